"""State archival on the devnet (docs/devnet.md "State archival"): TTLs on every contract data and
code entry, expiry (temporary gone, persistent archived), ENTRY_ARCHIVED for an unmarked archived
footprint entry, restore by simulation (ext v1) or restorePreamble, ExtendFootprintTTL and
RestoreFootprint with rent, the SAC's balance extension, and `devnet advance`. Each test runs its own
devnet with short TTLs, and moves time with devnet_advance."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from stellar_sdk import (
    Address,
    Asset,
    SorobanDataBuilder,
    SorobanServer,
    TransactionBuilder,
    TransactionEnvelope,
    scval,
    xdr,
)
from stellar_sdk.client.requests_client import RequestsClient
from stellar_sdk.soroban_rpc import GetTransactionResponse, GetTransactionStatus, SendTransactionStatus

from paygate_cli.sandbox.devnet import fees
from paygate_cli.sandbox.devnet.validate import declared_resources
from tests.devnet.helpers import addr, bytes32, call, fee_bump, invoke_tx, kp
from tests.support.devnet_support import DevnetHandle, start_devnet

MIN_P, MIN_T = 1_000, 100  # the devnets' minimum persistent / temporary TTLs
TTL_ARGS = ["--min-persistent-ttl", str(MIN_P), "--min-temporary-ttl", str(MIN_T)]
FOREVER = 10**9  # seconds of validity: a transaction kept across an advance of many ledgers
S = SendTransactionStatus
ihf = xdr.InvokeHostFunctionResultCode


@pytest.fixture
def net(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path, extra_args=TTL_ARGS)
    yield handle
    handle.stop()


@pytest.fixture
def rpc(net: DevnetHandle) -> Iterator[SorobanServer]:
    with SorobanServer(net.url, client=RequestsClient(num_retries=0)) as s:
        yield s


# ----- keys and reads ------------------------------------------------------------------------------

def data_key(contract: str, key: xdr.SCVal, persistent: bool = True) -> xdr.LedgerKey:
    durability = xdr.ContractDataDurability.PERSISTENT if persistent else xdr.ContractDataDurability.TEMPORARY
    return xdr.LedgerKey(xdr.LedgerEntryType.CONTRACT_DATA, contract_data=xdr.LedgerKeyContractData(
        contract=Address(contract).to_xdr_sc_address(), key=key, durability=durability))


def tagged(contract: str, tag: str, value: xdr.SCVal) -> xdr.LedgerKey:
    return data_key(contract, scval.to_vec([scval.to_symbol(tag), value]))


def instance(contract: str) -> xdr.LedgerKey:
    return data_key(contract, xdr.SCVal(xdr.SCValType.SCV_LEDGER_KEY_CONTRACT_INSTANCE))


def entries(net: DevnetHandle, keys: list[xdr.LedgerKey]) -> dict[str, dict]:
    """getLedgerEntries as JSON, by key: to see which fields stellar-rpc's shape carries."""
    res = call(net.url, "getLedgerEntries", {"keys": [k.to_xdr() for k in keys]})["result"]
    return {e["key"]: e for e in res["entries"]}


def live_until(net: DevnetHandle, key: xdr.LedgerKey) -> int | None:
    """liveUntilLedgerSeq (0 = archived); None when the entry is gone."""
    e = entries(net, [key]).get(key.to_xdr())
    return None if e is None else e["liveUntilLedgerSeq"]


def advance_to(net: DevnetHandle, ledger: int) -> dict:
    return net.rpc("devnet_advance", {"ledgers": ledger - net.latest_ledger()})


def land(rpc: SorobanServer, net: DevnetHandle, env: object) -> GetTransactionResponse:
    sent = rpc.send_transaction(env)  # type: ignore[arg-type]
    assert sent.status == S.PENDING, sent
    net.close_ledger()
    got = rpc.get_transaction(sent.hash)
    assert got.status != GetTransactionStatus.NOT_FOUND, got
    return got


