"""The webhooks worker against a real local HTTP server and a real Postgres."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest

from paygate_cli.workers.webhooks import TargetRefused, backoff_seconds, resolve_target
from tests.support.cli import base_environ, run_cli, spawn
from tests.support.webhook_receiver import Receiver
from tests.support.webhooks import SECRET, endpoint, event, row

LOOPBACK = {"PAYGATE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1/32"}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver().start()
    yield server
    server.stop()


def tick(dsn: str, *args: str, **extra: str) -> dict:
    result = run_cli("run-tick", "webhooks", "--json", *args, dsn=dsn, **{**LOOPBACK, **extra})
    assert result.code == 0, result.err
    return json.loads(result.out)["run_tick"]


def test_delivery_is_signed_with_the_documented_recipe(dsn: str, db: psycopg.Connection, receiver: Receiver) -> None:
    outbox_id = event(db, endpoint(db, f"{receiver.base}/ok"), data={"amount": "25"})
    tick(dsn)
    assert row(db, outbox_id)["status"] == "delivered"
    [request] = receiver.requests
    header = request["headers"]["Paygate-Signature"]
    parts = dict(part.split("=", 1) for part in header.split(","))
    # The recipe from docs/workers.md, verbatim: HMAC-SHA256(secret, "<t>.<raw body>"), hex.
    expected = hmac.new(SECRET.encode(), f"{parts['t']}.".encode() + request["body"], hashlib.sha256).hexdigest()
    assert hmac.compare_digest(parts["v1"], expected)
    assert abs(int(parts["t"]) - time.time()) < 60
    body = json.loads(request["body"])
    assert body["type"] == "charge.settled" and body["data"] == {"amount": "25"}
    assert request["headers"]["Paygate-Event-Id"] == body["id"] == str(row(db, outbox_id)["event_id"])


def test_failure_backs_off_with_jitter_and_retries(dsn: str, db: psycopg.Connection, receiver: Receiver) -> None:
    outbox_id = event(db, endpoint(db, f"{receiver.base}/flaky"))
    tick(dsn, PAYGATE_WEBHOOK_BACKOFF_BASE="10s")
    first = row(db, outbox_id)
    assert first["status"] == "pending" and first["attempts"] == 1 and first["last_status_code"] == 500
    delay = db.execute("SELECT extract(epoch FROM next_attempt_at - updated_at) FROM paygate.webhook_outbox"
                       " WHERE id = %s", (outbox_id,)).fetchone()[0]
    assert 5 <= float(delay) <= 10  # equal jitter of the first 10 s step
    tick(dsn)  # not due yet: nothing happens
    assert len(receiver.requests) == 1
    db.execute("UPDATE paygate.webhook_outbox SET next_attempt_at = now() WHERE id = %s", (outbox_id,))
    tick(dsn, PAYGATE_WEBHOOK_BACKOFF_BASE="0")
    db.execute("UPDATE paygate.webhook_outbox SET next_attempt_at = now() WHERE id = %s", (outbox_id,))
    tick(dsn)
    final = row(db, outbox_id)
    assert final["status"] == "delivered" and final["attempts"] == 3 and final["last_status_code"] == 200


def test_backoff_grows_and_is_capped() -> None:
    for attempts in range(1, 30):
        delay = backoff_seconds(attempts, 2.0, 300.0)
        nominal = min(300.0, 2.0 * 2 ** (attempts - 1))
        assert nominal / 2 <= delay <= nominal


def test_dead_after_max_attempts(dsn: str, db: psycopg.Connection, receiver: Receiver) -> None:
    outbox_id = event(db, endpoint(db, f"{receiver.base}/fail"), max_attempts=3)
    for _ in range(3):
        tick(dsn, PAYGATE_WEBHOOK_BACKOFF_BASE="0")
    dead = row(db, outbox_id)
    assert dead["status"] == "dead" and dead["attempts"] == 3
    assert "no success in 3 attempts" in dead["dead_reason"] and "HTTP 500" in dead["dead_reason"]
    tick(dsn)
    assert len(receiver.requests) == 3  # never retried once dead


def test_hanging_endpoint_times_out_without_blocking_other_endpoints(dsn: str, db: psycopg.Connection,
                                                                     receiver: Receiver) -> None:
    hang = event(db, endpoint(db, f"{receiver.base}/hang"))
    fine = [event(db, endpoint(db, f"{receiver.base}/ok")) for _ in range(3)]
    started = time.monotonic()
    summary = tick(dsn, PAYGATE_WEBHOOK_TIMEOUT="1s")
    elapsed = time.monotonic() - started
    assert elapsed < 8  # bounded by the timeout, not by the 30 s the endpoint would hang
    assert summary["processed"] == 4
    assert all(row(db, i)["status"] == "delivered" for i in fine)
    hung = row(db, hang)
    assert hung["status"] == "pending" and hung["last_error"] and "timed out" in hung["last_error"].lower()


def test_loopback_refused_unless_allow_listed(dsn: str, db: psycopg.Connection, receiver: Receiver) -> None:
    outbox_id = event(db, endpoint(db, f"{receiver.base}/ok"))
    result = run_cli("run-tick", "webhooks", dsn=dsn)  # no allow-list
    assert result.code == 0
    refused = row(db, outbox_id)
    assert refused["status"] == "dead" and "non-public address 127.0.0.1" in refused["dead_reason"]
    assert receiver.requests == []  # refused before any connection


@pytest.mark.parametrize("url", ["http://10.1.2.3/x", "http://169.254.169.254/latest", "http://[::1]/x",
                                 "http://0.0.0.0/x", "http://192.168.0.1/", "http://[::ffff:127.0.0.1]/"])
def test_private_and_link_local_targets_refused_before_connecting(url: str) -> None:
    with pytest.raises(TargetRefused, match="non-public"):
        resolve_target(url, allow=[])


def test_malformed_rows_go_dead_with_a_reason_and_never_block_the_batch(dsn: str, db: psycopg.Connection,
                                                                       receiver: Receiver) -> None:
    bad_scheme = event(db, endpoint(db, "ftp://example.com/x"))
    no_host = event(db, endpoint(db, "http:///nohost"))
    bad_port = event(db, endpoint(db, "http://example.com:99999/"))
    creds = event(db, endpoint(db, "http://user:pw@example.com/"))
    gone_endpoint = endpoint(db, f"{receiver.base}/ok")
    orphan = event(db, gone_endpoint)
    db.execute("DELETE FROM paygate.webhook_endpoints WHERE id = %s", (gone_endpoint,))
    disabled = event(db, endpoint(db, f"{receiver.base}/ok", enabled=False))
    good = event(db, endpoint(db, f"{receiver.base}/ok"))
    tick(dsn)
    reasons = {i: row(db, i)["dead_reason"] for i in (bad_scheme, no_host, bad_port, creds, orphan, disabled)}
    assert "scheme 'ftp'" in reasons[bad_scheme]
    assert "no host" in reasons[no_host]
    assert "malformed URL" in reasons[bad_port]
    assert "credentials" in reasons[creds]
    assert "endpoint missing" in reasons[orphan]
    assert "endpoint disabled" in reasons[disabled]
    assert all(row(db, i)["status"] == "dead" for i in reasons)
    assert row(db, good)["status"] == "delivered"


def test_expired_lease_is_reclaimed_and_a_stale_settle_cannot_overwrite(dsn: str, db: psycopg.Connection,
                                                                       receiver: Receiver) -> None:
    """A delivery whose worker died mid-flight: the lease lapses, the row is delivered by the next
    claim, and the dead worker's lease token no longer matches anything."""
    outbox_id = event(db, endpoint(db, f"{receiver.base}/ok"))
    stale_token = db.execute("UPDATE paygate.webhook_outbox SET status = 'delivering', attempts = 1,"
                             " lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 s'"
                             " WHERE id = %s RETURNING lease_token", (outbox_id,)).fetchone()[0]
    tick(dsn)
    assert row(db, outbox_id)["status"] == "delivered" and row(db, outbox_id)["attempts"] == 2
    from paygate_cli.queues.webhooks import SETTLE_SQL

    updated = db.execute(SETTLE_SQL, {"status": "pending", "code": 500, "error": "late", "dead_reason": None,
                                      "delay": 0, "id": outbox_id, "token": stale_token}).rowcount
    assert updated == 0 and row(db, outbox_id)["status"] == "delivered"


