"""simulateTransaction: record vs enforce, credential types, in-band errors, and that the answer is
exactly what prepare_transaction needs for the devnet to accept the transaction."""

from __future__ import annotations

import pytest
from stellar_sdk import SorobanServer, TransactionBuilder, scval, xdr
from stellar_sdk.soroban_rpc import GetTransactionStatus, SendTransactionStatus

from tests.devnet.helpers import addr, call, fee_bump, invoke_tx, kp
from tests.support.devnet_support import DevnetHandle


def _buy(server: SorobanServer, devnet: DevnetHandle, user_i: int, lane_i: int, item: str = "coffee",
         price: int = 5):
    g = devnet.genesis
    user, lane = kp(g["users"][user_i]), kp(g["lanes"][lane_i])
    tx = invoke_tx(server, devnet, lane, g["contracts"]["market"], "buy",
                   [addr(user.public_key), scval.to_symbol(item), scval.to_int128(price)], prepare=False)
    return tx, user, lane


def test_record_mode_returns_entries_to_sign_with_the_requested_credential_type(
        server: SorobanServer, devnet: DevnetHandle) -> None:
    tx, _user, _ = _buy(server, devnet, 0, 0)
    sim = server.simulate_transaction(tx)  # no auth on the op: record mode; SDK default = ADDRESS_V2
    assert sim.error is None and sim.min_resource_fee > 0
    [entry_b64] = sim.results[0].auth
    entry = xdr.SorobanAuthorizationEntry.from_xdr(entry_b64)
    assert entry.credentials.type == xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_ADDRESS_V2
    assert entry.credentials.address_v2.signature_expiration_ledger.uint32 == 0
    assert entry.credentials.address_v2.signature.type == xdr.SCValType.SCV_VOID
    legacy = server.simulate_transaction(tx, use_upgraded_auth=False)
    entry = xdr.SorobanAuthorizationEntry.from_xdr(legacy.results[0].auth[0])
    assert entry.credentials.type == xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_ADDRESS
    data = xdr.SorobanTransactionData.from_xdr(sim.transaction_data)
    assert data.resource_fee.int64 == sim.min_resource_fee
    assert len(data.resources.footprint.read_write) >= 1 and data.resources.instructions.uint32 > 0
    raw_sim = call(devnet.url, "simulateTransaction", {"transaction": tx.to_xdr()})["result"]
    assert isinstance(raw_sim["minResourceFee"], str) and isinstance(raw_sim["latestLedger"], int)


def test_prepared_relay_with_legacy_address_credentials_lands(server: SorobanServer, devnet: DevnetHandle) -> None:
    from stellar_sdk.auth import authorize_entry

    tx, user, lane = _buy(server, devnet, 1, 1)
    sim = server.simulate_transaction(tx, use_upgraded_auth=False)
    latest = server.get_latest_ledger().sequence
    entry = authorize_entry(sim.results[0].auth[0], user, latest + 20, devnet.passphrase)
    tx.transaction.operations[0].auth = [entry]
    enforce = server.simulate_transaction(tx)  # auth present: enforce mode
    assert enforce.error is None, enforce.error
    prepared = server.prepare_transaction(tx, enforce)
    prepared.sign(lane)
    fb = fee_bump(devnet, prepared)
    assert server.send_transaction(fb).status == SendTransactionStatus.PENDING
    devnet.close_ledger()
    got = server.get_transaction(fb.hash_hex())
    assert got.status == GetTransactionStatus.SUCCESS
    assert xdr.TransactionMeta.from_xdr(got.result_meta_xdr).v4.soroban_meta.return_value.type == \
        xdr.SCValType.SCV_U64


