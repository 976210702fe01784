"""The subscriptions worker: one charge per derived period, catch-up in order, past_due, cancel,
pause/resume, halts, and no double charge under concurrent workers. Database only (no chain)."""

from __future__ import annotations

import json

import psycopg
import pytest

from paygate_cli.workers.subscriptions import MAX_PERIODS_PER_TICK
from tests.support.cli import run_cli, spawn

ACCOUNT = "GCQ2DINBUGQ2DINBUGQ2DINBUGQ2DINBUGQ2DINBUGQ2DINBUGQ2DJX7"  # valid StrKeys (admission checks them)
OTHER = "GCZLFMVSWKZLFMVSWKZLFMVSWKZLFMVSWKZLFMVSWKZLFMVSWKZLFF6T"


def fund(db: psycopg.Connection, account: str, amount: int) -> None:
    """Stands in for settled deposits: the cached balance the funding path would have credited."""
    db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, %s) ON CONFLICT (address)"
               " DO UPDATE SET cached_balance = paygate.accounts.cached_balance + EXCLUDED.cached_balance",
               (account, amount))


def subscribe(db: psycopg.Connection, account: str, amount: int, period: str, periods_ago: float, key: str) -> int:
    return db.execute("SELECT subscription_id FROM paygate.create_subscription(%s, %s, %s::interval,"
                      " now() - %s * %s::interval, %s)", (account, amount, period, periods_ago, period, key)
                      ).fetchone()[0]


def tick(dsn: str, *args: str) -> dict:
    result = run_cli("run-tick", "subscriptions", "--json", *args, dsn=dsn)
    assert result.code == 0, result.err
    return json.loads(result.out)["run_tick"]


def charges(db: psycopg.Connection, subscription_id: int) -> list[tuple]:
    return db.execute("SELECT period_start, amount FROM paygate.charges WHERE subscription_id = %s"
                      " ORDER BY period_start", (subscription_id,)).fetchall()


def test_missed_periods_are_caught_up_in_order(dsn: str, db: psycopg.Connection) -> None:
    fund(db, ACCOUNT, 1000)
    sid = subscribe(db, ACCOUNT, 100, "1 hour", 3.5, "s1")
    tick(dsn)
    rows = charges(db, sid)
    anchor = db.execute("SELECT anchor FROM paygate.subscriptions WHERE id = %s", (sid,)).fetchone()[0]
    assert [r[0] for r in rows] == [anchor + db.execute("SELECT %s * interval '1 hour'", (k,)).fetchone()[0]
                                    for k in range(4)]
    assert db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s", (ACCOUNT,)).fetchone()[0] == 600
    state = db.execute("SELECT status, next_period_index FROM paygate.subscriptions WHERE id = %s", (sid,)).fetchone()
    assert state == ("active", 4)
    tick(dsn)  # nothing new is due
    assert len(charges(db, sid)) == 4


def test_catch_up_is_bounded_per_tick(dsn: str, db: psycopg.Connection) -> None:
    fund(db, ACCOUNT, 10_000)
    sid = subscribe(db, ACCOUNT, 10, "1 hour", 20.5, "s-long")
    tick(dsn)
    assert len(charges(db, sid)) == MAX_PERIODS_PER_TICK
    tick(dsn)
    assert len(charges(db, sid)) == 21


def test_insufficient_balance_goes_past_due_with_one_event_then_recovers(dsn: str, db: psycopg.Connection) -> None:
    fund(db, ACCOUNT, 150)
    db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES ('https://example.com/h', %s)",
               ("s" * 20,))
    sid = subscribe(db, ACCOUNT, 100, "1 hour", 1.5, "s-poor")
    tick(dsn)
    assert len(charges(db, sid)) == 1  # period 0 paid, period 1 is not
    status, retry_at, index = db.execute("SELECT status, retry_at > now(), next_period_index FROM paygate.subscriptions"
                                         " WHERE id = %s", (sid,)).fetchone()
    assert (status, retry_at, index) == ("past_due", True, 1)
    events = [r[0] for r in db.execute("SELECT event_type FROM paygate.webhook_outbox ORDER BY id")]
    assert events.count("subscription.past_due") == 1
    tick(dsn)  # not retried before retry_at
    assert len(charges(db, sid)) == 1 and events.count("subscription.past_due") == 1
    fund(db, ACCOUNT, 500)
    db.execute("UPDATE paygate.subscriptions SET retry_at = now() - interval '1 second' WHERE id = %s", (sid,))
    tick(dsn)
    assert len(charges(db, sid)) == 2
    assert db.execute("SELECT status FROM paygate.subscriptions WHERE id = %s", (sid,)).fetchone()[0] == "active"


