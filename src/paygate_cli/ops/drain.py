"""`drain` / `undrain`: an instance (a host running ticks) or a lane stops taking new work while
what is in flight finishes.

An instance is drained by a row in `instances` (the tick runner reads it at every tick start and
passes `draining=True`: the worker finishes what it holds and claims nothing new). A lane is
drained by `lanes.status = 'drained'`: allocation only ever takes active lanes. Both are audited
in the same transaction as the change."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paygate_cli.errors import UsageError, WaitTimedOut
from paygate_cli.ops.audit import record

if TYPE_CHECKING:
    import psycopg

DRAIN_INSTANCE_SQL = """
INSERT INTO paygate.instances (instance_id, drained_at, drained_by, drain_reason)
VALUES (%(id)s, now(), %(by)s, %(reason)s)
ON CONFLICT (instance_id) DO UPDATE
SET drained_at = coalesce(paygate.instances.drained_at, now()), drained_by = EXCLUDED.drained_by,
    drain_reason = EXCLUDED.drain_reason
RETURNING instance_id, drained_at, drained_by, drain_reason
"""
UNDRAIN_INSTANCE_SQL = """
UPDATE paygate.instances SET drained_at = NULL, drained_by = NULL, drain_reason = NULL
WHERE instance_id = %(id)s AND drained_at IS NOT NULL
RETURNING instance_id
"""
INSTANCE_SQL = """
SELECT instance_id, drained_at, drained_by, drain_reason, last_seen FROM paygate.instances WHERE instance_id = %s
"""

# Instances the tick runner has recorded (every run upserts its row in `instances`), most recent first:
# what a typo in --instance is told it might have meant.
SEEN_INSTANCES_SQL = """
SELECT instance_id, last_seen FROM paygate.instances ORDER BY last_seen DESC, instance_id LIMIT %(limit)s
"""
KNOWN_LANES_SQL = "SELECT address, status FROM paygate.lanes ORDER BY address LIMIT %(limit)s"
LISTED = 10  # known instances / lanes named in a refusal

LANE_SQL = "SELECT address, status, drained_at, drained_by, drain_reason FROM paygate.lanes WHERE address = %s"
DRAIN_LANE_SQL = """
UPDATE paygate.lanes SET status = 'drained', drained_at = now(), drained_by = %(by)s, drain_reason = %(reason)s
WHERE address = %(lane)s AND status = 'active'
RETURNING address
"""
UNDRAIN_LANE_SQL = """
UPDATE paygate.lanes SET status = 'active', drained_at = NULL, drained_by = NULL, drain_reason = NULL
WHERE address = %(lane)s AND status = 'drained'
RETURNING address
"""

# Every queue a worker claims under a lease: each table of schema paygate with both lease columns,
# read from the catalogue, so a queue a later migration adds is counted without anyone listing it.
LEASED_TABLES_SQL = """
SELECT c.relname FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE n.nspname = 'paygate' AND c.relkind IN ('r', 'p') AND a.attname IN ('lease_expires_at', 'claimed_by')
GROUP BY c.relname HAVING count(*) = 2 ORDER BY c.relname
"""
# The name an operator knows a queue by (the replay's and the docs' names); others by their table.
QUEUE_NAMES = {"deposits": "deposits", "webhook_outbox": "webhooks"}


def leased_queues(conn: psycopg.Connection) -> list[str]:
    """The tables whose rows are claimed under a lease (see LEASED_TABLES_SQL)."""
    return [str(name) for (name,) in conn.execute(LEASED_TABLES_SQL)]


def _instance_in_flight_sql(tables: list[str]) -> Any:
    """What an instance still holds: live leases taken by one of its processes (claimed_by is
    '<instance>:<slot>'), in every leased queue. A lease that lapsed is no longer held: its work
    belongs to whoever takes it over. Workers clear the lease when a row leaves their hands, so a
    live lease is held work whatever the row's status. One statement, one snapshot."""
    from psycopg import sql

    return sql.SQL(" UNION ALL ").join(
        sql.SQL("SELECT {name}, count(*) FROM paygate.{table} WHERE lease_expires_at > now() "
                "AND left(claimed_by, %(n)s) = %(prefix)s").format(
            name=sql.Literal(QUEUE_NAMES.get(table, table)), table=sql.Identifier(table))
        for table in tables)


# What a lane still has in flight: its live lineage (at most one, by the unique index).
LANE_IN_FLIGHT_SQL = """
SELECT 'lineages' AS queue, count(*) FROM paygate.lineages
WHERE lane = %(lane)s AND paygate.lineage_is_live(state)
"""

DRAINED_SQL = """
SELECT 'instance' AS kind, instance_id AS target, drained_at, drained_by, drain_reason
FROM paygate.instances WHERE drained_at IS NOT NULL
UNION ALL
SELECT 'lane', address, drained_at, drained_by, drain_reason FROM paygate.lanes WHERE status = 'drained'
ORDER BY drained_at
"""


@dataclass(frozen=True)
class Target:
    kind: str  # instance | lane
    name: str

    @classmethod
    def of(cls, instance: str | None, lane: str | None) -> Target:
        if bool(instance) == bool(lane):
            raise UsageError("give exactly one of --instance ID or --lane ADDRESS", msgid="usage.drain_target")
        if lane:
            return cls("lane", lane)
        assert instance is not None
        return cls("instance", instance)


