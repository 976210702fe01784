"""Crash drills for settlement and the observer: a real `paygate run-tick` process is SIGKILLed at a
named crash point, then ticks run until quiet, and the drill invariants (docs/architecture.md §1) hold: each charge id
debited at most once on chain, every admitted charge settled or failed, cached balances equal
on-chain balances, each event applied once, the cursor never moved backwards.

Credential versions: these drills are deliberately not run with both SOROBAN_CREDENTIALS
ADDRESS (v1) and ADDRESS_V2. `charge_batch` carries no user authorisation: its only require_auth is
the operator's, and the operator is the lane that is the transaction's source, so simulation records
a SOURCE_ACCOUNT entry whatever `useUpgradedAuth` says and no address credential is ever signed. The
deposits that fund the accounts here go through funding, whose drills cover both versions
(tests/workers/test_funding_drills.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.chain_env import ChainEnv
from tests.support.charges_support import (
    add_endpoint,
    admit_charge,
    charge_chain,
    check_invariants,
    fund,
    run_until_quiet,
)
from tests.support.cli import Result
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.drill_support import crash_tick as drill_crash_tick

DEPOSIT = 30_000_000


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=3, users=3)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return charge_chain(devnet, dsn, tmp_path / "keys")


def crash_tick(chain: ChainEnv, worker: str, point: str) -> Result:
    """A fresh OS process that must die at `point` (exit -9 and the point's marker; drill_support)."""
    return drill_crash_tick(chain.environ, worker, point)


def setup_charges(chain: ChainEnv, db: psycopg.Connection) -> list[str]:
    users = chain.genesis["users"]
    add_endpoint(db)
    fund(chain, db, [(users[0], DEPOSIT), (users[1], DEPOSIT)])
    for i in range(8):
        admit_charge(db, users[i % 2]["public"], 1_000_000 + i, f"c{i}")
    # Cached balance the chain does not have: this one ends charge_failed (balance restored).
    db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 9000)", (users[2]["public"],))
    admit_charge(db, users[2]["public"], 4000, "drift")
    return [u["public"] for u in users]


def quiesce_and_check(chain: ChainEnv, db: psycopg.Connection, accounts: list[str]) -> None:
    cursors: list[str] = []

    def runner(worker: str) -> Result:
        result = chain.tick(worker)
        if worker == "observer":
            row = db.execute("SELECT cursor FROM paygate.observer_cursor").fetchone()
            if row:
                cursors.append(row[0])
        return result

    run_until_quiet(chain, db, runner=runner)
    assert cursors == sorted(cursors), "the observer cursor moved backwards"
    # The third account's drift is the one put there on purpose (cached 9,000, chain 0): its
    # failed charge must have been given back exactly once.
    counts = check_invariants(chain, db, accounts[:2])
    assert db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s",
                      (accounts[2],)).fetchone()[0] == 9000
    assert counts["charged"] == 8 and counts["failed"] == 1
    statuses = dict(db.execute("SELECT status, count(*) FROM paygate.charges GROUP BY status").fetchall())
    assert statuses == {"settled": 8, "failed": 1}
    # Every lineage is terminal and at most one applied lineage carried each charge.
    assert not db.execute("SELECT count(*) FROM paygate.lineages WHERE state IN ('allocated', 'signed', 'sent')"
                          ).fetchone()[0]


@pytest.mark.parametrize("point", ["settlement.after_claim", "settlement.after_sign", "settlement.after_anchor",
                                   "settlement.after_broadcast"])
