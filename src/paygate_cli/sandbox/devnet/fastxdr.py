"""A fast decoder for the hot shapes of a Soroban `Transaction` (contract-call arguments, auth
invocations, footprint keys), producing the very same `stellar_sdk.xdr` objects as the SDK.

The SDK's generated pure-Python decoder spends most of a `charge_batch` envelope's decode in
SCVal/LedgerKey dispatch. Here the common cases (addresses, symbols, bytes, vectors, i128, u32/u64,
contract-data keys) are read with `struct` straight from the buffer; everything else is handed to
the SDK's own `unpack` at the same position, so the result is exactly what the SDK would build.
Callers fall back to the SDK's full decode on any error (`decode_transaction` raises, never lies):
the fast path must never accept bytes the SDK rejects, so it checks lengths, padding and enums.
"""

from __future__ import annotations

import struct
from typing import Any

from stellar_sdk import xdr
from xdrlib3 import Unpacker

_U32 = struct.Struct(">I").unpack_from
_I64 = struct.Struct(">q").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_SCV = {m.value: m for m in xdr.SCValType}
_BASE = dict.fromkeys(vars(xdr.SCVal(xdr.SCValType.SCV_VOID)))
_MAX_DEPTH = 64  # deeper values go through the SDK (which enforces its own depth limit)
_ACCOUNT_T = xdr.SCAddressType.SC_ADDRESS_TYPE_ACCOUNT
_CONTRACT_T = xdr.SCAddressType.SC_ADDRESS_TYPE_CONTRACT
_ED25519 = xdr.PublicKeyType.PUBLIC_KEY_TYPE_ED25519
_DURABILITY = {m.value: m for m in xdr.ContractDataDurability}


class FastDecodeError(ValueError):
    pass


def _sdk(cls: Any, buf: bytes, off: int) -> tuple[Any, int]:
    u = Unpacker(buf)
    u.set_position(off)
    obj = cls.unpack(u)
    return obj, u.get_position()


def _opaque(buf: bytes, off: int) -> tuple[bytes, int]:
    n = _U32(buf, off)[0]
    end = off + 4 + n
    pad = -n % 4
    if end + pad > len(buf) or buf[end:end + pad].strip(b"\0"):
        raise FastDecodeError("opaque out of range or bad padding")
    return buf[off + 4:end], end + pad


def _scval(t: int, **kw: Any) -> xdr.SCVal:
    o = xdr.SCVal.__new__(xdr.SCVal)
    d = dict(_BASE)
    d["type"] = _SCV[t]
    d.update(kw)
    o.__dict__ = d
    return o


def _address(buf: bytes, off: int) -> tuple[xdr.SCAddress, int]:
    at = _U32(buf, off)[0]
    if at == 0 and _U32(buf, off + 4)[0] == 0 and off + 40 <= len(buf):
        pk = xdr.PublicKey(_ED25519, ed25519=xdr.Uint256(buf[off + 8:off + 40]))
        return xdr.SCAddress(type=_ACCOUNT_T, account_id=xdr.AccountID(pk)), off + 40
    if at == 1 and off + 36 <= len(buf):
        return xdr.SCAddress(type=_CONTRACT_T, contract_id=xdr.ContractID(xdr.Hash(buf[off + 4:off + 36]))), off + 36
    return _sdk(xdr.SCAddress, buf, off)


def scval(buf: bytes, off: int, depth: int = 0) -> tuple[xdr.SCVal, int]:
    t = _U32(buf, off)[0]
    p = off + 4
    if depth < _MAX_DEPTH:
        if t == 18:  # ADDRESS
            a, p = _address(buf, p)
            return _scval(18, address=a), p
        if t == 16 and _U32(buf, p)[0] == 1:  # VEC (present)
            n = _U32(buf, p + 4)[0]
            p += 8
            if n > len(buf):
                raise FastDecodeError("vector length out of range")
            items = []
            for _ in range(n):
                v, p = scval(buf, p, depth + 1)
                items.append(v)
            return _scval(16, vec=xdr.SCVec(items)), p
        if t == 10 and p + 16 <= len(buf):  # I128
            return _scval(10, i128=xdr.Int128Parts(xdr.Int64(_I64(buf, p)[0]), xdr.Uint64(_U64(buf, p + 8)[0]))), p + 16
        if t == 13:  # BYTES
            b, p = _opaque(buf, p)
            return _scval(13, bytes=xdr.SCBytes(b)), p
        if t == 15:  # SYMBOL (max 32)
            b, p = _opaque(buf, p)
            if len(b) > 32:
                raise FastDecodeError("symbol too long")
            return _scval(15, sym=xdr.SCSymbol(b)), p
        if t == 3 and p + 4 <= len(buf):  # U32
            return _scval(3, u32=xdr.Uint32(_U32(buf, p)[0])), p + 4
        if t == 5 and p + 8 <= len(buf):  # U64
            return _scval(5, u64=xdr.Uint64(_U64(buf, p)[0])), p + 8
    return _sdk(xdr.SCVal, buf, off)


def _args(buf: bytes, off: int) -> tuple[xdr.InvokeContractArgs, int]:
    addr, p = _address(buf, off)
    name, p = _opaque(buf, p)
    if len(name) > 32:
        raise FastDecodeError("function name too long")
    n = _U32(buf, p)[0]
    p += 4
    if n > len(buf):
        raise FastDecodeError("argument count out of range")
    args = []
    for _ in range(n):
        v, p = scval(buf, p)
        args.append(v)
    return xdr.InvokeContractArgs(contract_address=addr, function_name=xdr.SCSymbol(name), args=args), p


