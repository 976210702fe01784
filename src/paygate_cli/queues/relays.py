"""The relay queue (paygate.relays) and its fee reservations (paygate.fee_reservations): every
statement that moves a relay's row, by purpose. The relay worker (workers/relay.py) holds the flow
of its phases, relay expiry (workers/relay_expiry.py) its one flip, `replay relays` (ops/replay.py)
its refusals; docs/states.md has the diagram.

Every write of a holder is guarded by the lease token its claim took (queues/leases.py)."""

from __future__ import annotations

from paygate_cli.journal import lineage as lineages
from paygate_cli.queues import leases

# -- claim, renew, release -------------------------------------------------------------------------

# Up to `batch` rows with a lineage in flight and, beside them, up to `batch` fresh ones in admission
# order: each counted on its own, so a tick that resolves its in-flight rows (freeing their lanes)
# has new work for those lanes in the same tick, rather than in-flight rows filling the batch and the
# freed lanes idling a tick (bench/throughput.py: 0.57 of the ceiling at 16 lanes, batch 16). A
# drained instance finishes what is in flight and takes nothing new. This is the queue's one
# take-over routine too: the worker takes rows whose lease lapsed (grace 0) with its free ones;
# recovery takes only those (`lapsed_only`) whose lease lapsed more than its grace ago.
_CLAIMABLE = """
    SELECT ctid, id, lineage_id FROM paygate.relays
    WHERE status = 'queued'
      AND ((lease_expires_at IS NULL AND NOT %(lapsed_only)s)
           OR lease_expires_at < now() - make_interval(secs => %(grace)s))"""
CLAIM_SQL = f"""
WITH in_flight AS ({_CLAIMABLE} AND lineage_id IS NOT NULL
    ORDER BY id LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), fresh AS ({_CLAIMABLE} AND lineage_id IS NULL AND NOT %(draining)s
    ORDER BY id LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), claimable AS (SELECT * FROM in_flight UNION ALL SELECT * FROM fresh)
UPDATE paygate.relays r
SET {leases.take()},
    claimed_by = %(owner)s, attempts = r.attempts + 1, updated_at = now()
FROM claimable LEFT JOIN paygate.lineages x ON x.id = claimable.lineage_id
-- Back to the rows by ctid, the version the FOR UPDATE locked (nobody else can move it until
-- this commits): no primary-key descent per claimed row, so the claim costs the same
-- however long the table's history (bench/growth.py).
WHERE r.ctid = claimable.ctid
RETURNING r.id, r.account, r.contract, r.function, r.args_xdr, r.auth_entries, r.auth_nonces,
          r.auth_expiration_ledger, r.max_fee, r.lease_token, r.lineage_id, r.pending_failure,
          EXISTS (SELECT 1 FROM paygate.relay_allowlist a
                  WHERE a.contract = r.contract AND a.function = r.function AND a.enabled),
          {", ".join(f"x.{c}" for c in lineages.LINEAGE_COLUMNS)}, set_config('synchronous_commit', 'off', true)
"""
# The tick's leases renewed before each phase (workers/recovery.py's grace assumes it: within a phase
# a worker waits on one RPC answer). Relaxed: a renewal lost in a database crash only lets a lease lapse.
RENEW_SQL = f"""
UPDATE paygate.relays r SET {leases.renew("r")}
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS mine(id, token)
WHERE r.id = mine.id AND r.status = 'queued' AND r.lease_token = mine.token
RETURNING set_config('synchronous_commit', 'off', true)
"""
RELEASE_SQL = f"""
UPDATE paygate.relays r SET {leases.RELEASE}, updated_at = now()
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS mine(id, token)
WHERE r.id = mine.id AND r.status = 'queued' AND r.lease_token = mine.token
"""
RELEASE_RELAXED = "RETURNING set_config('synchronous_commit', 'off', true)"

# -- the lease checks and the lineage pointer (the journal engine's Job hooks) ---------------------

