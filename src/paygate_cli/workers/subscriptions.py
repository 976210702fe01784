"""Subscriptions: each due period becomes one charge, through the same admission function as a
one-off charge (`paygate.admit_charge`), so the balance check, the idempotency record and the
outbox event are the same. Database only: no chain, no network.

A period's start is derived (anchor + k * period), never chosen; the idempotency key
`subscription:<id>:<k>` and UNIQUE (subscription_id, period_start) make a second charge for a
period impossible. Missed periods (downtime) are caught up in order, at most MAX_PERIODS_PER_TICK
per subscription per tick. Insufficient balance: `past_due` with an outbox event, no charge; the
unpaid period is tried again at each following period boundary until it is paid or cancelled."""

from __future__ import annotations

import psycopg
from psycopg.types.json import Jsonb

from paygate_cli.context import TickContext, TickResult
from paygate_cli.crashpoints import crashpoint
from paygate_cli.queues import subscriptions

MAX_PERIODS_PER_TICK = 12
# admit_charge's refusals (sql/functions/admit_charge.sql): admission halted, and not enough cached balance.
HALTED = "55000"
INSUFFICIENT_BALANCE = "PG402"

# The statements that take a due subscription and move it on (claim, load, admit, advance,
# past_due) are the queue's, with their why: queues/subscriptions.py.
EMIT_SQL = "SELECT paygate.emit_event(%s, %s)"


HONOURS_DRAIN = True  # a drained instance takes no due subscription (see tick)


def tick(ctx: TickContext) -> TickResult:
    result = TickResult(details={"charged": 0, "past_due": 0, "halted": 0})
    if ctx.draining:
        # A drained instance takes no new claims; nothing is ever held between ticks here (each
        # subscription is one transaction), so there is nothing in flight to finish either.
        return result
    handled: list[int] = []
    for _ in range(ctx.batch):
        with ctx.conn.transaction():
            row = ctx.conn.execute(subscriptions.CLAIM_DUE_SQL, (handled,)).fetchone()
            if row is None:
                break
            handled.append(row[0])
            outcome = charge_due_periods(ctx.conn, row[0])
            crashpoint("subscriptions.before_commit")
        result.processed += 1
        for key, count in outcome.items():
            result.details[key] += count
        if outcome["halted"]:
            break  # admission is closed: the rest waits for the next tick, untouched
    return result


def charge_due_periods(conn: psycopg.Connection, subscription_id: int) -> dict[str, int]:
    """Charge every started, unpaid period of one subscription (bounded), in order."""
    outcome = {"charged": 0, "past_due": 0, "halted": 0}
    for _ in range(MAX_PERIODS_PER_TICK):
        (sid, account, amount, _period, status, index, period_start, description, due,
         _following) = conn.execute(subscriptions.LOAD_SQL, (subscription_id,)).fetchone()
        if status not in ("active", "past_due") or not due:
            break
        params = {"account": account, "amount": amount, "key": f"subscription:{sid}:{index}",
                  "description": description or f"subscription {sid} period {index}", "subscription": sid,
                  "period_start": period_start}
        try:
            with conn.transaction():  # a savepoint: a refused admission rolls back only itself
                charge_row, _replayed = conn.execute(subscriptions.ADMIT_SQL, params).fetchone()
        except psycopg.Error as exc:
            if exc.sqlstate == HALTED:
                outcome["halted"] += 1
                break
            if exc.sqlstate == INSUFFICIENT_BALANCE:
                retry_at = conn.execute(subscriptions.PAST_DUE_SQL, (sid, index)).fetchone()[0]
                conn.execute(EMIT_SQL, ("subscription.past_due", Jsonb({
                    "subscription_id": sid, "account": account, "amount": str(amount), "period_index": index,
                    "period_start": period_start.isoformat(), "retry_at": retry_at.isoformat()})))
                outcome["past_due"] += 1
                break
            raise
        conn.execute(subscriptions.ADVANCE_SQL, (sid, index))
        conn.execute(EMIT_SQL, ("subscription.charged", Jsonb({
            "subscription_id": sid, "charge_row_id": charge_row, "period_index": index,
            "period_start": period_start.isoformat(), "amount": str(amount)})))
        outcome["charged"] += 1
    return outcome
