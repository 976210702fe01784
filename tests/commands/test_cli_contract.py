"""The CLI contract: exit codes for every class of failure, --json, logs on stderr only, no prompt
without a TTY, completion, and `--help` never importing stellar_sdk."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from paygate_cli.errors import ExitCode
from tests.support.cli import base_environ, run_cli, run_proc


def test_bad_flag_exits_2() -> None:
    result = run_cli("run-tick", "webhooks", "--no-such-flag")
    assert result.code == ExitCode.USAGE
    assert "No such option" in result.err


def test_unknown_worker_exits_2(dsn: str) -> None:
    result = run_cli("run-tick", "no_such_worker", dsn=dsn)
    assert result.code == ExitCode.USAGE
    assert "unknown worker" in result.err and "webhooks" in result.err


def test_once_and_every_together_exit_2(dsn: str) -> None:
    result = run_cli("run-tick", "webhooks", "--once", "--every", "1s", dsn=dsn)
    assert result.code == ExitCode.USAGE


def test_bad_duration_exits_2(dsn: str) -> None:
    result = run_cli("run-tick", "webhooks", "--every", "fast", dsn=dsn)
    assert result.code == ExitCode.USAGE
    assert "not a duration" in result.err


def test_invalid_toml_config_exits_78(tmp_path, dsn: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text("statement_timeout = [unclosed\n")
    result = run_cli("--config", str(config), "status", dsn=dsn)
    assert result.code == ExitCode.CONFIG
    assert "invalid TOML" in result.err
    assert len(result.err.strip().splitlines()) == 1  # one clear line


def test_unknown_config_key_exits_78(tmp_path, dsn: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text('statment_timeout = "5s"\n')
    result = run_cli("--config", str(config), "status", dsn=dsn)
    assert result.code == ExitCode.CONFIG
    assert "statment_timeout" in result.err


def test_missing_config_file_named_explicitly_exits_78(dsn: str) -> None:
    result = run_cli("--config", "/nonexistent/paygate.toml", "status", dsn=dsn)
    assert result.code == ExitCode.CONFIG


def test_missing_secret_file_exits_78(dsn: str) -> None:
    # A command that reads every secret (the read-only commands read none they do not use).
    result = run_cli("config", "show", dsn=dsn, PAYGATE_FEE_SECRET_FILE="/nonexistent/fee-secret")
    assert result.code == ExitCode.CONFIG
    assert "PAYGATE_FEE_SECRET_FILE" in result.err and "does not exist" in result.err


def test_no_database_configured_exits_78() -> None:
    result = run_cli("status")
    assert result.code == ExitCode.CONFIG
    assert "PAYGATE_DATABASE_URL" in result.err


def test_database_down_exits_69(tmp_path) -> None:
    nowhere = f"postgresql:///postgres?host={tmp_path}&port=1&user=postgres"
    result = run_cli("status", dsn=nowhere)
    assert result.code == ExitCode.UNAVAILABLE
    assert "cannot connect to Postgres" in result.err


def test_run_tick_database_down_exits_69(tmp_path) -> None:
    nowhere = f"postgresql:///postgres?host={tmp_path}&port=1&user=postgres"
    assert run_cli("run-tick", "webhooks", dsn=nowhere).code == ExitCode.UNAVAILABLE


def test_permission_denied_exits_77(dsn: str, empty_dsn: str) -> None:
    assert run_cli("migrate", "--roles", dsn=dsn).code == 0  # creates the (cluster-wide) runtime role
    as_runtime = psycopg.conninfo.make_conninfo(empty_dsn, options="-c role=paygate_runtime")
    result = run_cli("migrate", dsn=as_runtime)  # the runtime role may not run DDL
    assert result.code == ExitCode.NOPERM
    assert "permission denied" in result.err


def test_unexpected_database_error_is_a_bug_exit_70(db: psycopg.Connection, dsn: str) -> None:
    db.execute("DROP TABLE paygate.webhook_outbox")  # schema no longer matches the code
    result = run_cli("run-tick", "webhooks", dsn=dsn)
    assert result.code == ExitCode.SOFTWARE
    assert "a bug" in result.err


def test_write_without_tty_and_without_yes_exits_2_naming_yes(dsn: str) -> None:
    result = run_cli("halt", "--reason", "maintenance", dsn=dsn)
    assert result.code == ExitCode.USAGE
    assert "--yes" in result.err


def test_prompt_on_tty_is_honoured(dsn: str, db: psycopg.Connection) -> None:
    declined = run_cli("halt", "--reason", "maintenance", dsn=dsn, tty=True, stdin="n\n")
    assert declined.code == ExitCode.USAGE
    assert db.execute("SELECT count(*) FROM paygate.halts").fetchone()[0] == 0
    accepted = run_cli("halt", "--reason", "maintenance", dsn=dsn, tty=True, stdin="y\n")
    assert accepted.code == 0
    assert db.execute("SELECT reason FROM paygate.halts WHERE kind = 'operator'").fetchone()[0] == "maintenance"


def test_json_error_document_on_stderr_under_json() -> None:
    result = run_cli("status", "--json")
    assert result.code == ExitCode.CONFIG
    assert result.out == ""
    error = json.loads(result.err.strip().splitlines()[-1])
    assert error["message_type"] == "exit_error" and error["code"] == ExitCode.CONFIG


def test_json_output_has_schema_version_and_nothing_else_on_stdout(dsn: str) -> None:
    result = run_cli("workers", "--json", dsn=dsn)
    assert result.code == 0
    document = json.loads(result.out)  # exactly one document: json.loads rejects trailing text
    assert document["schema_version"] == 1
    assert {w["worker"] for w in document["workers"]} >= {"webhooks", "idempotency_sweep"}


def test_plain_output_is_tab_separated(dsn: str) -> None:
    result = run_cli("workers", "--plain", dsn=dsn)
    lines = result.out.strip().splitlines()
    assert lines[0].split("\t")[0] == "worker"
    assert any(line.startswith("webhooks\t") for line in lines[1:])


def test_logs_go_to_stderr_as_json_lines_when_not_a_tty(dsn: str) -> None:
    result = run_proc("--log-level", "debug", "run-tick", "idempotency_sweep", "--json", dsn=dsn)
    assert result.code == 0
    json.loads(result.out)  # stdout: only the result document
    records = [json.loads(line) for line in result.err.strip().splitlines()]
    assert any(r["msgid"] == "tick.done" and r["worker"] == "idempotency_sweep" for r in records)
    assert all("ts" in r for r in records)


def test_logs_under_journald_carry_priority_prefixes(dsn: str) -> None:
    result = run_proc("--log-level", "debug", "run-tick", "idempotency_sweep", dsn=dsn, JOURNAL_STREAM="8:1234")
    lines = result.err.strip().splitlines()
    assert lines and all(line.startswith("<") and line[2] == ">" for line in lines)
    assert "ts" not in json.loads(lines[0][3:])  # journald stamps its own time


def test_completion_prints_a_script_and_edits_nothing() -> None:
    result = run_cli("completion", "bash")
    assert result.code == 0
    assert "_PAYGATE_COMPLETE" in result.out and "complete" in result.out
    assert run_cli("--install-completion").code == ExitCode.USAGE  # typer's installer is off


def test_help_does_not_import_stellar_sdk() -> None:
    probe = ("import sys, io, contextlib\n"
             "from paygate_cli.__main__ import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    code = main(['--help'])\n"
             "print(code, 'stellar_sdk' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "False"]


@pytest.mark.parametrize("args", [
    ["run-tick", "webhooks", "--json"],
    # the state file (fee market, TTL expiry in ledgers) is written too: still no SDK
    ["run-tick", "webhooks", "--json", "--metrics-dir", "{tmp}"],
])
def test_idle_tick_does_not_import_stellar_sdk(dsn: str, tmp_path: Path, args: list[str]) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    probe = ("import sys\nfrom paygate_cli.__main__ import main\n"
             f"code = main({args!r})\n"
             "print('RESULT', code, 'stellar_sdk' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=base_environ(dsn))
    assert proc.stdout.strip().splitlines()[-1].split() == ["RESULT", "0", "False"]
    if "--metrics-dir" in args:
        assert (tmp_path / "paygate_state.prom").exists()


def test_a_cold_status_does_not_import_stellar_sdk(dsn: str) -> None:
    probe = ("import sys, io, contextlib\nfrom paygate_cli.__main__ import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    code = main(['status', '--json'])\n"
             "print('RESULT', code, 'stellar_sdk' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=base_environ(dsn))
    assert proc.stdout.strip().splitlines()[-1].split()[2] == "False", proc.stderr[-2000:]


@pytest.mark.parametrize("args", [["--version"], ["workers", "--offline", "--json"]])
def test_commands_that_need_no_database_work_without_one(args: list[str]) -> None:
    assert run_cli(*args).code == 0


@pytest.mark.parametrize("args, expected", [
    (["run-tick", "webhooks"], "run-tick"),
    (["--log-level", "debug", "--config", "x.toml", "run-tick"], "run-tick"),
    (["--json"], None),
    (["--version"], None),
    (["dev", "db", "up"], "dev"),
])
def test_the_command_is_found_after_root_options(args: list[str], expected: str | None) -> None:
    from paygate_cli.__main__ import _command_name

    assert _command_name(args) == expected


def test_run_tick_alone_still_gets_root_options_and_its_own_help() -> None:
    result = run_proc("--log-format", "json", "run-tick", "--help")  # click prints help to the real stdout
    assert result.code == 0 and "--lock-wait" in result.out
    assert run_cli("--log-format", "bogus", "run-tick", "webhooks").code == ExitCode.USAGE


# -- output: pipes, help, completion --------------------------------------------------------------

def _all_commands() -> list[list[str]]:
    """Every command and group path of the full app, e.g. ["dev", "db", "up"]."""
    import typer.main

    from paygate_cli.app import make_app

    paths: list[list[str]] = []

    def walk(command: object, path: list[str]) -> None:
        paths.append(path)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(make_app()), [])
    return paths


def _help(*args: str) -> tuple[int, str]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # click prints help to the real stdout
        code = run_cli(*args).code
    return code, out.getvalue()


def test_every_command_has_h_and_an_example_in_its_help() -> None:
    paths = _all_commands()
    assert ["run-tick"] in paths and ["dev", "db", "up"] in paths and ["devnet", "fault"] in paths
    for path in paths:
        code, text = _help(*path, "-h")
        assert code == 0, path
        assert "Usage: paygate" in text, path
        assert "Example: `paygate" in text or "Example: `export" in text, (path, text)


def test_durations_show_as_duration_in_help() -> None:
    _, text = _help("run-tick", "-h")
    for flag in ("--every", "--for", "--lock-wait"):
        assert f"{flag} DURATION" in text, text
    assert "TEXT" not in text.split("Options:")[1]
    assert "--ledger-interval DURATION" in _help("devnet", "start", "-h")[1]


def test_tables_are_not_cut_when_piped() -> None:
    result = run_proc("workers", "--offline")  # stdout is a pipe, not a TTY
    settlement = [line for line in result.out.splitlines() if "settlement" in line]
    assert len(settlement) == 1
    assert "(1885436263, 200..203)" in settlement[0]
    assert "subscriptions" in result.out and "idempotency_sweep" in result.out  # no cell wrapped or cut


def test_a_closed_pipe_exits_0_quietly() -> None:
    for args in (["workers", "--offline"], ["--help"]):
        proc = subprocess.Popen([sys.executable, "-m", "paygate_cli", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=base_environ(None))
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone before paygate writes a byte (`| head -0`)
        err = proc.stderr.read()
        assert proc.wait(timeout=30) == 0, (args, err)
        assert err == b"", err


def test_completion_script_works_in_bash() -> None:
    import os
    import shutil

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    paygate = os.path.join(os.path.dirname(sys.executable), "paygate")
    script = (f'source <("{paygate}" completion bash)\n'
              "complete -p paygate\n"
              "COMP_WORDS=(paygate wor); COMP_CWORD=1; _paygate_completion paygate\n"
              'echo "replies: ${COMPREPLY[*]}"\n'
              "COMP_WORDS=(paygate dev db u); COMP_CWORD=3; _paygate_completion paygate\n"
              'echo "replies: ${COMPREPLY[*]}"\n'
              "COMP_WORDS=(paygate run-tick sett); COMP_CWORD=2; _paygate_completion paygate\n"
              'echo "replies: ${COMPREPLY[*]}"\n')
    environ = {**base_environ(None), "PATH": os.path.dirname(paygate) + os.pathsep + os.environ.get("PATH", "")}
    proc = subprocess.run([bash, "-c", script], capture_output=True, text=True, env=environ, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "complete -o default -F _paygate_completion paygate"
    assert lines[1] == "replies: workers"
    assert lines[2].split(": ")[1].split() == ["up", "url"]
    assert lines[3] == "replies: settlement"
    assert "not supported" not in proc.stderr
