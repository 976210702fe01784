"""Contract bindings: build the SAC and billing invocations, check a user's deposit authorisation,
build + simulate + sign + fee-bump an invocation, decode events."""

from __future__ import annotations

import base64
import functools
import hashlib
import struct
from dataclasses import dataclass
from typing import Any

from stellar_sdk import Account, Address, Keypair, MuxedAccount, Network, TransactionBuilder, scval, xdr
from stellar_sdk.auth import authorization_payload_hash, build_authorization_preimage
from stellar_sdk.exceptions import BadSignatureError

from paygate_cli.chain.rpc import ChainClient, MalformedAnswer, fee_charged_of
from paygate_cli.errors import ConfigError, PaygateError, Unavailable


class BadAuthorization(PaygateError):
    """The user's signed authorisation can never work; the deposit is quarantined with the reason."""

    msgid = "funding.bad_authorization"


class SimulationFailed(PaygateError):
    msgid = "chain.simulation_failed"


class RestoreRequired(SimulationFailed):
    """The simulation answered with a restorePreamble: archived entries the call needs do not fit one
    transaction with it (auto-restore through ext v1 would pass a per-transaction limit), so a
    RestoreFootprint of `keys_xdr` must land first. Nothing is signed (docs/architecture.md §4 "State
    archival (TTL)")."""

    msgid = "chain.restore_required"

    def __init__(self, message: str, *, keys_xdr: list[str], min_resource_fee: int) -> None:
        super().__init__(message)
        self.keys_xdr = keys_xdr  # base64 LedgerKey XDR: the preamble's read-write footprint
        self.min_resource_fee = min_resource_fee


@dataclass(frozen=True)
class DepositAuth:
    entry_xdr: str
    nonce: int
    expiration_ledger: int

    @property
    def entry(self) -> xdr.SorobanAuthorizationEntry:
        """Decoded on use, afresh each time: only a deposit that gets a lane needs it."""
        return xdr.SorobanAuthorizationEntry.from_xdr(self.entry_xdr)


def check_deposit_auth(entry_b64: str, *, account: str, amount: int, usdc: str, billing: str,
                       passphrase: str) -> DepositAuth:
    """The authorisation must be the user's own signature over exactly
    USDC.transfer(account, billing, amount) on this network, and nothing else.

    A pure function of its arguments: a deposit waiting for a lane is checked again every tick, so
    the verdict of an accepted entry is remembered for the process (the entry itself is decoded
    afresh when used: a transaction built from it never shares a mutable object across ticks)."""
    key = (entry_b64, account, amount, usdc, billing, passphrase)
    known = _ACCEPTED.get(key)
    if known is not None:
        return DepositAuth(entry_b64, *known)
    checked = _check_deposit_auth(entry_b64, account=account, amount=amount, usdc=usdc, billing=billing,
                                  passphrase=passphrase)
    if len(_ACCEPTED) >= 4096:
        _ACCEPTED.clear()  # bounded: a long-lived process never grows without limit
    _ACCEPTED[key] = (checked.nonce, checked.expiration_ledger)
    return checked


_ACCEPTED: dict[tuple[str, str, int, str, str, str], tuple[int, int]] = {}


