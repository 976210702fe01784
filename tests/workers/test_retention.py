"""The retention worker: terminal rows older than the window move to paygate_archive in
bounded, index-driven batches; everything a live lineage, an unresolved finding, `replay` or
`key-retire-check` still needs stays; a killed process loses nothing (each row in the hot table or
the archive, never both, never neither)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from paygate_cli.catalogue import WORKERS
from paygate_cli.crashpoints import MARKER
from paygate_cli.db.locks import LOCK_NAMESPACE
from paygate_cli.journal.lineage import LAST_CONSUMED_SEQ_SQL
from paygate_cli.workers.reconciler import SETTLED_CHARGES_SQL
from paygate_cli.workers.retention import MAX_BATCHES_PER_TABLE, TABLES
from tests.support.cli import run_cli, run_proc

LANES = ["G" + chr(ord("A") + i) * 55 for i in range(2)]
ACCOUNT = "G" + "C" * 55
OTHER_ACCOUNT = "G" + "D" * 55
OLD, YOUNG = 40 * 86400, 86400  # seconds ago: past the 30-day default window, and well inside it
RETAINED = [t.name for t in TABLES]


def add_lineage(db: psycopg.Connection, *, lane: str, seq: int, state: str = "applied", age: int = OLD,
                purpose: str = "charge_batch", entitlement: str | None = None, key_id: str = "k1") -> int:
    """A lineage as the engine leaves it (INSERT is not guarded; the journal's UPDATE guard is)."""
    signed = state != "allocated"
    row = db.execute(
        """INSERT INTO paygate.lineages (purpose, entitlement, lane, state, source_seq, key_id, envelope, inner_hash,
                                         outer_hash, max_time, signed_at_ledger, ledger, resolution, created_at,
                                         signed_at, resolved_at)
           VALUES (%(purpose)s, coalesce(%(entitlement)s, 'charge_batch:' || gen_random_uuid()), %(lane)s, %(state)s,
                   %(seq)s, %(key)s, '\\x00', sha256(gen_random_uuid()::text::bytea),
                   sha256(gen_random_uuid()::text::bytea), 1, 1,
                   CASE WHEN %(state)s IN ('applied', 'failed') THEN 100 END,
                   CASE WHEN %(state)s NOT IN ('allocated', 'signed', 'sent') THEN 'test' END,
                   now() - make_interval(secs => %(age)s), now() - make_interval(secs => %(age)s),
                   CASE WHEN %(state)s NOT IN ('allocated', 'signed', 'sent')
                        THEN now() - make_interval(secs => %(age)s) END)
           RETURNING id""",
        {"purpose": purpose, "entitlement": entitlement, "lane": lane, "state": state, "seq": seq if signed else None,
         "key": key_id if signed else None, "age": age}).fetchone()
    return int(row[0])


def add_batch(db: psycopg.Connection, *, lane: str, seq: int, charges: int, age: int = OLD, state: str = "applied",
              account: str = ACCOUNT, status: str = "settled", closed: bool = True) -> tuple[int, list[int]]:
    """A charge_batch lineage, its batch row and `charges` charges it settled (or failed)."""
    lineage = add_lineage(db, lane=lane, seq=seq, state=state, age=age)
    db.execute("""INSERT INTO paygate.charge_batches (lineage_id, entries, outcome, created_at, closed_at)
                  VALUES (%(id)s, %(n)s, CASE WHEN %(closed)s THEN 'applied' END,
                          now() - make_interval(secs => %(age)s),
                          CASE WHEN %(closed)s THEN now() - make_interval(secs => %(age)s) END)""",
               {"id": lineage, "n": max(charges, 1), "closed": closed, "age": age})
    ids = add_charges(db, charges, lineage=lineage, age=age, account=account, status=status)
    return lineage, ids


def add_charges(db: psycopg.Connection, count: int, *, lineage: int | None = None, age: int = OLD,
                account: str = ACCOUNT, status: str = "settled", subscription: int | None = None,
                first_period: int = 0) -> list[int]:
    rows = db.execute(
        """INSERT INTO paygate.charges (charge_id, account, amount, idempotency_key, status, claimed_at, lineage_id,
                                        settled_at, failed_at, reason, failed_by, subscription_id, period_start,
                                        created_at)
           SELECT sha256(gen_random_uuid()::text::bytea), %(account)s, 7, 'k' || gen_random_uuid(), %(status)s,
                  CASE WHEN %(lineage)s::bigint IS NOT NULL THEN now() - make_interval(secs => %(age)s) END,
                  %(lineage)s,
                  CASE WHEN %(status)s = 'settled' THEN now() - make_interval(secs => %(age)s) END,
                  CASE WHEN %(status)s = 'failed' THEN now() - make_interval(secs => %(age)s) END,
                  CASE WHEN %(status)s = 'failed' THEN 'test' END, CASE WHEN %(status)s = 'failed' THEN 'observer' END,
                  %(sub)s, CASE WHEN %(sub)s::bigint IS NOT NULL
                                THEN timestamptz '2026-01-01' + (%(first)s + g) * interval '1 day' END,
                  now() - make_interval(secs => %(age)s)
           FROM generate_series(1, %(count)s) g RETURNING id""",
        {"account": account, "status": status, "lineage": lineage, "age": age, "count": count, "sub": subscription,
         "first": first_period}).fetchall()
    return [int(r[0]) for r in rows]


def add_events(db: psycopg.Connection, count: int, *, age: int = OLD, ledger: int = 50,
               quarantined: bool = False) -> None:
    db.execute("""INSERT INTO paygate.chain_events (event_id, ledger, kind, payload, quarantined, quarantine_reason,
                                                    observed_at)
                  SELECT 'ev-' || gen_random_uuid(), %s, 'charge', '{}', %s, CASE WHEN %s THEN 'test' END,
                         now() - make_interval(secs => %s)
                  FROM generate_series(1, %s)""", (ledger, quarantined, quarantined, age, count))


def add_webhooks(db: psycopg.Connection, count: int, *, status: str = "delivered", age: int = OLD) -> list[int]:
    rows = db.execute(
        """INSERT INTO paygate.webhook_outbox (event_type, payload, status, delivered_at, dead_at, dead_reason,
                                               created_at)
           SELECT 'charge.settled', '{}', %(status)s,
                  CASE WHEN %(status)s = 'delivered' THEN now() - make_interval(secs => %(age)s) END,
                  CASE WHEN %(status)s = 'dead' THEN now() - make_interval(secs => %(age)s) END,
                  CASE WHEN %(status)s = 'dead' THEN 'test' END, now() - make_interval(secs => %(age)s)
           FROM generate_series(1, %(count)s) RETURNING id""",
        {"status": status, "age": age, "count": count}).fetchall()
    return [int(r[0]) for r in rows]


def add_runs(db: psycopg.Connection, worker: str, count: int, *, age: int = OLD, outcome: str = "ok") -> None:
    db.execute("""INSERT INTO paygate.worker_runs (worker, instance_id, pid, started_at, finished_at, outcome)
                  SELECT %s, 'test', 1, now() - make_interval(secs => %s + g), now() - make_interval(secs => %s + g),
                         %s
                  FROM generate_series(1, %s) g""", (worker, age, age, outcome, count))


def setup_world(db: psycopg.Connection) -> None:
    db.execute("INSERT INTO paygate.lanes (address) SELECT unnest(%s::text[])", (LANES,))
    db.execute("INSERT INTO paygate.accounts (address) VALUES (%s), (%s)", (ACCOUNT, OTHER_ACCOUNT))
    db.execute("INSERT INTO paygate.observer_cursor (cursor, ledger) VALUES ('0000000000000429496-0000000000', 100)")


def hot_ids(db: psycopg.Connection, table: str, key: str = "id") -> set[int]:
    return {int(r[0]) for r in db.execute(f"SELECT {key} FROM paygate.{table}")}


def archived_ids(db: psycopg.Connection, table: str, key: str = "id") -> set[int]:
    return {int(r[0]) for r in db.execute(f"SELECT {key} FROM paygate_archive.{table}")}


def run_retention(dsn: str, *args: str) -> tuple[int, dict[str, Any]]:
    result = run_cli("run-tick", "retention", "--json", *args, dsn=dsn)
    return result.code, json.loads(result.out)["run_tick"] if result.out else {"err": result.err}


@pytest.fixture
def world(db: psycopg.Connection) -> psycopg.Connection:
    setup_world(db)
    return db


def test_old_terminal_rows_are_archived_and_the_rest_stays(dsn: str, world: psycopg.Connection) -> None:
    db = world
    old_batch, old_charges = add_batch(db, lane=LANES[0], seq=10, charges=5)
    old_failed_batch, old_failed = add_batch(db, lane=LANES[0], seq=11, charges=2, status="failed", state="failed")
    young_batch, young_charges = add_batch(db, lane=LANES[0], seq=12, charges=3, age=YOUNG)
    open_charges = add_charges(db, 4, age=OLD, status="authorized")  # non-terminal, however old
    add_events(db, 6)
    add_events(db, 2, age=YOUNG)
    old_hooks = add_webhooks(db, 3)
    young_hooks = add_webhooks(db, 2, age=YOUNG)
    pending_hooks = add_webhooks(db, 2, status="pending")
    settled_sum_before = db.execute(SETTLED_CHARGES_SQL).fetchone()[0]

    code, report = run_retention(dsn)
    assert code == 0, report
    moved = report["last_details"]["moved"]
    assert moved["charges"] == 7 and moved["charge_batches"] == 2 and moved["lineages"] == 2
    assert moved["chain_events"] == 6 and moved["webhook_outbox"] == 3
    assert hot_ids(db, "charges") == set(young_charges) | set(open_charges)
    assert archived_ids(db, "charges") == set(old_charges) | set(old_failed)
    assert archived_ids(db, "lineages") == {old_batch, old_failed_batch}
    assert young_batch in hot_ids(db, "lineages")
    assert hot_ids(db, "webhook_outbox") == set(young_hooks) | set(pending_hooks)
    assert archived_ids(db, "webhook_outbox") == set(old_hooks)
    assert db.execute("SELECT count(*) FROM paygate.chain_events").fetchone()[0] == 2
    # Archived rows keep every column, plus when they were archived.
    row = db.execute("SELECT status, amount, lineage_id, archived_at IS NOT NULL FROM paygate_archive.charges "
                     "WHERE id = %s", (old_charges[0],)).fetchone()
    assert row == ("settled", 7, old_batch, True)
    # The reconciler's contract total counts archived settled charges too (5 x 7 moved to the totals).
    assert db.execute(SETTLED_CHARGES_SQL).fetchone()[0] == settled_sum_before
    totals = db.execute("SELECT settled_charges_amount, settled_charges FROM paygate.retention_totals").fetchone()
    assert totals == (35, 5)
    audit = db.execute("SELECT details FROM paygate.audit_log WHERE action = 'retention.archive'").fetchall()
    assert len(audit) == 1 and audit[0][0]["moved"]["charges"] == 7


def test_a_rerun_moves_nothing_more(dsn: str, world: psycopg.Connection) -> None:
    db = world
    add_batch(db, lane=LANES[0], seq=10, charges=5)
    add_batch(db, lane=LANES[0], seq=11, charges=5)
    add_webhooks(db, 3)
    assert run_retention(dsn)[0] == 0
    before = {t: (hot_ids(world, t, "lineage_id" if t == "charge_batches" else "id"),
                  archived_ids(world, t, "lineage_id" if t == "charge_batches" else "id")) for t in RETAINED}
    code, report = run_retention(dsn)
    assert code == 0 and report["processed"] == 0
    db.execute("DELETE FROM paygate.worker_runs WHERE worker = 'retention' AND id > %s",
               (max(before["worker_runs"][0]),))  # the second run's own heartbeat
    after = {t: (hot_ids(world, t, "lineage_id" if t == "charge_batches" else "id"),
                 archived_ids(world, t, "lineage_id" if t == "charge_batches" else "id")) for t in RETAINED}
    assert after == before


def test_live_lineages_and_open_batches_keep_their_charges(dsn: str, world: psycopg.Connection) -> None:
    db = world
    # The observer settled these charges, but their batch's lineage is still 'sent' (not resolved yet).
    live, live_charges = add_batch(db, lane=LANES[0], seq=20, charges=3, state="sent", closed=False)
    # A terminal lineage whose batch row is still open (settlement has not handed its rows on).
    unclosed, unclosed_charges = add_batch(db, lane=LANES[1], seq=20, charges=2, closed=False)
    assert run_retention(dsn)[0] == 0
    assert set(live_charges) | set(unclosed_charges) <= hot_ids(db, "charges")
    assert {live, unclosed} <= hot_ids(db, "lineages")
    assert {live, unclosed} <= hot_ids(db, "charge_batches", "lineage_id")
    # Delete guard: even while archiving, only terminal journal rows may be deleted; a plain DELETE never.
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        db.execute("DELETE FROM paygate.lineages WHERE id = %s", (live,))
    with pytest.raises(psycopg.errors.InsufficientPrivilege), db.transaction():
        db.execute("SET LOCAL paygate.archiving = 'on'")
        db.execute("DELETE FROM paygate.charge_batches WHERE lineage_id = %s", (live,))
        db.execute("DELETE FROM paygate.lineages WHERE id = %s", (live,))


def test_each_lanes_highest_consumed_sequence_stays_for_allocation_and_key_retire_check(
        dsn: str, world: psycopg.Connection) -> None:
    db = world
    batches = [add_batch(db, lane=LANES[0], seq=seq, charges=1)[0] for seq in (30, 31, 32)]
    expired = add_lineage(db, lane=LANES[1], seq=40, state="expired")
    top_other = add_lineage(db, lane=LANES[1], seq=39, state="failed")
    consumed = {lane: db.execute(LAST_CONSUMED_SEQ_SQL, (lane,)).fetchone()[0] for lane in LANES}
    assert run_retention(dsn)[0] == 0
    assert archived_ids(db, "lineages") == {batches[0], batches[1], expired}
    assert {batches[2], top_other} <= hot_ids(db, "lineages")
    assert {lane: db.execute(LAST_CONSUMED_SEQ_SQL, (lane,)).fetchone()[0] for lane in LANES} == consumed


def test_deposit_and_relay_lineages_stay_for_replay(dsn: str, world: psycopg.Connection) -> None:
    """Deposit, credit and relay lineages are read by entitlement (replay's 'effect already on chain'
    check) for rows that stay hot: they are not retention's."""
    db = world
    kept = [add_lineage(db, lane=LANES[0], seq=50, purpose="deposit", entitlement="deposit:1:deposit"),
            add_lineage(db, lane=LANES[0], seq=51, purpose="relay", entitlement="relay:1"),
            add_lineage(db, lane=LANES[0], seq=52, purpose="relay", entitlement="bot_job:1", state="expired")]
    dead_hooks = add_webhooks(db, 2, status="dead")
    assert run_retention(dsn)[0] == 0
    assert set(kept) <= hot_ids(db, "lineages")
    assert set(dead_hooks) <= hot_ids(db, "webhook_outbox")  # `replay webhooks` needs them


def test_unresolved_findings_keep_what_they_name(dsn: str, world: psycopg.Connection) -> None:
    db = world
    _, drift_charges = add_batch(db, lane=LANES[0], seq=60, charges=2, account=OTHER_ACCOUNT)
    _, other_charges = add_batch(db, lane=LANES[0], seq=61, charges=2)
    gap_lane_lineage = add_lineage(db, lane=LANES[1], seq=60, state="expired")
    stuck_hook, free_hook = add_webhooks(db, 2)
    add_events(db, 2, quarantined=True)
    add_events(db, 2, ledger=100)  # not passed by the observer's cursor yet
    db.execute("""INSERT INTO paygate.findings (kind, subject, summary) VALUES
                  ('balance_drift', %s, 't'), ('lane_gap', %s, 't'), ('stuck', %s, 't')""",
               (OTHER_ACCOUNT, LANES[1], f"webhook:{stuck_hook}"))
    assert run_retention(dsn)[0] == 0
    assert set(drift_charges) <= hot_ids(db, "charges") and not set(other_charges) & hot_ids(db, "charges")
    assert gap_lane_lineage in hot_ids(db, "lineages")
    assert hot_ids(db, "webhook_outbox") == {stuck_hook}
    assert free_hook in archived_ids(db, "webhook_outbox")
    assert db.execute("SELECT count(*) FROM paygate.chain_events").fetchone()[0] == 4
    # Resolved findings no longer hold anything back.
    db.execute("UPDATE paygate.findings SET resolved_at = now(), resolved_by = 'test'")
    assert run_retention(dsn)[0] == 0
    assert not set(drift_charges) & hot_ids(db, "charges")
    assert gap_lane_lineage in archived_ids(db, "lineages")
    # An open contract-wide drift finding holds every charge.
    db.execute("INSERT INTO paygate.findings (kind, subject, summary) VALUES ('total_drift', 'contract', 't')")
    _, held = add_batch(db, lane=LANES[0], seq=62, charges=2)
    assert run_retention(dsn)[0] == 0
    assert set(held) <= hot_ids(db, "charges")


def test_a_subscriptions_latest_charge_and_each_workers_latest_runs_stay(dsn: str, world: psycopg.Connection) -> None:
    db = world
    sub = db.execute("""INSERT INTO paygate.subscriptions (account, amount, period, anchor, next_period_start,
                                                          next_period_index, idempotency_key)
                        VALUES (%s, 7, '1 day', '2026-01-01', timestamptz '2026-01-01' + 4 * interval '1 day', 4, 's1')
                        RETURNING id""", (ACCOUNT,)).fetchone()[0]
    periods = add_charges(db, 3, subscription=sub)
    add_runs(db, "gas", 5)
    add_runs(db, "gas", 2, age=OLD - 100, outcome="failed")  # newer than the ok ones, not ok
    add_runs(db, "funding", 3, age=YOUNG)
    assert run_retention(dsn)[0] == 0
    assert hot_ids(db, "charges") == {periods[-1]}
    db.execute("SELECT paygate.cancel_subscription(%s, 'test')", (sub,))
    assert run_retention(dsn)[0] == 0
    assert hot_ids(db, "charges") == set()  # a cancelled subscription charges no further period
    runs = db.execute("SELECT worker, outcome, count(*) FROM paygate.worker_runs WHERE instance_id = 'test' "
                      "GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
    # gas: the latest run (failed) and the latest successful one stay; funding's runs are young.
    assert runs == [("funding", "ok", 3), ("gas", "failed", 1), ("gas", "ok", 1)]


def test_batches_are_bounded_and_the_next_tick_continues(dsn: str, world: psycopg.Connection) -> None:
    db = world
    add_batch(db, lane=LANES[0], seq=70, charges=1)
    add_charges(db, 5 * MAX_BATCHES_PER_TABLE + 7, lineage=None)
    code, report = run_retention(dsn, "--batch", "5")
    assert code == 0
    assert report["last_details"]["moved"]["charges"] == 5 * MAX_BATCHES_PER_TABLE
    assert "charges" in report["last_details"]["backlog"]
    # Batches and lineages wait while charges (which point at them) still have a backlog.
    assert report["last_details"]["deferred"] == ["charge_batches", "lineages"]
    assert report["last_details"]["moved"]["webhook_outbox"] == 0  # independent tables still ran
    code, report = run_retention(dsn, "--batch", "5")
    assert code == 0 and report["last_details"]["moved"]["charges"] == 8
    assert report["last_details"]["moved"]["charge_batches"] == 1 and "deferred" not in report["last_details"]
    assert db.execute("SELECT count(*) FROM paygate.charges").fetchone()[0] == 0


def test_the_lock_makes_it_exclusive(dsn: str, world: psycopg.Connection) -> None:
    db = world
    add_webhooks(db, 3)
    key = WORKERS["retention"].lock_keys()
    assert key == [WORKERS["retention"].lock_keys()[0]] and WORKERS["retention"].single_writer
    db.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_NAMESPACE, key[0]))
    try:
        skipped = run_proc("run-tick", "retention", "--lock-wait", "0", dsn=dsn)
        assert skipped.code == 75, skipped.err
        assert db.execute("SELECT count(*) FROM paygate.webhook_outbox").fetchone()[0] == 3
    finally:
        db.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_NAMESPACE, key[0]))
    done = run_proc("run-tick", "retention", "--lock-wait", "0", dsn=dsn)
    assert done.code == 0, done.err
    assert db.execute("SELECT count(*) FROM paygate.webhook_outbox").fetchone()[0] == 0


