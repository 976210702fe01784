"""Lineage rows: allocation of a lane, anchoring the signed envelope, the terminal transitions.
Every transition is a compare-and-set on the state it expects (DESIGN rule 6); the table's trigger
refuses anything else, so a bug cannot rewrite history either."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

LIVE_STATES = ("allocated", "signed", "sent")
TERMINAL_STATES = ("applied", "failed", "expired", "superseded", "abandoned")

SYNC_LANES_SQL = """
INSERT INTO paygate.lanes (address) SELECT unnest(%s::text[]) ON CONFLICT (address) DO NOTHING
"""

# A free lane: active, one of ours (we hold its key), no live lineage; the least recently used
# one, so no lane is everyone's first choice (a bad lane first in address order would take every
# allocation). SKIP LOCKED spreads concurrent allocators over lanes; the partial unique index on
# live lineages is the real guard.
ALLOCATE_SQL = """
WITH lane AS (
    SELECT l.address FROM paygate.lanes l
    WHERE l.status = 'active' AND l.address = ANY(%(lanes)s)
      AND NOT EXISTS (SELECT 1 FROM paygate.lineages x
                      WHERE x.lane = l.address AND x.state IN ('allocated', 'signed', 'sent'))
    ORDER BY l.last_allocated_at NULLS FIRST, l.address
    LIMIT 1
    FOR UPDATE OF l SKIP LOCKED
), used AS (
    UPDATE paygate.lanes SET last_allocated_at = clock_timestamp() FROM lane WHERE lanes.address = lane.address
)
INSERT INTO paygate.lineages (purpose, entitlement, lane)
SELECT %(purpose)s, %(entitlement)s, lane.address FROM lane
RETURNING id, lane
"""

FREE_LANES_SQL = """
SELECT count(*) FROM paygate.lanes l
WHERE l.status = 'active' AND l.address = ANY(%s)
  AND NOT EXISTS (SELECT 1 FROM paygate.lineages x
                  WHERE x.lane = l.address AND x.state IN ('allocated', 'signed', 'sent'))
"""

# Sequence numbers known consumed on a lane: applied or failed lineages (both used theirs).
# Expired/superseded ones never landed, so their numbers must not push the next one up.
LAST_CONSUMED_SEQ_SQL = """
SELECT max(source_seq) FROM paygate.lineages WHERE lane = %s AND state IN ('applied', 'failed')
"""

ANCHOR_SQL = """
UPDATE paygate.lineages
SET state = 'signed', source_seq = %(seq)s, key_id = %(key_id)s, envelope = %(envelope)s,
    inner_hash = %(inner_hash)s, outer_hash = %(outer_hash)s, max_time = %(max_time)s,
    signed_at_ledger = %(signed_at_ledger)s, max_ledger = %(max_ledger)s, signed_at = now()
WHERE id = %(id)s AND state = 'allocated'
"""

MARK_SENT_SQL = """
UPDATE paygate.lineages
SET state = 'sent', send_count = send_count + 1, last_send_status = %(status)s,
    sent_at = coalesce(sent_at, now())
WHERE id = %(id)s AND state IN ('signed', 'sent')
"""

FINISH_SQL = """
UPDATE paygate.lineages
SET state = %(state)s, ledger = %(ledger)s, fee_charged = %(fee)s, result_code = %(code)s,
    resolution = %(resolution)s, resolved_at = now()
WHERE id = %(id)s AND state IN ('signed', 'sent')
"""

ABANDON_SQL = """
UPDATE paygate.lineages SET state = 'abandoned', resolution = %(why)s, resolved_at = now()
WHERE id = %(id)s AND state = 'allocated'
"""

LOAD_SQL = """
SELECT id, purpose, entitlement, lane, state, source_seq, key_id, envelope, inner_hash, outer_hash,
       max_time, signed_at_ledger, ledger, fee_charged, result_code, resolution, max_ledger