def _check_deposit_auth(entry_b64: str, *, account: str, amount: int, usdc: str, billing: str,
                        passphrase: str) -> DepositAuth:
    try:
        entry = xdr.SorobanAuthorizationEntry.from_xdr(entry_b64)
    except Exception as exc:  # any decode failure: the bytes are not an authorisation entry
        raise BadAuthorization(f"auth entry is not a SorobanAuthorizationEntry ({type(exc).__name__})") from None
    creds = entry.credentials.address_v2 or entry.credentials.address
    if creds is None:
        raise BadAuthorization("auth entry must carry address credentials signed by the depositor")
    # Compared as XDR values (the expected ones remembered per process, _sc_address), not as strkeys:
    # a strkey is only encoded to name what differs.
    try:
        depositor = _sc_address(account)
    except ValueError:
        raise BadAuthorization(f"the depositing account {account!r} is not a Stellar address") from None
    if creds.address != depositor:
        raise BadAuthorization(f"auth entry is signed for {_strkey(creds.address)}, "
                               f"not the depositing account {account}")
    function = entry.root_invocation.function
    if function.contract_fn is None:
        raise BadAuthorization("auth entry does not authorise a contract call")
    if function.contract_fn.contract_address != _configured(usdc, "PAYGATE_USDC_CONTRACT"):
        contract = _strkey(function.contract_fn.contract_address)
        raise BadAuthorization(f"auth entry authorises contract {contract}, not the USDC contract {usdc}")
    if function.contract_fn.function_name.sc_symbol != b"transfer":
        raise BadAuthorization("auth entry does not authorise transfer")
    if entry.root_invocation.sub_invocations:
        raise BadAuthorization("auth entry authorises more than the transfer")
    args = function.contract_fn.args
    if len(args) != 3 or any(a.type != xdr.SCValType.SCV_ADDRESS for a in args[:2]) \
            or args[2].type != xdr.SCValType.SCV_I128:
        raise BadAuthorization("auth entry's transfer arguments are not (from, to, amount)")
    if args[0].address != depositor or args[1].address != _configured(billing, "PAYGATE_BILLING_CONTRACT"):
        raise BadAuthorization(f"auth entry transfers {_strkey(args[0].address)} -> {_strkey(args[1].address)}, "
                               f"not {account} -> the billing contract")
    value = scval.from_int128(args[2])
    if value != amount:
        raise BadAuthorization(f"auth entry is for amount {value}, the deposit is for {amount}")
    expiration = int(creds.signature_expiration_ledger.uint32)
    # Only an account (G…) signs with an ed25519 key; a contract address can never match.
    depositor_key = depositor.account_id.account_id.ed25519.uint256 if depositor.account_id else None
    try:
        payload = authorization_payload_hash(build_authorization_preimage(entry, expiration, passphrase))
        signatures = scval.to_native(creds.signature)
        valid = any(sig["public_key"] == depositor_key and _verifies(sig["public_key"], payload, sig["signature"])
                    for sig in signatures)
    except (ValueError, TypeError, KeyError):
        raise BadAuthorization("auth entry's signature is not Vec<Map{public_key, signature}>") from None
    if not valid:
        raise BadAuthorization("auth entry's signature does not verify for this network and account")
    return DepositAuth(entry_b64, int(creds.nonce.int64), expiration)


def _configured(contract: str, variable: str) -> xdr.SCAddress:
    """A configured contract id as an SCAddress; a malformed one is the operator's error, never a
    reason to quarantine the user's deposit."""
    try:
        return _sc_address(contract)
    except ValueError:
        raise ConfigError(f"{variable} is not a Stellar contract id: {contract!r}") from None


def _strkey(address: xdr.SCAddress) -> str:
    return Address.from_xdr_sc_address(address).address


def _verifies(public_key: bytes, payload: bytes, signature: bytes) -> bool:
    try:
        Keypair.from_raw_ed25519_public_key(public_key).verify(payload, signature)
        return True
    except BadSignatureError:
        return False


def nonce_key(account: str, nonce: int) -> xdr.LedgerKey:
    """Where the host records a consumed authorisation nonce (CAP-46-11)."""
    return xdr.LedgerKey(type=xdr.LedgerEntryType.CONTRACT_DATA, contract_data=xdr.LedgerKeyContractData(
        contract=_sc_address(account),
        key=xdr.SCVal(type=xdr.SCValType.SCV_LEDGER_KEY_NONCE, nonce_key=xdr.SCNonceKey(nonce=xdr.Int64(nonce))),
        durability=xdr.ContractDataDurability.TEMPORARY))


def nonce_consumed(chain: ChainClient, account: str, nonce: int) -> tuple[bool, int]:
    """(consumed?, latest ledger of the read)."""
    answer = chain.ledger_entries([nonce_key(account, nonce)])
    return bool(answer.entries), int(answer.latest_ledger)


@dataclass(frozen=True)
class LandedReceipt:
    """What a majority of the read endpoints agree a landed transaction was (landed_with_authorisation)."""
    inner_hash: bytes
    ledger: int
    fee_charged: int
    fee_source: str | None  # the fee bump's fee account, else None


