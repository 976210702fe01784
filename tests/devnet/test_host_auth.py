"""Soroban auth in the devnet host: signatures, expiration window, nonces, record → sign → apply."""

from __future__ import annotations

import hashlib

import pytest
from stellar_sdk import Address, Keypair, Network, scval, xdr
from stellar_sdk.auth import authorize_entry, authorize_invocation

from paygate_cli.sandbox.devnet.host import ContractHost, InvokeOutcome
from paygate_cli.sandbox.devnet.storage import MAX_ENTRY_TTL
from tests.devnet.host_support import PASS, Env, deploy, kp

V1 = xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_ADDRESS
V2 = xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_ADDRESS_V2
LEDGER = 1000


ISSUER, USER, LANE, ADMIN, OTHER = kp(1), kp(2), kp(3), kp(4), kp(5)


@pytest.fixture
def env() -> Env:
    e = deploy(ISSUER, ADMIN, LANE)
    e.host.mint(e.usdc, USER.public_key, 1_000_000)
    return e


def host_fn(contract: str, fn: str, args: list[xdr.SCVal]) -> xdr.HostFunction:
    return xdr.HostFunction(
        xdr.HostFunctionType.HOST_FUNCTION_TYPE_INVOKE_CONTRACT,
        invoke_contract=xdr.InvokeContractArgs(Address(contract).to_xdr_sc_address(), xdr.SCSymbol(fn.encode()), args),
    )


def invocation(contract: str, fn: str, args: list[xdr.SCVal]) -> xdr.SorobanAuthorizedInvocation:
    return xdr.SorobanAuthorizedInvocation(
        function=xdr.SorobanAuthorizedFunction(
            xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN,
            contract_fn=xdr.InvokeContractArgs(Address(contract).to_xdr_sc_address(), xdr.SCSymbol(fn.encode()), args),
        ),
        sub_invocations=[],
    )


def buy_args(item: str = "book", price: int = 10, user: Keypair = USER) -> list[xdr.SCVal]:
    return [scval.to_address(user.public_key), scval.to_symbol(item), scval.to_int128(price)]


def run(
    env: Env,
    fn: xdr.HostFunction,
    auth: list[xdr.SorobanAuthorizationEntry],
    *,
    mode: str = "apply",
    ledger: int = LEDGER,
    source: str = LANE.public_key,
    footprint: tuple[list[xdr.LedgerKey], list[xdr.LedgerKey]] | None = None,
    upgraded: bool = True,
) -> InvokeOutcome:
    return env.host.invoke(
        host_function=fn,
        auth=auth,
        source_account=source,
        ledger_seq=ledger,
        ledger_close_time=ledger * 5,
        mode=mode,  # type: ignore[arg-type]
        footprint=footprint,
        use_upgraded_auth=upgraded,
    )


def signed_buy(
    env: Env,
    *,
    ctype: xdr.SorobanCredentialsType = V2,
    exp: int = LEDGER + 10,
    signer: Keypair = USER,
    passphrase: str = PASS,
) -> tuple[xdr.HostFunction, xdr.SorobanAuthorizationEntry]:
    args = buy_args()
    entry = authorize_invocation(
        signer, USER.public_key, exp, invocation(env.market, "buy", args), passphrase, credentials_type=ctype
    )
    return host_fn(env.market, "buy", args), entry


def creds_of(entry: xdr.SorobanAuthorizationEntry) -> xdr.SorobanAddressCredentials:
    c = entry.credentials.address_v2 if entry.credentials.type == V2 else entry.credentials.address
    assert c is not None
    return c


def nonce_ledger_key(entry: xdr.SorobanAuthorizationEntry) -> xdr.LedgerKey:
    """Built exactly as stellar-sdk builds an address credential."""
    creds = creds_of(entry)
    return xdr.LedgerKey(
        type=xdr.LedgerEntryType.CONTRACT_DATA,
        contract_data=xdr.LedgerKeyContractData(
            contract=creds.address,
            key=xdr.SCVal(type=xdr.SCValType.SCV_LEDGER_KEY_NONCE, nonce_key=xdr.SCNonceKey(nonce=creds.nonce)),
            durability=xdr.ContractDataDurability.TEMPORARY,
        ),
    )


