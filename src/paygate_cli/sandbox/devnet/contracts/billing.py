"""Native model of paygate's prepaid billing contract (docs/architecture.md §4).

Storage (what a soroban-sdk contract would write):
- instance: `Admin` → Address, `Operators` → Vec<Address>, `Token` → Address;
- persistent `Vec[Symbol("Balance"), Address]` → i128 (internal balance);
- persistent `Vec[Symbol("Charged"), BytesN<32>]` → true (charge id consumed, settled or failed);
- persistent `Vec[Symbol("Credited"), BytesN<32>]` → true (deposit credited).

`charge_batch` never traps per entry: failures are recorded as `charge_failed` events (a trapped
transaction would emit no events at all), consumed ids are skipped so a resubmitted batch never
double-debits.
"""

from __future__ import annotations

import hashlib
from typing import Any

from stellar_sdk import scval, xdr

from ..storage import (
    DUR_PERSISTENT,
    INSTANCE_CODECS,
    SC_FALSE,
    SC_TRUE,
    SC_VOID,
    T_CONTRACT_DATA,
    sc_i128,
    sc_sym,
    sc_u32,
    sc_vec,
    tagged_key_prefix,
)
from .base import (
    ContractTrap,
    Ctx,
    addr_bytes,
    addr_str,
    as_address,
    as_bytesn,
    as_i128,
    as_vec,
    expect_args,
    fake_wasm,
    missing_function,
)

KIND = "billing"
MAX_BATCH = 100
BASE_INSTRUCTIONS = 1_500_000
PER_ENTRY_INSTRUCTIONS = 150_000  # path-independent, so simulation and apply agree

ERR_NOT_AUTHORIZED = 1  # caller is not an allow-listed operator / not the admin
ERR_ALREADY_CREDITED = 2
ERR_INVALID_AMOUNT = 3
ERR_BATCH_TOO_LARGE = 4
ERR_LENGTH_MISMATCH = 5

# A minimal valid wasm module (magic, version, one custom section naming the model), so the
# contract has real CONTRACT_CODE bytes and a wasm-hash executable like a deployed contract.
WASM = fake_wasm("paygate-devnet:billing:v1")
WASM_HASH = hashlib.sha256(WASM).digest()

_BAL = tagged_key_prefix("Balance") + b"\x00\x00\x00\x12"
_CHARGED = tagged_key_prefix("Charged") + b"\x00\x00\x00\x0d\x00\x00\x00\x20"
_CREDITED = tagged_key_prefix("Credited") + b"\x00\x00\x00\x0d\x00\x00\x00\x20"

SYM_CHARGE = sc_sym("charge")
SYM_CHARGE_FAILED = sc_sym("charge_failed")
SYM_CREDIT = sc_sym("credit")
SYM_INSUFFICIENT = sc_sym("insufficient_balance")
SYM_INVALID = sc_sym("invalid_amount")


def make_instance(admin: bytes, token: bytes, operators: list[bytes]) -> dict[str, Any]:
    return {
        "contract_kind": KIND,
        "wasm_hash": WASM_HASH,
        "admin": admin,
        "token": token,
        "operators": tuple(dict.fromkeys(operators)),
    }


def _to_json(val: dict[str, Any]) -> dict[str, Any]:
    return {
        "contract_kind": KIND,
        "admin": addr_str(val["admin"]),
        "token": addr_str(val["token"]),
        "operators": [addr_str(o) for o in val["operators"]],
    }


def _from_json(d: dict[str, Any]) -> dict[str, Any]:
    return make_instance(addr_bytes(d["admin"]), addr_bytes(d["token"]), [addr_bytes(o) for o in d["operators"]])


def _to_xdr(val: dict[str, Any]) -> xdr.SCContractInstance:
    storage = scval.to_map(
        {
            scval.to_symbol("Admin"): scval.to_address(addr_str(val["admin"])),
            scval.to_symbol("Operators"): scval.to_vec([scval.to_address(addr_str(o)) for o in val["operators"]]),
            scval.to_symbol("Token"): scval.to_address(addr_str(val["token"])),
        }
    )
    return xdr.SCContractInstance(
        executable=xdr.ContractExecutable(
            xdr.ContractExecutableType.CONTRACT_EXECUTABLE_WASM, wasm_hash=xdr.Hash(val["wasm_hash"])
        ),
        storage=storage.map,
    )


INSTANCE_CODECS[KIND] = (_to_xdr, _to_json, _from_json)


def _require_operator(ctx: Ctx, op: bytes) -> None:
    ctx.require_auth(op)
    if op not in ctx.instance.val["operators"]:
        raise ContractTrap(ERR_NOT_AUTHORIZED, "caller is not an allow-listed operator")


