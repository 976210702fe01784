"""Entry point: builds the Env, runs the app, maps every exception to one exit code (one place)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from paygate_cli.env import Env
from paygate_cli.errors import ExitCode, PaygateError
from paygate_cli.secrets import scrub


def _classify_database_error(env: Env, exc: BaseException) -> tuple[ExitCode, str, str] | None:
    """psycopg failures that are not bugs: unreachable server, missing privilege, a schema older
    than this build."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(exc, psycopg.Error):
        return None
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return ExitCode.NOPERM, "db.permission_denied", f"database permission denied: {exc}".strip()
    missing = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn, psycopg.errors.UndefinedFunction,
               psycopg.errors.InvalidSchemaName)
    if isinstance(exc, missing):
        from paygate_cli.db.migrate import explain_missing_object

        behind = explain_missing_object(env.settings)
        if behind is not None:
            return behind.exit_code, behind.msgid, str(behind)
    from paygate_cli.db.connect import is_connection_lost, is_read_only_error, no_writer_error

    if is_read_only_error(exc):  # a write command on a standby or a read-only database: no writer
        no_writer = no_writer_error(exc, None)
        return no_writer.exit_code, no_writer.msgid, str(no_writer)
    if is_connection_lost(exc):
        return ExitCode.UNAVAILABLE, "db.unavailable", f"database unavailable: {exc}".strip()
    if isinstance(exc, psycopg.OperationalError):  # deadlock, timeout: failed, a retry may succeed
        return ExitCode.FAILED, "db.operation_failed", f"database operation failed: {exc}".strip()
    return None


def _report(env: Env, code: int, msgid: str, message: str, args: Sequence[str] = ()) -> None:
    """The run's last line on stderr. A skip (75) is not an error: it is said at info level (and
    not at all under --log-level warning/error); everything else at error level."""
    message = scrub(message.strip().splitlines()[0] if message.strip() else msgid)
    level = logging.INFO if code == ExitCode.SKIPPED else logging.ERROR
    threshold = (env.log_level or _root_option(args, "--log-level") or env.environ.get("PAYGATE_LOG_LEVEL")
                 or "info")
    threshold_no = logging.getLevelName(threshold.upper())
    if isinstance(threshold_no, int) and level < threshold_no:  # an invalid level is reported, not applied
        return
    fmt = _log_format(env, args)
    journald = bool(env.environ.get("JOURNAL_STREAM"))
    if env.json_errors:
        line = json.dumps({"message_type": "exit_error", "code": code, "msgid": msgid, "message": message})
        if journald:
            line = f"<{3 if level >= logging.ERROR else 6}>{line}"
    else:
        from paygate_cli.logs import final_line

        line = final_line(env, fmt=fmt, level=level, msgid=msgid, message=message, code=code)
    env.stderr.write(line + "\n")
    env.stderr.flush()


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _log_format(env: Env, args: Sequence[str]) -> str:
    """The format of the final line. A failure may come before the flags were validated, so an
    invalid value (itself the error being reported) falls back to auto rather than shaping the line."""
    fmt = env.log_format or _root_option(args, "--log-format") or env.environ.get("PAYGATE_LOG_FORMAT") or "auto"
    fmt = fmt.strip().lower()
    return fmt if fmt in ("auto", "text", "json") else "auto"


