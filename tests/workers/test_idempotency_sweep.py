"""The idempotency sweep: only expired keys, bounded batches, index-driven."""

from __future__ import annotations

import json

import psycopg

from paygate_cli.workers.idempotency_sweep import DELETE_EXPIRED_SQL, MAX_BATCHES_PER_TICK
from tests.support.cli import run_cli


def add_keys(db: psycopg.Connection, prefix: str, count: int, seconds_from_now: int) -> None:
    db.execute("INSERT INTO paygate.idempotency_keys (scope, key, request_hash, expires_at)"
               " SELECT 'api', %s || g, '\\x00', now() + make_interval(secs => %s) FROM generate_series(1, %s) g",
               (prefix, seconds_from_now, count))


def test_deletes_only_expired_keys(dsn: str, db: psycopg.Connection) -> None:
    add_keys(db, "old-", 25, -10)
    add_keys(db, "live-", 7, 3600)
    result = run_cli("run-tick", "idempotency_sweep", "--batch", "10", "--json", dsn=dsn)
    assert result.code == 0 and json.loads(result.out)["run_tick"]["processed"] == 25
    left = {r[0] for r in db.execute("SELECT key FROM paygate.idempotency_keys")}
    assert left == {f"live-{i}" for i in range(1, 8)}


def test_one_tick_is_bounded(dsn: str, db: psycopg.Connection) -> None:
    add_keys(db, "old-", 100, -10)
    result = run_cli("run-tick", "idempotency_sweep", "--batch", "5", "--json", dsn=dsn)
    assert json.loads(result.out)["run_tick"]["processed"] == 5 * MAX_BATCHES_PER_TICK
    remaining = db.execute("SELECT count(*) FROM paygate.idempotency_keys").fetchone()[0]
    assert remaining == 100 - 5 * MAX_BATCHES_PER_TICK  # the next tick continues


def test_batch_walks_the_expires_at_index_not_the_table(db: psycopg.Connection) -> None:
    add_keys(db, "live-", 50_000, 3600)
    add_keys(db, "old-", 100, -10)
    db.execute("ANALYZE paygate.idempotency_keys")
    plan = db.execute("EXPLAIN (FORMAT JSON) " + DELETE_EXPIRED_SQL, (1000,)).fetchone()[0]
    text = json.dumps(plan)
    assert "idempotency_keys_expires_at" in text
    assert '"Seq Scan"' not in text
