"""audit_log: every operator write records who did what, in the same transaction as the write."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

AUDIT_SQL = """
INSERT INTO paygate.audit_log (actor, action, target, details) VALUES (%s, %s, %s, %s)
"""


def record(conn: psycopg.Connection, actor: str, action: str, target: str | None,
           details: dict[str, Any] | None = None) -> None:
    from psycopg.types.json import Jsonb

    conn.execute(AUDIT_SQL, (actor, action, target, Jsonb(details or {})))
