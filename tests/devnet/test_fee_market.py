"""The devnet's fee market (docs/devnet.md, "Fee market"): capacity per ledger, inclusion by fee rate,
the surge price every included transaction is charged, the `surge` fault's competing demand, the
Soroban queue limit, replace-by-fee under a surge and getFeeStats over the charged rates."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from stellar_sdk import (
    Asset,
    FeeBumpTransactionEnvelope,
    Keypair,
    SorobanServer,
    StrKey,
    TransactionBuilder,
    scval,
    xdr,
)
from stellar_sdk.soroban_rpc import GetTransactionStatus, SendTransactionStatus

from tests.devnet.helpers import call, fee_bump, invoke_tx, kp, result_code
from tests.support.cli import run_cli
from tests.support.devnet_support import DevnetError, DevnetHandle, start_devnet

S = SendTransactionStatus
CAPACITY = 2  # Soroban transactions per ledger on this module's devnet (the start flag)
SOROBAN_WINDOW = 3  # getFeeStats' Soroban window (the start flag): a surge leaves it in 3 ledgers


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path_factory.mktemp("fee-market"), lanes=1, users=1, extra_args=[
        "--ledger-max-soroban-txs", str(CAPACITY), "--fee-stats-window-soroban", str(SOROBAN_WINDOW),
        "--fee-stats-window-classic", "2"])
    yield handle
    handle.stop()


@pytest.fixture(autouse=True)
def clean_market(devnet: DevnetHandle) -> Iterator[None]:
    """Each test starts with an empty queue, no fault and the start capacity."""
    yield
    devnet.clear_faults()
    devnet.rpc("devnet_setLimits", {"ledgerMaxSorobanTxs": CAPACITY, "ledgerMaxClassicOps": 1000})
    devnet.close_ledger(5, advance_seconds=1)  # whatever a test left queued lands or ages out


def bidder(server: SorobanServer, devnet: DevnetHandle, rate: int) -> FeeBumpTransactionEnvelope:
    """A fresh account's Soroban call (billing.balance), fee-bumped at `rate` stroops per operation."""
    src = Keypair.from_secret(devnet.rpc("devnet_createAccount", {})["secret"])
    billing, user = devnet.genesis["contracts"]["billing"], devnet.genesis["users"][0]["public"]
    # A long timeout: manual closes move the devnet's clock ahead of the wall clock.
    inner = invoke_tx(server, devnet, src, billing, "balance", [scval.to_address(user)], timeout=86_400)
    return fee_bump(devnet, inner, base_fee=rate)


def send(server: SorobanServer, fb: FeeBumpTransactionEnvelope) -> Any:
    return server.send_transaction(fb)


def resource_fee(fb: FeeBumpTransactionEnvelope) -> int:
    return fb.transaction.inner_transaction_envelope.transaction.soroban_data.resource_fee.int64


def queued(devnet: DevnetHandle) -> set[str]:
    return {q["hash"] for q in devnet.state()["queue"]}


def assert_charged(devnet: DevnetHandle, fb: FeeBumpTransactionEnvelope, rate: int) -> None:
    """The fee bump (2 operations) paid `rate` per operation for inclusion, and getTransaction's
    result feeCharged, the fee account's balance change in the meta and the CAP-67 fee events all
    say the same fee. The beforeAllTxs fee event is the inclusion fee plus the whole declared resource
    fee; the afterAllTxs one refunds the unused resource fee."""
    got = call(devnet.url, "getTransaction", {"hash": fb.hash_hex()})["result"]
    assert got["status"] == "SUCCESS", got
    fee_charged = xdr.TransactionResult.from_xdr(got["resultXdr"]).fee_charged.int64
    changes = xdr.TransactionMeta.from_xdr(got["resultMetaXdr"]).v4.tx_changes_before.ledger_entry_changes
    entries = [(c.state or c.updated).data.account for c in changes]
    fee_account = fb.transaction.fee_source.account_id
    balances = [a.balance.int64 for a in entries
                if StrKey.encode_ed25519_public_key(a.account_id.account_id.ed25519.uint256) == fee_account]
    events = [xdr.TransactionEvent.from_xdr(b64) for b64 in got["events"]["transactionEventsXdr"]]
    amounts = {e.stage: scval.to_native(e.event.body.v0.data) for e in events}
    up_front = amounts[xdr.TransactionEventStage.TRANSACTION_EVENT_STAGE_BEFORE_ALL_TXS]
    assert up_front - resource_fee(fb) == rate * 2
    assert fee_charged == balances[0] - balances[1] == sum(amounts.values())
    assert fee_charged <= fb.transaction.fee  # never above the bid