def test_settlement_crash_before_the_batch_is_out(chain: ChainEnv, db: psycopg.Connection, point: str) -> None:
    accounts = setup_charges(chain, db)
    result = crash_tick(chain, "settlement", point)
    assert result.code == -9, f"expected a SIGKILL at {point}: {result.code} {result.err}"
    # Let the dead worker's lease (1 s, DB time) lapse before any ledger closes: otherwise, on a slow
    # machine, the closes could pass the anchored envelope's maxTime first, and a correct but
    # different path (proven expired, a new lineage) would run instead of the one this test names.
    time.sleep(1.2)
    quiesce_and_check(chain, db, accounts)
    states = [r[0] for r in db.execute("SELECT state FROM paygate.lineages WHERE purpose = 'charge_batch' ORDER BY id")]
    if point in ("settlement.after_claim", "settlement.after_sign"):
        # Never anchored: the lane was released (abandoned) and a new lineage carried the batch.
        assert states == ["abandoned", "applied"]
    else:
        # Anchored before the crash: the journaled bytes themselves were (re)sent and landed.
        assert states == ["applied"]


def test_a_ticks_batches_are_journaled_together_before_the_first_is_sent(chain: ChainEnv,
                                                                         db: psycopg.Connection) -> None:
    """Three batches in one tick (batch size 3, one lane each): the tick anchors all three in one
    transaction, then broadcasts. Killed right after that commit: all three are journaled ('signed')
    and the devnet has seen none of them; the same bytes are then sent and land, once each."""
    from tests.support.drill_support import crash_tick as crash

    accounts = setup_charges(chain, db)
    crash(chain.environ, "settlement", "settlement.after_anchor", "--batch", "3")
    states = db.execute("SELECT id, state FROM paygate.lineages WHERE purpose = 'charge_batch' ORDER BY id").fetchall()
    assert [state for _, state in states] == ["signed"] * 3
    # One transaction wrote all three envelopes: one synchronous commit for the tick.
    assert db.execute("SELECT count(DISTINCT xmin::text) FROM paygate.lineages WHERE purpose = 'charge_batch'"
                      ).fetchone()[0] == 1
    assert chain.devnet.state()["queue"] == []  # nothing broadcast before the kill
    time.sleep(1.2)  # the dead worker's batch leases lapse (1 s, DB time)
    quiesce_and_check(chain, db, accounts)
    # The journaled bytes themselves were sent and landed: no batch needed a second lineage.
    assert db.execute("SELECT id, state FROM paygate.lineages WHERE purpose = 'charge_batch' ORDER BY id"
                      ).fetchall() == [(lineage_id, "applied") for lineage_id, _ in states]


@pytest.mark.parametrize("point", ["settlement.before_resolve", "settlement.after_resolve"])
def test_settlement_crash_while_resolving(chain: ChainEnv, db: psycopg.Connection, point: str) -> None:
    accounts = setup_charges(chain, db)
    assert chain.tick("settlement").code == 0  # the batch is sent
    chain.devnet.close_ledger()
    result = crash_tick(chain, "settlement", point)
    assert result.code == -9, f"expected a SIGKILL at {point}: {result.code} {result.err}"
    quiesce_and_check(chain, db, accounts)


@pytest.mark.parametrize("point", ["observer.after_fetch", "observer.after_apply"])
def test_observer_crash_mid_page(chain: ChainEnv, db: psycopg.Connection, point: str) -> None:
    accounts = setup_charges(chain, db)
    assert chain.tick("settlement").code == 0
    chain.devnet.close_ledger()
    result = crash_tick(chain, "observer", point)
    assert result.code == -9, f"expected a SIGKILL at {point}: {result.code} {result.err}"
    quiesce_and_check(chain, db, accounts)


def test_repeated_crashes_at_every_settlement_point(chain: ChainEnv, db: psycopg.Connection) -> None:
    """One process dies at each point in turn while the same charges are in flight (each one on the
    path its predecessor left: the dead worker's batch lease lapses first)."""
    accounts = setup_charges(chain, db)
    for point in ("settlement.after_claim", "settlement.after_anchor", "settlement.before_resolve",
                  "settlement.after_resolve"):
        time.sleep(1.2)
        crash_tick(chain, "settlement", point)
        chain.devnet.close_ledger()
        crash_tick(chain, "observer", "observer.after_apply")
    quiesce_and_check(chain, db, accounts)