# Every write below is guarded by the lease token the claim took.
HOLD_SQL = leases.hold("relays", "r", "r.status = 'queued'", key_param="id", token_param="token")
# The engine's one-statement phases (RelayJob, journal/engine.py Job): the lease check as SQL, the
# row's pointer recorded with the allocation, and phase 2b's install committed with the anchor (the
# relay points at the hash of the envelope just journaled, guarded on the live lease and the
# allocated lineage; zero rows rolls the anchor back with it: nothing installed, nothing sent).
HOLD_ROW_SQL = leases.hold("relays", "r", "r.status = 'queued'")
ATTACH_SQL = """
UPDATE paygate.relays r SET lineage_id = lineage.id, updated_at = now()
FROM lineage WHERE r.id = %(row_id)s AND r.status = 'queued' AND r.lease_token = %(row_token)s
RETURNING 1
"""
HOLD_MANY_SQL = leases.hold_many("relays", "r", "r.status = 'queued'")
ATTACH_MANY_SQL = """
UPDATE paygate.relays r SET lineage_id = lineage.id, updated_at = now()
FROM lineage JOIN req USING (entitlement)
WHERE r.id = req.row_id AND r.status = 'queued' AND r.lease_token = req.row_token
RETURNING 1
"""
INSTALL_ANCHORED_SQL = """
UPDATE paygate.relays r SET tx_hash = %(x_inner_hash)s, updated_at = now()
FROM anchored
WHERE r.id = %(row_id)s AND r.status = 'queued' AND r.lease_token = %(row_token)s AND r.lineage_id = anchored.id
RETURNING 1
"""
INSTALL_ANCHORED_MANY_SQL = """
UPDATE paygate.relays r SET tx_hash = anchored.inner_hash, updated_at = now()
FROM anchored JOIN req ON req.lineage_id = anchored.id
WHERE r.id = req.row_id AND r.status = 'queued' AND r.lease_token = req.row_token AND r.lineage_id = anchored.id
RETURNING 1
"""
# A dead lineage is remembered and the pointer cleared: only then may a new one be prepared.
DROP_LINEAGE_SQL = """
UPDATE paygate.relays
SET lineage_id = NULL, tx_hash = NULL, dead_lineages = dead_lineages || %(lineage)s::bigint, updated_at = now()
WHERE id = %(id)s AND status = 'queued' AND lease_token = %(token)s AND lineage_id = %(lineage)s
"""
SET_PENDING_FAILURE_SQL = """
UPDATE paygate.relays SET pending_failure = %(reason)s, updated_at = now()
WHERE id = %(id)s AND status = 'queued' AND lease_token = %(token)s
"""
# Live relay lineages no queued relay points at any more (a row finished elsewhere): drive them so
# no lane stays pinned. Older than a minute: never a lineage whose allocation is being recorded.
ORPHANS_SQL = """
SELECT x.id FROM paygate.lineages x
WHERE x.purpose = 'relay' AND x.entitlement LIKE 'relay:%%' AND paygate.lineage_is_live(x.state)
  AND x.created_at < now() - interval '1 minute'
  AND NOT EXISTS (SELECT 1 FROM paygate.relays r WHERE r.lineage_id = x.id AND r.status = 'queued')
ORDER BY x.parked_at IS NOT NULL, x.id LIMIT %(limit)s  -- parked ones never crowd out the rest
"""

# -- settle (included on chain), fail / needs_human (terminal), expire -----------------------------

