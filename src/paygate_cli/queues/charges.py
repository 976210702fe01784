"""Charges (paygate.charges) and the batches that carry them to the chain (paygate.charge_batches)
(docs/architecture.md §5).

A charge comes in through `paygate.admit_charge` (the API role, or the subscriptions worker) as
`authorized`, its amount already taken off the account's cached balance. The settlement worker
(workers/settlement.py) claims authorized rows into one charge batch per claim: the rows take the
batch's lineage (`claimed_at`, `lineage_id`) and the batch opens under a lease. It never marks a
charge settled: the observer (workers/observer.py) does, from the contract's `charge` event, and
fails it (balance restored) from a `charge_failed` one. Settlement hands rows back when their
lineage never got signed bytes or proved dead, fails them (balance restored) at the attempt limit,
and makes them `needs_human` when their batch's lineage must be looked at. Recovery takes batches
over through settlement's own take-over.

Charge statuses: authorized -> settled | failed | needs_human; needs_human -> settled | failed (the
chain's event, if the bytes land after all). Within `authorized`: waiting (no lineage) or in a
batch (a lineage, `claimed_at`).
Batch: open (`closed_at` NULL, leased while a process drives it) -> closed with an outcome:
applied | abandoned | dead | needs_human. docs/states.md has the diagrams."""

from __future__ import annotations

from paygate_cli.journal import lineage as lineages
from paygate_cli.queues import leases

# Writes the system can re-derive after a database crash (a claim, a lease taken or released, a
# batch closed from a terminal lineage) commit without waiting for their WAL flush, as
# db.connect.relaxed_transaction does — but as ONE round trip: set_config(..., true) is local to the
# statement's own implicit transaction, so an autocommit statement that references this CTE commits
# asynchronously (BEGIN + SET LOCAL + statement + COMMIT would be four). Ordering still holds: the
# anchor's synchronous commit flushes everything before it, before anything is broadcast.
RELAXED_CTE = "relaxed AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true) AS off)"

# -- work? -------------------------------------------------------------------------------------------

# Whether any charge waits for a batch: one probe of each kind's partial index (migration 0006).
CLAIMABLE_EXPR = """(EXISTS (SELECT 1 FROM paygate.charges
               WHERE status = 'authorized' AND claimed_at IS NULL AND lineage_id IS NULL AND subscription_id IS NULL)
       OR EXISTS (SELECT 1 FROM paygate.charges
                  WHERE status = 'authorized' AND claimed_at IS NULL AND lineage_id IS NULL
                    AND subscription_id IS NOT NULL))"""

HAS_WORK_SQL = """
SELECT """ + CLAIMABLE_EXPR + """,
       EXISTS (SELECT 1 FROM paygate.charge_batches
               WHERE closed_at IS NULL AND (lease_expires_at IS NULL OR lease_expires_at < now())),
       -- ORPHANS_SQL's question, asked here to save a round trip per tick
       EXISTS (SELECT 1 FROM paygate.lineages x
               WHERE paygate.lineage_is_live(x.state) AND x.purpose = 'charge_batch'
                 AND NOT EXISTS (SELECT 1 FROM paygate.charge_batches b
                                 WHERE b.lineage_id = x.id AND b.closed_at IS NULL)
                 AND x.created_at < now() - interval '5 seconds')
"""

# -- claim -------------------------------------------------------------------------------------------

# Who is claimed first (docs/architecture.md §5 "Claim order"): one-off charges before subscription
# periods, oldest first in each. A customer at a checkout waits on a one-off charge; a period can
# wait, and a billing run admits thousands at once (the first of the month), which in one queue
# would hold every checkout behind it until the run drained. So that checkouts above capacity can
# never starve billing, periods that have waited PERIOD_PRIORITY_AFTER go first again, up to a
# PERIOD_SHARE of each claim: billing keeps at least that share of settlement, checkouts the rest.
PERIOD_PRIORITY_AFTER = "60 seconds"
PERIOD_SHARE = 4  # an aged period takes at most 1/PERIOD_SHARE of a claim's rows