def landed_with_authorisation(chain: ChainClient, inner_hash: bytes, *, account: str, nonce: int
                              ) -> LandedReceipt | None:
    """Did the transaction with this inner hash land successfully carrying `account`'s authorisation
    with this nonce? Only when a majority of the read endpoints each show it (each answer's envelope
    hashed again: an answer about another transaction counts for nothing) and agree on its ledger,
    its fee charged and who paid it: the receipt they agree on, else None. Asked of a deposit or a
    relay whose nonce is consumed with no lineage of this database's (a restore lost it)."""
    from stellar_sdk import FeeBumpTransactionEnvelope
    from stellar_sdk.exceptions import SorobanRpcErrorResponse

    chain._guard("landed transaction read")
    votes: dict[tuple[int, int, str | None], int] = {}
    for srv in chain.readers:
        try:
            answer = chain._retrying("getTransaction", lambda srv=srv: srv.get_transaction(inner_hash.hex()), 2)
        except (Unavailable, SorobanRpcErrorResponse):
            continue
        if getattr(answer.status, "value", answer.status) != "SUCCESS" or not answer.envelope_xdr:
            continue
        try:
            envelope = TransactionBuilder.from_xdr(answer.envelope_xdr, chain.passphrase)
            bumped = isinstance(envelope, FeeBumpTransactionEnvelope)
            inner = envelope.transaction.inner_transaction_envelope if bumped else envelope
            if inner.hash() != inner_hash:
                continue
            carries = carries_authorisation(inner.transaction, account=account, nonce=nonce)
            fee = fee_charged_of(answer.result_xdr)
            said = (int(answer.ledger), fee, envelope.transaction.fee_source.account_id if bumped else None)
        except Exception:  # foreign bytes that do not decode: this endpoint's word counts for nothing
            continue
        if carries and fee is not None:
            votes[said] = votes.get(said, 0) + 1
    need = len(chain.read_urls) // 2 + 1
    for (ledger, fee, fee_source), count in votes.items():
        if count >= need:
            return LandedReceipt(inner_hash, ledger, fee, fee_source)
    return None


def authorising_transactions(chain: ChainClient, account: str, nonce: int) -> list[bytes]:
    """Candidates, never a decision: the inner hashes of the successful transactions that carry
    `account`'s authorisation with this nonce, in the ledger where its nonce entry was written (the
    entry's lastModifiedLedgerSeq: the host writes a nonce once, when a transaction consumes it).
    Empty when the nonce is not consumed, or when that ledger is beyond the read hosts' history
    (getTransactions refuses it): then nothing here can name the transaction."""
    from stellar_sdk.exceptions import SorobanRpcErrorResponse

    answer = chain.ledger_entries([nonce_key(account, nonce)])
    if not answer.entries:
        return []
    ledger = int(answer.entries[0].last_modified_ledger)
    try:
        transactions = chain.ledger_transactions(ledger)
    except (Unavailable, SorobanRpcErrorResponse):
        return []
    return [tx.inner_hash for tx in transactions
            if tx.status == "SUCCESS" and carries_authorisation(tx.transaction, account=account, nonce=nonce)]


def carries_authorisation(transaction: Any, *, account: str, nonce: int) -> bool:
    """Does this (inner, stellar_sdk) transaction carry `account`'s authorisation with this nonce?"""
    for op in transaction.operations:
        for entry in getattr(op, "auth", None) or []:
            creds = entry.credentials.address_v2 or entry.credentials.address
            if creds is not None and int(creds.nonce.int64) == nonce \
                    and Address.from_xdr_sc_address(creds.address).address == account:
                return True
    return False


@dataclass(frozen=True)
class Invocation:
    contract: str
    function: str
    args: list[xdr.SCVal]
    auth: list[xdr.SorobanAuthorizationEntry]


@dataclass(frozen=True)
class FootprintCall:
    """An ExtendFootprintTTL (`kind` "extend": `keys_xdr` read-only, to `extend_to` ledgers ahead) or a
    RestoreFootprint (`kind` "restore": `keys_xdr` read-write). Built by chain/ttl.py; build_signed
    takes it where it takes an Invocation. It carries no authorisation."""

    kind: str
    keys_xdr: tuple[str, ...]
    extend_to: int | None = None

    @property
    def function(self) -> str:  # what messages name it by, as an invocation's function
        return "ExtendFootprintTTL" if self.kind == "extend" else "RestoreFootprint"

    @property
    def auth(self) -> list[xdr.SorobanAuthorizationEntry]:
        return []


def sac_transfer(usdc: str, source: str, destination: str, amount: int,
                 auth: xdr.SorobanAuthorizationEntry) -> Invocation:
    return Invocation(usdc, "transfer", [_address_val(source), _address_val(destination),
                                         scval.to_int128(amount)], [auth])


def billing_credit(billing: str, operator: str, account: str, amount: int, deposit_tx: bytes) -> Invocation:
    return Invocation(billing, "credit", [_address_val(operator), _address_val(account),
                                          scval.to_int128(amount), scval.to_bytes(deposit_tx)], [])


def _address_val(address: str) -> xdr.SCVal:
    """scval.to_address, from the remembered SCAddress (_sc_address)."""
    return xdr.SCVal(type=xdr.SCValType.SCV_ADDRESS, address=_sc_address(address))