def test_cancelled_and_paused_subscriptions_are_not_charged(dsn: str, db: psycopg.Connection) -> None:
    fund(db, ACCOUNT, 1000)
    cancelled = subscribe(db, ACCOUNT, 10, "1 hour", 2.5, "s-c")
    paused = subscribe(db, ACCOUNT, 10, "1 hour", 2.5, "s-p")
    assert db.execute("SELECT paygate.cancel_subscription(%s, 'customer left')", (cancelled,)).fetchone()[0]
    assert db.execute("SELECT paygate.pause_subscription(%s)", (paused,)).fetchone()[0]
    tick(dsn)
    assert charges(db, cancelled) == [] and charges(db, paused) == []
    assert db.execute("SELECT paygate.resume_subscription(%s)", (paused,)).fetchone()[0]
    tick(dsn)
    assert charges(db, paused) == []  # the periods that passed while paused are skipped
    start = db.execute("SELECT next_period_start > now() FROM paygate.subscriptions WHERE id = %s",
                       (paused,)).fetchone()[0]
    assert start is True


def test_halted_admission_charges_nothing_and_marks_nothing(dsn: str, db: psycopg.Connection) -> None:
    fund(db, ACCOUNT, 1000)
    sid = subscribe(db, ACCOUNT, 10, "1 hour", 0.5, "s-h")
    db.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('operator', 'incident', 't')")
    summary = tick(dsn)
    assert summary["last_details"]["halted"] == 1
    assert charges(db, sid) == []
    assert db.execute("SELECT status FROM paygate.subscriptions WHERE id = %s", (sid,)).fetchone()[0] == "active"
    db.execute("DELETE FROM paygate.halts")
    tick(dsn)
    assert len(charges(db, sid)) == 1


def test_create_subscription_is_idempotent(db: psycopg.Connection) -> None:
    first = subscribe(db, ACCOUNT, 10, "1 day", 0, "same-key")
    again = db.execute("SELECT subscription_id, replayed FROM paygate.create_subscription(%s, 10, '1 day'::interval,"
                       " (SELECT anchor FROM paygate.subscriptions WHERE id = %s), 'same-key')",
                       (ACCOUNT, first)).fetchone()
    assert again == (first, True)
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute("SELECT * FROM paygate.create_subscription(%s, 99, '1 day'::interval, now(), 'same-key')",
                   (ACCOUNT,))


def test_a_period_can_never_be_charged_twice(db: psycopg.Connection) -> None:
    fund(db, ACCOUNT, 1000)
    sid = subscribe(db, ACCOUNT, 10, "1 hour", 0.5, "s-u")
    start = db.execute("SELECT anchor FROM paygate.subscriptions WHERE id = %s", (sid,)).fetchone()[0]
    db.execute("SELECT * FROM paygate.admit_charge(%s, 10, 'k1', NULL, %s, %s)", (ACCOUNT, sid, start))
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute("SELECT * FROM paygate.admit_charge(%s, 10, 'k2', NULL, %s, %s)", (ACCOUNT, sid, start))


