"""The tick runner with real processes: lock exclusivity (exit 75), a killed holder frees the lock at
once, SIGTERM finishes cleanly, concurrency slots, heartbeats, metrics, the DB vanishing (69)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from paygate_cli.catalogue import RESERVED_WORKER_IDS, WORKERS
from paygate_cli.db.locks import LOCK_NAMESPACE, MIGRATE_KEY
from paygate_cli.errors import ExitCode
from paygate_cli.ticks.runner import next_slot
from tests.support.cli import run_cli, run_proc, spawn
from tests.support.pg import private_cluster


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


def lock_held(db: psycopg.Connection, worker: str) -> int:
    key = WORKERS[worker].lock_keys()[0]
    return db.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = %s"
                      " AND granted", (LOCK_NAMESPACE, key)).fetchone()[0]


def test_lock_ids_are_distinct_across_every_worker_and_slot() -> None:
    keys = [MIGRATE_KEY]
    for spec in WORKERS.values():
        keys += spec.lock_keys()
    assert len(keys) == len(set(keys))
    assert len(set(RESERVED_WORKER_IDS.values())) == len(RESERVED_WORKER_IDS)
    assert set(WORKERS) <= set(RESERVED_WORKER_IDS)


@given(started=st.floats(0, 1e6), elapsed=st.floats(0, 1e4), every=st.floats(0.01, 100))
def test_next_slot_is_the_first_slot_after_now_and_never_bursts(started: float, elapsed: float, every: float) -> None:
    now = started + elapsed
    slot = next_slot(started, now, every)
    assert slot > now - 1e-6
    assert slot - now <= every + 1e-6  # at most one interval ahead: overrun slots skipped, not replayed
    k = (slot - started) / every
    assert abs(k - round(k)) < 1e-6


def test_second_process_exits_75_while_first_holds_the_lock(dsn: str, db: psycopg.Connection) -> None:
    holder = spawn("run-tick", "idempotency_sweep", "--every", "0.2s", "--for", "20s", dsn=dsn)
    try:
        wait_for(lambda: lock_held(db, "idempotency_sweep") == 1)
        second = run_proc("run-tick", "idempotency_sweep", "--lock-wait", "0", dsn=dsn)
        assert second.code == ExitCode.SKIPPED
        assert "lock held" in second.err
        waited = run_proc("run-tick", "idempotency_sweep", "--lock-wait", "0.5s", dsn=dsn)
        assert waited.code == ExitCode.SKIPPED
    finally:
        holder.kill()
        holder.wait()


def test_a_run_started_before_the_last_one_ends_takes_over_at_its_deadline(dsn: str, db: psycopg.Connection) -> None:
    """cron's handover: the next minute's run starts while the last one still ticks and waits for the
    lock. `--for` counts from each run's start, the lock wait included, so the next run ticks the
    moment the last one stops (no hole) and stops at its own start + --for (counted from the lock,
    each run would end later and later until a start found the lock held past its --lock-wait)."""
    first = spawn("run-tick", "idempotency_sweep", "--every", "0.5s", "--for", "8s", dsn=dsn)
    try:
        wait_for(lambda: lock_held(db, "idempotency_sweep") == 1)
        started = time.monotonic()
        second = spawn("run-tick", "idempotency_sweep", "--every", "0.5s", "--for", "8s", "--lock-wait", "20s",
                       dsn=dsn)
        _, err = second.communicate(timeout=60)
        lived = time.monotonic() - started
        assert second.returncode == 0, err
        assert first.wait(timeout=30) == 0
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    runs = {pid: (first_start, last_end, n) for pid, first_start, last_end, n in db.execute(
        "SELECT pid, min(started_at), max(finished_at), count(*) FROM paygate.worker_runs "
        "WHERE worker = 'idempotency_sweep' GROUP BY pid")}
    assert set(runs) == {first.pid, second.pid}
    (_, first_end, _), (second_start, _, ticks) = runs[first.pid], runs[second.pid]
    assert ticks >= 1 and second_start >= first_end  # one holder at a time
    assert (second_start - first_end).total_seconds() < 2.5  # the waiting run took over at once
    # Its 8 s counted from its start: about 8 s and its start-up, never the 8 s after the lock
    # (which came 6-8 s after its start).
    assert lived < 13, lived


def test_killed_holder_frees_the_lock_at_once(dsn: str, db: psycopg.Connection) -> None:
    holder = spawn("run-tick", "idempotency_sweep", "--every", "0.2s", "--for", "60s", dsn=dsn)
    wait_for(lambda: lock_held(db, "idempotency_sweep") == 1)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    wait_for(lambda: lock_held(db, "idempotency_sweep") == 0, timeout=5)
    after = run_proc("run-tick", "idempotency_sweep", "--lock-wait", "0", dsn=dsn)
    assert after.code == 0, after.err


def test_sigterm_mid_loop_finishes_the_tick_and_exits_0(dsn: str, db: psycopg.Connection) -> None:
    proc = spawn("run-tick", "webhooks", "--every", "0.1s", "--for", "60s", "--json", dsn=dsn)
    wait_for(lambda: db.execute("SELECT count(*) FROM paygate.worker_runs WHERE worker = 'webhooks'"
                                " AND outcome = 'ok'").fetchone()[0] >= 3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    summary = json.loads(out)["run_tick"]
    assert summary["stopped_by"] == "SIGTERM"
    running = db.execute("SELECT count(*) FROM paygate.worker_runs WHERE outcome = 'running'").fetchone()[0]
    assert running == 0  # every heartbeat row was finished
    assert lock_held(db, "webhooks") == 0


def test_concurrency_slots_let_four_webhooks_processes_run_and_refuse_a_fifth(dsn: str, db: psycopg.Connection) -> None:
    procs = [spawn("run-tick", "webhooks", "--every", "0.2s", "--for", "30s", "--lock-wait", "0", dsn=dsn)
             for _ in range(4)]
    try:
        keys = WORKERS["webhooks"].lock_keys()
        wait_for(lambda: db.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = ANY(%s)",
            (LOCK_NAMESPACE, keys)).fetchone()[0] == 4)
        fifth = run_proc("run-tick", "webhooks", "--lock-wait", "0", dsn=dsn)
        assert fifth.code == ExitCode.SKIPPED
        assert "all 4 slots" in fifth.err
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_loop_writes_a_heartbeat_per_tick_and_stops_after_for(dsn: str, db: psycopg.Connection) -> None:
    result = run_proc("run-tick", "idempotency_sweep", "--every", "0.2s", "--for", "1s", "--json", dsn=dsn)
    assert result.code == 0
    ticks = json.loads(result.out)["run_tick"]["ticks"]
    assert 3 <= ticks <= 6  # 5 slots in 1 s; scheduling jitter may cost one, never a burst beyond
    rows = db.execute("SELECT outcome, finished_at IS NOT NULL FROM paygate.worker_runs"
                      " WHERE worker = 'idempotency_sweep'").fetchall()
    assert len(rows) == ticks and all(o == "ok" and f for o, f in rows)


def test_metrics_textfile_is_written_with_last_success(dsn: str, tmp_path: Path) -> None:
    result = run_cli("run-tick", "webhooks", "--metrics-dir", str(tmp_path), dsn=dsn)
    assert result.code == 0
    text = (tmp_path / "paygate_webhooks_slot0.prom").read_text()
    from prometheus_client.parser import text_string_to_metric_families

    samples = {s.name: s for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples["paygate_tick_exit_code"].value == 0
    assert samples["paygate_tick_last_success_timestamp_seconds"].value > time.time() - 60
    assert samples["paygate_tick_last_success_timestamp_seconds"].labels["worker"] == "webhooks"
    assert not list(tmp_path.glob("*.prom.*"))  # no temp files left behind


def test_drained_instance_takes_no_new_work(dsn: str, db: psycopg.Connection) -> None:
    db.execute("INSERT INTO paygate.idempotency_keys (scope, key, request_hash, expires_at)"
               " VALUES ('s', 'k', '\\x00', now() - interval '1 hour')")
    db.execute("INSERT INTO paygate.instances (instance_id, drained_at, drained_by) VALUES ('host-a', now(), 't')")
    result = run_cli("run-tick", "idempotency_sweep", "--json", dsn=dsn, PAYGATE_INSTANCE_ID="host-a")
    assert result.code == 0 and json.loads(result.out)["run_tick"]["drained_ticks"] == 1
    assert db.execute("SELECT count(*) FROM paygate.idempotency_keys").fetchone()[0] == 1
    result = run_cli("run-tick", "idempotency_sweep", dsn=dsn, PAYGATE_INSTANCE_ID="host-b")
    assert db.execute("SELECT count(*) FROM paygate.idempotency_keys").fetchone()[0] == 0


@pytest.mark.slow
def test_postgres_vanishing_mid_loop_exits_69() -> None:
    with private_cluster() as cluster:
        assert run_proc("migrate", dsn=cluster.dsn()).code == 0
        proc = spawn("run-tick", "idempotency_sweep", "--every", "0.1s", "--for", "60s", dsn=cluster.dsn())
        with psycopg.connect(cluster.dsn(), autocommit=True) as db:
            wait_for(lambda: db.execute("SELECT count(*) FROM paygate.worker_runs").fetchone()[0] >= 2)
        cluster.stop()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == ExitCode.UNAVAILABLE, err


def test_a_lock_timeout_fails_the_tick_without_calling_the_database_gone(dsn: str) -> None:
    """A statement that fails on a live connection (lock timeout, deadlock) is a failed tick: exit 1,
    recorded on the heartbeat row, retried next tick; only a lost connection means 69."""
    with psycopg.connect(dsn) as blocker:
        blocker.execute("LOCK TABLE paygate.webhook_outbox IN ACCESS EXCLUSIVE MODE")
        result = run_cli("run-tick", "webhooks", "--json", dsn=dsn, PAYGATE_LOCK_TIMEOUT="300ms")
        blocker.rollback()
    assert result.code == ExitCode.FAILED, result.err
    with psycopg.connect(dsn) as db:
        outcome, error = db.execute("SELECT outcome, error FROM paygate.worker_runs WHERE worker = 'webhooks'"
                                    " ORDER BY id DESC LIMIT 1").fetchone()
    assert outcome == "failed" and "LockNotAvailable" in error
