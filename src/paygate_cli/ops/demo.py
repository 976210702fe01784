"""`paygate demo`: the system end to end on a private Postgres, so anyone can watch it work.

It plays the API service's part (inserting webhook events and idempotency keys, as admission would),
runs the workers' ticks, and reports what happened. A local receiver on 127.0.0.1 stands in for a
customer's webhook endpoint and checks every signature."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from paygate_cli.db.cluster import Cluster
from paygate_cli.db.connect import connect
from paygate_cli.db.migrate import migrate
from paygate_cli.env import Env
from paygate_cli.ticks.registry import get_worker
from paygate_cli.ticks.runner import RunOptions, run_worker

DEMO_SECRET = "whsec_demo_0123456789abcdef"  # the demo receiver's own HMAC key, not a real secret

INSERT_ENDPOINT_SQL = """
INSERT INTO paygate.webhook_endpoints (url, secret, description) VALUES (%s, %s, %s) RETURNING id
"""
INSERT_EVENT_SQL = """
INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload, max_attempts) VALUES (%s, %s, %s, %s)
"""
INSERT_KEY_SQL = """
INSERT INTO paygate.idempotency_keys (scope, key, request_hash, expires_at)
VALUES ('demo', %s, %s, now() + make_interval(secs => %s))
ON CONFLICT DO NOTHING
"""
OUTBOX_REPORT_SQL = """
SELECT o.id, o.event_type, coalesce(e.description, '(deleted)'), o.status, o.attempts,
       o.last_status_code, coalesce(o.dead_reason, o.last_error, '')
FROM paygate.webhook_outbox o LEFT JOIN paygate.webhook_endpoints e ON e.id = o.endpoint_id
ORDER BY o.id
"""
KEYS_LEFT_SQL = "SELECT count(*) FROM paygate.idempotency_keys WHERE scope = 'demo'"


@dataclass
class Receiver:
    """A customer endpoint on loopback: /ok answers 200, /flaky fails twice then answers 200."""

    received: list[dict[str, Any]] = field(default_factory=list)
    flaky_failures: int = 2

    def verify(self, headers: Any, body: bytes) -> bool:
        parts = dict(p.split("=", 1) for p in headers.get("Paygate-Signature", "").split(","))
        expected = hmac.new(DEMO_SECRET.encode(), f"{parts.get('t')}.".encode() + body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, parts.get("v1", ""))

    def serve(self) -> ThreadingHTTPServer:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                ok_signature = receiver.verify(self.headers, body)
                failing = self.path == "/flaky" and receiver.flaky_failures > 0
                if failing:
                    receiver.flaky_failures -= 1
                receiver.received.append({"path": self.path, "signature_ok": ok_signature,
                                          "event": json.loads(body)["type"], "answered": 500 if failing else 200})
                self.send_response(500 if failing else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


DEMO_DATABASE = "paygate_demo"


def _fresh_database(cluster: Cluster) -> None:
    """Each demo run starts from an empty database, so its report shows only this run."""
    import psycopg

    with psycopg.connect(cluster.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DEMO_DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DEMO_DATABASE}")


def run_demo(env: Env, data_dir: Path, say: Callable[[str], None]) -> dict[str, Any]:
    from psycopg.types.json import Jsonb

    cluster = Cluster.at(data_dir)
    say(f"1. private Postgres in {cluster.datadir} (Unix socket only)")
    cluster.up()
    _fresh_database(cluster)
    env.override(database_url=cluster.dsn(DEMO_DATABASE), webhook_allow_hosts=["127.0.0.1/32"],
                 webhook_backoff_base=0.2)
    receiver = Receiver()
    server = receiver.serve()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with connect(env.settings, "demo") as conn:
            result = migrate(conn)
            say(f"2. schema migrated to version {result['schema_version']}")
            with conn.transaction():
                def endpoint(url: str, description: str) -> int:
                    return conn.execute(INSERT_ENDPOINT_SQL, (url, DEMO_SECRET, description)).fetchone()[0]

                ok_id = endpoint(f"{base}/ok", "shop (healthy)")
                flaky_id = endpoint(f"{base}/flaky", "shop (flaky)")
                private_id = endpoint("http://[::1]:9/hook", "internal address (refused)")
                for event in ("credit.settled", "charge.settled", "charge.failed"):
                    conn.execute(INSERT_EVENT_SQL, (ok_id, event, Jsonb({"demo": True, "event": event}), None))
                conn.execute(INSERT_EVENT_SQL, (flaky_id, "subscription.past_due", Jsonb({"demo": True}), 5))
                conn.execute(INSERT_EVENT_SQL, (private_id, "charge.settled", Jsonb({"demo": True}), None))
                for i in range(5):
                    conn.execute(INSERT_KEY_SQL, (f"expired-{i}", b"\x00" * 32, -60))
                    conn.execute(INSERT_KEY_SQL, (f"live-{i}", b"\x00" * 32, 3600))
            say("3. admitted 5 webhook events (3 endpoints) and 10 idempotency keys (5 expired)")
        ticks = []
        for worker, opts in (("webhooks", RunOptions(once=False, every=0.5, for_seconds=4.0, lock_wait=5)),
                             ("idempotency_sweep", RunOptions(once=True, lock_wait=5))):
            summary = run_worker(env, get_worker(worker), opts)
            ticks.append(summary.as_dict())
            say(f"4. run-tick {worker}: {summary.ticks} tick(s), processed {summary.processed}")
        with connect(env.settings, "demo") as conn:
            outbox = [dict(zip(("id", "event", "endpoint", "status", "attempts", "http", "note"), row, strict=True))
                      for row in conn.execute(OUTBOX_REPORT_SQL)]
            keys_left = conn.execute(KEYS_LEFT_SQL).fetchone()[0]
    finally:
        server.shutdown()
    return {"dsn": cluster.dsn(DEMO_DATABASE), "ticks": ticks, "outbox": outbox, "received": receiver.received,
            "idempotency_keys_left": keys_left}