@dataclass(frozen=True)
class SignedTransaction:
    envelope_xdr: str  # the fee-bump envelope
    inner_hash: bytes
    outer_hash: bytes
    max_time: int
    max_ledger: int | None = None  # the last ledger it may apply in, when bounded
    fee: int | None = None  # the fee bump's fee: the most the fee account can be charged (known when built)
    # What the fee is made of (docs/architecture.md §4 "Fees and the fee market"):
    # fee = bid_rate * fee_ops + resource_fee.
    bid_rate: int | None = None  # the outer inclusion bid per operation (stroops)
    fee_ops: int | None = None  # the operations the bid pays for: the inner's plus one for the fee bump
    resource_fee: int | None = None  # the Soroban resource fee the inner transaction declares


def bid_bound(max_total_fee: int | None, resource_fee: int, fee_ops: int) -> int | None:
    """The highest bid rate whose fee stays within `max_total_fee` (None: unbounded). Negative when
    the resource fee alone is above it."""
    if max_total_fee is None:
        return None
    return (max_total_fee - resource_fee) // fee_ops


def build_signed(chain: ChainClient, *, lane: Keypair, fee_account: Keypair, seq: int,
                 call: Invocation | FootprintCall, max_time: int, base_fee: int, bid_rate: int,
                 max_total_fee: int | None = None, max_ledger: int | None = None) -> SignedTransaction:
    """Build the invocation (or footprint operation) from `lane` at `seq`, simulate (enforce mode when
    the call carries auth), assemble, sign, fee-bump. No database transaction may be open: the guard
    in ChainClient checks.

    The simulation's SorobanTransactionData is spliced in exactly as given: when the call touches an
    archived entry, its ext v1 (archivedSorobanEntries) restores it on the way and the rent is in the
    resource fee. When the restore does not fit the call's transaction, the simulation answers with a
    restorePreamble instead: RestoreRequired, nothing signed.

    `base_fee` is the inner transaction's rate, `bid_rate` the fee bump's (the market's bid,
    journal/fee_market.py). `max_total_fee`: the most the whole fee may be (a relay's reservation):
    the bid is lowered to fit it once the resource fee is known. The network's floor wins over both
    (the outer rate is never below the inner one), so a fee above `max_total_fee` can still come
    out: the caller's check refuses it.

    `max_ledger`: the last ledger the transaction may apply in (a user authorisation's expiration
    ledger). The network's bound is exclusive, so the envelope carries max_ledger + 1: a transaction
    that cannot land before the authorisation dies is then provably dead by ledger (resolve), never
    included to fail with its fee paid.

    Built as XDR directly, the same bytes TransactionBuilder + prepare_transaction + sign
    + the fee bump give (tests/journal/test_engine_speed.py holds them equal): the transaction is packed once,
    for the simulation, and assembly splices the simulation's answer into those bytes
    (assembled_bytes); hash, signature and fee bump reuse them."""
    network_id = _network_id(chain.passphrase)
    footprint = isinstance(call, FootprintCall)
    if isinstance(call, FootprintCall):
        tx = footprint_transaction(lane.public_key, seq, call, max_time=max_time, base_fee=base_fee,
                                   max_ledger=max_ledger)
        unsigned_bytes = tx.to_xdr_bytes()
        # Simulated with the footprint to extend or restore (stellar-rpc requires it); assembly then
        # puts the simulation's narrowed transactionData in its place.
        simulated = unsigned_bytes[:-len(_EXT_V0)] + _EXT_SOROBAN + footprint_data(call).to_xdr_bytes()
    else:
        tx = invoke_transaction(lane.public_key, seq, call, max_time=max_time, base_fee=base_fee,
                                max_ledger=max_ledger)
        simulated = unsigned_bytes = tx.to_xdr_bytes()
    # The unsigned envelope: ENVELOPE_TYPE_TX | tx | an empty signature array.
    simulation = chain.simulate(base64.b64encode(_TX_TYPE + simulated + _NO_SIGNATURES).decode())
    if simulation.error:
        raise SimulationFailed(f"simulation of {call.function} failed: {simulation.error}"[:500])
    if getattr(simulation, "restore_preamble", None) is not None:
        raise _restore_required(call.function, simulation.restore_preamble)
    try:
        tx_bytes, inner_fee, resource_fee = assembled_bytes(unsigned_bytes, simulation, source=lane.public_key,
                                                            carries_auth=bool(call.auth), footprint=footprint)
    except MalformedAnswer as exc:
        # The RPC node is outside paygate: an answer that does not hold together says nothing about
        # the call. Nothing is signed or journaled; the unit is retried later (never made terminal).
        raise Unavailable(f"simulateTransaction of {call.function}: {exc}"[:500], msgid="rpc.malformed") from None
    # Never packed again: the hash, the signature and the fee bump reuse these bytes.
    inner_hash = hashlib.sha256(network_id + _TX_TYPE + tx_bytes).digest()
    signature = lane.sign_decorated(inner_hash).to_xdr_object().to_xdr_bytes()
    fee_ops = 2  # one operation, plus one for the fee bump
    bound = bid_bound(max_total_fee, resource_fee, fee_ops)
    rate = bid_rate if bound is None else min(bid_rate, bound)
    # The network refuses a fee bump whose rate is below the inner transaction's inclusion rate
    # ((inner fee - resource fee) / operations); a minimum resource fee above the resource fee the
    # transaction data declares raises that rate, so the bump's rate rises to cover it.
    bump_rate = max(rate, inner_fee - resource_fee, 100)  # one operation; never below the network's minimum
    envelope_xdr, outer_hash, fee = _fee_bump_bytes(
        tx_bytes, [signature], inner_fee=inner_fee, resource_fee=resource_fee, operations=1,
        fee_account=fee_account, base_fee=bump_rate, network_id=network_id)
    return SignedTransaction(envelope_xdr, inner_hash, outer_hash, max_time, max_ledger, fee, bump_rate, fee_ops,
                             resource_fee)


