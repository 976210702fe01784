"""Lineage rows: allocation of a lane, anchoring the signed envelope, the terminal transitions.
Every transition is a compare-and-set on the state it expects (docs/architecture.md §1 rule 6); the table's trigger
refuses anything else, so a bug cannot rewrite history either."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from datetime import datetime

    import psycopg

T = TypeVar("T")

# A lineage in flight, holding its lane (at most one per lane); every other state is terminal.
LIVE_STATES = ("allocated", "signed", "sent")

SYNC_LANES_SQL = """
INSERT INTO paygate.lanes (address) SELECT unnest(%s::text[]) ON CONFLICT (address) DO NOTHING
"""

# A free lane: active, one of ours (we hold its key), no live lineage, and submissions open (no
# `restore` halt: after a restore or promotion nothing new is signed until a recovery pass compared
# the journal with the chain, docs/architecture.md §8); the least recently used
# one, so no lane is everyone's first choice (a bad lane first in address order would take every
# allocation). SKIP LOCKED spreads concurrent allocators over lanes; the partial unique index on
# live lineages is the real guard.
def _lane_is_free(lanes_param: str = "lanes") -> str:
    """The condition on `paygate.lanes l` that makes l a free lane of `lanes_param` (above)."""
    return """l.status = 'active' AND l.address = ANY(%(""" + lanes_param + """)s)
      AND NOT EXISTS (SELECT 1 FROM paygate.halts h WHERE h.kind = 'restore')
      AND NOT EXISTS (SELECT 1 FROM paygate.lineages x
                      WHERE x.lane = l.address AND paygate.lineage_is_live(x.state))"""


def free_lane_ctes(*, lanes_param: str = "lanes", only_if: str = "true", limit: str = "1") -> str:
    """The `lane` and `used` CTEs every allocation shares (the one rule for picking a lane), for a
    statement that goes on to insert the lineage from `lane`. `only_if`: a condition that must hold
    for any lane to be taken (e.g. the statement found rows to allocate for); `limit`: how many
    lanes at most (an SQL expression)."""
    return """lane AS (
    SELECT l.address FROM paygate.lanes l
    WHERE """ + only_if + " AND " + _lane_is_free(lanes_param) + """
    ORDER BY l.last_allocated_at NULLS FIRST, l.address
    LIMIT """ + limit + """
    FOR UPDATE OF l SKIP LOCKED
), used AS (
    UPDATE paygate.lanes SET last_allocated_at = clock_timestamp() FROM lane WHERE lanes.address = lane.address
)"""


def lanes_for(worker: str, lanes: Iterable[str], shares: dict[str, int]) -> list[str]:
    """The lanes `worker` may allocate on, by the lane shares (docs/workers.md "Lane shares"): the
    lanes in address order go to the named workers in name order, `shares[w]` each; a named worker
    signs on its own and on the lanes left over, any other worker on every lane. Every process with
    the same lanes and shares computes the same partition, so no two named workers share a lane."""
    from paygate_cli.errors import ConfigError

    ordered = sorted(lanes)
    if not shares:
        return ordered
    if sum(shares.values()) > len(ordered):
        raise ConfigError(f"lane_shares reserve {sum(shares.values())} lanes but {len(ordered)} are configured")
    if worker not in shares:
        return ordered
    start = sum(count for name, count in shares.items() if name < worker)
    leftover = ordered[sum(shares.values()):]
    return ordered[start:start + shares[worker]] + leftover


ALLOCATE_SQL = "WITH " + free_lane_ctes() + """
INSERT INTO paygate.lineages (purpose, entitlement, lane)
SELECT %(purpose)s, %(entitlement)s, lane.address FROM lane
RETURNING id, lane
"""

# How many of `lanes` are free now (an SQL expression: a path may read it with something of its own).
FREE_LANES_EXPR = "(SELECT count(*) FROM paygate.lanes l WHERE " + _lane_is_free() + ")"
FREE_LANES_SQL = "SELECT " + FREE_LANES_EXPR
# Whether any of `lanes` looks free now, without locking it: a claim asks this before it locks its
# candidate rows, so a claim that would find every lane taken costs an index probe, not the rows'
# locks (the lane CTE still decides, under its lock).
ANY_FREE_LANE_EXPR = "EXISTS (SELECT 1 FROM paygate.lanes l WHERE " + _lane_is_free() + ")"



def last_consumed_seq_sql(lane: str) -> str:
    """The highest sequence number known consumed on the lane `lane` (an SQL expression): what the
    lane's chain sequence must equal before a new lineage uses it (journal/engine.py prepare).

    Applied and failed lineages used theirs (a receipt proves it). Expired and abandoned ones never
    landed. A superseded one proves its number consumed, but never alone: by a lineage of ours at
    the same number (applied/failed, counted here) or by a transaction we never journaled, which
    fences the lane with a `lane_fence` finding; an operator who resolves that finding accepts the
    chain's sequence (`lanes.accepted_seq`, sql/0001_baseline.sql), and that counts here too.

    Written as the top of lineages_lane_seq read backwards (ORDER BY … DESC LIMIT 1): a few index
    entries however long the lane's history. Postgres plans max() that way too once the table is
    analysed, but before that (a new deployment, a table that grew since its last ANALYZE) as a scan
    of every lineage the lane ever had; this form it reads backwards for a given lane on stale
    statistics as well (measured: 3 buffers where max() read 105)."""
    return ("(SELECT greatest((SELECT x.source_seq FROM paygate.lineages x WHERE x.lane = " + lane
            + " AND x.state IN ('applied', 'failed') AND x.source_seq IS NOT NULL"
            + " ORDER BY x.source_seq DESC LIMIT 1),"
            + " (SELECT a.accepted_seq FROM paygate.lanes a WHERE a.address = " + lane + ")))")


LAST_CONSUMED_SEQ_SQL = "SELECT " + last_consumed_seq_sql("q.lane") + " FROM (SELECT %s::text AS lane) q"

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

# -- the one-statement phases ------------------------------------------------------------
# A phase written as ONE statement: no BEGIN/COMMIT round trips, one server round trip. A path that
# offers it (journal/engine.py's Job) supplies `{hold}` — its lease check, a SELECT … FOR UPDATE
# that returns a row iff the lease is still its own — and its own row update (`{attach}` reading the
# new `lineage`, `{install}` reading `anchored`). Every part is conditioned on the one before, and
# paygate.require() (sql/functions/require.sql) aborts the whole statement if the row's part did not follow the
# lineage's: all or nothing, as the BEGIN … COMMIT it replaces. set_config(…, true) is SET LOCAL for
# the statement's own transaction (relaxed commit: see db.connect.relaxed_transaction).

# Allocation: hold, least recently used free lane, lineage row, the row's pointer, and the lane's
# highest sequence our journal knows consumed (what next_sequence reads). Relaxed: an allocation
# nothing was signed under is abandoned by the next tick.
ALLOCATE_ATTACH_SQL = """
WITH held AS ({hold}),
""" + free_lane_ctes(lanes_param="x_lanes", only_if="EXISTS (SELECT 1 FROM held)") + """, lineage AS (
    INSERT INTO paygate.lineages (purpose, entitlement, lane)
    SELECT %(x_purpose)s, %(x_entitlement)s, lane.address FROM lane
    RETURNING id, lane
), attached AS ({attach})
SELECT (SELECT count(*) FROM held), n.id, n.lane,
       """ + last_consumed_seq_sql("n.lane") + """,
       paygate.require((SELECT count(*) FROM attached) = (SELECT count(*) FROM lineage),
                       'the row did not take its new lineage'),
       set_config('synchronous_commit', 'off', true)
