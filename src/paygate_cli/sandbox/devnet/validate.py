"""Envelope decoding and validation, as stellar-core does it when a transaction enters its queue
(and again when it is applied). The checks and their order follow `TransactionFrame::checkValid`
and `FeeBumpTransactionFrame::checkValid` closely enough that every result code a client can see
from real Stellar RPC for these failures is the one the devnet returns (docs/devnet.md lists what stays approximate).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey
from stellar_sdk import StrKey, xdr
from xdrlib3 import Unpacker

from paygate_cli.sandbox.devnet import fees
from paygate_cli.sandbox.devnet.fastxdr import decode_transaction
from paygate_cli.sandbox.devnet.storage import (  # the host's fast LedgerKey encoder
    MAX_ENTRY_TTL,
    enc_ledger_key,
    has_ttl,
    is_persistent,
)
from paygate_cli.sandbox.devnet.xdrutil import fee_bump_result, muxed_to_g, tx_result

if TYPE_CHECKING:
    from paygate_cli.sandbox.devnet.ledger import Account

TRC = xdr.TransactionResultCode
SOROBAN_OPS = (
    xdr.OperationType.INVOKE_HOST_FUNCTION,
    xdr.OperationType.EXTEND_FOOTPRINT_TTL,
    xdr.OperationType.RESTORE_FOOTPRINT,
)
MAX_OPS = 100


class InvalidXdr(ValueError):
    """The request carried bytes that do not decode as the XDR type it must be."""


@dataclass
class Parsed:
    """A decoded envelope with what validation and application need, computed once."""

    b64: str
    fee_bump: bool
    full_hash: bytes  # the envelope's hash (outer for fee bumps): sendTransaction.hash
    inner_hash: bytes  # hash of the (inner) Transaction; equals full_hash for a plain transaction
    tx: xdr.Transaction
    inner_sigs: list[xdr.DecoratedSignature]
    outer_sigs: list[xdr.DecoratedSignature]
    source: str  # sequence source (inner transaction's source)
    fee_source: str  # who pays: the fee-bump fee source, else the source
    seq: int
    fee: int  # total fee bid paid by fee_source
    inner_fee: int
    n_ops: int  # operations of the inner transaction
    soroban: xdr.SorobanTransactionData | None
    inner_size: int  # bytes of the inner ENVELOPE_TYPE_TX envelope (Soroban tx size)

    @property
    def resource_fee(self) -> int:
        return self.soroban.resource_fee.int64 if self.soroban is not None else 0

    @property
    def inclusion_fee(self) -> int:
        return self.fee - self.resource_fee

    @property
    def fee_ops(self) -> int:
        """Operations the inclusion fee is spread over: fee bumps count one more (CAP-15)."""
        return self.n_ops + 1 if self.fee_bump else self.n_ops

    def op_source(self, op: xdr.Operation) -> str:
        return muxed_to_g(op.source_account) if op.source_account is not None else self.source


def decode_b64(b64: object, cls: type) -> object:
    """Decode base64 XDR of `cls`; any failure (bad base64, short input, trailing bytes) → InvalidXdr."""
    if not isinstance(b64, str):
        raise InvalidXdr("expected a base64 string")
    try:
        return cls.from_xdr_bytes(base64.b64decode(b64, validate=True))
    except Exception as exc:  # binascii, EOFError, ValueError, …: garbage raises assorted errors
        raise InvalidXdr(str(exc) or type(exc).__name__) from exc


def parse_envelope(b64: object, net_id: bytes) -> Parsed:
    """Decode an envelope once, slicing the raw bytes for the hashes and the size.

    The Transaction / FeeBumpTransaction bytes inside the envelope are exactly what is hashed, so
    slicing them avoids re-encoding (pure-Python XDR encoding costs as much as decoding).
    """
    if not isinstance(b64, str):
        raise InvalidXdr("expected a base64 string")
    try:
        raw = base64.b64decode(b64, validate=True)
        return _parse_raw(raw, b64, net_id)
    except InvalidXdr:
        raise
    except Exception as exc:  # xdrlib3 raises assorted errors on garbage; all of them mean "invalid"
        raise InvalidXdr(str(exc) or type(exc).__name__) from exc


def _sigs(u: Unpacker) -> list[xdr.DecoratedSignature]:
    n = u.unpack_uint()
    if n > 20:
        raise InvalidXdr("more than 20 signatures")
    return [xdr.DecoratedSignature.unpack(u) for _ in range(n)]


def _transaction(raw: bytes, u: Unpacker) -> xdr.Transaction:
    """The fast decoder where it applies, else the SDK's (which also decides what is invalid)."""
    start = u.get_position()
    try:
        tx, end = decode_transaction(raw, start)
    except Exception:
        u.set_position(start)
        return xdr.Transaction.unpack(u)
    u.set_position(end)
    return tx


