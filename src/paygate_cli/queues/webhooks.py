"""The webhook queue (paygate.webhook_outbox, read with its paygate.webhook_endpoints): every
statement that moves a delivery's row, by purpose. The webhook worker (workers/webhooks.py) holds
the flow (claim, POST with no transaction open, settle), `replay webhooks` (ops/replay.py) its
refusals; docs/states.md has the diagram.

Every settle of a holder is a CAS on the lease token its claim took (queues/leases.py)."""

from __future__ import annotations

from paygate_cli.queues import leases

# -- take over, claim, settle ----------------------------------------------------------------------

# The one take-over routine for this queue, used by its worker (grace 0, in its claim transaction)
# and by recovery (past its grace window): a row whose lease lapsed (its worker died mid-delivery)
# goes back to pending, or dead when its attempts are spent. A CAS on the lease token read, so a
# delivery that finishes meanwhile is never overwritten, and SKIP LOCKED so two takers split rows.
TAKE_OVER_SQL = f"""
WITH lapsed AS (
    SELECT id, lease_token FROM paygate.webhook_outbox
    WHERE status = 'delivering' AND lease_expires_at < now() - make_interval(secs => %(grace)s)
    ORDER BY lease_expires_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), decided AS (
    SELECT o.id, lapsed.lease_token, o.attempts >= coalesce(o.max_attempts, %(max_attempts)s) AS spent
    FROM paygate.webhook_outbox o JOIN lapsed ON lapsed.id = o.id
)
UPDATE paygate.webhook_outbox o
SET status = CASE WHEN d.spent THEN 'dead' ELSE 'pending' END,
    dead_at = CASE WHEN d.spent THEN now() END,
    dead_reason = CASE WHEN d.spent THEN format('no success in %%s attempts; the last one was abandoned by its '
                                                'worker (lease lapsed)', o.attempts) END,
    last_error = 'abandoned mid-delivery: lease lapsed (taken over by ' || %(by)s || ')',
    {leases.RELEASE}, claimed_by = NULL, next_attempt_at = now(), updated_at = now()
FROM decided d
WHERE o.id = d.id AND o.status = 'delivering' AND o.lease_token = d.lease_token
RETURNING o.id, o.status
"""

# Due rows under a lease (SKIP LOCKED), the attempt counted at claim so a row that kills its worker
# still runs out of attempts; with the endpoint each is POSTed to.
CLAIM_SQL = f"""
WITH due AS (
    SELECT ctid FROM paygate.webhook_outbox
    WHERE status = 'pending' AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE paygate.webhook_outbox o
    SET status = 'delivering', {leases.take()},
        claimed_by = %(instance)s, attempts = o.attempts + 1, updated_at = now()
    FROM due
    -- Back to the rows by ctid, the version the FOR UPDATE locked (nobody else can move it until
    -- this commits): no primary-key descent per claimed row, so the claim costs the same
    -- however long the table's history (bench/growth.py).
    WHERE o.ctid = due.ctid
    RETURNING o.id, o.event_id, o.endpoint_id, o.event_type, o.payload, o.attempts, o.max_attempts,
              o.lease_token, o.created_at
)
SELECT c.id, c.event_id, c.endpoint_id, c.event_type, c.payload, c.attempts, c.max_attempts,
       c.lease_token, c.created_at, e.url, e.secret, e.enabled
FROM claimed c LEFT JOIN paygate.webhook_endpoints e ON e.id = c.endpoint_id
"""

# The outcome of one delivery (delivered, pending again after a backoff, or dead). CAS on the lease
# token: a delivery whose lease lapsed and was re-claimed cannot overwrite its successor.
SETTLE_SQL = f"""
UPDATE paygate.webhook_outbox
SET status = %(status)s,
    {leases.RELEASE}, claimed_by = NULL,
    last_status_code = %(code)s, last_error = %(error)s,
    delivered_at = CASE WHEN %(status)s = 'delivered' THEN now() END,
    dead_at = CASE WHEN %(status)s = 'dead' THEN now() END,
    dead_reason = %(dead_reason)s,
    next_attempt_at = CASE WHEN %(status)s = 'pending' THEN now() + make_interval(secs => %(delay)s)
                           ELSE next_attempt_at END,
    updated_at = now()
WHERE id = %(id)s AND status = 'delivering' AND lease_token = %(token)s
"""

# -- replay (ops/replay.py) ------------------------------------------------------------------------

REPLAY_ROWS_SQL = """
SELECT o.id, o.status, o.attempts, o.event_id, o.event_type, o.dead_reason, o.dead_at, o.updated_at,
       o.endpoint_id, e.enabled
FROM paygate.webhook_outbox o LEFT JOIN paygate.webhook_endpoints e ON e.id = o.endpoint_id
WHERE CASE WHEN %(ids)s::bigint[] IS NULL
           THEN o.status = 'dead' AND (%(since)s::timestamptz IS NULL OR o.dead_at >= %(since)s)
           ELSE o.id = ANY(%(ids)s) END
ORDER BY o.id
"""
# Same row, same event id (the receiver's idempotency key), its last error kept as history.
REPLAY_SQL = """
UPDATE paygate.webhook_outbox
SET status = 'pending', attempts = 0, next_attempt_at = now(), dead_at = NULL, dead_reason = NULL, updated_at = now()
WHERE id = %(id)s AND status = 'dead' AND updated_at = %(updated_at)s
RETURNING id
"""

# -- depth rows (state.py composes them into `status` and the state metrics) -----------------------

DEPTH_ROWS: dict[str, str] = {
    "webhooks.pending": """
        SELECT count(*), extract(epoch FROM now() - min(next_attempt_at))::float8
        FROM paygate.webhook_outbox WHERE status = 'pending' AND next_attempt_at <= now()""",
    "webhooks.retrying": """
        SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
        FROM paygate.webhook_outbox WHERE status = 'pending' AND next_attempt_at > now()""",
    "webhooks.delivering": """
        SELECT count(*), extract(epoch FROM now() - min(updated_at))::float8
        FROM paygate.webhook_outbox WHERE status = 'delivering'""",
    "webhooks.dead": """
        SELECT count(*), extract(epoch FROM now() - min(dead_at))::float8
        FROM paygate.webhook_outbox WHERE status = 'dead'""",
}
