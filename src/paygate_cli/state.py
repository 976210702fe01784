"""The read model: what the database says about the fleet's work, read by `status` (ops/status.py)
and by every ticking worker's shared state metrics (ticks/runner.py). Reads only; the writes of the
same facts (halt, resume, drain) stay in ops/.

Below ops/ and ticks/ on purpose (docs/architecture.md §2, dependencies point one way): both need
these reads, and neither may import the other."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paygate_cli.queues import bot_jobs, charges, deposits, relays, subscriptions, ttl, webhooks

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
    **ttl.DEPTH_ROWS,
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


# --- the fee account (the gas monitor: workers/gas.py) ---------------------------------------------
GAS_SQL = """
SELECT g.level, g.headroom, g.balance, g.reserve, g.reserved_fees, g.committed_fees, g.halted, g.low_lanes,
       g.checked_at, t.reserved, t.settled, t.released
FROM paygate.relay_fee_totals t LEFT JOIN paygate.gas_state g ON true
"""


def gas_state(conn: psycopg.Connection) -> dict[str, Any]:
    """The gas monitor's last reading (its fields None before its first) beside the relay fee totals."""
    row = conn.execute(GAS_SQL).fetchone()
    names = ("level", "headroom", "balance", "reserve", "reserved_fees", "committed_fees", "halted", "low_lanes",
             "checked_at", "fees_reserved", "fees_settled", "fees_released")
    return dict(zip(names, row, strict=True)) if row else {}


# --- the fee market (docs/architecture.md §4 "Fees and the fee market") ---------------------------
# Which path a lineage belongs to, by its purpose (and, for 'relay', its entitlement: bot jobs ride
# the relay purpose as 'bot_job:<id>'); the TTL keeper's extends and restores are 'ttl'. Status, the
# metrics and the alerts speak in paths; each of these is always shown (0 when it has none), and a
# purpose not named here shows under its own name while it has live lineages.
FEE_PATHS = ("funding", "settlement", "relay", "bot_jobs", "ttl")
LINEAGE_PATH_SQL = """CASE WHEN l.purpose IN ('deposit', 'credit') THEN 'funding'
     WHEN l.purpose = 'charge_batch' THEN 'settlement'
     WHEN l.purpose = 'relay' AND l.entitlement LIKE 'bot_job:%%' THEN 'bot_jobs'
     WHEN l.purpose = 'relay' THEN 'relay'
     WHEN l.purpose IN ('ttl_extend', 'restore') THEN 'ttl'
     ELSE l.purpose END"""

# One row per path, the last price read beside each (one round trip: the state file is rewritten by
# every ticking worker, and status reads it too). Live lineages are at most one per lane, so the
# per-unit list of the fee-capped ones is small; their fee_capped_at has its own partial index.
FEE_MARKET_SQL = f"""
WITH live AS (
    SELECT {LINEAGE_PATH_SQL} AS path, l.id, l.entitlement, l.state, l.bid_rate, l.cap_rate,
           l.fee_required, l.fee_capped_at, l.replacements
    FROM paygate.lineages l WHERE paygate.lineage_is_live(l.state)
)
SELECT p.path,
       count(live.id) FILTER (WHERE live.fee_capped_at IS NOT NULL),
       max(live.fee_required),
       max(live.cap_rate) FILTER (WHERE live.fee_capped_at IS NOT NULL),
       min(live.fee_capped_at),
       extract(epoch FROM now() - min(live.fee_capped_at))::float8,
       max(live.bid_rate) FILTER (WHERE live.state IN ('signed', 'sent')),
       coalesce(json_agg(json_build_object(
           'lineage_id', live.id, 'entitlement', live.entitlement, 'state', live.state,
           'bid_rate', live.bid_rate, 'fee_required', live.fee_required, 'cap_rate', live.cap_rate,
           'replacements', live.replacements, 'fee_capped_at', live.fee_capped_at,
           'fee_capped_age_s', round(extract(epoch FROM now() - live.fee_capped_at)::numeric, 1))
           ORDER BY live.fee_capped_at, live.id) FILTER (WHERE live.fee_capped_at IS NOT NULL), '[]'),
       m.percentile, m.price, m.max_fee, m.transactions, m.ledgers, m.ledger, m.endpoint, m.read_at,
       extract(epoch FROM now() - m.read_at)::float8
FROM (SELECT * FROM unnest(%(paths)s::text[]) WITH ORDINALITY AS known(path, n)
      UNION ALL
      SELECT DISTINCT path, 1000 FROM live WHERE path <> ALL (%(paths)s::text[])) AS p(path, n)
LEFT JOIN live ON live.path = p.path
LEFT JOIN paygate.fee_market m ON true
GROUP BY p.path, p.n, m.singleton
ORDER BY p.n, p.path
"""
_MARKET_COLUMNS = ("percentile", "price", "max_fee", "transactions", "ledgers", "ledger", "endpoint", "read_at",
                   "age_s")