def inner_op(got: GetTransactionResponse) -> xdr.OperationResultTr:
    r = xdr.TransactionResult.from_xdr(got.result_xdr)  # type: ignore[arg-type]
    results = r.result.inner_result_pair.result.result.results if r.result.inner_result_pair else r.result.results
    return results[0].tr


def refundable_charged(env: TransactionEnvelope, got: GetTransactionResponse) -> int:
    """What a plain (not fee-bumped) Soroban transaction paid beyond the base fee and its declared
    resources: the refundable part, i.e. events, return value and rent (fees.py)."""
    sd = env.transaction.soroban_data
    assert sd is not None
    non_refundable = fees.non_refundable_fee(declared_resources(sd), len(base64.b64decode(env.to_xdr())))
    charged = xdr.TransactionResult.from_xdr(got.result_xdr).fee_charged.int64  # type: ignore[arg-type]
    return charged - fees.BASE_FEE - non_refundable


def credit(rpc: SorobanServer, net: DevnetHandle, dep: bytes, amount: int = 1_000, user: int = 0) -> tuple[int, str]:
    """billing.credit from lane 0: creates Credited(dep) and the user's Balance; -> (ledger, user)."""
    g = net.genesis
    lane, who = kp(g["lanes"][0]), g["users"][user]["public"]
    tx = invoke_tx(rpc, net, lane, g["contracts"]["billing"], "credit",
                   [addr(lane.public_key), addr(who), scval.to_int128(amount), scval.to_bytes(dep)])
    got = land(rpc, net, fee_bump(net, tx))
    assert got.status == GetTransactionStatus.SUCCESS, got
    return got.ledger, who  # type: ignore[return-value]


def charge_batch(rpc: SorobanServer, net: DevnetHandle, lane_i: int, user: str, ids: list[bytes], *,
                 prepare: bool = True) -> TransactionEnvelope:
    lane = kp(net.genesis["lanes"][lane_i])
    return invoke_tx(rpc, net, lane, net.genesis["contracts"]["billing"], "charge_batch",
                     [addr(lane.public_key), scval.to_vec([addr(user)] * len(ids)),
                      scval.to_vec([scval.to_int128(1)] * len(ids)), scval.to_vec([scval.to_bytes(i) for i in ids])],
                     timeout=FOREVER, prepare=prepare)


def refused(sent: object) -> xdr.TransactionResultResult:
    return xdr.TransactionResult.from_xdr(sent.error_result_xdr).result  # type: ignore[attr-defined]


def restored_keys(sd: xdr.SorobanTransactionData) -> set[str]:
    assert sd.ext.v == 1 and sd.ext.resource_ext is not None
    rw = sd.resources.footprint.read_write
    return {rw[i.uint32].to_xdr() for i in sd.ext.resource_ext.archived_soroban_entries}


# ----- tests ---------------------------------------------------------------------------------------

def test_new_entries_live_min_ttl_counting_their_ledger_then_archive(net: DevnetHandle, rpc: SorobanServer) -> None:
    g = net.genesis
    billing = g["contracts"]["billing"]
    dep = bytes32("ttl:dep")
    ledger, user = credit(rpc, net, dep)
    credited, balance = tagged(billing, "Credited", scval.to_bytes(dep)), tagged(billing, "Balance", addr(user))
    # soroban-env-host's min_live_until_ledger: ledger + min TTL - 1 (the creating ledger counts).
    assert live_until(net, credited) == live_until(net, balance) == ledger + MIN_P - 1
    assert live_until(net, instance(billing)) == 1 + MIN_P - 1  # genesis (ledger 1) entries too
    advance_to(net, ledger + MIN_P - 1)  # the last ledger it is live in
    assert live_until(net, credited) == ledger + MIN_P - 1
    before = entries(net, [credited])[credited.to_xdr()]
    advance_to(net, ledger + MIN_P)
    # Archived: stellar-rpc still returns the entry, with liveUntilLedgerSeq 0 (core's "archived").
    after = entries(net, [credited])[credited.to_xdr()]
    assert after["liveUntilLedgerSeq"] == 0
    assert (after["xdr"], after["lastModifiedLedgerSeq"]) == (before["xdr"], before["lastModifiedLedgerSeq"])
    # A G account's USDC is its trustline: classic, no TTL, never archived.
    tl = xdr.LedgerKey(xdr.LedgerEntryType.TRUSTLINE, trust_line=xdr.LedgerKeyTrustLine(
        account_id=kp(g["users"][0]).xdr_account_id(),
        asset=Asset("USDC", g["issuer"]["public"]).to_trust_line_asset_xdr_object()))
    assert "liveUntilLedgerSeq" not in entries(net, [tl])[tl.to_xdr()]