# The whole claim in one statement (docs/architecture.md §5; a row with a lineage is never re-claimable):
# - candidates: the claimable rows in claim order, each tier from its own partial index and locked
#   FOR UPDATE SKIP LOCKED (Postgres allows no FOR UPDATE under a UNION, hence one CTE a tier). A
#   CTE is read only as far as its reader reads it, so a tier after the batch is full is never
#   scanned nor locked: the usual claim (one-off charges fill it) locks exactly what it did
#   before. `periods` skips the aged rows `aged_periods` already holds (our own locks are not
#   skipped by SKIP LOCKED);
# - chosen: their longest prefix (claim order) that fits one transaction's footprint estimate
#   (chain/charges.claim_estimate: each entry writes its charge-id entry and each distinct account its
#   balance, so entries + distinct accounts <= the read-write key limit);
# - lane + lineage: the least recently used free active lane of ours gets a new charge_batch lineage
#   (the same rule as journal/lineage.ALLOCATE_SQL, repeated here so claim and allocation are one
#   round trip; the partial unique index on live lineages is the real guard: a lost race raises
#   UniqueViolation and the whole claim rolls back — "no free lane this time");
# - claimed: the lineage recorded on every chosen row, and the batch opened under this process's
#   lease, in the same statement, so no row is ever claimed without its lineage.
# One result row even when nothing was claimed: `wanted` (rows that would fit) tells an empty queue
# (0) from no free lane (> 0, lineage NULL). The batch size and the footprint limits are written in
# by workers/settlement.claim_sql.
CLAIM_SQL = f"""
WITH {RELAXED_CTE}, lane_seen AS MATERIALIZED (
    -- Any lane free? Asked first, without a lock: with none free the candidates below are never
    -- read or locked (their one-time filter), and `wanted` says whether work waits.
    SELECT {lineages.ANY_FREE_LANE_EXPR} AS free
), aged_periods AS MATERIALIZED (
    SELECT ctid, id, account, created_at, 0 AS tier FROM paygate.charges
    WHERE status = 'authorized' AND claimed_at IS NULL AND lineage_id IS NULL AND subscription_id IS NOT NULL
      AND created_at < now() - interval '{PERIOD_PRIORITY_AFTER}' AND (SELECT free FROM lane_seen)
    ORDER BY created_at, id
    LIMIT %(period_share)s
    FOR UPDATE SKIP LOCKED
), one_off AS MATERIALIZED (
    SELECT ctid, id, account, created_at, 1 AS tier FROM paygate.charges
    WHERE status = 'authorized' AND claimed_at IS NULL AND lineage_id IS NULL AND subscription_id IS NULL
      AND (SELECT free FROM lane_seen)
    ORDER BY created_at, id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), periods AS MATERIALIZED (
    SELECT ctid, id, account, created_at, 2 AS tier FROM paygate.charges
    WHERE status = 'authorized' AND claimed_at IS NULL AND lineage_id IS NULL AND subscription_id IS NOT NULL
      AND ctid <> ALL (ARRAY(SELECT ctid FROM aged_periods)) AND (SELECT free FROM lane_seen)
    ORDER BY created_at, id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), candidates AS MATERIALIZED (
    (SELECT * FROM aged_periods) UNION ALL (SELECT * FROM one_off) UNION ALL (SELECT * FROM periods)
    LIMIT %(batch)s
), counted AS (
    SELECT ctid, row_number() OVER claim_order AS entries, sum(first_of_account) OVER claim_order AS accounts
    FROM (SELECT ctid, id, created_at, tier,
                 (row_number() OVER (PARTITION BY account ORDER BY tier, created_at, id) = 1)::int
                     AS first_of_account
          FROM candidates) c
    WINDOW claim_order AS (ORDER BY tier, created_at, id ROWS UNBOUNDED PRECEDING)
), chosen AS MATERIALIZED (
    SELECT ctid FROM counted
    WHERE entries <= %(max_entries)s AND entries + accounts <= %(max_write)s
      AND entries + accounts + %(read_only)s <= %(max_keys)s
), {lineages.free_lane_ctes(only_if="EXISTS (SELECT 1 FROM chosen)")}, lineage AS (
    INSERT INTO paygate.lineages (purpose, entitlement, lane)
    SELECT 'charge_batch', %(entitlement)s, lane.address FROM lane
    RETURNING id, lane
), claimed AS (
    UPDATE paygate.charges c
    SET claimed_at = now(), claimed_by = %(owner)s, lineage_id = lineage.id, updated_at = now()
    FROM lineage
    -- Back to the rows by ctid, the version the FOR UPDATE locked (nobody else can move it until
    -- this commits): no primary-key descent per claimed row, so the claim costs the same
    -- however long the table's history (bench/growth.py).
    WHERE c.ctid IN (SELECT ctid FROM chosen)
      AND c.status = 'authorized' AND c.claimed_at IS NULL AND c.lineage_id IS NULL
    RETURNING c.id, c.account, c.amount, c.charge_id, c.created_at, lineage.id AS lineage_id, lineage.lane
), batch AS (
    INSERT INTO paygate.charge_batches (lineage_id, entries, lease_token, lease_expires_at, claimed_by)
    SELECT lineage.id, (SELECT count(*) FROM chosen), %(token)s, now() + make_interval(secs => %(lease)s),
           %(owner)s
    FROM lineage
), journal AS (
    -- The lane's highest sequence our journal knows consumed (what lineage.next_sequence reads).
    SELECT {lineages.last_consumed_seq_sql("lineage.lane")} AS seq FROM lineage
)
SELECT CASE WHEN (SELECT free FROM lane_seen) THEN (SELECT count(*) FROM chosen)
            ELSE {CLAIMABLE_EXPR}::int END AS wanted, claimed.lineage_id, claimed.lane,
       claimed.id, claimed.account, claimed.amount, claimed.charge_id, (SELECT seq FROM journal)
FROM relaxed LEFT JOIN claimed ON true
ORDER BY claimed.created_at, claimed.id
"""