FROM (SELECT 1) AS one LEFT JOIN lineage n ON true
"""

# The same for a tick's rows at once (journal/engine.py allocate_many): as many free lanes as rows
# whose lease still holds, paired with them in request order; each row takes its lineage (of the
# row's own purpose). The path supplies `{hold}` — the ids of the requested rows (`req`: row_id,
# row_token, entitlement, purpose, n) whose lease is still its own, locked FOR UPDATE — and
# `{attach}`, an UPDATE … FROM lineage JOIN req USING (entitlement) … RETURNING 1 (`lineage`: id,
# purpose, lane, entitlement). One row per request, in order: whether its lease held, and its
# lineage and lane (NULL: no free lane left for it).
ALLOCATE_ATTACH_MANY_SQL = """
WITH req AS (
    SELECT * FROM unnest(%(x_row_ids)s::bigint[], %(x_row_tokens)s::uuid[], %(x_entitlements)s::text[],
                         %(x_purposes)s::text[])
                  WITH ORDINALITY AS q(row_id, row_token, entitlement, purpose, n)
), held AS ({hold}),
wanted AS (
    SELECT req.entitlement, req.purpose, row_number() OVER (ORDER BY req.n) AS k FROM req JOIN held USING (row_id)
),
""" + free_lane_ctes(lanes_param="x_lanes", only_if="EXISTS (SELECT 1 FROM held)",
                     limit="(SELECT count(*) FROM held)") + """, paired AS (
    SELECT w.entitlement, w.purpose, lane.address FROM (SELECT address, row_number() OVER () AS k FROM lane) lane
    JOIN wanted w USING (k)
), lineage AS (
    INSERT INTO paygate.lineages (purpose, entitlement, lane)
    SELECT purpose, entitlement, address FROM paired
    RETURNING id, purpose, lane, entitlement
), attached AS ({attach})
SELECT req.row_id, held.row_id IS NOT NULL, n.id, n.lane,
       """ + last_consumed_seq_sql("n.lane") + """,
       paygate.require((SELECT count(*) FROM attached) = (SELECT count(*) FROM lineage),
                       'a row did not take its new lineage'),
       set_config('synchronous_commit', 'off', true)
