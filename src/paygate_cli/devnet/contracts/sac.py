"""Native model of the Stellar Asset Contract (SAC) for one credit asset (USDC).

Balances live where the real SAC keeps them: a G-account's balance is its classic TRUSTLINE entry,
a C-address's balance is the SAC's persistent contract data `Vec[Symbol("Balance"), Address]` →
`Map{amount: i128, authorized: bool, clawback: bool}` (what `SorobanServer.get_sac_balance` reads).
The issuer is the unlimited source/sink: it has no trustline, transfers from it mint and to it burn.
Events follow CAP-67: `["transfer", from, to, "CODE:ISSUER"] → i128`, `["mint", to, "CODE:ISSUER"] → i128`.
Error codes are the SAC's `ContractError` numbers.
"""

from __future__ import annotations

from typing import Any

from stellar_sdk import StrKey, scval, xdr

from ..storage import (
    ADDR_ACCOUNT,
    DUR_PERSISTENT,
    INSTANCE_CODECS,
    SC_VOID,
    T_CONTRACT_DATA,
    sc_i128,
    sc_map,
    sc_sym,
    sc_u32,
    tagged_key_prefix,
    trustline_asset,
    trustline_key,
)
from .base import ContractTrap, Ctx, as_address, as_i128, expect_args, missing_function

KIND = "sac"
BASE_INSTRUCTIONS = 400_000
DECIMALS = 7
INT64_MAX = 2**63 - 1

ERR_NEGATIVE_AMOUNT = 8
ERR_BALANCE = 10
ERR_OVERFLOW = 12
ERR_TRUSTLINE_MISSING = 13

_BAL_PREFIX = tagged_key_prefix("Balance") + b"\x00\x00\x00\x12"
SYM_TRANSFER = sc_sym("transfer")
SYM_MINT = sc_sym("mint")


def make_instance(code: str, issuer: str) -> dict[str, Any]:
    ed = StrKey.decode_ed25519_public_key(issuer)
    name = f"{code}:{issuer}"
    return {
        "contract_kind": KIND,
        "code": code,
        "issuer": ed,
        "asset": trustline_asset(code, ed),
        "name": name,
        "name_scval": scval.to_string(name),
    }


def _to_json(val: dict[str, Any]) -> dict[str, Any]:
    return {"contract_kind": KIND, "code": val["code"], "issuer": StrKey.encode_ed25519_public_key(val["issuer"])}


def _from_json(d: dict[str, Any]) -> dict[str, Any]:
    return make_instance(d["code"], d["issuer"])


def _to_xdr(val: dict[str, Any]) -> xdr.SCContractInstance:
    issuer = StrKey.encode_ed25519_public_key(val["issuer"])
    code = val["code"]
    # Vec keys are unhashable in the SDK, so build the map from pairs (sorted like the host sorts).
    storage = sc_map(
        [
            (
                scval.to_symbol("METADATA"),
                scval.to_map(
                    {
                        scval.to_symbol("decimal"): scval.to_uint32(DECIMALS),
                        scval.to_symbol("name"): scval.to_string(val["name"]),
                        scval.to_symbol("symbol"): scval.to_string(code),
                    }
                ),
            ),
            (scval.to_vec([scval.to_symbol("Admin")]), scval.to_address(issuer)),
            (
                scval.to_vec([scval.to_symbol("AssetInfo")]),
                scval.to_vec(
                    [
                        scval.to_symbol("AlphaNum4" if len(code) <= 4 else "AlphaNum12"),
                        scval.to_map(
                            {
                                scval.to_symbol("asset_code"): scval.to_string(code),
                                scval.to_symbol("issuer"): scval.to_bytes(val["issuer"]),
                            }
                        ),
                    ]
                ),
            ),
        ]
    )
    return xdr.SCContractInstance(
        executable=xdr.ContractExecutable(xdr.ContractExecutableType.CONTRACT_EXECUTABLE_STELLAR_ASSET),
        storage=storage.map,
    )