def test_enforce_mode_rejects_a_bad_signature_in_band(server: SorobanServer, devnet: DevnetHandle) -> None:
    from stellar_sdk.auth import authorize_entry

    tx, _user, _ = _buy(server, devnet, 2, 2)
    sim = server.simulate_transaction(tx)
    impostor = kp(devnet.genesis["users"][3])
    latest = server.get_latest_ledger().sequence
    entry = authorize_entry(sim.results[0].auth[0], impostor, latest + 20, devnet.passphrase)
    tx.transaction.operations[0].auth = [entry]
    answer = call(devnet.url, "simulateTransaction", {"transaction": tx.to_xdr()})
    assert "error" not in answer  # HTTP 200, no JSON-RPC error …
    assert "Auth" in answer["result"]["error"]  # … the failure is in the result
    rec = call(devnet.url, "simulateTransaction", {"transaction": tx.to_xdr(), "authMode": "record"})
    # simulate_transaction.go validateAuthMode: recording over a present auth footprint is refused.
    assert rec["result"]["error"] == "cannot set authMode to 'record' with an auth footprint"


def test_contract_trap_and_shape_errors_are_in_band(server: SorobanServer, devnet: DevnetHandle) -> None:
    tx, _, lane = _buy(server, devnet, 0, 3, item="fail")
    sim = server.simulate_transaction(tx)
    assert sim.error and sim.transaction_data is None
    account = server.load_account(lane.public_key)
    g = devnet.genesis
    memo_tx = (TransactionBuilder(account, devnet.passphrase)
               .append_invoke_contract_function_op(g["contracts"]["billing"], "balance", [addr(lane.public_key)])
               .add_text_memo("hi").set_timeout(60).build())
    assert "memo" in server.simulate_transaction(memo_tx).error
    bad_mode = call(devnet.url, "simulateTransaction", {"transaction": memo_tx.to_xdr(), "authMode": "yolo"})
    assert "memo" in bad_mode["result"]["error"]  # stellar-rpc checks the memo before authMode


def test_read_only_call_returns_the_value(server: SorobanServer, devnet: DevnetHandle) -> None:
    g = devnet.genesis
    lane = kp(g["lanes"][4])
    tx = invoke_tx(server, devnet, lane, g["contracts"]["usdc"], "balance", [addr(g["users"][3]["public"])],
                   prepare=False)
    sim = server.simulate_transaction(tx)
    assert scval.to_native(xdr.SCVal.from_xdr(sim.results[0].xdr)) == 1_000 * 10_000_000


# stellar-rpc cmd/stellar-rpc/internal/methods/simulate_transaction.go passes the request's plain-bool
# `UseUpgradedAuth` to preflight (lib/preflight/src/shared.rs: make_recording_auth_mode(.., use_upgraded_auth)):
# absent means false, i.e. legacy SOROBAN_CREDENTIALS_ADDRESS; only `true` records ADDRESS_V2.
@pytest.mark.parametrize("flag,ctype", [
    (None, xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_ADDRESS),
    (False, xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_ADDRESS),
    (True, xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_ADDRESS_V2),
], ids=["absent-v1", "false-v1", "true-v2"])
def test_recording_follows_use_upgraded_auth_and_both_versions_land(
        server: SorobanServer, devnet: DevnetHandle, flag: bool | None, ctype: xdr.SorobanCredentialsType) -> None:
    from stellar_sdk.auth import authorize_entry

    user_i = {None: 2, False: 3, True: 0}[flag]
    tx, user, lane = _buy(server, devnet, user_i, 2 + user_i, item=f"tea-{flag}")
    params: dict = {"transaction": tx.to_xdr()}
    if flag is not None:
        params["useUpgradedAuth"] = flag
    res = call(devnet.url, "simulateTransaction", params)["result"]
    assert "error" not in res, res
    [entry_b64] = res["results"][0]["auth"]
    entry = xdr.SorobanAuthorizationEntry.from_xdr(entry_b64)
    assert entry.credentials.type == ctype
    latest = server.get_latest_ledger().sequence
    tx.transaction.operations[0].auth = [authorize_entry(entry, user, latest + 20, devnet.passphrase)]
    prepared = server.prepare_transaction(tx)  # enforce mode: the signed entry of either version verifies
    prepared.sign(lane)
    fb = fee_bump(devnet, prepared)
    assert server.send_transaction(fb).status == SendTransactionStatus.PENDING
    devnet.close_ledger()
    assert server.get_transaction(fb.hash_hex()).status == GetTransactionStatus.SUCCESS