FROM req LEFT JOIN held USING (row_id) LEFT JOIN lineage n USING (entitlement)
ORDER BY req.n
"""

# Anchor: hold, allocated -> signed with the encrypted envelope and its bid (bid_ledger: the ledger
# it was signed at), the row's own part. Synchronous commit (the default): durable before anything
# is broadcast (docs/architecture.md §1 rule 3).
ANCHOR_HELD_SQL = """
WITH held AS ({hold}),
anchored AS (
    UPDATE paygate.lineages
    SET state = 'signed', source_seq = %(x_seq)s, key_id = %(x_key_id)s, envelope = %(x_envelope)s,
        inner_hash = %(x_inner_hash)s, outer_hash = %(x_outer_hash)s, max_time = %(x_max_time)s,
        signed_at_ledger = %(x_signed_at_ledger)s, max_ledger = %(x_max_ledger)s, signed_at = now(),
        bid_rate = %(x_bid_rate)s, bid_ledger = %(x_signed_at_ledger)s, fee_ops = %(x_fee_ops)s,
        resource_fee = %(x_resource_fee)s, cap_rate = %(x_cap_rate)s
    WHERE id = %(x_id)s AND state = 'allocated' AND EXISTS (SELECT 1 FROM held)
    RETURNING id
), installed AS ({install})
SELECT (SELECT count(*) FROM held), (SELECT count(*) FROM anchored),
       paygate.require((SELECT count(*) FROM installed) = (SELECT count(*) FROM anchored),
                       'the row did not take its envelope')
