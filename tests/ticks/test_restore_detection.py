"""Every tick compares the database's identity with the recorded one in its heartbeat round trip
(ticks/runner.py, sql/functions/check_db_identity.sql). A real restore from a real dump: `pg_dump`
of the test database, `pg_restore` into a new database (a new OID; the dump carries the old
db_identity row), a tick pointed at it. No devnet: the webhooks worker reads no chain."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.support.cli import run_cli, run_proc
from tests.support.pg import PgServer
from tests.support.pg_backup import oid_of, restored_copy


@pytest.fixture
def restored(pg_server: PgServer) -> Iterator[list[str]]:
    """Restored databases to drop at the end."""
    made: list[str] = []
    yield made
    for dsn in made:
        pg_server.drop_database(dsn)


def identity(db: psycopg.Connection) -> tuple[str, int, int, str]:
    return db.execute("SELECT system_identifier, timeline, database_oid, recorded_by FROM paygate.db_identity"
                      ).fetchone()


def test_a_restored_database_is_halted_by_its_first_tick_and_keeps_the_first_reason(
        pg_server: PgServer, dsn: str, db: psycopg.Connection, tmp_path: Path, restored: list[str]) -> None:
    first = run_cli("run-tick", "webhooks", "--once", dsn=dsn, PAYGATE_INSTANCE_ID="host-a")
    assert first.code == 0, first.err
    system, timeline, recorded_oid, by = identity(db)
    assert (recorded_oid, by) == (oid_of(db), "webhooks:host-a")  # the first tick records it

    copy = restored_copy(pg_server, dsn, tmp_path)
    restored.append(copy)
    # Two ticks in one process: the halt is set once, logged once; each tick still runs (exit 0:
    # the webhooks worker moves no money, and live lineages elsewhere must still be driven).
    ticks = run_proc("run-tick", "webhooks", "--every", "0.2s", "--for", "0.5s", dsn=copy,
                     PAYGATE_INSTANCE_ID="host-b")
    assert ticks.code == 0, ticks.err
    assert ticks.err.count("restore.halt_set") == 1, ticks.err
    with psycopg.connect(copy, autocommit=True) as new:
        new_oid = oid_of(new)
        assert new_oid != recorded_oid
        assert new.execute("SELECT count(*) FROM paygate.worker_runs WHERE instance_id = 'host-b'").fetchone()[0] >= 2
        [(reason, set_by)] = new.execute("SELECT reason, set_by FROM paygate.halts WHERE kind = 'restore'").fetchall()
        assert f"a recreated database (oid {new_oid}, recorded {recorded_oid}" in reason and set_by == "webhooks:host-b"
        assert "paygate recover-check" in reason
        # The recorded identity is left as it was: every later tick sees the difference too.
        assert identity(new) == (system, timeline, recorded_oid, by)
        [(actor, details)] = new.execute("SELECT actor, details FROM paygate.audit_log WHERE action = 'restore_halt'"
                                         ).fetchall()
        assert actor == "webhooks:host-b" and details["recorded"]["database_oid"] == recorded_oid
        assert details["now"]["database_oid"] == new_oid and details["reason"] == reason

        # A later tick (another process) keeps the first reason and writes no second audit row.
        new.execute("UPDATE paygate.halts SET reason = 'first reason, kept' WHERE kind = 'restore'")
        again = run_cli("run-tick", "webhooks", "--once", dsn=copy, PAYGATE_INSTANCE_ID="host-c")
        assert again.code == 0, again.err
        assert new.execute("SELECT reason FROM paygate.halts WHERE kind = 'restore'").fetchone()[0] == \
            "first reason, kept"
        assert new.execute("SELECT count(*) FROM paygate.audit_log WHERE action = 'restore_halt'").fetchone()[0] == 1

    # The database the dump came from is still itself: its ticks set nothing.
    assert run_cli("run-tick", "webhooks", "--once", dsn=dsn).code == 0
    assert db.execute("SELECT count(*) FROM paygate.halts").fetchone()[0] == 0
    assert conninfo_to_dict(copy)["dbname"] != conninfo_to_dict(dsn)["dbname"]


def test_a_promoted_standby_is_halted_by_its_first_tick_for_its_new_timeline() -> None:
    """A real promotion (tests/support/pg_replication.py): the same cluster (system identifier) and
    database (OID), a new timeline. The first tick on the new primary sets the halt naming it."""
    from tests.support.pg_replication import ReplicatedPair

    with ReplicatedPair() as pair:
        assert run_cli("run-tick", "webhooks", "--once", dsn=pair.primary_dsn()).code == 0
        with psycopg.connect(pair.primary_dsn(), autocommit=True) as primary:
            system, timeline, oid, _ = identity(primary)
        # The first record commits relaxed with the tick's heartbeat (it may still sit in the
        # primary's WAL buffers, past the write position wait_caught_up reads): wait until the
        # standby has it, as it would long before any real failover.
        deadline = time.monotonic() + 10
        with psycopg.connect(pair.standby_dsn(), autocommit=True) as standby:
            while standby.execute("SELECT count(*) FROM paygate.db_identity").fetchone()[0] == 0:
                assert time.monotonic() < deadline, "the recorded identity never reached the standby"
                time.sleep(0.05)
        pair.kill_primary()
        pair.promote()
        tick = run_cli("run-tick", "webhooks", "--once", dsn=pair.multihost_dsn())
        assert tick.code == 0, tick.err
        assert "restore.halt_set" in tick.err
        with psycopg.connect(pair.standby_dsn(), autocommit=True) as promoted:
            [reason] = [r for (r,) in promoted.execute("SELECT reason FROM paygate.halts WHERE kind = 'restore'")]
            assert f"timeline {timeline + 1}, recorded {timeline} (a promotion" in reason
            assert "a different cluster" not in reason and "a recreated database" not in reason
            assert identity(promoted)[:3] == (system, timeline, oid)  # kept until a clean pass