def drained(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every drained instance and lane (for `status`)."""
    cursor = conn.execute(DRAINED_SQL)
    return [dict(zip(("kind", "target", "drained_at", "drained_by", "reason"), row, strict=True)) for row in cursor]


def in_flight(conn: psycopg.Connection, target: Target) -> dict[str, int]:
    if target.kind == "lane":
        rows = conn.execute(LANE_IN_FLIGHT_SQL, {"lane": target.name}).fetchall()
    else:
        prefix = target.name + ":"
        rows = conn.execute(_instance_in_flight_sql(leased_queues(conn)),
                            {"prefix": prefix, "n": len(prefix)}).fetchall()
    return {str(queue): int(count) for queue, count in rows}


def _current(conn: psycopg.Connection, target: Target) -> dict[str, Any] | None:
    if target.kind == "lane":
        row = conn.execute(LANE_SQL, (target.name,)).fetchone()
        keys = ("lane", "status", "drained_at", "drained_by", "reason")
    else:
        row = conn.execute(INSTANCE_SQL, (target.name,)).fetchone()
        keys = ("instance", "drained_at", "drained_by", "reason", "last_seen")
    return dict(zip(keys, row, strict=True)) if row else None


def _known(conn: psycopg.Connection, sql: str) -> str:
    rows = conn.execute(sql, {"limit": LISTED}).fetchall()
    return ", ".join(str(row[0]) for row in rows) if rows else "none"


def drain(conn: psycopg.Connection, target: Target, *, reason: str | None, actor: str,
          dry_run: bool, force: bool = False) -> dict[str, Any]:
    current = _current(conn, target)
    if target.kind == "instance" and current is None and not force:
        # Draining a name no tick ever ran under changes nothing: the real host keeps claiming.
        raise UsageError(f"instance {target.name} has never run a tick against this database (known, most "
                         f"recent first: {_known(conn, SEEN_INSTANCES_SQL)}); check PAYGATE_INSTANCE_ID on the "
                         "host, or pass --force to drain a host that has not started yet",
                         msgid="usage.unknown_instance")
    if target.kind == "lane":
        if current is None:
            raise UsageError(f"lane {target.name} is not in the journal (paygate knows only lanes it has used; "
                             f"known: {_known(conn, KNOWN_LANES_SQL)})", msgid="usage.unknown_lane")
        if current["status"] == "retired":
            raise UsageError(f"lane {target.name} is retired; draining it changes nothing", msgid="usage.lane_retired")
    already = current is not None and (current.get("drained_at") is not None)
    result: dict[str, Any] = {"target": target.kind, "name": target.name, "already_drained": already,
                              "in_flight": in_flight(conn, target)}
    if dry_run:
        return {**result, "would_drain": not already, "dry_run": True}
    with conn.transaction():
        if target.kind == "lane":
            changed = conn.execute(DRAIN_LANE_SQL, {"lane": target.name, "by": actor, "reason": reason}).fetchone()
        else:
            changed = None if already else conn.execute(
                DRAIN_INSTANCE_SQL, {"id": target.name, "by": actor, "reason": reason}).fetchone()
        if changed is not None:
            record(conn, actor, f"drain.{target.kind}", target.name, {"reason": reason})
    return {**result, "drained": True, "changed": changed is not None}


def undrain(conn: psycopg.Connection, target: Target, *, actor: str, dry_run: bool) -> dict[str, Any]:
    current = _current(conn, target)
    if current is None and target.kind == "lane":
        raise UsageError(f"lane {target.name} is not in the journal", msgid="usage.unknown_lane")
    was = current is not None and current.get("drained_at") is not None
    result: dict[str, Any] = {"target": target.kind, "name": target.name, "was_drained": was}
    if current is not None:
        result["previous"] = {k: current.get(k) for k in ("drained_at", "drained_by", "reason")}
    if dry_run:
        return {**result, "would_undrain": was, "dry_run": True}
    with conn.transaction():
        sql = UNDRAIN_LANE_SQL if target.kind == "lane" else UNDRAIN_INSTANCE_SQL
        changed = conn.execute(sql, {"lane": target.name, "id": target.name}).fetchone()
        if changed is not None:
            previous = result.get("previous") or {}
            record(conn, actor, f"undrain.{target.kind}", target.name,
                   {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in previous.items()})
    return {**result, "undrained": changed is not None}


def wait_idle(conn: psycopg.Connection, target: Target, *, timeout: float, monotonic: Callable[[], float],
              sleep: Callable[[float], None], progress: Callable[[dict[str, int]], None] | None = None,
              poll: float = 0.5) -> dict[str, Any]:
    """Block until nothing is in flight for `target`; WaitTimedOut (75) when `timeout` passes first.
    Each poll is its own statement (autocommit): no snapshot is held while waiting."""
    started = monotonic()
    while True:
        counts = in_flight(conn, target)
        if progress is not None:
            progress(counts)
        if not any(counts.values()):
            return {"idle": True, "waited_s": round(monotonic() - started, 3)}
        left = timeout - (monotonic() - started)
        if left <= 0:
            raise WaitTimedOut(f"{target.kind} {target.name} still has work in flight after {timeout:g}s: " +
                               ", ".join(f"{q} {n}" for q, n in counts.items() if n), msgid="drain.wait_timeout")
        sleep(min(poll, left))