"""
# The same for a tick's envelopes at once (journal/engine.py send_prepared): one statement, one
# synchronous commit. `{hold}` as for ALLOCATE_ATTACH_MANY_SQL (over `req`: row_id, row_token,
# lineage_id, …); `{install}` an UPDATE … FROM anchored JOIN req ON req.lineage_id = anchored.id …
# RETURNING 1. One row per unit, in order: whether its lease held, whether its lineage was anchored.
ANCHOR_HELD_MANY_SQL = """
WITH req AS (
    SELECT * FROM unnest(%(x_row_ids)s::bigint[], %(x_row_tokens)s::uuid[], %(x_ids)s::bigint[], %(x_seqs)s::bigint[],
                         %(x_key_ids)s::text[], %(x_envelopes)s::bytea[], %(x_inner_hashes)s::bytea[],
                         %(x_outer_hashes)s::bytea[], %(x_max_times)s::bigint[], %(x_signed_at_ledgers)s::bigint[],
                         %(x_max_ledgers)s::bigint[], %(x_bid_rates)s::bigint[], %(x_fee_opss)s::smallint[],
                         %(x_resource_fees)s::bigint[], %(x_cap_rates)s::bigint[])
                  WITH ORDINALITY AS q(row_id, row_token, lineage_id, seq, key_id, envelope, inner_hash, outer_hash,
                                       max_time, signed_at_ledger, max_ledger, bid_rate, fee_ops, resource_fee,
                                       cap_rate, n)
), held AS ({hold}),
anchored AS (
    UPDATE paygate.lineages x
    SET state = 'signed', source_seq = q.seq, key_id = q.key_id, envelope = q.envelope, inner_hash = q.inner_hash,
        outer_hash = q.outer_hash, max_time = q.max_time, signed_at_ledger = q.signed_at_ledger,
        max_ledger = q.max_ledger, signed_at = now(), bid_rate = q.bid_rate, bid_ledger = q.signed_at_ledger,
        fee_ops = q.fee_ops, resource_fee = q.resource_fee, cap_rate = q.cap_rate
    FROM req q
    WHERE x.id = q.lineage_id AND x.state = 'allocated' AND q.row_id IN (SELECT row_id FROM held)
    RETURNING x.id, x.inner_hash
), installed AS ({install})
SELECT held.row_id IS NOT NULL, a.id IS NOT NULL,
       paygate.require((SELECT count(*) FROM installed) = (SELECT count(*) FROM anchored),
                       'a row did not take its envelope')
FROM req LEFT JOIN held USING (row_id) LEFT JOIN anchored a ON a.id = req.lineage_id
ORDER BY req.n
"""
# A path with nothing of its own to write at anchor. (`{attach}` and `{install}` return a row per
# row they wrote: UPDATE … RETURNING 1.)
NO_INSTALL = "SELECT 1 FROM anchored"

# What the broadcast answered: re-derivable (a 'signed' lineage is resolved the same way), so relaxed.

# The tick's broadcasts recorded together (journal/engine.py flush_sent): one statement a tick, or
# a CTE in front of the path's own end-of-tick statement (MARK_SENT_BEFORE).
MARK_SENT_MANY = """
UPDATE paygate.lineages x
SET state = 'sent', send_count = x.send_count + 1, last_send_status = m.status, sent_at = coalesce(x.sent_at, now())
FROM unnest(%(x_sent_ids)s::bigint[], %(x_sent_statuses)s::text[]) AS m(id, status)
WHERE x.id = m.id AND x.state IN ('signed', 'sent')
"""
MARK_SENT_MANY_SQL = MARK_SENT_MANY.rstrip() + "\nRETURNING set_config('synchronous_commit', 'off', true)\n"
MARK_SENT_BEFORE = "WITH marked_sent AS (" + MARK_SENT_MANY.strip() + " RETURNING 1)\n"

# Receipts recorded from the chain (re-derivable: the chain keeps them), relaxed, a tick's in one
# statement (journal/resolve.py record_receipts). Each row is the same CAS as FINISH_SQL; the ids
# whose CAS won come back.
FINISH_RECEIPTS_SQL = """
UPDATE paygate.lineages x
SET state = r.state, ledger = r.ledger, fee_charged = r.fee, result_code = r.code, resolution = r.resolution,
    resolved_at = now()
FROM unnest(%(ids)s::bigint[], %(states)s::text[], %(ledgers)s::bigint[], %(fees)s::bigint[], %(codes)s::text[],
            %(resolutions)s::text[]) AS r(id, state, ledger, fee, code, resolution)
