"""chain/authority.py over hand-built envelopes: each path's policy, entry by entry (the devnet tests
in tests/hostile/test_envelope_authority.py and tests/workers/test_relay_drainer_authority.py prove the
engine runs it on every path's real envelopes)."""

from __future__ import annotations

import pytest
from stellar_sdk import Keypair, StrKey, scval, xdr

from paygate_cli.chain import authority
from paygate_cli.chain.authority import AuthorityRefused, Ours
from paygate_cli.chain.contracts import Invocation, fee_bump, invoke_transaction

LANE = Keypair.random()
OTHER_LANE = Keypair.random()
FEE = Keypair.random()
USER = Keypair.random().public_key
BILLING = StrKey.encode_contract(b"\x01" * 32)
USDC = StrKey.encode_contract(b"\x02" * 32)
MARKET = StrKey.encode_contract(b"\x03" * 32)
OURS = Ours(frozenset({LANE.public_key, OTHER_LANE.public_key, FEE.public_key, BILLING}), BILLING, USDC)
PASSPHRASE = "Test SDF Network ; September 2015"


def invocation(contract: str, function: str, args: list[xdr.SCVal] | None = None,
               subs: list[xdr.SorobanAuthorizedInvocation] | None = None) -> xdr.SorobanAuthorizedInvocation:
    return xdr.SorobanAuthorizedInvocation(
        function=xdr.SorobanAuthorizedFunction(
            type=xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN,
            contract_fn=xdr.InvokeContractArgs(contract_address=scval.to_address(contract).address,
                                               function_name=xdr.SCSymbol(function.encode()), args=args or [])),
        sub_invocations=subs or [])


def source_entry(contract: str, function: str, **kw: object) -> xdr.SorobanAuthorizationEntry:
    return xdr.SorobanAuthorizationEntry(
        credentials=xdr.SorobanCredentials(xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_SOURCE_ACCOUNT),
        root_invocation=invocation(contract, function, **kw))  # type: ignore[arg-type]


def address_entry(address: str, contract: str, function: str, *, v2: bool = True,
                  **kw: object) -> xdr.SorobanAuthorizationEntry:
    creds = xdr.SorobanAddressCredentials(address=scval.to_address(address).address, nonce=xdr.Int64(7),
                                          signature_expiration_ledger=xdr.Uint32(100),
                                          signature=xdr.SCVal(xdr.SCValType.SCV_VOID))
    kind = xdr.SorobanCredentialsType
    credentials = (xdr.SorobanCredentials(kind.SOROBAN_CREDENTIALS_ADDRESS_V2, address_v2=creds) if v2
                   else xdr.SorobanCredentials(kind.SOROBAN_CREDENTIALS_ADDRESS, address=creds))
    return xdr.SorobanAuthorizationEntry(credentials=credentials,
                                         root_invocation=invocation(contract, function, **kw))  # type: ignore[arg-type]


def envelope(contract: str, function: str, auth: list[xdr.SorobanAuthorizationEntry], *,
             source: Keypair = LANE, op_source: str | None = None) -> str:
    """A fee-bumped one-operation invocation, as the engine's build_signed shapes it (unsimulated)."""
    from stellar_sdk import TransactionEnvelope

    tx = invoke_transaction(source.public_key, 5, Invocation(contract, function, [], auth), max_time=10**9,
                            base_fee=100)
    if op_source is not None:
        from stellar_sdk import MuxedAccount

        tx.operations[0].source_account = MuxedAccount.from_account(op_source).to_xdr_object()
    inner = TransactionEnvelope.from_xdr_object(
        xdr.TransactionEnvelope(xdr.EnvelopeType.ENVELOPE_TYPE_TX, v1=xdr.TransactionV1Envelope(tx, [])), PASSPHRASE)
    inner.sign(source)
    return fee_bump(inner, FEE, 1000, PASSPHRASE)[0]


def check(env: str, policy: authority.Policy, lane: str = LANE.public_key) -> None:
    authority.check(env, policy, lane=lane, ours=OURS)


def refused(env: str, policy: authority.Policy, match: str) -> None:
    with pytest.raises(AuthorityRefused, match=match):
        check(env, policy)


