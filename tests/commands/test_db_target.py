"""Operators always see which database they are on: `status`, every --dry-run, every confirmation
and `migrate` name the target (host or socket, port, database, role; never the password) and the
named context; an empty database says "wrong database?" before "run migrate"; a write against a
production context needs its name typed back (or `--yes --context NAME` without a TTY). And the
exit codes of a bad database URL and of a socket the OS user may not reach are configuration (78)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from paygate_cli.errors import ExitCode
from tests.support.cli import base_environ, paygate_cmd, run_cli, run_proc

PASSWORD = "pw-Zq81-never-shown"
PROD = {"PAYGATE_CONTEXT": "prod-eu", "PAYGATE_CONTEXT_PRODUCTION": "1"}


def _halts(db: psycopg.Connection) -> int:
    return db.execute("SELECT count(*) FROM paygate.halts WHERE kind = 'operator'").fetchone()[0]


def test_status_names_the_target_and_never_the_password(dsn: str) -> None:
    # The private cluster trusts local connections, so the password is carried but never needed.
    with_password = make_conninfo(dsn, password=PASSWORD)
    database = conninfo_to_dict(dsn)["dbname"]
    socket_dir = conninfo_to_dict(dsn)["host"]
    human = run_proc("status", dsn=with_password, PAYGATE_CONTEXT="staging-1")
    assert human.code == ExitCode.OK, human.err  # ready: no worker failed, nothing waits
    target = next(line for line in human.out.splitlines() if line.startswith("target: "))
    assert f"database {database} on socket {socket_dir} port" in target and "as role postgres" in target
    assert "context staging-1" in target
    as_json = run_proc("status", "--json", dsn=with_password, PAYGATE_CONTEXT="staging-1")
    document = json.loads(as_json.out)["status"]["target"]
    assert document["database"] == database and document["host"] == socket_dir and document["socket"] is True
    assert document["role"] == "postgres" and document["context"] == "staging-1" and document["production"] is False
    for result in (human, as_json):
        assert PASSWORD not in result.out + result.err


def test_status_names_the_target_when_the_database_is_unreachable(tmp_path) -> None:
    nowhere = f"postgresql://postgres:{PASSWORD}@/paygate_x?host={tmp_path}&port=1"
    result = run_cli("status", "--json", dsn=nowhere)
    assert result.code == ExitCode.UNAVAILABLE
    target = json.loads(result.out)["status"]["target"]
    assert target["database"] == "paygate_x" and target["host"] == str(tmp_path) and target["port"] == "1"
    assert PASSWORD not in result.out + result.err


def test_an_empty_database_says_wrong_database_before_run_migrate(empty_dsn: str) -> None:
    database = conninfo_to_dict(empty_dsn)["dbname"]
    result = run_cli("status", dsn=empty_dsn)
    assert result.code == ExitCode.FAILED
    first = result.out.splitlines()[0]
    assert "wrong database?" in first and f"database {database}" in first
    assert first.index("wrong database?") < first.index("run `paygate migrate`")
    tick = run_cli("run-tick", "webhooks", dsn=empty_dsn)
    assert tick.code == ExitCode.CONFIG
    assert tick.err.index("wrong database?") < tick.err.index("run `paygate migrate`")
    dry = run_cli("migrate", "--dry-run", dsn=empty_dsn)
    assert dry.code == 0 and f"target: database {database}" in dry.out and "wrong database?" in dry.out


@pytest.mark.parametrize("args", [["halt", "--reason", "x"], ["resume"], ["drain", "--instance", "h", "--force"],
                                  ["undrain", "--instance", "h"], ["replay", "webhooks", "1"], ["recover-check"]],
                         ids=lambda a: a[0])
def test_every_dry_run_and_every_prompt_names_the_target(dsn: str, args: list[str]) -> None:
    database = conninfo_to_dict(dsn)["dbname"]
    dry = run_cli(*args, "--dry-run", dsn=dsn, PAYGATE_CONTEXT="staging-1")
    assert dry.code in (0, 1), dry.err
    assert f"target: database {database} on socket" in dry.out and "context staging-1" in dry.out
    assert json.loads(run_cli(*args, "--dry-run", "--json", dsn=dsn).out)["target"]["database"] == database
    asked = run_cli(*args, dsn=dsn, tty=True, stdin="n\n")
    if args[0] != "replay":  # replay asks only when a row is replayable
        assert asked.code == ExitCode.USAGE and f"database {database}" in asked.err


def test_a_production_context_refuses_a_write_with_only_yes(dsn: str, db: psycopg.Connection) -> None:
    refused = run_cli("halt", "--reason", "x", "--yes", dsn=dsn, **PROD)
    assert refused.code == ExitCode.USAGE
    assert "--context prod-eu" in refused.err and "production" in refused.err
    assert _halts(db) == 0
    wrong = run_cli("halt", "--reason", "x", "--yes", "--context", "staging-1", dsn=dsn, **PROD)
    assert wrong.code == ExitCode.USAGE and "does not match" in wrong.err
    assert _halts(db) == 0
    accepted = run_cli("halt", "--reason", "x", "--yes", "--context", "prod-eu", dsn=dsn, **PROD)
    assert accepted.code == 0, accepted.err
    assert _halts(db) == 1


def test_a_production_context_on_a_tty_needs_the_name_typed(dsn: str, db: psycopg.Connection) -> None:
    said_yes = run_cli("halt", "--reason", "x", dsn=dsn, tty=True, stdin="y\n", **PROD)
    assert said_yes.code == ExitCode.USAGE and "type the context name (prod-eu)" in said_yes.err
    assert _halts(db) == 0
    typed = run_cli("halt", "--reason", "x", dsn=dsn, tty=True, stdin="prod-eu\n", **PROD)
    assert typed.code == 0, typed.err
    assert _halts(db) == 1


def test_migrate_against_production_needs_the_context_and_elsewhere_asks_nothing(empty_dsn: str) -> None:
    refused = run_cli("migrate", dsn=empty_dsn, **PROD)
    assert refused.code == ExitCode.USAGE and "--yes --context prod-eu" in refused.err
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT to_regclass('paygate.schema_migrations')").fetchone()[0] is None
    assert run_cli("migrate", "--yes", "--context", "prod-eu", dsn=empty_dsn, **PROD).code == 0
    assert run_cli("migrate", dsn=empty_dsn).code == 0  # no context: unattended deploys unchanged


def test_a_context_mismatch_fails_even_on_a_dry_run(dsn: str) -> None:
    result = run_cli("drain", "--instance", "h", "--force", "--dry-run", "--context", "prod-eu", dsn=dsn)
    assert result.code == ExitCode.USAGE and "no context" in result.err


def test_production_without_a_context_name_is_configuration(dsn: str) -> None:
    result = run_cli("halt", "--reason", "x", "--yes", dsn=dsn, PAYGATE_CONTEXT_PRODUCTION="1")
    assert result.code == ExitCode.CONFIG and "PAYGATE_CONTEXT" in result.err


def test_sslmode_bogus_is_configuration_at_once(dsn: str) -> None:
    for args in (["status"], ["run-tick", "webhooks"], ["migrate"]):
        result = run_cli(*args, dsn=make_conninfo(dsn, sslmode="bogus"))
        assert result.code == ExitCode.CONFIG, (args, result.err)
        assert "invalid sslmode value" in result.err


@pytest.fixture
def unreadable_socket_dir() -> Iterator[str]:
    # Outside tmp_path: pytest's base directory is 0700, which would deny the other user on its own.
    path = tempfile.mkdtemp(prefix="pgdeny-", dir="/tmp")
    os.chmod(path, 0o000)
    try:
        yield path
    finally:
        os.chmod(path, 0o700)
        shutil.rmtree(path, ignore_errors=True)


def test_a_socket_dir_the_os_user_cannot_enter_is_configuration(unreadable_socket_dir: str) -> None:
    # Root passes every permission check through CAP_DAC_OVERRIDE (and DAC_READ_SEARCH), so as root
    # the CLI runs without them (a real OS refusal). Still root, it reads the checkout and its venv
    # wherever they are (a private 0700 clone included), which another user could not.
    dsn = f"postgresql:///postgres?host={unreadable_socket_dir}&user=postgres"
    command = paygate_cmd("status")
    if os.geteuid() == 0:
        dropped = "-dac_override,-dac_read_search"
        command = ["setpriv", f"--inh-caps={dropped}", f"--bounding-set={dropped}", "--", *command]
    proc = subprocess.run(command, env=base_environ(dsn), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, cwd="/")
    assert "Permission denied" in proc.stderr, proc.stderr
    assert proc.returncode == ExitCode.CONFIG, proc.stderr
    assert "may not reach the Postgres socket" in proc.stderr