# -- take over open batches ------------------------------------------------------------------------------

# Batches whose lease lapsed (their process died or finished its step): any settlement process
# may pick them up and drive their lineage one step further.
# The lineage's columns as journal/lineage.LOAD_SQL selects them (so Lineage(*row) stays right if
# they change): taking over a batch and loading its lineage are one round trip.
LINEAGE_COLUMNS = ", ".join("x." + c.strip() for c in
                            lineages.LOAD_SQL.split("SELECT", 1)[1].split("FROM", 1)[0].split(","))
CLAIM_OPEN_BATCHES_SQL = f"""
WITH {RELAXED_CTE}, open AS (
    SELECT lineage_id FROM paygate.charge_batches
    WHERE closed_at IS NULL
      AND ((lease_expires_at IS NULL AND NOT %(lapsed_only)s)
           OR lease_expires_at < now() - make_interval(secs => %(grace)s))
    ORDER BY created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE paygate.charge_batches b
    SET {leases.take()},
        claimed_by = %(owner)s
    FROM open WHERE b.lineage_id = open.lineage_id
    RETURNING b.lineage_id, b.lease_token
)
SELECT taken.lease_token, {LINEAGE_COLUMNS}
FROM relaxed, taken JOIN paygate.lineages x ON x.id = taken.lineage_id
ORDER BY x.id
"""
# Batches whose owner died holding the lease, more than %(grace)s seconds ago (recovery's question).
LAPSED_BATCHES_SQL = """
SELECT EXISTS (SELECT 1 FROM paygate.charge_batches
               WHERE closed_at IS NULL AND lease_expires_at < now() - make_interval(secs => %(grace)s))
"""

# -- hold / renew ------------------------------------------------------------------------------------

# Guard for every write made on behalf of a batch: the lease this process holds is still its own
# (and it is renewed: checked before each phase, a slow phase does not lose it to a lapse).
HOLD_BATCH_SQL = f"""
UPDATE paygate.charge_batches b
SET {leases.renew("b")}
WHERE lineage_id = %(lineage)s AND lease_token = %(token)s AND closed_at IS NULL
RETURNING 1
"""
# The same guard as parts of the engine's one-statement phases, where the engine offers them
# (journal/engine.py Job: the anchor is then ONE statement, lease check and all): `hold` locks
# the batch row iff the lease is still ours, `install` (committed with the envelope) renews it.
HOLD_BATCH_ROW_SQL = leases.hold("charge_batches", "b", "b.closed_at IS NULL", key="lineage_id",
                                 key_param="batch_lineage", token_param="batch_token")