def _each_row_in_exactly_one_place(db: psycopg.Connection, expected: dict[str, set[int]]) -> dict[str, int]:
    archived = {}
    for table, ids in expected.items():
        key = "lineage_id" if table == "charge_batches" else "id"
        hot, arch = hot_ids(db, table, key), archived_ids(db, table, key)
        assert not hot & arch, table
        assert (hot | arch) & ids == ids, table
        archived[table] = len(arch & ids)
    return archived


@pytest.mark.parametrize("point", ["retention.before_commit", "retention.after_batch"])
def test_a_kill_mid_run_loses_nothing(dsn: str, world: psycopg.Connection, point: str) -> None:
    db = world
    lineages, charges = set(), set()
    for seq in range(80, 86):
        lineage, ids = add_batch(db, lane=LANES[0], seq=seq, charges=4)
        lineages.add(lineage)
        charges |= set(ids)
    expected = {"charges": charges, "charge_batches": lineages, "lineages": lineages}
    environ_extra = {"PAYGATE_ENABLE_CRASHPOINTS": "1", "PAYGATE_CRASH_AT": point}
    killed = run_proc("run-tick", "retention", "--batch", "10", dsn=dsn, **environ_extra)
    assert killed.code == -9 and f"{MARKER} {point}" in killed.err, (killed.code, killed.err)
    archived = _each_row_in_exactly_one_place(db, expected)
    # Killed before its first commit: nothing moved. Killed after it: exactly that one batch moved.
    assert archived == {"charges": 0 if point == "retention.before_commit" else 10, "charge_batches": 0, "lineages": 0}
    totals = db.execute("SELECT settled_charges FROM paygate.retention_totals").fetchone()[0]
    assert totals == archived["charges"]  # the running total moved with exactly those rows
    done = run_proc("run-tick", "retention", "--batch", "10", dsn=dsn)
    assert done.code == 0, done.err
    archived = _each_row_in_exactly_one_place(db, expected)
    # All but the lane's highest consumed sequence (kept for allocation) are archived.
    assert archived == {"charges": len(charges), "charge_batches": len(lineages), "lineages": len(lineages) - 1}
    assert db.execute("SELECT settled_charges FROM paygate.retention_totals").fetchone()[0] == len(charges)