@dataclass(frozen=True)
class Rebumped:
    """A replacement fee bump (rebump): the same inner transaction, a new outer envelope and bid."""

    envelope_xdr: str
    inner_hash: bytes
    outer_hash: bytes
    fee: int
    bid_rate: int


def rebump(envelope_xdr: str, fee_account: Keypair, bid_rate: int, passphrase: str) -> Rebumped:
    """A new fee bump at `bid_rate` per operation around exactly the inner transaction (bytes and
    signatures) of the fee-bump envelope `envelope_xdr`: the inner hash, the sequence and the time
    bounds are the journaled ones (docs/architecture.md §4 "Fees and the fee market"). A rate below
    the inner transaction's is refused (ValueError), as the network would."""
    raw = base64.b64decode(envelope_xdr, validate=True)
    if raw[:4] != _FEE_BUMP_TYPE:
        raise ValueError("not a fee-bump envelope")
    envelope = xdr.TransactionEnvelope.from_xdr_bytes(raw)
    inner = envelope.fee_bump.tx.inner_tx.v1
    tx_bytes = inner.tx.to_xdr_bytes()
    resource_fee = int(inner.tx.ext.soroban_data.resource_fee.int64) if inner.tx.ext.v == 1 else 0
    network_id = _network_id(passphrase)
    inner_hash = hashlib.sha256(network_id + _TX_TYPE + tx_bytes).digest()
    new_xdr, outer_hash, fee = _fee_bump_bytes(
        tx_bytes, [s.to_xdr_bytes() for s in inner.signatures], inner_fee=int(inner.tx.fee.uint32),
        resource_fee=resource_fee, operations=len(inner.tx.operations), fee_account=fee_account,
        base_fee=bid_rate, network_id=network_id)
    # The inner bytes travel untouched: the replacement is the same transaction (same hash).
    replaced = xdr.TransactionEnvelope.from_xdr(new_xdr).fee_bump.tx.inner_tx.v1
    if hashlib.sha256(network_id + _TX_TYPE + replaced.tx.to_xdr_bytes()).digest() != inner_hash:
        raise AssertionError("a replacement fee bump changed its inner transaction")
    return Rebumped(new_xdr, inner_hash, outer_hash, fee, bid_rate)


def _restore_required(function: str, preamble: Any) -> RestoreRequired | Unavailable:
    """RestoreRequired naming the preamble's entries (its read-write footprint), or Unavailable for a
    preamble that does not decode (the node is outside paygate: nothing is decided on it)."""
    try:
        data = xdr.SorobanTransactionData.from_xdr(preamble.transaction_data)
        keys = [k.to_xdr() for k in data.resources.footprint.read_write]
        fee = int(preamble.min_resource_fee)
    except Exception as exc:  # any decode failure of foreign bytes
        return Unavailable(f"simulateTransaction of {function}: its restorePreamble does not decode "
                           f"({type(exc).__name__})", msgid="rpc.malformed")
    if not keys:
        return Unavailable(f"simulateTransaction of {function}: a restorePreamble with nothing to restore",
                           msgid="rpc.malformed")
    return RestoreRequired(f"simulation of {function}: {len(keys)} archived ledger entr"
                           f"{'y' if len(keys) == 1 else 'ies'} must be restored first (restorePreamble, "
                           f"its minimum fee {fee})", keys_xdr=keys, min_resource_fee=fee)