def _root_option(args: Sequence[str], name: str) -> str | None:
    """A root option's value from the raw arguments, for failures before the root callback ran."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


# Root options that take a value: the command name is the first word that is neither one of these
# nor an option.
_ROOT_OPTIONS_WITH_VALUE = {"--config", "--log-format", "--log-level"}


def _command_name(args: list[str]) -> str | None:
    index = _command_index(args)
    return None if index is None else args[index]


def _command_index(args: list[str]) -> int | None:
    skip = False
    for index, arg in enumerate(args):
        if skip:
            skip = False
        elif arg in _ROOT_OPTIONS_WITH_VALUE:
            skip = True
        elif arg == "--":
            return None
        elif not arg.startswith("-"):
            return index
    return None


# Output flags a person types on either side of the command name (`paygate --json status` and
# `paygate status --json`): each command declares its own --json/--plain (its document), the root
# declares --wide (every table). A flag on the other side is moved to where it is declared.
_COMMAND_FLAGS = ("--json", "--plain")
_ROOT_FLAGS = ("--wide",)


def _place_output_flags(args: list[str]) -> list[str]:
    index = _command_index(args)
    if index is None:
        return args
    before, after = args[:index], args[index:]
    to_command = [a for a in before if a in _COMMAND_FLAGS]
    before = [a for a in before if a not in _COMMAND_FLAGS]
    end = after.index("--") if "--" in after else len(after)  # after `--` every word is an argument
    to_root = [a for a in after[:end] if a in _ROOT_FLAGS]
    after = [a for a in after[:end] if a not in _ROOT_FLAGS] + to_command + after[end:]
    return to_root + before + after


COMPLETE_VAR = "_PAYGATE_COMPLETE"


def _stdout_gone(env: Env) -> int:
    """The reader of stdout went away (`paygate workers | head -1`): that is how pipes end, not a
    failure. Point fd 1 at /dev/null so the interpreter's final flush cannot complain either."""
    if env.stdout is sys.__stdout__ or getattr(env.stdout, "_stream", None) is sys.__stdout__:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno())
    return ExitCode.OK


def main(argv: Sequence[str] | None = None, env: Env | None = None) -> int:
    env = env or Env()
    if env.stdout is sys.__stdout__:
        from paygate_cli.output import ClosedPipeSafe

        env.stdout = ClosedPipeSafe(env.stdout)  # type: ignore[assignment]  # a closed pipe keeps the verdict
    code = _main(argv, env)
    env.stdout.flush()  # what is still buffered drains here (to /dev/null if the reader left)
    return code


def _main(argv: Sequence[str] | None, env: Env) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env.json_errors = "--json" in args
    for position, arg in enumerate(args, start=1):
        # Non-UTF-8 bytes in argv arrive as lone surrogates: refuse them here, as a usage error, not
        # later when Postgres or a log line fails to encode them (a bug report, 70).
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            _report(env, ExitCode.USAGE, "usage.not_utf8", f"command-line argument {position} is not valid UTF-8",
                    [a for a in args if _is_utf8(a)])
            return ExitCode.USAGE
    from typer._click.exceptions import ClickException
    from typer._click.utils import PacifyFlushWrapper

    from paygate_cli.app import COMMANDS, make_app  # typer is imported here so a broken env still maps errors

    completing = COMPLETE_VAR in env.environ
    if completing:  # the script from `paygate completion SHELL` calls back with this variable set
        from typer._completion_classes import completion_init

        completion_init()
    args = _place_output_flags(args)
    command = _command_name(args)
    app = make_app(command if command in COMMANDS and not completing else None)

    try:
        result = app(args=args, prog_name="paygate", standalone_mode=False, obj=env)
        return int(result) if isinstance(result, int) else 0
    except ClickException as exc:  # bad flags: click already knows the text
        from paygate_cli.logs import wants_json

        fmt = _log_format(env, args)
        if env.json_errors or wants_json(env, fmt) or not env.stderr_isatty:
            # A log collector or a script gets one line, not click's usage block (a human at a terminal does).
            _report(env, ExitCode.USAGE, "usage", exc.format_message(), args)
        else:
            exc.show(file=env.stderr)
        return ExitCode.USAGE
    except SystemExit:
        # click turns EPIPE on stdout into exit 1 after wrapping sys.stdout; a closed pipe is not a failure.
        if isinstance(sys.stdout, PacifyFlushWrapper):
            return _stdout_gone(env)
        raise
    except PaygateError as exc:
        _report(env, exc.exit_code, exc.msgid, str(exc), args)
        return exc.exit_code
    except KeyboardInterrupt:
        return ExitCode.SIGINT
    except BrokenPipeError:
        return _stdout_gone(env)
    except Exception as exc:
        classified = _classify_database_error(env, exc)
        if classified:
            code, msgid, message = classified
            _report(env, code, msgid, message, args)
            return code
        if env.environ.get("PAYGATE_DEBUG"):
            env.stderr.write(scrub("".join(traceback.format_exception(exc))))
        first_line = (str(exc).strip().splitlines() or [""])[0]
        _report(env, ExitCode.SOFTWARE, "bug", f"unexpected {type(exc).__name__}: {first_line} "
                "(a bug; rerun with PAYGATE_DEBUG=1 for the traceback)", args)
        return ExitCode.SOFTWARE


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