def test_a_temporary_entry_is_gone_after_its_live_until(net: DevnetHandle, rpc: SorobanServer) -> None:
    g = net.genesis
    user, lane = kp(g["users"][1]), kp(g["lanes"][1])
    tx = invoke_tx(rpc, net, lane, g["contracts"]["market"], "buy",
                   [addr(user.public_key), scval.to_symbol("tea"), scval.to_int128(3)], signers=[user])
    assert land(rpc, net, fee_bump(net, tx)).status == GetTransactionStatus.SUCCESS
    creds = tx.transaction.operations[0].auth[0].credentials
    creds = creds.address_v2 or creds.address
    nonce = data_key(g["users"][1]["public"], xdr.SCVal(xdr.SCValType.SCV_LEDGER_KEY_NONCE, nonce_key=xdr.SCNonceKey(
        creds.nonce)), persistent=False)
    exp = creds.signature_expiration_ledger.uint32
    advance_to(net, exp)
    assert live_until(net, nonce) == exp  # still there in its last ledger
    out = advance_to(net, exp + 1)
    assert live_until(net, nonce) is None  # temporary: deleted, not archived
    assert out["expired"]["deleted"] == 1


def test_archived_footprint_entry_fails_entry_archived_with_fee_and_sequence_consumed(
        net: DevnetHandle, rpc: SorobanServer) -> None:
    g = net.genesis
    ledger, user = credit(rpc, net, bytes32("ttl:dep2"))
    stale = charge_batch(rpc, net, 1, user, [bytes32("ttl:charge")])  # prepared while everything is live
    advance_to(net, ledger + MIN_P)
    fee_key = xdr.LedgerKey(xdr.LedgerEntryType.ACCOUNT, account=xdr.LedgerKeyAccount(
        kp(g["fee_account"]).xdr_account_id()))
    balance_before = rpc.get_ledger_entries([fee_key]).entries[0]
    got = land(rpc, net, fee_bump(net, stale))
    assert got.status == GetTransactionStatus.FAILED
    assert inner_op(got).invoke_host_function_result.code == ihf.INVOKE_HOST_FUNCTION_ENTRY_ARCHIVED
    charged = xdr.TransactionResult.from_xdr(got.result_xdr).fee_charged.int64  # type: ignore[arg-type]
    assert charged > 0
    balance_after = rpc.get_ledger_entries([fee_key]).entries[0]
    drop = (xdr.LedgerEntryData.from_xdr(balance_before.xdr).account.balance.int64
            - xdr.LedgerEntryData.from_xdr(balance_after.xdr).account.balance.int64)
    assert drop == charged  # a real failed transaction: fee charged …
    assert rpc.load_account(g["lanes"][1]["public"]).sequence == stale.transaction.sequence  # … sequence used
    assert got.events.contract_events_xdr in ([], [[]])  # no contract events


