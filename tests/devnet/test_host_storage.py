"""Host storage: exact key encodings, footprints, atomicity, resource limits, snapshot/restore."""

from __future__ import annotations

import hashlib
import json

import pytest
from stellar_sdk import Address, Asset, Keypair, Network, scval, xdr
from stellar_sdk.auth import authorize_entry

from paygate_cli.sandbox.devnet.host import ContractHost, InvokeOutcome
from paygate_cli.sandbox.devnet.storage import enc_ledger_key, enc_scval, entry_size

PASS = Network.STANDALONE_NETWORK_PASSPHRASE
LEDGER = 200
SRC = xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_SOURCE_ACCOUNT


def kp(i: int) -> Keypair:
    return Keypair.from_raw_ed25519_seed(bytes([i]) * 32)


ISSUER, ALICE, LANE, ADMIN = kp(21), kp(22), kp(23), kp(24)


def h32(s: str) -> bytes:
    return hashlib.sha256(s.encode()).digest()


def host_fn(contract: str, fn: str, args: list[xdr.SCVal]) -> xdr.HostFunction:
    return xdr.HostFunction(
        xdr.HostFunctionType.HOST_FUNCTION_TYPE_INVOKE_CONTRACT,
        invoke_contract=xdr.InvokeContractArgs(Address(contract).to_xdr_sc_address(), xdr.SCSymbol(fn.encode()), args),
    )


def invoke(
    host: ContractHost,
    fn: xdr.HostFunction,
    auth: list[xdr.SorobanAuthorizationEntry],
    *,
    mode: str = "apply",
    source: Keypair = LANE,
    ledger: int = LEDGER,
    footprint: tuple[list[xdr.LedgerKey], list[xdr.LedgerKey]] | None = None,
) -> InvokeOutcome:
    return host.invoke(
        host_function=fn,
        auth=auth,
        source_account=source.public_key,
        ledger_seq=ledger,
        ledger_close_time=ledger * 5,
        mode=mode,
        footprint=footprint,
    )  # type: ignore[arg-type]


def recorded(host: ContractHost, fn: xdr.HostFunction, source: Keypair = LANE) -> InvokeOutcome:
    rec = invoke(host, fn, [], mode="record", source=source)
    assert rec.ok, rec.error
    return rec


def setup() -> tuple[ContractHost, str, str, str]:
    host = ContractHost(PASS)
    usdc = host.deploy_sac("USDC", ISSUER.public_key)
    billing = host.deploy_billing(ADMIN.public_key, usdc, [LANE.public_key])
    market = host.deploy_market(usdc)
    host.mint(usdc, ALICE.public_key, 10_000)
    host.mint(usdc, billing, 77)
    return host, usdc, billing, market


def batch_args(accounts: list[str], amounts: list[int], ids: list[bytes]) -> list[xdr.SCVal]:
    return [
        scval.to_address(LANE.public_key),
        scval.to_vec([scval.to_address(x) for x in accounts]),
        scval.to_vec([scval.to_int128(n) for n in amounts]),
        scval.to_vec([scval.to_bytes(i) for i in ids]),
    ]


def credit_fn(billing: str, account: str, amount: int, dep: str) -> xdr.HostFunction:
    return host_fn(
        billing,
        "credit",
        [
            scval.to_address(LANE.public_key),
            scval.to_address(account),
            scval.to_int128(amount),
            scval.to_bytes(h32(dep)),
        ],
    )


def apply_recorded(host: ContractHost, fn: xdr.HostFunction, source: Keypair = LANE) -> InvokeOutcome:
    rec = recorded(host, fn, source)
    out = invoke(host, fn, rec.auth, source=source, footprint=(rec.read_only, rec.read_write))
    assert out.ok, out.error
    return out


# --- encodings ------------------------------------------------------------------------------------------


