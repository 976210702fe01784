"""Shared CLI plumbing: the Env from the typer context, the --json/--plain flags, confirmations naming
the target database and context, and which exit codes each command can end in."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from paygate_cli.db.connect import connect, database_target, describe_target
from paygate_cli.env import Env
from paygate_cli.errors import ExitCode, UsageError
from paygate_cli.output import Mode, mode_from_flags

if TYPE_CHECKING:
    from paygate_cli.db.connect import Connection
    from paygate_cli.settings import Settings

JsonFlag = Annotated[bool, typer.Option("--json", help="One JSON document on stdout (with schema_version).")]
PlainFlag = Annotated[bool, typer.Option("--plain", help="Tab-separated lines for grep/awk, no decoration.")]
YesFlag = Annotated[bool, typer.Option("--yes", "-y", help="Do it without asking (required without a TTY).")]
DryRunFlag = Annotated[bool, typer.Option("--dry-run", "-n", help="Show what would change; change nothing.")]


# The secret files the read-only commands use: the database's, and the RPC URLs for those that read
# the chain. None of them needs a lane seed, the fee seed or a journal key (docs/architecture.md).
DATABASE_SECRETS = ("database_url",)
CHAIN_READ_SECRETS = (*DATABASE_SECRETS, "rpc_url", "rpc_read_urls")


def get_env(ctx: typer.Context) -> Env:
    env = ctx.find_root().obj
    if not isinstance(env, Env):  # invoked without __main__ (e.g. typer's test runner)
        env = Env()
        ctx.find_root().obj = env
    return env


def output_mode(json_flag: bool, plain_flag: bool = False) -> Mode:
    if json_flag and plain_flag:
        raise UsageError("--json and --plain are mutually exclusive")
    return mode_from_flags(json_flag, plain_flag)


ContextFlag = Annotated[str | None, typer.Option(
    "--context", help="The context this write is meant for (PAYGATE_CONTEXT): refused unless it matches; "
                      "with --yes, required against a production context.", show_default=False)]


def target_of(env: Env, conn: Any = None) -> dict[str, Any]:
    """The database and context this command acts on (never the password)."""
    return database_target(env.settings, conn)


def open_db(env: Env, purpose: str, *, attempts: int = 3, settings: Settings | None = None) -> Connection:
    """The one way a command reaches the database: a connection for `purpose` (pg_stat_activity shows
    paygate:<purpose>), handed to the ops/ functions it calls. Connection failures are retried
    `attempts` times, then raise Unavailable (69). `settings`: ones the command loaded itself
    (`doctor`, whose config checks decide which secret files load), instead of env.settings."""
    return connect(settings or env.settings, purpose, attempts=attempts)


def target_detail(target: dict[str, Any]) -> str:
    """The target as one phrase: host, database, role and context (never the password)."""
    return describe_target(target)


def target_line(target: dict[str, Any]) -> str:
    return f"target: {target_detail(target)}"


def check_context(env: Env, context: str | None, target: dict[str, Any] | None = None) -> dict[str, Any]:
    """`--context NAME` asserts which deployment a write is meant for: a script aimed at the wrong one
    fails here (exit 2), dry run or not, before anything is read or written."""
    target = target or target_of(env)
    if context is not None and context != target["context"]:
        have = f"context {target['context']}" if target["context"] else "no context (PAYGATE_CONTEXT is unset)"
        raise UsageError(f"--context {context} does not match this configuration: it points at {have}, "
                         f"{describe_target(target)}", msgid="usage.context_mismatch")
    return target


def confirm(env: Env, question: str, *, yes: bool, context: str | None = None, dry_run: bool = False,
            outside_production: bool = True, target: dict[str, Any] | None = None) -> None:
    """Ask on a TTY, naming the target database and context; without one, refuse (exit 2) naming the
    flags to pass. Never hangs a cron job. A dry run only checks `--context`.

    Against a context marked production, `--yes` alone is never enough: on a TTY the context's name
    is typed back; without one, `--yes --context NAME` is required. `outside_production=False` asks
    nothing elsewhere (`migrate`, which deploy scripts run unattended)."""
    target = check_context(env, context, target)
    if dry_run:
        return
    where = describe_target(target)
    name = target["context"]
    if target["production"]:
        if yes and context == name:
            return
        if not env.stdin_isatty:
            flags = "--context " + name if yes else "--yes --context " + name
            raise UsageError(f"refusing to {question} on production context {name} without {flags} "
                             f"(the context's name, repeated; stdin is not a TTY): {where}",
                             msgid="usage.needs_context")
        env.stderr.write(f"{question} on {where}?\nThis is production: type the context name ({name}) to "
                         f"confirm: ")
        env.stderr.flush()
        if env.stdin.readline().strip() != name:
            raise UsageError(f"not confirmed: {question} (the context name was not typed)",
                             msgid="usage.not_confirmed")
        return
    if yes or not outside_production:
        return
    if not env.stdin_isatty:
        raise UsageError(f"refusing to {question} without --yes (stdin is not a TTY): {where}",
                         msgid="usage.needs_yes")
    env.stderr.write(f"{question} on {where}? [y/N] ")
    env.stderr.flush()
    answer = env.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise UsageError(f"not confirmed: {question}", msgid="usage.not_confirmed")


# -- which exit codes each command can end in (docs/exit-codes.md renders this; a test holds them equal) --
_E = ExitCode
# Every command: done, bad flags, a bug, Ctrl-C (`__main__` maps each).
_ANY = frozenset({_E.OK, _E.USAGE, _E.SOFTWARE, _E.SIGINT})
# It loads settings (a bad config file or setting, a missing secret file).
_SETTINGS = _ANY | {_E.CONFIG}
# It talks to Postgres: unreachable (69), a refused login or a bad DSN (78), a missing GRANT (77), a
# statement that failed on a live connection (1: a lock or statement timeout, a deadlock).
_DATABASE = _SETTINGS | {_E.FAILED, _E.UNAVAILABLE, _E.NOPERM}
COMMAND_EXIT_CODES: dict[str, frozenset[ExitCode]] = {
    "run-tick": _DATABASE | {_E.NEEDS_HUMAN, _E.SKIPPED, _E.SIGTERM},
    "migrate": _DATABASE | {_E.NEEDS_HUMAN},  # 3: an applied migration changed
    "status": _DATABASE,  # 1: not ready
    "top": _DATABASE,
    "workers": _DATABASE,
    "halt": _DATABASE,
    "resume": _DATABASE,
    "nonce-inspect": _DATABASE | {_E.NEEDS_HUMAN},
    "trace": _DATABASE | {_E.NEEDS_HUMAN},  # 3: unexplained; 1: the chain unreadable; 2: no such unit
    "recover-check": _DATABASE | {_E.NEEDS_HUMAN},  # 3: blockers remain, or a lane was fenced
    "drain": _DATABASE | {_E.SKIPPED},  # 75: --wait ran out
    "undrain": _DATABASE,
    "key-retire-check": _DATABASE | {_E.NEEDS_HUMAN},
    "reconcile-report": _DATABASE | {_E.NEEDS_HUMAN},
    "replay": _DATABASE,  # 1: a row was refused
    "doctor": _DATABASE | {_E.NEEDS_HUMAN},  # 1: warnings only; 3/69/78: the worst failed check's kind
    "config": _SETTINGS,
    "dev": _SETTINGS | {_E.UNAVAILABLE},  # 78: no PostgreSQL binaries; 69: the cluster did not start
    "devnet": _SETTINGS | {_E.UNAVAILABLE},  # 69: the port is taken, the devnet is unreachable
    "completion": _ANY,
    "demo": _DATABASE,
}


# One part of a `--since` duration: `2h`, `30m`, `1.5d`, `45s`; parts may follow each other (`2h30m`).
_SINCE_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|seconds?|secs?|s|minutes?|mins?|m|hours?|h|days?|d)", re.IGNORECASE)
_SINCE_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_since(text: str | None, *, flag: str = "--since", now: datetime | None = None) -> datetime | None:
    """`--since`: a duration back from now (`1h`, `30min`, `2h30m`, `7d`) or an ISO timestamp
    (UTC when it names no zone). A usage error (exit 2) otherwise."""
    if not text or not text.strip():
        return None
    spec = text.strip()
    compact = spec.replace(" ", "")
    parts = list(_SINCE_PART.finditer(compact))
    seconds: float | None = None
    if parts and "".join(m.group(0) for m in parts) == compact:
        seconds = sum(float(m.group(1)) * _SINCE_UNIT_S["ms" if m.group(2).lower() == "ms" else m.group(2)[0].lower()]
                      for m in parts)
    elif re.fullmatch(r"\d+(?:\.\d+)?", compact):  # a bare number: seconds, as every other duration flag
        seconds = float(compact)
    if seconds is not None:
        try:
            return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
        except OverflowError:
            raise UsageError(f"{flag}: {spec[:80]!r} reaches back before year 1") from None
    try:
        moment = datetime.fromisoformat(spec)
    except ValueError:
        raise UsageError(f"{flag}: {spec[:80]!r} is neither a duration (1h, 30min, 2h30m, 7d) nor an ISO "
                         "timestamp") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