def test_each_path_accepts_exactly_its_own_authority() -> None:
    check(envelope(BILLING, "charge_batch", [source_entry(BILLING, "charge_batch")]), authority.CHARGE_BATCH)
    check(envelope(BILLING, "credit", [source_entry(BILLING, "credit")]), authority.CREDIT)
    check(envelope(USDC, "transfer", [address_entry(USER, USDC, "transfer")]), authority.deposit(USER))
    check(envelope(MARKET, "buy", [address_entry(USER, MARKET, "buy", v2=False,
                                                 subs=[invocation(USDC, "transfer")])]), authority.relay(USER))
    check(envelope(MARKET, "close_expired", []), authority.BOT_JOB)


@pytest.mark.parametrize("entry", [source_entry(MARKET, "buy"), address_entry(USER, MARKET, "buy"),
                                   address_entry(LANE.public_key, MARKET, "buy")], ids=["source", "user", "lane"])
def test_a_bot_job_carries_no_authorisation_at_all(entry: xdr.SorobanAuthorizationEntry) -> None:
    refused(envelope(MARKET, "buy", [entry]), authority.BOT_JOB, "bot_job")


@pytest.mark.parametrize("ours", [LANE.public_key, OTHER_LANE.public_key, FEE.public_key, BILLING],
                         ids=["lane", "other_lane", "fee", "billing"])
def test_no_user_entry_may_authorise_as_one_of_ours(ours: str) -> None:
    for contract, function, policy in ((MARKET, "buy", authority.relay(ours)),
                                       (USDC, "transfer", authority.deposit(ours)),
                                       (MARKET, "close_expired", authority.BOT_JOB),
                                       (BILLING, "charge_batch", authority.CHARGE_BATCH),
                                       (BILLING, "credit", authority.CREDIT)):
        # Even when the row names that account as its user.
        refused(envelope(contract, function, [address_entry(ours, contract, function)]), policy,
                "one of the gateway's own accounts")


def test_relays_and_deposits_carry_only_their_users_entries() -> None:
    refused(envelope(MARKET, "buy", [source_entry(MARKET, "buy")]), authority.relay(USER), "SOURCE_ACCOUNT")
    other = Keypair.random().public_key
    refused(envelope(MARKET, "buy", [address_entry(other, MARKET, "buy")]), authority.relay(USER), "not the relay's")
    refused(envelope(MARKET, "buy", [address_entry(USER, MARKET, "sell")]), authority.relay(USER),
            "other than the invoked")
    refused(envelope(USDC, "transfer", [source_entry(USDC, "transfer")]), authority.deposit(USER), "SOURCE_ACCOUNT")
    refused(envelope(USDC, "transfer", [address_entry(USER, USDC, "transfer", subs=[invocation(MARKET, "buy")])]),
            authority.deposit(USER), "nested")
    refused(envelope(MARKET, "transfer", [address_entry(USER, MARKET, "transfer")]), authority.deposit(USER),
            "not the usdc contract's transfer")


def test_operator_calls_carry_the_lanes_authority_over_their_own_function_only() -> None:
    refused(envelope(BILLING, "charge_batch", [source_entry(USDC, "transfer")]), authority.CHARGE_BATCH,
            "other than the invoked")
    refused(envelope(BILLING, "charge_batch", [source_entry(BILLING, "credit")]), authority.CHARGE_BATCH,
            "other than the invoked")
    refused(envelope(BILLING, "credit", [source_entry(BILLING, "credit", subs=[invocation(USDC, "transfer")])]),
            authority.CREDIT, "nested")
    refused(envelope(BILLING, "charge_batch", [address_entry(USER, BILLING, "charge_batch")]),
            authority.CHARGE_BATCH, "no user authorisation")
    refused(envelope(MARKET, "charge_batch", [source_entry(MARKET, "charge_batch")]), authority.CHARGE_BATCH,
            "not the billing contract's")
    refused(envelope(BILLING, "credit", [source_entry(BILLING, "credit")]), authority.CHARGE_BATCH,
            "not the billing contract's charge_batch")


def test_the_source_is_the_lane_and_no_operation_names_another() -> None:
    env = envelope(BILLING, "credit", [source_entry(BILLING, "credit")])
    with pytest.raises(AuthorityRefused, match="not its lane"):
        check(env, authority.CREDIT, lane=OTHER_LANE.public_key)
    refused(envelope(BILLING, "credit", [source_entry(BILLING, "credit")], op_source=FEE.public_key),
            authority.CREDIT, "its own source account")
    refused("AAAA", authority.CREDIT, "does not decode")


def test_the_ttl_keeper_sends_no_authorisation_and_no_invocation() -> None:
    refused(envelope(MARKET, "close_expired", []), authority.TTL, "INVOKE_HOST_FUNCTION")