def test_simulated_restore_lands_pays_rent_and_revives_the_entries(net: DevnetHandle, rpc: SorobanServer) -> None:
    g = net.genesis
    billing = g["contracts"]["billing"]
    dep = bytes32("ttl:dep3")
    ledger, _ = credit(rpc, net, dep)
    credited = tagged(billing, "Credited", scval.to_bytes(dep))
    advance_to(net, ledger + MIN_P)
    lane = kp(g["lanes"][2])
    tx = invoke_tx(rpc, net, lane, billing, "is_credited", [scval.to_bytes(dep)], timeout=FOREVER)
    sd = tx.transaction.soroban_data
    assert sd is not None
    restored = restored_keys(sd)
    assert credited.to_xdr() in restored and instance(billing).to_xdr() in restored
    assert any(xdr.LedgerKey.from_xdr(k).type == xdr.LedgerEntryType.CONTRACT_CODE for k in restored)
    assert len(restored) == 3 and not sd.resources.footprint.read_only  # restoring moves reads to read-write
    # Wrongly marked restores are refused at the door, as stellar-core's checkSorobanResources does.
    for marks in ([1, 0], [len(sd.resources.footprint.read_write)]):
        bad = TransactionEnvelope.from_xdr(tx.to_xdr(), net.passphrase)
        bad.transaction.soroban_data.ext = xdr.SorobanTransactionDataExt(1, resource_ext=xdr.SorobanResourcesExtV0(
            [xdr.Uint32(i) for i in marks]))
        bad.signatures = []
        bad.sign(lane)
        sent = rpc.send_transaction(bad)
        assert sent.status == S.ERROR and refused(sent).code == xdr.TransactionResultCode.txSOROBAN_INVALID
    got = land(rpc, net, tx)
    assert got.status == GetTransactionStatus.SUCCESS, got
    ret = xdr.TransactionMeta.from_xdr(got.result_meta_xdr).v4.soroban_meta.return_value
    assert scval.to_native(ret) is True  # the credit is still recorded
    # Rent: what it paid beyond the base fee, the declared resources and its 8-byte return value.
    assert refundable_charged(tx, got) - fees.refundable_fee(8) > 0
    after = entries(net, [credited])[credited.to_xdr()]
    assert after["liveUntilLedgerSeq"] == got.ledger + MIN_P - 1
    assert after["lastModifiedLedgerSeq"] == got.ledger  # rewritten from the hot archive
    # Live again: the same call simulates with nothing to restore, and costs less.
    again = invoke_tx(rpc, net, lane, billing, "is_credited", [scval.to_bytes(dep)],
                      timeout=FOREVER).transaction.soroban_data
    assert again is not None and again.ext.v == 0 and again.resource_fee.int64 < sd.resource_fee.int64


def test_restore_preamble_when_the_restore_does_not_fit_and_restored_ids_stay_consumed(
        net: DevnetHandle, rpc: SorobanServer) -> None:
    g = net.genesis
    billing = g["contracts"]["billing"]
    ledger, user = credit(rpc, net, bytes32("ttl:dep4"), amount=1_000_000)
    old = [bytes32(f"ttl:old:{i}") for i in range(30)]
    first = land(rpc, net, fee_bump(net, charge_batch(rpc, net, 1, user, old)))
    assert first.status == GetTransactionStatus.SUCCESS
    advance_to(net, ledger + MIN_P + 1)
    new = [bytes32(f"ttl:new:{i}") for i in range(24)]
    # Auto-restore would put 33 archived entries plus 24 new ids in the read-write footprint (> 50).
    tx = charge_batch(rpc, net, 3, user, old + new, prepare=False)
    sim = rpc.simulate_transaction(tx)
    assert sim.error is None, sim.error
    assert sim.restore_preamble is not None
    data = xdr.SorobanTransactionData.from_xdr(sim.transaction_data)
    assert data.ext.v == 0 and len(data.resources.footprint.read_write) == 25  # as if restored: balance + 24 new
    pre = xdr.SorobanTransactionData.from_xdr(sim.restore_preamble.transaction_data)
    rw = {k.to_xdr() for k in pre.resources.footprint.read_write}
    assert not pre.resources.footprint.read_only and len(rw) == 33
    assert {tagged(billing, "Charged", scval.to_bytes(i)).to_xdr() for i in old} <= rw
    assert pre.resource_fee.int64 == int(sim.restore_preamble.min_resource_fee)
    # The preamble first: a RestoreFootprint with exactly that transactionData.
    lane = kp(g["lanes"][4])
    restore = (TransactionBuilder(rpc.load_account(lane.public_key), net.passphrase, base_fee=100)
               .append_restore_footprint_op().set_soroban_data(pre).set_timeout(FOREVER).build())
    restore.sign(lane)
    assert land(rpc, net, restore).status == GetTransactionStatus.SUCCESS
    assert live_until(net, tagged(billing, "Charged", scval.to_bytes(old[0]))) == net.latest_ledger() + MIN_P - 1
    # Then the call as simulated: the restored ids are still consumed, only the new ones charge.
    prepared = rpc.prepare_transaction(tx, sim)
    prepared.sign(kp(g["lanes"][3]))
    got = land(rpc, net, fee_bump(net, prepared))
    assert got.status == GetTransactionStatus.SUCCESS, got
    ret = xdr.TransactionMeta.from_xdr(got.result_meta_xdr).v4.soroban_meta.return_value
    assert scval.to_native(ret) == [24, 0, 30]  # settled, failed, skipped


