"""Deposits (paygate.deposits): a user's signed SAC transfer authorisation waiting to become USDC in
the billing contract and a credit on the account (docs/architecture.md §5).

Rows come in through `paygate.admit_deposit` (the API role) as `pending`. The funding worker
(workers/funding.py) claims them under a lease and moves them out: `settled` (its credit applied;
the observer may win that flip from the credit event instead), `failed` (a bad authorisation, a
transfer failed or rejected on chain), `expired` (the authorisation ran out) or `needs_human`.
Recovery takes over rows whose owner died through funding's own claim (`lapsed_only`), and
`replay deposits` (ops/replay.py) puts a dead row back to `pending`.

Statuses: pending -> settled | failed | expired | needs_human; failed | expired | needs_human ->
pending (replay); docs/states.md has the diagram. Where a deposit is credited: SETTLE_SQL (the
flip and the account's cached balance increment, one statement)."""

from __future__ import annotations

from paygate_cli.journal import lineage as lineages
from paygate_cli.queues import leases

# -- claim -------------------------------------------------------------------------------------------

# Up to `batch` rows with a transaction in flight and, beside them, up to `batch` fresh ones in
# order: each counted on its own, so the lanes a tick frees by resolving its in-flight rows get new
# work in the same tick (queues/relays.py CLAIM_SQL says why). A drained instance takes no new work
# but still drives what is in flight (a row with a lineage).
_CLAIMABLE = """
    SELECT ctid, id, deposit_lineage_id, credit_lineage_id FROM paygate.deposits
    WHERE status = 'pending'
      AND ((lease_expires_at IS NULL AND NOT %(lapsed_only)s)
           OR lease_expires_at < now() - make_interval(secs => %(grace)s))"""
CLAIM_SQL = f"""
WITH in_flight AS ({_CLAIMABLE} AND (deposit_lineage_id IS NOT NULL OR credit_lineage_id IS NOT NULL)
    ORDER BY id LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), fresh AS ({_CLAIMABLE} AND deposit_lineage_id IS NULL AND credit_lineage_id IS NULL AND NOT %(draining)s
    ORDER BY id LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), claimable AS (SELECT * FROM in_flight UNION ALL SELECT * FROM fresh)
UPDATE paygate.deposits p
SET {leases.take()},
    claimed_by = %(owner)s, attempts = p.attempts + 1, updated_at = now()
FROM claimable LEFT JOIN paygate.lineages x ON x.id = coalesce(claimable.credit_lineage_id,
                                                               claimable.deposit_lineage_id)
-- Back to the rows by ctid, the version the FOR UPDATE locked (nobody else can move it until
-- this commits): no primary-key descent per claimed row, so the claim costs the same
-- however long the table's history (bench/growth.py).
WHERE p.ctid = claimable.ctid
RETURNING p.id, p.account, p.amount, p.auth_entry, p.auth_nonce, p.auth_expiration_ledger, p.lease_token,
          p.deposit_lineage_id, p.credit_lineage_id, p.deposit_tx, p.pending_failure,
          {", ".join(f"x.{c}" for c in lineages.LINEAGE_COLUMNS)}
"""

# A claim is re-derivable (its lease lapses): the statement's own transaction commits relaxed.
RELAXED = ", set_config('synchronous_commit', 'off', true)"

# -- hold / renew ------------------------------------------------------------------------------------

# Every write below is guarded by the lease token it claimed with: a worker whose lease lapsed
# (and whose row someone else now owns) changes nothing.

# The lease check before each phase, renewing it: zero rows = another worker has the row now.
RENEW_SQL = f"""
UPDATE paygate.deposits p
SET {leases.renew("p")}
WHERE id = %(id)s AND status = 'pending' AND lease_token = %(token)s
RETURNING 1
"""

