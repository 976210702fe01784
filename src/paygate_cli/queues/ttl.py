"""The TTL keeper's tables (sql/0003_state_archival.sql): paygate.ttl_entries (what paygate keeps
alive, as last read), paygate.ttl_jobs (extend / restore work, one transaction each through the
engine) and paygate.ttl_rent (rent spent per UTC day). Every statement that moves their rows, by
purpose; the keeper (workers/ttl.py) holds the flow, docs/architecture.md §6 "TTL keeper" the design.

Every write of a job's holder is guarded by the lease token its claim took (queues/leases.py). A
restore is requested through paygate.request_restore (sql/functions/request_restore.sql), by the
keeper and by a money path alike: one open restore per key."""

from __future__ import annotations

from paygate_cli.queues import leases

# The UTC day rent is counted in (database time: docs/architecture.md §1 rule 9).
TODAY = "(now() AT TIME ZONE 'UTC')::date"

# -- what is kept alive ----------------------------------------------------------------------------

# An account has money on it while its cached balance is positive, a charge admitted against it is
# not settled yet (the chain still holds what the cache already debited), or a deposit of it is in
# flight (its transfer may have landed ahead of the credit). `{account}`: the SQL naming the address.
MONEY_ON = """(EXISTS (SELECT 1 FROM paygate.accounts m WHERE m.address = {account} AND m.cached_balance > 0)
     OR EXISTS (SELECT 1 FROM paygate.charges mc WHERE mc.account = {account} AND mc.status = 'authorized')
     OR EXISTS (SELECT 1 FROM paygate.deposits md WHERE md.account = {account} AND md.status = 'pending'
                AND md.deposit_lineage_id IS NOT NULL))"""

# The entries the keeper keeps alive now: the contract's own (instance, code, its USDC balance: the
# current ones, %(fixed)s, whatever the contract id was before) and the balance entry of every
# account with money on it. Rows of accounts that no longer have any stay (rows are never deleted)
# and are simply not kept: not read, not extended, not restored.
KEPT = ("(e.key_hash = ANY(%(fixed)s::bytea[]) OR (e.kind = 'account_balance' AND "
        + MONEY_ON.format(account="e.account") + "))")
# Kept, whatever the contract's current keys (status and the metrics have no chain client to build them).
KEPT_ANY = "(e.kind <> 'account_balance' OR " + MONEY_ON.format(account="e.account") + ")"

# An open job already holds the entry (the GIN index ttl_jobs_open_keys).
COVERED = ("EXISTS (SELECT 1 FROM paygate.ttl_jobs j WHERE j.status = 'pending' "
           "AND j.key_hashes @> ARRAY[e.key_hash])")

# The contract's own entries, upserted by key (kind, account as given); the rows of earlier keys of
# the same kinds stay, unkept (KEPT names only the current ones).
UPSERT_ENTRIES_SQL = """
INSERT INTO paygate.ttl_entries (key_hash, key_xdr, kind, account)
SELECT * FROM unnest(%(hashes)s::bytea[], %(keys)s::text[], %(kinds)s::text[], %(accounts)s::text[])
ON CONFLICT (key_hash) DO NOTHING
"""
# Accounts with money on them that have no balance entry row yet (a new customer), at most `limit`
# a tick: their keys are built in Python (chain/ttl.py) and upserted above.
MISSING_ACCOUNTS_SQL = """
SELECT a.address FROM paygate.accounts a
WHERE """ + MONEY_ON.format(account="a.address") + """
  AND NOT EXISTS (SELECT 1 FROM paygate.ttl_entries e WHERE e.kind = 'account_balance' AND e.account = a.address)
ORDER BY a.address LIMIT %(limit)s
"""
# Whether the code entry's row is there (it needs a chain read of the instance to name it).
CODE_KEY_SQL = "SELECT key_xdr FROM paygate.ttl_entries WHERE kind = 'code' AND key_hash = ANY(%(fixed)s::bytea[])"

