"""The USDC SAC's whole interface, against soroban-env-host's Stellar Asset Contract
(soroban-env-host/src/builtin_contracts/stellar_asset_contract/: contract.rs for each function's
checks and their order, allowance.rs for allowances, balance.rs for authorization and clawback,
event.rs for the CAP-67 event shapes). The devnet's issuer has no account flags, so a real SAC refuses
to deauthorize (#2 OperationNotSupported) and finds nothing clawbackable (#10 BalanceError)."""

from __future__ import annotations

from stellar_sdk import Address, SorobanServer, scval, xdr

from paygate_cli.sandbox.devnet.contracts import sac as sac_model
from paygate_cli.sandbox.devnet.host import InvokeOutcome
from tests.devnet.helpers import fee_bump, invoke_tx
from tests.devnet.helpers import kp as genesis_kp
from tests.devnet.host_support import (
    ADMIN,
    ALICE,
    BOB,
    ISSUER,
    LANE,
    LEDGER,
    STRANGER,
    Env,
    a,
    call,
    contract_error,
    env,  # noqa: F401  (the fixture)
    event,
    host_fn,
    source_auth,
    view,
)
from tests.support.devnet_support import DevnetHandle

i128 = scval.to_int128


def name(e: Env) -> str:
    return f"USDC:{ISSUER.public_key}"


def at(e: Env, ledger: int, fn: str, args: list[xdr.SCVal], source=LANE, mode: str = "apply") -> InvokeOutcome:
    return e.host.invoke(host_function=host_fn(e.usdc, fn, args), auth=[source_auth(e.usdc, fn, args)]
                         if mode == "apply" else [], source_account=source.public_key, ledger_seq=ledger,
                         ledger_close_time=ledger * 5, mode=mode)  # type: ignore[arg-type]


def test_approve_allowance_transfer_from(env: Env) -> None:  # noqa: F811
    until = LEDGER + 10
    out = call(env, env.usdc, "approve", [a(ALICE), a(LANE), i128(200), scval.to_uint32(until)], source=ALICE)
    assert out.ok, out.error
    assert [event(e) for e in out.events] == [
        (env.usdc, ["approve", ALICE.public_key, LANE.public_key, name(env)], [200, until])]
    assert view(env, env.usdc, "allowance", [a(ALICE), a(LANE)]) == 200
    # Stored where the SAC stores it: TEMPORARY Vec[Allowance, Map{from, spender}] -> Map{amount, live_until_ledger}.
    key = xdr.LedgerKey(xdr.LedgerEntryType.CONTRACT_DATA, contract_data=xdr.LedgerKeyContractData(
        contract=Address(env.usdc).to_xdr_sc_address(),
        key=scval.to_vec([scval.to_symbol("Allowance"), scval.to_map({
            scval.to_symbol("from"): a(ALICE), scval.to_symbol("spender"): a(LANE)})]),
        durability=xdr.ContractDataDurability.TEMPORARY))
    found = env.host.get_ledger_entry(key, LEDGER)
    assert found is not None and found[1] == until
    assert scval.to_native(found[0].data.contract_data.val) == {"amount": 200, "live_until_ledger": until}
    out = call(env, env.usdc, "transfer_from", [a(LANE), a(ALICE), a(BOB), i128(150)], source=LANE)
    assert out.ok, out.error
    assert [event(e) for e in out.events] == [
        (env.usdc, ["transfer", ALICE.public_key, BOB.public_key, name(env)], 150)]
    assert env.host.token_balance(env.usdc, BOB.public_key) == 150
    assert view(env, env.usdc, "allowance", [a(ALICE), a(LANE)]) == 50
    assert contract_error(call(env, env.usdc, "transfer_from", [a(LANE), a(ALICE), a(BOB), i128(51)]), 9)
    # The spender's authorisation is what transfer_from needs, not the owner's.
    out = call(env, env.usdc, "transfer_from", [a(LANE), a(ALICE), a(BOB), i128(1)], source=BOB)
    assert not out.ok and "Error(Auth, InvalidAction)" in (out.error or "")
    # allowance.rs: an expired allowance reads as 0 and cannot be spent.
    expired = at(env, until + 1, "allowance", [a(ALICE), a(LANE)], mode="enforce")
    assert expired.ok and scval.to_native(expired.return_value) == 0
    assert contract_error(at(env, until + 1, "transfer_from", [a(LANE), a(ALICE), a(BOB), i128(1)]), 9)


