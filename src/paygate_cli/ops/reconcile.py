"""`reconcile-report`: what the reconciler and recovery found, and what is still open, read from
the same tables `status` and alerts read. Set-based SQL only: every section is one statement."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

# Walks findings_one_open (a partial index on open findings): cheap however long the history is.
OPEN_FINDINGS_SUMMARY_SQL = """
SELECT kind, count(*), min(first_seen) FROM paygate.findings WHERE cleared_at IS NULL GROUP BY kind ORDER BY kind
"""


def open_findings_summary(conn: psycopg.Connection) -> list[dict[str, Any]]:
    return [{"kind": kind, "count": int(count), "oldest": oldest}
            for kind, count, oldest in conn.execute(OPEN_FINDINGS_SUMMARY_SQL)]