# The engine's one-statement phases (workers/funding.py FundingJob): the lease check locks the row;
# the allocation records the lineage on the row and renews the lease in the same statement; the
# credit's allocation also records the deposit's inner hash (until then an applied deposit lineage
# says it: the row points at it, so a crash before this write re-derives it). The anchor renews the
# lease.
HOLD_ROW_SQL = leases.hold("deposits", "p", "p.status = 'pending'")
ATTACH_DEPOSIT_SQL = f"""
UPDATE paygate.deposits p
SET deposit_lineage_id = lineage.id, updated_at = now(),
    {leases.renew("p", "row_lease")}
FROM lineage WHERE p.id = %(row_id)s AND p.status = 'pending' AND p.lease_token = %(row_token)s
RETURNING 1
"""
ATTACH_CREDIT_SQL = f"""
UPDATE paygate.deposits p
SET credit_lineage_id = lineage.id, deposit_tx = %(row_deposit_tx)s, pending_failure = NULL, updated_at = now(),
    {leases.renew("p", "row_lease")}
FROM lineage WHERE p.id = %(row_id)s AND p.status = 'pending' AND p.lease_token = %(row_token)s
RETURNING 1
"""
# The same for a tick's rows (engine.allocate_many, over its request `req`), deposits and credits in
# one statement: each row takes the lineage of its own phase. A credit's deposit hash is its applied
# deposit lineage's (what the single-row form is given); a row where that is not so takes nothing,
# the statement's require() fails, and each row is allocated for alone.
HOLD_MANY_SQL = leases.hold_many("deposits", "p", "p.status = 'pending'")
ATTACH_MANY_SQL = f"""
UPDATE paygate.deposits p
SET deposit_lineage_id = CASE lineage.purpose WHEN 'deposit' THEN lineage.id ELSE p.deposit_lineage_id END,
    credit_lineage_id = CASE lineage.purpose WHEN 'credit' THEN lineage.id ELSE p.credit_lineage_id END,
    deposit_tx = CASE lineage.purpose WHEN 'credit'
                 THEN (SELECT d.inner_hash FROM paygate.lineages d WHERE d.id = p.deposit_lineage_id)
                 ELSE p.deposit_tx END,
    pending_failure = CASE lineage.purpose WHEN 'credit' THEN NULL ELSE p.pending_failure END,
    updated_at = now(),
    {leases.renew("p", "row_lease")}
FROM lineage JOIN req USING (entitlement)
WHERE p.id = req.row_id AND p.status = 'pending' AND p.lease_token = req.row_token
  AND (lineage.purpose = 'deposit'
       OR EXISTS (SELECT 1 FROM paygate.lineages d
                  WHERE d.id = p.deposit_lineage_id AND d.state = 'applied'
                    AND d.inner_hash = coalesce(p.deposit_tx, d.inner_hash)))
RETURNING 1
"""
RENEW_AT_ANCHOR_SQL = f"""
UPDATE paygate.deposits p
SET {leases.renew("p", "row_lease")}
FROM anchored WHERE p.id = %(row_id)s AND p.status = 'pending' AND p.lease_token = %(row_token)s
RETURNING 1
"""
RENEW_AT_ANCHOR_MANY_SQL = f"""
UPDATE paygate.deposits p
SET {leases.renew("p", "row_lease")}
FROM anchored JOIN req ON req.lineage_id = anchored.id
WHERE p.id = req.row_id AND p.status = 'pending' AND p.lease_token = req.row_token
RETURNING 1
"""

# Rejected for good at send: the row ends failed once its lineage is proven dead (maxTime); the mark
# is cleared with the credit's allocation if the same bytes land after all.
SET_PENDING_FAILURE_SQL = """
UPDATE paygate.deposits SET pending_failure = %(reason)s, updated_at = now()
WHERE id = %(id)s AND status = 'pending' AND lease_token = %(token)s
"""

# -- release -----------------------------------------------------------------------------------------

# The tick's rows handed back, in one statement (after the engine's deferred 'sent' marks); relaxed:
# a lease left in place only lapses.
RELEASE_RELAXED = "RETURNING set_config('synchronous_commit', 'off', true)"
RELEASE_SQL = f"""
UPDATE paygate.deposits p SET {leases.RELEASE}, updated_at = now()
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS mine(id, token)
WHERE p.id = mine.id AND p.status = 'pending' AND p.lease_token = mine.token
"""

# -- fail / expire / needs_human -----------------------------------------------------------------------

# A terminal status other than settled (failed, expired, needs_human), under the lease; the caller
# emits the deposit.* event in the same transaction.
FINISH_ROW_SQL = f"""
UPDATE paygate.deposits
SET status = %(status)s, reason = %(reason)s, {leases.RELEASE}, updated_at = now()
WHERE id = %(id)s AND status = 'pending' AND lease_token = %(token)s
RETURNING account, amount
"""