# -- the dead path, branch B, the batch split, resumes in fresh processes ----------------------

def resume_procs(chain: ChainEnv, db: psycopg.Connection, environ: dict[str, str] | None = None,
                 allowed: tuple[int, ...] = (0,)) -> list[Result]:
    """settlement and the observer as fresh OS processes, ledgers closing, until nothing is open."""
    from tests.support.charges_support import open_work
    from tests.support.cli import run_proc

    results = []
    for _ in range(30):
        for worker in ("settlement", "observer"):
            result = run_proc("run-tick", worker, "--once", "--json", environ=environ or chain.environ)
            results.append(result)
            assert result.code in allowed, f"{worker} exited {result.code}: {result.err[-2000:]}"
        if not open_work(db):
            chain.devnet.close_ledger()
            run_proc("run-tick", "observer", "--once", environ=environ or chain.environ)
            return results
        chain.devnet.close_ledger()
    raise AssertionError("settlement did not go quiet")


def charge_rows(db: psycopg.Connection) -> list[tuple]:
    return db.execute("SELECT status, attempts, cardinality(dead_lineages) FROM paygate.charges ORDER BY id").fetchall()


def test_a_dead_lineage_hands_its_charges_back_across_a_crash(chain: ChainEnv, db: psycopg.Connection) -> None:
    """The batch is dropped by the network (never included); once its maxTime passes the lineage is
    proven expired and its charges are handed back for a new attempt. The worker dies inside that
    hand-back transaction: nothing of it survives, and a fresh process does it once."""
    users = chain.genesis["users"]
    fund(chain, db, [(users[0], DEPOSIT)])
    for i in range(3):
        admit_charge(db, users[0]["public"], 1000 + i, f"d{i}")
    chain.devnet.set_fault("drop_next")
    assert chain.tick("settlement").code == 0
    [lineage_id] = [r[0] for r in db.execute("SELECT id FROM paygate.lineages WHERE purpose = 'charge_batch'")]
    time.sleep(1.2)  # the batch lease (1 s) lapses
    chain.devnet.close_ledger(n=14)  # past maxTime
    crash_tick(chain, "settlement", "settlement.before_release_dead")
    # the lineage is proven dead (its own commit), the hand-back rolled back with the process
    assert db.execute("SELECT state FROM paygate.lineages WHERE id = %s", (lineage_id,)).fetchone()[0] == "expired"
    assert charge_rows(db) == [("authorized", 0, 0)] * 3
    assert db.execute("SELECT count(*) FROM paygate.charges WHERE lineage_id = %s", (lineage_id,)).fetchone()[0] == 3
    time.sleep(1.2)
    resume_procs(chain, db)
    assert charge_rows(db) == [("settled", 1, 1)] * 3
    check_invariants(chain, db, [users[0]["public"]])


def test_the_last_dead_attempt_fails_the_charges_with_balances_restored_once(chain: ChainEnv,
                                                                            db: psycopg.Connection) -> None:
    """At the attempt limit the proven-dead batch fails its charges and restores the cached balance in
    the same transaction; killed inside it, the fresh process restores the balance exactly once."""
    users = chain.genesis["users"]
    add_endpoint(db)
    fund(chain, db, [(users[0], DEPOSIT)])
    for i in range(3):
        admit_charge(db, users[0]["public"], 1000 + i, f"l{i}")
    environ = {**chain.environ, "PAYGATE_SETTLEMENT_MAX_ATTEMPTS": "1"}
    chain.devnet.set_fault("drop_next")
    assert chain.tick("settlement", PAYGATE_SETTLEMENT_MAX_ATTEMPTS="1").code == 0
    time.sleep(1.2)
    chain.devnet.close_ledger(n=14)
    crash_tick_env = {**environ}
    from tests.support.drill_support import crash_tick as drill

    drill(crash_tick_env, "settlement", "settlement.before_release_dead")
    assert db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s",
                      (users[0]["public"],)).fetchone()[0] == DEPOSIT - 3003
    time.sleep(1.2)
    resume_procs(chain, db, environ)
    assert charge_rows(db) == [("failed", 1, 1)] * 3
    assert db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s",
                      (users[0]["public"],)).fetchone()[0] == DEPOSIT
    assert db.execute("SELECT count(*) FROM paygate.webhook_outbox WHERE event_type = 'charge.failed'"
                      ).fetchone()[0] == 3
    check_invariants(chain, db, [users[0]["public"]])


