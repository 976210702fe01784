"""CAP-67 (protocol 23+) events as stellar-rpc serves them: classic XLM movements are the native SAC's
`transfer` events, fees are `fee` events of the native SAC at the transaction level.

Sources: stellar-rpc cmd/stellar-rpc/internal/db/transaction.go (parseEvents: transactionEventsXdr from
TransactionMetaV4.events, contractEventsXdr per operation), cmd/stellar-rpc/internal/methods/
get_transaction.go (BuildEventsXDRFromTransaction), cmd/stellar-rpc/internal/db/event.go (getEvents
indexes beforeAllTxs events under transaction 0, afterAllTxs under the maximum transaction index, and
keeps failed transactions' fee events with inSuccessfulContractCall false); soroban-env-host
stellar_asset_contract/event.rs for the transfer shape (name "native")."""

from __future__ import annotations

from stellar_sdk import Address, Asset, Keypair, SorobanServer, TransactionBuilder, scval, xdr

from tests.devnet.helpers import addr, call, fee_bump, invoke_tx, kp
from tests.support.devnet_support import DevnetHandle

BEFORE = xdr.TransactionEventStage.TRANSACTION_EVENT_STAGE_BEFORE_ALL_TXS
AFTER = xdr.TransactionEventStage.TRANSACTION_EVENT_STAGE_AFTER_ALL_TXS


def native(devnet: DevnetHandle) -> str:
    return Asset.native().contract_id(devnet.passphrase)


def decode(ev: xdr.ContractEvent) -> tuple[str, list, object]:
    body = ev.body.v0
    topics = [scval.to_native(t) for t in body.topics]
    topics = [t.address if isinstance(t, Address) else t for t in topics]
    return Address.from_raw_contract(ev.contract_id.contract_id.hash).address, topics, scval.to_native(body.data)


def test_native_payment_and_create_account_emit_transfer_and_fee_events(server: SorobanServer,
                                                                        devnet: DevnetHandle) -> None:
    g = devnet.genesis
    src, dest = kp(g["lanes"][0]), g["users"][0]["public"]
    fresh = Keypair.random().public_key
    tx = (TransactionBuilder(server.load_account(src.public_key), devnet.passphrase, base_fee=100)
          .append_payment_op(dest, Asset.native(), "2.5")
          .append_create_account_op(fresh, "10").set_timeout(300).build())
    tx.sign(src)
    assert server.send_transaction(tx).status.value == "PENDING"
    devnet.close_ledger()
    r = call(devnet.url, "getTransaction", {"hash": tx.hash_hex()})["result"]
    assert r["status"] == "SUCCESS"
    per_op = [[decode(xdr.ContractEvent.from_xdr(e)) for e in op] for op in r["events"]["contractEventsXdr"]]
    assert per_op == [[(native(devnet), ["transfer", src.public_key, dest, "native"], 25_000_000)],
                      [(native(devnet), ["transfer", src.public_key, fresh, "native"], 100_000_000)]]
    [fee] = [xdr.TransactionEvent.from_xdr(e) for e in r["events"]["transactionEventsXdr"]]
    assert fee.stage == BEFORE and decode(fee.event) == (native(devnet), ["fee", src.public_key], 200)
    # The same events sit in TransactionMetaV4, where stellar-rpc reads them from.
    meta = xdr.TransactionMeta.from_xdr(r["resultMetaXdr"]).v4
    assert [e.to_xdr() for e in meta.events] == r["events"]["transactionEventsXdr"]
    assert [[e.to_xdr() for e in op.events] for op in meta.operations] == r["events"]["contractEventsXdr"]
    # getEvents: fee first (transaction index 0), then the operations' transfers.
    page = call(devnet.url, "getEvents", {"startLedger": r["ledger"], "endLedger": r["ledger"] + 1,
                                          "filters": [{"contractIds": [native(devnet)]}]})["result"]
    kinds = [(scval.to_native(e["topic"][0]), e["transactionIndex"], e["operationIndex"]) for e in page["events"]]
    assert kinds == [("fee", 0, 0), ("transfer", 1, 0), ("transfer", 1, 1)]
    assert all(e["txHash"] == tx.hash_hex() and e["inSuccessfulContractCall"] for e in page["events"])