def _parse_raw(raw: bytes, b64: str, net_id: bytes) -> Parsed:
    et = xdr.EnvelopeType
    u = Unpacker(raw)
    etype = et.unpack(u)
    if etype == et.ENVELOPE_TYPE_TX:
        t0 = u.get_position()
        tx = _transaction(raw, u)
        t1 = u.get_position()
        inner_sigs, outer_sigs = _sigs(u), []
        inner_hash = hashlib.sha256(net_id + raw[:4] + raw[t0:t1]).digest()
        full_hash, fee_bump = inner_hash, False
        fee_source = muxed_to_g(tx.source_account)
        fee = tx.fee.uint32
        inner_size = len(raw)
    elif etype == et.ENVELOPE_TYPE_TX_FEE_BUMP:
        f0 = u.get_position()
        fee_source = muxed_to_g(xdr.MuxedAccount.unpack(u))
        fee = xdr.Int64.unpack(u).int64
        i0 = u.get_position()
        if et.unpack(u) != et.ENVELOPE_TYPE_TX:
            raise InvalidXdr("fee bump inner transaction must be ENVELOPE_TYPE_TX")
        t0 = u.get_position()
        tx = _transaction(raw, u)
        t1 = u.get_position()
        inner_sigs = _sigs(u)
        i1 = u.get_position()
        xdr.FeeBumpTransactionExt.unpack(u)
        f1 = u.get_position()
        outer_sigs = _sigs(u)
        inner_hash = hashlib.sha256(net_id + raw[i0:i0 + 4] + raw[t0:t1]).digest()
        full_hash, fee_bump = hashlib.sha256(net_id + raw[:4] + raw[f0:f1]).digest(), True
        inner_size = i1 - i0
    else:
        # ENVELOPE_TYPE_TX_V0 predates protocol 13; no current SDK builds it.
        raise InvalidXdr("unsupported envelope type (only ENVELOPE_TYPE_TX and ENVELOPE_TYPE_TX_FEE_BUMP)")
    if u.get_position() != len(raw):
        raise InvalidXdr(f"unexpected trailing {len(raw) - u.get_position()} bytes")
    return Parsed(
        b64=b64, fee_bump=fee_bump, full_hash=full_hash, inner_hash=inner_hash, tx=tx,
        inner_sigs=inner_sigs, outer_sigs=outer_sigs, source=muxed_to_g(tx.source_account),
        fee_source=fee_source, seq=tx.seq_num.sequence_number.int64, fee=fee, inner_fee=tx.fee.uint32,
        n_ops=len(tx.operations), soroban=tx.ext.soroban_data if tx.ext.v == 1 else None,
        inner_size=inner_size,
    )


def archived_indices(sd: xdr.SorobanTransactionData) -> list[int]:
    """SorobanResourcesExtV0.archivedSorobanEntries: the read-write footprint entries to restore."""
    if sd.ext.v != 1 or sd.ext.resource_ext is None:
        return []
    return [i.uint32 for i in sd.ext.resource_ext.archived_soroban_entries]


def declared_resources(sd: xdr.SorobanTransactionData) -> fees.Resources:
    r = sd.resources
    return fees.Resources(
        instructions=r.instructions.uint32, disk_read_bytes=r.disk_read_bytes.uint32,
        write_bytes=r.write_bytes.uint32, read_entries=len(r.footprint.read_only),
        write_entries=len(r.footprint.read_write),
    )


class Rejected(Exception):
    """Validation failed with a result code; `result` is the TransactionResult to return."""

    def __init__(self, result: xdr.TransactionResult, reason: str) -> None:
        super().__init__(reason)
        self.result = result
        self.reason = reason


