"""Subscriptions (paygate.subscriptions): a recurring charge, one per period (docs/architecture.md §5).

Rows are created, paused, resumed and cancelled by the product through the schema's functions
(sql/0001_baseline.sql). The subscriptions worker (workers/subscriptions.py) takes each due
one (no lease: one transaction per subscription, the row locked for its short, database-only
duration), charges its started periods through `paygate.admit_charge` and moves it on: the next
period (`active`), or `past_due` with a retry time when the balance does not cover it.

Statuses: active <-> past_due (the worker); active | past_due -> paused -> active, and any ->
cancelled (the product's functions). docs/states.md has the diagram."""

from __future__ import annotations

# -- claim -------------------------------------------------------------------------------------------

# Due: an active subscription whose next period has started, or a past_due one whose retry time
# came. One subscription per transaction, locked for its (short, database-only) duration: a
# transaction then touches one account row, so concurrent workers cannot deadlock on accounts.
CLAIM_DUE_SQL = """
SELECT id FROM paygate.subscriptions
WHERE ((status = 'active' AND next_period_start <= now()) OR (status = 'past_due' AND retry_at <= now()))
  AND id <> ALL(%s)  -- each subscription at most once per tick: catch-up stays bounded
ORDER BY coalesce(retry_at, next_period_start)
LIMIT 1
FOR UPDATE SKIP LOCKED
"""
LOAD_SQL = """
SELECT id, account, amount, period, status, next_period_index, next_period_start, description,
       next_period_start <= now() AS due, anchor + (next_period_index + 1) * period AS following_start
FROM paygate.subscriptions WHERE id = %s
"""

# -- charge a period ------------------------------------------------------------------------------------

# The same admission as a one-off charge: balance check, idempotency record, outbox event.
ADMIT_SQL = """
SELECT charge_row_id, replayed FROM paygate.admit_charge(%(account)s, %(amount)s, %(key)s, %(description)s,
                                                         %(subscription)s, %(period_start)s)
"""
# Paid: on to the next period (derived, never chosen: anchor + k * period).
ADVANCE_SQL = """
UPDATE paygate.subscriptions
SET status = 'active', next_period_index = next_period_index + 1,
    next_period_start = anchor + (next_period_index + 1) * period,
    retry_at = NULL, past_due_since = NULL, updated_at = now()
WHERE id = %s AND next_period_index = %s
"""
# Not paid: the next try of an unpaid period is the next period boundary after now (DB time).
PAST_DUE_SQL = """
UPDATE paygate.subscriptions
SET status = 'past_due', past_due_since = coalesce(past_due_since, now()), updated_at = now(),
    retry_at = anchor + (SELECT min(i) FROM generate_series(next_period_index + 1, next_period_index + 100000) i
                         WHERE anchor + i * period > now()) * period
WHERE id = %s AND next_period_index = %s
RETURNING retry_at
"""

# -- depth rows (`status`, metrics: state.py) ------------------------------------------------------------

# Each: the count and the age of the oldest item, in seconds.
DEPTH_ROWS: dict[str, str] = {
    "subscriptions.due": """
        SELECT count(*), extract(epoch FROM now() - min(coalesce(retry_at, next_period_start)))::float8
        FROM paygate.subscriptions
        WHERE (status = 'active' AND next_period_start <= now()) OR (status = 'past_due' AND retry_at <= now())""",
    "subscriptions.past_due": """
        SELECT count(*), extract(epoch FROM now() - min(past_due_since))::float8
        FROM paygate.subscriptions WHERE status = 'past_due'""",
}