def test_branch_b_signed_then_a_competing_transaction_takes_the_sequence(chain: ChainEnv,
                                                                          db: psycopg.Connection) -> None:
    """Anchored, killed before the broadcast; then a transaction we never journaled takes the lane's
    sequence. The lineage is proven superseded, the lane fenced and a human asked (exit 3, once), and
    the charges go out on another lane: each debited once."""
    from tests.support.cli import run_proc

    accounts = setup_charges(chain, db)
    crash_tick(chain, "settlement", "settlement.after_anchor")
    [first] = db.execute("SELECT id, lane FROM paygate.lineages WHERE purpose = 'charge_batch'").fetchall()
    assert chain.devnet.state()["queue"] == []
    chain.devnet.rpc("devnet_consumeSequence", {"account": first[1]})
    chain.devnet.close_ledger()
    time.sleep(1.2)
    resumed = run_proc("run-tick", "settlement", "--once", "--json", environ=chain.environ)
    assert resumed.code == 3, resumed.err
    assert "journal.foreign_sequence_use" in resumed.err
    assert db.execute("SELECT state FROM paygate.lineages WHERE id = %s", (first[0],)).fetchone()[0] == "superseded"
    assert db.execute("SELECT status FROM paygate.lanes WHERE address = %s", (first[1],)).fetchone()[0] == "drained"
    quiesce_and_check(chain, db, accounts)
    lanes = db.execute("SELECT lane, state FROM paygate.lineages WHERE purpose = 'charge_batch' AND id <> %s",
                       (first[0],)).fetchall()
    assert lanes and all(lane != first[1] for lane, _ in lanes)


SPLIT_RUNNER = """
import sys
import paygate_cli.chain.charges as charges
# let the claim take an over-limit batch: only the contract's ceiling of 100 entries
charges.claim_estimate = lambda: {"max_entries": 100, "max_write": 10**6, "read_only": 0, "max_keys": 10**6}
from paygate_cli.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_crash_right_after_a_batch_split(chain: ChainEnv, db: psycopg.Connection) -> None:
    """The prepared footprint is over the network limit, so the batch is halved (the dropped rows
    handed back in the same lease); the process dies right after the split. A fresh process carries
    on: every charge debited once."""
    import subprocess
    import sys

    from tests.support.drill_support import assert_crashed_at
    from tests.support.drill_support import crash_environ as armed

    users = chain.genesis["users"][:3]
    fund(chain, db, [(u, DEPOSIT) for u in users])
    for i in range(60):
        admit_charge(db, users[i % 3]["public"], 1000, f"s{i}")
    proc = subprocess.run([sys.executable, "-c", SPLIT_RUNNER, "run-tick", "settlement", "--once", "--batch", "60"],
                          env=armed(chain.environ, "settlement.after_split"), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert_crashed_at(Result(proc.returncode, proc.stdout, proc.stderr), "settlement.after_split")
    assert "settlement.batch_split" in proc.stderr
    time.sleep(1.2)
    resume_procs(chain, db)
    assert db.execute("SELECT count(*) FROM paygate.charges WHERE status = 'settled'").fetchone()[0] == 60
    check_invariants(chain, db, [u["public"] for u in users])
