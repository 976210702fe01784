"""The restore gate (docs/architecture.md §8) on the money path, against a real devnet and real
restores (pg_dump -> pg_restore into a new database, tests/support/pg_backup.py restored_copy):

- a restored database signs nothing new (the funding tick is stalled, exit 1, naming the halt)
  while its live lineage is still driven; `recover-check` keeps the halt while that lineage is live
  (exit 3, the blocker named), clears it once nothing is (exit 0), and the work settles;
- lanes the chain used after the backup was taken (the old database went on) are fenced by the
  recovery pass with the engine's evidence, and the halt then clears;
- with no identity change, two lanes ahead of the journal at once set the restore halt (recovery's
  cheap check); one lane ahead is only that lane's fence;
- a pass whose identity changed before it clears keeps the halt."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from paygate_cli.errors import ExitCode
from paygate_cli.journal import restore_gate
from tests.support.chain_env import ChainEnv, admit_deposit, chain_environ, recovery_environ, sign_deposit
from tests.support.cli import run_cli
from tests.support.devnet_support import start_devnet
from tests.support.drill_support import crash_tick
from tests.support.funding import wait_for_leases
from tests.support.pg import PgServer
from tests.support.pg_backup import oid_of, restored_copy

AMOUNT = 5_000_000


@pytest.fixture
def chain(tmp_path: Path, dsn: str) -> Iterator[ChainEnv]:
    devnet = start_devnet(tmp_path / "devnet", lanes=2, users=3)
    yield ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))
    devnet.stop()


@pytest.fixture
def restored(pg_server: PgServer) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for dsn in made:
        pg_server.drop_database(dsn)


def on(chain: ChainEnv, dsn: str) -> ChainEnv:
    """The same deployment pointed at another database (the restored one)."""
    return ChainEnv(chain.devnet, dsn, {**chain.environ, "PAYGATE_DATABASE_URL": dsn})


def restore(pg_server: PgServer, chain: ChainEnv, tmp_path: Path, restored: list[str]) -> tuple[ChainEnv,
                                                                                                 psycopg.Connection]:
    copy = restored_copy(pg_server, chain.dsn, tmp_path)
    restored.append(copy)
    return on(chain, copy), psycopg.connect(copy, autocommit=True)


def admit(chain: ChainEnv, db: psycopg.Connection, user: int, key: str) -> int:
    u = chain.genesis["users"][user]
    entry, nonce, expiration = sign_deposit(chain.devnet, u["secret"], AMOUNT)
    return admit_deposit(db, u["public"], AMOUNT, entry, nonce, expiration, key)


def status_of(db: psycopg.Connection, deposit: int) -> str:
    return db.execute("SELECT status FROM paygate.deposits WHERE id = %s", (deposit,)).fetchone()[0]


def settle(chain: ChainEnv, db: psycopg.Connection, deposit: int) -> None:
    for _ in range(10):
        result = chain.tick("funding", "--once")
        assert result.code in (0, 1), result.err[-2000:]
        if status_of(db, deposit) == "settled":
            return
        chain.devnet.close_ledger()
    raise AssertionError(f"deposit {deposit} did not settle")


def recover_check(chain: ChainEnv, *args: str) -> tuple[int, dict[str, Any], str]:
    result = run_cli("recover-check", "--yes", "--json", *args, environ=recovery_environ(chain.environ))
    return result.code, json.loads(result.out)["recover_check"], result.err


def restore_halts(db: psycopg.Connection) -> list[str]:
    return [reason for (reason,) in db.execute("SELECT reason FROM paygate.halts WHERE kind = 'restore'")]


def audits(db: psycopg.Connection, action: str) -> list[tuple[str, dict[str, Any]]]:
    return db.execute("SELECT actor, details FROM paygate.audit_log WHERE action = %s ORDER BY id", (action,)
                      ).fetchall()


def test_a_restored_database_signs_nothing_new_drives_what_is_live_and_reopens_after_a_clean_pass(
        pg_server: PgServer, chain: ChainEnv, db: psycopg.Connection, tmp_path: Path, restored: list[str]) -> None:
    assert chain.tick("funding", "--once").code == 0  # the identity recorded
    deposit = admit(chain, db, 0, "gate-1")
    crash_tick(chain.environ, "funding", "funding.after_broadcast")  # its deposit lineage sent, then died
    [(lineage_id, lane, seq)] = db.execute("SELECT id, lane, source_seq FROM paygate.lineages "
                                           "WHERE state IN ('signed', 'sent')").fetchall()
    chain.devnet.close_ledger()  # it lands on chain
    copy, new = restore(pg_server, chain, tmp_path, restored)
    with new:
        # A dry run before any tick writes nothing, not even the halt, and says the identity changed.
        dry = run_cli("recover-check", "--dry-run", environ=recovery_environ(copy.environ))
        assert dry.code == ExitCode.NEEDS_HUMAN, dry.err  # the live lineage blocks
        assert "no restore halt set (but the database's identity differs from the recorded one" in dry.out
        assert not restore_halts(new) and not audits(new, "restore_check")
        # Recovery's tick: its heartbeat sets the halt; the live lineage (its lease the dead owner's,
        # within the grace window) is not taken over, so the pass leaves the halt: stalled, exit 1,
        # naming the blocker. A recovery tick writes no audit row for a pass that did not clear.
        tick = run_cli("run-tick", "recovery", "--once", "--json", environ=recovery_environ(copy.environ))
        assert tick.code == ExitCode.FAILED, tick.err[-2000:]
        assert f"the restore halt stays: 1 blocker(s): lineage {lineage_id}" in tick.err
        assert json.loads(tick.out)["run_tick"]["last_details"]["restore_gate"]["live_lineages"] == 1
        assert restore_halts(new) and not audits(new, "restore_check")
        # recover-check: the same blocker, never robbed: exit 3, the halt stays, the check audited.
        code, report, err = recover_check(copy)
        assert code == ExitCode.NEEDS_HUMAN, err
        assert restore_halts(new) and "a recreated database" in report["restore_halt"]["reason"]
        [unit] = report["units"]
        assert (unit["lineage_id"], unit["lane"], unit["source_seq"]) == (lineage_id, lane, seq)
        assert unit["state"] in ("signed", "sent") and unit["lease_expires_at"] is not None
        [blocked] = [lane_check for lane_check in report["lanes"] if lane_check["lane"] == lane]
        assert blocked["verdict"] == "blocked" and f"lineage {lineage_id} is live" in blocked["detail"]
        assert not report["clean"] and not report["cleared"]
        [(actor, details)] = audits(new, "restore_check")
        assert details["clean"] is False and any(f"lineage {lineage_id}" in b for b in details["blockers"])

        # The funding worker still drives its lineage (resolved applied), but signs nothing new: the
        # credit waits, and the tick says why (exit 1), not "no free lane".
        wait_for_leases(new)  # the dead owner's lease lapses: the worker's own claim takes the row
        result = copy.tick("funding", "--once")
        assert result.code == ExitCode.FAILED, result.err[-2000:]
        assert "submissions closed by the restore halt: the database changed since" in result.err
        assert "run `paygate recover-check`" in result.err
        assert new.execute("SELECT state FROM paygate.lineages WHERE id = %s", (lineage_id,)).fetchone()[0] == "applied"
        assert new.execute("SELECT count(*) FROM paygate.lineages WHERE entitlement LIKE %s AND purpose = 'credit' "
                           "AND source_seq IS NOT NULL", (f"deposit:{deposit}:%",)).fetchone()[0] == 0
        assert status_of(new, deposit) == "pending"

        # Nothing live, every lane where the journal left it: the pass clears the halt and records
        # the restored database's identity, audited.
        code, report, err = recover_check(copy)
        assert code == ExitCode.OK, err
        assert report["clean"] and report["cleared"] and not restore_halts(new)
        assert {c["lane"]: c["verdict"] for c in report["lanes"]} == {lane: "ok" for lane in
                                                                      [c["lane"] for c in report["lanes"]]}
        recorded_oid, recorded_by = new.execute("SELECT database_oid, recorded_by FROM paygate.db_identity"
                                                ).fetchone()
        assert recorded_oid == oid_of(new) and recorded_by == report_actor(copy)
        [(actor, details)] = audits(new, "restore_clear")
        assert actor == recorded_by and details["cleared"] is True and details["lanes"] == {"ok": 2}
        settle(copy, new, deposit)
        assert restore_halts(new) == []  # the ticks after the pass see the recorded identity


def report_actor(chain: ChainEnv) -> str:
    import getpass

    return chain.environ.get("PAYGATE_OPERATOR") or getpass.getuser()


def test_lanes_the_chain_used_after_the_backup_are_fenced_with_evidence_and_the_halt_clears(
        pg_server: PgServer, chain: ChainEnv, db: psycopg.Connection, tmp_path: Path, restored: list[str]) -> None:
    settle(chain, db, admit(chain, db, 0, "before-backup"))  # both lanes used: deposit, then credit
    copy, new = restore(pg_server, chain, tmp_path, restored)
    # The old database lived on after the backup: another deposit moved both lanes on chain.
    settle(chain, db, admit(chain, db, 1, "after-backup"))
    lost = {lane: (seq, inner, outer) for lane, seq, inner, outer in db.execute(
        "SELECT DISTINCT ON (lane) lane, source_seq, encode(inner_hash, 'hex'), encode(outer_hash, 'hex') "
        "FROM paygate.lineages WHERE state = 'applied' ORDER BY lane, source_seq DESC")}
    with new:
        # Recovery's tick on the restored database: its heartbeat sets the halt, its pass fences both
        # lanes (exit 3: a human must look), nothing else is unresolved, so the halt clears.
        result = run_cli("run-tick", "recovery", "--once", "--json", environ=recovery_environ(copy.environ))
        assert result.code == ExitCode.NEEDS_HUMAN, result.err[-3000:]
        assert "restore.halt_set" in result.err and "journal.lane_fenced" in result.err
        gate = json.loads(result.out)["run_tick"]["last_details"]["restore_gate"]
        assert gate["fenced_now"] == 2 and gate["lanes"] == {"fenced": 2} and gate["cleared"] is True
        assert not restore_halts(new)
        for lane, (seq, inner, outer) in lost.items():
            status, drained_by = new.execute("SELECT status, drained_by FROM paygate.lanes WHERE address = %s",
                                             (lane,)).fetchone()
            assert (status, drained_by) == ("drained", "paygate:chain_ahead_of_journal")
            [evidence] = [d for (d,) in new.execute("SELECT details FROM paygate.findings WHERE kind = 'lane_fence' "
                                                    "AND subject = %s AND resolved_at IS NULL", (lane,))]
            assert evidence["chain_seq"] == seq and evidence["range"][1] == seq
            # The transactions the restored journal lost, found on chain by their source and sequence.
            assert [t["seq"] for t in evidence["transactions"]] == [seq]
            assert evidence["transactions"][0]["hash"] in (inner, outer)
        # A second pass: the lanes are fenced already (a human's), nothing new is written.
        code, report, _ = recover_check(copy)
        assert code == ExitCode.OK and report["fenced_now"] == 0 and report["lanes"] == report["lanes"]
        assert all(c["verdict"] == "fenced" and "fenced already" in c["detail"] for c in report["lanes"])
        assert new.execute("SELECT count(*) FROM paygate.findings WHERE kind = 'lane_fence'").fetchone()[0] == 2


def test_two_lanes_ahead_without_an_identity_change_set_the_restore_halt_one_lane_does_not(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    settle(chain, db, admit(chain, db, 0, "used"))
    lanes = [lane for (lane,) in db.execute("SELECT address FROM paygate.lanes ORDER BY address")]
    recovery = recovery_environ(chain.environ)
    # One lane used outside the journal: a lane fence's business (the engine's), not a restore.
    chain.devnet.rpc("devnet_consumeSequence", {"account": lanes[0]})
    chain.devnet.close_ledger()
    one = run_cli("run-tick", "recovery", "--once", environ=recovery)
    assert one.code == ExitCode.OK, one.err[-2000:]
    assert not restore_halts(db) and db.execute("SELECT count(*) FROM paygate.lanes WHERE status <> 'active'"
                                                ).fetchone()[0] == 0
    # Both at once: the database went back in time without changing identity (a file-level snapshot).
    chain.devnet.rpc("devnet_consumeSequence", {"account": lanes[1]})
    chain.devnet.close_ledger()
    both = run_cli("run-tick", "recovery", "--once", "--json", environ=recovery)
    assert both.code == ExitCode.NEEDS_HUMAN, both.err[-2000:]
    assert "restore.halt_set" in both.err and "lanes ahead of the journal" in both.err
    [(actor, details)] = audits(db, "restore_halt")
    assert actor.startswith("recovery:") and sorted(details["lanes"]) == lanes
    # The same tick's pass fenced both with their evidence; nothing else was unresolved, so it cleared.
    gate = json.loads(both.out)["run_tick"]["last_details"]["restore_gate"]
    assert gate["lanes"] == {"fenced": 2} and gate["cleared"] is True and not restore_halts(db)
    assert [who for (who,) in db.execute("SELECT drained_by FROM paygate.lanes ORDER BY address")] == \
        ["paygate:chain_ahead_of_journal"] * 2


def test_a_pass_whose_identity_changed_before_it_clears_keeps_the_halt(
        pg_server: PgServer, db: psycopg.Connection) -> None:
    """A clean pass (no lane, nothing live) that started on another database's identity (a real one:
    a second database of this server, another OID), as a pass would that a promotion overtook:
    clearing re-reads the identity in its transaction, finds it changed, and keeps the halt."""
    db.execute("SELECT paygate.check_db_identity('test')")
    db.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('restore', 'a drill', 'test')")
    other = pg_server.create_database()
    try:
        with psycopg.connect(other, autocommit=True) as elsewhere:
            started_on = restore_gate.read_identity(elsewhere)
    finally:
        pg_server.drop_database(other)
    assert started_on != restore_gate.read_identity(db)
    result = restore_gate.PassResult(restore_gate.restore_halt(db), started_on, [], [], 0, dry_run=False)
    assert result.clean
    restore_gate._clear(db, result, "test", logging.getLogger("test"))
    assert not result.cleared and result.kept_because is not None and "changed during the pass" in result.kept_because
    assert restore_halts(db) == ["a drill"]
    assert db.execute("SELECT count(*) FROM paygate.audit_log WHERE action = 'restore_clear'").fetchone()[0] == 0
    # Started on this database's own identity, the same clear lifts the halt.
    result.identity = restore_gate.read_identity(db)
    restore_gate._clear(db, result, "test", logging.getLogger("test"))
    assert result.cleared and restore_halts(db) == []
