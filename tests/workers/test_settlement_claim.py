"""The settlement worker's one-statement claim and its XDR templates, on a real Postgres and real
landed transactions: what the speed work must not have changed."""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import Keypair, scval, xdr

from paygate_cli.chain.charges import _footprint_after_call, _NotMeasured, _skip_ledger_key, charge_batch
from paygate_cli.journal import lineage as lineages
from paygate_cli.queues import charges
from paygate_cli.workers import settlement
from tests.support.chain_env import ChainEnv
from tests.support.charges_support import admit_charge, charge_chain, fund, run_until_quiet
from tests.support.devnet_support import DevnetHandle, start_devnet


def _accounts(db: psycopg.Connection, n: int) -> list[str]:
    users = [Keypair.random().public_key for _ in range(n)]
    db.execute("INSERT INTO paygate.accounts (address, cached_balance) SELECT unnest(%s::text[]), 10^12", (users,))
    return users


def _claim(db: psycopg.Connection, lanes: list[str], batch: int = 48) -> settlement.Claim:
    return settlement.claim(db, lanes=lanes, owner="test:0", token=uuid.uuid4(), batch=batch, lease=30)


def test_the_claim_takes_the_oldest_prefix_that_fits_and_records_its_lineage(db: psycopg.Connection) -> None:
    users = _accounts(db, 30)
    lanes = [Keypair.random().public_key for _ in range(2)]
    lineages.sync_lanes(db, lanes)
    # 30 distinct accounts: entries + accounts <= 50 read-write keys, so 25 fit one batch.
    ids = [admit_charge(db, users[i], 100 + i, f"k{i}")[0] for i in range(30)]
    db.execute("SET synchronous_commit = on")  # as a production session has it (test clusters run without)
    got = _claim(db, lanes)
    assert got.wanted == 25 and got.lineage_id is not None and got.lane in lanes
    assert [r.id for r in got.rows] == ids[:25]
    assert [r.amount for r in got.rows] == [100 + i for i in range(25)]
    rows = db.execute("SELECT id, lineage_id, claimed_at IS NOT NULL, claimed_by FROM paygate.charges ORDER BY id"
                      ).fetchall()
    assert rows[:25] == [(i, got.lineage_id, True, "test:0") for i in ids[:25]]
    assert rows[25:] == [(i, None, False, None) for i in ids[25:]]
    batch = db.execute("SELECT entries, lease_token IS NOT NULL, closed_at FROM paygate.charge_batches").fetchall()
    assert batch == [(25, True, None)]
    lineage = lineages.load(db, got.lineage_id)
    assert (lineage.purpose, lineage.state, lineage.lane) == ("charge_batch", "allocated", got.lane)
    # The claim's own commit was relaxed; the session is not: the anchor that follows commits synchronously.
    assert db.execute("SHOW synchronous_commit").fetchone()[0] == "on"
    assert db.execute(f"WITH {charges.RELAXED_CTE} SELECT current_setting('synchronous_commit') FROM relaxed"
                      ).fetchone()[0] == "off"
    assert db.execute("SHOW synchronous_commit").fetchone()[0] == "on"
    # A row with a lineage is never claimed again: the next claim takes the rest on the other lane.
    again = _claim(db, lanes)
    assert [r.id for r in again.rows] == ids[25:] and again.lane != got.lane


def test_no_free_lane_or_nothing_to_claim_writes_nothing(db: psycopg.Connection) -> None:
    users = _accounts(db, 2)
    lane = Keypair.random().public_key
    lineages.sync_lanes(db, [lane])
    assert _claim(db, [lane]) == settlement.Claim(0, None, None, [])  # an empty queue
    for i in range(4):
        admit_charge(db, users[i % 2], 100, f"n{i}")
    first = _claim(db, [lane])
    assert first.lineage_id is not None and len(first.rows) == 4
    admit_charge(db, users[0], 100, "n-late")
    busy = _claim(db, [lane])  # the only lane holds a live lineage
    assert busy == settlement.Claim(1, None, None, [])
    assert db.execute("SELECT count(*) FROM paygate.lineages").fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM paygate.charge_batches").fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM paygate.charges WHERE lineage_id IS NULL").fetchone()[0] == 1


