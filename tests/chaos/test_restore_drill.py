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

`make test` runs it with PAYGATE_DRILL_SECONDS (default 30) of load; `make soak SCENARIO=restore
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
    DRILL_WEIGHTS,
    Disaster,
    LostDatabase,
    OperatorLog,
    chain_lane_sequences,
    check_money,
    check_recovery,
    db_now,
    drill_seconds,
    drill_supervisor,
    explain_and_accept_fences,
    first_money_ticks,
    in_flight,
    journal_consumed,
    landed_inner_hashes,
    money_moved,
    outcomes,
    read_lost,
    wait_quiet,
)
from tests.chaos.soak import AdminLedger, LoadGenerator, build_world, final_observer, soak_seed
from tests.support.pg import hand_edit
from tests.support.pg_backup import database_oid, restore_over, take_dump

QUIESCE_LIMIT = 150.0
PRE_T_LIMIT = 60.0  # at most this long past half the load's time waiting for money to move


def _report(lines: dict[str, Any], *sections: dict[str, Any]) -> str:
    out = []
    for part in (lines, *sections):
        out += [f"  {key:<46} {value}" for key, value in part.items()]
    return "\n".join(out)


@pytest.mark.soak
@pytest.mark.slow
def test_a_restore_from_a_dump_taken_mid_run_ends_every_unit_at_most_once_on_chain(tmp_path: Path) -> None:
    seconds, seed = drill_seconds(), soak_seed()
    print(f"\nrestore drill: seed={seed} load={seconds:.0f}s (PAYGATE_SOAK_SEED={seed} replays it)", flush=True)
    rng = random.Random(seed)
    world = build_world(tmp_path)
    supervisor = drill_supervisor(world.chain.environ, tmp_path / "logs", random.Random(rng.random()))
    load = LoadGenerator(world.dsn, AdminLedger(world.devnet.proc, world.devnet.genesis, world.devnet.log_path),
                         random.Random(rng.random()), max_subscriptions=3, weights=dict(DRILL_WEIGHTS))
    lost_dsn = make_conninfo(world.dsn, dbname="soak_lost")
    operator = OperatorLog()
    stats: dict[str, Any] = {}
    try:
        load.start()
        started = time.monotonic()
        # T: half the load's time, and not before money is moving (a charge settled on chain), so
        # deposits, charges and relays are in flight at T whatever the machine's speed.
        while time.monotonic() < started + seconds / 2 or (
                not money_moved(world.dsn) and time.monotonic() < started + seconds / 2 + PRE_T_LIMIT):
            supervisor.poll()
            time.sleep(0.25)
        dump = take_dump(world.dsn, tmp_path / "mid-run.dump")  # T: workers and load go on meanwhile
        at_t = time.monotonic()
        while time.monotonic() < at_t + seconds / 2:
            supervisor.poll()
            time.sleep(0.25)
        load.stop()
        killed = supervisor.sigkill_all()  # the disaster: every worker dies where it stood
        old_oid = database_oid(world.dsn)
        restore_over(world.dsn, dump.path, keep_old_as="soak_lost")
        lost, lost_statuses = read_lost(lost_dsn)
        with psycopg.connect(world.dsn, autocommit=True) as conn:
            at_t_units = in_flight(conn)
            journal_seq = journal_consumed(conn)
            max_lineage = int(conn.execute("SELECT coalesce(max(id), 0) FROM paygate.lineages").fetchone()[0])
        disaster = Disaster(lost=lost, lost_statuses=lost_statuses, in_flight_at_t=at_t_units,
                            chain_seq_at_recovery=chain_lane_sequences(world.chain),
                            journal_seq_at_recovery=journal_seq, max_lineage_at_recovery=max_lineage,
                            recovered_at=db_now(world.dsn), recovered_monotonic=time.monotonic())
        supervisor.start_all()

        def operator_step() -> None:
            with psycopg.connect(world.dsn, autocommit=True) as conn:
                fences = conn.execute("SELECT count(*) FROM paygate.findings WHERE kind = 'lane_fence' "
                                      "AND resolved_at IS NULL").fetchone()[0]
            if fences:
                explain_and_accept_fences(world.chain, world.dsn, lost, operator, landed_inner_hashes(world.chain))

        open_now, quiesce_seconds = wait_quiet(supervisor, world.dsn, limit=QUIESCE_LIMIT, each=operator_step)
        supervisor.stop()
        observer_code = final_observer(world)
        money = check_money(world.chain, world.dsn, disaster)
        recovery = check_recovery(world.dsn, disaster, chain_lane_sequences(world.chain))
        stats.update({
            "dump at T (seconds into the load, pg_dump's time, size)":
                f"{at_t - started:.0f}s, {dump.seconds:.1f}s, {dump.size} bytes",
            "workers SIGKILLed at the disaster": killed,
            "database oid (lost -> restored)": f"{old_oid} -> {database_oid(world.dsn)}",
            "units in flight at T": {k: len(v) for k, v in at_t_units.items()},
            **outcomes(world.dsn, disaster, world.chain),
            "first successful money tick after the restore (s)": (
                money_ticks := first_money_ticks(world.dsn, disaster.recovered_at)),
            "quiesce after the restore (s)": f"{quiesce_seconds:.0f}",
            "lane fences accepted by the operator (lane: seq)": {k[:8]: v for k, v in operator.accepted.items()},
            "lane fences the operator could not explain": operator.refused,
            "admitted": dict(load.admitted),
            "exit codes per worker (-9 = our SIGKILL)": supervisor.histogram(),
        })
    finally:
        load.stop()
        supervisor.kill_all()
        world.close()
    report = f"restore drill: seed={seed}\n{_report(stats, money.counts, recovery.counts)}"
    print(report, flush=True)
    (tmp_path / "restore-drill-report.txt").write_text(report + "\n")

    problems = [(v.invariant, v.detail) for v in recovery.violations + money.violations]
    if load.error is not None:
        problems.insert(0, ("the load generator ran without error", repr(load.error)))
    if supervisor.crashes:  # 70, or any code but 0, 1, 3, 69, 75, 143 and our own signals
        problems.insert(0, ("no tick process exited 70 (or any unexpected code)", "\n\n".join(
            f"{w} exited {c}:\n{tail}" for w, c, tail in supervisor.crashes[:3])))
    if any(open_now.values()):
        problems.append((f"quiet within {QUIESCE_LIMIT:.0f}s of the restore", f"still open: {open_now}"))
    if observer_code != 0:
        problems.append(("the final observer pass succeeds", f"exit {observer_code}"))
    if any(code != 0 for code in operator.undrain_codes):
        problems.append(("undrain after an accepted fence succeeds", f"exit codes {operator.undrain_codes}"))
    if problems:
        others = "; ".join(name for name, _ in problems[1:8])
        raise AssertionError(f"restore drill seed={seed}: first violated: {problems[0][0]}\n{problems[0][1]}\n"
                             + (f"(also violated: {others})\n" if others else "") + f"\n{report}")
    # The drill was a drill: money was in flight at T, and moved on chain after it.
    assert sum(len(v) for v in at_t_units.values()) > 0, f"nothing was in flight at T\n{report}"
    assert len(lost_statuses["charges"]) > len(at_t_units["charges"]) or lost.deposits, report
    assert any(v is not None for v in money_ticks.values()), f"no money tick moved anything after the restore\n{report}"


def _disaster(**over: Any) -> Disaster:
    base: dict[str, Any] = dict(lost=LostDatabase(), lost_statuses={}, in_flight_at_t={},
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
