"""Crash drills for settlement and the observer: a real `paygate run-tick` process is SIGKILLed at a
named crash point, then ticks run until quiet, and the invariants of DESIGN §9 hold: each charge id
debited at most once on chain, every admitted charge settled or failed, cached balances equal
on-chain balances, each event applied once, the cursor never moved backwards."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.chain_env import ChainEnv
from tests.charges_support import add_endpoint, admit_charge, charge_chain, check_invariants, fund, run_until_quiet
from tests.cli import Result, run_proc
from tests.devnet_support import DevnetHandle, start_devnet

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
    environ = {**chain.environ, "PAYGATE_ENABLE_CRASHPOINTS": "1", "PAYGATE_CRASH_AT": point}
    return run_proc("run-tick", worker, "--once", "--json", environ=environ)


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
    """One process dies at each point in turn while the same charges are in flight."""
    accounts = setup_charges(chain, db)
    for point in ("settlement.after_claim", "settlement.after_anchor", "settlement.after_broadcast"):
        crash_tick(chain, "settlement", point)
        chain.devnet.close_ledger()
        crash_tick(chain, "observer", "observer.after_apply")
    quiesce_and_check(chain, db, accounts)