WHERE x.id = r.id AND x.state IN ('signed', 'sent')
RETURNING x.id, set_config('synchronous_commit', 'off', true)
"""

# -- the fee market (docs/architecture.md §4 "Fees and the fee market") --------------------------

# A replacement fee bump journaled BEFORE it is broadcast (rule 3), one statement, synchronous
# commit: the new outer envelope (same inner transaction, so the same lane, sequence and bounds),
# its bid, the replacement counted, fee-capped cleared; the outer hash it replaced kept in
# lineage_envelopes. The CAS is on the outer hash and the count the caller read: a racing
# replacer, or a resolver that finished the lineage, makes it match nothing (nothing is sent).
REPLACE_ENVELOPE_SQL = """
WITH replaced AS (
    UPDATE paygate.lineages x
    SET envelope = %(envelope)s, key_id = %(key_id)s, outer_hash = %(outer_hash)s, bid_rate = %(bid_rate)s,
        bid_ledger = %(bid_ledger)s, replacements = x.replacements + 1, fee_capped_at = NULL, fee_required = NULL
    WHERE x.id = %(id)s AND x.state IN ('signed', 'sent') AND x.outer_hash = %(old_outer_hash)s
      AND x.replacements = %(replacements)s
    RETURNING x.id, x.replacements
), kept AS (
    INSERT INTO paygate.lineage_envelopes (lineage_id, replaced_by, outer_hash, bid_rate, bid_ledger)
    SELECT r.id, r.replacements, %(old_outer_hash)s, %(old_bid_rate)s, %(old_bid_ledger)s FROM replaced r
    RETURNING 1
)
SELECT r.replacements, (SELECT count(*) FROM kept) FROM replaced r
"""

# Fee-capped: the market asks more than the lineage may bid. Since when (the first time) and what
# rate it asked (the latest); relaxed: the next tick derives it again.
SET_FEE_CAPPED_SQL = """
UPDATE paygate.lineages
SET fee_capped_at = coalesce(fee_capped_at, now()), fee_required = %(required)s
WHERE id = %(id)s AND state IN ('signed', 'sent')
  AND (fee_capped_at IS NULL OR fee_required IS DISTINCT FROM %(required)s)
RETURNING fee_capped_at, set_config('synchronous_commit', 'off', true)
"""
CLEAR_FEE_CAPPED_SQL = """
UPDATE paygate.lineages SET fee_capped_at = NULL, fee_required = NULL
WHERE id = %(id)s AND fee_capped_at IS NOT NULL AND state IN ('signed', 'sent')
RETURNING set_config('synchronous_commit', 'off', true)
"""

# The fee-capped live lineages of some paths (a path: a purpose and its entitlements' kind, the
# text before the first ':', since relays and bot jobs share the purpose 'relay'): how many, the
# highest rate they need and the lowest cap among them (the stall reason; lineages_fee_capped).
FEE_CAPPED_OF_SQL = """
SELECT count(*), max(fee_required), min(cap_rate)
FROM paygate.lineages
WHERE fee_capped_at IS NOT NULL AND paygate.lineage_is_live(state)
  AND (purpose, split_part(entitlement, ':', 1)) IN (SELECT * FROM unnest(%(purposes)s::text[], %(kinds)s::text[]))