# -- reading (the rotation) ------------------------------------------------------------------------

# What this tick reads: entries of jobs that just applied (`fresh`: their new TTL), entries never
# read, entries due for an extension by their last reading (read again before a job is made for
# them: someone else may have extended them), then the least recently read, each at most about
# hourly (`every` seconds) so a large set costs a steady trickle of reads.
READ_BATCH_SQL = f"""
SELECT e.key_hash, e.key_xdr, e.kind, e.account, e.state
FROM paygate.ttl_entries e
WHERE {KEPT}
  AND (e.read_at IS NULL OR e.read_at < now() - make_interval(secs => %(every)s)
       OR e.key_hash = ANY(%(fresh)s::bytea[])
       OR (e.state = 'live' AND e.live_until < %(due_before)s AND NOT {COVERED}))
ORDER BY e.key_hash = ANY(%(fresh)s::bytea[]) DESC, e.read_at IS NULL DESC,
         (e.state = 'live' AND e.live_until < %(due_before)s) DESC, e.read_at, e.key_hash
LIMIT %(limit)s
"""
# What was read, one statement for the tick's reads. Archived keeps the last live_until known (when
# it expired); a needs_human entry stays so while it reads archived (a human restores it), and is
# live again once it reads live (restored by hand).
UPDATE_READS_SQL = """
UPDATE paygate.ttl_entries e
SET state = CASE WHEN r.absent THEN 'absent'
                 WHEN r.archived THEN CASE WHEN e.state = 'needs_human' THEN 'needs_human' ELSE 'archived' END
                 ELSE 'live' END,
    live_until = CASE WHEN r.absent THEN NULL WHEN r.archived THEN e.live_until ELSE r.live_until END,
    reason = CASE WHEN r.archived AND e.state = 'needs_human' THEN e.reason ELSE NULL END,
    read_ledger = %(ledger)s, read_at = now(), updated_at = now()
FROM unnest(%(hashes)s::bytea[], %(live_untils)s::integer[], %(archived)s::boolean[], %(absent)s::boolean[])
     AS r(key_hash, live_until, archived, absent)
WHERE e.key_hash = r.key_hash
"""

# -- deciding (extend, restore, ask a human) -------------------------------------------------------

# Kept live entries that expire before `due_before` (latest + threshold) and no open job holds:
# the most urgent first.
DUE_SQL = f"""
SELECT e.key_hash, e.key_xdr FROM paygate.ttl_entries e
WHERE e.state = 'live' AND e.live_until < %(due_before)s AND {KEPT} AND NOT {COVERED}
ORDER BY e.live_until, e.key_hash
"""
INSERT_EXTEND_SQL = """
INSERT INTO paygate.ttl_jobs (kind, key_hashes, keys_xdr, extend_to, requested_by)
VALUES ('extend', %(hashes)s::bytea[], %(keys)s::text[], %(extend_to)s, 'ttl')
RETURNING id
"""
# Kept entries read archived that no open restore holds. restored_at: restored before (by the
# keeper or a path's restore), so archived a second time: a human is asked, no second restore.
ARCHIVED_SQL = f"""
SELECT e.key_hash, e.key_xdr, e.restored_at FROM paygate.ttl_entries e
WHERE e.state = 'archived' AND {KEPT} AND NOT {COVERED}
ORDER BY e.live_until NULLS FIRST, e.key_hash
"""
REQUEST_RESTORE_SQL = "SELECT paygate.request_restore(%(keys)s::text[], %(by)s)"
ARCHIVED_AGAIN_SQL = """
UPDATE paygate.ttl_entries
SET state = 'needs_human', updated_at = now(),
    reason = 'archived again after its restore at ' || to_char(restored_at AT TIME ZONE 'UTC',
                                                               'YYYY-MM-DD"T"HH24:MI:SS"Z"')
             || ': the keeper did not keep it alive; restore it by hand (runbooks/contract-ttl.md), key '
             || key_xdr
WHERE key_hash = ANY(%(hashes)s::bytea[]) AND state = 'archived'
RETURNING kind, account, key_xdr
"""

