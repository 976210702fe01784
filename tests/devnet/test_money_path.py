"""The happy path through SorobanServer only: a fee-bumped, user-authorised SAC transfer into the
billing contract, `credit` for it, then `charge_batch` with good, insufficient and duplicate ids."""

from __future__ import annotations

import hashlib

import pytest
from stellar_sdk import Address, SorobanServer, StrKey, scval, xdr
from stellar_sdk.soroban_rpc import GetTransactionStatus, SendTransactionStatus

from tests.devnet.helpers import addr, bytes32, fee_bump, invoke_tx, kp
from tests.support.devnet_support import DevnetHandle

AMOUNT = 25_000_000


def _land(server: SorobanServer, devnet: DevnetHandle, env) -> object:
    sent = server.send_transaction(env)
    assert sent.status == SendTransactionStatus.PENDING, sent
    devnet.close_ledger()
    got = server.get_transaction(sent.hash)
    assert got.status == GetTransactionStatus.SUCCESS, got
    return got


def _events(got) -> list[tuple[str, list, object]]:
    out = []
    for op_events in got.events.contract_events_xdr:
        for b64 in op_events:
            ev = xdr.ContractEvent.from_xdr(b64)
            out.append((StrKey.encode_contract(ev.contract_id.contract_id.hash),
                        [scval.to_native(t) for t in ev.body.v0.topics], scval.to_native(ev.body.v0.data)))
    return out


def _balance(server: SorobanServer, devnet: DevnetHandle, contract: str, who: str) -> int:
    lane = kp(devnet.genesis["lanes"][7])
    tx = invoke_tx(server, devnet, lane, contract, "balance", [addr(who)], prepare=False)
    sim = server.simulate_transaction(tx)
    assert sim.error is None, sim.error
    return scval.to_native(xdr.SCVal.from_xdr(sim.results[0].xdr))


@pytest.fixture(scope="module")
def deposit(server: SorobanServer, devnet: DevnetHandle) -> dict:
    g = devnet.genesis
    user, lane = kp(g["users"][0]), kp(g["lanes"][0])
    billing, usdc = g["contracts"]["billing"], g["contracts"]["usdc"]
    inner = invoke_tx(server, devnet, lane, usdc, "transfer", [addr(user.public_key), addr(billing),
                      scval.to_int128(AMOUNT)], signers=[user])
    fb = fee_bump(devnet, inner)
    got = _land(server, devnet, fb)
    return {"inner": inner.hash_hex(), "outer": fb.hash_hex(), "got": got}


def test_fee_bumped_user_authorised_transfer_lands_and_is_indexed_by_both_hashes(
        server: SorobanServer, devnet: DevnetHandle, deposit: dict) -> None:
    g = devnet.genesis
    got = deposit["got"]
    assert got.fee_bump is True and got.application_order == 1
    by_inner = server.get_transaction(deposit["inner"])
    assert by_inner.status == GetTransactionStatus.SUCCESS and by_inner.ledger == got.ledger
    assert by_inner.transaction_hash == deposit["inner"]
    result = xdr.TransactionResult.from_xdr(got.result_xdr)
    assert result.result.code == xdr.TransactionResultCode.txFEE_BUMP_INNER_SUCCESS
    assert result.result.inner_result_pair.transaction_hash.hash.hex() == deposit["inner"]
    meta = xdr.TransactionMeta.from_xdr(got.result_meta_xdr)
    assert meta.v == 4 and meta.v4.soroban_meta is not None
    assert meta.to_xdr() == got.result_meta_xdr  # canonical XDR (the devnet assembles it by hand)
    # the op result's success hash is sha256(InvokeHostFunctionSuccessPreImage{returnValue, events})
    pre = xdr.InvokeHostFunctionSuccessPreImage(return_value=meta.v4.soroban_meta.return_value,
                                                events=meta.v4.operations[0].events)
    op_result = result.result.inner_result_pair.result.result.results[0].tr.invoke_host_function_result
    assert op_result.success.hash == hashlib.sha256(pre.to_xdr_bytes()).digest()
    user = g["users"][0]["public"]
    [(cid, topics, data)] = _events(got)
    assert cid == g["contracts"]["usdc"]
    assert topics[0] == "transfer" and topics[1].address == user
    assert topics[2].address == g["contracts"]["billing"] and topics[3] == g["asset"]
    assert data == AMOUNT


