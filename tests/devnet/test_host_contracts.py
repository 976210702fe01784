"""The devnet host's native contract models: SAC (USDC), billing, market."""

from __future__ import annotations

import hashlib

from stellar_sdk import Address, Asset, Keypair, StrKey, scval, xdr
from stellar_sdk.base_soroban_server import _build_sac_balance_ledger_key
from stellar_sdk.soroban_rpc import GetSACBalanceResponse, LedgerEntryResult

from paygate_cli.sandbox.devnet.host import InvokeOutcome
from tests.devnet.host_support import (
    ADMIN,
    ALICE,
    BOB,
    ISSUER,
    LANE,
    LEDGER,
    PASS,
    STRANGER,
    Env,
    a,
    call,
    contract_error,
    event,
    view,
)
from tests.devnet.host_support import env as env


def h32(s: str) -> bytes:
    return hashlib.sha256(s.encode()).digest()


# --- SAC ---------------------------------------------------------------------------------------------------


def test_sac_transfer_moves_balances_and_emits_cap67_event(env: Env) -> None:
    args = [a(ALICE), a(BOB), scval.to_int128(300)]
    out = call(env, env.usdc, "transfer", args, source=ALICE)
    assert out.ok, out.error
    assert env.host.token_balance(env.usdc, ALICE.public_key) == 700
    assert env.host.token_balance(env.usdc, BOB.public_key) == 300
    assert [event(e) for e in out.events] == [
        (env.usdc, ["transfer", ALICE.public_key, BOB.public_key, f"USDC:{ISSUER.public_key}"], 300)
    ]
    # The topic asset is a String, the amount an i128, as in CAP-67.
    v0 = out.events[0].body.v0
    assert v0 is not None and v0.topics[3].type == xdr.SCValType.SCV_STRING
    assert v0.data.type == xdr.SCValType.SCV_I128
    assert view(env, env.usdc, "balance", [a(BOB)]) == 300


def test_sac_balances_are_real_trustline_and_contract_data_entries(env: Env) -> None:
    call(env, env.usdc, "transfer", [a(ALICE), a(env.billing), scval.to_int128(250)], source=ALICE)
    asset = Asset("USDC", ISSUER.public_key)
    tl_key = xdr.LedgerKey(
        xdr.LedgerEntryType.TRUSTLINE,
        trust_line=xdr.LedgerKeyTrustLine(ALICE.xdr_account_id(), asset.to_trust_line_asset_xdr_object()),
    )
    found = env.host.get_ledger_entry(tl_key, LEDGER)
    assert found is not None
    entry, live_until = found
    assert live_until is None  # classic entries have no TTL
    tl = entry.data.trust_line
    assert tl is not None and tl.balance.int64 == 750 and tl.flags.uint32 & 1
    assert entry.last_modified_ledger_seq.uint32 == LEDGER
    # A contract's SAC balance is read the way SorobanServer.get_sac_balance does it.
    key = _build_sac_balance_ledger_key(asset, env.billing, PASS)
    found = env.host.get_ledger_entry(key, LEDGER)
    assert found is not None
    # getLedgerEntries puts the LedgerEntryData XDR on the wire; parse it as the SDK does.
    result = LedgerEntryResult.model_validate(
        {
            "key": key.to_xdr(),
            "xdr": found[0].data.to_xdr(),
            "lastModifiedLedgerSeq": LEDGER,
            "liveUntilLedgerSeq": found[1],
        }
    )
    bal = GetSACBalanceResponse.from_ledger_entry_result(result, LEDGER).balance_entry
    assert bal is not None and int(bal.amount) == 250 and bal.authorized and not bal.clawback


def test_sac_transfer_errors(env: Env) -> None:
    assert contract_error(call(env, env.usdc, "transfer", [a(ALICE), a(BOB), scval.to_int128(1_001)], source=ALICE), 10)
    assert contract_error(call(env, env.usdc, "transfer", [a(ALICE), a(BOB), scval.to_int128(-1)], source=ALICE), 8)
    assert contract_error(
        call(env, env.usdc, "transfer", [a(ALICE), a(STRANGER), scval.to_int128(1)], source=ALICE), 13
    )  # no trustline
    # Moving someone else's money needs their authorisation.
    out = call(env, env.usdc, "transfer", [a(ALICE), a(BOB), scval.to_int128(1)], source=BOB)
    assert not out.ok and "Error(Auth, InvalidAction)" in (out.error or "")
    assert env.host.token_balance(env.usdc, ALICE.public_key) == 1_000