def _invocation(buf: bytes, off: int, depth: int = 0) -> tuple[xdr.SorobanAuthorizedInvocation, int]:
    if depth > _MAX_DEPTH or _U32(buf, off)[0] != 0:  # not CONTRACT_FN: let the SDK decode it
        return _sdk(xdr.SorobanAuthorizedInvocation, buf, off)
    fn_args, p = _args(buf, off + 4)
    fn = xdr.SorobanAuthorizedFunction(
        type=xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN, contract_fn=fn_args)
    n = _U32(buf, p)[0]
    p += 4
    if n > len(buf):
        raise FastDecodeError("sub-invocation count out of range")
    subs = []
    for _ in range(n):
        s, p = _invocation(buf, p, depth + 1)
        subs.append(s)
    return xdr.SorobanAuthorizedInvocation(function=fn, sub_invocations=subs), p


def _auth_entry(buf: bytes, off: int) -> tuple[xdr.SorobanAuthorizationEntry, int]:
    creds, p = _sdk(xdr.SorobanCredentials, buf, off)
    inv, p = _invocation(buf, p)
    return xdr.SorobanAuthorizationEntry(credentials=creds, root_invocation=inv), p


def _ledger_key(buf: bytes, off: int) -> tuple[xdr.LedgerKey, int]:
    if _U32(buf, off)[0] != 6:  # not CONTRACT_DATA
        return _sdk(xdr.LedgerKey, buf, off)
    contract, p = _address(buf, off + 4)
    key, p = scval(buf, p)
    durability = _DURABILITY[_U32(buf, p)[0]]
    return xdr.LedgerKey(type=xdr.LedgerEntryType.CONTRACT_DATA, contract_data=xdr.LedgerKeyContractData(
        contract=contract, key=key, durability=durability)), p + 4


def _keys(buf: bytes, off: int) -> tuple[list[xdr.LedgerKey], int]:
    n = _U32(buf, off)[0]
    p = off + 4
    if n > len(buf):
        raise FastDecodeError("key count out of range")
    keys = []
    for _ in range(n):
        k, p = _ledger_key(buf, p)
        keys.append(k)
    return keys, p


def _operation(buf: bytes, off: int) -> tuple[xdr.Operation, int]:
    has_source = _U32(buf, off)[0]
    if has_source > 1:
        raise FastDecodeError("bad optional")
    p = off + 4
    source = None
    if has_source:
        source, p = _sdk(xdr.MuxedAccount, buf, p)
    if _U32(buf, p)[0] != xdr.OperationType.INVOKE_HOST_FUNCTION.value or _U32(buf, p + 4)[0] != 0:
        body, p = _sdk(xdr.OperationBody, buf, p)
        return xdr.Operation(source_account=source, body=body), p
    args, p = _args(buf, p + 8)
    hf = xdr.HostFunction(type=xdr.HostFunctionType.HOST_FUNCTION_TYPE_INVOKE_CONTRACT, invoke_contract=args)
    n = _U32(buf, p)[0]
    p += 4
    if n > len(buf):
        raise FastDecodeError("auth count out of range")
    auth = []
    for _ in range(n):
        e, p = _auth_entry(buf, p)
        auth.append(e)
    body = xdr.OperationBody(type=xdr.OperationType.INVOKE_HOST_FUNCTION,
                             invoke_host_function_op=xdr.InvokeHostFunctionOp(host_function=hf, auth=auth))
    return xdr.Operation(source_account=source, body=body), p


def decode_transaction(buf: bytes, off: int) -> tuple[xdr.Transaction, int]:
    """Decode a `Transaction` at `off`; returns it and the offset after it. Raises on anything odd."""
    source, p = _sdk(xdr.MuxedAccount, buf, off)
    fee = xdr.Uint32(_U32(buf, p)[0])
    seq = xdr.SequenceNumber(xdr.Int64(_I64(buf, p + 4)[0]))
    cond, p = _sdk(xdr.Preconditions, buf, p + 12)
    memo, p = _sdk(xdr.Memo, buf, p)
    n = _U32(buf, p)[0]
    p += 4
    if n > 100:
        raise FastDecodeError("too many operations")
    ops = []
    for _ in range(n):
        op, p = _operation(buf, p)
        ops.append(op)
    v = _U32(buf, p)[0]
    p += 4
    if v == 0:
        ext = xdr.TransactionExt(0)
    elif v == 1:
        sd_ext, p = _sdk(xdr.SorobanTransactionDataExt, buf, p)
        ro, p = _keys(buf, p)
        rw, p = _keys(buf, p)
        if p + 20 > len(buf):
            raise FastDecodeError("truncated resources")
        res = xdr.SorobanResources(
            footprint=xdr.LedgerFootprint(read_only=ro, read_write=rw), instructions=xdr.Uint32(_U32(buf, p)[0]),
            disk_read_bytes=xdr.Uint32(_U32(buf, p + 4)[0]), write_bytes=xdr.Uint32(_U32(buf, p + 8)[0]))
        sd = xdr.SorobanTransactionData(ext=sd_ext, resources=res, resource_fee=xdr.Int64(_I64(buf, p + 12)[0]))
        ext = xdr.TransactionExt(1, soroban_data=sd)
        p += 20
    else:
        raise FastDecodeError("bad transaction ext")
    if p > len(buf):
        raise FastDecodeError("truncated transaction")
    return xdr.Transaction(source_account=source, fee=fee, seq_num=seq, cond=cond, memo=memo, operations=ops,
                           ext=ext), p