FROM paygate.lineages WHERE id = %s
"""

# A lane whose sequence was consumed by a transaction we never journaled: someone else holds its
# key. Fence it (no new allocations) until a human has looked; a retired lane stays retired.
FENCE_LANE_SQL = """
UPDATE paygate.lanes SET status = 'drained', drained_at = now(), drained_by = %(by)s
WHERE address = %(lane)s AND status = 'active'
"""
FENCE_AUDIT_SQL = """
INSERT INTO paygate.audit_log (actor, action, target, details) VALUES (%(by)s, 'lane.fence', %(lane)s, %(details)s)
"""

OTHER_AT_SEQ_SQL = """
SELECT id, state FROM paygate.lineages
WHERE lane = %s AND source_seq = %s AND id <> %s AND state IN ('applied', 'failed')
"""


@dataclass
class Lineage:
    id: int
    purpose: str
    entitlement: str
    lane: str
    state: str
    source_seq: int | None
    key_id: str | None
    envelope: bytes | None
    inner_hash: bytes | None
    outer_hash: bytes | None
    max_time: int | None
    signed_at_ledger: int | None
    ledger: int | None
    fee_charged: int | None
    result_code: str | None
    resolution: str | None
    max_ledger: int | None = None  # last ledger it may apply in (user-authorised calls), else None

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def public(self) -> dict[str, Any]:
        """What an operator may see: never the envelope or its ciphertext."""
        return {"id": self.id, "purpose": self.purpose, "entitlement": self.entitlement, "lane": self.lane,
                "state": self.state, "source_seq": self.source_seq, "key_id": self.key_id,
                "inner_hash": self.inner_hash.hex() if self.inner_hash else None,
                "outer_hash": self.outer_hash.hex() if self.outer_hash else None,
                "max_time": self.max_time, "max_ledger": self.max_ledger,
                "signed_at_ledger": self.signed_at_ledger, "ledger": self.ledger,
                "fee_charged": self.fee_charged, "result_code": self.result_code, "resolution": self.resolution}


def load(conn: psycopg.Connection, lineage_id: int) -> Lineage:
    row = conn.execute(LOAD_SQL, (lineage_id,)).fetchone()
    if row is None:
        raise LookupError(f"lineage {lineage_id} does not exist")
    return Lineage(*row)


def sync_lanes(conn: psycopg.Connection, addresses: list[str]) -> None:
    conn.execute(SYNC_LANES_SQL, (sorted(addresses),))


def allocate(conn: psycopg.Connection, *, purpose: str, entitlement: str, lanes: list[str]) -> tuple[int, str] | None:
    """Inside the caller's transaction. None when every lane is busy or drained.

    Two allocators can both see a lane as free (the NOT EXISTS reads a snapshot taken before the
    other committed); the unique index on live lineages then refuses the second insert. That is
    "no free lane this time", not an error: the savepoint keeps the caller's transaction usable."""
    import psycopg

    params = {"lanes": sorted(lanes), "purpose": purpose, "entitlement": entitlement}
    try:
        with conn.transaction():
            row = conn.execute(ALLOCATE_SQL, params).fetchone()
    except psycopg.errors.UniqueViolation as exc:
        if exc.diag.constraint_name != "lineages_one_live_per_lane":
            raise
        return None
    except psycopg.errors.SerializationFailure:
        # Under REPEATABLE READ the winner's update of the lane's last_allocated_at is a concurrent
        # update of the row we lock: the same lost race, reported differently.
        return None
    return (int(row[0]), str(row[1])) if row else None


def free_lane_count(conn: psycopg.Connection, lanes: list[str]) -> int:
    return int(conn.execute(FREE_LANES_SQL, (sorted(lanes),)).fetchone()[0])


def next_sequence(conn: psycopg.Connection, lane: str, chain_seq: int) -> int:
    """Chain sequence + 1, but never below what our own journal knows was consumed: a lagging
    sequence read must not make us build a transaction for a number already used."""
    journal = conn.execute(LAST_CONSUMED_SEQ_SQL, (lane,)).fetchone()[0]
    return max(chain_seq, int(journal or 0)) + 1


def anchor(conn: psycopg.Connection, lineage_id: int, **fields: Any) -> bool:
    return conn.execute(ANCHOR_SQL, {"id": lineage_id, "max_ledger": None, **fields}).rowcount == 1


def mark_sent(conn: psycopg.Connection, lineage_id: int, status: str) -> bool:
    return conn.execute(MARK_SENT_SQL, {"id": lineage_id, "status": status}).rowcount == 1


def finish(conn: psycopg.Connection, lineage_id: int, state: str, *, ledger: int | None = None,
           fee: int | None = None, code: str | None = None, resolution: str) -> bool:
    return conn.execute(FINISH_SQL, {"id": lineage_id, "state": state, "ledger": ledger, "fee": fee,
                                     "code": code, "resolution": resolution}).rowcount == 1


def fence_lane(conn: psycopg.Connection, lane: str, *, by: str, details: dict[str, Any]) -> bool:
    """Inside the caller's transaction: drain the lane and record why in the audit log."""
    from psycopg.types.json import Jsonb

    fenced = conn.execute(FENCE_LANE_SQL, {"lane": lane, "by": by}).rowcount == 1
    conn.execute(FENCE_AUDIT_SQL, {"by": by, "lane": lane, "details": Jsonb(details)})
    return fenced


def abandon(conn: psycopg.Connection, lineage_id: int, why: str) -> bool:
    return conn.execute(ABANDON_SQL, {"id": lineage_id, "why": why}).rowcount == 1