# -- jobs: claim, renew, release -------------------------------------------------------------------

# Jobs in flight first (their lineages are driven whatever the batch), then restores (a money path
# may wait on one), then extends by urgency (the soonest expiry among their keys). `urgency` comes
# back so the tick keeps that order (UPDATE … RETURNING has none of its own). A lapsed lease is the
# keeper's own to take again (a single writer: what a killed tick left, its next one drives).
CLAIM_SQL = f"""
WITH claimable AS (
    SELECT j.ctid, j.id,
           (SELECT min(e.live_until) FROM paygate.ttl_entries e WHERE e.key_hash = ANY(j.key_hashes)) AS urgency
    FROM paygate.ttl_jobs j
    WHERE j.status = 'pending' AND (j.lease_expires_at IS NULL OR j.lease_expires_at < now())
      AND (j.lineage_id IS NOT NULL OR NOT %(draining)s)
    ORDER BY j.lineage_id IS NULL, j.kind <> 'restore', urgency NULLS FIRST, j.id
    LIMIT %(batch)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE paygate.ttl_jobs j SET {leases.take()}, claimed_at = now()
FROM claimable WHERE j.ctid = claimable.ctid
RETURNING j.id, j.kind, j.keys_xdr, j.key_hashes, j.extend_to, j.requested_by, j.lease_token, j.lineage_id,
          j.attempts, j.rent_estimate, claimable.urgency
"""
RENEW_SQL = f"""
UPDATE paygate.ttl_jobs j SET {leases.renew("j")}
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS mine(id, token)
WHERE j.id = mine.id AND j.status = 'pending' AND j.lease_token = mine.token
"""
RELEASE_SQL = f"""
UPDATE paygate.ttl_jobs j SET {leases.RELEASE}
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS mine(id, token)
WHERE j.id = mine.id AND j.status = 'pending' AND j.lease_token = mine.token
"""

# -- the lease check and the lineage pointer (journal/engine.py Job) ---------------------------------

HOLD_SQL = leases.hold("ttl_jobs", "j", "j.status = 'pending'", key_param="id", token_param="token")
ATTACH_SQL = """
UPDATE paygate.ttl_jobs j SET lineage_id = lineage.id
FROM lineage WHERE j.id = %(id)s AND j.status = 'pending' AND j.lease_token = %(token)s
RETURNING 1
"""
HOLD_MANY_SQL = leases.hold_many("ttl_jobs", "j", "j.status = 'pending'")
ATTACH_MANY_SQL = """
UPDATE paygate.ttl_jobs j SET lineage_id = lineage.id
FROM lineage JOIN req USING (entitlement)
WHERE j.id = req.row_id AND j.status = 'pending' AND j.lease_token = req.row_token
RETURNING 1
"""
# Inside the engine's transaction, after its hold() took the row lock under our lease: abandoned
# before anchoring, nothing was sent, so no attempt.
UNHOOK_SQL = "UPDATE paygate.ttl_jobs SET lineage_id = NULL WHERE id = %(id)s AND lineage_id = %(lineage)s"
# What the last prepare's simulation said the transaction costs (resource fee): kept for status and
# for skipping a job the day's budget cannot cover without simulating it again.
SET_ESTIMATE_SQL = "UPDATE paygate.ttl_jobs SET rent_estimate = %(estimate)s WHERE id = %(id)s AND status = 'pending'"
# A lineage proven dead (expired, superseded, abandoned) is one attempt and the job is prepared
# again; a starved one (expired after a replacement fee bump, or fee-capped: docs/architecture.md
# §4 "Fees and the fee market") is none.
DEAD_LINEAGE_SQL = """
UPDATE paygate.ttl_jobs
SET lineage_id = NULL,
    attempts = attempts + (SELECT CASE WHEN x.state = 'expired' AND (x.replacements > 0 OR x.fee_capped_at IS NOT NULL)
                                       THEN 0 ELSE 1 END FROM paygate.lineages x WHERE x.id = %(lineage)s)
WHERE id = %(id)s AND status = 'pending' AND lease_token = %(token)s AND lineage_id = %(lineage)s
RETURNING attempts
"""