def test_extend_and_restore_footprint_take_effect_with_rent(net: DevnetHandle, rpc: SorobanServer) -> None:
    g = net.genesis
    billing = g["contracts"]["billing"]
    dep = bytes32("ttl:dep5")
    _, user = credit(rpc, net, dep)
    keys = [tagged(billing, "Credited", scval.to_bytes(dep)), tagged(billing, "Balance", addr(user)), instance(billing)]
    lane = kp(g["lanes"][5])

    def footprint_tx(build: object, read_only: list, read_write: list) -> TransactionEnvelope:
        b = TransactionBuilder(rpc.load_account(lane.public_key), net.passphrase, base_fee=100)
        build(b)  # type: ignore[operator]
        b.set_soroban_data(SorobanDataBuilder().set_read_only(read_only).set_read_write(read_write).build())
        env = rpc.prepare_transaction(b.set_timeout(FOREVER).build())
        env.sign(lane)
        return env

    ext = footprint_tx(lambda b: b.append_extend_footprint_ttl_op(5_000), keys, [])
    assert len(ext.transaction.soroban_data.resources.footprint.read_only) == 3
    got = land(rpc, net, ext)
    assert got.status == GetTransactionStatus.SUCCESS
    assert [live_until(net, k) for k in keys] == [got.ledger + 5_000] * 3
    assert refundable_charged(ext, got) > 0  # rent for the extension
    # Nothing to extend: simulation narrows the footprint to nothing, and no rent is paid.
    noop = footprint_tx(lambda b: b.append_extend_footprint_ttl_op(100), keys, [])
    assert not noop.transaction.soroban_data.resources.footprint.read_only
    got_noop = land(rpc, net, noop)
    assert got_noop.status == GetTransactionStatus.SUCCESS and refundable_charged(noop, got_noop) == 0
    assert [live_until(net, k) for k in keys] == [got.ledger + 5_000] * 3
    # extendTo beyond max-entry-ttl - 1: EXTEND_FOOTPRINT_TTL_MALFORMED at the door (txFAILED).
    too_far = TransactionBuilder(rpc.load_account(lane.public_key), net.passphrase, base_fee=100) \
        .append_extend_footprint_ttl_op(3_110_400) \
        .set_soroban_data(SorobanDataBuilder().set_read_only(keys).set_resource_fee(1_000_000).build()) \
        .set_timeout(FOREVER).build()
    too_far.sign(lane)
    sent = rpc.send_transaction(too_far)
    assert sent.status == S.ERROR and refused(sent).code == xdr.TransactionResultCode.txFAILED
    assert refused(sent).results[0].tr.extend_footprint_ttl_result.code == \
        xdr.ExtendFootprintTTLResultCode.EXTEND_FOOTPRINT_TTL_MALFORMED
    # Archive them, then RestoreFootprint.
    advance_to(net, got.ledger + 5_001)
    assert [live_until(net, k) for k in keys] == [0, 0, 0]
    res = footprint_tx(lambda b: b.append_restore_footprint_op(), [], keys)
    rsd = res.transaction.soroban_data
    assert len(rsd.resources.footprint.read_write) == 3 and rsd.resources.disk_read_bytes.uint32 > 0
    assert rsd.resources.write_bytes.uint32 == rsd.resources.disk_read_bytes.uint32  # read and written once
    got = land(rpc, net, res)
    assert got.status == GetTransactionStatus.SUCCESS
    assert [live_until(net, k) for k in keys] == [got.ledger + MIN_P - 1] * 3
    assert refundable_charged(res, got) > 0  # rent for the restored entries
    # A temporary key cannot be restored: simulation says so (and sendTransaction would refuse it).
    temp = data_key(billing, scval.to_symbol("nothing"), persistent=False)
    b = TransactionBuilder(rpc.load_account(lane.public_key), net.passphrase, base_fee=100)
    b.append_restore_footprint_op().set_soroban_data(SorobanDataBuilder().set_read_write([temp]).build())
    sim = rpc.simulate_transaction(b.set_timeout(300).build())
    assert sim.error is not None and "Only persistent ledger entries" in sim.error