def test_sac_metadata_and_instance(env: Env) -> None:
    assert view(env, env.usdc, "decimals", []) == 7
    assert view(env, env.usdc, "symbol", []) == "USDC"
    assert view(env, env.usdc, "name", []) == f"USDC:{ISSUER.public_key}"
    inst_key = xdr.LedgerKey(
        xdr.LedgerEntryType.CONTRACT_DATA,
        contract_data=xdr.LedgerKeyContractData(
            contract=Address(env.usdc).to_xdr_sc_address(),
            key=xdr.SCVal(xdr.SCValType.SCV_LEDGER_KEY_CONTRACT_INSTANCE),
            durability=xdr.ContractDataDurability.PERSISTENT,
        ),
    )
    found = env.host.get_ledger_entry(inst_key, LEDGER)
    assert found is not None
    cd = found[0].data.contract_data
    assert cd is not None and cd.val.instance is not None
    assert cd.val.instance.executable.type == xdr.ContractExecutableType.CONTRACT_EXECUTABLE_STELLAR_ASSET


def test_wasm_contracts_have_instance_and_code_entries(env: Env) -> None:
    for contract in (env.billing, env.market):
        inst_key = xdr.LedgerKey(
            xdr.LedgerEntryType.CONTRACT_DATA,
            contract_data=xdr.LedgerKeyContractData(
                contract=Address(contract).to_xdr_sc_address(),
                key=xdr.SCVal(xdr.SCValType.SCV_LEDGER_KEY_CONTRACT_INSTANCE),
                durability=xdr.ContractDataDurability.PERSISTENT,
            ),
        )
        found = env.host.get_ledger_entry(inst_key, LEDGER)
        assert found is not None
        inst = found[0].data.contract_data.val.instance  # type: ignore[union-attr]
        assert inst is not None and inst.executable.type == xdr.ContractExecutableType.CONTRACT_EXECUTABLE_WASM
        code_key = xdr.LedgerKey(
            xdr.LedgerEntryType.CONTRACT_CODE, contract_code=xdr.LedgerKeyContractCode(inst.executable.wasm_hash)
        )
        code = env.host.get_ledger_entry(code_key, LEDGER)
        assert code is not None and code[0].data.contract_code is not None
        wasm = code[0].data.contract_code.code
        assert wasm.startswith(b"\x00asm") and hashlib.sha256(wasm).digest() == inst.executable.wasm_hash.hash


# --- billing -------------------------------------------------------------------------------------------------------


def credit(env: Env, account: Keypair, amount: int, deposit: str, *, operator: Keypair = LANE) -> InvokeOutcome:
    args = [a(operator), a(account), scval.to_int128(amount), scval.to_bytes(h32(deposit))]
    return call(env, env.billing, "credit", args, source=operator)


def charge(env: Env, entries: list[tuple[Keypair, int, str]], *, operator: Keypair = LANE) -> InvokeOutcome:
    args = [
        a(operator),
        scval.to_vec([a(k) for k, _, _ in entries]),
        scval.to_vec([scval.to_int128(n) for _, n, _ in entries]),
        scval.to_vec([scval.to_bytes(h32(c)) for _, _, c in entries]),
    ]
    return call(env, env.billing, "charge_batch", args, source=operator)


def billing_balance(env: Env, k: Keypair) -> int:
    return view(env, env.billing, "balance", [a(k)])  # type: ignore[return-value]