def orders(env: Env) -> int:
    out = run(env, host_fn(env.market, "orders", [scval.to_address(USER.public_key)]), [], mode="enforce")
    assert out.ok, out.error
    return scval.to_native(out.return_value)


# --- signatures ------------------------------------------------------------------------------------


@pytest.mark.parametrize("ctype", [V1, V2], ids=["ADDRESS", "ADDRESS_V2"])
def test_authorize_invocation_entries_verify_and_apply(env: Env, ctype: xdr.SorobanCredentialsType) -> None:
    fn, entry = signed_buy(env, ctype=ctype)
    out = run(env, fn, [entry])
    assert out.ok, out.error
    assert scval.to_native(out.return_value) == 1
    assert orders(env) == 1


def test_bad_signature_fails(env: Env) -> None:
    fn, entry = signed_buy(env, signer=OTHER)  # OTHER signs for USER's address
    out = run(env, fn, [entry])
    assert not out.ok and out.error_kind == "trapped"
    assert out.error is not None and out.error.startswith("HostError: Error(Auth, InvalidAction)")
    # A tampered signature by the right key fails too.
    fn, entry = signed_buy(env)
    sig_map = creds_of(entry).signature.vec.sc_vec[0].map.sc_map  # type: ignore[union-attr]
    raw = bytearray(sig_map[1].val.bytes.sc_bytes)  # type: ignore[union-attr]
    raw[0] ^= 1
    sig_map[1].val = scval.to_bytes(bytes(raw))
    out = run(env, fn, [entry])
    assert not out.ok and "Error(Auth, InvalidAction)" in (out.error or "")
    assert orders(env) == 0


@pytest.mark.parametrize("ctype", [V1, V2], ids=["ADDRESS", "ADDRESS_V2"])
def test_wrong_network_passphrase_fails(env: Env, ctype: xdr.SorobanCredentialsType) -> None:
    fn, entry = signed_buy(env, ctype=ctype, passphrase=Network.TESTNET_NETWORK_PASSPHRASE)
    out = run(env, fn, [entry])
    assert not out.ok and "Error(Auth, InvalidAction)" in (out.error or "")


def test_v1_signature_does_not_verify_as_v2(env: Env) -> None:
    """ADDRESS_V2 binds the address into the preimage: relabelling a V1 entry breaks it."""
    fn, entry = signed_buy(env, ctype=V1)
    entry.credentials = xdr.SorobanCredentials(V2, address_v2=entry.credentials.address)
    out = run(env, fn, [entry])
    assert not out.ok and "Error(Auth, InvalidAction)" in (out.error or "")


# --- expiration window ---------------------------------------------------------------------------------


def test_expiration_is_inclusive_and_expired_entries_fail(env: Env) -> None:
    fn, entry = signed_buy(env, exp=LEDGER - 1)
    out = run(env, fn, [entry])
    assert not out.ok and "Error(Auth, InvalidAction)" in (out.error or "") and "expired" in (out.error or "")
    fn, entry = signed_buy(env, exp=LEDGER)  # valid through its expiration ledger
    assert run(env, fn, [entry]).ok


def test_too_far_expiration_fails(env: Env) -> None:
    fn, entry = signed_buy(env, exp=LEDGER + MAX_ENTRY_TTL)
    out = run(env, fn, [entry])
    assert not out.ok and "Error(Auth, InvalidAction)" in (out.error or "") and "too late" in (out.error or "")
    fn, entry = signed_buy(env, exp=LEDGER + MAX_ENTRY_TTL - 1)  # the last acceptable ledger
    assert run(env, fn, [entry]).ok


# --- invocation matching -------------------------------------------------------------------------------------


def test_mismatched_args_function_or_contract_fail(env: Env) -> None:
    signed_args = buy_args(price=10)
    entry = authorize_invocation(USER, None, LEDGER + 5, invocation(env.market, "buy", signed_args), PASS)
    for fn in (
        host_fn(env.market, "buy", buy_args(price=11)),  # different price
        host_fn(env.market, "buy", buy_args(item="pen")),  # different item
    ):
        out = run(env, fn, [entry])
        assert not out.ok and "Error(Auth, InvalidAction)" in (out.error or "")
    # An entry for a different function (here SAC transfer) does not authorise buy either.
    t_args = [scval.to_address(USER.public_key), scval.to_address(OTHER.public_key), scval.to_int128(10)]
    other = authorize_invocation(USER, None, LEDGER + 5, invocation(env.usdc, "transfer", t_args), PASS)
    out = run(env, host_fn(env.market, "buy", signed_args), [other])
    assert not out.ok
    assert orders(env) == 0
    assert run(env, host_fn(env.market, "buy", signed_args), [entry]).ok