def _periods(db: psycopg.Connection, users: list[str], key: str) -> list[int]:
    """One due period for each of `users` (a subscription each, charged as the subscriptions worker
    charges a period: admit_charge with the subscription and the period's start)."""
    ids = []
    for n, user in enumerate(users):
        sub = db.execute("SELECT subscription_id FROM paygate.create_subscription(%s, 7, '1 day'::interval, "
                         "now(), %s)", (user, f"{key}-sub-{n}")).fetchone()[0]
        ids.append(db.execute("SELECT charge_row_id FROM paygate.admit_charge(%s, 7, %s, NULL, %s, now())",
                              (user, f"{key}-period-{n}", sub)).fetchone()[0])
    return ids


def test_one_off_charges_are_claimed_ahead_of_a_billing_run(db: psycopg.Connection) -> None:
    users = _accounts(db, 2)
    lanes = [Keypair.random().public_key for _ in range(3)]
    lineages.sync_lanes(db, lanes)
    # A billing run admitted 60 periods (of 2 accounts: 48 fit a batch), then a checkout charged once.
    periods = _periods(db, [users[i % 2] for i in range(60)], "run")
    checkout = admit_charge(db, users[0], 100, "checkout")[0]
    first = _claim(db, lanes)
    assert sorted(r.id for r in first.rows) == sorted([checkout, *periods[:47]])
    # With no one-off charge waiting, periods fill the claims, oldest first.
    second = _claim(db, lanes)
    assert sorted(r.id for r in second.rows) == periods[47:]
    assert _claim(db, lanes) == settlement.Claim(0, None, None, [])


def test_periods_that_waited_take_a_share_of_each_claim_but_no_more(db: psycopg.Connection) -> None:
    users = _accounts(db, 2)
    lanes = [Keypair.random().public_key for _ in range(2)]
    lineages.sync_lanes(db, lanes)
    periods = _periods(db, [users[i % 2] for i in range(30)], "aged")
    # Checkout charges above capacity: without a share, periods would wait as long as they kept coming.
    checkouts = [admit_charge(db, users[i % 2], 100, f"c{i}")[0] for i in range(100)]
    db.execute("UPDATE paygate.charges SET created_at = created_at - interval '61 seconds' WHERE id = ANY(%s)",
               (periods,))
    share = 48 // charges.PERIOD_SHARE
    got = _claim(db, lanes)
    assert sorted(r.id for r in got.rows) == [*periods[:share], *checkouts[:48 - share]]
    # Periods younger than the bound wait behind every one-off charge.
    db.execute("UPDATE paygate.charges SET created_at = now() WHERE id = ANY(%s)", (periods,))
    got = _claim(db, lanes)
    assert sorted(r.id for r in got.rows) == checkouts[48 - share:96 - share]


def test_a_claim_filled_by_one_off_charges_never_reads_the_periods(db: psycopg.Connection) -> None:
    users = _accounts(db, 2)
    lanes = [Keypair.random().public_key]
    lineages.sync_lanes(db, lanes)
    _periods(db, [users[i % 2] for i in range(10)], "idle")
    for i in range(60):
        admit_charge(db, users[i % 2], 100, f"f{i}")
    # Rows it never reads it never locks: another settlement process's claim can take them meanwhile.
    plan = "\n".join(r[0] for r in db.execute(
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + settlement.claim_sql(48),
        {"lanes": lanes, "owner": "test:0", "token": uuid.uuid4(), "lease": 30, "entitlement": "t"}).fetchall())
    assert "charges_claim_one_off" in plan, plan
    # Three scans of the periods' index: the aged tier's, which its index condition (created_at before
    # the bound) ends at once with none aged; the rest's, which never runs; and the "does work wait"
    # probe a claim with no lane free answers with, which never runs with a lane free.
    scans = sorted(line.split("(", 1)[1] for line in plan.splitlines() if "charges_claim_periods" in line)
    assert scans == ["actual rows=0 loops=1)", "never executed)", "never executed)"], plan