def test_fast_encoders_match_the_sdk() -> None:
    _host, _usdc, billing, _ = setup()
    vals = [
        scval.to_symbol("Balance"),
        scval.to_address(ALICE.public_key),
        scval.to_address(billing),
        scval.to_bytes(b"\x01\x02\x03"),
        scval.to_int128(-(2**100) + 7),
        scval.to_int128(5),
        scval.to_uint32(9),
        scval.to_uint64(2**64 - 1),
        scval.to_vec([scval.to_symbol("Charged"), scval.to_bytes(h32("x"))]),
        xdr.SCVal(xdr.SCValType.SCV_LEDGER_KEY_NONCE, nonce_key=xdr.SCNonceKey(xdr.Int64(-(2**63)))),
        xdr.SCVal(xdr.SCValType.SCV_LEDGER_KEY_CONTRACT_INSTANCE),
        scval.to_string("odd"),
        scval.to_bool(True),
    ]
    for v in vals:
        assert enc_scval(v) == v.to_xdr_bytes(), v
    keys = [
        xdr.LedgerKey(xdr.LedgerEntryType.ACCOUNT, account=xdr.LedgerKeyAccount(ALICE.xdr_account_id())),
        xdr.LedgerKey(
            xdr.LedgerEntryType.TRUSTLINE,
            trust_line=xdr.LedgerKeyTrustLine(
                ALICE.xdr_account_id(), Asset("USDC", ISSUER.public_key).to_trust_line_asset_xdr_object()
            ),
        ),
        xdr.LedgerKey(xdr.LedgerEntryType.CONTRACT_CODE, contract_code=xdr.LedgerKeyContractCode(xdr.Hash(h32("c")))),
    ] + [
        xdr.LedgerKey(
            xdr.LedgerEntryType.CONTRACT_DATA,
            contract_data=xdr.LedgerKeyContractData(Address(owner).to_xdr_sc_address(), v, durability),
        )
        for owner in (billing, ALICE.public_key)
        for v in vals[:3] + vals[8:11]
        for durability in (xdr.ContractDataDurability.PERSISTENT, xdr.ContractDataDurability.TEMPORARY)
    ]
    for k in keys:
        assert enc_ledger_key(k) == k.to_xdr_bytes(), k


def test_entry_sizes_are_exact() -> None:
    host, _usdc, billing, market = setup()
    assert apply_recorded(host, credit_fn(billing, ALICE.public_key, 50, "d")).ok
    assert apply_recorded(
        host, host_fn(market, "buy", [scval.to_address(LANE.public_key), scval.to_symbol("a"), scval.to_int128(3)])
    ).ok
    kinds = set()
    for kb, e in host._entries.items():  # internal on purpose: checks every stored kind
        lk = xdr.LedgerKey.from_xdr_bytes(kb)
        materialized = host.get_ledger_entry(lk, LEDGER)
        assert materialized is not None
        assert entry_size(kb, e) == len(materialized[0].to_xdr_bytes()), e.kind
        kinds.add(e.kind)
    assert {"trustline", "sac_balance", "i128", "bool", "u64", "instance", "code"} <= kinds


# --- footprints -----------------------------------------------------------------------------------------


def test_recorded_footprint_applies_and_violations_trap() -> None:
    host, _usdc, billing, _ = setup()
    assert apply_recorded(host, credit_fn(billing, ALICE.public_key, 100, "d1")).ok
    fn = host_fn(billing, "charge_batch", batch_args([ALICE.public_key], [10], [h32("c1")]))
    rec = recorded(host, fn)
    rw_keys = [enc_ledger_key(k) for k in rec.read_write]
    assert len(rw_keys) == 2  # the balance and the charge id
    # Drop the balance key from the read-write set: the write falls outside the footprint.
    balance_key = next(k for k in rec.read_write if b"Balance" in enc_ledger_key(k))
    ro_only = [k for k in rec.read_write if k is not balance_key]
    out = invoke(host, fn, rec.auth, footprint=([*rec.read_only, balance_key], ro_only))
    assert not out.ok and out.error_kind == "trapped"
    assert (out.error or "").startswith("HostError: Error(Storage, ExceededLimit)")
    # Missing entirely (not even readable) traps the same way.
    out = invoke(host, fn, rec.auth, footprint=(rec.read_only, ro_only))
    assert not out.ok and "Error(Storage, ExceededLimit)" in (out.error or "")
    # Missing the instance (every call reads it) traps too.
    instance = xdr.SCValType.SCV_LEDGER_KEY_CONTRACT_INSTANCE
    no_instance = [k for k in rec.read_only if k.contract_data is None or k.contract_data.key.type != instance]
    assert len(no_instance) == len(rec.read_only) - 1
    out = invoke(host, fn, rec.auth, footprint=(no_instance, rec.read_write))
    assert not out.ok and "Error(Storage, ExceededLimit)" in (out.error or "")
    enforced = invoke(host, fn, rec.auth, mode="enforce")  # enforce mode reports the same footprint
    assert enforced.ok and enforced.read_write == rec.read_write and enforced.read_only == rec.read_only
    ok = invoke(host, fn, rec.auth, footprint=(rec.read_only, rec.read_write))
    assert ok.ok, ok.error
    assert ok.write_bytes > 0 and ok.instructions > 0


