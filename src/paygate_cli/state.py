"""The read model: what the database says about the fleet's work, read by `status` (ops/status.py)
and by every ticking worker's shared state metrics (ticks/runner.py). Reads only; the writes of the
same facts (halt, resume, drain) stay in ops/.

Below ops/ and ticks/ on purpose (docs/architecture.md §2, dependencies point one way): both need
these reads, and neither may import the other."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paygate_cli.queues import bot_jobs, charges, deposits, relays, subscriptions, webhooks

if TYPE_CHECKING:
    import psycopg

# Each queue: depth and the age of its oldest item. Add a queue here when its worker lands.
# A plain label -> SQL dict, so a queue module's own depth rows can be merged in.
QUEUE_SQL: dict[str, str] = {
    **deposits.DEPTH_ROWS,
    **charges.DEPTH_ROWS,
    "observer.quarantined": """
        SELECT count(*), extract(epoch FROM now() - min(observed_at))::float8
        FROM paygate.chain_events WHERE quarantined""",
    **subscriptions.DEPTH_ROWS,
    "lineages.live": """
        SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
        FROM paygate.lineages WHERE paygate.lineage_is_live(state)""",
    **webhooks.DEPTH_ROWS,
    **relays.DEPTH_ROWS,
    **bot_jobs.DEPTH_ROWS,
    "idempotency.expired": """
        SELECT count(*), extract(epoch FROM now() - min(expires_at))::float8
        FROM paygate.idempotency_keys WHERE expires_at < now()""",
}

# All queues in one statement (one round trip instead of one per queue: a cold `status` opens a
# fresh backend, and each statement there also pays its catalog lookups).
QUEUE_DEPTHS_SQL = "\nUNION ALL\n".join(
    f"SELECT '{name}', * FROM ({sql.strip()}) AS q" for name, sql in QUEUE_SQL.items())


def queue_depths(conn: psycopg.Connection) -> list[dict[str, Any]]:
    found = {name: (count, oldest) for name, count, oldest in conn.execute(QUEUE_DEPTHS_SQL)}
    depths = []
    for name in QUEUE_SQL:  # in the catalogue's order, whatever order the rows came back in
        count, oldest = found[name]
        depths.append({"queue": name, "depth": int(count), "oldest_age_s": round(oldest, 1) if oldest else None})
    return depths


# --- halts (set and cleared by ops/halts.py and the gas monitor) ---------------------------------
LIST_HALTS_SQL = "SELECT kind, reason, set_by, set_at FROM paygate.halts ORDER BY kind"


def list_halts(conn: psycopg.Connection) -> list[dict[str, Any]]:
    cursor = conn.execute(LIST_HALTS_SQL)
    return [dict(zip(("kind", "reason", "set_by", "set_at"), row, strict=True)) for row in cursor]


# --- open findings (recorded by queues/findings.py) ----------------------------------------------
# Walks findings_one_open (a partial index on open findings): cheap however long the history is.
OPEN_FINDINGS_SUMMARY_SQL = """
SELECT kind, count(*), min(first_seen) FROM paygate.findings WHERE resolved_at IS NULL GROUP BY kind ORDER BY kind
"""


def open_findings_summary(conn: psycopg.Connection) -> list[dict[str, Any]]:
    return [{"kind": kind, "count": int(count), "oldest": oldest}
            for kind, count, oldest in conn.execute(OPEN_FINDINGS_SUMMARY_SQL)]


# Findings come from the reconciler (its own migration); until that table exists there is nothing to
# count. "Open" = not resolved when the table records resolution, else every stored finding.
FINDINGS_SHAPE_SQL = """
SELECT to_regclass('paygate.findings') IS NOT NULL,
       EXISTS (SELECT 1 FROM information_schema.columns
               WHERE table_schema = 'paygate' AND table_name = 'findings' AND column_name = 'resolved_at')
"""
OPEN_FINDINGS_SQL = "SELECT count(*) FROM paygate.findings WHERE resolved_at IS NULL"
ALL_FINDINGS_SQL = "SELECT count(*) FROM paygate.findings"


def open_findings_count(conn: psycopg.Connection) -> int | None:
    """Open findings, or every finding on a schema without resolved_at; None without a findings table."""
    present, resolvable = conn.execute(FINDINGS_SHAPE_SQL).fetchone()
    if not present:
        return None
    return conn.execute(OPEN_FINDINGS_SQL if resolvable else ALL_FINDINGS_SQL).fetchone()[0]