def test_crash_after_claim_is_recovered_by_the_next_tick(dsn: str, db: psycopg.Connection, receiver: Receiver) -> None:
    outbox_id = event(db, endpoint(db, f"{receiver.base}/ok"))
    environ = base_environ(dsn, PAYGATE_ENABLE_CRASHPOINTS="1", PAYGATE_CRASH_AT="webhooks.after_claim",
                           PAYGATE_WEBHOOK_LEASE="1s", **LOOPBACK)
    proc = spawn("run-tick", "webhooks", environ=environ)
    proc.wait(timeout=30)
    assert proc.returncode == -9  # killed hard at the crash point
    assert row(db, outbox_id)["status"] == "delivering" and receiver.requests == []
    time.sleep(1.2)  # the lease lapses (DB time)
    tick(dsn)
    assert row(db, outbox_id)["status"] == "delivered" and len(receiver.requests) == 1


def test_parallel_workers_deliver_each_event_exactly_once(dsn: str, db: psycopg.Connection,
                                                         receiver: Receiver) -> None:
    endpoint_id = endpoint(db, f"{receiver.base}/ok")
    ids = [event(db, endpoint_id, data={"n": n}) for n in range(200)]
    environ = base_environ(dsn, **LOOPBACK)
    procs = [spawn("run-tick", "webhooks", "--every", "0.05s", "--for", "6s", "--batch", "7", environ=environ)
             for _ in range(4)]
    for proc in procs:
        proc.wait(timeout=60)
        assert proc.returncode == 0, proc.stderr.read()
    delivered = db.execute("SELECT count(*) FROM paygate.webhook_outbox WHERE status = 'delivered'"
                           " AND id = ANY(%s)", (ids,)).fetchone()[0]
    assert delivered == 200
    per_event = Counter(r["headers"]["Paygate-Event-Id"] for r in receiver.requests)
    assert len(per_event) == 200 and max(per_event.values()) == 1  # no row claimed twice
    slots = db.execute("SELECT count(DISTINCT slot) FROM paygate.worker_runs WHERE worker = 'webhooks'").fetchone()[0]
    assert slots == 4
