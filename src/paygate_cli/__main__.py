"""Entry point: builds the Env, runs the app, maps every exception to one exit code (one place)."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Sequence

from paygate_cli.env import Env
from paygate_cli.errors import ExitCode, PaygateError
from paygate_cli.secrets import scrub


def _classify_database_error(exc: BaseException) -> tuple[ExitCode, str, str] | None:
    """psycopg failures that are not bugs: unreachable server, missing privilege."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(exc, psycopg.Error):
        return None
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return ExitCode.NOPERM, "db.permission_denied", f"database permission denied: {exc}".strip()
    from paygate_cli.db.connect import is_connection_lost

    if is_connection_lost(exc):
        return ExitCode.UNAVAILABLE, "db.unavailable", f"database unavailable: {exc}".strip()
    if isinstance(exc, psycopg.OperationalError):  # deadlock, timeout: failed, a retry may succeed
        return ExitCode.FAILED, "db.operation_failed", f"database operation failed: {exc}".strip()
    return None


def _report(env: Env, code: int, msgid: str, message: str) -> None:
    message = scrub(message.strip().splitlines()[0] if message.strip() else msgid)
    if env.json_errors:
        env.stderr.write(json.dumps({"message_type": "exit_error", "code": code, "msgid": msgid,
                                     "message": message}) + "\n")
    else:
        env.stderr.write(f"paygate: error: {message}\n")
    env.stderr.flush()


# Root options that take a value: the command name is the first word that is neither one of these
# nor an option.
_ROOT_OPTIONS_WITH_VALUE = {"--config", "--log-format", "--log-level"}


def _command_name(args: list[str]) -> str | None:
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _ROOT_OPTIONS_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def main(argv: Sequence[str] | None = None, env: Env | None = None) -> int:
    env = env or Env()
    args = list(sys.argv[1:] if argv is None else argv)
    env.json_errors = "--json" in args
    from typer._click.exceptions import ClickException

    from paygate_cli.app import COMMANDS, make_app  # typer is imported here so a broken env still maps errors

    command = _command_name(args)
    app = make_app(command if command in COMMANDS else None)

    try:
        result = app(args=args, prog_name="paygate", standalone_mode=False, obj=env)
        return int(result) if isinstance(result, int) else 0
    except ClickException as exc:  # bad flags: click already knows the text
        exc.show(file=env.stderr)
        return ExitCode.USAGE
    except PaygateError as exc:
        _report(env, exc.exit_code, exc.msgid, str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        return ExitCode.SIGINT
    except BrokenPipeError:
        return ExitCode.FAILED
    except Exception as exc:
        classified = _classify_database_error(exc)
        if classified:
            code, msgid, message = classified
            _report(env, code, msgid, message)
            return code
        if env.environ.get("PAYGATE_DEBUG"):
            env.stderr.write(scrub("".join(traceback.format_exception(exc))))
        first_line = (str(exc).strip().splitlines() or [""])[0]
        _report(env, ExitCode.SOFTWARE, "bug", f"unexpected {type(exc).__name__}: {first_line} "
                "(a bug; rerun with PAYGATE_DEBUG=1 for the traceback)")
        return ExitCode.SOFTWARE


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