def fee_stats(devnet: DevnetHandle) -> dict[str, Any]:
    return call(devnet.url, "getFeeStats")["result"]["sorobanInclusionFee"]


def test_start_flags_are_the_limits(devnet: DevnetHandle) -> None:
    limits = devnet.state()["limits"]
    assert limits == {"ledgerMaxSorobanTxs": CAPACITY, "ledgerMaxClassicOps": 1000, "sorobanQueueLimit": 2 * CAPACITY,
                      "feeStatsWindowSoroban": SOROBAN_WINDOW, "feeStatsWindowClassic": 2}


def test_a_full_ledger_takes_the_highest_rates_and_charges_its_lowest(server: SorobanServer,
                                                                      devnet: DevnetHandle) -> None:
    low, high, mid = (bidder(server, devnet, r) for r in (300, 1000, 500))
    for fb in (low, high, mid):
        assert send(server, fb).status == S.PENDING
    devnet.close_ledger()
    assert queued(devnet) == {low.hash_hex()}  # capacity 2: the third waits
    for fb in (high, mid):  # the surge price is the lowest included rate, 500, per operation (2 ops)
        assert_charged(devnet, fb, 500)
    devnet.close_ledger()
    assert queued(devnet) == set()
    # Alone in its ledger, nothing was left out: the base fee, whatever it bid.
    assert_charged(devnet, low, 100)


def test_a_ledger_with_room_charges_the_base_fee(server: SorobanServer, devnet: DevnetHandle) -> None:
    devnet.rpc("devnet_setLimits", {"ledgerMaxSorobanTxs": 100})
    fbs = [bidder(server, devnet, r) for r in (5000, 300, 200)]
    for fb in fbs:
        assert send(server, fb).status == S.PENDING
    devnet.close_ledger()
    for fb in fbs:
        assert_charged(devnet, fb, 100)


def test_a_surge_starves_a_base_fee_bid_while_a_higher_one_lands_at_the_surge_price(
        server: SorobanServer, devnet: DevnetHandle) -> None:
    devnet.set_fault("surge", rate=2000, txs=CAPACITY)  # 20x the base fee, enough to fill every ledger
    starved, above = bidder(server, devnet, 200), bidder(server, devnet, 3000)
    assert send(server, starved).status == S.PENDING and send(server, above).status == S.PENDING
    devnet.close_ledger()
    assert_charged(devnet, above, 2000)
    devnet.close_ledger(2)
    assert queued(devnet) == {starved.hash_hex()}  # three ledgers without inclusion: still queued
    devnet.close_ledger()  # the fourth: dropped and banned
    assert queued(devnet) == set()
    assert server.get_transaction(starved.hash_hex()).status == GetTransactionStatus.NOT_FOUND
    assert send(server, starved).status == S.TRY_AGAIN_LATER


def test_fee_stats_follow_the_surge_within_a_ledger_and_fall_back_after_the_window(
        server: SorobanServer, devnet: DevnetHandle) -> None:
    devnet.close_ledger(SOROBAN_WINDOW)  # nothing of earlier tests left in the window
    assert fee_stats(devnet)["transactionCount"] == "0"
    devnet.set_fault("surge", rate=2000, txs=CAPACITY + 1)
    devnet.close_ledger()
    stats = fee_stats(devnet)
    # The phantoms were charged the surge price (their own rate): CAPACITY of them were included.
    assert stats["p90"] == "2000" and stats["transactionCount"] == str(CAPACITY)
    assert stats["ledgerCount"] == SOROBAN_WINDOW
    devnet.clear_faults()
    devnet.close_ledger(SOROBAN_WINDOW - 1)
    assert fee_stats(devnet)["p90"] == "2000"  # still in the window
    devnet.close_ledger()
    assert fee_stats(devnet)["p90"] == "0" and fee_stats(devnet)["transactionCount"] == "0"  # stellar-rpc: 0