def test_sac_footprint_holds_trustlines_and_counts_classic_read_bytes() -> None:
    host, usdc, _, _ = setup()
    bob = kp(29)
    host.mint(usdc, bob.public_key, 0)
    fn = host_fn(
        usdc, "transfer", [scval.to_address(ALICE.public_key), scval.to_address(bob.public_key), scval.to_int128(5)]
    )
    rec = recorded(host, fn, ALICE)
    assert {k.type for k in rec.read_write} == {xdr.LedgerEntryType.TRUSTLINE}
    assert rec.read_bytes == 2 * 116  # both trustlines; contract data is not "disk" read since P23
    assert invoke(host, fn, rec.auth, source=ALICE, footprint=(rec.read_only, rec.read_write)).ok


# --- atomicity ------------------------------------------------------------------------------------------


def test_failed_and_simulated_invocations_change_nothing() -> None:
    host, usdc, billing, market = setup()
    assert apply_recorded(host, credit_fn(billing, ALICE.public_key, 100, "d1")).ok
    before = json.dumps(host.snapshot(), sort_keys=True)
    # A trap after earlier writes in the same call (credit writes nothing before the check, so use a
    # SAC transfer whose debit succeeds and whose credit then fails on a missing trustline).
    fn = host_fn(
        usdc, "transfer", [scval.to_address(ALICE.public_key), scval.to_address(kp(30).public_key), scval.to_int128(5)]
    )
    src = xdr.SorobanAuthorizationEntry(
        credentials=xdr.SorobanCredentials(SRC),
        root_invocation=xdr.SorobanAuthorizedInvocation(
            function=xdr.SorobanAuthorizedFunction(
                xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN,
                contract_fn=fn.invoke_contract,
            ),
            sub_invocations=[],
        ),
    )
    out = invoke(host, fn, [src], source=ALICE)
    assert not out.ok and "Error(Contract, #13)" in (out.error or "")
    # Simulations of successful calls commit nothing either.
    ok_fn = host_fn(billing, "charge_batch", batch_args([ALICE.public_key], [10], [h32("c1")]))
    rec = recorded(host, ok_fn)
    assert invoke(host, ok_fn, rec.auth, mode="enforce").ok
    buy = host_fn(market, "buy", [scval.to_address(ALICE.public_key), scval.to_symbol("x"), scval.to_int128(1)])
    assert recorded(host, buy, LANE).ok
    # Garbage in: a host function without its body never raises out of invoke.
    broken = xdr.HostFunction(xdr.HostFunctionType.HOST_FUNCTION_TYPE_INVOKE_CONTRACT, invoke_contract=None)
    out = invoke(host, broken, [])
    assert not out.ok and out.error_kind == "trapped" and "Error(Context, InternalError)" in (out.error or "")
    after = host.snapshot()
    after["nonce_counter"] = json.loads(before)["nonce_counter"]  # recording advances only the nonce counter
    assert json.dumps(after, sort_keys=True) == before


def test_events_over_the_network_limit_are_resource_limit_exceeded() -> None:
    host, _usdc, billing, _ = setup()
    accounts = [kp(100 + i).public_key for i in range(100)]
    fn = host_fn(billing, "charge_batch", batch_args(accounts, [1] * 100, [h32(f"c{i}") for i in range(100)]))
    rec = invoke(host, fn, [], mode="record")  # 100 charge_failed events ≈ 22 KB > 16 KB
    assert not rec.ok and rec.error_kind == "resource_limit_exceeded"
    assert (rec.error or "").startswith("HostError: Error(Budget, ExceededLimit)")
    fn = host_fn(billing, "charge_batch", batch_args(accounts[:50], [1] * 50, [h32(f"c{i}") for i in range(50)]))
    assert recorded(host, fn).ok