def test_a_claim_with_every_lane_taken_locks_no_row_and_says_work_waits(db: psycopg.Connection) -> None:
    users = _accounts(db, 2)
    lanes = [Keypair.random().public_key]
    lineages.sync_lanes(db, lanes)
    _periods(db, users, "busy")
    first = _claim(db, lanes)  # the only lane is taken by this batch's lineage
    assert first.lineage_id is not None and len(first.rows) == 2
    # No work waits and no lane is free: "nothing to claim", not a lane shortage.
    assert _claim(db, lanes) == settlement.Claim(0, None, None, [])
    _periods(db, users[:1], "later")
    for i in range(5):
        admit_charge(db, users[i % 2], 100, f"w{i}")
    # Locking a row writes its tuple's xmax (the locker's transaction id); a row never locked keeps 0.
    xmax_sql = "SELECT id, xmax::text::bigint FROM paygate.charges WHERE lineage_id IS NULL ORDER BY id"
    unlocked = db.execute(xmax_sql).fetchall()
    assert len(unlocked) == 6 and {x for _, x in unlocked} == {0}
    # Work waits (one-off charges and a period) and no lane is free: "no lane", nothing written or locked.
    assert _claim(db, lanes) == settlement.Claim(1, None, None, [])
    assert db.execute(xmax_sql).fetchall() == unlocked
    assert db.execute("SELECT count(*) FROM paygate.lineages").fetchone()[0] == 1
    # The lane frees: the same claim takes the waiting rows.
    db.execute("UPDATE paygate.lineages SET state = 'abandoned' WHERE id = %s", (first.lineage_id,))
    assert len(_claim(db, lanes).rows) == 6


def test_charge_batch_values_are_encoded_as_the_sdk_encodes_them() -> None:
    accounts = [Keypair.random().public_key for _ in range(3)]
    amounts = [1, 2**63, 2**64 + 7, 2**127 - 1]
    ids = [os.urandom(32) for _ in amounts]
    picked = [accounts[i % 3] for i in range(len(amounts))]
    call = charge_batch("CA3D5KRYM6CB7OWQ6TWYRR3Z4T7GNZLKERYNZGGA5SOAOPIFY6YQGAXE", accounts[0], picked, amounts, ids)
    expected = [scval.to_address(accounts[0]), scval.to_vec([scval.to_address(a) for a in picked]),
                scval.to_vec([scval.to_int128(a) for a in amounts]), scval.to_vec([scval.to_bytes(c) for c in ids])]
    assert [a.to_xdr_bytes() for a in call.args] == [e.to_xdr_bytes() for e in expected]
    assert call.args == expected  # its fields decode to the same value
    auth = xdr.SorobanAuthorizationEntry.from_xdr(call.auth[0].to_xdr())
    assert auth.credentials.type == xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_SOURCE_ACCOUNT
    assert auth.root_invocation.function.contract_fn.args == expected
    assert not auth.root_invocation.sub_invocations
    with pytest.raises(ValueError):
        charge_batch(call.contract, accounts[0], [accounts[0]], [2**127], [ids[0]])


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=3)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return charge_chain(devnet, dsn, tmp_path / "keys")