# Every input branch of stellar-rpc's simulateTransaction handler answers HTTP 200 with `result.error`
# and latestLedger 0, in this order and with these texts: cmd/stellar-rpc/internal/methods/
# simulate_transaction.go (NewSimulateTransactionHandler, validateAuthMode) and go-stellar-sdk
# protocols/rpc/format.go (IsValidFormat). Only a param of the wrong JSON type fails request decoding.
def test_input_errors_are_in_band_as_stellar_rpc_words_them(server: SorobanServer, devnet: DevnetHandle) -> None:
    from stellar_sdk import Asset

    g = devnet.genesis
    lane = kp(g["lanes"][7])
    user = g["users"][1]["public"]
    account = server.load_account(lane.public_key)

    def build(*ops: str, memo: bool = False) -> str:
        b = TransactionBuilder(account, devnet.passphrase, base_fee=100).set_timeout(60)
        for op in ops:
            if op == "invoke":
                b.append_invoke_contract_function_op(g["contracts"]["billing"], "balance", [addr(user)])
            elif op == "payment":
                b.append_payment_op(user, Asset.native(), "1")
            elif op == "extend":
                b.append_extend_footprint_ttl_op(100)
        if memo:
            b.add_text_memo("hi")
        return b.build().to_xdr()

    def sim(params: dict) -> dict:
        body = call(devnet.url, "simulateTransaction", params)
        assert "error" not in body, body  # never a JSON-RPC error …
        assert body["result"]["latestLedger"] == 0, body  # … and the early-exit response's zero ledger
        return body["result"]["error"]

    invoke = build("invoke")
    assert sim({}) == "Could not unmarshal transaction"  # missing transaction = empty string
    assert sim({"transaction": "%%%"}) == "Could not unmarshal transaction"
    assert sim({"transaction": "AAAAAgAAAAA="}) == "Could not unmarshal transaction"
    assert sim({"transaction": invoke, "xdrFormat": "xml"}) == \
        "got 'xml': expected base64, json for optional 'xdrFormat'"
    assert sim({"transaction": build("invoke", "invoke")}) == "Transaction contains more than one operation"
    assert sim({"transaction": build("invoke", memo=True)}) == \
        "Transaction contains a memo. Soroban transactions do not support memos."
    assert sim({"transaction": invoke, "authMode": "yolo"}) == \
        "optional 'authMode' must be one of enforce,record,record_allow_nonroot when included"
    assert sim({"transaction": build("payment")}) == \
        "transaction contains unsupported operation type: OperationTypePayment"
    assert sim({"transaction": build("extend"), "authMode": "record"}) == \
        "cannot set authMode with non-InvokeHostFunction operations"
    assert sim({"transaction": build("extend")}).startswith(
        "To perform a SimulateTransaction for ExtendFootprintTtl or RestoreFootprint operations,")
    # A zero-operation envelope decodes (the XDR allows it) and is "more than one" to stellar-rpc.
    empty = TransactionBuilder(account, devnet.passphrase, base_fee=100).set_timeout(60)
    empty_env = empty.append_bump_sequence_op(0).build()
    empty_env.transaction.operations = []
    assert sim({"transaction": empty_env.to_xdr()}) == "Transaction contains more than one operation"
    # Wrong JSON types fail jrpc2's request decoding: -32602.
    assert call(devnet.url, "simulateTransaction", {"transaction": 5})["error"]["code"] == -32602
    assert call(devnet.url, "simulateTransaction",
                {"transaction": invoke, "useUpgradedAuth": "yes"})["error"]["code"] == -32602