# -- finish: applied / failed (with the fee its lineage paid), needs_human ---------------------------

# A CAS on status + lease token + the lineage whose receipt it records (none for a job that ends
# before one landed); the day's rent is added only by the statement that won it.
FINISH_SQL = f"""
UPDATE paygate.ttl_jobs
SET status = %(status)s, reason = %(reason)s, fee_charged = %(fee)s, finished_at = now(), {leases.RELEASE}
WHERE id = %(id)s AND status = 'pending' AND lease_token = %(token)s AND lineage_id IS NOT DISTINCT FROM %(lineage)s
RETURNING id
"""
ADD_RENT_SQL = f"""
INSERT INTO paygate.ttl_rent AS r (day, spent, transactions) VALUES ({TODAY}, %(fee)s, 1)
ON CONFLICT (day) DO UPDATE SET spent = r.spent + EXCLUDED.spent, transactions = r.transactions + 1,
                                updated_at = now()
"""
# A restore that applied: its entries are live again (their new TTL is read this same tick).
RESTORED_SQL = """
UPDATE paygate.ttl_entries SET state = 'live', restored_at = now(), reason = NULL, updated_at = now()
WHERE key_hash = ANY(%(hashes)s::bytea[]) AND state IN ('archived', 'needs_human', 'live')
"""
# A restore that could not bring its entries back: each kept entry asks a human, with the key.
RESTORE_FAILED_SQL = """
UPDATE paygate.ttl_entries
SET state = 'needs_human', reason = %(reason)s || '; key ' || key_xdr, read_at = coalesce(read_at, now()),
    updated_at = now()
WHERE key_hash = ANY(%(hashes)s::bytea[])
"""

# -- the day's budget --------------------------------------------------------------------------------

# Spent today (receipts) and what the jobs in flight may still cost: a live lineage at the most it
# may be charged (its bid for every operation it pays for, plus its resource fee), a landed one whose
# job is not finished yet at its fee.
BUDGET_SQL = f"""
SELECT coalesce((SELECT spent FROM paygate.ttl_rent WHERE day = {TODAY}), 0),
       coalesce((SELECT sum(CASE WHEN x.state IN ('applied', 'failed') THEN coalesce(x.fee_charged, 0)
                                 ELSE coalesce(x.bid_rate, 0)::bigint * coalesce(x.fee_ops, 2)
                                      + coalesce(x.resource_fee, 0) END)
                 FROM paygate.ttl_jobs j JOIN paygate.lineages x ON x.id = j.lineage_id
                 WHERE j.status = 'pending' AND x.state IN ('signed', 'sent', 'applied', 'failed')), 0)
"""
SET_LEFT_SQL = f"""
INSERT INTO paygate.ttl_rent AS r (day, left_unextended) VALUES ({TODAY}, %(left)s)
ON CONFLICT (day) DO UPDATE SET left_unextended = EXCLUDED.left_unextended, updated_at = now()
"""
# Due entries waiting for an extension nothing sends today: the keys of open extend jobs with no
# lineage in flight.
WAITING_KEYS_SQL = """
SELECT count(DISTINCT h) FROM paygate.ttl_jobs j, unnest(j.key_hashes) AS h
WHERE j.status = 'pending' AND j.kind = 'extend' AND j.lineage_id IS NULL
"""

# -- orphans ---------------------------------------------------------------------------------------