def test_approve_bounds(env: Env) -> None:  # noqa: F811
    past = scval.to_uint32(LEDGER - 1)
    assert contract_error(call(env, env.usdc, "approve", [a(ALICE), a(LANE), i128(5), past], source=ALICE), 9)
    assert call(env, env.usdc, "approve", [a(ALICE), a(LANE), i128(0), past], source=ALICE).ok  # clearing is fine
    too_far = scval.to_uint32(LEDGER + 3_110_400)
    assert contract_error(call(env, env.usdc, "approve", [a(ALICE), a(LANE), i128(5), too_far], source=ALICE), 9)
    assert contract_error(call(env, env.usdc, "approve", [a(ALICE), a(LANE), i128(-1), past], source=ALICE), 8)


def test_burn_and_burn_from(env: Env) -> None:  # noqa: F811
    out = call(env, env.usdc, "burn", [a(ALICE), i128(100)], source=ALICE)
    assert out.ok, out.error
    assert [event(e) for e in out.events] == [(env.usdc, ["burn", ALICE.public_key, name(env)], 100)]
    assert env.host.token_balance(env.usdc, ALICE.public_key) == 900
    assert contract_error(call(env, env.usdc, "burn", [a(ISSUER), i128(1)], source=ISSUER), 2)  # invalid on issuer
    assert contract_error(call(env, env.usdc, "burn_from", [a(LANE), a(ALICE), i128(1)]), 9)  # no allowance
    assert call(env, env.usdc, "approve", [a(ALICE), a(LANE), i128(40), scval.to_uint32(LEDGER + 5)], source=ALICE).ok
    out = call(env, env.usdc, "burn_from", [a(LANE), a(ALICE), i128(40)])
    assert out.ok, out.error
    assert [event(e) for e in out.events] == [(env.usdc, ["burn", ALICE.public_key, name(env)], 40)]
    assert env.host.token_balance(env.usdc, ALICE.public_key) == 860


def test_admin_set_admin_and_mint(env: Env) -> None:  # noqa: F811
    assert view(env, env.usdc, "admin", []).address == ISSUER.public_key  # init_asset: the issuer
    out = call(env, env.usdc, "mint", [a(BOB), i128(7)], source=ISSUER)
    assert out.ok and [event(e) for e in out.events] == [(env.usdc, ["mint", BOB.public_key, name(env)], 7)]
    assert contract_error(call(env, env.usdc, "mint", [a(ISSUER), i128(7)], source=ISSUER), 2)
    out = call(env, env.usdc, "set_admin", [a(ADMIN)], source=ISSUER)
    assert out.ok, out.error
    assert [event(e) for e in out.events] == [
        (env.usdc, ["set_admin", ISSUER.public_key, name(env)], Address(ADMIN.public_key))]
    assert view(env, env.usdc, "admin", []).address == ADMIN.public_key
    assert not call(env, env.usdc, "mint", [a(BOB), i128(1)], source=ISSUER).ok  # the old admin no longer can
    assert call(env, env.usdc, "mint", [a(BOB), i128(1)], source=ADMIN).ok
    assert env.host.token_balance(env.usdc, BOB.public_key) == 8


