"""Disaster-recovery drill 2: a failover to an asynchronous standby that lagged (docs/reliability.md
"Disaster recovery drills").

The same workers and load as the restore drill, on a primary with an asynchronous streaming standby
(tests/support/pg_replication.py), every process on the multi-host DSN (target_session_attrs =
read-write). At T the standby's replay is paused and it is cut off from the primary, so whatever
the primary commits after T is really lost; the load goes on, money lands on chain after T; then
the primary's postmaster is SIGKILLed (the workers, frozen for the instant the drill reads what the
primary held, carry on into a database that is gone: their ticks exit 69 while there is no writer),
and the standby is promoted. The workers find it on their own (the same DSN) and run until quiet,
the drill playing the runbook's operator for lanes fenced ahead of the journal. Then the restore
drill's checks against the chain (tests/chaos/dr.py), the RPO (WAL bytes between what the standby
had received and the primary's last LSN; the units and rows lost) and the RTO (the kill to each
money worker's first successful tick).

`make test` runs it with PAYGATE_DRILL_SECONDS (default 20) of load; `make soak SCENARIO=failover
DURATION=10m` runs it longer. PAYGATE_SOAK_SEED=N replays the load's choices."""

from __future__ import annotations

import random
import time
from pathlib import Path

import psycopg
import pytest

from tests.chaos.dr import (
    MONEY_WORKERS,
    Disaster,
    Drill,
    chain_lane_sequences,
    db_now,
    drill_seconds,
    first_money_ticks,
    in_flight,
    journal_consumed,
    raise_problems,
    read_lost,
    unit_statuses,
)
from tests.chaos.soak import soak_seed, world_on
from tests.support.pg_replication import ReplicatedPair

NO_WRITER_LIMIT = 30.0  # seconds after the kill to see a tick exit 69 before promoting anyway

ROWS_SQL = """
SELECT (SELECT count(*) FROM paygate.deposits) AS deposits, (SELECT count(*) FROM paygate.charges) AS charges,
       (SELECT count(*) FROM paygate.relays) AS relays, (SELECT count(*) FROM paygate.lineages) AS lineages,
       (SELECT count(*) FROM paygate.chain_events) AS chain_events, (SELECT count(*) FROM paygate.worker_runs) AS runs
"""


def _one(dsn: str, sql: str) -> object:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchone()[0]


def _rows(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(ROWS_SQL)
        return dict(zip([c.name for c in cursor.description], cursor.fetchone(), strict=True))


@pytest.mark.soak
@pytest.mark.slow
def test_a_failover_to_a_lagging_standby_ends_every_unit_at_most_once_on_chain(tmp_path: Path) -> None:
    seconds, seed = drill_seconds(), soak_seed()
    print(f"\nfailover drill: seed={seed} load={seconds:.0f}s (PAYGATE_SOAK_SEED={seed} replays it)", flush=True)
    rng = random.Random(seed)
    pair = ReplicatedPair()
    try:
        world = world_on(tmp_path, pair.multihost_dsn())
    except BaseException:
        pair.close()
        raise
    drill = Drill.start(world, seed, rng)
    standby = pair.standby_dsn()
    try:
        at_t = drill.load_until_t(seconds)
        # T: the standby stops receiving, then stops applying: the primary's commits from here on
        # never reach it. (Cut off first: a standby whose replay is paused does not act on the
        # reload that stops its walreceiver. What it received it replays, at promotion at the latest.)
        pair.cut_off()
        pair.pause_replay()
        replayed_lsn = str(_one(standby, "SELECT pg_last_wal_replay_lsn()::text"))
        received_lsn = str(_one(standby, "SELECT coalesce(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::text"))
        with psycopg.connect(standby, autocommit=True) as conn:
            at_t_units = in_flight(conn)  # what the standby has of T: what the promoted writer will know
        drill.run_for(seconds / 2)
        drill.load.stop()
        frozen = drill.supervisor.freeze()  # for the instant the primary is read: nothing commits
        primary_lsn = str(_one(pair.primary_dsn(), "SELECT pg_current_wal_lsn()::text"))
        lost, lost_statuses = read_lost(pair.primary_dsn())
        rows_on_primary = _rows(pair.primary_dsn())
        pair.kill_primary()
        killed = time.monotonic()
        killed_at = db_now(standby)  # the same host's clock, read from the survivor
        drill.supervisor.thaw()
        drill.run_for(0, until=lambda: any(code == 69 and end > killed for _, code, end in drill.supervisor.runs),
                      limit=NO_WRITER_LIMIT)
        no_writer = sorted({w for w, code, end in drill.supervisor.runs if code == 69 and end > killed})
        pair.promote()
        promoted = time.monotonic()
        with psycopg.connect(world.dsn, autocommit=True) as conn:
            known = unit_statuses(conn)
            journal_seq = journal_consumed(conn)
            max_lineage = int(conn.execute("SELECT coalesce(max(id), 0) FROM paygate.lineages").fetchone()[0])
            wal_lost = int(conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)",
                                        (primary_lsn, received_lsn)).fetchone()[0])
        rows_promoted = _rows(world.dsn)
        disaster = Disaster(lost=lost, lost_statuses=lost_statuses, in_flight_at_t=at_t_units, known_at_recovery=known,
                            chain_seq_at_recovery=chain_lane_sequences(world.chain),
                            journal_seq_at_recovery=journal_seq, max_lineage_at_recovery=max_lineage,
                            recovered_at=db_now(world.dsn), recovered_monotonic=promoted)
        lost_units = {t: len(set(lost_statuses[t]) - set(known[t])) for t in lost_statuses}
        drill.stats.update({
            "T (s into the load)": f"{at_t:.0f}",
            "workers frozen at the kill": frozen,
            "RPO: WAL lost (primary's last LSN - standby's received)":
                f"{wal_lost} bytes ({primary_lsn} - {received_lsn}; replayed at T {replayed_lsn})",
            "RPO: units lost (admitted after T)": lost_units,
            "RPO: rows lost (primary at the kill - promoted)": {k: rows_on_primary[k] - rows_promoted[k]
                                                               for k in rows_on_primary},
            "kill to promotion (s)": f"{promoted - killed:.1f}",
            "workers whose tick exited 69 with no writer": no_writer,
        })
        money, recovery, problems = drill.recover(disaster)
        rto = first_money_ticks(world.dsn, killed_at, moved=False)
        drill.stats["RTO: kill to first successful tick (s)"] = rto
        drill.stats["kill to first tick that moved money (s)"] = first_money_ticks(world.dsn, killed_at)
    finally:
        drill.stop_loads()
        drill.supervisor.kill_all()
        world.close()
        pair.close()
    report = drill.report("failover drill", money.counts, recovery.counts)
    raise_problems("failover drill", seed, problems, report)
    # The drill was a drill: the failover lost commits, ticks saw no writer, then every money worker worked.
    assert wal_lost > 0 and any(lost_units.values()), f"the failover lost nothing\n{report}"
    assert no_writer, f"no tick exited 69 while there was no writer\n{report}"
    assert all(rto[w] is not None for w in MONEY_WORKERS), \
        f"a money worker never ticked ok after the failover\n{report}"
    assert recovery.counts["lineages built after recovery"] > 0, f"no lineage was built after the failover\n{report}"