def test_missing_auth_fails(env: Env) -> None:
    out = run(env, host_fn(env.market, "buy", buy_args()), [])
    assert not out.ok and out.error is not None and out.error.startswith("HostError: Error(Auth, InvalidAction)")


def test_source_account_credentials_authorise_only_the_source(env: Env) -> None:
    args = buy_args(user=LANE)
    entry = xdr.SorobanAuthorizationEntry(
        credentials=xdr.SorobanCredentials(xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_SOURCE_ACCOUNT),
        root_invocation=invocation(env.market, "buy", args),
    )
    assert run(env, host_fn(env.market, "buy", args), [entry], source=LANE.public_key).ok
    # The same entry in a transaction from another source authorises that source, not LANE.
    out = run(env, host_fn(env.market, "buy", args), [entry], source=OTHER.public_key)
    assert not out.ok and "Error(Auth, InvalidAction)" in (out.error or "")


# --- nonces ------------------------------------------------------------------------------------------------------


def test_nonce_replay_fails_and_nonce_entry_lives_until_expiration(env: Env) -> None:
    exp = LEDGER + 20
    fn, entry = signed_buy(env, exp=exp)
    key = nonce_ledger_key(entry)
    assert env.host.get_ledger_entry(key, LEDGER) is None  # not consumed yet
    assert run(env, fn, [entry]).ok
    found = env.host.get_ledger_entry(key, LEDGER)
    assert found is not None
    ledger_entry, live_until = found
    assert live_until == exp
    cd = ledger_entry.data.contract_data
    assert cd is not None and cd.durability == xdr.ContractDataDurability.TEMPORARY
    assert cd.val.type == xdr.SCValType.SCV_VOID and cd.key == key.contract_data.key  # type: ignore[union-attr]
    # Replaying the same signed entry fails, in a later ledger and in simulation.
    replay = run(env, fn, [entry], ledger=LEDGER + 1)
    assert not replay.ok and "Error(Auth, ExistingValue)" in (replay.error or "")
    assert not run(env, fn, [entry], mode="enforce", ledger=LEDGER + 1).ok
    assert orders(env) == 1
    # Readable through its expiration ledger, absent afterwards.
    assert env.host.get_ledger_entry(key, exp) is not None
    assert env.host.get_ledger_entry(key, exp + 1) is None


def test_trapped_invocation_consumes_no_nonce(env: Env) -> None:
    args = buy_args(item="fail")
    entry = authorize_invocation(USER, None, LEDGER + 5, invocation(env.market, "buy", args), PASS)
    out = run(env, host_fn(env.market, "buy", args), [entry])
    assert not out.ok and "Error(Contract, #1)" in (out.error or "")
    assert env.host.get_ledger_entry(nonce_ledger_key(entry), LEDGER) is None


def test_enforce_mode_verifies_but_consumes_nothing(env: Env) -> None:
    fn, entry = signed_buy(env)
    out = run(env, fn, [entry], mode="enforce")
    assert out.ok, out.error
    assert env.host.get_ledger_entry(nonce_ledger_key(entry), LEDGER) is None
    assert orders(env) == 0
    assert run(env, fn, [entry]).ok  # still usable for real