def _charge_batch(ctx: Ctx, args: list[xdr.SCVal]) -> xdr.SCVal:
    expect_args(args, 4, "charge_batch")
    op = as_address(args[0])
    accounts, amounts, ids = as_vec(args[1]), as_vec(args[2]), as_vec(args[3])
    _require_operator(ctx, op)
    n = len(accounts)
    if n > MAX_BATCH:
        raise ContractTrap(ERR_BATCH_TOO_LARGE, f"batch of {n} exceeds {MAX_BATCH} entries")
    if len(amounts) != n or len(ids) != n:
        raise ContractTrap(ERR_LENGTH_MISMATCH, "accounts, amounts and charge_ids differ in length")
    addrs = [as_address(v) for v in accounts]
    amts = [as_i128(v) for v in amounts]
    cids = [as_bytesn(v, 32) for v in ids]
    ctx.instructions += PER_ENTRY_INSTRUCTIONS * n
    head = T_CONTRACT_DATA + ctx.contract
    bal_pre, chg_pre = head + _BAL, head + _CHARGED
    get, put, emit = ctx.staging.get, ctx.staging.put, ctx.emit
    settled = failed = skipped = 0
    for i in range(n):
        ck = chg_pre + cids[i] + DUR_PERSISTENT
        if get(ck) is not None:
            skipped += 1  # consumed earlier (or earlier in this batch): never debit twice
            continue
        amt = amts[i]
        if amt <= 0:
            reason = SYM_INVALID
        else:
            bk = bal_pre + addrs[i] + DUR_PERSISTENT
            be = get(bk)
            bal = be.val if be is not None else 0
            if bal >= amt:
                put(bk, "i128", bal - amt)
                put(ck, "bool", True)
                emit([SYM_CHARGE, accounts[i]], sc_vec([amounts[i], ids[i]]))
                settled += 1
                continue
            reason = SYM_INSUFFICIENT
        put(ck, "bool", True)
        emit([SYM_CHARGE_FAILED, accounts[i]], sc_vec([amounts[i], ids[i], reason]))
        failed += 1
    return sc_vec([sc_u32(settled), sc_u32(failed), sc_u32(skipped)])


def _credit(ctx: Ctx, args: list[xdr.SCVal]) -> xdr.SCVal:
    expect_args(args, 4, "credit")
    op, account, amount, dtx = as_address(args[0]), as_address(args[1]), as_i128(args[2]), as_bytesn(args[3], 32)
    _require_operator(ctx, op)
    if amount <= 0:
        raise ContractTrap(ERR_INVALID_AMOUNT, f"credit amount must be positive: {amount}")
    head = T_CONTRACT_DATA + ctx.contract
    ck = head + _CREDITED + dtx + DUR_PERSISTENT
    if ctx.get(ck) is not None:
        raise ContractTrap(ERR_ALREADY_CREDITED, "deposit already credited")
    bk = head + _BAL + account + DUR_PERSISTENT
    be = ctx.get(bk)
    ctx.put(bk, "i128", (be.val if be is not None else 0) + amount)
    ctx.put(ck, "bool", True)
    ctx.emit([SYM_CREDIT, args[1]], sc_vec([args[2], args[3]]))
    ctx.instructions += PER_ENTRY_INSTRUCTIONS
    return SC_VOID


def _set_operator(ctx: Ctx, args: list[xdr.SCVal], add: bool) -> xdr.SCVal:
    expect_args(args, 2, "add_operator" if add else "remove_operator")
    admin, op = as_address(args[0]), as_address(args[1])
    ctx.require_auth(admin)
    val = ctx.instance.val
    if admin != val["admin"]:
        raise ContractTrap(ERR_NOT_AUTHORIZED, "caller is not the admin")
    ops = val["operators"]
    new = ((*ops, op) if op not in ops else ops) if add else tuple(o for o in ops if o != op)
    if new != ops:
        ctx.set_instance({**val, "operators": new})
    return SC_VOID


def call(ctx: Ctx, fn: bytes, args: list[xdr.SCVal]) -> xdr.SCVal:
    ctx.instructions += BASE_INSTRUCTIONS
    if fn == b"charge_batch":
        return _charge_batch(ctx, args)
    if fn == b"credit":
        return _credit(ctx, args)
    head = T_CONTRACT_DATA + ctx.contract
    if fn == b"balance":
        expect_args(args, 1, "balance")
        e = ctx.get(head + _BAL + as_address(args[0]) + DUR_PERSISTENT)
        return sc_i128(e.val if e is not None else 0)
    if fn == b"is_charged":
        expect_args(args, 1, "is_charged")
        hit = ctx.get(head + _CHARGED + as_bytesn(args[0], 32) + DUR_PERSISTENT)
        return SC_TRUE if hit is not None else SC_FALSE
    if fn == b"is_credited":
        expect_args(args, 1, "is_credited")
        hit = ctx.get(head + _CREDITED + as_bytesn(args[0], 32) + DUR_PERSISTENT)
        return SC_TRUE if hit is not None else SC_FALSE
    if fn == b"add_operator":
        return _set_operator(ctx, args, True)
    if fn == b"remove_operator":
        return _set_operator(ctx, args, False)
    raise missing_function(fn)
