"""What authority an envelope may carry: the one check, for every path, of the Soroban
authorisation entries in a signed envelope (docs/architecture.md §5, "Authority").

The engine runs it on every envelope after signing and before anchoring (journal/engine.py
`prepare`), so no path can send bytes that authorise more than its policy allows, whatever its
own checks, admission or the simulation's recording mode put in the transaction:

| path | SOURCE_ACCOUNT entries (the lane's own authority) | ADDRESS entries (a user's signed authority) |
| --- | --- | --- |
| relay | never | the relay's user only, never one of ours; root = the invoked call |
| bot_job | never | never: a permissionless call needs no authorisation at all |
| charge_batch | root = billing.charge_batch, no sub-invocations | never |
| deposit | never | the depositor only, never one of ours; root = usdc.transfer, no sub-invocations |
| credit | root = billing.credit, no sub-invocations | never |
| ttl | never (ExtendFootprintTTL / RestoreFootprint carry none) | never |

"Ours" is every lane this process holds a key for, the fee account and the billing contract: an
entry authorising as one of them is the gateway lending its own authority. The operation itself
must invoke what the path sends (billing.charge_batch, billing.credit, usdc.transfer; any contract
for the relay and bot jobs, whose allow-lists decide that), with no operation-level source account
(a SOURCE_ACCOUNT entry authorises as the operation's source), from the lane the engine allocated.

Only the inner transaction's header and operations are decoded (never its SorobanTransactionData,
the footprint, which is the bulk of a charge batch): what authority it carries is all in those."""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stellar_sdk import StrKey, xdr
from stellar_sdk.xdr.base import Unpacker

from paygate_cli.errors import PaygateError

if TYPE_CHECKING:
    from paygate_cli.chain.keys import Signer
    from paygate_cli.settings import Settings

_OT = xdr.OperationType
_CT = xdr.SorobanCredentialsType
_AT = xdr.SCAddressType
INVOKE = frozenset({_OT.INVOKE_HOST_FUNCTION})


class AuthorityRefused(PaygateError):
    """The envelope carries an authorisation its path may not: nothing is anchored or broadcast."""

    msgid = "chain.authority_refused"


@dataclass(frozen=True)
class Policy:
    """One path's rule. `invokes`: the (contract role, function) the operation must call, the role
    being "billing" or "usdc" (the configured contracts); None: any (relay, bot job). `operator`:
    SOURCE_ACCOUNT entries are allowed, their root being the invoked call. `user`: the one address
    ADDRESS/ADDRESS_V2 entries may authorise as (None: no such entry at all); `user_subcalls`:
    whether a user's entry may authorise nested calls too."""

    path: str
    invokes: tuple[str, str] | None = None
    operator: bool = False
    user: str | None = None
    user_subcalls: bool = False
    operations: frozenset[xdr.OperationType] = INVOKE


BOT_JOB = Policy("bot_job")
CHARGE_BATCH = Policy("charge_batch", invokes=("billing", "charge_batch"), operator=True)
CREDIT = Policy("credit", invokes=("billing", "credit"), operator=True)
TTL = Policy("ttl", operations=frozenset({_OT.EXTEND_FOOTPRINT_TTL, _OT.RESTORE_FOOTPRINT}))


def relay(user: str) -> Policy:
    # A relayed call may authorise nested calls of the user's (e.g. a token transfer the call makes).
    return Policy("relay", user=user, user_subcalls=True)


def deposit(user: str) -> Policy:
    return Policy("deposit", invokes=("usdc", "transfer"), user=user)


@dataclass(frozen=True)
class Ours:
    """The gateway's own accounts and contracts (strkeys) and the configured contract ids."""

    accounts: frozenset[str]  # every lane we hold a key for, the fee account, the billing contract
    billing: str | None
    usdc: str | None


def ours_of(signer: Signer, settings: Settings) -> Ours:
    """What a signing engine holds: its lanes and fee account, and the configured contracts."""
    billing, usdc = settings.billing_contract, settings.usdc_contract
    accounts = {*signer.lanes, signer.fee.public_key, *([billing] if billing else [])}
    return Ours(frozenset(accounts), billing, usdc)


def check(envelope_xdr: str, policy: Policy, *, lane: str, ours: Ours) -> None:
    """Raise AuthorityRefused unless every authorisation entry of the envelope is one `policy`
    allows, from `lane` (the transaction's source)."""
    where = f"authority refused ({policy.path})"
    try:
        source, operations = _inner(base64.b64decode(envelope_xdr))
    except (ValueError, EOFError) as exc:  # any decode failure: not the envelope the engine built
        raise AuthorityRefused(f"{where}: the envelope does not decode ({type(exc).__name__})") from None
    if source != lane:
        raise AuthorityRefused(f"{where}: the transaction's source is {source}, not its lane {lane}")
    for number, op in enumerate(operations, start=1):
        if op.body.type not in policy.operations:
            raise AuthorityRefused(f"{where}: operation {number} is {op.body.type.name}")
        if op.source_account is not None:
            raise AuthorityRefused(f"{where}: operation {number} names its own source account")
        invoke = op.body.invoke_host_function_op
        if invoke is None:
            continue  # ExtendFootprintTTL / RestoreFootprint: no authorisation field at all
        called = invoke.host_function.invoke_contract
        if called is None:
            raise AuthorityRefused(f"{where}: operation {number} does not invoke a contract function")
        contract, function = _contract(called.contract_address), called.function_name.sc_symbol
        if policy.invokes is not None:
            role, expected = policy.invokes
            wanted = ours.billing if role == "billing" else ours.usdc
            if wanted is None or contract != wanted or function != expected.encode():
                raise AuthorityRefused(f"{where}: operation {number} invokes {_name(contract, function)}, "
                                       f"not the {role} contract's {expected}")
        for index, entry in enumerate(invoke.auth or [], start=1):
            _entry(policy, ours, entry, contract, function, lane,
                   f"{where}: auth entry {index} of operation {number}")