def test_a_window_shorter_than_key_retention_is_a_configuration_error(dsn: str, world: psycopg.Connection) -> None:
    add_webhooks(world, 2)
    result = run_cli("run-tick", "retention", dsn=dsn, PAYGATE_RETENTION_WINDOW="1d", PAYGATE_KEY_RETENTION="7d")
    assert result.code == 78 and "retention_window" in result.err
    assert world.execute("SELECT count(*) FROM paygate.webhook_outbox").fetchone()[0] == 2


def test_an_archive_missing_a_hot_column_moves_nothing(dsn: str, world: psycopg.Connection) -> None:
    db = world
    add_webhooks(db, 2)
    db.execute("ALTER TABLE paygate.webhook_outbox ADD COLUMN note text")
    result = run_cli("run-tick", "retention", dsn=dsn)
    assert result.code == 78 and "paygate_archive.webhook_outbox" in result.err
    assert db.execute("SELECT count(*) FROM paygate.webhook_outbox").fetchone()[0] == 2


def _relations_scanned(plan: Any, kind: str) -> set[str]:
    found: set[str] = set()
    if isinstance(plan, dict):
        if plan.get("Node Type") == kind and "Relation Name" in plan:
            found.add(plan["Relation Name"])
        for value in plan.values():
            found |= _relations_scanned(value, kind)
    elif isinstance(plan, list):
        for item in plan:
            found |= _relations_scanned(item, kind)
    return found