# -- settle: where a deposit is credited ---------------------------------------------------------------

# The flip and the balance increment are one statement (for a tick's deposits, or the observer's
# one): whichever of funding and the observer wins pending -> settled applies the increment; the
# loser's statement matches no row (the observer runs it inside its page transaction). Funding's
# own settle (SETTLE_RELAXED_SQL) commits relaxed: it records what the credit's receipt proves, so
# a database crash that loses it leaves the row pending on its applied credit lineage and the next
# tick settles again. Nothing outside the database acts on it first: a webhook POST follows the
# webhook claim's synchronous commit, which flushes the WAL past this one.
def _settle_sql(relaxed: str) -> str:
    """The settle statement; `relaxed` ends its select list (funding's own commits relaxed)."""
    return f"""
WITH flipped AS (
    UPDATE paygate.deposits p
    SET status = 'settled', settled_by = %(by)s, settled_at = now(), {leases.RELEASE},
        updated_at = now()
    FROM unnest(%(ids)s::bigint[], %(deposit_txs)s::bytea[]) AS s(id, deposit_tx)
    WHERE p.id = s.id AND p.status = 'pending' AND p.deposit_tx = s.deposit_tx
    RETURNING p.id, p.account, p.amount, p.deposit_tx
), credited AS (
    -- One increment per account (an UPDATE … FROM applies one matching row per target row).
    UPDATE paygate.accounts a SET cached_balance = a.cached_balance + t.amount, updated_at = now()
    FROM (SELECT account, sum(amount) AS amount FROM flipped GROUP BY account) t WHERE a.address = t.account
    RETURNING a.address, a.cached_balance
), settled AS (
    -- Each deposit's balance right after its own credit: the account's new balance less what this
    -- statement credited it after that deposit (by id).
    SELECT f.id, f.account, f.amount, f.deposit_tx,
           c.cached_balance - (sum(f.amount) OVER (PARTITION BY f.account ORDER BY f.id DESC) - f.amount) AS balance
    FROM flipped f JOIN credited c ON c.address = f.account
    ORDER BY f.id
)
SELECT s.id, s.account, s.amount, s.balance,
       paygate.emit_event('deposit.settled', jsonb_build_object(
           'deposit_id', s.id, 'account', s.account, 'amount', s.amount::text,
           'deposit_tx', encode(s.deposit_tx, 'hex'), 'balance', s.balance::text)){relaxed}
FROM settled s
"""


SETTLE_SQL = _settle_sql("")
# The observer's settle of a credit whose deposit hash the row has not recorded (a restore lost the
# credit's allocation, which records it): first the hash, taken from the applied deposit lineage the
# row points at, which the credit event names. No lease: the value is the one funding records with
# its credit (ATTACH_MANY_SQL), and funding's own writes stay guarded by theirs.
RECORD_DEPOSIT_TX_SQL = """
UPDATE paygate.deposits p SET deposit_tx = d.inner_hash, updated_at = now()
FROM paygate.lineages d
WHERE p.id = %(id)s AND p.status = 'pending' AND p.deposit_tx IS NULL
  AND d.id = p.deposit_lineage_id AND d.purpose = 'deposit' AND d.state = 'applied' AND d.inner_hash = %(ref)s
"""
SETTLE_RELAXED_SQL = _settle_sql(", set_config('synchronous_commit', 'off', true)")

# A deposit whose authorisation nonce is consumed with no lineage of ours (a restore lost the
# lineages journaled after the backup): the hashes the chain's credits named for its account and
# amount, which the observer quarantined for want of a deposit (funding checks each on chain).
UNMATCHED_CREDITS_SQL = """
SELECT decode(e.payload->>'ref', 'hex') FROM paygate.chain_events e
WHERE e.quarantined AND e.kind = 'credit' AND e.applied_to IS NULL
  AND e.payload->>'account' = %(account)s AND e.payload->>'amount' = %(amount)s
ORDER BY e.ledger, e.event_id
LIMIT 10
"""
# Asked at an expiry only (workers/funding.py): sql/functions/admitted_before_restore.sql.
ADMITTED_BEFORE_RESTORE_SQL = ("SELECT paygate.admitted_before_restore(created_at) FROM paygate.deposits "
                               "WHERE id = %(id)s")
