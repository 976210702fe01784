"""Candidates for shell completion read from the database: lane addresses and instance ids.

A completion runs on every Tab: it must answer within about a second and never print anything but
candidates, so it opens its own short-lived connection (1 s to connect, 1 s per statement, no
retries) and lets every failure reach the caller, which offers nothing."""

from __future__ import annotations

from typing import Any

LIMIT = 200

LANES_SQL = """
SELECT address FROM paygate.lanes WHERE address LIKE %(prefix)s ORDER BY address LIMIT %(limit)s
"""
INSTANCES_SQL = """
SELECT instance_id FROM paygate.instances WHERE instance_id LIKE %(prefix)s ORDER BY instance_id LIMIT %(limit)s
"""


def _like_prefix(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _names(settings: Any, sql: str, incomplete: str) -> list[str]:
    import psycopg
    from psycopg.conninfo import make_conninfo

    conninfo = make_conninfo(settings.dsn(), connect_timeout=1, application_name="paygate:completion",
                             options="-c statement_timeout=1000 -c lock_timeout=500")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return [row[0] for row in conn.execute(sql, {"prefix": _like_prefix(incomplete), "limit": LIMIT})]


def lane_addresses(settings: Any, incomplete: str) -> list[str]:
    return _names(settings, LANES_SQL, incomplete)


def instance_ids(settings: Any, incomplete: str) -> list[str]:
    return _names(settings, INSTANCES_SQL, incomplete)
