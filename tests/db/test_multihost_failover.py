"""A multi-host DSN (`host=P,S … target_session_attrs=read-write`) through a failover, against a real
primary and streaming standby (tests/support/pg_replication.py) and real `paygate` processes: a tick
runs on the primary and says so; the primary is SIGKILLed and the next tick exits 69 "no writer"
(libpq refuses the standby as read-only); after pg_promote() the next tick exits 0 on the new
primary and names it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest

from tests.support.cli import Result, base_environ, run_proc
from tests.support.pg_replication import ReplicatedPair


@pytest.fixture
def pair() -> Iterator[ReplicatedPair]:
    with ReplicatedPair() as replicated:
        yield replicated


def tick(environ: dict[str, str]) -> Result:
    # subscriptions needs no RPC: the test is about the database alone.
    return run_proc("--log-format", "json", "run-tick", "subscriptions", "--once", "--json", environ=environ,
                    timeout=30)


def database_log(result: Result) -> dict[str, object]:
    records = [json.loads(line) for line in result.err.splitlines() if line.startswith("{")]
    [record] = [r for r in records if r.get("msgid") == "tick.database"]
    assert record["level"] == "info"  # a multi-host DSN: which host answered is said at info level
    return record


def test_a_tick_follows_the_writer_through_kill_and_promotion(pair: ReplicatedPair) -> None:
    dsn = pair.multihost_dsn("paygate", connect_timeout=2)
    environ = base_environ(dsn, PAYGATE_CONNECT_TIMEOUT="2s")

    first = tick(environ)
    assert first.code == 0, first.err
    assert json.loads(first.out)["run_tick"]["database"] == {
        "host": pair.primary_socket, "port": "55432", "database": "paygate", "writer": True, "in_recovery": False}
    assert database_log(first)["db_host"] == pair.primary_socket
    status = json.loads(run_proc("status", "--json", environ=environ).out)["status"]
    assert status["database"]["host"] == pair.primary_socket and status["database"]["writer"] is True
    pair.wait_caught_up()

    pair.kill_primary()
    no_writer = tick(environ)
    assert no_writer.code == 69, no_writer.err
    last = json.loads(no_writer.err.strip().splitlines()[-1])
    assert last["msgid"] == "db.no_writer"
    assert last["message"].startswith("no writer: no host of the database URL accepts writes")
    assert "session is read-only" in last["message"] and pair.standby_socket in last["message"]
    status_down = run_proc("status", "--json", environ=environ)
    assert status_down.code == 69
    down = json.loads(status_down.out)["status"]
    assert down["ready"] is False
    assert down["problems"][0].startswith("no writer: no host of the database URL accepts writes")
    assert down["target"]["host"] == f"{pair.primary_socket},{pair.standby_socket}"  # the hosts listed

    pair.promote()
    after = tick(environ)
    assert after.code == 0, after.err
    reached = json.loads(after.out)["run_tick"]["database"]
    assert (reached["host"], reached["writer"]) == (pair.standby_socket, True)
    record = database_log(after)
    assert record["db_host"] == pair.standby_socket and pair.standby_socket in str(record["msg"])
    # The heartbeats of both runs are there: the standby had replayed the first one before the kill.
    with psycopg.connect(pair.standby_dsn("paygate")) as conn:
        outcomes = [row[0] for row in conn.execute(
            "SELECT outcome FROM paygate.worker_runs WHERE worker = 'subscriptions' ORDER BY id")]
    assert outcomes == ["ok", "ok"]
