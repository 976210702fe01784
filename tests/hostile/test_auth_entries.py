"""The workers' checks of a user's authorisation entry, on hostile bytes.

SQL admission cannot verify signatures or read the invocation, so a deposit or relay carrying an
entry signed for another network, for another contract or function, by another account, or simply
corrupted, is admitted and then refused by the worker with a reason (the row is quarantined; the
queue moves on: tests/workers/test_funding_bad_input.py and tests/workers/test_relay.py prove that on the devnet).
Here hypothesis corrupts valid entries byte by byte and semantically, and asserts the check always
ends in its own refusal (BadAuthorization / BadRelay: a quarantine reason), never another exception
(which would fail the tick instead of quarantining the row) and never acceptance of a changed entry."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stellar_sdk import Keypair, StrKey, scval, xdr
from stellar_sdk.auth import authorize_invocation

from paygate_cli.chain.contracts import BadAuthorization, check_deposit_auth
from paygate_cli.chain.relay import BadRelay, relay_invocation
from paygate_cli.errors import ConfigError
from tests.support.relay_admission import MARKET, PASSPHRASE, USER, args_xdr, auth_entry

ENTRIES = settings(max_examples=150, deadline=None, derandomize=True)
USDC = StrKey.encode_contract(bytes([21]) * 32)
BILLING = StrKey.encode_contract(bytes([22]) * 32)
AMOUNT = 5_000_000
EXPIRATION = 500


def deposit_entry(*, contract: str = USDC, function: bytes = b"transfer", to: str = BILLING, amount: int = AMOUNT,
                  signer: Keypair = USER, passphrase: str = PASSPHRASE) -> str:
    invocation = xdr.SorobanAuthorizedInvocation(
        function=xdr.SorobanAuthorizedFunction(
            type=xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN,
            contract_fn=xdr.InvokeContractArgs(
                contract_address=scval.to_address(contract).address, function_name=xdr.SCSymbol(function),
                args=[scval.to_address(USER.public_key), scval.to_address(to), scval.to_int128(amount)])),
        sub_invocations=[])
    return authorize_invocation(signer, None, EXPIRATION, invocation, passphrase).to_xdr()


def check_deposit(entry: str) -> object:
    return check_deposit_auth(entry, account=USER.public_key, amount=AMOUNT, usdc=USDC, billing=BILLING,
                              passphrase=PASSPHRASE)


def check_relay(entry: str, nonce: int) -> object:
    return relay_invocation(account=USER.public_key, contract=MARKET, function="buy", args_xdr=args_xdr(),
                            auth_entries=[entry], nonces=[nonce], expiration_ledger=EXPIRATION,
                            passphrase=PASSPHRASE, own_accounts=set())


def nonce_of(entry: str) -> int:
    parsed = xdr.SorobanAuthorizationEntry.from_xdr(entry)
    return int((parsed.credentials.address_v2 or parsed.credentials.address).nonce.int64)


@st.composite
def corrupted_bytes(draw: st.DrawFn, entry: str) -> str:
    raw = bytearray(base64.b64decode(entry))
    how = draw(st.sampled_from(["flip", "truncate", "insert", "overwrite"]))
    at = draw(st.integers(0, len(raw) - 1))
    if how == "flip":
        raw[at] ^= draw(st.integers(1, 255))
    elif how == "truncate":
        del raw[at:]
    elif how == "insert":
        raw[at:at] = draw(st.binary(min_size=1, max_size=8))
    else:
        raw[at:at + 4] = draw(st.sampled_from([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f\xff\xff\xff",
                                               b"\x00\x00\x00\x05"]))
    return base64.b64encode(bytes(raw)).decode()


def same_entry(original: str, mutated: str) -> bool:
    """A mutation that only touched XDR padding decodes to the very same entry: still valid."""
    try:
        return xdr.SorobanAuthorizationEntry.from_xdr(mutated).to_xdr() == original
    except Exception:  # does not decode: certainly not the same entry
        return False


GOOD_DEPOSIT = deposit_entry()


def test_valid_entries_pass_both_checks() -> None:
    """The corpus's starting points are accepted, so every refusal below is the corruption's doing."""
    check_deposit(GOOD_DEPOSIT)
    good_relay = auth_entry(expiration=EXPIRATION)
    check_relay(good_relay, nonce_of(good_relay))


def test_semantically_wrong_entries_are_refused_with_a_reason() -> None:
    other = Keypair.from_raw_ed25519_seed(bytes([3]) * 32)
    for entry, reason in [
        (deposit_entry(passphrase="Test SDF Network ; September 2015"), "does not verify for this network"),
        (deposit_entry(contract=MARKET), "not the USDC contract"),
        (deposit_entry(function=b"approve"), "does not authorise transfer"),
        (deposit_entry(to=MARKET), "not " + USER.public_key),
        (deposit_entry(amount=AMOUNT + 1), "is for amount"),
        (deposit_entry(signer=other), "not the depositing account"),
    ]:
        try:
            check_deposit(entry)
        except BadAuthorization as exc:
            assert reason in str(exc), (reason, str(exc))
        else:
            raise AssertionError(f"accepted: {reason}")
    for entry, reason in [
        (auth_entry(expiration=EXPIRATION, function="sell"), "authorises a different call"),
        (auth_entry(expiration=EXPIRATION, signer=other), "is signed for"),
    ]:
        try:
            check_relay(entry, nonce_of(entry))
        except BadRelay as exc:
            assert reason in str(exc), (reason, str(exc))
        else:
            raise AssertionError(f"accepted: {reason}")


def test_a_misconfigured_contract_id_is_a_config_error_not_a_quarantine() -> None:
    """A typo in PAYGATE_USDC_CONTRACT or PAYGATE_BILLING_CONTRACT is the operator's to fix: the tick
    stops with a config error (exit 78) instead of refusing every user's deposit for good."""
    for usdc, billing, variable in [("CNOTACONTRACT", BILLING, "PAYGATE_USDC_CONTRACT"),
                                    (USDC, "not-an-id", "PAYGATE_BILLING_CONTRACT")]:
        with pytest.raises(ConfigError, match=variable):
            check_deposit_auth(GOOD_DEPOSIT, account=USER.public_key, amount=AMOUNT, usdc=usdc, billing=billing,
                               passphrase=PASSPHRASE)


@ENTRIES
@given(data=st.data())
def test_corrupted_deposit_entries_are_quarantined_never_crash(data: st.DataObject) -> None:
    mutated = data.draw(corrupted_bytes(GOOD_DEPOSIT))
    try:
        check_deposit(mutated)
    except BadAuthorization:
        return
    assert same_entry(GOOD_DEPOSIT, mutated), mutated


@ENTRIES
@given(data=st.data())
def test_corrupted_relay_entries_are_quarantined_never_crash(data: st.DataObject) -> None:
    good = auth_entry(expiration=EXPIRATION, nonce=77)
    mutated = data.draw(corrupted_bytes(good))
    try:
        check_relay(mutated, 77)
    except BadRelay:
        return
    assert same_entry(good, mutated), mutated