"""


def replace_envelope(conn: psycopg.Connection, lineage: Lineage, *, envelope: bytes, key_id: str, outer_hash: bytes,
                     bid_rate: int, bid_ledger: int) -> bool:
    """Journal a replacement envelope for `lineage` (as read: its outer hash and count are the CAS).
    True when this call's replacement is the lineage's envelope now."""
    row = one_statement(conn, REPLACE_ENVELOPE_SQL, {
        "id": lineage.id, "envelope": envelope, "key_id": key_id, "outer_hash": outer_hash, "bid_rate": bid_rate,
        "bid_ledger": bid_ledger, "old_outer_hash": lineage.outer_hash, "replacements": lineage.replacements,
        "old_bid_rate": lineage.bid_rate, "old_bid_ledger": lineage.bid_ledger}).fetchone()
    return row is not None


def set_fee_capped(conn: psycopg.Connection, lineage_id: int, required: int) -> bool:
    """Mark the lineage fee-capped (or update the rate it needs); True when this call wrote it."""
    return one_statement(conn, SET_FEE_CAPPED_SQL, {"id": lineage_id, "required": required}).fetchone() is not None


def clear_fee_capped(conn: psycopg.Connection, lineage_id: int) -> bool:
    return one_statement(conn, CLEAR_FEE_CAPPED_SQL, {"id": lineage_id}).fetchone() is not None


def fee_capped_of(conn: psycopg.Connection, paths: set[tuple[str, str]]) -> tuple[int, int | None, int | None]:
    """(count, highest required rate, lowest cap) of the live fee-capped lineages of `paths`."""
    ordered = sorted(paths)
    count, required, cap = conn.execute(FEE_CAPPED_OF_SQL, {"purposes": [p for p, _ in ordered],
                                                            "kinds": [k for _, k in ordered]}).fetchone()
    return int(count), None if required is None else int(required), None if cap is None else int(cap)


# Exactly the SQLSTATE paygate.require() raises (sql/functions/require.sql).
REQUIRE_FAILED = "PGR01"


# Lineage's fields, in order (a path's claim may read the lineage in flight with its rows).
LINEAGE_COLUMNS = ("id", "purpose", "entitlement", "lane", "state", "source_seq", "key_id", "envelope", "inner_hash",
                   "outer_hash", "max_time", "signed_at_ledger", "ledger", "fee_charged", "result_code", "resolution",
                   "max_ledger", "parked_reason", "bid_rate", "bid_ledger", "fee_ops", "resource_fee", "cap_rate",
                   "replacements", "fee_capped_at", "fee_required")
LOAD_SQL = f"SELECT {', '.join(LINEAGE_COLUMNS)} FROM paygate.lineages WHERE id = %s"

# A lane that cannot be trusted with new work (its sequence consumed by a transaction we never
# journaled, or it failed for a lane reason): fence it (no new allocations) until a human has
# looked, with why on the lane itself (status, nonce-inspect and drain show it); a retired lane
# stays retired.
FENCE_LANE_SQL = """
UPDATE paygate.lanes SET status = 'drained', drained_at = now(), drained_by = %(by)s, drain_reason = %(reason)s
WHERE address = %(lane)s AND status = 'active'
"""
# The finding a sequence fence opens (one open per lane, findings_one_open): a repeat sighting
# updates the evidence and never alerts again. Only an operator resolves it
# (sql/functions/accept_lane_fence.sql); undrain does not.
FENCE_FINDING_SQL = """
INSERT INTO paygate.findings AS f (kind, subject, summary, details, alerted_at)
VALUES ('lane_fence', %(lane)s, %(summary)s, %(details)s, now())
ON CONFLICT (kind, subject) WHERE resolved_at IS NULL
DO UPDATE SET last_seen = now(), seen_count = f.seen_count + 1, summary = EXCLUDED.summary, details = EXCLUDED.details
RETURNING f.id, (f.seen_count = 1) AS new
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
    # Why its envelope cannot be resent (it does not decrypt): parked, still live, never resent
    # (journal/resolve.py park; parked_at in sql/0001_baseline.sql). None for every ordinary lineage.
    parked_reason: str | None = None
    # Its bid (docs/architecture.md §4 "Fees and the fee market"; None: signed before paygate bid
    # from the market): the current outer envelope's rate and the ledger it was journaled at, the
    # operations and resource fee of its fee, the highest rate it may ever bid, and its replacements.
    bid_rate: int | None = None
    bid_ledger: int | None = None
    fee_ops: int | None = None
    resource_fee: int | None = None
    cap_rate: int | None = None
    replacements: int = 0
    # Fee-capped: since when the market has asked more than cap_rate, and what rate it asked.
    fee_capped_at: datetime | None = None
    fee_required: int | None = None

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
                "fee_charged": self.fee_charged, "result_code": self.result_code, "resolution": self.resolution,
                "parked_reason": self.parked_reason, "bid_rate": self.bid_rate, "bid_ledger": self.bid_ledger,
                "fee_ops": self.fee_ops, "resource_fee": self.resource_fee, "cap_rate": self.cap_rate,
                "replacements": self.replacements,
                "fee_capped_at": self.fee_capped_at.isoformat() if self.fee_capped_at else None,
                "fee_required": self.fee_required}


def load(conn: psycopg.Connection, lineage_id: int) -> Lineage:
    row = conn.execute(LOAD_SQL, (lineage_id,)).fetchone()
    if row is None:
        raise LookupError(f"lineage {lineage_id} does not exist")
    return Lineage(*row)


def sync_lanes(conn: psycopg.Connection, addresses: list[str]) -> None:
    conn.execute(SYNC_LANES_SQL, (sorted(addresses),))


# A statement that lost a lane race runs again this many times in all before it reads as "no free lane".
LANE_RACE_ATTEMPTS = 3