def _structure_code(p: Parsed) -> tuple[xdr.TransactionResultCode, str] | None:
    """Checks that need no ledger state: operation count, Soroban shape, resources vs limits."""
    tx = p.tx
    if p.n_ops == 0:
        return TRC.txMISSING_OPERATION, "transaction has no operations"
    if p.n_ops > MAX_OPS:
        return TRC.txMALFORMED, f"more than {MAX_OPS} operations"
    soroban_ops = [op for op in tx.operations if op.body.type in SOROBAN_OPS]
    if soroban_ops and p.n_ops != 1:
        return TRC.txMALFORMED, "a Soroban operation must be the only operation"
    if soroban_ops and p.soroban is None:
        return TRC.txMALFORMED, "Soroban transaction without sorobanData"
    if not soroban_ops and p.soroban is not None:
        return TRC.txMALFORMED, "sorobanData on a non-Soroban transaction"
    if p.soroban is None:
        return None
    if p.resource_fee < 0 or p.resource_fee > p.inner_fee:
        return TRC.txMALFORMED, "resourceFee exceeds the transaction fee"
    res = declared_resources(p.soroban)
    why = fees.limits_violation(res, p.inner_size)
    if why:
        return TRC.txSOROBAN_INVALID, why
    keys = list(p.soroban.resources.footprint.read_only) + list(p.soroban.resources.footprint.read_write)
    raw = [enc_ledger_key(k) for k in keys]
    if len(set(raw)) != len(raw):
        return TRC.txSOROBAN_INVALID, "duplicate footprint key"
    if any(k.type == xdr.LedgerEntryType.TTL for k in keys):
        return TRC.txSOROBAN_INVALID, "TTL keys are not allowed in a footprint"
    # stellar-core checkSorobanResources: archivedSorobanEntries strictly ascending, each an index of
    # the read-write footprint holding a persistent entry.
    rw_raw = raw[len(p.soroban.resources.footprint.read_only):]
    last = -1
    for index in archived_indices(p.soroban):
        if index <= last:
            return TRC.txSOROBAN_INVALID, "archivedSorobanEntries must be sorted in ascending order"
        if index >= len(rw_raw):
            return TRC.txSOROBAN_INVALID, "archivedSorobanEntries index is out of bounds"
        if not is_persistent(rw_raw[index]):
            return TRC.txSOROBAN_INVALID, "archivedSorobanEntries index points to a non-persistent entry"
        last = index
    min_fee = fees.non_refundable_fee(res, p.inner_size)
    if p.resource_fee < min_fee:
        return TRC.txSOROBAN_INVALID, (
            f"resourceFee {p.resource_fee} below the {min_fee} the declared resources cost"
        )
    return None


def _bounds_code(tx: xdr.Transaction, ledger_seq: int, close_time: int
                 ) -> tuple[xdr.TransactionResultCode, str] | None:
    """CAP-21: minTime <= closeTime <= maxTime (inclusive), minLedger <= seq < maxLedger (exclusive)."""
    c = tx.cond
    tb = c.time_bounds if c.type == xdr.PreconditionType.PRECOND_TIME else None
    lb = None
    if c.type == xdr.PreconditionType.PRECOND_V2 and c.v2 is not None:
        tb, lb = c.v2.time_bounds, c.v2.ledger_bounds
    if tb is not None:
        lo, hi = tb.min_time.time_point.uint64, tb.max_time.time_point.uint64
        if lo and close_time < lo:
            return TRC.txTOO_EARLY, f"closeTime {close_time} < minTime {lo}"
        if hi and close_time > hi:
            return TRC.txTOO_LATE, f"closeTime {close_time} > maxTime {hi}"
    if lb is not None:
        lo, hi = lb.min_ledger.uint32, lb.max_ledger.uint32
        if lo and ledger_seq < lo:
            return TRC.txTOO_EARLY, f"ledger {ledger_seq} < minLedger {lo}"
        if hi and ledger_seq >= hi:
            return TRC.txTOO_LATE, f"ledger {ledger_seq} >= maxLedger {hi}"
    return None


def _seq_ok(tx: xdr.Transaction, account_seq: int) -> bool:
    seq = tx.seq_num.sequence_number.int64
    c = tx.cond
    if c.type == xdr.PreconditionType.PRECOND_V2 and c.v2 is not None and c.v2.min_seq_num is not None:
        # CAP-21 minSeqNum relaxes "exactly account+1" to a range.
        return c.v2.min_seq_num.sequence_number.int64 <= account_seq < seq
    return seq == account_seq + 1


_vk_cache: dict[str, VerifyKey] = {}