def footprint_data(call: FootprintCall) -> xdr.SorobanTransactionData:
    """The transactionData a footprint operation is simulated with: its keys, nothing else declared."""
    keys = [xdr.LedgerKey.from_xdr(k) for k in call.keys_xdr]
    read_only, read_write = (keys, []) if call.kind == "extend" else ([], keys)
    return xdr.SorobanTransactionData(
        ext=xdr.SorobanTransactionDataExt(0),
        resources=xdr.SorobanResources(footprint=xdr.LedgerFootprint(read_only=read_only, read_write=read_write),
                                       instructions=xdr.Uint32(0), disk_read_bytes=xdr.Uint32(0),
                                       write_bytes=xdr.Uint32(0)),
        resource_fee=xdr.Int64(0))


def footprint_transaction(source: str, seq: int, call: FootprintCall, *, max_time: int, base_fee: int,
                          max_ledger: int | None = None) -> xdr.Transaction:
    """The unsigned one-operation ExtendFootprintTTL / RestoreFootprint transaction, ext v0 (the
    simulation's transactionData is added by assembly), with invoke_transaction's bounds."""
    if call.kind == "extend":
        assert call.extend_to is not None
        body = xdr.OperationBody(type=xdr.OperationType.EXTEND_FOOTPRINT_TTL,
                                 extend_footprint_ttl_op=xdr.ExtendFootprintTTLOp(
                                     ext=xdr.ExtensionPoint(0), extend_to=xdr.Uint32(call.extend_to)))
    elif call.kind == "restore":
        body = xdr.OperationBody(type=xdr.OperationType.RESTORE_FOOTPRINT,
                                 restore_footprint_op=xdr.RestoreFootprintOp(ext=xdr.ExtensionPoint(0)))
    else:
        raise ValueError(f"unknown footprint operation {call.kind!r}")
    return _one_operation(source, seq, xdr.Operation(source_account=None, body=body), max_time=max_time,
                          base_fee=base_fee, max_ledger=max_ledger)


def invoke_transaction(source: str, seq: int, call: Invocation, *, max_time: int, base_fee: int,
                       max_ledger: int | None = None) -> xdr.Transaction:
    """The unsigned transaction TransactionBuilder(Account(source, seq - 1)) builds for this one
    contract call with time bounds (0, max_time) and, when bounded, ledger bounds (0, max_ledger + 1)."""
    operation = xdr.Operation(source_account=None, body=xdr.OperationBody(
        type=xdr.OperationType.INVOKE_HOST_FUNCTION,
        invoke_host_function_op=xdr.InvokeHostFunctionOp(
            host_function=xdr.HostFunction(
                type=xdr.HostFunctionType.HOST_FUNCTION_TYPE_INVOKE_CONTRACT,
                invoke_contract=xdr.InvokeContractArgs(contract_address=_sc_address(call.contract),
                                                       function_name=xdr.SCSymbol(call.function.encode()),
                                                       args=list(call.args))),
            auth=list(call.auth))))
    return _one_operation(source, seq, operation, max_time=max_time, base_fee=base_fee, max_ledger=max_ledger)


def _one_operation(source: str, seq: int, operation: xdr.Operation, *, max_time: int, base_fee: int,
                   max_ledger: int | None) -> xdr.Transaction:
    from stellar_sdk.ledger_bounds import LedgerBounds
    from stellar_sdk.preconditions import Preconditions
    from stellar_sdk.time_bounds import TimeBounds

    preconditions = Preconditions(time_bounds=TimeBounds(0, max_time),
                                  ledger_bounds=None if max_ledger is None else LedgerBounds(0, max_ledger + 1))
    return xdr.Transaction(source_account=_muxed(source), fee=xdr.Uint32(base_fee),
                           seq_num=xdr.SequenceNumber(xdr.Int64(seq)), cond=preconditions.to_xdr_object(),
                           memo=_NO_MEMO, operations=[operation], ext=xdr.TransactionExt(0))