# --- record mode ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("upgraded,ctype", [(True, V2), (False, V1)], ids=["ADDRESS_V2", "ADDRESS"])
def test_record_then_authorize_entry_then_enforce_and_apply(
    env: Env, upgraded: bool, ctype: xdr.SorobanCredentialsType
) -> None:
    fn = host_fn(env.market, "buy", buy_args())
    rec = run(env, fn, [], mode="record", upgraded=upgraded)
    assert rec.ok, rec.error
    assert len(rec.auth) == 1
    unsigned = rec.auth[0]
    creds = creds_of(unsigned)
    assert unsigned.credentials.type == ctype
    assert creds.signature_expiration_ledger.uint32 == 0
    assert creds.signature.type == xdr.SCValType.SCV_VOID
    assert Address.from_xdr_sc_address(creds.address).address == USER.public_key
    # The recorded footprint already holds the nonce key (rw) and the signer's account (ro).
    nonce_key = nonce_ledger_key(unsigned)
    assert nonce_key in rec.read_write
    acct = xdr.LedgerKey(xdr.LedgerEntryType.ACCOUNT, account=xdr.LedgerKeyAccount(USER.xdr_account_id()))
    assert acct in rec.read_only
    assert orders(env) == 0  # simulation committed nothing

    signed = authorize_entry(unsigned, USER, LEDGER + 10, PASS)
    assert run(env, fn, [signed], mode="enforce").ok
    applied = run(env, fn, [signed], footprint=(rec.read_only, rec.read_write))
    assert applied.ok, applied.error
    assert env.host.get_ledger_entry(nonce_key, LEDGER) is not None
    assert orders(env) == 1


def test_record_nonces_are_fresh_and_deterministic(env: Env) -> None:
    fn = host_fn(env.market, "buy", buy_args())
    a = creds_of(run(env, fn, [], mode="record").auth[0]).nonce.int64
    b = creds_of(run(env, fn, [], mode="record").auth[0]).nonce.int64
    assert a != b
    twin = ContractHost(PASS)
    twin.deploy_sac("USDC", ISSUER.public_key)
    twin_market = twin.deploy_market(env.usdc)
    assert twin_market == env.market
    out = twin.invoke(
        host_function=fn, auth=[], source_account=LANE.public_key, ledger_seq=LEDGER, ledger_close_time=0, mode="record"
    )
    assert creds_of(out.auth[0]).nonce.int64 == a


def test_record_for_source_account_gives_source_credentials(env: Env) -> None:
    dtx = hashlib.sha256(b"deposit").digest()
    args = [
        scval.to_address(LANE.public_key),
        scval.to_address(USER.public_key),
        scval.to_int128(5),
        scval.to_bytes(dtx),
    ]
    rec = run(env, host_fn(env.billing, "credit", args), [], mode="record")
    assert rec.ok, rec.error
    assert [e.credentials.type for e in rec.auth] == [xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_SOURCE_ACCOUNT]
    assert run(env, host_fn(env.billing, "credit", args), rec.auth, footprint=(rec.read_only, rec.read_write)).ok


def test_delegates_credentials_are_rejected(env: Env) -> None:
    fn, entry = signed_buy(env)
    entry.credentials = xdr.SorobanCredentials(
        xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_ADDRESS_WITH_DELEGATES,
        address_with_delegates=xdr.SorobanAddressCredentialsWithDelegates(
            address_credentials=creds_of(entry), delegates=[]
        ),
    )
    out = run(env, fn, [entry])
    assert not out.ok and "Error(Auth, InvalidAction)" in (out.error or "")


def test_expired_nonce_entries_are_evicted(env: Env) -> None:
    exp = LEDGER + 2
    fn, entry = signed_buy(env, exp=exp)
    assert run(env, fn, [entry]).ok
    key = nonce_ledger_key(entry)

    def stored_nonces() -> int:
        return sum(1 for e in env.host.snapshot()["entries"] if e["kind"] == "void")

    assert stored_nonces() == 1
    _, later = signed_buy(env, exp=LEDGER + 100)
    assert run(env, fn, [later], ledger=exp + 1).ok  # an apply at exp + 1: the old nonce is dead, not yet evicted
    assert env.host.get_ledger_entry(key, exp + 1) is None
    assert stored_nonces() == 2
    _, third = signed_buy(env, exp=LEDGER + 100)
    assert run(env, fn, [third], ledger=exp + 2).ok
    assert stored_nonces() == 2  # the expired one is gone, the two live ones stay
    assert env.host.get_ledger_entry(nonce_ledger_key(later), exp + 2) is not None


def test_address_credentials_of_a_missing_account_fail_when_the_rpc_layer_says_so(env: Env) -> None:
    known = {LANE.public_key}
    env.host.account_exists = known.__contains__
    fn, entry = signed_buy(env)
    out = run(env, fn, [entry])
    assert not out.ok and "Error(Auth, InvalidAction)" in (out.error or "") and "does not exist" in (out.error or "")
    known.add(USER.public_key)
    assert run(env, fn, [entry]).ok