def test_authorization_and_clawback_under_a_flagless_issuer(env: Env) -> None:  # noqa: F811
    assert view(env, env.usdc, "authorized", [a(ALICE)]) is True
    assert view(env, env.usdc, "authorized", [a(env.billing)]) is True  # no AUTH_REQUIRED
    assert contract_error(call(env, env.usdc, "authorized", [a(STRANGER)], signed_by_source=False,
                               mode="enforce"), 13)  # no trustline
    assert contract_error(call(env, env.usdc, "set_authorized", [a(ALICE), scval.to_bool(False)], source=ISSUER), 2)
    out = call(env, env.usdc, "set_authorized", [a(ALICE), scval.to_bool(True)], source=ISSUER)
    assert out.ok and [event(e) for e in out.events] == [
        (env.usdc, ["set_authorized", ALICE.public_key, name(env)], True)]
    assert not call(env, env.usdc, "set_authorized", [a(ALICE), scval.to_bool(True)], source=ALICE).ok  # admin only
    assert contract_error(call(env, env.usdc, "clawback", [a(ALICE), i128(1)], source=ISSUER), 10)
    assert contract_error(call(env, env.usdc, "clawback", [a(env.billing), i128(1)], source=ISSUER), 10)
    assert contract_error(call(env, env.usdc, "clawback", [a(ISSUER), i128(1)], source=ISSUER), 2)
    assert contract_error(call(env, env.usdc, "clawback", [a(ALICE), i128(-1)], source=ISSUER), 8)


def test_transfers_from_and_to_the_issuer_are_mint_and_burn_events(env: Env) -> None:  # noqa: F811
    out = call(env, env.usdc, "transfer", [a(ISSUER), a(BOB), i128(5)], source=ISSUER)
    assert out.ok and [event(e) for e in out.events] == [(env.usdc, ["mint", BOB.public_key, name(env)], 5)]
    out = call(env, env.usdc, "transfer", [a(ALICE), a(ISSUER), i128(5)], source=ALICE)
    assert out.ok and [event(e) for e in out.events] == [(env.usdc, ["burn", ALICE.public_key, name(env)], 5)]


def test_every_sac_function_is_served(env: Env) -> None:  # noqa: F811
    """No function of the real SAC's interface answers Error(WasmVm, MissingValue) any more."""
    for fn in ("allowance", "approve", "balance", "authorized", "transfer", "transfer_from", "burn", "burn_from",
               "clawback", "set_authorized", "mint", "set_admin", "admin", "decimals", "name", "symbol", "trust"):
        out = call(env, env.usdc, fn, [], source=ALICE)
        assert "MissingValue" not in (out.error or ""), fn
    assert "Error(WasmVm, MissingValue)" in (call(env, env.usdc, "nope", []).error or "")
    assert sac_model.ERR_ALLOWANCE == 9


def test_approve_then_transfer_from_over_rpc(server: SorobanServer, devnet: DevnetHandle) -> None:
    """The allowance's TEMPORARY key goes through simulation's footprint and lands, events on getEvents."""
    g = devnet.genesis
    user, lane = genesis_kp(g["users"][0]), genesis_kp(g["lanes"][0])
    usdc, latest = g["contracts"]["usdc"], server.get_latest_ledger().sequence
    approve = invoke_tx(server, devnet, user, usdc, "approve",
                        [a(user.public_key), a(lane.public_key), i128(500), scval.to_uint32(latest + 50)])
    assert server.send_transaction(fee_bump(devnet, approve)).status.value == "PENDING"
    devnet.close_ledger()
    pull = invoke_tx(server, devnet, lane, usdc, "transfer_from",
                     [a(lane.public_key), a(user.public_key), a(g["users"][1]["public"]), i128(300)])
    fb = fee_bump(devnet, pull)
    assert server.send_transaction(fb).status.value == "PENDING"
    devnet.close_ledger()
    assert server.get_transaction(fb.hash_hex()).status.value == "SUCCESS"
    sim = server.simulate_transaction(invoke_tx(server, devnet, lane, usdc, "allowance",
                                                [a(user.public_key), a(lane.public_key)], prepare=False))
    assert scval.to_native(xdr.SCVal.from_xdr(sim.results[0].xdr)) == 200
    page = server.get_events(start_ledger=latest, filters=[], limit=100)
    kinds = [scval.to_native(e.topic[0]) for e in page.events if e.contract_id == usdc]
    assert "approve" in kinds and "transfer" in kinds
