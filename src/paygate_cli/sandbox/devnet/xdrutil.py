"""Small XDR helpers shared by the devnet's RPC layer (strkeys, results, ids)."""

from __future__ import annotations

import functools
import hashlib

from stellar_sdk import Keypair, StrKey, xdr

TX_RESULT_EXT = xdr.TransactionResultExt(0)


def network_id(passphrase: str) -> bytes:
    return hashlib.sha256(passphrase.encode()).digest()


def muxed_to_g(m: xdr.MuxedAccount) -> str:
    """The G address behind a (possibly muxed) account: sequence numbers and signers live there."""
    if m.ed25519 is not None:
        return StrKey.encode_ed25519_public_key(m.ed25519.uint256)
    assert m.med25519 is not None
    return StrKey.encode_ed25519_public_key(m.med25519.ed25519.uint256)


def account_id_to_g(a: xdr.AccountID) -> str:
    return StrKey.encode_ed25519_public_key(a.account_id.ed25519.uint256)


@functools.lru_cache(maxsize=4096)
def g_to_account_id(g: str) -> xdr.AccountID:
    """Cached: strkey decoding (base32 + CRC in pure Python) is hot in ledger closing.
    Callers must not mutate the returned object."""
    return Keypair.from_public_key(g).xdr_account_id()


def toid(ledger: int, tx_index: int, op_index: int) -> int:
    """SEP-35 TOID: ledger in the high 32 bits, 20 bits of transaction order, 12 bits of operation."""
    return (ledger << 32) | ((tx_index & 0xFFFFF) << 12) | (op_index & 0xFFF)


def event_id(ledger: int, tx_index: int, op_index: int, event_index: int) -> str:
    return f"{toid(ledger, tx_index, op_index):019d}-{event_index:010d}"


def parse_event_id(s: str) -> tuple[int, int, int, int]:
    """(ledger, tx_index, op_index, event_index) from an id/cursor; ValueError when malformed."""
    head, sep, tail = s.partition("-")
    if not sep or not head.isdigit() or not tail.isdigit():
        raise ValueError(f"invalid cursor {s!r}")
    t, ev = int(head), int(tail)
    if t >= 1 << 63 or ev >= 1 << 32:
        raise ValueError(f"invalid cursor {s!r}")
    return t >> 32, (t >> 12) & 0xFFFFF, t & 0xFFF, ev


def tx_result(fee_charged: int, code: xdr.TransactionResultCode,
              op_results: list[xdr.OperationResult] | None = None) -> xdr.TransactionResult:
    needs_results = code in (xdr.TransactionResultCode.txSUCCESS, xdr.TransactionResultCode.txFAILED)
    return xdr.TransactionResult(
        fee_charged=xdr.Int64(fee_charged),
        result=xdr.TransactionResultResult(code=code, results=(op_results or []) if needs_results else None),
        ext=TX_RESULT_EXT,
    )


def fee_bump_result(fee_charged: int, inner_hash: bytes, inner_code: xdr.TransactionResultCode,
                    op_results: list[xdr.OperationResult] | None = None) -> xdr.TransactionResult:
    """A fee-bump result: txFEE_BUMP_INNER_SUCCESS/FAILED wrapping the inner pair (CAP-15)."""
    ok = inner_code == xdr.TransactionResultCode.txSUCCESS
    needs_results = ok or inner_code == xdr.TransactionResultCode.txFAILED
    inner = xdr.InnerTransactionResult(
        fee_charged=xdr.Int64(fee_charged),
        result=xdr.InnerTransactionResultResult(
            code=inner_code, results=(op_results or []) if needs_results else None
        ),
        ext=xdr.InnerTransactionResultExt(0),
    )
    return xdr.TransactionResult(
        fee_charged=xdr.Int64(fee_charged),
        result=xdr.TransactionResultResult(
            code=xdr.TransactionResultCode.txFEE_BUMP_INNER_SUCCESS
            if ok
            else xdr.TransactionResultCode.txFEE_BUMP_INNER_FAILED,
            inner_result_pair=xdr.InnerTransactionResultPair(
                transaction_hash=xdr.Hash(inner_hash), result=inner
            ),
        ),
        ext=TX_RESULT_EXT,
    )


def invoke_result(code: xdr.InvokeHostFunctionResultCode, success_hash: bytes | None = None
                  ) -> xdr.OperationResult:
    return xdr.OperationResult(
        code=xdr.OperationResultCode.opINNER,
        tr=xdr.OperationResultTr(
            type=xdr.OperationType.INVOKE_HOST_FUNCTION,
            invoke_host_function_result=xdr.InvokeHostFunctionResult(
                code=code, success=xdr.Hash(success_hash) if success_hash is not None else None
            ),
        ),
    )