def test_credit_once_per_deposit_tx(env: Env) -> None:
    out = credit(env, ALICE, 500, "dep-1")
    assert out.ok, out.error
    assert [event(e) for e in out.events] == [(env.billing, ["credit", ALICE.public_key], [500, h32("dep-1")])]
    assert billing_balance(env, ALICE) == 500
    assert view(env, env.billing, "is_credited", [scval.to_bytes(h32("dep-1"))]) is True
    assert view(env, env.billing, "is_credited", [scval.to_bytes(h32("dep-2"))]) is False
    again = credit(env, ALICE, 500, "dep-1")
    assert contract_error(again, 2) and again.events == []
    assert billing_balance(env, ALICE) == 500
    assert credit(env, ALICE, 1, "dep-2").ok
    assert billing_balance(env, ALICE) == 501


def test_non_operator_cannot_credit_or_charge(env: Env) -> None:
    # STRANGER authorises (it is the source) but is not on the allow-list.
    assert contract_error(credit(env, ALICE, 5, "dep-x", operator=STRANGER), 1)
    assert contract_error(charge(env, [(ALICE, 1, "c-x")], operator=STRANGER), 1)
    # An allow-listed operator that did not authorise fails auth.
    args = [a(LANE), a(ALICE), scval.to_int128(5), scval.to_bytes(h32("dep-y"))]
    out = call(env, env.billing, "credit", args, source=STRANGER, signed_by_source=False)
    assert not out.ok and "Error(Auth, InvalidAction)" in (out.error or "")
    assert billing_balance(env, ALICE) == 0


def test_charge_batch_mix_of_outcomes(env: Env) -> None:
    assert credit(env, ALICE, 100, "dep-a").ok
    assert credit(env, BOB, 10, "dep-b").ok
    assert charge(env, [(ALICE, 30, "c-old")]).ok  # consumed before the batch
    out = charge(
        env,
        [
            (ALICE, 20, "c-1"),  # settles
            (BOB, 50, "c-2"),  # insufficient
            (ALICE, 5, "c-old"),  # already consumed → skipped
            (ALICE, 0, "c-3"),  # invalid amount
            (BOB, -4, "c-4"),  # invalid amount
            (ALICE, 7, "c-1"),  # duplicate inside the batch → skipped
            (BOB, 10, "c-5"),  # settles to zero
        ],
    )
    assert out.ok, out.error
    assert scval.to_native(out.return_value) == [2, 3, 2]
    assert [event(e) for e in out.events] == [
        (env.billing, ["charge", ALICE.public_key], [20, h32("c-1")]),
        (env.billing, ["charge_failed", BOB.public_key], [50, h32("c-2"), "insufficient_balance"]),
        (env.billing, ["charge_failed", ALICE.public_key], [0, h32("c-3"), "invalid_amount"]),
        (env.billing, ["charge_failed", BOB.public_key], [-4, h32("c-4"), "invalid_amount"]),
        (env.billing, ["charge", BOB.public_key], [10, h32("c-5")]),
    ]
    assert billing_balance(env, ALICE) == 50
    assert billing_balance(env, BOB) == 0
    # Every processed id is consumed, failed ones included; resubmitting the batch changes nothing.
    for cid in ("c-1", "c-2", "c-3", "c-4", "c-5", "c-old"):
        assert view(env, env.billing, "is_charged", [scval.to_bytes(h32(cid))]) is True
    assert view(env, env.billing, "is_charged", [scval.to_bytes(h32("c-never"))]) is False
    again = charge(env, [(ALICE, 20, "c-1"), (BOB, 50, "c-2")])
    assert again.ok and scval.to_native(again.return_value) == [0, 0, 2] and again.events == []
    assert billing_balance(env, ALICE) == 50


def test_charge_batch_size_and_shape_traps(env: Env) -> None:
    assert credit(env, ALICE, 1_000, "dep").ok
    too_big = charge(env, [(ALICE, 1, f"c{i}") for i in range(101)])
    assert contract_error(too_big, 4) and too_big.events == []
    args = [
        a(LANE),
        scval.to_vec([a(ALICE), a(ALICE)]),
        scval.to_vec([scval.to_int128(1)]),
        scval.to_vec([scval.to_bytes(h32("m1")), scval.to_bytes(h32("m2"))]),
    ]
    assert contract_error(call(env, env.billing, "charge_batch", args), 5)
    assert billing_balance(env, ALICE) == 1_000
    assert view(env, env.billing, "is_charged", [scval.to_bytes(h32("c0"))]) is False