def test_fee_stats_are_the_charged_inclusion_fees_nearest_rank(server: SorobanServer, devnet: DevnetHandle) -> None:
    devnet.close_ledger(SOROBAN_WINDOW)
    fbs = [bidder(server, devnet, r) for r in (900, 700, 400)]
    for fb in fbs:
        send(server, fb)
    devnet.close_ledger(2)  # 900 and 700 at the surge price 700; then 400 alone, at the base fee
    stats = fee_stats(devnet)
    # Each fee bump's whole inclusion fee, as stellar-rpc counts it: its two operations at what it was charged.
    assert [stats[k] for k in ("min", "mode", "p10", "p50", "p60", "p90", "max", "transactionCount")] == \
        ["200", "1400", "200", "1400", "1400", "1400", "1400", "3"]


def test_a_full_queue_refuses_a_bid_below_its_lowest_with_the_fee_needed(server: SorobanServer,
                                                                        devnet: DevnetHandle) -> None:
    devnet.rpc("devnet_setLimits", {"ledgerMaxSorobanTxs": 1})  # the queue holds 2
    low, other = bidder(server, devnet, 300), bidder(server, devnet, 400)
    assert send(server, low).status == S.PENDING and send(server, other).status == S.PENDING
    refused = bidder(server, devnet, 300)  # a tie does not beat the lowest
    answer = send(server, refused)
    assert answer.status == S.ERROR
    res = xdr.TransactionResult.from_xdr(answer.error_result_xdr)
    assert res.result.code == xdr.TransactionResultCode.txINSUFFICIENT_FEE
    assert res.fee_charged.int64 == 301 * 2 + resource_fee(refused)
    # One that beats it evicts the lowest, which is dropped and banned.
    evicting = bidder(server, devnet, 500)
    assert send(server, evicting).status == S.PENDING
    assert queued(devnet) == {other.hash_hex(), evicting.hash_hex()}
    assert send(server, low).status == S.TRY_AGAIN_LATER


def test_the_surge_phantoms_fill_the_queue_and_give_way_to_a_higher_bid(server: SorobanServer,
                                                                        devnet: DevnetHandle) -> None:
    devnet.set_fault("surge", rate=1000, txs=2 * CAPACITY)  # the queue is full of phantoms alone
    below = bidder(server, devnet, 800)
    answer = send(server, below)
    assert answer.status == S.ERROR and result_code(answer.error_result_xdr) == "txINSUFFICIENT_FEE"
    assert xdr.TransactionResult.from_xdr(answer.error_result_xdr).fee_charged.int64 == \
        1001 * 2 + resource_fee(below)
    above = bidder(server, devnet, 1200)
    assert send(server, above).status == S.PENDING
    devnet.close_ledger()
    assert_charged(devnet, above, 1000)


def test_replace_by_fee_rescues_a_starving_transaction(server: SorobanServer, devnet: DevnetHandle) -> None:
    devnet.rpc("devnet_setLimits", {"ledgerMaxSorobanTxs": 1})
    devnet.set_fault("surge", rate=2000, txs=1)
    old = bidder(server, devnet, 200)
    assert send(server, old).status == S.PENDING
    devnet.close_ledger()
    assert queued(devnet) == {old.hash_hex()}  # starving behind the surge
    inner = old.transaction.inner_transaction_envelope
    under = fee_bump(devnet, inner, base_fee=1999)  # under 10x the queued rate
    assert result_code(send(server, under).error_result_xdr) == "txINSUFFICIENT_FEE"
    new = fee_bump(devnet, inner, base_fee=2500)  # >= 10x, and above the surge
    assert send(server, new).status == S.PENDING
    assert queued(devnet) == {new.hash_hex()}
    devnet.close_ledger()
    assert_charged(devnet, new, 2500)
    assert server.get_transaction(old.hash_hex()).status == GetTransactionStatus.NOT_FOUND
    again = send(server, old)  # the replaced envelope can no longer land: its sequence is used
    assert again.status == S.ERROR
    res = xdr.TransactionResult.from_xdr(again.error_result_xdr)
    assert res.result.inner_result_pair.result.result.code == xdr.TransactionResultCode.txBAD_SEQ