# The disposition of a tick's relays whose lineage was included on chain, in one statement (its own
# transaction): the status flip — a CAS on status + lease token + the lineage whose receipt it
# settles, so a stale tick (another lineage, another lease) matches nothing — then, only for the
# flip's winners, the fee settlement and the event. A settlement that finds no open reservation
# fails require(), and the whole statement, flips included, rolls back: the relays are then disposed
# of one by one (the same statement, one row each), so the refusal stays that row's, which re-ticks.
# Relaxed commit: it records what a receipt proves, so a database crash that loses it leaves the row
# queued on its applied lineage and the next tick disposes again. Nothing outside the database acts
# on it first: a webhook POST follows the webhook claim's synchronous commit, which flushes the WAL
# past this one.
DISPOSE_INCLUDED_SQL = f"""
WITH flipped AS (
    UPDATE paygate.relays r
    SET status = d.status, fee_charged = d.fee, tx_hash = d.tx, reason = d.reason, finished_at = now(),
        {leases.RELEASE}, updated_at = now()
    FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(lineages)s::bigint[], %(statuses)s::text[],
                %(fees)s::bigint[], %(txs)s::bytea[], %(reasons)s::text[], %(payloads)s::jsonb[])
         AS d(id, token, lineage, status, fee, tx, reason, payload)
    WHERE r.id = d.id AND r.status = 'queued' AND r.lease_token = d.token
      AND r.lineage_id IS NOT DISTINCT FROM d.lineage  -- NULL: settled from the chain's receipt alone
    RETURNING r.id, d.lineage, d.fee, d.tx, d.status, d.payload
)
SELECT f.id,
       paygate.require(paygate.settle_relay_fee(f.id, f.lineage, f.fee, f.tx), 'reservation not open at settlement'),
       paygate.emit_event('relay.' || f.status, f.payload), set_config('synchronous_commit', 'off', true)
FROM flipped f ORDER BY f.id
"""
# Terminal without a fee burned by us: the reservation is released in the same transaction. Only
# needs_human may keep a lineage (one whose envelope does not decrypt: parked, it may still land,
# so the reservation stays open and the row keeps pointing at it as the evidence).
FINISH_SQL = f"""
UPDATE paygate.relays
SET status = %(status)s, reason = %(reason)s, finished_at = now(), {leases.RELEASE},
    updated_at = now()
WHERE id = %(id)s AND status = 'queued' AND lease_token = %(token)s
  AND (lineage_id IS NULL OR %(status)s = 'needs_human')
RETURNING id
"""
RELEASE_FEE_SQL = "SELECT paygate.release_relay_fee(%s, %s)"

# Relay expiry (workers/relay_expiry.py): never while a lineage of the relay could still land (its
# current one allocated, signed or sent is the relay worker's to prove dead first), nor while the
# relay worker holds the row's lease; the reservation released and the product told once, in the
# transaction that wins the flip.
EXPIRE_SQL = f"""
WITH expiring AS (
    SELECT r.id FROM paygate.relays r
    LEFT JOIN paygate.lineages x ON x.id = r.lineage_id
    WHERE r.status = 'queued' AND r.auth_expiration_ledger < %(latest)s
      AND (r.lease_expires_at IS NULL OR r.lease_expires_at < now())
      AND (r.lineage_id IS NULL OR x.state IN ('expired', 'superseded', 'abandoned'))
      -- Admitted before a restore: a lost transaction of ours may have used it; the relay worker
      -- settles it from the chain or hands it to a human (workers/relay.py), never an expiry.
      AND NOT paygate.admitted_before_restore(r.created_at)
    ORDER BY r.auth_expiration_ledger, r.id
    LIMIT %(batch)s
    FOR UPDATE OF r SKIP LOCKED
), flipped AS (
    UPDATE paygate.relays r
    SET status = 'expired', finished_at = now(), {leases.RELEASE}, updated_at = now(),
        lineage_id = NULL, tx_hash = NULL,
        dead_lineages = CASE WHEN r.lineage_id IS NULL THEN r.dead_lineages ELSE r.dead_lineages || r.lineage_id END,
        reason = format('authorisation expired at ledger %%s (latest %%s)', r.auth_expiration_ledger, %(latest)s::int)
    FROM expiring e WHERE r.id = e.id
    RETURNING r.id, r.account, r.contract, r.function, r.auth_expiration_ledger, r.max_fee, r.reason
)
SELECT f.id, paygate.release_relay_fee(f.id, f.reason),
       paygate.emit_event('relay.expired', jsonb_build_object(
           'relay_id', f.id, 'account', f.account, 'contract', f.contract, 'function', f.function,
           'auth_expiration_ledger', f.auth_expiration_ledger, 'latest_ledger', %(latest)s::int,
           'released_fee', f.max_fee, 'reason', f.reason))
FROM flipped f
"""
# Asked at an expiry only (workers/relay.py): sql/functions/admitted_before_restore.sql.
ADMITTED_BEFORE_RESTORE_SQL = ("SELECT paygate.admitted_before_restore(created_at) FROM paygate.relays "
                               "WHERE id = %(id)s")
