"""The error hierarchy. Each class carries its exit code and a stable msgid (borg-style),
so the mapping from failure to exit code lives in one place: `__main__.main`."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The exit-code contract (DESIGN §7). Scripts and systemd units depend on these numbers."""

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


class PermissionDenied(PaygateError):
    exit_code = ExitCode.NOPERM
    msgid = "permission.denied"


class ConfigError(PaygateError):
    exit_code = ExitCode.CONFIG
    msgid = "config.invalid"


class SecretMissing(ConfigError):
    msgid = "config.secret_missing"


class DatabaseAuthFailed(ConfigError):
    """Wrong password, unknown role or database, no pg_hba entry: retrying never fixes it (78, not 69)."""

    msgid = "db.auth_failed"


class SchemaBehind(ConfigError):
    """Code newer than the database: `paygate migrate` has not run yet (78, not a bug)."""

    msgid = "schema.behind"


class CannotWork(ConfigError):
    """A worker lacks what it needs to move money (RPC, keys, contracts): it must not tick as if idle."""

    msgid = "worker.cannot_work"


class ItemsFailed(PaygateError):
    """A tick ran and some items failed; the next tick may retry them."""

    exit_code = ExitCode.FAILED
    msgid = "tick.items_failed"