def test_the_footprint_read_without_a_full_decode_is_the_landed_envelopes(chain: ChainEnv,
                                                                          db: psycopg.Connection) -> None:
    users = chain.genesis["users"][:3]
    fund(chain, db, [(u, 50_000_000) for u in users])
    for i in range(30):
        admit_charge(db, users[i % 3]["public"], 1000 + i, f"fp{i}")
    run_until_quiet(chain, db)
    landed = db.execute("SELECT id, lane, inner_hash FROM paygate.lineages WHERE purpose = 'charge_batch' "
                        "AND state = 'applied'").fetchall()
    assert landed
    for lineage_id, lane, inner_hash in landed:
        rows = db.execute("SELECT account, amount, charge_id FROM paygate.charges WHERE lineage_id = %s "
                          "ORDER BY created_at, id", (lineage_id,)).fetchall()
        call = charge_batch(chain.environ["PAYGATE_BILLING_CONTRACT"], lane, [r[0] for r in rows],
                            [int(r[1]) for r in rows], [bytes(r[2]) for r in rows])
        with chain.server() as server:
            envelope = server.get_transaction(bytes(inner_hash).hex()).envelope_xdr
        footprint = xdr.TransactionEnvelope.from_xdr(envelope).fee_bump.tx.inner_tx.v1.tx.ext.soroban_data \
            .resources.footprint
        full = (len(footprint.read_only), len(footprint.read_write))
        assert _footprint_after_call(base64.b64decode(envelope), call) == full
        assert full[1] == len(rows) + len({r[0] for r in rows})  # a charge-id entry each, a balance per account
        # Any other call (here: one entry fewer) is not found in the bytes: the caller decodes in full.
        other = charge_batch(call.contract, lane, [r[0] for r in rows[1:]], [int(r[1]) for r in rows[1:]],
                             [bytes(r[2]) for r in rows[1:]])
        assert _footprint_after_call(base64.b64decode(envelope), other) is None


def test_footprint_keys_are_measured_as_the_sdk_encodes_them() -> None:
    """The footprint is counted by measuring each key's encoding (no decode): every measured shape
    ends exactly where the SDK's encoding ends, and a kind it does not measure says so (the caller
    then decodes the envelope in full)."""
    contract = scval.to_address("CA3D5KRYM6CB7OWQ6TWYRR3Z4T7GNZLKERYNZGGA5SOAOPIFY6YQGAXE").address
    account = Keypair.random().public_key
    keys = [scval.to_vec([scval.to_symbol("Charge"), scval.to_bytes(os.urandom(32))]),
            scval.to_vec([scval.to_symbol("Balance"), scval.to_address(account)]),
            scval.to_map({scval.to_symbol("k"): scval.to_uint64(7), scval.to_string("abcde"): scval.to_int128(-1)}),
            scval.to_bool(True), scval.to_void(), scval.to_uint32(1), scval.to_int256(5), scval.to_duration(9),
            xdr.SCVal(xdr.SCValType.SCV_LEDGER_KEY_CONTRACT_INSTANCE),
            xdr.SCVal(xdr.SCValType.SCV_LEDGER_KEY_NONCE, nonce_key=xdr.SCNonceKey(xdr.Int64(3))),
            xdr.SCVal(xdr.SCValType.SCV_VEC, vec=None)]
    ledger_keys = [xdr.LedgerKey(type=xdr.LedgerEntryType.CONTRACT_DATA, contract_data=xdr.LedgerKeyContractData(
        contract=contract, key=key, durability=xdr.ContractDataDurability.PERSISTENT)) for key in keys]
    ledger_keys.append(xdr.LedgerKey(type=xdr.LedgerEntryType.CONTRACT_CODE,
                                     contract_code=xdr.LedgerKeyContractCode(xdr.Hash(os.urandom(32)))))
    ledger_keys.append(xdr.LedgerKey(type=xdr.LedgerEntryType.ACCOUNT, account=xdr.LedgerKeyAccount(
        Keypair.random().xdr_account_id())))
    for key in ledger_keys:
        encoded = key.to_xdr_bytes()
        assert _skip_ledger_key(encoded + b"tail", 0) == len(encoded)
    trustline = xdr.LedgerKey(type=xdr.LedgerEntryType.TRUSTLINE, trust_line=xdr.LedgerKeyTrustLine(
        Keypair.random().xdr_account_id(), xdr.TrustLineAsset(xdr.AssetType.ASSET_TYPE_NATIVE)))
    with pytest.raises(_NotMeasured):
        _skip_ledger_key(trustline.to_xdr_bytes(), 0)