def test_each_pick_walks_its_index_not_the_history(world: psycopg.Connection) -> None:
    """With a large young history (nothing to move), each pick's plan reads its partial index and
    never scans the hot table it moves from."""
    db = world
    n = 20_000
    db.execute("""INSERT INTO paygate.lineages (purpose, entitlement, lane, state, source_seq, key_id, envelope,
                                                 inner_hash, outer_hash, max_time, signed_at_ledger, ledger, resolution,
                                                 resolved_at)
                  SELECT 'charge_batch', 'charge_batch:' || g, %s, 'applied', g, 'k1', '\\x00',
                         sha256(('i' || g)::bytea), sha256(('o' || g)::bytea), 1, 1, 1, 't', now()
                  FROM generate_series(1, %s) g""", (LANES[0], n))
    db.execute("INSERT INTO paygate.charge_batches (lineage_id, entries, outcome, closed_at)"
               " SELECT id, 1, 'applied', now() FROM paygate.lineages")
    db.execute("""INSERT INTO paygate.charges (charge_id, account, amount, idempotency_key, status, claimed_at,
                                               lineage_id, settled_at)
                  SELECT sha256(('c' || id)::bytea), %s, 7, 'k' || id, 'settled', now(), id, now()
                  FROM paygate.lineages""", (ACCOUNT,))
    add_events(db, n, age=YOUNG)
    add_webhooks(db, n, age=YOUNG)
    add_runs(db, "gas", n, age=YOUNG)
    db.execute("ANALYZE")
    for table in TABLES:
        plan = db.execute("EXPLAIN (FORMAT JSON) " + table.pick, {"window": 30 * 86400, "batch": 5000}).fetchone()[0]
        scanned = _relations_scanned(plan, "Seq Scan")
        assert not scanned & {"charges", "charge_batches", "lineages", "chain_events", "webhook_outbox",
                              "worker_runs"}, (table.name, json.dumps(plan))