INSTANCE_CODECS[KIND] = (_to_xdr, _to_json, _from_json)


def balance_key(contract: bytes, inst: dict[str, Any], holder: bytes) -> tuple[bytes, str] | None:
    """Where `holder`'s balance lives: (ledger key, entry kind); None for the issuer."""
    if holder[:8] == ADDR_ACCOUNT:
        ed = holder[8:]
        if ed == inst["issuer"]:
            return None
        return trustline_key(ed, inst["asset"]), "trustline"
    return T_CONTRACT_DATA + contract + _BAL_PREFIX + holder + DUR_PERSISTENT, "sac_balance"


def _spend(ctx: Ctx, inst: dict[str, Any], holder: bytes, amount: int) -> None:
    where = balance_key(ctx.contract, inst, holder)
    if where is None:
        return  # the issuer mints
    key, kind = where
    e = ctx.get(key)
    if e is None and kind == "trustline":
        raise ContractTrap(ERR_TRUSTLINE_MISSING, "trustline entry is missing for account")
    bal = e.val if e is not None else 0
    if bal < amount:
        raise ContractTrap(ERR_BALANCE, f"resulting balance is not within the allowed range: {bal} < {amount}")
    ctx.put(key, kind, bal - amount)


def _receive(ctx: Ctx, inst: dict[str, Any], holder: bytes, amount: int) -> None:
    where = balance_key(ctx.contract, inst, holder)
    if where is None:
        return  # the issuer burns
    key, kind = where
    e = ctx.get(key)
    if e is None and kind == "trustline":
        raise ContractTrap(ERR_TRUSTLINE_MISSING, "trustline entry is missing for account")
    bal = (e.val if e is not None else 0) + amount
    if kind == "trustline" and bal > INT64_MAX:
        raise ContractTrap(ERR_OVERFLOW, "trustline balance would exceed its limit")
    ctx.put(key, kind, bal)


def read_balance(ctx: Ctx, inst: dict[str, Any], holder: bytes) -> int:
    where = balance_key(ctx.contract, inst, holder)
    if where is None:
        return INT64_MAX
    e = ctx.get(where[0])
    return e.val if e is not None else 0


def call(ctx: Ctx, fn: bytes, args: list[xdr.SCVal]) -> xdr.SCVal:
    inst = ctx.instance.val
    ctx.instructions += BASE_INSTRUCTIONS
    if fn == b"transfer":
        expect_args(args, 3, "transfer")
        frm, to, amount = as_address(args[0]), as_address(args[1]), as_i128(args[2])
        if amount < 0:
            raise ContractTrap(ERR_NEGATIVE_AMOUNT, f"negative amount is not allowed: {amount}")
        ctx.require_auth(frm)
        _spend(ctx, inst, frm, amount)
        _receive(ctx, inst, to, amount)
        ctx.emit([SYM_TRANSFER, args[0], args[1], inst["name_scval"]], args[2])
        return SC_VOID
    if fn == b"balance":
        expect_args(args, 1, "balance")
        return sc_i128(read_balance(ctx, inst, as_address(args[0])))
    if fn == b"mint":
        expect_args(args, 2, "mint")
        to, amount = as_address(args[0]), as_i128(args[1])
        if amount < 0:
            raise ContractTrap(ERR_NEGATIVE_AMOUNT, f"negative amount is not allowed: {amount}")
        ctx.require_auth(ADDR_ACCOUNT + inst["issuer"])  # the admin is the issuer
        _receive(ctx, inst, to, amount)
        ctx.emit([SYM_MINT, args[0], inst["name_scval"]], args[1])
        return SC_VOID
    if fn == b"decimals":
        expect_args(args, 0, "decimals")
        return sc_u32(DECIMALS)
    if fn == b"name":
        expect_args(args, 0, "name")
        return inst["name_scval"]
    if fn == b"symbol":
        expect_args(args, 0, "symbol")
        return scval.to_string(inst["code"])
    raise missing_function(fn)