# Cheap check before any chain read: is anything queued at all?
ANY_QUEUED_SQL = "SELECT min(auth_expiration_ledger) FROM paygate.relays WHERE status = 'queued'"

# -- replay (ops/replay.py) ------------------------------------------------------------------------

REPLAY_ROWS_SQL = """
SELECT r.id, r.status, r.account, r.contract, r.function, r.auth_nonces, r.auth_expiration_ledger, r.max_fee,
       r.reason, r.attempts, r.idempotency_key, r.updated_at,
       (SELECT array_agg(l.id || ':' || l.state ORDER BY l.id) FROM paygate.lineages l
        WHERE l.entitlement = 'relay:' || r.id AND paygate.lineage_is_live(l.state)) AS live,
       (SELECT array_agg(l.id ORDER BY l.id) FROM paygate.lineages l
        WHERE l.entitlement = 'relay:' || r.id AND l.state = 'applied') AS applied,
       EXISTS (SELECT 1 FROM paygate.relay_allowlist a
               WHERE a.contract = r.contract AND a.function = r.function AND a.enabled) AS allowed,
       EXISTS (SELECT 1 FROM paygate.fee_reservations f
               WHERE f.relay_id = r.id AND f.status = 'reserved') AS reservation_open
FROM paygate.relays r
WHERE CASE WHEN %(ids)s::bigint[] IS NULL
           THEN r.status = ANY(%(dead)s) AND (%(since)s::timestamptz IS NULL OR r.updated_at >= %(since)s)
           ELSE r.id = ANY(%(ids)s) END
ORDER BY r.id
"""
# What admission would say about fees now (read-only, for the plan; apply re-checks under the lock).
REPLAY_ADMISSION_SQL = """
SELECT (SELECT string_agg(kind || ': ' || reason, '; ' ORDER BY kind) FROM paygate.halts),
       t.reserved, c.fee_budget
FROM paygate.relay_fee_totals t, paygate.relay_config c
"""
# Back to queued under the same idempotency key, the dead lineages kept as history; the relay
# worker starts it afresh (re-checks the authorisation, its nonces and its expiry before building).
REPLAY_SQL = f"""
UPDATE paygate.relays
SET status = 'queued', reason = NULL, pending_failure = NULL, attempts = 0, {leases.RELEASE},
    claimed_by = NULL, lineage_id = NULL, tx_hash = NULL, fee_charged = NULL,
    finished_at = NULL, updated_at = now()
WHERE id = %(id)s AND status = %(status)s AND updated_at = %(updated_at)s
RETURNING id
"""
# The budget rule is admission's own (sql/functions/take_relay_fee_budget.sql); the row is the
# relay's next reservation round. A needs_human relay still holds its reservation: it keeps it.
RESERVATION_OPEN_SQL = """
SELECT 1 FROM paygate.fee_reservations WHERE relay_id = %(id)s AND status = 'reserved'
"""
TAKE_FEE_BUDGET_SQL = "SELECT paygate.take_relay_fee_budget(%(max_fee)s)"
RESERVE_FEE_SQL = """
INSERT INTO paygate.fee_reservations (relay_id, amount, round)
SELECT %(id)s, %(max_fee)s, coalesce(max(round), 0) + 1 FROM paygate.fee_reservations WHERE relay_id = %(id)s
"""
REPLAY_EVENT_SQL = """
SELECT paygate.emit_event('relay.replayed', jsonb_build_object('relay_id', %(id)s::bigint,
                          'account', %(account)s::text, 'contract', %(contract)s::text,
                          'function', %(function)s::text, 'reserved_fee', %(max_fee)s::bigint,
                          'previous_status', %(status)s::text))
"""

# -- depth rows (state.py composes them into `status` and the state metrics) -----------------------

DEPTH_ROWS: dict[str, str] = {
    "relays.queued": """
        SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
        FROM paygate.relays WHERE status = 'queued'""",
    "relays.needs_human": """
        SELECT count(*), extract(epoch FROM now() - min(updated_at))::float8
        FROM paygate.relays WHERE status = 'needs_human'""",
}