def _verify_key(g: str) -> VerifyKey:
    vk = _vk_cache.get(g)
    if vk is None:
        vk = _vk_cache[g] = VerifyKey(StrKey.decode_ed25519_public_key(g))
    return vk


def _check_signatures(sigs: list[xdr.DecoratedSignature], h: bytes, signers: dict[str, Account]
                      ) -> tuple[xdr.TransactionResultCode, str] | None:
    """Every required account needs its master key's weight >= its threshold; no extra signatures.

    The devnet's accounts have only a master key (no added signers), so weight is the master weight.
    """
    used = [False] * len(sigs)
    for g, acct in signers.items():
        weight = 0
        hint = StrKey.decode_ed25519_public_key(g)[-4:]
        for i, ds in enumerate(sigs):
            if used[i] or ds.hint.signature_hint != hint:
                continue
            try:
                _verify_key(g).verify(h, ds.signature.signature)
            except (BadSignatureError, ValueError):
                continue
            used[i] = True
            weight += acct.thresholds[0]
            break
        if weight == 0 or weight < max(1, acct.thresholds[2]):
            return TRC.txBAD_AUTH, f"missing or invalid signature for {g}"
    if not all(used):
        return TRC.txBAD_AUTH_EXTRA, "unused signatures attached"
    return None


@dataclass
class Context:
    """What validation reads from the ledger: accounts, the ledger the tx would apply in, queued fees."""

    accounts: dict[str, Account]
    ledger_seq: int  # the ledger the transaction would be applied in
    close_time: int  # close time to check time bounds against
    queued_fees: dict[str, int]  # fee source → fees of its queued transactions (not counting a replaced one)
    max_entry_ttl: int = MAX_ENTRY_TTL  # the network's (bounds ExtendFootprintTTL's extendTo)


def _reserve(acct: Account) -> int:
    return (2 + acct.num_sub_entries) * fees.BASE_RESERVE


def min_fee(p: Parsed) -> int:
    return fees.BASE_FEE * p.fee_ops + p.resource_fee


def check(p: Parsed, ctx: Context, *, at_apply: bool = False) -> None:
    """Raise Rejected with the result stellar-core would give, or return when the envelope is valid.

    `at_apply` re-checks what a closing ledger can invalidate (bounds, sequence, accounts) and skips
    signatures (already verified) and the balance-vs-queue check (the queue no longer holds it).
    """
    if p.fee_bump:
        _check_outer(p, ctx, at_apply)
    code = _check_inner(p, ctx, at_apply)
    fee_charged = min_fee(p)
    if code is None:
        malformed = None if at_apply else _footprint_op_malformed(p, ctx)
        if malformed is None:
            return
        op_result, why = malformed
        if p.fee_bump:
            raise Rejected(fee_bump_result(fee_charged, p.inner_hash, TRC.txFAILED, [op_result]), why)
        raise Rejected(tx_result(fee_charged, TRC.txFAILED, [op_result]), why)
    c, why = code
    if p.fee_bump:
        raise Rejected(fee_bump_result(fee_charged, p.inner_hash, c), why)
    raise Rejected(tx_result(fee_charged, c), why)


def _footprint_op_malformed(p: Parsed, ctx: Context) -> tuple[xdr.OperationResult, str] | None:
    """The operation checks stellar-core makes last (doCheckValidForSoroban), failing the transaction
    with txFAILED and the operation's MALFORMED: ExtendFootprintTTL extends read-only entries with a
    TTL by at most max-entry-ttl - 1 ledgers; RestoreFootprint restores read-write persistent ones."""
    if p.soroban is None or p.n_ops != 1:
        return None
    op = p.tx.operations[0]
    t = op.body.type
    fp = p.soroban.resources.footprint
    why = None
    if t == xdr.OperationType.EXTEND_FOOTPRINT_TTL:
        assert op.body.extend_footprint_ttl_op is not None
        if fp.read_write:
            why = "read-write footprint must be empty for ExtendFootprintTTL operation"
        elif not all(has_ttl(enc_ledger_key(k)) for k in fp.read_only):
            why = "only entries with TTL (contract data or code entries) can have it extended"
        elif op.body.extend_footprint_ttl_op.extend_to.uint32 > ctx.max_entry_ttl - 1:
            why = f"TTL extension is too large: {op.body.extend_footprint_ttl_op.extend_to.uint32} > " \
                  f"{ctx.max_entry_ttl - 1}"
        if why is None:
            return None
        tr = xdr.OperationResultTr(type=t, extend_footprint_ttl_result=xdr.ExtendFootprintTTLResult(
            xdr.ExtendFootprintTTLResultCode.EXTEND_FOOTPRINT_TTL_MALFORMED))
    elif t == xdr.OperationType.RESTORE_FOOTPRINT:
        if fp.read_only:
            why = "read-only footprint must be empty for RestoreFootprint operation"
        elif not all(is_persistent(enc_ledger_key(k)) for k in fp.read_write):
            why = "only persistent Soroban entries can be restored"
        if why is None:
            return None
        tr = xdr.OperationResultTr(type=t, restore_footprint_result=xdr.RestoreFootprintResult(
            xdr.RestoreFootprintResultCode.RESTORE_FOOTPRINT_MALFORMED))
    else:
        return None
    return xdr.OperationResult(code=xdr.OperationResultCode.opINNER, tr=tr), why


