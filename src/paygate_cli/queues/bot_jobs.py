"""The bot-job queue (paygate.bot_jobs): every statement that moves a job's row, by purpose. The
relay drainer (workers/relay_drainer.py) holds the flow of its phases, `replay bot_jobs`
(ops/replay.py) its refusals; docs/states.md has the diagram.

Every write of a holder is guarded by the lease token its claim took (queues/leases.py)."""

from __future__ import annotations

from paygate_cli.queues import leases

# -- claim, renew, release -------------------------------------------------------------------------

# The queue's one take-over routine too: the worker takes rows whose lease lapsed (grace 0) with its
# free ones; recovery takes only those (`lapsed_only`) whose lease lapsed more than its grace ago.
CLAIM_SQL = f"""
WITH claimable AS (
    SELECT ctid, id FROM paygate.bot_jobs
    WHERE status = 'queued'
      AND ((lease_expires_at IS NULL AND NOT %(lapsed_only)s)
           OR lease_expires_at < now() - make_interval(secs => %(grace)s))
      AND (lineage_id IS NOT NULL OR NOT %(draining)s)
    ORDER BY (lineage_id IS NULL), id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
UPDATE paygate.bot_jobs j
SET {leases.take()},
    claimed_by = %(owner)s, updated_at = now()
-- Back to the rows by ctid, the version the FOR UPDATE locked (nobody else can move it until
-- this commits): no primary-key descent per claimed row, so the claim costs the same
-- however long the table's history (bench/growth.py).
FROM claimable WHERE j.ctid = claimable.ctid
RETURNING j.id, j.job_key, j.contract, j.function, j.args_xdr, j.lease_token, j.lineage_id, j.attempts,
          coalesce(j.max_attempts, (SELECT bot_job_max_attempts FROM paygate.relay_config)), j.pending_failure,
          -- The bot-job allow-list, never the relay's: a function safe to relay with a user's
          -- signature is not therefore safe to call with no signature at all.
          EXISTS (SELECT 1 FROM paygate.bot_job_allowlist a
                  WHERE a.contract = j.contract AND a.function = j.function AND a.enabled)
"""
# The tick's leases renewed before each job's phase (workers/recovery.py's grace assumes it).
RENEW_SQL = f"""
UPDATE paygate.bot_jobs j SET {leases.renew("j")}
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS mine(id, token)
WHERE j.id = mine.id AND j.status = 'queued' AND j.lease_token = mine.token
"""
RELEASE_SQL = f"""
UPDATE paygate.bot_jobs j SET {leases.RELEASE}, updated_at = now()
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS mine(id, token)
WHERE j.id = mine.id AND j.status = 'queued' AND j.lease_token = mine.token
"""

# -- the lease check and the lineage pointer -------------------------------------------------------

HOLD_SQL = leases.hold("bot_jobs", "j", "j.status = 'queued'", key_param="id", token_param="token")
# The engine's one-statement allocation (journal/engine.py Job): the job takes its new lineage
# (`lineage`) under its lease, one job's form and a tick's over the request `req`.
ATTACH_SQL = """
UPDATE paygate.bot_jobs j SET lineage_id = lineage.id, updated_at = now()
FROM lineage WHERE j.id = %(id)s AND j.status = 'queued' AND j.lease_token = %(token)s
RETURNING 1
"""
HOLD_MANY_SQL = leases.hold_many("bot_jobs", "j", "j.status = 'queued'")
ATTACH_MANY_SQL = """
UPDATE paygate.bot_jobs j SET lineage_id = lineage.id, updated_at = now()
FROM lineage JOIN req USING (entitlement)
WHERE j.id = req.row_id AND j.status = 'queued' AND j.lease_token = req.row_token
RETURNING 1
"""
# A proven-dead lineage is one attempt; the pointer is cleared so a new one may be prepared. A
# starved one (expired after a replacement fee bump, or while fee-capped: docs/architecture.md §4
# "Fees and the fee market") is not: the market outbid it, the job did nothing wrong.
DEAD_LINEAGE_SQL = """
UPDATE paygate.bot_jobs
SET lineage_id = NULL, dead_lineages = dead_lineages || %(lineage)s::bigint,
    attempts = attempts + (SELECT CASE WHEN x.state = 'expired' AND (x.replacements > 0 OR x.fee_capped_at IS NOT NULL)
                                       THEN 0 ELSE 1 END FROM paygate.lineages x WHERE x.id = %(lineage)s),
    updated_at = now()
WHERE id = %(id)s AND status = 'queued' AND lease_token = %(token)s AND lineage_id = %(lineage)s
RETURNING attempts
"""
# Inside the engine's transaction, after its hold() took the row lock under our lease.
UNHOOK_SQL = """
UPDATE paygate.bot_jobs SET lineage_id = NULL, dead_lineages = dead_lineages || %(lineage)s::bigint, updated_at = now()
WHERE id = %(id)s AND lineage_id = %(lineage)s
"""
SET_PENDING_FAILURE_SQL = """
UPDATE paygate.bot_jobs SET pending_failure = %(reason)s, updated_at = now()
WHERE id = %(id)s AND status = 'queued' AND lease_token = %(token)s
"""
# Live bot-job lineages no queued job points at any more (a job finished elsewhere): driven so no
# lane stays pinned. Older than a minute: never a lineage whose allocation is being recorded.
ORPHANS_SQL = """
SELECT x.id FROM paygate.lineages x
WHERE x.purpose = 'relay' AND x.entitlement LIKE 'bot_job:%%' AND paygate.lineage_is_live(x.state)
  AND x.created_at < now() - interval '1 minute'
  AND NOT EXISTS (SELECT 1 FROM paygate.bot_jobs j WHERE j.lineage_id = x.id AND j.status = 'queued')
ORDER BY x.parked_at IS NOT NULL, x.id LIMIT %(limit)s  -- parked ones never crowd out the rest
"""

