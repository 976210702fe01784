"""Shared CLI plumbing: the Env from the typer context, the --json/--plain flags, confirmations."""

from __future__ import annotations

from typing import Annotated

import typer

from paygate_cli.env import Env
from paygate_cli.errors import UsageError
from paygate_cli.output import Mode, mode_from_flags

JsonFlag = Annotated[bool, typer.Option("--json", help="One JSON document on stdout (with schema_version).")]
PlainFlag = Annotated[bool, typer.Option("--plain", help="Tab-separated lines for grep/awk, no decoration.")]
YesFlag = Annotated[bool, typer.Option("--yes", "-y", help="Do it without asking (required without a TTY).")]
DryRunFlag = Annotated[bool, typer.Option("--dry-run", "-n", help="Show what would change; change nothing.")]


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


def confirm(env: Env, question: str, *, yes: bool) -> None:
    """Ask on a TTY; without one, refuse (exit 2) and name --yes. Never hangs a cron job."""
    if yes:
        return
    if not env.stdin_isatty:
        raise UsageError(f"refusing to {question} without --yes (stdin is not a TTY)", msgid="usage.needs_yes")
    env.stderr.write(f"{question}? [y/N] ")
    env.stderr.flush()
    answer = env.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise UsageError(f"not confirmed: {question}", msgid="usage.not_confirmed")
