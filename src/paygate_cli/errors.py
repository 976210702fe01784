"""The error hierarchy. Each class carries its exit code and a stable msgid (borg-style),
so the mapping from failure to exit code lives in one place: `__main__.main`."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The exit-code contract (docs/exit-codes.md). Scripts and systemd units depend on these numbers."""

    OK = 0  # done, including "nothing to do"
    FAILED = 1  # ran, some items failed; the next tick may retry
    USAGE = 2  # bad flags, or a prompt was needed without a TTY
    NEEDS_HUMAN = 3  # unexplained drift, nonce gap, key not retirable, poison data
    UNAVAILABLE = 69  # Postgres or RPC unavailable after bounded retries
    SOFTWARE = 70  # a bug: unexpected exception
    SKIPPED = 75  # the worker's lock is held, or a --wait timed out
    NOPERM = 77  # permission denied (DB role)
    CONFIG = 78  # configuration invalid or a secret file missing
    SIGINT = 130  # 128 + SIGINT, interrupted mid-phase
    SIGTERM = 143  # 128 + SIGTERM, interrupted mid-phase


# What each code means: the one source of the table in docs/exit-codes.md (a test holds the two
# equal). Which command can end in which code is commands/_common.py's COMMAND_EXIT_CODES.
EXIT_CODE_MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "done, including nothing to do",
    ExitCode.FAILED: "ran, and some items failed (the next tick may retry), or a tick stalled; a statement "
                     "that failed on a live connection (a lock or statement timeout, a deadlock); "
                     "`status`: not ready; `reconcile-report`: an account the reconciler never checked, or a "
                     "ledger entry the TTL keeper keeps alive read archived",
    ExitCode.USAGE: "usage error: bad flags; a confirmation needed without a TTY (the message names the "
                    "flags to pass: `--yes`, and `--context NAME` for a production context) or declined at the "
                    "prompt (nothing is changed); `--context NAME` that does not match the configured context; "
                    "`--out FILE` that exists without `--force`; `--batch` over what the worker's path can use",
    ExitCode.NEEDS_HUMAN: "needs a human: unexplained drift, nonce gap, key not retirable, poison data, "
                          "a changed applied migration",
    ExitCode.UNAVAILABLE: "a dependency (Postgres, RPC) is unavailable after bounded retries, or the database "
                          "reached is no writer (a standby in recovery, read-only); the message names the host and "
                          "port or socket tried",
    ExitCode.SOFTWARE: "a bug (unexpected exception); `PAYGATE_DEBUG=1` prints the traceback",
    ExitCode.SKIPPED: "skipped: the worker's lock is held, or a `--wait` timed out (said at info level, "
                      "not as an error; systemd `SuccessExitStatus=75`)",
    ExitCode.NOPERM: "permission denied by the database to paygate's role (a missing GRANT)",
    ExitCode.CONFIG: "configuration, which retrying never fixes: an invalid or missing setting or secret file; "
                     "a database URL libpq rejects (`sslmode=bogus`); a socket directory the OS user may not "
                     "reach; Postgres refusing the login (wrong password, unknown role or database, no "
                     "`pg_hba.conf` entry); the schema older than this build (\"schema is at version N, this paygate "
                     "needs M: run `paygate migrate`\"); a worker lacking what it needs (RPC, contracts, keys), a "
                     "secret that does not parse, an RPC endpoint on another network; an unwritable `--metrics-dir`",
    ExitCode.SIGINT: "interrupted by SIGINT (Ctrl-C): an operator command at once, a tick at a second "
                     "signal mid-phase (everything is restart-safe)",
    ExitCode.SIGTERM: "interrupted mid-phase by a second SIGTERM (everything is restart-safe)",
}


class PaygateError(Exception):
    """Base class: a failure paygate understands. The message must never contain a secret."""

    exit_code: ExitCode = ExitCode.FAILED
    msgid: str = "paygate.error"

    def __init__(self, message: str, *, msgid: str | None = None) -> None:
        super().__init__(message)
        if msgid:
            self.msgid = msgid


class UsageError(PaygateError):
    exit_code = ExitCode.USAGE
    msgid = "usage"


class NeedsHuman(PaygateError):
    exit_code = ExitCode.NEEDS_HUMAN
    msgid = "needs_human"


class Unavailable(PaygateError):
    exit_code = ExitCode.UNAVAILABLE
    msgid = "dependency.unavailable"


class LockHeld(PaygateError):
    exit_code = ExitCode.SKIPPED
    msgid = "lock.held"


class WaitTimedOut(PaygateError):
    exit_code = ExitCode.SKIPPED
    msgid = "wait.timeout"


class ConfigError(PaygateError):
    exit_code = ExitCode.CONFIG
    msgid = "config.invalid"


class SecretMissing(ConfigError):
    msgid = "config.secret_missing"


class DatabaseAuthFailed(ConfigError):
    """Wrong password, unknown role or database, no pg_hba entry: retrying never fixes it (78, not 69)."""

    msgid = "db.auth_failed"


class DatabaseConfigInvalid(ConfigError):
    """libpq rejected the connection settings (`sslmode=bogus`, a port that is not a number) or the OS
    refused the socket path: configuration that no retry fixes (78, not 69)."""

    msgid = "db.config_invalid"


class SchemaBehind(ConfigError):
    """Code newer than the database: `paygate migrate` has not run yet (78, not a bug)."""

    msgid = "schema.behind"


class CannotWork(ConfigError):
    """A worker lacks what it needs to move money (RPC, keys, contracts): it must not tick as if idle."""

    msgid = "worker.cannot_work"
