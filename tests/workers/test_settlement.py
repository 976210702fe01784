"""Settlement + observer against a real devnet and a real Postgres: admitted charges end settled
(observer-promoted), charge_failed restores the balance, batches respect the footprint limits,
proven-dead lineages are retried and fail the charges after the attempt limit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import xdr

from tests.support.chain_env import ChainEnv, billing_balance, contract_events, landed_auth_types
from tests.support.charges_support import (
    add_endpoint,
    admit_charge,
    charge_chain,
    check_invariants,
    fund,
    run_until_quiet,
)
from tests.support.devnet_support import DevnetHandle, start_devnet

DEPOSIT = 50_000_000
# A claim-time estimate that lets everything through up to the contract's ceiling of 100 entries.
ESTIMATE_OFF = {"max_entries": 100, "max_write": 10**6, "read_only": 0, "max_keys": 10**6}


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=4, users=4)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return charge_chain(devnet, dsn, tmp_path / "keys")


def balance(db: psycopg.Connection, account: str) -> int:
    return int(db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s", (account,)).fetchone()[0])


def test_admitted_charges_are_settled_by_the_observer(chain: ChainEnv, db: psycopg.Connection) -> None:
    users = chain.genesis["users"][:2]
    add_endpoint(db)
    fund(chain, db, [(u, DEPOSIT) for u in users])
    charges = [admit_charge(db, users[i % 2]["public"], 1_000_000 + i, f"c{i}") for i in range(10)]
    results = run_until_quiet(chain, db)
    rows = db.execute("SELECT status, lineage_id, attempts FROM paygate.charges ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["settled"] * 10 and all(r[1] is not None and r[2] == 0 for r in rows)
    batches = db.execute("SELECT outcome FROM paygate.charge_batches").fetchall()
    assert batches and all(b[0] == "applied" for b in batches)
    # charge_batch carries only the operator's authorisation, and the operator is the lane that is the
    # transaction's source: one SOURCE_ACCOUNT entry, no address credential of either version (why the
    # settlement drills are not run with ADDRESS and ADDRESS_V2 as funding's are).
    applied = db.execute("SELECT inner_hash FROM paygate.lineages WHERE purpose = 'charge_batch' "
                         "AND state = 'applied'").fetchall()
    assert len(applied) == len(batches)
    for (inner,) in applied:
        assert landed_auth_types(chain, bytes(inner)) == [xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_SOURCE_ACCOUNT]
    on_chain = {bytes(e["value"][1]): e["value"][0] for e in contract_events(chain, "charge")}
    assert on_chain == {charge_id: 1_000_000 + i for i, (_, charge_id) in enumerate(charges)}
    spent = [sum(1_000_000 + i for i in range(10) if i % 2 == k) for k in (0, 1)]
    for user, amount in zip(users, spent, strict=True):
        assert balance(db, user["public"]) == DEPOSIT - amount == billing_balance(chain, user["public"])
    check_invariants(chain, db, [u["public"] for u in users])
    settled = db.execute("SELECT payload FROM paygate.webhook_outbox WHERE event_type = 'charge.settled'").fetchall()
    assert len(settled) == 10
    assert any(r.code == 0 and '"settled"' in r.out for r in results)


def test_charge_failed_on_chain_restores_the_cached_balance(chain: ChainEnv, db: psycopg.Connection) -> None:
    user = chain.genesis["users"][2]["public"]
    # The cached balance says 5,000 but the contract holds nothing for this account (a drift the
    # chain settles): charge_batch records charge_failed and the observer gives the money back.
    db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 5000)", (user,))
    row_id, charge_id = admit_charge(db, user, 3000, "drift-1")
    assert balance(db, user) == 2000
    run_until_quiet(chain, db)
    status, reason, failed_by = db.execute("SELECT status, reason, failed_by FROM paygate.charges WHERE id = %s",
                                           (row_id,)).fetchone()
    assert (status, failed_by) == ("failed", "observer") and "insufficient_balance" in reason
    assert balance(db, user) == 5000
    failed = contract_events(chain, "charge_failed")
    assert len(failed) == 1 and bytes(failed[0]["value"][1]) == charge_id
    event = db.execute("SELECT effect, applied_to FROM paygate.chain_events").fetchone()
    assert event == ("failed", f"charge:{row_id}")


def test_batches_respect_the_write_footprint_limit(chain: ChainEnv, db: psycopg.Connection) -> None:
    users = chain.genesis["users"][:4]
    fund(chain, db, [(u, DEPOSIT) for u in users])
    for i in range(60):
        admit_charge(db, users[i % 4]["public"], 1000, f"f{i}")
    result = chain.tick("settlement", "--batch", "100")
    assert result.code == 0, result.err
    sizes = [r[0] for r in db.execute("SELECT entries FROM paygate.charge_batches ORDER BY created_at")]
    # 4 distinct accounts: entries + 4 <= 50 read-write keys -> 46 per batch; the rest in the next.
    assert sizes == [46, 14]
    run_until_quiet(chain, db)
    assert db.execute("SELECT count(*) FROM paygate.charges WHERE status = 'settled'").fetchone()[0] == 60
    check_invariants(chain, db, [u["public"] for u in users])


def test_dead_lineages_are_retried_then_fail_with_the_balance_restored(chain: ChainEnv,
                                                                       db: psycopg.Connection) -> None:
    user = chain.genesis["users"][0]
    fund(chain, db, [(user, DEPOSIT)])
    row_id, _ = admit_charge(db, user["public"], 7000, "doomed")
    # Every broadcast is dropped by the network (never included): each lineage can only expire.
    chain.devnet.set_fault("drop_next")
    assert chain.tick("settlement").code == 0
    for attempt in range(1, 6):
        lineage_id = db.execute("SELECT lineage_id FROM paygate.charges WHERE id = %s", (row_id,)).fetchone()[0]
        assert lineage_id is not None
        # Not re-claimable while its lineage can still land.
        assert chain.tick("settlement").code == 0
        assert db.execute("SELECT lineage_id FROM paygate.charges WHERE id = %s", (row_id,)).fetchone()[0] == lineage_id
        chain.devnet.close_ledger(n=14)  # past maxTime (60 s at 5 s per ledger)
        if attempt < 5:
            chain.devnet.set_fault("drop_next")  # the retry (sent in the same tick) is dropped too
        assert chain.tick("settlement").code == 0
        state = db.execute("SELECT state FROM paygate.lineages WHERE id = %s", (lineage_id,)).fetchone()[0]
        assert state == "expired"
        status, attempts, new_lineage = db.execute("SELECT status, attempts, lineage_id FROM paygate.charges "
                                                   "WHERE id = %s", (row_id,)).fetchone()
        assert attempts == attempt
        if attempt < 5:
            assert status == "authorized" and new_lineage not in (None, lineage_id)
        else:
            assert status == "failed" and new_lineage is None
    reason, failed_by, dead = db.execute("SELECT reason, failed_by, dead_lineages FROM paygate.charges WHERE id = %s",
                                         (row_id,)).fetchone()
    assert failed_by == "settlement" and "5 charge_batch transactions were each proven dead" in reason
    assert len(dead) == 5
    assert balance(db, user["public"]) == DEPOSIT == billing_balance(chain, user["public"])
    assert not contract_events(chain, "charge") and not contract_events(chain, "charge_failed")


def test_rpc_outage_before_signing_hands_the_batch_back_at_once(chain: ChainEnv, db: psycopg.Connection) -> None:
    user = chain.genesis["users"][0]
    fund(chain, db, [(user, DEPOSIT)])
    row_id, _ = admit_charge(db, user["public"], 5000, "outage")
    chain.devnet.set_fault("http_503", methods=["simulateTransaction"])
    result = chain.tick("settlement")
    assert result.code == 69 and "rpc.unavailable" in result.err, result.err  # unavailable; the next run retries
    # Nothing was signed or journaled: the lane and the charge are free again now, not after the lease.
    row = db.execute("SELECT status, lineage_id, claimed_at, attempts FROM paygate.charges WHERE id = %s",
                     (row_id,)).fetchone()
    assert row == ("authorized", None, None, 0)
    states = db.execute("SELECT state FROM paygate.lineages WHERE purpose = 'charge_batch'").fetchall()
    assert states == [("abandoned",)]
    chain.devnet.clear_faults()
    run_until_quiet(chain, db)
    assert db.execute("SELECT status FROM paygate.charges WHERE id = %s", (row_id,)).fetchone()[0] == "settled"


def test_a_batch_over_the_network_limits_is_split_before_signing(chain: ChainEnv, db: psycopg.Connection,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import paygate_cli.chain.charges as charges

    users = chain.genesis["users"][:4]
    fund(chain, db, [(u, DEPOSIT) for u in users])
    for i in range(100):
        admit_charge(db, users[i % 4]["public"], 1000, f"s{i}")
    # Pretend the claim-time estimate lets everything through: the prepared footprint (100 charge-id
    # entries + 4 balances = 104 read-write keys) must then be caught and the batch halved until it fits.
    monkeypatch.setattr(charges, "claim_estimate", lambda: {**ESTIMATE_OFF})
    result = chain.tick("settlement", "--batch", "100")
    assert result.code == 0, result.err
    assert "settlement.batch_split" in result.err
    sizes = [r[0] for r in db.execute("SELECT entries FROM paygate.charge_batches ORDER BY created_at")]
    assert sizes and all(n + 4 <= 50 for n in sizes) and sizes[0] == 25
    run_until_quiet(chain, db)
    assert db.execute("SELECT count(*) FROM paygate.charges WHERE status = 'settled'").fetchone()[0] == 100
    assert db.execute("SELECT count(*) FROM paygate.lineages WHERE purpose = 'charge_batch' AND state <> 'applied'"
                      ).fetchone()[0] == 0
    check_invariants(chain, db, [u["public"] for u in users])
