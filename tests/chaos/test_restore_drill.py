"""Disaster-recovery drill 1: a restore from a dump taken mid-run (docs/reliability.md "Disaster
recovery drills").

Every money worker runs in looping `paygate run-tick` processes on a private Postgres and the
devnet while the load generator admits deposits, one-off charges, subscriptions and relays. At T a
real `pg_dump -Fc` is taken while the load goes on; the load keeps going, so deposits, charge
batches, subscription charges and relays land on chain after T; then every worker is SIGKILLed and
the dump restored over the same database name (a new database, so a new OID; the db_identity row
the dump carried names the old one). The workers start again on the restored database and run
until quiet, the drill playing the runbook's operator for lanes fenced ahead of the journal
(runbooks/lane-fenced-chain-ahead.md: accepted only once every sequence of the range is a landed
transaction of ours). Then, against the chain: see tests/chaos/dr.py.

`make test` runs it with PAYGATE_DRILL_SECONDS (default 20) of load; `make soak SCENARIO=restore
DURATION=10m` runs it longer. PAYGATE_SOAK_SEED=N replays the load's choices."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.chaos.dr import (
    Disaster,
    Drill,
    LostDatabase,
    chain_lane_sequences,
    check_recovery,
    db_now,
    drill_seconds,
    first_money_ticks,
    in_flight,
    journal_consumed,
    raise_problems,
    read_lost,
    unit_statuses,
)
from tests.chaos.soak import build_world, soak_seed
from tests.support.pg import hand_edit
from tests.support.pg_backup import database_oid, restore_over, take_dump


@pytest.mark.soak
@pytest.mark.slow
def test_a_restore_from_a_dump_taken_mid_run_ends_every_unit_at_most_once_on_chain(tmp_path: Path) -> None:
    seconds, seed = drill_seconds(), soak_seed()
    print(f"\nrestore drill: seed={seed} load={seconds:.0f}s (PAYGATE_SOAK_SEED={seed} replays it)", flush=True)
    rng = random.Random(seed)
    world = build_world(tmp_path)
    lost_dsn = make_conninfo(world.dsn, dbname="soak_lost")
    drill = Drill.start(world, seed, rng)
    try:
        at_t = drill.load_until_t(seconds)
        dump = take_dump(world.dsn, tmp_path / "mid-run.dump")  # T: workers and load go on meanwhile
        drill.run_for(seconds / 2)
        drill.load.stop()
        killed = drill.supervisor.sigkill_all()  # the disaster: every worker dies where it stood
        old_oid = database_oid(world.dsn)
        restore_over(world.dsn, dump.path, keep_old_as="soak_lost")
        lost, lost_statuses = read_lost(lost_dsn)
        with psycopg.connect(world.dsn, autocommit=True) as conn:
            at_t_units = in_flight(conn)
            known_at_recovery = unit_statuses(conn)
            journal_seq = journal_consumed(conn)
            max_lineage = int(conn.execute("SELECT coalesce(max(id), 0) FROM paygate.lineages").fetchone()[0])
        disaster = Disaster(lost=lost, lost_statuses=lost_statuses, in_flight_at_t=at_t_units,
                            known_at_recovery=known_at_recovery,
                            chain_seq_at_recovery=chain_lane_sequences(world.chain),
                            journal_seq_at_recovery=journal_seq, max_lineage_at_recovery=max_lineage,
                            recovered_at=db_now(world.dsn), recovered_monotonic=time.monotonic())
        drill.supervisor.start_all()
        drill.stats.update({
            "dump at T (s into the load; pg_dump's time; size)": f"{at_t:.0f}s; {dump.seconds:.1f}s; {dump.size} B",
            "workers SIGKILLed at the disaster": killed,
            "database oid (lost -> restored)": f"{old_oid} -> {database_oid(world.dsn)}",
        })
        money, recovery, problems = drill.recover(disaster)
        money_ticks = first_money_ticks(world.dsn, disaster.recovered_at)
        drill.stats["first successful money tick after the restore (s)"] = money_ticks
    finally:
        drill.stop_loads()
        drill.supervisor.kill_all()
        world.close()
    report = drill.report("restore drill", money.counts, recovery.counts)
    raise_problems("restore drill", seed, problems, report)
    # The drill was a drill: money was in flight at T, commits were lost, and money moved after.
    assert sum(len(v) for v in at_t_units.values()) > 0, f"nothing was in flight at T\n{report}"
    assert any(set(lost_statuses[t]) - set(known_at_recovery[t]) for t in lost_statuses), \
        f"the restore lost no unit: nothing was admitted after T\n{report}"
    assert any(v is not None for v in money_ticks.values()), f"no money tick moved anything after the restore\n{report}"
    assert recovery.counts["lineages built after recovery"] > 0, f"no lineage was built after the restore\n{report}"


def _disaster(**over: Any) -> Disaster:
    base: dict[str, Any] = dict(lost=LostDatabase(), lost_statuses={}, in_flight_at_t={}, known_at_recovery={},
                                chain_seq_at_recovery={}, journal_seq_at_recovery={}, max_lineage_at_recovery=0,
                                recovered_at=None, recovered_monotonic=0.0)
    return Disaster(**{**base, **over})


LANE = "G" + "A" * 55


def test_the_restore_checks_fail_without_the_halt_or_with_a_lane_reused(db: psycopg.Connection, dsn: str) -> None:
    """What the drill asserts really fails: a restored database whose restore halt was never set, a
    lane the chain had ahead of the journal with no fence, a lineage built at a sequence the chain
    had consumed; and passes once the halt was set and cleared and the lane fenced."""
    db.execute("INSERT INTO paygate.lanes (address) VALUES (%s)", (LANE,))
    db.execute("INSERT INTO paygate.lineages (purpose, entitlement, lane, state, source_seq, key_id, envelope, "
               "inner_hash, outer_hash, max_time, signed_at_ledger, fee_ops, resource_fee, ledger) VALUES "
               "('deposit', 'deposit:1:deposit', %s, 'applied', 10, 'k', '\\x00', %s, %s, 1, 1, 2, 0, 5)",
               (LANE, b"\x01" * 32, b"\x02" * 32))
    disaster = _disaster(chain_seq_at_recovery={LANE: 12}, journal_seq_at_recovery=journal_consumed(db),
                         max_lineage_at_recovery=int(db.execute("SELECT max(id) FROM paygate.lineages").fetchone()[0]))
    # Built after the recovery at 12, a sequence the chain had consumed (by a lost transaction).
    db.execute("INSERT INTO paygate.lineages (purpose, entitlement, lane, state, source_seq, key_id, envelope, "
               "inner_hash, outer_hash, max_time, signed_at_ledger, fee_ops, resource_fee) VALUES "
               "('deposit', 'deposit:2:deposit', %s, 'expired', 12, 'k', '\\x00', %s, %s, 1, 1, 2, 0)",
               (LANE, b"\x03" * 32, b"\x04" * 32))
    found = {v.invariant: v.detail for v in check_recovery(dsn, disaster, {LANE: 12}).violations}
    assert "no 'restore_halt' audit row" in found["the restore halt was set after the restore"]
    assert "chain 12, journal 10" in found["every lane ahead of the restored journal fenced with evidence"]
    assert "'source_seq': 12" in found["no lane reused at a sequence the chain had consumed"]
    assert "the recovered database's identity is recorded once the pass is clean" in found

    hand_edit(db, "DELETE FROM paygate.lineages WHERE entitlement = 'deposit:2:deposit'")
    db.execute("SELECT paygate.check_db_identity('drill-test')")  # records this database's identity
    db.execute("UPDATE paygate.db_identity SET database_oid = database_oid + 1")  # as the dump carried it
    assert db.execute("SELECT paygate.check_db_identity('drill-test')").fetchone()[0]  # the halt, audited
    found = {v.invariant for v in check_recovery(dsn, disaster, {LANE: 12}).violations}
    assert "the restore halt was set after the restore" not in found
    assert "the restore halt was cleared by the recovery pass" in found
    db.execute("DELETE FROM paygate.halts WHERE kind = 'restore'")
    assert "the restore halt was cleared by the recovery pass" in {
        v.invariant for v in check_recovery(dsn, disaster, {LANE: 12}).violations}  # gone, but not by a pass
    db.execute("INSERT INTO paygate.audit_log (actor, action, target) VALUES ('recovery', 'restore_clear', 'restore')")
    db.execute("UPDATE paygate.db_identity SET database_oid = (SELECT oid FROM pg_database "
               "WHERE datname = current_database())")
    db.execute("INSERT INTO paygate.findings (kind, subject, summary, details) VALUES ('lane_fence', %s, 'ahead', "
               "'{\"range\": [11, 12], \"chain_seq\": 12, \"journal_seq\": 10}')", (LANE,))
    assert check_recovery(dsn, disaster, {LANE: 12}).violations == []
