"""Deletes expired idempotency keys in bounded batches.

Each batch walks `idempotency_keys_expires_at` from the oldest key and stops at `now()`, so a batch
costs the rows it deletes, not a scan of the table. SKIP LOCKED lets it pass keys that admission is
touching right now; they are taken next time."""

from __future__ import annotations

from paygate_cli.context import TickContext, TickResult

DELETE_EXPIRED_SQL = """
DELETE FROM paygate.idempotency_keys k
USING (
    SELECT scope, key FROM paygate.idempotency_keys
    WHERE expires_at < now()
    ORDER BY expires_at
    LIMIT %s
    FOR UPDATE SKIP LOCKED
) expired
WHERE k.scope = expired.scope AND k.key = expired.key
"""
MAX_BATCHES_PER_TICK = 10  # bounds one tick; the next tick continues


HONOURS_DRAIN = True  # a drained instance takes no new work: the sweep's deletions included


def tick(ctx: TickContext) -> TickResult:
    if ctx.draining:
        return TickResult(details={"draining": True})
    deleted = 0
    for _ in range(MAX_BATCHES_PER_TICK):
        with ctx.conn.transaction():
            count = ctx.conn.execute(DELETE_EXPIRED_SQL, (ctx.batch,)).rowcount
        deleted += count
        if count < ctx.batch:
            break
    return TickResult(processed=deleted, details={"deleted": deleted})
