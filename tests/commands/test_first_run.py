"""First run and exit codes: a schema behind the code, a refused login, an unwritable metrics
directory, a lock skip, fatal lines in the log format, workers that cannot work."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from paygate_cli.db.locks import LOCK_NAMESPACE
from paygate_cli.db.migrate import available_migrations
from paygate_cli.errors import ExitCode
from paygate_cli.sandbox.pg_cluster import _as_postgres, find_bindir
from tests.support.cli import base_environ, run_cli, run_proc
from tests.support.pg import private_cluster

SHIPPED = max(m.version for m in available_migrations())
SRC = Path(__file__).resolve().parents[2] / "src" / "paygate_cli"


def _runs(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM paygate.worker_runs").fetchone()[0]


@pytest.fixture
def newer_build(tmp_path: Path, dsn: str) -> dict[str, str]:
    """The environment of a build that ships one migration more than this database has: a copy of
    the package with one more sql/NNNN file, run as its own process (the next release against a
    database nobody migrated yet)."""
    package = tmp_path / "build" / "paygate_cli"
    shutil.copytree(SRC, package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "sql" / f"{SHIPPED + 1:04d}_next.sql").write_text("SELECT 1;\n")
    return base_environ(dsn, PYTHONPATH=str(package.parent))


# -- schema behind the code: 78 with both versions, never 70 on UndefinedTable -------------------

def test_tick_before_any_migrate_exits_78_naming_the_versions(empty_dsn: str) -> None:
    result = run_cli("run-tick", "webhooks", dsn=empty_dsn)
    assert result.code == ExitCode.CONFIG, result.err
    assert f"has no paygate schema (schema is at version 0, this paygate needs {SHIPPED}); if it is the right " \
           "one, run `paygate migrate`" in result.err


def test_tick_on_a_schema_one_migration_behind_exits_78(newer_build: dict[str, str], db: psycopg.Connection) -> None:
    result = run_proc("run-tick", "idempotency_sweep", environ=newer_build)
    assert result.code == ExitCode.CONFIG, result.err
    assert f"schema is at version {SHIPPED}, this paygate needs {SHIPPED + 1}" in result.err
    assert _runs(db) == 0  # said before any tick


def test_commands_before_migrate_exit_78_not_70(empty_dsn: str) -> None:
    for args in (["halt", "--reason", "x", "--yes"], ["workers"], ["resume", "--yes"]):
        result = run_cli(*args, dsn=empty_dsn)
        assert result.code == ExitCode.CONFIG, (args, result.err)
        assert "run `paygate migrate`" in result.err
    assert run_cli("migrate", dsn=empty_dsn).code == 0
    assert run_cli("run-tick", "webhooks", dsn=empty_dsn).code == 0


# -- a refused login never fixes itself: 78, at once -------------------------------------------

def test_wrong_password_exits_78_without_retrying() -> None:
    with private_cluster() as cluster:
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            conn.execute("CREATE ROLE paygate_pw LOGIN PASSWORD 'right-one'")
        hba = cluster.datadir / "pg_hba.conf"
        hba.write_text("local all paygate_pw scram-sha-256\n" + hba.read_text())
        subprocess.run(_as_postgres([str(find_bindir() / "pg_ctl"), "-D", str(cluster.datadir), "reload"]),
                       check=True, capture_output=True)
        time.sleep(0.5)
        wrong = cluster.dsn().replace("user=postgres", "user=paygate_pw&password=wrong-one")
        right = cluster.dsn().replace("user=postgres", "user=paygate_pw&password=right-one")
        assert run_cli("migrate", dsn=right).code != ExitCode.CONFIG  # the rule lets the right password in
        for args in (["status"], ["run-tick", "webhooks"]):
            started = time.monotonic()
            result = run_cli(*args, dsn=wrong)
            assert result.code == ExitCode.CONFIG, (args, result.err)
            assert "password authentication failed" in result.err and "wrong-one" not in result.err
            assert time.monotonic() - started < 2  # not retried with backoff
        unknown_role = cluster.dsn().replace("user=postgres", "user=nobody_here")
        assert run_cli("status", dsn=unknown_role).code == ExitCode.CONFIG


# -- --metrics-dir is checked before the tick does work ------------------------------------------

@pytest.mark.parametrize("where", ["under_a_file", "proc"])
def test_unwritable_metrics_dir_exits_78_before_any_tick(dsn: str, db: psycopg.Connection, tmp_path: Path,
                                                         where: str) -> None:
    # A missing directory is created (as the writer would); one under a regular file cannot be, and
    # /proc refuses new files even to root: real unwritable places whoever runs the suite.
    (tmp_path / "a-file").write_text("")
    directory = str(tmp_path / "a-file" / "metrics") if where == "under_a_file" else "/proc/self"
    result = run_cli("run-tick", "webhooks", "--metrics-dir", directory, dsn=dsn)
    assert result.code == ExitCode.CONFIG, result.err
    assert "--metrics-dir" in result.err
    assert _runs(db) == 0


# -- a lock skip is not an error ----------------------------------------------------------------

def _hold_sweep_lock(dsn: str) -> psycopg.Connection:
    holder = psycopg.connect(dsn, autocommit=True)
    holder.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_NAMESPACE, 1100))  # idempotency_sweep slot 0
    return holder


def test_lock_skip_exits_75_without_an_error_line(dsn: str) -> None:
    with _hold_sweep_lock(dsn):
        text = run_cli("--log-format", "text", "run-tick", "idempotency_sweep", "--lock-wait", "0", dsn=dsn)
        as_json = run_cli("--log-format", "json", "run-tick", "idempotency_sweep", "--lock-wait", "0", dsn=dsn)
        quiet = run_cli("--log-level", "warning", "run-tick", "idempotency_sweep", "--lock-wait", "0", dsn=dsn)
    assert text.code == as_json.code == quiet.code == ExitCode.SKIPPED
    assert "error" not in text.err and "skipped" in text.err
    [line] = as_json.err.strip().splitlines()
    record = json.loads(line)
    assert record["level"] == "info" and record["msgid"] == "lock.held" and record["exit_code"] == 75
    assert quiet.err == ""


# -- fatal lines: where, in the log format, with journald priorities ----------------------------

def test_database_down_message_keeps_the_socket_and_port(tmp_path: Path) -> None:
    nowhere = f"postgresql:///postgres?host={tmp_path}&port=1&user=postgres"
    result = run_cli("status", dsn=nowhere)
    assert result.code == ExitCode.UNAVAILABLE
    assert f"{tmp_path}/.s.PGSQL.1" in result.err


def test_fatal_line_honours_log_format_json_and_journald(tmp_path: Path) -> None:
    nowhere = f"postgresql:///postgres?host={tmp_path}&port=1&user=postgres"
    as_json = run_cli("--log-format", "json", "run-tick", "webhooks", dsn=nowhere)
    record = json.loads(as_json.err.strip().splitlines()[-1])
    assert record["level"] == "error" and record["msgid"] == "db.unavailable" and record["exit_code"] == 69
    journald = run_proc("run-tick", "webhooks", dsn=nowhere, JOURNAL_STREAM="8:1234")
    last = journald.err.strip().splitlines()[-1]
    assert journald.code == ExitCode.UNAVAILABLE and last.startswith("<3>")
    assert json.loads(last[3:])["msgid"] == "db.unavailable"
    skipped_env = {"JOURNAL_STREAM": "8:1234"}
    usage = run_proc("run-tick", "webhooks", "--every", "fast", dsn=nowhere, **skipped_env)
    assert usage.code == ExitCode.USAGE and usage.err.strip().splitlines()[-1].startswith("<3>")


def test_status_json_prints_its_document_when_the_database_is_down(tmp_path: Path) -> None:
    nowhere = f"postgresql:///postgres?host={tmp_path}&port=1&user=postgres"
    result = run_cli("status", "--json", dsn=nowhere)
    assert result.code == ExitCode.UNAVAILABLE
    report = json.loads(result.out)["status"]
    assert report["ready"] is False and report["database"]["reachable"] is False
    assert "cannot connect to Postgres" in report["problems"][0]
    assert json.loads(result.err.strip().splitlines()[-1])["code"] == ExitCode.UNAVAILABLE


# -- workers that cannot work say so, even idle ------------------------------------------------

@pytest.mark.parametrize("worker", ["funding", "settlement", "observer"])
def test_worker_without_rpc_keys_or_contracts_exits_78_on_an_idle_tick(dsn: str, db: psycopg.Connection,
                                                                       worker: str) -> None:
    result = run_cli("run-tick", worker, dsn=dsn)
    assert result.code == ExitCode.CONFIG, result.err
    [line] = result.err.strip().splitlines()
    assert f"{worker} cannot work: missing an RPC endpoint (PAYGATE_RPC_URL)" in line
    assert "PAYGATE_BILLING_CONTRACT" in line
    if worker != "observer":
        assert "PAYGATE_LANE_SECRETS_FILE" in line and "PAYGATE_FEE_SECRET_FILE" in line
        assert "PAYGATE_JOURNAL_KEYS_FILE" in line
    # No tick ran: the one heartbeat says why the worker cannot start (slot -1: it holds none).
    assert db.execute("SELECT slot, outcome, error LIKE 'cannot start: %%' FROM paygate.worker_runs").fetchall() == [
        (-1, "error", True)]


def test_funding_names_only_what_is_missing(dsn: str, tmp_path: Path) -> None:
    (tmp_path / "lanes").write_text("S" + "A" * 55 + "\n")
    (tmp_path / "fee").write_text("S" + "B" * 55 + "\n")
    (tmp_path / "keys").write_text(json.dumps({"k1": "ab" * 32}))
    result = run_cli("run-tick", "funding", dsn=dsn, PAYGATE_RPC_URL="http://127.0.0.1:9",
                     PAYGATE_BILLING_CONTRACT="C" + "A" * 55, PAYGATE_LANE_SECRETS_FILE=str(tmp_path / "lanes"),
                     PAYGATE_FEE_SECRET_FILE=str(tmp_path / "fee"), PAYGATE_JOURNAL_KEYS_FILE=str(tmp_path / "keys"),
                     PAYGATE_JOURNAL_ACTIVE_KEY_ID="k1")
    assert result.code == ExitCode.CONFIG
    [line] = result.err.strip().splitlines()  # off a terminal the final line is JSON, like the logs
    assert json.loads(line)["msg"] == "funding cannot work: missing the USDC contract id (PAYGATE_USDC_CONTRACT)"


def test_status_on_a_schema_behind_still_prints_its_document(newer_build: dict[str, str],
                                                             db: psycopg.Connection) -> None:
    # As if the newer build's migration had created the outbox and not run yet here.
    db.execute("DROP TABLE paygate.webhook_outbox CASCADE")
    result = run_proc("status", "--json", environ=newer_build)
    assert result.code == ExitCode.FAILED, result.err
    report = json.loads(result.out)["status"]
    assert report["ready"] is False
    assert f"schema behind: schema is at version {SHIPPED}, this paygate needs {SHIPPED + 1}" in report["problems"][0]


def test_bad_flag_under_journald_is_one_prioritised_line() -> None:
    result = run_proc("run-tick", "webhooks", "--no-such-flag", JOURNAL_STREAM="8:1234")
    assert result.code == ExitCode.USAGE
    [line] = result.err.strip().splitlines()
    assert line.startswith("<3>") and "No such option: --no-such-flag" in json.loads(line[3:])["msg"]


def test_an_invalid_log_level_is_a_usage_error_not_a_crash() -> None:
    result = run_cli("--log-level", "bogus", "workers", "--offline")
    assert result.code == ExitCode.USAGE and "is not a log level" in result.err