# --- persistence ------------------------------------------------------------------------------------------


def test_snapshot_restore_round_trip() -> None:
    host, usdc, billing, market = setup()
    assert apply_recorded(host, credit_fn(billing, ALICE.public_key, 100, "d1")).ok
    assert apply_recorded(host, host_fn(billing, "charge_batch", batch_args([ALICE.public_key], [30], [h32("c1")]))).ok
    buy = host_fn(market, "buy", [scval.to_address(ALICE.public_key), scval.to_symbol("x"), scval.to_int128(1)])
    rec = recorded(host, buy)
    signed = authorize_entry(rec.auth[0], ALICE, LEDGER + 50, PASS)
    assert invoke(host, buy, [signed], footprint=(rec.read_only, rec.read_write)).ok
    assert apply_recorded(
        host,
        host_fn(billing, "add_operator", [scval.to_address(ADMIN.public_key), scval.to_address(ALICE.public_key)]),
        ADMIN,
    ).ok

    data = json.loads(json.dumps(host.snapshot()))  # must survive JSON
    twin = ContractHost.restore(PASS, data)
    assert twin.snapshot() == data
    assert twin.token_balance(usdc, ALICE.public_key) == 10_000
    assert twin.token_balance(usdc, billing) == 77
    for h in (host, twin):
        keys = list(h._entries)  # internal on purpose: every entry must read back identically
        for kb in keys:
            lk = xdr.LedgerKey.from_xdr_bytes(kb)
            assert host.get_ledger_entry(lk, LEDGER) is not None
    for kb in host._entries:
        lk = xdr.LedgerKey.from_xdr_bytes(kb)
        a, b = host.get_ledger_entry(lk, LEDGER), twin.get_ledger_entry(lk, LEDGER)
        assert a is not None and b is not None
        assert a[0].to_xdr() == b[0].to_xdr() and a[1] == b[1]
    # State keeps working after restore: the nonce is still consumed, the charge id too,
    # the new operator is allow-listed, and record nonces continue rather than repeat.
    replay = invoke(twin, buy, [signed], ledger=LEDGER + 1)
    assert not replay.ok and "Error(Auth, ExistingValue)" in (replay.error or "")
    again = apply_recorded(twin, host_fn(billing, "charge_batch", batch_args([ALICE.public_key], [30], [h32("c1")])))
    assert scval.to_native(again.return_value) == [0, 0, 1]
    assert apply_recorded(twin, credit_fn(billing, ALICE.public_key, 1, "d2")).ok
    n1 = recorded(host, buy).auth[0].credentials.address_v2.nonce.int64  # type: ignore[union-attr]
    n2 = recorded(twin, buy).auth[0].credentials.address_v2.nonce.int64  # type: ignore[union-attr]
    assert n1 == n2 and n1 != rec.auth[0].credentials.address_v2.nonce.int64  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        ContractHost.restore(Network.TESTNET_NETWORK_PASSPHRASE, data)


def test_commit_if_can_veto_an_apply() -> None:
    host, _usdc, billing, _ = setup()
    fn = credit_fn(billing, ALICE.public_key, 100, "d1")
    rec = recorded(host, fn)
    seen: list[InvokeOutcome] = []

    def veto(outcome: InvokeOutcome) -> bool:
        seen.append(outcome)
        return False

    out = host.invoke(
        host_function=fn,
        auth=rec.auth,
        source_account=LANE.public_key,
        ledger_seq=LEDGER,
        ledger_close_time=0,
        mode="apply",
        footprint=(rec.read_only, rec.read_write),
        commit_if=veto,
    )
    assert out.ok and seen == [out] and out.events  # the caller saw the full outcome …
    balance = host_fn(billing, "balance", [scval.to_address(ALICE.public_key)])
    assert scval.to_native(invoke(host, balance, [], mode="enforce").return_value) == 0  # … and nothing landed
    out = host.invoke(
        host_function=fn,
        auth=rec.auth,
        source_account=LANE.public_key,
        ledger_seq=LEDGER,
        ledger_close_time=0,
        mode="apply",
        commit_if=lambda o: True,
    )
    assert out.ok
    assert scval.to_native(invoke(host, balance, [], mode="enforce").return_value) == 100