RENEW_BATCH_AT_ANCHOR_SQL = f"""
UPDATE paygate.charge_batches b
SET {leases.renew("b", "batch_lease")}
FROM anchored
WHERE b.lineage_id = %(batch_lineage)s AND b.lease_token = %(batch_token)s AND b.closed_at IS NULL
RETURNING 1
"""
# The same for a tick's batches, anchored in one statement (journal/lineage.py ANCHOR_HELD_MANY_SQL;
# the request `req` names each batch by its lineage and lease token).
HOLD_BATCHES_SQL = leases.hold_many("charge_batches", "b", "b.closed_at IS NULL", key="lineage_id")
RENEW_BATCHES_AT_ANCHOR_SQL = f"""
UPDATE paygate.charge_batches b
SET {leases.renew("b", "batch_lease")}
FROM anchored JOIN req ON req.lineage_id = anchored.id
WHERE b.lineage_id = req.row_id AND b.lease_token = req.row_token AND b.closed_at IS NULL
RETURNING 1
"""
# Trimmed to fit a resource limit (the dropped rows are handed back in the same lease: UNCLAIM_SQL).
SHRINK_BATCH_SQL = """
UPDATE paygate.charge_batches SET entries = %(entries)s
WHERE lineage_id = %(lineage)s AND lease_token = %(token)s AND closed_at IS NULL
"""

# -- release -----------------------------------------------------------------------------------------

# Leases released together, relaxed, one statement: the tick's broadcast batches where the engine
# defers the 'sent' marks (flush_sent; on_sent is not called for an ordinary answer), after the
# flush; and the batches a take-over found still in flight.
RELEASE_SENT_LEASES_SQL = f"""
WITH {RELAXED_CTE}
UPDATE paygate.charge_batches b SET {leases.RELEASE}
FROM relaxed, unnest(%(lineages)s::bigint[], %(tokens)s::uuid[]) AS s(lineage_id, token)
WHERE b.lineage_id = s.lineage_id AND b.lease_token = s.token AND b.closed_at IS NULL
"""
# One batch's lease, released once it was broadcast (on_sent).
RELEASE_BATCH_LEASE_SQL = f"""
UPDATE paygate.charge_batches SET {leases.RELEASE}
WHERE lineage_id = %(lineage)s AND lease_token = %(token)s AND closed_at IS NULL
"""
# Hand rows back without counting an attempt: their lineage never got signed bytes (abandoned),
# or they were trimmed from a batch before signing.
UNCLAIM_SQL = """
UPDATE paygate.charges SET claimed_at = NULL, claimed_by = NULL, lineage_id = NULL, updated_at = now()
WHERE lineage_id = %(lineage)s AND status = 'authorized' AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s))
"""

# -- close -------------------------------------------------------------------------------------------

CLOSE_BATCH_SQL = f"""
UPDATE paygate.charge_batches
SET outcome = %(outcome)s, closed_at = now(), {leases.RELEASE}
WHERE lineage_id = %(lineage)s AND lease_token = %(token)s AND closed_at IS NULL
"""
# The batches a take-over found applied, closed together after the loop: re-derivable from their
# terminal lineages, so relaxed, one statement. Returns the ones still held under the lease.
CLOSE_APPLIED_MANY_SQL = f"""
WITH {RELAXED_CTE}
UPDATE paygate.charge_batches b
SET outcome = 'applied', closed_at = now(), {leases.RELEASE}
FROM relaxed, unnest(%(lineages)s::bigint[], %(tokens)s::uuid[]) AS s(lineage_id, token)
WHERE b.lineage_id = s.lineage_id AND b.lease_token = s.token AND b.closed_at IS NULL
RETURNING b.lineage_id
"""

# -- fail (a dead lineage's rows) --------------------------------------------------------------------------