# The hash a majority of read hosts show carrying the row's authorisation: the row records it under
# its lease, and the observer settles the row from the credit event naming it.
RECORD_LANDED_TX_SQL = """
UPDATE paygate.deposits SET deposit_tx = %(deposit_tx)s, updated_at = now()
WHERE id = %(id)s AND status = 'pending' AND lease_token = %(token)s AND deposit_tx IS NULL
  AND deposit_lineage_id IS NULL
"""

# -- orphans -------------------------------------------------------------------------------------------

# Live funding lineages that no pending row points at any more: the row was settled (the observer
# won the credit race), failed or was handed to a human. Nothing else would ever resolve them.
ORPHANS_SQL = """
SELECT x.id FROM paygate.lineages x
WHERE paygate.lineage_is_live(x.state) AND x.purpose IN ('deposit', 'credit')
  AND NOT EXISTS (SELECT 1 FROM paygate.deposits p
                  WHERE p.status = 'pending' AND (p.deposit_lineage_id = x.id OR p.credit_lineage_id = x.id))
ORDER BY x.parked_at IS NOT NULL, x.id  -- parked ones never crowd out the rest
LIMIT %(limit)s
"""
# A tick's first look once it has work: how many lanes are free, and whether orphans wait.
FREE_LANES_AND_ORPHANS_SQL = "SELECT " + lineages.FREE_LANES_EXPR + ", EXISTS (" + ORPHANS_SQL + ")"

# -- replay (ops/replay.py) ----------------------------------------------------------------------------

REPLAY_ROWS_SQL = """
SELECT p.id, p.status, p.account, p.amount, p.auth_entry, p.auth_nonce, p.auth_expiration_ledger, p.reason,
       p.attempts, p.deposit_tx, p.deposit_lineage_id, p.credit_lineage_id, p.idempotency_key, p.updated_at,
       (SELECT array_agg(l.id || ':' || l.state ORDER BY l.id) FROM paygate.lineages l
        WHERE l.entitlement IN ('deposit:' || p.id || ':deposit', 'deposit:' || p.id || ':credit')
          AND paygate.lineage_is_live(l.state)) AS live,
       (SELECT array_agg(l.id ORDER BY l.id) FROM paygate.lineages l
        WHERE l.entitlement = 'deposit:' || p.id || ':deposit' AND l.state = 'applied') AS applied
FROM paygate.deposits p
WHERE CASE WHEN %(ids)s::bigint[] IS NULL
           THEN p.status = ANY(%(dead)s) AND (%(since)s::timestamptz IS NULL OR p.updated_at >= %(since)s)
           ELSE p.id = ANY(%(ids)s) END
ORDER BY p.id
"""
# Back to pending: the funding worker starts it afresh (its old lineages are all terminal and stay
# in the journal under the same entitlement; the row no longer points at them).
REPLAY_SQL = f"""
UPDATE paygate.deposits
SET status = 'pending', reason = NULL, pending_failure = NULL, attempts = 0, {leases.RELEASE},
    claimed_by = NULL, deposit_lineage_id = NULL, credit_lineage_id = NULL, updated_at = now()
WHERE id = %(id)s AND status = %(status)s AND updated_at = %(updated_at)s AND deposit_tx IS NULL
RETURNING id
"""
REPLAY_EVENT_SQL = """
SELECT paygate.emit_event('deposit.replayed', jsonb_build_object('deposit_id', %(id)s::bigint,
                          'account', %(account)s::text, 'amount', %(amount)s::text,
                          'previous_status', %(status)s::text))
"""

# -- depth rows (`status`, metrics: state.py) ------------------------------------------------------------

# Each: the count and the age of the oldest item, in seconds.
DEPTH_ROWS: dict[str, str] = {
    "deposits.pending": """
        SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
        FROM paygate.deposits WHERE status = 'pending'""",
    "deposits.needs_human": """
        SELECT count(*), extract(epoch FROM now() - min(updated_at))::float8
        FROM paygate.deposits WHERE status = 'needs_human'""",
}