# -- finish: applied / failed (with the fee its lineage burned), dead, needs_human -----------------

# A CAS on status + lease token + the lineage whose receipt it records (none for a job that ends
# before one landed).
FINISH_SQL = f"""
UPDATE paygate.bot_jobs
SET status = %(status)s, reason = %(reason)s, fee_charged = %(fee)s, tx_hash = %(tx)s, finished_at = now(),
    {leases.RELEASE}, updated_at = now()
WHERE id = %(id)s AND status = 'queued' AND lease_token = %(token)s
  AND lineage_id IS NOT DISTINCT FROM %(lineage)s
RETURNING id
"""

# -- replay (ops/replay.py) ------------------------------------------------------------------------

REPLAY_ROWS_SQL = """
SELECT j.id, j.status, j.job_key, j.contract, j.function, j.reason, j.attempts, j.updated_at,
       (SELECT array_agg(l.id || ':' || l.state ORDER BY l.id) FROM paygate.lineages l
        WHERE l.entitlement = 'bot_job:' || j.id AND paygate.lineage_is_live(l.state)) AS live,
       (SELECT array_agg(l.id ORDER BY l.id) FROM paygate.lineages l
        WHERE l.entitlement = 'bot_job:' || j.id AND l.state = 'applied') AS applied,
       EXISTS (SELECT 1 FROM paygate.bot_job_allowlist a
               WHERE a.contract = j.contract AND a.function = j.function AND a.enabled) AS allowed
FROM paygate.bot_jobs j
WHERE CASE WHEN %(ids)s::bigint[] IS NULL
           THEN j.status = ANY(%(dead)s) AND (%(since)s::timestamptz IS NULL OR j.updated_at >= %(since)s)
           ELSE j.id = ANY(%(ids)s) END
ORDER BY j.id
"""
# Back to queued under the same job key, the dead lineages kept as history; the drainer starts it afresh.
REPLAY_SQL = f"""
UPDATE paygate.bot_jobs
SET status = 'queued', reason = NULL, pending_failure = NULL, attempts = 0, {leases.RELEASE},
    claimed_by = NULL, lineage_id = NULL, tx_hash = NULL, fee_charged = NULL,
    finished_at = NULL, updated_at = now()
WHERE id = %(id)s AND status = %(status)s AND updated_at = %(updated_at)s
RETURNING id
"""
REPLAY_EVENT_SQL = """
SELECT paygate.emit_event('bot_job.replayed', jsonb_build_object('bot_job_id', %(id)s::bigint,
                          'job_key', %(job_key)s::text, 'previous_status', %(status)s::text))
"""

# -- depth rows (state.py composes them into `status` and the state metrics) -----------------------

DEPTH_ROWS: dict[str, str] = {
    "bot_jobs.queued": """
        SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
        FROM paygate.bot_jobs WHERE status = 'queued'""",
    "bot_jobs.dead": """
        SELECT count(*), extract(epoch FROM now() - min(finished_at))::float8
        FROM paygate.bot_jobs WHERE status = 'dead'""",
}