def _check_outer(p: Parsed, ctx: Context, at_apply: bool) -> None:
    def reject(c: xdr.TransactionResultCode, why: str, fee_charged: int | None = None) -> None:
        raise Rejected(tx_result(min_fee(p) if fee_charged is None else fee_charged, c), why)

    if p.n_ops == 0:
        # An empty inner transaction is reported through the inner pair like other inner failures.
        return
    need = min_fee(p)
    if p.fee < need:
        reject(TRC.txINSUFFICIENT_FEE, f"fee-bump fee {p.fee} below the minimum {need}", need)
    # CAP-15: the outer inclusion fee rate (over ops+1) must be at least the inner rate (over ops).
    inner_incl = p.inner_fee - p.resource_fee
    if p.inclusion_fee * p.n_ops < inner_incl * (p.n_ops + 1):
        needed = -(-inner_incl * (p.n_ops + 1) // p.n_ops) + p.resource_fee
        reject(TRC.txINSUFFICIENT_FEE, "fee-bump fee rate below the inner transaction's", needed)
    src = ctx.accounts.get(p.fee_source)
    if src is None:
        reject(TRC.txNO_ACCOUNT, f"fee source {p.fee_source} does not exist")
        return
    if at_apply:
        return
    code = _check_signatures(p.outer_sigs, p.full_hash, {p.fee_source: src})
    if code:
        reject(*code)
    if not at_apply:
        available = src.balance - _reserve(src) - ctx.queued_fees.get(p.fee_source, 0)
        if available < p.fee:
            reject(TRC.txINSUFFICIENT_BALANCE, f"fee source {p.fee_source} cannot pay {p.fee}")


def _check_inner(p: Parsed, ctx: Context, at_apply: bool) -> tuple[xdr.TransactionResultCode, str] | None:
    code = None if at_apply else _structure_code(p)  # the envelope cannot change after admission
    if code:
        return code
    code = _bounds_code(p.tx, ctx.ledger_seq, ctx.close_time)
    if code:
        return code
    if not p.fee_bump and p.inclusion_fee < fees.BASE_FEE * p.n_ops:
        return TRC.txINSUFFICIENT_FEE, f"inclusion fee {p.inclusion_fee} below {fees.BASE_FEE}/op"
    src = ctx.accounts.get(p.source)
    if src is None:
        return TRC.txNO_ACCOUNT, f"source account {p.source} does not exist"
    if not _seq_ok(p.tx, src.seq):
        return TRC.txBAD_SEQ, f"sequence {p.seq} is not account sequence {src.seq} + 1"
    signers: dict[str, Account] = {p.source: src}
    for op in p.tx.operations:
        g = p.op_source(op)
        if g not in signers:
            acct = ctx.accounts.get(g)
            if acct is None:
                return TRC.txBAD_AUTH, f"operation source {g} does not exist"
            signers[g] = acct
    if at_apply:
        # Signatures were verified on admission and devnet accounts never change signers.
        return None
    code = _check_signatures(p.inner_sigs, p.inner_hash, signers)
    if code:
        return code
    if not p.fee_bump:
        available = src.balance - _reserve(src) - ctx.queued_fees.get(p.fee_source, 0)
        if available < p.fee:
            return TRC.txINSUFFICIENT_BALANCE, f"source {p.source} cannot pay {p.fee}"
    return None