# The lineage is proven dead (it cannot land: expired, superseded, or included and failed, which
# reverts every entry). Its rows get a new chance, or, at the attempt limit, fail with the balance
# restored and the product told, in this one statement — guarded by the lineage's terminal state.
# A starved lineage (expired after a replacement fee bump, or while fee-capped: the market outbid
# it, docs/architecture.md §4 "Fees and the fee market") is no attempt: its rows go back uncounted.
RELEASE_DEAD_SQL = """
WITH dead AS (
    SELECT id, (state = 'expired' AND (replacements > 0 OR fee_capped_at IS NOT NULL))::int AS starved
    FROM paygate.lineages WHERE id = %(lineage)s AND state IN ('failed', 'expired', 'superseded')
), released AS (
    UPDATE paygate.charges c
    SET attempts = c.attempts + 1 - dead.starved, dead_lineages = c.dead_lineages || c.lineage_id,
        lineage_id = NULL, claimed_at = NULL, claimed_by = NULL,
        status = CASE WHEN dead.starved = 0 AND c.attempts + 1 >= %(max)s THEN 'failed' ELSE 'authorized' END,
        failed_at = CASE WHEN dead.starved = 0 AND c.attempts + 1 >= %(max)s THEN now() END,
        failed_by = CASE WHEN dead.starved = 0 AND c.attempts + 1 >= %(max)s THEN 'settlement' END,
        reason = CASE WHEN dead.starved = 0 AND c.attempts + 1 >= %(max)s
                      THEN format('%%s charge_batch transactions were each proven dead (last: %%s)',
                                  c.attempts + 1, %(why)s::text) END,
        updated_at = now()
    FROM dead WHERE c.lineage_id = dead.id AND c.status = 'authorized'
    RETURNING c.id, c.charge_id, c.account, c.amount, c.status, c.attempts, c.reason
), restored AS (
    UPDATE paygate.accounts a SET cached_balance = a.cached_balance + r.total, updated_at = now()
    FROM (SELECT account, sum(amount) AS total FROM released WHERE status = 'failed' GROUP BY account) r
    WHERE a.address = r.account
    RETURNING a.address, a.cached_balance
)
SELECT r.id, r.status,
       CASE WHEN r.status = 'failed' THEN paygate.emit_event('charge.failed', jsonb_build_object(
           'charge_row_id', r.id, 'charge_id', encode(r.charge_id, 'hex'), 'account', r.account,
           'amount', r.amount::text, 'reason', r.reason,
           'balance', (SELECT x.cached_balance::text FROM restored x WHERE x.address = r.account)))
       END
FROM released r
"""

# -- needs_human ---------------------------------------------------------------------------------------

# A batch whose lineage a human must look at (an envelope that does not decrypt): the batch closes
# and its charges become needs_human with the reason, each announced, in one statement under the lease.
BATCH_NEEDS_HUMAN_SQL = f"""
WITH closed AS (
    UPDATE paygate.charge_batches
    SET outcome = 'needs_human', closed_at = now(), {leases.RELEASE}
    WHERE lineage_id = %(lineage)s AND lease_token = %(token)s AND closed_at IS NULL
    RETURNING lineage_id
), held AS (
    UPDATE paygate.charges c SET status = 'needs_human', reason = %(reason)s, updated_at = now()
    FROM closed WHERE c.lineage_id = closed.lineage_id AND c.status = 'authorized'
    RETURNING c.id, c.charge_id, c.account, c.amount
), announced AS (
    SELECT paygate.emit_event('charge.needs_human', jsonb_build_object(
        'charge_row_id', h.id, 'charge_id', encode(h.charge_id, 'hex'), 'account', h.account,
        'amount', h.amount::text, 'reason', %(reason)s::text)) FROM held h
)
SELECT (SELECT count(*) FROM closed), (SELECT count(*) FROM held), (SELECT count(*) FROM announced)
"""

# -- orphans -------------------------------------------------------------------------------------------

# Live charge_batch lineages no open batch holds any more: nothing else would resolve them.
ORPHANS_SQL = """
SELECT x.id FROM paygate.lineages x
WHERE paygate.lineage_is_live(x.state) AND x.purpose = 'charge_batch'
  AND NOT EXISTS (SELECT 1 FROM paygate.charge_batches b WHERE b.lineage_id = x.id AND b.closed_at IS NULL)
  AND x.created_at < now() - interval '5 seconds'  -- not one being claimed right now
ORDER BY x.parked_at IS NOT NULL, x.id  -- parked ones never crowd out the rest
LIMIT %(limit)s
"""

# -- settle / fail from the chain's events (the observer, inside its page transaction) ------------------

# A page travels to Postgres as one JSON document per statement (json_to_recordset): see
# workers/observer.py.