def fee_market_state(conn: psycopg.Connection) -> dict[str, Any]:
    """The last fee market price read ("market": None when none was ever read: not a price of 0),
    and per path its fee-capped live lineages (count, the highest rate required, the highest
    allowed, the oldest fee_capped_at, each unit) and the highest bid of its live signed lineages."""
    market: dict[str, Any] | None = None
    paths = []
    for row in conn.execute(FEE_MARKET_SQL, {"paths": list(FEE_PATHS)}):
        path, capped, required, allowed, since, since_age, bid, units, *read = row
        if read[0] is not None:  # percentile is NOT NULL in the table: a row was read
            market = dict(zip(_MARKET_COLUMNS, read, strict=True))
            market["age_s"] = round(market["age_s"], 1)
        paths.append({"path": path, "fee_capped": int(capped), "highest_required": required, "allowed": allowed,
                      "since": since, "since_age_s": round(since_age, 1) if since_age is not None else None,
                      "highest_bid": bid, "units": units})
    return {"market": market, "paths": paths}


# --- state archival: the TTL keeper (workers/ttl.py, docs/architecture.md §6 "TTL keeper") --------
TTL_STATES = ("unread", "live", "archived", "absent", "needs_human")


def ttl_state(conn: psycopg.Connection, limit: int = 50) -> dict[str, Any]:
    """What the keeper keeps alive as last read: entries per state (kept ones, and every one asking a
    human), the nearest expiry of a kept live entry (in ledgers past the newest ledger a read saw),
    today's rent and what the budget left unextended, the open jobs (who asked, the lineage in
    flight) and the entries that need a human, each with its key."""
    counts, latest, kind, account, key, live_until, spent, transactions, left = conn.execute(
        ttl.TTL_SUMMARY_SQL).fetchone()
    nearest = None
    if live_until is not None:
        nearest = {"kind": kind, "account": account, "key_xdr": key, "live_until": live_until,
                   "ledgers_left": live_until - latest if latest is not None else None}
    jobs = [dict(zip(("id", "kind", "status", "keys", "requested_by", "attempts", "rent_estimate", "lineage_id",
                      "lineage_state", "reason", "age_s"), row, strict=True))
            for row in conn.execute(ttl.TTL_JOBS_SQL, {"limit": limit})]
    for job in jobs:
        job["age_s"] = round(job["age_s"], 1)
    needs_human = [dict(zip(("kind", "account", "key_xdr", "reason", "age_s"), row, strict=True))
                   for row in conn.execute(ttl.TTL_NEEDS_HUMAN_SQL, {"limit": limit})]
    for entry in needs_human:
        entry["age_s"] = round(entry["age_s"], 1)
    return {"entries": {state: int((counts or {}).get(state, 0)) for state in TTL_STATES},
            "latest_ledger": latest, "nearest": nearest,
            "rent": {"spent": int(spent or 0), "transactions": int(transactions or 0),
                     "left_unextended": int(left or 0)},
            "jobs": jobs, "needs_human": needs_human}