def assembled_bytes(unsigned: bytes, simulation: Any, *, source: str, carries_auth: bool,
                    footprint: bool = False) -> tuple[bytes, int, int]:
    """What prepare_transaction's assembly makes of a packed one-operation invocation, spliced from its
    bytes instead of decoded and packed again: the fee (right after the source account) raised by
    the minimum resource fee; the simulation's auth entries, when the call carries none, in place of
    the operation's empty auth array (the last field of the last operation, just before the
    transaction's ext); ext v1 with the simulation's SorobanTransactionData, whose last field is its
    int64 resource fee. Returns (transaction bytes, its fee, the resource fee).

    The answer is checked first, as the SDK's assembly checks it (and more, since its bytes are
    spliced unseen): exactly one result, transactionData that decodes as SorobanTransactionData,
    a minimum resource fee that is a fee, recorded auth entries that decode. Anything else is
    MalformedAnswer. `footprint`: an ExtendFootprintTTL / RestoreFootprint, whose answer carries no
    result and no auth (the SDK's assembly takes only its transactionData and fee too)."""
    data, resource_fee, min_resource_fee, recorded = _checked_simulation(simulation, splice_auth=not carries_auth,
                                                                         footprint=footprint)
    fee_at = len(_muxed_bytes(source))
    fee = _U32.unpack(unsigned[fee_at:fee_at + 4])[0] + min_resource_fee
    if fee > 0xFFFFFFFF:
        raise MalformedAnswer(f"the simulation's minimum resource fee {min_resource_fee} overflows the "
                              "transaction fee")
    body = unsigned[fee_at + 4:-len(_EXT_V0)]
    if recorded:
        body = body[:-4] + _U32.pack(len(recorded)) + b"".join(recorded)
    return b"".join([unsigned[:fee_at], _U32.pack(fee), body, _EXT_SOROBAN, data]), fee, resource_fee


def _checked_simulation(simulation: Any, *, splice_auth: bool, footprint: bool = False
                        ) -> tuple[bytes, int, int, list[bytes]]:
    """(transactionData bytes, their resource fee, the minimum resource fee, the recorded auth
    entries' bytes when they are to be spliced in) from a simulation answer, or MalformedAnswer."""
    results = simulation.results
    if footprint:
        results, splice_auth = [None], False  # a footprint operation returns nothing and records no auth
    if not isinstance(results, list) or len(results) != 1:
        count = len(results) if isinstance(results, list) else 0
        raise MalformedAnswer(f"simulation returned {count} results for one invocation")
    encoded = simulation.transaction_data
    if not isinstance(encoded, str) or not encoded:
        raise MalformedAnswer("simulation returned no transactionData")
    try:
        data = base64.b64decode(encoded, validate=True)
        resource_fee = int(xdr.SorobanTransactionData.from_xdr_bytes(data).resource_fee.int64)
    except Exception as exc:  # any decode failure of foreign bytes
        raise MalformedAnswer(f"simulation transactionData does not decode ({type(exc).__name__})") from None
    min_resource_fee = simulation.min_resource_fee
    if isinstance(min_resource_fee, bool) or not isinstance(min_resource_fee, int) or min_resource_fee < 0 \
            or resource_fee < 0:
        raise MalformedAnswer(f"simulation minResourceFee {str(min_resource_fee)[:40]!r} / resourceFee "
                              f"{resource_fee} is not a fee")
    recorded: list[bytes] = []
    if splice_auth:
        for entry in results[0].auth or []:
            try:
                raw = base64.b64decode(entry, validate=True)
                xdr.SorobanAuthorizationEntry.from_xdr_bytes(raw)
            except Exception as exc:  # any decode failure of foreign bytes
                raise MalformedAnswer(f"simulation auth entry does not decode ({type(exc).__name__})") from None
            recorded.append(raw)
    return data, resource_fee, min_resource_fee, recorded


def fee_bump(inner: Any, fee_account: Keypair, base_fee: int, passphrase: str) -> tuple[str, bytes]:
    """The fee-bump envelope of a signed inner transaction (an SDK TransactionEnvelope) -> (base64
    XDR, outer hash).

    Byte-for-byte what TransactionBuilder.build_fee_bump_transaction + sign produce (a test holds
    them equal), built from the XDR directly: the SDK deep-copies the inner transaction first,
    which costs several ms of pure Python per transaction."""
    transaction = inner.transaction
    resource_fee = transaction.soroban_data.resource_fee.int64 if transaction.soroban_data else 0
    envelope_xdr, outer_hash, _fee = _fee_bump_bytes(
        transaction.to_xdr_object().to_xdr_bytes(), [s.to_xdr_object().to_xdr_bytes() for s in inner.signatures],
        inner_fee=transaction.fee, resource_fee=resource_fee, operations=len(transaction.operations),
        fee_account=fee_account, base_fee=base_fee, network_id=_network_id(passphrase))
    return envelope_xdr, outer_hash