def test_the_sac_extends_a_contract_balance_only_under_its_threshold(net: DevnetHandle, rpc: SorobanServer) -> None:
    g = net.genesis
    usdc, billing = g["contracts"]["usdc"], g["contracts"]["billing"]
    user = kp(g["users"][2])
    balance = data_key(usdc, scval.to_vec([scval.to_symbol("Balance"), addr(billing)]))
    tx = invoke_tx(rpc, net, user, usdc, "transfer", [addr(user.public_key), addr(billing), scval.to_int128(10)])
    got = land(rpc, net, tx)
    assert got.status == GetTransactionStatus.SUCCESS
    first = got.ledger
    # balance.rs: created with the minimum TTL (999 left), then extended to 30 days (BALANCE_EXTEND_AMOUNT).
    assert live_until(net, balance) == first + 518_400
    assert live_until(net, instance(usdc)) == first + 120_960  # the instance: 7 days (INSTANCE_EXTEND_AMOUNT)

    def read_balance() -> int:
        lane = kp(g["lanes"][6])
        env = invoke_tx(rpc, net, lane, usdc, "balance", [addr(billing)], timeout=FOREVER)
        done = land(rpc, net, env)
        assert done.status == GetTransactionStatus.SUCCESS
        return done.ledger  # type: ignore[return-value]

    net.rpc("devnet_advance", {"ledgers": 100})
    read_balance()  # 518,300 left > 501,120 (BALANCE_TTL_THRESHOLD): untouched
    assert live_until(net, balance) == first + 518_400
    net.rpc("devnet_advance", {"ledgers": 20_000})
    at = read_balance()  # under 29 days left: back to 30 days
    assert live_until(net, balance) == at + 518_400
    assert live_until(net, instance(usdc)) == at + 120_960  # the instance was under 6 days left too