def test_wrong_argument_types_trap(env: Env) -> None:
    cases = [
        (env.usdc, "transfer", [a(ALICE), a(BOB), scval.to_int64(5)]),  # i64 instead of i128
        (env.billing, "credit", [a(LANE), scval.to_symbol("alice"), scval.to_int128(5), scval.to_bytes(h32("d"))]),
        (
            env.billing,
            "charge_batch",
            [
                a(LANE),
                scval.to_vec([a(ALICE)]),
                scval.to_vec([scval.to_uint64(1)]),
                scval.to_vec([scval.to_bytes(h32("c"))]),
            ],
        ),
        (env.market, "buy", [a(ALICE), scval.to_string("book"), scval.to_int128(5)]),
    ]
    for contract, fn, args in cases:
        out = call(env, contract, fn, args, source=ALICE if contract != env.billing else LANE)
        assert not out.ok and out.error_kind == "trapped", fn
        assert (out.error or "").startswith("HostError: Error(Value, UnexpectedType)"), out.error
    short = call(env, env.billing, "credit", [a(LANE), a(ALICE), scval.to_int128(5), scval.to_bytes(b"\x01" * 31)])
    assert not short.ok and "Error(Value, UnexpectedSize)" in (short.error or "")
    missing = call(env, env.billing, "no_such_fn", [])
    assert not missing.ok and "Error(WasmVm, MissingValue)" in (missing.error or "")


def test_add_and_remove_operator_need_the_admin(env: Env) -> None:
    args = [a(ADMIN), a(STRANGER)]
    assert call(env, env.billing, "add_operator", args, source=ADMIN).ok
    assert credit(env, ALICE, 5, "dep-s", operator=STRANGER).ok
    assert contract_error(call(env, env.billing, "remove_operator", [a(STRANGER), a(STRANGER)], source=STRANGER), 1)
    assert call(env, env.billing, "remove_operator", args, source=ADMIN).ok
    assert contract_error(credit(env, ALICE, 5, "dep-t", operator=STRANGER), 1)
    assert billing_balance(env, ALICE) == 5


# --- market --------------------------------------------------------------------------------------------------------


def test_market_buy_and_fail_on_demand(env: Env) -> None:
    buy = [a(ALICE), scval.to_symbol("book"), scval.to_int128(42)]
    out = call(env, env.market, "buy", buy, source=ALICE)
    assert out.ok, out.error
    assert scval.to_native(out.return_value) == 1
    assert out.return_value is not None and out.return_value.type == xdr.SCValType.SCV_U64
    assert [event(e) for e in out.events] == [(env.market, ["order", ALICE.public_key], ["book", 42, 1])]
    assert scval.to_native(call(env, env.market, "buy", buy, source=ALICE).return_value) == 2
    for bad in (
        [a(ALICE), scval.to_symbol("fail"), scval.to_int128(42)],
        [a(ALICE), scval.to_symbol("book"), scval.to_int128(0)],
    ):
        failed = call(env, env.market, "buy", bad, source=ALICE)
        assert contract_error(failed, 1) and failed.events == []
    assert view(env, env.market, "orders", [a(ALICE)]) == 2
    assert view(env, env.market, "orders", [a(BOB)]) == 0


def test_unknown_contract_and_non_invoke_host_functions_fail_cleanly(env: Env) -> None:
    ghost = StrKey.encode_contract(h32("ghost"))
    out = call(env, ghost, "balance", [a(ALICE)], signed_by_source=False)
    assert not out.ok and "Error(Storage, MissingValue)" in (out.error or "")
    upload = xdr.HostFunction(xdr.HostFunctionType.HOST_FUNCTION_TYPE_UPLOAD_CONTRACT_WASM, wasm=b"\x00asm")
    out = env.host.invoke(
        host_function=upload,
        auth=[],
        source_account=LANE.public_key,
        ledger_seq=LEDGER,
        ledger_close_time=0,
        mode="apply",
    )
    assert not out.ok and out.error_kind == "trapped"