def test_nonce_of_the_user_auth_entry_is_stored_and_replay_is_rejected(
        server: SorobanServer, devnet: DevnetHandle, deposit: dict) -> None:
    env = xdr.TransactionEnvelope.from_xdr(server.get_transaction(deposit["inner"]).envelope_xdr)
    entry = env.fee_bump.tx.inner_tx.v1.tx.operations[0].body.invoke_host_function_op.auth[0]
    creds = entry.credentials.address_v2 or entry.credentials.address
    key = xdr.LedgerKey(type=xdr.LedgerEntryType.CONTRACT_DATA, contract_data=xdr.LedgerKeyContractData(
        contract=creds.address,
        key=xdr.SCVal(type=xdr.SCValType.SCV_LEDGER_KEY_NONCE, nonce_key=xdr.SCNonceKey(nonce=creds.nonce)),
        durability=xdr.ContractDataDurability.TEMPORARY))
    [entry_res] = server.get_ledger_entries([key]).entries
    assert entry_res.live_until_ledger == creds.signature_expiration_ledger.uint32
    # The same signed auth entry in a new transaction from another lane: simulation (enforce) fails …
    g = devnet.genesis
    lane = kp(g["lanes"][1])
    op = env.fee_bump.tx.inner_tx.v1.tx.operations[0].body.invoke_host_function_op
    from stellar_sdk import TransactionBuilder

    tx = (TransactionBuilder(server.load_account(lane.public_key), devnet.passphrase, base_fee=100)
          .append_invoke_contract_function_op(g["contracts"]["usdc"], "transfer",
                                              list(op.host_function.invoke_contract.args), auth=[entry])
          .set_timeout(300).build())
    sim = server.simulate_transaction(tx)
    assert sim.error is not None and "Auth" in sim.error
    # … and forced through with the original resources, it traps at apply: FAILED, no events.
    tx.transaction.soroban_data = env.fee_bump.tx.inner_tx.v1.tx.ext.soroban_data
    tx.transaction.fee += tx.transaction.soroban_data.resource_fee.int64
    tx.sign(lane)
    sent = server.send_transaction(tx)
    assert sent.status == SendTransactionStatus.PENDING, sent
    devnet.close_ledger()
    got = server.get_transaction(sent.hash)
    assert got.status == GetTransactionStatus.FAILED
    r = xdr.TransactionResult.from_xdr(got.result_xdr)
    assert r.result.code == xdr.TransactionResultCode.txFAILED
    assert r.result.results[0].tr.invoke_host_function_result.code == \
        xdr.InvokeHostFunctionResultCode.INVOKE_HOST_FUNCTION_TRAPPED
    assert got.events.contract_events_xdr == [[]]


def test_credit_then_charge_batch_with_good_insufficient_and_duplicate_ids(
        server: SorobanServer, devnet: DevnetHandle, deposit: dict) -> None:
    g = devnet.genesis
    billing = g["contracts"]["billing"]
    user, poor = g["users"][0]["public"], g["users"][1]["public"]
    lane = kp(g["lanes"][2])
    deposit_tx = bytes.fromhex(deposit["inner"])
    credit = invoke_tx(server, devnet, lane, billing, "credit",
                       [addr(lane.public_key), addr(user), scval.to_int128(AMOUNT), scval.to_bytes(deposit_tx)])
    got = _land(server, devnet, fee_bump(devnet, credit))
    [(cid, topics, data)] = _events(got)
    assert cid == billing and topics[0] == "credit" and topics[1].address == user
    assert data == [AMOUNT, deposit_tx]
    assert _balance(server, devnet, billing, user) == AMOUNT

    a, b = bytes32("charge-a"), bytes32("charge-b")
    args = [scval.to_vec([addr(user), addr(poor), addr(user)]),
            scval.to_vec([scval.to_int128(10), scval.to_int128(5), scval.to_int128(10)]),
            scval.to_vec([scval.to_bytes(a), scval.to_bytes(b), scval.to_bytes(a)])]
    batch = invoke_tx(server, devnet, lane, billing, "charge_batch", [addr(lane.public_key), *args])
    got = _land(server, devnet, fee_bump(devnet, batch))
    rv = xdr.TransactionMeta.from_xdr(got.result_meta_xdr).v4.soroban_meta.return_value
    assert scval.to_native(rv) == [1, 1, 1]  # settled, failed (insufficient), skipped (duplicate id)
    kinds = [(topics[0], Address(topics[1].address).address) for _, topics, _ in _events(got)]
    assert kinds == [("charge", user), ("charge_failed", poor)]
    assert _balance(server, devnet, billing, user) == AMOUNT - 10
    # The same batch again: every id is consumed or fails, nothing is debited twice.
    again = invoke_tx(server, devnet, lane, billing, "charge_batch", [addr(lane.public_key), *args])
    got = _land(server, devnet, fee_bump(devnet, again))
    rv = xdr.TransactionMeta.from_xdr(got.result_meta_xdr).v4.soroban_meta.return_value
    assert scval.to_native(rv)[0] == 0
    assert _balance(server, devnet, billing, user) == AMOUNT - 10


def test_fee_stats_reflect_applied_soroban_bids(devnet: DevnetHandle, deposit: dict) -> None:
    from tests.devnet.helpers import call

    fs = call(devnet.url, "getFeeStats")["result"]["sorobanInclusionFee"]
    assert int(fs["transactionCount"]) >= 1
    # Charged, not bid: the fee bumps bid 200 per operation and nothing was full, so each paid the base
    # fee for its two operations; stellar-rpc reports a Soroban transaction's whole inclusion fee.
    assert fs["max"] == "200"
