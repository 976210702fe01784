"""`status` judges each worker's liveness against its cadence (the registry's catalogue): a worker
overdue, failing, or never run while its work waits is not ready, and its last error is shown,
redacted. A worker never run with nothing waiting for it is not deployed here: shown, not a blocker.
Heartbeat rows are written straight into worker_runs (the rows the tick runner writes), aged in DB time."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from paygate_cli.errors import ExitCode
from tests.support.chain_env import chain_environ
from tests.support.cli import run_cli, spawn
from tests.support.devnet_support import DevnetHandle, start_devnet

RUN_SQL = """
INSERT INTO paygate.worker_runs (worker, instance_id, slot, pid, started_at, finished_at, outcome, error)
VALUES (%s, 'host-a', 0, 4242, now() - %s::interval, now() - %s::interval + interval '50 ms', %s, %s)
"""
FAKE_SEED = "S" + "A" * 55  # shaped like a Stellar seed: status must never print such a thing


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path_factory.mktemp("devnet"), lanes=1, users=1)
    yield handle
    handle.stop()


@pytest.fixture
def configured(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> dict[str, str]:
    return chain_environ(devnet, dsn, tmp_path / "keys")


def status(environ: dict[str, str]) -> tuple[int, dict]:
    result = run_cli("status", "--json", environ=environ)
    return result.code, json.loads(result.out)["status"]


def worker(report: dict, name: str) -> dict:
    return next(w for w in report["workers"] if w["worker"] == name)


def test_never_run_with_nothing_waiting_is_shown_but_ready(configured: dict[str, str]) -> None:
    code, report = status(configured)
    assert code == 0 and report["ready"] is True, report["problems"]
    assert {w["liveness"] for w in report["workers"]} == {"never run"}
    human = run_cli("status", "--plain", environ=configured).out
    assert "worker:relay\tnever run\tlast run never" in human


def test_worker_overdue_against_its_cadence_is_not_ready(configured: dict[str, str], db: psycopg.Connection) -> None:
    # funding ticks every 2 s; its last run, a success, was 12 minutes ago
    db.execute(RUN_SQL, ("funding", "12 min", "12 min", "ok", None))
    code, report = status(configured)
    assert code == ExitCode.FAILED and report["ready"] is False
    assert report["problems"] == ["funding overdue: last run 12m ago (cadence 2s, overdue after 62s)"]
    assert worker(report, "funding")["liveness"] == "overdue"
    # a slow worker (retention: every 300 s) 4 minutes after its last run is on time
    db.execute(RUN_SQL, ("retention", "4 min", "4 min", "ok", None))
    db.execute(RUN_SQL, ("funding", "1 s", "1 s", "ok", None))
    code, report = status(configured)
    assert code == 0, report["problems"]
    assert worker(report, "retention")["liveness"] == "live" and worker(report, "funding")["liveness"] == "live"


def test_never_run_while_its_work_waits_is_not_ready(configured: dict[str, str], db: psycopg.Connection) -> None:
    db.execute("INSERT INTO paygate.idempotency_keys (scope, key, request_hash, expires_at)"
               " VALUES ('charge', 'k1', '\\x00', now() - interval '1 h')")
    code, report = status(configured)
    assert code == ExitCode.FAILED
    assert report["problems"] == ["idempotency_sweep has never run while work waits (1 in idempotency.expired)"]
    assert worker(report, "idempotency_sweep")["liveness"] == "never run, work waiting"


@pytest.mark.parametrize("outcome", ["error", "failed", "needs_human"])
def test_last_run_failing_is_not_ready_and_shows_its_error_redacted(configured: dict[str, str],
                                                                   db: psycopg.Connection, outcome: str) -> None:
    error = f"RPC https://rpc.example/v1/APIKEY123456 said no; seed {FAKE_SEED}"
    db.execute(RUN_SQL, ("webhooks", "3 s", "3 s", "ok", None))
    db.execute(RUN_SQL, ("webhooks", "1 s", "1 s", outcome, error))
    result = run_cli("status", "--json", environ=configured)
    assert result.code == ExitCode.FAILED
    report = json.loads(result.out)["status"]
    [problem] = report["problems"]
    assert problem.startswith(f"webhooks last run {outcome}: RPC https://rpc.example said no; seed S***"), problem
    assert worker(report, "webhooks")["last_error"] == "RPC https://rpc.example said no; seed S***"
    for mode in ([], ["--plain"]):
        shown = run_cli("status", *mode, environ=configured).out
        assert f"{outcome}: RPC https://rpc.example said no" in shown
        assert FAKE_SEED not in shown and "APIKEY123456" not in shown
    assert FAKE_SEED not in result.out and "APIKEY123456" not in result.out


def test_a_tick_stuck_past_the_grace_is_overdue(configured: dict[str, str], db: psycopg.Connection) -> None:
    db.execute(RUN_SQL, ("settlement", "10 min", "10 min", "ok", None))
    db.execute("INSERT INTO paygate.worker_runs (worker, instance_id, slot, pid, started_at)"
               " VALUES ('settlement', 'host-a', 0, 4242, now() - interval '5 min')")  # still 'running'
    code, report = status(configured)
    assert code == ExitCode.FAILED
    assert report["problems"] == ["settlement overdue: last run 5m ago (cadence 2s, overdue after 62s)"]


def test_workers_shows_the_last_run_relative(dsn: str, db: psycopg.Connection) -> None:
    db.execute(RUN_SQL, ("funding", "12 min", "12 min", "failed", "deadlock detected"))
    document = json.loads(run_cli("workers", "--json", dsn=dsn).out)
    funding = next(w for w in document["workers"] if w["worker"] == "funding")
    assert funding["last_run"] == "12m ago" and funding["last_error"] == "deadlock detected"
    plain = run_cli("workers", "--plain", dsn=dsn).out
    assert any(line.startswith("funding\t") and "\t12m ago\t" in line for line in plain.splitlines())


def test_lock_holder_shows_instance_os_pid_backend_pid_and_held_for(dsn: str, db: psycopg.Connection) -> None:
    instance = "paygate-webhooks-7d9f8c6b5-x2x9q.worker-pool-eu-west-1.internal"  # longer than application_name
    holder = spawn("run-tick", "webhooks", "--every", "0.2s", "--for", "30s", dsn=dsn, PAYGATE_INSTANCE_ID=instance)
    try:
        for _ in range(200):
            # The heartbeat first, then the report read after it (the full instance comes from it).
            ticked = db.execute("SELECT count(*) FROM paygate.worker_runs WHERE pid = %s", (holder.pid,)).fetchone()[0]
            report = json.loads(run_cli("status", "--json", dsn=dsn).out)["status"]
            if report["locks"] and ticked:
                break
            time.sleep(0.05)  # polling for the spawned process to take its lock, not a timing assertion
        [lock] = report["locks"]
        assert (lock["lock"], lock["slot"], lock["instance"], lock["os_pid"]) == ("webhooks", 0, instance, holder.pid)
        backend = db.execute("SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'paygate:lock:webhooks%'"
                             ).fetchone()[0]
        assert lock["backend_pid"] == backend != holder.pid
        assert lock["held_for_s"] is not None and lock["held_for_s"] >= 0 and lock["held_for"].endswith("s")
        plain = run_cli("status", "--plain", dsn=dsn).out
        assert f"lock:webhooks\t{instance} pid {holder.pid}\tslot 0, backend pid {backend}, held " in plain
    finally:
        holder.terminate()
        holder.communicate(timeout=60)
