"""`paygate doctor`'s db.pooling against a real PgBouncer (Debian's) in front of the test cluster: session
pooling keeps a connection's server session its own (advisory locks hold), transaction pooling does
not, and doctor says so (exit 78, with the fix)."""

from __future__ import annotations

import json

from tests.support.cli import base_environ, run_cli
from tests.support.pgbouncer import pgbouncer


def _pooling(dsn: str) -> tuple[int, dict]:
    result = run_cli("doctor", "--only", "db", "--json", environ=base_environ(dsn))
    document = json.loads(result.out)
    return result.code, {c["id"]: c for c in document["checks"]}


def test_session_pooling_is_ok(dsn: str) -> None:
    with pgbouncer(dsn, "session") as pooled:
        code, checks = _pooling(pooled)
    assert checks["db.reachable"]["verdict"] == "ok"
    assert checks["db.pooling"]["verdict"] == "ok", checks["db.pooling"]
    assert code == 0


def test_transaction_pooling_fails_with_the_fix(dsn: str) -> None:
    with pgbouncer(dsn, "transaction") as pooled:
        code, checks = _pooling(pooled)
    pooling = checks["db.pooling"]
    assert pooling["verdict"] == "fail" and pooling["kind"] == "config", pooling
    assert "transaction pooling" in pooling["evidence"]
    assert "pool_mode = session" in pooling["fix"]
    assert code == 78


def test_a_direct_connection_is_ok(dsn: str) -> None:
    code, checks = _pooling(dsn)
    assert checks["db.pooling"]["verdict"] == "ok"
    assert code == 0
