"""No writer: a hot standby, or a database whose sessions default to read-only, can answer `status`
(it only reads) but no tick: `run-tick` exits 69 with one clear line (msgid db.no_writer), never 70
with a ReadOnlySqlTransaction traceback, and the same when the database turns read-only under a
running tick. Against a real streaming standby (tests/support/pg_replication.py) and a real devnet."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.support.chain_env import chain_environ
from tests.support.cli import run_cli, run_proc, spawn
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.pg_replication import ReplicatedPair

HINT = "with a multi-host DSN add target_session_attrs=read-write, docs/configuration.md"


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicatedPair]:
    with ReplicatedPair() as replicated:
        yield replicated


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path_factory.mktemp("devnet"), lanes=2, users=1)
    yield handle
    handle.stop()


def tick_environ(devnet: DevnetHandle, dsn: str, keys: Path) -> dict[str, str]:
    environ = chain_environ(devnet, dsn, keys, lanes=2)
    environ["PAYGATE_OBSERVER_START_LEDGER"] = "1"
    return environ


def assert_no_writer_exit(code: int, err: str, host: str) -> None:
    assert code == 69, err
    assert f"no writer: the database at host {host} port 55432 is a standby in recovery (read-only); {HINT}" in err
    assert "ReadOnlySqlTransaction" not in err and "Traceback" not in err and "read-only transaction" not in err


def test_status_on_the_standby_answers_and_says_there_is_no_writer(pair: ReplicatedPair) -> None:
    result = run_cli("status", "--json", dsn=pair.standby_dsn())
    assert result.code == 1, result.err  # not ready, the way status says it
    report = json.loads(result.out)["status"]
    assert report["ready"] is False
    database = report["database"]
    assert (database["host"], database["port"]) == (pair.standby_socket, "55432")
    assert database["writer"] is False and database["in_recovery"] is True
    assert (f"no writer: the database at host {pair.standby_socket} port 55432 is a standby in recovery "
            f"(read-only); {HINT}") in report["problems"]
    assert report["schema"]["schema_version"] == report["schema"]["expected_version"]  # it read the replica

    human = run_cli("status", dsn=pair.standby_dsn())
    assert human.code == 1
    assert (f"database: standby in recovery (read-only, no writer), host {pair.standby_socket} port 55432"
            in human.out)


def test_read_only_commands_work_on_the_standby_and_writes_exit_69(pair: ReplicatedPair, devnet: DevnetHandle,
                                                                    tmp_path: Path) -> None:
    environ = tick_environ(devnet, pair.standby_dsn(), tmp_path / "keys")
    inspected = run_cli("nonce-inspect", "--json", environ=environ)
    assert inspected.code == 0, inspected.err
    assert json.loads(inspected.out)["needs_human"] is False
    halted = run_cli("--log-format", "json", "halt", "--reason", "drill", "--yes", environ=environ)
    assert halted.code == 69, halted.err
    last = json.loads(halted.err.strip().splitlines()[-1])
    assert last["msgid"] == "db.no_writer" and "cannot execute INSERT in a read-only transaction" in last["msg"]
    assert HINT in last["msg"]


def test_status_on_the_primary_names_the_writer(pair: ReplicatedPair) -> None:
    result = run_cli("status", "--json", dsn=pair.primary_dsn())
    database = json.loads(result.out)["status"]["database"]
    assert (database["host"], database["port"]) == (pair.primary_socket, "55432")
    assert database["writer"] is True and database["in_recovery"] is False
    assert not [p for p in json.loads(result.out)["status"]["problems"] if p.startswith("no writer")]


@pytest.mark.parametrize("worker", ["funding", "observer"])
def test_a_tick_on_the_standby_exits_69_no_writer(pair: ReplicatedPair, devnet: DevnetHandle, tmp_path: Path,
                                                    worker: str) -> None:
    environ = tick_environ(devnet, pair.standby_dsn(), tmp_path / "keys")
    result = run_proc("--log-format", "json", "run-tick", worker, "--once", environ=environ)
    assert_no_writer_exit(result.code, result.err, pair.standby_socket)
    last = json.loads(result.err.strip().splitlines()[-1])
    assert last["msgid"] == "db.no_writer"


def test_a_tick_on_a_read_only_database_exits_69(dsn: str, devnet: DevnetHandle, tmp_path: Path) -> None:
    """default_transaction_read_only = on (the suite's own cluster, this test's database only)."""
    name = conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
    result = run_cli("run-tick", "funding", "--once", environ=tick_environ(devnet, dsn, tmp_path / "keys"))
    assert result.code == 69, result.err
    assert "is read-only (default_transaction_read_only = on)" in result.err and HINT in result.err
    status = json.loads(run_cli("status", "--json", dsn=dsn).out)["status"]
    assert status["database"]["writer"] is False and status["database"]["read_only"] is True
    assert status["database"]["in_recovery"] is False


def _wait_for(predicate: object, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_database_turning_read_only_inside_a_tick_exits_69_not_70(
        pair: ReplicatedPair, devnet: DevnetHandle, tmp_path: Path) -> None:
    """The primary is fenced read-only (ALTER SYSTEM default_transaction_read_only, reloaded: what a
    failover tool does to an old primary) while the observer's tick waits on a slow getEvents: its
    next write is refused with SQLSTATE 25006 inside the tick."""
    db = pair.create_database(f"ro_{uuid.uuid4().hex[:8]}")
    environ = tick_environ(devnet, pair.primary_dsn(db), tmp_path / "keys")
    devnet.set_fault("slow", ms=3000, methods=["getEvents"])
    proc = spawn("run-tick", "observer", "--once", environ=environ)
    try:
        with psycopg.connect(pair.primary_dsn(db), autocommit=True) as conn:
            _wait_for(lambda: conn.execute("SELECT count(*) FROM paygate.worker_runs WHERE worker = 'observer'")
                      .fetchone() == (1,), "the observer's heartbeat")
            conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
            conn.execute("SELECT pg_reload_conf()")
        _out, err = proc.communicate(timeout=30)
    finally:
        devnet.clear_faults()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with psycopg.connect(pair.primary_dsn(db), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET default_transaction_read_only")
            conn.execute("SELECT pg_reload_conf()")
    assert proc.returncode == 69, err
    assert f"no writer: the database at host {pair.primary_socket} port 55432 refused a write" in err, err
    assert "Traceback" not in err and "tick crashed" not in err and HINT in err
    with psycopg.connect(pair.primary_dsn(db)) as conn:  # the tick's writes rolled back: no cursor stored
        assert conn.execute("SELECT count(*) FROM paygate.observer_cursor").fetchone() == (0,)