def test_the_surge_counts_its_ledgers_down_and_clears_itself(devnet: DevnetHandle) -> None:
    faults = devnet.set_fault("surge", rate=500, txs=3, ledgers=2)["faults"]
    assert [(f["kind"], f["rate"], f["txs"], f["ledgers"]) for f in faults] == [("surge", 500, 3, 2)]
    devnet.close_ledger()
    assert [f["ledgers"] for f in devnet.state()["faults"]] == [1]
    devnet.close_ledger()
    assert devnet.state()["faults"] == []
    # A second surge replaces the first; without `ledgers` it stays until cleared.
    devnet.set_fault("surge", rate=500, txs=3)
    devnet.set_fault("surge", rate=900, txs=1)
    devnet.close_ledger(3)
    assert [(f["rate"], f["txs"]) for f in devnet.state()["faults"]] == [(900, 1)]


def test_bad_surge_and_limit_requests(devnet: DevnetHandle) -> None:
    for params in ({"rate": 99, "txs": 1}, {"rate": 100, "txs": 0}, {"txs": 1}, {"rate": 100},
                   {"rate": 100, "txs": 1, "count": 2}):
        with pytest.raises(DevnetError, match="-32602"):
            devnet.set_fault("surge", **params)
    with pytest.raises(DevnetError, match="surge only"):
        devnet.set_fault("slow", ms=10, rate=200)
    for params in ({"ledgerMaxSorobanTxs": 0}, {"ledgerMaxClassicOps": -1}, {"ledgerMaxSorobanTxs": "2"}):
        with pytest.raises(DevnetError, match="-32602"):
            devnet.rpc("devnet_setLimits", params)
    assert devnet.state()["faults"] == [] and devnet.state()["limits"]["ledgerMaxSorobanTxs"] == CAPACITY


def test_cli_fault_surge_and_limits(devnet: DevnetHandle) -> None:
    r = run_cli("devnet", "fault", "surge", "--rate", "2000", "--txs", "3", "--ledgers", "4", "--url", devnet.url,
                "--json")
    assert r.code == 0, r.err
    assert [(f["kind"], f["rate"], f["txs"], f["ledgers"]) for f in json.loads(r.out)["faults"]] == \
        [("surge", 2000, 3, 4)]
    r = run_cli("devnet", "fault", "surge", "--clear", "--url", devnet.url, "--json")
    assert r.code == 0 and json.loads(r.out)["faults"] == []
    r = run_cli("devnet", "fault", "surge", "--rate", "50", "--txs", "3", "--url", devnet.url)
    assert r.code == 2 and "rate >= 100" in r.err
    r = run_cli("devnet", "limits", "--ledger-max-soroban-txs", "7", "--url", devnet.url, "--json")
    assert r.code == 0 and json.loads(r.out)["ledgerMaxSorobanTxs"] == 7
    assert devnet.state()["limits"]["ledgerMaxSorobanTxs"] == 7


def test_classic_capacity_counts_operations(server: SorobanServer, devnet: DevnetHandle) -> None:
    devnet.rpc("devnet_setLimits", {"ledgerMaxClassicOps": 1})
    sent = []
    for fee in (300, 100):
        src = Keypair.from_secret(devnet.rpc("devnet_createAccount", {})["secret"])
        tx = (TransactionBuilder(server.load_account(src.public_key), devnet.passphrase, base_fee=fee)
              .append_payment_op(kp(devnet.genesis["issuer"]).public_key, Asset.native(), "1")
              .set_timeout(86_400).build())
        tx.sign(src)
        assert send(server, tx).status == S.PENDING
        sent.append(tx)
    devnet.close_ledger()
    assert queued(devnet) == {sent[1].hash_hex()}
    got = server.get_transaction(sent[0].hash_hex())
    assert xdr.TransactionResult.from_xdr(got.result_xdr).fee_charged.int64 == 300  # the surge price: its own
    devnet.close_ledger()
    got = server.get_transaction(sent[1].hash_hex())
    assert xdr.TransactionResult.from_xdr(got.result_xdr).fee_charged.int64 == 100


def test_a_bid_equal_to_the_surge_loses_the_tie_to_its_phantoms(server: SorobanServer, devnet: DevnetHandle) -> None:
    devnet.set_fault("surge", rate=1000, txs=CAPACITY)
    tie = bidder(server, devnet, 1000)  # sent while the ledger is open: the phantoms arrived first
    assert send(server, tie).status == S.PENDING
    devnet.close_ledger()
    assert queued(devnet) == {tie.hash_hex()}
    devnet.clear_faults()
    devnet.close_ledger()
    assert_charged(devnet, tie, 100)  # alone once the surge is over: the base fee