def test_devnet_advance_is_fast_archives_and_keeps_retention_and_the_chain(tmp_path: Path) -> None:
    net = start_devnet(tmp_path, retention=5_000, extra_args=TTL_ARGS)
    try:
        with SorobanServer(net.url, client=RequestsClient(num_retries=0)) as rpc:
            g = net.genesis
            billing = g["contracts"]["billing"]
            dep = bytes32("ttl:dep6")
            ledger, _ = credit(rpc, net, dep)
            credit_tx = rpc.get_transactions(start_ledger=ledger, limit=1).transactions[0].transaction_hash
            before = rpc.get_latest_ledger()
            env = {k: v for k, v in os.environ.items() if not k.startswith("PAYGATE_")}
            env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src")
            t0 = time.monotonic()
            out = subprocess.run([sys.executable, "-m", "paygate_cli", "devnet", "advance", "100000", "--url", net.url,
                                  "--json"], capture_output=True, text=True, env=env, timeout=60)
            elapsed = time.monotonic() - t0
            assert out.returncode == 0, out.stderr
            # Months in seconds is what tests rely on (a ledger at a time would take minutes); the bound
            # is loose so a loaded machine does not fail it (~1 s measured, the whole CLI run included).
            assert elapsed < 20.0, elapsed
            res = json.loads(out.stdout)
            assert res["latestLedger"] == before.sequence + 100_000
            assert res["closeTime"] == before.close_time + 100_000 * 5  # the manual close step, each ledger
            assert res["expired"]["archived"] >= 2
            assert live_until(net, tagged(billing, "Credited", scval.to_bytes(dep))) == 0
            assert live_until(net, instance(billing)) == 0
            latest = rpc.get_latest_ledger()
            assert latest.sequence == res["latestLedger"] and latest.close_time == res["closeTime"]
            # Retention follows: only the last 5,000 ledgers, and the credit's transaction is forgotten.
            page = rpc.get_ledgers(start_ledger=latest.sequence - 1, limit=2)
            assert page.oldest_ledger == latest.sequence - 5_000 + 1
            assert rpc.get_transaction(credit_tx).status == GetTransactionStatus.NOT_FOUND
            heads = [xdr.LedgerHeaderHistoryEntry.from_xdr(x.header_xdr) for x in page.ledgers]
            assert heads[1].header.previous_ledger_hash.hash == heads[0].hash.hash
            assert heads[1].header.ledger_seq.uint32 == latest.sequence and heads[1].hash.hash.hex() == latest.id
            # A normal close continues the chain.
            net.close_ledger()
            nxt = xdr.LedgerHeader.from_xdr(rpc.get_latest_ledger().header_xdr)
            assert nxt.previous_ledger_hash.hash.hex() == latest.id
    finally:
        net.stop()


def test_advanced_ledgers_and_the_archive_survive_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    net = start_devnet(tmp_path, state=state, extra_args=TTL_ARGS)
    try:
        with SorobanServer(net.url, client=RequestsClient(num_retries=0)) as rpc:
            dep = bytes32("ttl:dep7")
            ledger, _ = credit(rpc, net, dep)
        advance_to(net, ledger + MIN_P + 3_000)
        last = net.rpc("getLatestLedger")
    finally:
        net.stop()
    net = start_devnet(tmp_path, state=state, extra_args=TTL_ARGS)
    try:
        assert net.rpc("getLatestLedger")["id"] == last["id"]
        billing = net.genesis["contracts"]["billing"]
        assert live_until(net, tagged(billing, "Credited", scval.to_bytes(dep))) == 0  # still archived
        page = net.rpc("getLedgers", {"startLedger": ledger + 1, "pagination": {"limit": 2}})["ledgers"]
        heads = [xdr.LedgerHeaderHistoryEntry.from_xdr(x["headerXdr"]) for x in page]
        assert heads[1].header.previous_ledger_hash.hash == heads[0].hash.hash
        assert heads[0].header.previous_ledger_hash.hash.hex() == net.rpc(
            "getLedgers", {"startLedger": ledger, "pagination": {"limit": 1}})["ledgers"][0]["hash"]
    finally:
        net.stop()


def test_rent_grows_with_size_and_ledgers() -> None:
    def rent(size: int, old_lu: int, new_lu: int, persistent: bool = True) -> int:
        return fees.rent_fee([fees.RentChange(persistent, False, size if old_lu else 0, size, old_lu, new_lu)], 100)

    assert 0 < rent(100, 0, 1_000) < rent(200, 0, 1_000) < rent(200, 0, 2_000)
    assert rent(100, 500, 1_000) < rent(100, 0, 1_000)  # an extension pays only for the new ledgers
    assert rent(100, 1_000, 1_000) == 0  # nothing new, nothing owed
    assert rent(100, 0, 1_000, persistent=False) < rent(100, 0, 1_000)  # temporary storage is cheaper