def test_archived_settled_charges_still_reconcile_against_the_chain(tmp_path: Any, dsn: str,
                                                                    db: psycopg.Connection) -> None:
    """Real path: charges settled on a devnet through settlement and the observer, their rows aged
    past the window and archived; the reconciler's contract-wide check still matches the USDC the
    billing contract holds (the archived settled amount is counted from retention_totals)."""
    from tests.support.charges_support import admit_charge, charge_chain, fund, run_until_quiet
    from tests.support.devnet_support import start_devnet

    devnet = start_devnet(tmp_path / "devnet", lanes=3, users=3)
    try:
        chain = charge_chain(devnet, dsn, tmp_path / "keys")
        users = chain.genesis["users"][:2]
        fund(chain, db, [(user, 10_000_000) for user in users])
        for n in range(3):
            admit_charge(db, users[0]["public"], 1_000 + n, f"ret-{n}")
        run_until_quiet(chain, db)
        assert db.execute("SELECT count(*) FROM paygate.charges WHERE status = 'settled'").fetchone()[0] == 3
        before = chain.tick("reconciler")
        assert before.code == 0, before.err
        assert json.loads(before.out)["run_tick"]["last_details"]["total"]["regime"] == "match"
        # Age the history (a lineage's own timestamps never change: the journal's guard forbids it).
        db.execute("UPDATE paygate.charges SET settled_at = settled_at - interval '40 days'")
        db.execute("UPDATE paygate.charge_batches SET closed_at = closed_at - interval '40 days'")
        moved = chain.tick("retention")
        assert moved.code == 0, moved.err
        details = json.loads(moved.out)["run_tick"]["last_details"]
        assert details["moved"]["charges"] == 3 and details["moved"]["charge_batches"] >= 1
        assert db.execute("SELECT count(*) FROM paygate.charges").fetchone()[0] == 0
        after = chain.tick("reconciler")
        assert after.code == 0, after.err
        total = json.loads(after.out)["run_tick"]["last_details"]["total"]
        assert total["regime"] == "match", total
        assert total["charged_total"] == str(1_000 + 1_001 + 1_002)
    finally:
        devnet.stop()