def retry_lost_lane_race(statement: Callable[[], T], lost: T) -> T:
    """`statement()`: one statement (or savepoint) that allocates lineages on free lanes; again when it
    lost a lane race, and `lost` once it has lost LANE_RACE_ATTEMPTS times.

    Two allocators can both see a lane as free: free_lane_ctes' NOT EXISTS reads the statement's
    snapshot, taken before the other's lineage committed. The unique index on live lineages then
    refuses the second insert and the whole statement rolls back (nothing was written). Run again,
    the statement reads a snapshot with the winner's lineage in it and takes another free lane, so
    a lost race costs a statement, not a lane left idle for a ledger. Under REPEATABLE READ the
    winner's update of the lane row is a serialization failure instead: the same race. (A
    REPEATABLE READ caller keeps its snapshot, so its attempts lose alike and it gets `lost`.)"""
    import psycopg

    for _ in range(LANE_RACE_ATTEMPTS):
        try:
            return statement()
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "lineages_one_live_per_lane":
                raise
        except psycopg.errors.SerializationFailure:
            pass
    return lost


def allocate(conn: psycopg.Connection, *, purpose: str, entitlement: str, lanes: list[str]) -> tuple[int, str] | None:
    """Inside the caller's transaction (a savepoint keeps it usable after a lost race: see
    retry_lost_lane_race). None when every lane is busy or drained."""
    params = {"lanes": sorted(lanes), "purpose": purpose, "entitlement": entitlement}

    def allocate_once() -> tuple[int, str] | None:
        with conn.transaction():
            row = conn.execute(ALLOCATE_SQL, params).fetchone()
        return (int(row[0]), str(row[1])) if row else None

    return retry_lost_lane_race(allocate_once, None)


def free_lane_count(conn: psycopg.Connection, lanes: list[str]) -> int:
    return int(conn.execute(FREE_LANES_SQL, {"lanes": sorted(lanes)}).fetchone()[0])


def last_consumed(conn: psycopg.Connection, lane: str) -> int | None:
    """The lane's highest sequence known consumed (last_consumed_seq_sql); None: never used by the journal."""
    journal = conn.execute(LAST_CONSUMED_SEQ_SQL, (lane,)).fetchone()[0]
    return None if journal is None else int(journal)


def next_sequence(conn: psycopg.Connection, lane: str, chain_seq: int) -> int:
    """Chain sequence + 1, but never below what our own journal knows was consumed: a lagging
    sequence read must not make us build a transaction for a number already used."""
    return max(chain_seq, last_consumed(conn, lane) or 0) + 1


def anchor(conn: psycopg.Connection, lineage_id: int, **fields: Any) -> bool:
    return conn.execute(ANCHOR_SQL, {"id": lineage_id, "max_ledger": None, **fields}).rowcount == 1


def mark_sent(conn: psycopg.Connection, lineage_id: int, status: str) -> bool:
    return conn.execute(MARK_SENT_SQL, {"id": lineage_id, "status": status}).rowcount == 1


def one_statement(conn: psycopg.Connection, sql: str, params: dict[str, Any]) -> psycopg.Cursor[Any]:
    """Run one statement as its own transaction. On an idle autocommit connection that is the
    statement alone (no BEGIN/COMMIT round trips); otherwise a transaction block (a savepoint inside
    the caller's) gives the same all-or-nothing. The cursor's rows are fetched either way."""
    from psycopg.pq import TransactionStatus

    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        return conn.execute(sql, params)
    with conn.transaction():
        return conn.execute(sql, params)


def mark_sent_many(conn: psycopg.Connection, sent: list[tuple[int, str]],
                   then: tuple[str, dict[str, Any]] | None = None) -> None:
    """mark_sent for several lineages in one relaxed statement. `then`: the caller's own relaxed
    statement (no WITH clause of its own), run as the same statement after the marks."""
    params = {"x_sent_ids": [i for i, _ in sent], "x_sent_statuses": [status for _, status in sent]}
    if then is None:
        if sent:
            one_statement(conn, MARK_SENT_MANY_SQL, params)
        return
    sql, own = then
    one_statement(conn, (MARK_SENT_BEFORE + sql) if sent else sql, {**own, **params})