def test_soroban_fee_bump_charges_up_front_and_refunds_after_all_txs(server: SorobanServer,
                                                                     devnet: DevnetHandle) -> None:
    g = devnet.genesis
    lane, fee_source = kp(g["lanes"][1]), g["fee_account"]["public"]
    inner = invoke_tx(server, devnet, lane, g["contracts"]["billing"], "balance", [addr(g["users"][1]["public"])])
    fb = fee_bump(devnet, inner)
    assert server.send_transaction(fb).status.value == "PENDING"
    devnet.close_ledger()
    r = call(devnet.url, "getTransaction", {"hash": fb.hash_hex()})["result"]
    charged = xdr.TransactionResult.from_xdr(r["resultXdr"]).fee_charged.int64
    before, after = [xdr.TransactionEvent.from_xdr(e) for e in r["events"]["transactionEventsXdr"]]
    resource_fee = inner.transaction.soroban_data.resource_fee.int64
    assert before.stage == BEFORE and decode(before.event)[1] == ["fee", fee_source]
    assert decode(before.event)[2] == 100 * 2 + resource_fee  # inclusion (ops + 1) + the whole resource fee
    assert after.stage == AFTER and decode(after.event)[1] == ["fee", fee_source]
    assert decode(after.event)[2] < 0 and decode(before.event)[2] + decode(after.event)[2] == charged
    page = call(devnet.url, "getEvents", {"startLedger": r["ledger"], "endLedger": r["ledger"] + 1,
                                          "filters": [{"contractIds": [native(devnet)]}]})["result"]
    assert [e["transactionIndex"] for e in page["events"]] == [0, 0xFFFFF]  # afterAllTxs: the max index


def test_failed_transactions_keep_their_fee_event_only(server: SorobanServer, devnet: DevnetHandle) -> None:
    g = devnet.genesis
    src = kp(g["lanes"][2])
    tx = (TransactionBuilder(server.load_account(src.public_key), devnet.passphrase, base_fee=100)
          .append_payment_op(Keypair.random().public_key, Asset.native(), "1").set_timeout(300).build())
    tx.sign(src)  # the destination does not exist: PAYMENT_NO_DESTINATION
    assert server.send_transaction(tx).status.value == "PENDING"
    devnet.close_ledger()
    r = call(devnet.url, "getTransaction", {"hash": tx.hash_hex()})["result"]
    assert r["status"] == "FAILED" and r["events"]["contractEventsXdr"] == [[]]
    assert len(r["events"]["transactionEventsXdr"]) == 1
    page = call(devnet.url, "getEvents", {"startLedger": r["ledger"], "endLedger": r["ledger"] + 1,
                                          "filters": [{"contractIds": [native(devnet)]}]})["result"]
    [ev] = page["events"]
    assert scval.to_native(ev["topic"][0]) == "fee" and ev["inSuccessfulContractCall"] is False


def test_fee_events_allowances_and_admin_survive_a_restart(tmp_path) -> None:
    """--state keeps the new state: CAP-67 transaction events, failed-tx event flags, SAC allowances
    and a changed SAC admin (persist.py round trip of TxRecord, EventRecord and contract storage)."""
    from stellar_sdk.client.requests_client import RequestsClient

    from tests.support.devnet_support import start_devnet

    state = tmp_path / "state.json"
    dev = start_devnet(tmp_path, state=state, lanes=1, users=2)
    try:
        with SorobanServer(dev.url, client=RequestsClient(num_retries=0)) as server:
            g = dev.genesis
            user, lane = kp(g["users"][0]), kp(g["lanes"][0])
            latest = server.get_latest_ledger().sequence
            approve = invoke_tx(server, dev, user, g["contracts"]["usdc"], "approve",
                                [addr(user.public_key), addr(lane.public_key), scval.to_int128(77),
                                 scval.to_uint32(latest + 100)])
            assert server.send_transaction(approve).status.value == "PENDING"
            issuer = kp(g["issuer"])
            handover = invoke_tx(server, dev, issuer, g["contracts"]["usdc"], "set_admin", [addr(g["admin"]["public"])])
            assert server.send_transaction(handover).status.value == "PENDING"
            dev.close_ledger()
            assert server.get_transaction(handover.hash_hex()).status.value == "SUCCESS"
            before = call(dev.url, "getTransaction", {"hash": approve.hash_hex()})["result"]["events"]
    finally:
        dev.stop()
    dev = start_devnet(tmp_path, state=state, lanes=1, users=2)
    try:
        with SorobanServer(dev.url, client=RequestsClient(num_retries=0)) as server:
            after = call(dev.url, "getTransaction", {"hash": approve.hash_hex()})["result"]["events"]
            assert after == before and len(after["transactionEventsXdr"]) == 2
            sim = server.simulate_transaction(invoke_tx(server, dev, lane, g["contracts"]["usdc"], "allowance",
                                                        [addr(user.public_key), addr(lane.public_key)],
                                                        prepare=False))
            assert scval.to_native(xdr.SCVal.from_xdr(sim.results[0].xdr)) == 77
            sim = server.simulate_transaction(invoke_tx(server, dev, lane, g["contracts"]["usdc"], "admin", [],
                                                        prepare=False))
            assert scval.to_native(xdr.SCVal.from_xdr(sim.results[0].xdr)).address == g["admin"]["public"]
    finally:
        dev.stop()