# Set-based promotion of a page's `charge` events: only rows whose account and amount match the
# event, and only from a non-terminal state; the rest are diagnosed one by one and quarantined.
# `needs_human` is not terminal for the chain: a charge handed to a human because its batch's
# envelope no longer decrypts is settled (or failed) by its event when those bytes land after all.
# The outbox rows are paygate.emit_event's, in set form (one row per enabled endpoint per event):
# calling the function once per row cost a third of the statement.
SETTLE_CHARGES_SQL = """
WITH ev AS (
    SELECT e.event_id, decode(e.charge_id, 'hex') AS charge_id, e.account, e.amount, e.ledger
    FROM json_to_recordset(%s::json) AS e(event_id text, charge_id text, account text, amount numeric,
                                          ledger integer)
), settled AS (
    UPDATE paygate.charges c
    SET status = 'settled', settled_at = now(), settled_ledger = ev.ledger, event_id = ev.event_id,
        updated_at = now()
    FROM ev
    WHERE c.charge_id = ev.charge_id AND c.account = ev.account AND c.amount = ev.amount
      AND c.status IN ('authorized', 'needs_human')
    RETURNING c.id, c.charge_id, c.account, c.amount, ev.event_id, ev.ledger
), emitted AS (
    INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload)
    SELECT w.id, 'charge.settled', jsonb_build_object(
               'charge_row_id', s.id, 'charge_id', encode(s.charge_id, 'hex'), 'account', s.account,
               'amount', s.amount::text, 'ledger', s.ledger, 'event_id', s.event_id)
    FROM settled s CROSS JOIN paygate.webhook_endpoints w
    WHERE w.enabled
)
SELECT s.event_id, s.id FROM settled s
"""

# `charge_failed`: the failure and the balance restore in one statement (docs/architecture.md §5).
FAIL_CHARGES_SQL = """
WITH ev AS (
    SELECT e.event_id, decode(e.charge_id, 'hex') AS charge_id, e.account, e.amount, e.ledger, e.reason
    FROM json_to_recordset(%s::json) AS e(event_id text, charge_id text, account text, amount numeric,
                                          ledger integer, reason text)
), failed AS (
    UPDATE paygate.charges c
    SET status = 'failed', failed_at = now(), failed_by = 'observer', settled_ledger = ev.ledger,
        event_id = ev.event_id, reason = 'charge_failed on chain: ' || ev.reason, updated_at = now()
    FROM ev
    WHERE c.charge_id = ev.charge_id AND c.account = ev.account AND c.amount = ev.amount
      AND c.status IN ('authorized', 'needs_human')
    RETURNING c.id, c.charge_id, c.account, c.amount, ev.event_id, ev.ledger, ev.reason
), restored AS (
    UPDATE paygate.accounts a SET cached_balance = a.cached_balance + f.total, updated_at = now()
    FROM (SELECT account, sum(amount) AS total FROM failed GROUP BY account) f
    WHERE a.address = f.account
    RETURNING a.address, a.cached_balance
), emitted AS (
    INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload)
    SELECT w.id, 'charge.failed', jsonb_build_object(
               'charge_row_id', f.id, 'charge_id', encode(f.charge_id, 'hex'), 'account', f.account,
               'amount', f.amount::text, 'reason', f.reason, 'ledger', f.ledger, 'event_id', f.event_id,
               'balance', (SELECT r.cached_balance::text FROM restored r WHERE r.address = f.account))
    FROM failed f CROSS JOIN paygate.webhook_endpoints w
    WHERE w.enabled
)
SELECT f.event_id, f.id FROM failed f
"""

# -- depth rows (`status`, metrics: state.py) ------------------------------------------------------------

# Each: the count and the age of the oldest item, in seconds.
DEPTH_ROWS: dict[str, str] = {
    "charges.waiting": """
        SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
        FROM paygate.charges WHERE status = 'authorized' AND lineage_id IS NULL""",
    "charges.in_batch": """
        SELECT count(*), extract(epoch FROM now() - min(claimed_at))::float8
        FROM paygate.charges WHERE status = 'authorized' AND lineage_id IS NOT NULL""",
    "charge_batches.open": """
        SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
        FROM paygate.charge_batches WHERE closed_at IS NULL""",
}
