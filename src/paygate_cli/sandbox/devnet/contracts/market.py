"""Native model of a small market contract, the target of relayed user calls.

`buy(user, item: Symbol, price: i128) -> u64` needs `user`'s authorisation (so a relay must carry the
user's signed ADDRESS/ADDRESS_V2 entry), traps with Error(Contract, #1) when `price <= 0` or when
`item == "fail"` (failure on demand, for tests of failed relays), and emits
`["order", user] → Vec[item, price, order_id]`. It moves no tokens. `orders(user) -> u64` counts.
The item "limited" exists once: the first buy that applies gets it, any later one traps with
Error(Contract, #5) — a call that simulates fine and then fails on chain when two race for it
(the demo's "failed on chain, fee still burned" relay).
A user's latest order is open for ORDER_TTL_LEDGERS ledgers after the one it was bought in.

`close_expired(user: Address) -> u32` is permissionless (no authorisation at all: the gateway's bot
jobs call it from a lane): closes `user`'s open order once its ledger window has passed and returns
the ledger it expired at; emits `["order_closed", user] → u32`. Traps Error(Contract, #2) when the
user has no order, #3 when it is already closed, #4 while it is still open (the chain decides
"expired", not the caller's clock). Keyed by user, not by the global order id, so buys by different
users in one ledger touch disjoint entries (a key derived from the global id would differ between
simulation and apply and trap the second of two concurrent buys).

Storage: instance `Token` → Address; persistent `Symbol("OrderSeq")` → u64 (last order id);
persistent `Vec[Symbol("Orders"), Address]` → u64; persistent `Symbol("LimitedSold")` → u64;
persistent `Vec[Symbol("OrderExp"), Address]` → u64 (the last ledger the user's latest order is open
in; 0 once closed).
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
    sc_u32,
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
ERR_NO_ORDER = 2
ERR_CLOSED = 3
ERR_NOT_EXPIRED = 4
ERR_SOLD_OUT = 5
ORDER_TTL_LEDGERS = 20

WASM = fake_wasm("paygate-devnet:market:v1")
WASM_HASH = hashlib.sha256(WASM).digest()

_ORDERS = tagged_key_prefix("Orders") + b"\x00\x00\x00\x12"
_SEQ = enc_symbol(b"OrderSeq")
_LIMITED_SOLD = enc_symbol(b"LimitedSold")
_EXPIRY = tagged_key_prefix("OrderExp") + b"\x00\x00\x00\x12"  # SCV_ADDRESS of the user follows
SYM_ORDER = sc_sym("order")
SYM_CLOSED = sc_sym("order_closed")


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
        if item == b"limited":
            lk = head + _LIMITED_SOLD + DUR_PERSISTENT
            if ctx.get(lk) is not None:
                raise ContractTrap(ERR_SOLD_OUT, "item 'limited' is sold out")
            ctx.put(lk, "u64", 1)
        sk = head + _SEQ + DUR_PERSISTENT
        se = ctx.get(sk)
        order_id = (se.val if se is not None else 0) + 1
        ctx.put(sk, "u64", order_id)
        ok = head + _ORDERS + user + DUR_PERSISTENT
        oe = ctx.get(ok)
        ctx.put(ok, "u64", (oe.val if oe is not None else 0) + 1)
        ctx.put(head + _EXPIRY + user + DUR_PERSISTENT, "u64", ctx.ledger_seq + ORDER_TTL_LEDGERS)
        oid = sc_u64(order_id)
        ctx.emit([SYM_ORDER, args[0]], sc_vec([args[1], args[2], oid]))
        return oid
    if fn == b"close_expired":
        expect_args(args, 1, "close_expired")
        user = as_address(args[0])
        ek = head + _EXPIRY + user + DUR_PERSISTENT
        ee = ctx.get(ek)
        if ee is None:
            raise ContractTrap(ERR_NO_ORDER, "no order for this user")
        if ee.val == 0:
            raise ContractTrap(ERR_CLOSED, "the user's order is already closed")
        if ctx.ledger_seq <= ee.val:
            raise ContractTrap(ERR_NOT_EXPIRED, f"the user's order is open until ledger {ee.val}")
        ctx.put(ek, "u64", 0)
        ctx.emit([SYM_CLOSED, args[0]], sc_u32(ee.val))
        return sc_u32(ee.val)
    if fn == b"orders":
        expect_args(args, 1, "orders")
        oe = ctx.get(head + _ORDERS + as_address(args[0]) + DUR_PERSISTENT)
        return sc_u64(oe.val if oe is not None else 0)
    raise missing_function(fn)


def sign_buy(*, user_secret: str, market: str, item: str, price: int, passphrase: str,
             expiration_ledger: int) -> tuple[str, str]:
    """A user's wallet authorising market.buy(user, item, price) (the demo and bench play the user):
    -> (args as a base64 SCVal vector, the signed auth entry as base64), what admit_relay takes."""
    from stellar_sdk import Keypair
    from stellar_sdk.auth import authorize_invocation

    user = Keypair.from_secret(user_secret)
    args = [scval.to_address(user.public_key), scval.to_symbol(item), scval.to_int128(price)]
    invocation = xdr.SorobanAuthorizedInvocation(
        function=xdr.SorobanAuthorizedFunction(
            type=xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN,
            contract_fn=xdr.InvokeContractArgs(contract_address=scval.to_address(market).address,
                                               function_name=xdr.SCSymbol(b"buy"), args=args)),
        sub_invocations=[])
    entry = authorize_invocation(user, None, expiration_ledger, invocation, passphrase)
    return scval.to_vec(args).to_xdr(), entry.to_xdr()