def _fee_bump_bytes(tx_bytes: bytes, signatures: list[bytes], *, inner_fee: int, resource_fee: int, operations: int,
                    fee_account: Keypair, base_fee: int, network_id: bytes) -> tuple[str, bytes, int]:
    """The fee bump of a packed, signed inner transaction -> (base64 envelope, outer hash, its fee).
    FeeBumpTransaction = fee source | fee | inner (ENVELOPE_TYPE_TX, tx, signatures) | ext 0; the
    envelope = ENVELOPE_TYPE_TX_FEE_BUMP | that | its signatures: concatenated XDR, no re-packing."""
    if base_fee < 100:
        raise ValueError("fee bump base fee must be at least 100 stroops")
    if base_fee < -(-(inner_fee - resource_fee) // operations):
        raise ValueError("the fee bump's rate must be at least the inner transaction's")
    fee = base_fee * (operations + 1) + resource_fee
    bump_bytes = b"".join([_muxed_bytes(fee_account.public_key), _I64.pack(fee), _TX_TYPE, tx_bytes,
                           _U32.pack(len(signatures)), *signatures, _EXT_V0])
    outer_hash = hashlib.sha256(network_id + _FEE_BUMP_TYPE + bump_bytes).digest()
    signature = fee_account.sign_decorated(outer_hash).to_xdr_object().to_xdr_bytes()
    envelope = _FEE_BUMP_TYPE + bump_bytes + _U32.pack(1) + signature
    return base64.b64encode(envelope).decode(), outer_hash, fee


_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_EXT_V0 = _U32.pack(0)
_EXT_SOROBAN = _U32.pack(1)  # TransactionExt v1: SorobanTransactionData follows
_NO_SIGNATURES = _U32.pack(0)
_TX_TYPE = xdr.EnvelopeType.ENVELOPE_TYPE_TX.to_xdr_bytes()
_NO_MEMO = xdr.Memo(xdr.MemoType.MEMO_NONE)
_FEE_BUMP_TYPE = xdr.EnvelopeType.ENVELOPE_TYPE_TX_FEE_BUMP.to_xdr_bytes()


@functools.lru_cache(maxsize=8)
def _network_id(passphrase: str) -> bytes:
    return Network(passphrase).network_id()  # a SHA-256: the same for the whole process


@functools.lru_cache(maxsize=64)
def _muxed(public_key: str) -> xdr.MuxedAccount:
    return MuxedAccount.from_account(public_key).to_xdr_object()


@functools.lru_cache(maxsize=64)
def _muxed_bytes(public_key: str) -> bytes:
    return _muxed(public_key).to_xdr_bytes()


@functools.lru_cache(maxsize=4096)
def _sc_address(address: str) -> xdr.SCAddress:
    """An account's or contract's SCAddress, remembered: the strkey check decodes base32 in pure
    Python, and the same accounts and contracts recur in every call. Only ever packed, never
    modified, so one object can serve every invocation."""
    return Address(address).to_xdr_sc_address()


def read_contract(chain: ChainClient, *, source: str, contract: str, function: str, args: list[xdr.SCVal]) -> Any:
    """A read-only contract call by simulation (nothing is sent), decoded to Python."""
    builder = TransactionBuilder(Account(source, chain.account_sequence(source)), chain.passphrase, base_fee=100)
    tx = builder.append_invoke_contract_function_op(contract, function, args).set_timeout(300).build()
    simulation = chain.simulate(tx)
    if simulation.error:
        raise SimulationFailed(f"{function} read failed: {simulation.error}"[:500])
    return scval.to_native(simulated_return_value(simulation, function))


def simulated_return_value(simulation: Any, function: str) -> xdr.SCVal:
    """The one result of a read-only simulation, or Unavailable: an answer with no result, several,
    or bytes that do not decode says nothing about the chain (the node is outside paygate), so the
    read is retried later like an unanswered one, never a crash of the tick."""
    results = simulation.results
    if not isinstance(results, list) or len(results) != 1:
        count = len(results) if isinstance(results, list) else 0
        raise Unavailable(f"{function} read: the simulation answered {count} results for one call",
                          msgid="rpc.malformed_answer")
    try:
        return xdr.SCVal.from_xdr(results[0].xdr)
    except Exception as exc:  # any decode failure of foreign bytes
        raise Unavailable(f"{function} read: the simulation's result does not decode ({type(exc).__name__})",
                          msgid="rpc.malformed_answer") from None


def billing_balance(chain: ChainClient, *, billing: str, account: str, source: str) -> int:
    return int(read_contract(chain, source=source, contract=billing, function="balance",
                             args=[scval.to_address(account)]))