def finish_receipts(conn: psycopg.Connection, receipts: list[dict[str, Any]]) -> set[int]:
    """finish() of several receipts (dicts of id, state, ledger, fee, code, resolution) in one
    relaxed statement; the ids whose CAS won. Sorted by id, so two writers of overlapping sets
    tend to lock in the same order (a deadlock, should one still happen, is the caller's to retry
    one by one: journal/resolve.py record_receipts)."""
    if not receipts:
        return set()
    ordered = sorted(receipts, key=lambda r: r["id"])
    params = {f"{k}s": [r[k] for r in ordered] for k in ("id", "state", "ledger", "fee", "code", "resolution")}
    return {int(row[0]) for row in one_statement(conn, FINISH_RECEIPTS_SQL, params).fetchall()}


def finish(conn: psycopg.Connection, lineage_id: int, state: str, *, ledger: int | None = None,
           fee: int | None = None, code: str | None = None, resolution: str) -> bool:
    return conn.execute(FINISH_SQL, {"id": lineage_id, "state": state, "ledger": ledger, "fee": fee,
                                     "code": code, "resolution": resolution}).rowcount == 1


def fence_lane(conn: psycopg.Connection, lane: str, *, by: str, details: dict[str, Any], reason: str | None = None,
               finding: str | None = None) -> bool:
    """Inside the caller's transaction: drain the lane with `reason` on the lane (default: the
    details' `why`, else `by`) and record the evidence in the audit log. `finding`: the summary of
    the `lane_fence` finding to open (sequence fences: rule 10), with `details` as its evidence."""
    from psycopg.types.json import Jsonb

    why = (reason or str(details.get("why") or by))[:1000]
    fenced = conn.execute(FENCE_LANE_SQL, {"lane": lane, "by": by, "reason": why}).rowcount == 1
    conn.execute(FENCE_AUDIT_SQL, {"by": by, "lane": lane, "details": Jsonb(details)})
    if finding is not None:
        conn.execute(FENCE_FINDING_SQL, {"lane": lane, "summary": finding[:1000], "details": Jsonb(details)})
    return fenced


def abandon(conn: psycopg.Connection, lineage_id: int, why: str) -> bool:
    return conn.execute(ABANDON_SQL, {"id": lineage_id, "why": why}).rowcount == 1


# A live lineage whose stored envelope does not decrypt (journal/resolve.py): parked and its lane
# fenced, in one statement. Only the first parker gets a row back (it alone reports it: exit 3
# once). It stays live: only the chain may end it (sql/0001_baseline.sql says why, at parked_at).
PARK_SQL = """
WITH parked AS (
    UPDATE paygate.lineages SET parked_at = now(), parked_reason = %(why)s
    WHERE id = %(id)s AND state IN ('signed', 'sent') AND parked_at IS NULL
    RETURNING id, lane
), fenced AS (
    UPDATE paygate.lanes l
    SET status = 'drained', drained_at = now(), drained_by = %(by)s, drain_reason = %(lane_reason)s
    FROM parked WHERE l.address = parked.lane AND l.status = 'active'
    RETURNING l.address
), audited AS (
    INSERT INTO paygate.audit_log (actor, action, target, details)
    SELECT %(by)s, 'lane.fence', parked.lane, %(details)s FROM parked
    RETURNING 1
)
SELECT parked.id, (SELECT count(*) FROM fenced), (SELECT count(*) FROM audited) FROM parked
"""
PARKED_BY = "paygate:envelope_tampered"


def park(conn: psycopg.Connection, lineage: Lineage, why: str) -> bool:
    """Park `lineage` (its envelope does not decrypt) and fence its lane; True when this call parked it."""
    from psycopg.types.json import Jsonb

    lane_reason = (f"lineage {lineage.id} (sequence {lineage.source_seq}) has an envelope that does not decrypt: "
                   "its bytes may still land, so the lane's sequence is not ours to reuse until a human looks")
    row = one_statement(conn, PARK_SQL, {
        "id": lineage.id, "why": why[:1000], "by": PARKED_BY, "lane_reason": lane_reason,
        "details": Jsonb({"why": why[:500], "lineage_id": lineage.id, "source_seq": lineage.source_seq,
                          "entitlement": lineage.entitlement})}).fetchone()
    return row is not None