def test_one_tick_charges_every_due_subscription_up_to_its_batch(dsn: str, db: psycopg.Connection) -> None:
    """A tick keeps claiming while subscriptions are due, up to its batch (500): periods falling due
    together (a month's first day) are charged in the next tick, not sixteen a minute."""
    fund(db, ACCOUNT, 10**9)
    ids = [subscribe(db, ACCOUNT, 5, "1 day", 0.5, f"due-{i}") for i in range(300)]
    summary = tick(dsn)
    assert summary["processed"] == 300
    charged = db.execute("SELECT count(DISTINCT subscription_id) FROM paygate.charges WHERE subscription_id = ANY(%s)",
                         (ids,)).fetchone()[0]
    assert charged == 300
    assert tick(dsn, "--batch", "7")["processed"] == 0  # nothing is due any more


def test_concurrent_workers_charge_each_period_once(dsn: str, db: psycopg.Connection) -> None:
    fund(db, ACCOUNT, 10**9)
    fund(db, OTHER, 10**9)
    ids = [subscribe(db, ACCOUNT if i % 2 else OTHER, 7, "1 hour", 5.5, f"c-{i}") for i in range(40)]
    procs = [spawn("run-tick", "subscriptions", "--every", "0.1s", "--for", "4s", "--batch", "3", dsn=dsn)
             for _ in range(3)]
    for proc in procs:
        proc.wait(timeout=60)
        assert proc.returncode == 0, proc.stderr.read()
    per_period = db.execute("SELECT subscription_id, count(*), count(DISTINCT period_start) FROM paygate.charges"
                            " GROUP BY subscription_id").fetchall()
    assert len(per_period) == len(ids)
    assert all(total == 6 and distinct == 6 for _, total, distinct in per_period)
    debited = 2 * 10**9 - db.execute("SELECT sum(cached_balance) FROM paygate.accounts").fetchone()[0]
    assert debited == 40 * 6 * 7


# -- drills and draining ---------------------------------------------------------------------

def test_a_crash_before_commit_charges_nothing_and_a_fresh_process_charges_once(dsn: str, db: psycopg.Connection
                                                                                ) -> None:
    """Killed inside the transaction, after the charges were admitted but before the commit: nothing
    of it survives; a fresh OS process then charges each period exactly once."""
    from tests.support.cli import base_environ, run_proc
    from tests.support.drill_support import crash_tick

    fund(db, ACCOUNT, 1000)
    sid = subscribe(db, ACCOUNT, 100, "1 hour", 2.5, "s-crash")
    environ = base_environ(dsn)
    crash_tick(environ, "subscriptions", "subscriptions.before_commit")
    assert charges(db, sid) == []
    balance = db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s", (ACCOUNT,)).fetchone()[0]
    assert balance == 1000
    assert db.execute("SELECT next_period_index FROM paygate.subscriptions WHERE id = %s", (sid,)).fetchone()[0] == 0
    resumed = run_proc("run-tick", "subscriptions", "--once", "--json", environ=environ)
    assert resumed.code == 0, resumed.err
    assert len(charges(db, sid)) == 3
    assert db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s", (ACCOUNT,)).fetchone()[0] == 700
    assert db.execute("SELECT count(*) FROM paygate.idempotency_keys WHERE key LIKE %s",
                      (f"subscription:{sid}:%",)).fetchone()[0] == 3


def test_a_drained_instance_takes_no_subscription(dsn: str, db: psycopg.Connection) -> None:
    """The worker itself, with TickContext.draining set (as the runner passes it for a drained instance)."""
    import logging

    from paygate_cli.context import TickContext
    from paygate_cli.settings import load_settings
    from paygate_cli.workers import subscriptions
    from tests.support.cli import base_environ

    fund(db, ACCOUNT, 1000)
    sid = subscribe(db, ACCOUNT, 100, "1 hour", 1.5, "s-drain")
    ctx = TickContext(conn=db, settings=load_settings(base_environ(dsn)), worker="subscriptions",
                      instance_id="drained-host", slot=0, batch=16, log=logging.getLogger("test"), draining=True)
    assert subscriptions.tick(ctx).processed == 0
    assert charges(db, sid) == []
    tick(dsn)  # an instance that is not drained charges them
    assert len(charges(db, sid)) == 2
