"""Native model of a small market contract, the target of relayed user calls.

`buy(user, item: Symbol, price: i128) -> u64` needs `user`'s authorisation (so a relay must carry the
user's signed ADDRESS/ADDRESS_V2 entry), traps with Error(Contract, #1) when `price <= 0` or when
`item == "fail"` (failure on demand, for tests of failed relays), and emits
`["order", user] → Vec[item, price, order_id]`. It moves no tokens. `orders(user) -> u64` counts.

Storage: instance `Token` → Address; persistent `Symbol("OrderSeq")` → u64 (last order id);
persistent `Vec[Symbol("Orders"), Address]` → u64.
"""

from __future__ import annotations

import hashlib
from typing import Any

from stellar_sdk import scval, xdr

from ..storage import (
    DUR_PERSISTENT,
    INSTANCE_CODECS,
    T_CONTRACT_DATA,
    enc_symbol,
    sc_sym,
    sc_u64,
    sc_vec,
    tagged_key_prefix,
)
from .base import (
    ContractTrap,
    Ctx,
    addr_bytes,
    addr_str,
    as_address,
    as_i128,
    as_symbol,
    expect_args,
    fake_wasm,
    missing_function,
)

KIND = "market"
BASE_INSTRUCTIONS = 1_000_000
ERR_BAD_ORDER = 1

WASM = fake_wasm("paygate-devnet:market:v1")
WASM_HASH = hashlib.sha256(WASM).digest()

_ORDERS = tagged_key_prefix("Orders") + b"\x00\x00\x00\x12"
_SEQ = enc_symbol(b"OrderSeq")
SYM_ORDER = sc_sym("order")


def make_instance(token: bytes) -> dict[str, Any]:
    return {"contract_kind": KIND, "wasm_hash": WASM_HASH, "token": token}


def _to_json(val: dict[str, Any]) -> dict[str, Any]:
    return {"contract_kind": KIND, "token": addr_str(val["token"])}


def _from_json(d: dict[str, Any]) -> dict[str, Any]:
    return make_instance(addr_bytes(d["token"]))


def _to_xdr(val: dict[str, Any]) -> xdr.SCContractInstance:
    storage = scval.to_map({scval.to_symbol("Token"): scval.to_address(addr_str(val["token"]))})
    return xdr.SCContractInstance(
        executable=xdr.ContractExecutable(
            xdr.ContractExecutableType.CONTRACT_EXECUTABLE_WASM, wasm_hash=xdr.Hash(val["wasm_hash"])
        ),
        storage=storage.map,
    )


INSTANCE_CODECS[KIND] = (_to_xdr, _to_json, _from_json)


def call(ctx: Ctx, fn: bytes, args: list[xdr.SCVal]) -> xdr.SCVal:
    ctx.instructions += BASE_INSTRUCTIONS
    head = T_CONTRACT_DATA + ctx.contract
    if fn == b"buy":
        expect_args(args, 3, "buy")
        user, item, price = as_address(args[0]), as_symbol(args[1]), as_i128(args[2])
        ctx.require_auth(user)
        if price <= 0:
            raise ContractTrap(ERR_BAD_ORDER, f"price must be positive: {price}")
        if item == b"fail":
            raise ContractTrap(ERR_BAD_ORDER, "order failed on demand (item 'fail')")
        sk = head + _SEQ + DUR_PERSISTENT
        se = ctx.get(sk)
        order_id = (se.val if se is not None else 0) + 1
        ctx.put(sk, "u64", order_id)
        ok = head + _ORDERS + user + DUR_PERSISTENT
        oe = ctx.get(ok)
        ctx.put(ok, "u64", (oe.val if oe is not None else 0) + 1)
        oid = sc_u64(order_id)
        ctx.emit([SYM_ORDER, args[0]], sc_vec([args[1], args[2], oid]))
        return oid
    if fn == b"orders":
        expect_args(args, 1, "orders")
        oe = ctx.get(head + _ORDERS + as_address(args[0]) + DUR_PERSISTENT)
        return sc_u64(oe.val if oe is not None else 0)
    raise missing_function(fn)