# Live TTL lineages no pending job points at any more (a job finished elsewhere): driven so no lane
# stays pinned. Older than a minute: never a lineage whose allocation is being recorded.
ORPHANS_SQL = """
SELECT x.id FROM paygate.lineages x
WHERE x.purpose IN ('ttl_extend', 'restore') AND paygate.lineage_is_live(x.state)
  AND x.created_at < now() - interval '1 minute'
  AND NOT EXISTS (SELECT 1 FROM paygate.ttl_jobs j WHERE j.lineage_id = x.id AND j.status = 'pending')
ORDER BY x.parked_at IS NOT NULL, x.id LIMIT %(limit)s  -- parked ones never crowd out the rest
"""

# -- depth rows (state.py composes them into `status` and the state metrics) -----------------------

DEPTH_ROWS: dict[str, str] = {
    "ttl_jobs.pending": """
        SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
        FROM paygate.ttl_jobs WHERE status = 'pending'""",
    "ttl_jobs.needs_human": """
        SELECT count(*), extract(epoch FROM now() - min(finished_at))::float8
        FROM paygate.ttl_jobs WHERE status = 'needs_human'""",
}

# -- the read model (state.py ttl_state: status, metrics) --------------------------------------------

# Entries per state (kept ones; needs_human ones always: a human was asked), the nearest expiry of a
# kept live entry against the newest ledger a read saw, today's rent, in one statement.
TTL_SUMMARY_SQL = f"""
WITH kept AS (SELECT e.* FROM paygate.ttl_entries e WHERE {KEPT_ANY} OR e.state = 'needs_human'),
nearest AS (SELECT kind, account, key_xdr, live_until FROM kept WHERE state = 'live' AND live_until IS NOT NULL
            ORDER BY live_until, key_hash LIMIT 1)
SELECT (SELECT coalesce(json_object_agg(state, n), '{{}}')
        FROM (SELECT state, count(*) AS n FROM kept GROUP BY state) s),
       (SELECT max(read_ledger) FROM paygate.ttl_entries),
       n.kind, n.account, n.key_xdr, n.live_until,
       r.spent, r.transactions, r.left_unextended
FROM (SELECT 1) one
LEFT JOIN nearest n ON true
LEFT JOIN paygate.ttl_rent r ON r.day = {TODAY}
"""
# Open jobs (who asked, for how long, the lineage in flight) and what waits on a human.
TTL_JOBS_SQL = """
SELECT j.id, j.kind, j.status, cardinality(j.key_hashes), j.requested_by, j.attempts, j.rent_estimate,
       j.lineage_id, x.state, j.reason, extract(epoch FROM now() - j.created_at)::float8
FROM paygate.ttl_jobs j LEFT JOIN paygate.lineages x ON x.id = j.lineage_id
WHERE j.status = 'pending' OR j.status = 'needs_human'
ORDER BY j.status = 'pending' DESC, j.kind <> 'restore', j.id
LIMIT %(limit)s
"""
TTL_NEEDS_HUMAN_SQL = """
SELECT kind, account, key_xdr, reason, extract(epoch FROM now() - updated_at)::float8
FROM paygate.ttl_entries WHERE state = 'needs_human' ORDER BY updated_at, key_hash LIMIT %(limit)s
"""
# reconcile-report: the kept entries it cannot vouch for (archived or asking a human), at most `limit`.
UNKEPT_ENTRIES_SQL = f"""
SELECT e.kind, e.account, e.state, e.live_until, e.read_ledger, e.read_at, e.restored_at, e.reason, e.key_xdr
FROM paygate.ttl_entries e
WHERE (e.state = 'needs_human' OR (e.state = 'archived' AND {KEPT_ANY}))
  -- one account's report still lists the contract's own entries: every account's money needs them
  AND (%(account)s::text IS NULL OR e.account IS NULL OR e.account = %(account)s)
ORDER BY e.state = 'needs_human' DESC, e.updated_at, e.key_hash
LIMIT %(limit)s
"""
