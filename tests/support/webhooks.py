"""Webhook deliveries in the tests: endpoints, events, outbox rows in every state a test needs."""

from __future__ import annotations

import psycopg
from psycopg.types.json import Jsonb

SECRET = "whsec_test_0123456789abcdef"  # every test endpoint's signing secret


def endpoint(db: psycopg.Connection, url: str, *, enabled: bool = True) -> int:
    return db.execute("INSERT INTO paygate.webhook_endpoints (url, secret, enabled) VALUES (%s, %s, %s) RETURNING id",
                      (url, SECRET, enabled)).fetchone()[0]


def event(db: psycopg.Connection, endpoint_id: int | None, event_type: str = "charge.settled", *,
          max_attempts: int | None = None, data: dict | None = None) -> int:
    return db.execute("INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload, max_attempts)"
                      " VALUES (%s, %s, %s, %s) RETURNING id",
                      (endpoint_id, event_type, Jsonb(data or {"charge": 1}), max_attempts)).fetchone()[0]


def row(db: psycopg.Connection, outbox_id: int) -> dict:
    cursor = db.execute("SELECT * FROM paygate.webhook_outbox WHERE id = %s", (outbox_id,))
    names = [c.name for c in cursor.description]
    return dict(zip(names, cursor.fetchone(), strict=True))


def dead_webhook(db: psycopg.Connection, url: str) -> int:
    endpoint = db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES (%s, %s) RETURNING id",
                          (url, SECRET)).fetchone()[0]
    return db.execute(
        "INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload, status, attempts, dead_at, dead_reason,"
        " last_error) VALUES (%s, 'charge.settled', %s, 'dead', 8, now(), 'no success in 8 attempts', 'HTTP 500')"
        " RETURNING id", (endpoint, Jsonb({"charge": 7}))).fetchone()[0]


def held_webhook(db: psycopg.Connection, owner: str, lease: str = "30 seconds") -> int:
    endpoint = db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES ('http://127.0.0.1:9/h', "
                          "'0123456789abcdef0123') RETURNING id").fetchone()[0]
    return db.execute(
        "INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload, status, lease_token, "
        "lease_expires_at, claimed_by, attempts) VALUES (%s, 't', %s, 'delivering', gen_random_uuid(), "
        "now() + %s::interval, %s, 1) RETURNING id", (endpoint, Jsonb({}), lease, owner)).fetchone()[0]


def seen(db: psycopg.Connection, *instances: str) -> None:
    """The heartbeat every tick writes (ticks/runner.py): these instances have run ticks here."""
    for instance in instances:
        db.execute("INSERT INTO paygate.instances (instance_id) VALUES (%s)", (instance,))