def test_the_runtime_role_runs_retention(dsn: str, world: psycopg.Connection) -> None:
    """With what `migrate --roles` grants it (db/privileges.py): DELETE on the hot tables retention
    moves from, INSERT and SELECT on the archive, which stays append-only for it."""
    db = world
    _, charges = add_batch(db, lane=LANES[0], seq=90, charges=3)
    add_batch(db, lane=LANES[0], seq=91, charges=1)
    add_events(db, 3)
    add_webhooks(db, 2)
    assert run_cli("migrate", "--roles", dsn=dsn).code == 0
    as_runtime = psycopg.conninfo.make_conninfo(dsn, options="-c role=paygate_runtime")
    result = run_cli("run-tick", "retention", "--json", dsn=as_runtime)
    assert result.code == 0, result.err
    moved = json.loads(result.out)["run_tick"]["last_details"]["moved"]
    assert moved == {"charges": 4, "charge_batches": 2, "lineages": 1, "chain_events": 3, "webhook_outbox": 2,
                     "worker_runs": 0}
    assert set(charges) <= archived_ids(db, "charges")
    with psycopg.connect(as_runtime, autocommit=True) as runtime:
        for table in RETAINED:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                runtime.execute(f"DELETE FROM paygate_archive.{table}")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                runtime.execute(f"UPDATE paygate_archive.{table} SET archived_at = now()")