def _entry(policy: Policy, ours: Ours, entry: xdr.SorobanAuthorizationEntry, contract: str | None,
           function: bytes, lane: str, where: str) -> None:
    kind = entry.credentials.type
    root = entry.root_invocation
    if kind == _CT.SOROBAN_CREDENTIALS_SOURCE_ACCOUNT:
        if not policy.operator:
            raise AuthorityRefused(f"{where} has SOURCE_ACCOUNT credentials: it would authorise "
                                   f"{_invoked(root)} as the lane {lane}")
        _root(root, contract, function, where)
        if root.sub_invocations:
            raise AuthorityRefused(f"{where}: the lane's authority would extend to nested calls")
        return
    creds = entry.credentials.address_v2 if kind == _CT.SOROBAN_CREDENTIALS_ADDRESS_V2 else (
        entry.credentials.address if kind == _CT.SOROBAN_CREDENTIALS_ADDRESS else None)
    if creds is None:
        raise AuthorityRefused(f"{where} has {kind.name} credentials")
    signer = _identity(creds.address)
    if signer is not None and signer in ours.accounts:
        raise AuthorityRefused(f"{where} authorises as {signer}, one of the gateway's own accounts")
    if policy.user is None:
        raise AuthorityRefused(f"{where} authorises as {signer or 'an unsupported address'}: "
                               f"a {policy.path.replace('_', ' ')} may carry no user authorisation")
    if signer != policy.user:
        raise AuthorityRefused(f"{where} authorises as {signer or 'an unsupported address'}, "
                               f"not the {policy.path}'s account {policy.user}")
    _root(root, contract, function, where)
    if root.sub_invocations and not policy.user_subcalls:
        raise AuthorityRefused(f"{where} authorises nested calls too")


def _invoked(root: xdr.SorobanAuthorizedInvocation) -> str:
    fn = root.function.contract_fn
    return "a contract creation" if fn is None else _name(_contract(fn.contract_address), fn.function_name.sc_symbol)


def _root(root: xdr.SorobanAuthorizedInvocation, contract: str | None, function: bytes, where: str) -> None:
    fn = root.function.contract_fn
    if fn is None or _contract(fn.contract_address) != contract or fn.function_name.sc_symbol != function:
        raise AuthorityRefused(f"{where} authorises something other than the invoked "
                               f"{_name(contract, function)}")


def _inner(envelope: bytes) -> tuple[str, list[xdr.Operation]]:
    """(source account, operations) of a fee bump's inner transaction, decoded no further than its
    operations. Our envelopes are always a fee bump around a v1 transaction."""
    u = Unpacker(envelope)
    if u.unpack_uint() != xdr.EnvelopeType.ENVELOPE_TYPE_TX_FEE_BUMP.value:
        raise ValueError("not a fee-bump envelope")
    xdr.MuxedAccount.unpack(u)  # the fee source
    xdr.Int64.unpack(u)  # its fee
    if u.unpack_uint() != xdr.EnvelopeType.ENVELOPE_TYPE_TX.value:
        raise ValueError("the inner transaction is not a v1 transaction")
    source = xdr.MuxedAccount.unpack(u)
    xdr.Uint32.unpack(u)
    xdr.SequenceNumber.unpack(u)
    xdr.Preconditions.unpack(u)
    xdr.Memo.unpack(u)
    count = u.unpack_uint()
    if count > 100:
        raise ValueError("more operations than a transaction holds")
    operations = [xdr.Operation.unpack(u) for _ in range(count)]
    if source.type != xdr.CryptoKeyType.KEY_TYPE_ED25519:
        raise ValueError("a muxed transaction source")
    return _account(source.ed25519.uint256), operations


def _identity(address: xdr.SCAddress) -> str | None:
    """Whom an entry authorises as: a G… (a muxed account counts as its G…) or C… strkey; None for
    a kind that cannot sign."""
    if address.type == _AT.SC_ADDRESS_TYPE_ACCOUNT:
        return _account(address.account_id.account_id.ed25519.uint256)
    if address.type == _AT.SC_ADDRESS_TYPE_MUXED_ACCOUNT:
        return _account(address.muxed_account.ed25519.uint256)
    return _contract(address)


def _contract(address: xdr.SCAddress) -> str | None:
    if address.type != _AT.SC_ADDRESS_TYPE_CONTRACT:
        return None
    return _contract_key(address.contract_id.contract_id.hash)


@functools.lru_cache(maxsize=4096)
def _account(raw: bytes) -> str:
    return StrKey.encode_ed25519_public_key(raw)  # base32 in pure Python: the same few recur


@functools.lru_cache(maxsize=1024)
def _contract_key(raw: bytes) -> str:
    return StrKey.encode_contract(raw)


def _name(contract: str | None, function: bytes) -> str:
    return f"{contract or 'a non-contract address'}.{function.decode(errors='replace')[:32]}"
