"""Native model of the Stellar Asset Contract (SAC) for one credit asset (USDC).

Balances live where the real SAC keeps them: a G-account's balance is its classic TRUSTLINE entry,
a C-address's balance is the SAC's persistent contract data `Vec[Symbol("Balance"), Address]` →
`Map{amount: i128, authorized: bool, clawback: bool}` (what `SorobanServer.get_sac_balance` reads).
The issuer is the unlimited source/sink: it has no trustline, transfers from it mint and to it burn.

The whole SAC interface of soroban-env-host (builtin_contracts/stellar_asset_contract/contract.rs,
allowance.rs, balance.rs, event.rs), in its order of checks: `allowance`, `approve`, `balance`,
`authorized`, `transfer`, `transfer_from`, `burn`, `burn_from`, `clawback`, `set_authorized`, `mint`,
`set_admin`, `admin`, `decimals`, `name`, `symbol`, `trust`. Allowances live where the SAC keeps them:
TEMPORARY `Vec[Symbol("Allowance"), Map{from, spender}]` → `Map{amount, live_until_ledger}`, live until
`live_until_ledger`. Events follow CAP-67 (event.rs): `["transfer", from, to, name]`, a transfer from
the issuer is a `["mint", to, name]`, one to the issuer a `["burn", from, name]`; `["approve", from,
spender, name] → [amount, live_until_ledger]`, `["clawback", from, name]`, `["set_authorized", id,
name] → bool`, `["set_admin", admin, name] → new_admin`. Error codes are the SAC's `ContractError`
numbers. The devnet's issuer has no account flags (no AUTH_REQUIRED, AUTH_REVOCABLE or
AUTH_CLAWBACK_ENABLED), so every balance is authorized, deauthorizing is refused (#2) and nothing is
clawbackable (#10), exactly what a real SAC answers for such an issuer.
"""

from __future__ import annotations

from typing import Any

from stellar_sdk import StrKey, scval, xdr

from ..storage import (
    ADDR_ACCOUNT,
    DUR_PERSISTENT,
    DUR_TEMPORARY,
    INSTANCE_CODECS,
    SC_FALSE,
    SC_TRUE,
    SC_VOID,
    T_CONTRACT_DATA,
    enc_scval,
    sc_address,
    sc_i128,
    sc_map,
    sc_sym,
    sc_u32,
    sc_vec,
    tagged_key_prefix,
    trustline_asset,
    trustline_key,
)
from .base import (
    ContractTrap,
    Ctx,
    addr_bytes,
    addr_str,
    as_address,
    as_bool,
    as_i128,
    as_u32,
    expect_args,
    missing_function,
)

KIND = "sac"
BASE_INSTRUCTIONS = 400_000
# storage_types.rs: the SAC keeps its instance and contract-address balances alive as they are used.
DAY_IN_LEDGERS = 17_280
INSTANCE_EXTEND_AMOUNT = 7 * DAY_IN_LEDGERS
INSTANCE_TTL_THRESHOLD = INSTANCE_EXTEND_AMOUNT - DAY_IN_LEDGERS
BALANCE_EXTEND_AMOUNT = 30 * DAY_IN_LEDGERS
BALANCE_TTL_THRESHOLD = BALANCE_EXTEND_AMOUNT - DAY_IN_LEDGERS
# contract.rs: every function but these extends the instance (extend_current_contract_instance_and_code_ttl).
_NO_INSTANCE_EXTEND = frozenset({b"admin", b"decimals", b"name", b"symbol"})
DECIMALS = 7
INT64_MAX = 2**63 - 1

ERR_OPERATION_NOT_SUPPORTED = 2
ERR_ACCOUNT_MISSING = 6
ERR_NEGATIVE_AMOUNT = 8
ERR_ALLOWANCE = 9
ERR_BALANCE = 10
ERR_OVERFLOW = 12
ERR_TRUSTLINE_MISSING = 13

_BAL_PREFIX = tagged_key_prefix("Balance") + b"\x00\x00\x00\x12"
SYM_TRANSFER = sc_sym("transfer")
SYM_MINT = sc_sym("mint")
SYM_BURN = sc_sym("burn")
SYM_APPROVE = sc_sym("approve")
SYM_CLAWBACK = sc_sym("clawback")
SYM_SET_AUTHORIZED = sc_sym("set_authorized")
SYM_SET_ADMIN = sc_sym("set_admin")


def make_instance(code: str, issuer: str, admin: str | None = None) -> dict[str, Any]:
    ed = StrKey.decode_ed25519_public_key(issuer)
    name = f"{code}:{issuer}"
    return {
        "contract_kind": KIND,
        "code": code,
        "issuer": ed,
        "asset": trustline_asset(code, ed),
        "name": name,
        "name_scval": scval.to_string(name),
        # init_asset writes the issuer as the administrator; set_admin replaces it.
        "admin": addr_bytes(admin) if admin else ADDR_ACCOUNT + ed,
    }


def _to_json(val: dict[str, Any]) -> dict[str, Any]:
    return {"contract_kind": KIND, "code": val["code"], "issuer": StrKey.encode_ed25519_public_key(val["issuer"]),
            "admin": addr_str(val["admin"])}


def _from_json(d: dict[str, Any]) -> dict[str, Any]:
    return make_instance(d["code"], d["issuer"], d.get("admin"))


def _to_xdr(val: dict[str, Any]) -> xdr.SCContractInstance:
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
            (scval.to_vec([scval.to_symbol("Admin")]), sc_address(val["admin"])),
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


def _write_balance(ctx: Ctx, key: bytes, kind: str, value: int) -> None:
    """balance.rs: a contract address's balance is extended to 30 days on every write when under 29;
    an account's is its trustline (classic, no TTL)."""
    ctx.put(key, kind, value)
    if kind == "sac_balance":
        ctx.staging.extend_ttl(key, BALANCE_TTL_THRESHOLD, BALANCE_EXTEND_AMOUNT)


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
    _write_balance(ctx, key, kind, bal - amount)


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
    _write_balance(ctx, key, kind, bal)


def read_balance(ctx: Ctx, inst: dict[str, Any], holder: bytes) -> int:
    """balance.rs read_balance: reading an existing contract-address balance extends it like a write."""
    where = balance_key(ctx.contract, inst, holder)
    if where is None:
        return INT64_MAX
    e = ctx.get(where[0])
    if e is not None and where[1] == "sac_balance":
        ctx.staging.extend_ttl(where[0], BALANCE_TTL_THRESHOLD, BALANCE_EXTEND_AMOUNT)
    return e.val if e is not None else 0


def _is_issuer(inst: dict[str, Any], addr: bytes) -> bool:
    return addr[:8] == ADDR_ACCOUNT and addr[8:] == inst["issuer"]


def _nonneg(amount: int) -> None:
    if amount < 0:
        raise ContractTrap(ERR_NEGATIVE_AMOUNT, f"negative amount is not allowed: {amount}")


def _not_issuer(inst: dict[str, Any], addr: bytes) -> None:
    if _is_issuer(inst, addr):
        raise ContractTrap(ERR_OPERATION_NOT_SUPPORTED, "operation invalid on issuer")


def _require_trustline(ctx: Ctx, inst: dict[str, Any], addr: bytes) -> None:
    """Account holders need the trustline (balance.rs); the issuer and C-addresses do not."""
    where = balance_key(ctx.contract, inst, addr)
    if where is not None and where[1] == "trustline" and ctx.get(where[0]) is None:
        raise ContractTrap(ERR_TRUSTLINE_MISSING, "trustline entry is missing for account")


def allowance_key(contract: bytes, frm: bytes, spender: bytes) -> bytes:
    """TEMPORARY `Vec[Symbol("Allowance"), Map{from, spender}]` of the SAC (storage_types.rs)."""
    key = sc_vec([sc_sym("Allowance"), sc_map([(sc_sym("from"), sc_address(frm)),
                                               (sc_sym("spender"), sc_address(spender))])])
    return T_CONTRACT_DATA + contract + enc_scval(key) + DUR_TEMPORARY


def read_allowance(ctx: Ctx, frm: bytes, spender: bytes) -> int:
    e = ctx.get(allowance_key(ctx.contract, frm, spender))
    if e is None or e.val[1] < ctx.ledger_seq:
        return 0
    return int(e.val[0])


def _write_allowance(ctx: Ctx, frm: bytes, spender: bytes, amount: int, live_until: int) -> None:
    """allowance.rs write_allowance: bounds on live_until, no entry for a zero first approval, the TTL
    only ever extended (to live_until) by a positive approval."""
    if live_until > ctx.ledger_seq + ctx.staging.ttl.max_entry - 1:
        raise ContractTrap(ERR_ALLOWANCE, "live_until is greater than max")
    if amount > 0 and live_until < ctx.ledger_seq:
        raise ContractTrap(ERR_ALLOWANCE, "live_until must be >= ledger sequence")
    key = allowance_key(ctx.contract, frm, spender)
    old = ctx.get(key)
    if old is None and amount == 0:
        return
    ttl = old.live_until if old is not None else None
    if amount > 0 and (old is None or old.val[1] < live_until):
        ttl = live_until
    ctx.put(key, "sac_allowance", (amount, live_until), ttl)


def _spend_allowance(ctx: Ctx, frm: bytes, spender: bytes, amount: int) -> None:
    allowance = read_allowance(ctx, frm, spender)
    if allowance < amount:
        raise ContractTrap(ERR_ALLOWANCE, f"not enough allowance to spend: {allowance} < {amount}")
    if amount > 0:
        e = ctx.get(allowance_key(ctx.contract, frm, spender))
        assert e is not None
        _write_allowance(ctx, frm, spender, allowance - amount, e.val[1])


def _transfer_event(ctx: Ctx, inst: dict[str, Any], frm: xdr.SCVal, to: xdr.SCVal, amount: xdr.SCVal) -> None:
    """event.rs transfer_maybe_with_issuer: from the issuer it is a mint, to the issuer a burn."""
    f, t = as_address(frm), as_address(to)
    if f != t and _is_issuer(inst, f):
        ctx.emit([SYM_MINT, to, inst["name_scval"]], amount)
    elif f != t and _is_issuer(inst, t):
        ctx.emit([SYM_BURN, frm, inst["name_scval"]], amount)
    else:
        ctx.emit([SYM_TRANSFER, frm, to, inst["name_scval"]], amount)


def call(ctx: Ctx, fn: bytes, args: list[xdr.SCVal]) -> xdr.SCVal:
    inst = ctx.instance.val
    ctx.instructions += BASE_INSTRUCTIONS
    name = inst["name_scval"]
    if fn not in _NO_INSTANCE_EXTEND:
        # Before the function's checks; a trap rolls the extension back with everything else.
        ctx.staging.extend_ttl(ctx.instance_key, INSTANCE_TTL_THRESHOLD, INSTANCE_EXTEND_AMOUNT)
    if fn == b"transfer":
        expect_args(args, 3, "transfer")
        frm, to, amount = as_address(args[0]), as_address(args[1]), as_i128(args[2])
        _nonneg(amount)
        ctx.require_auth(frm)
        _spend(ctx, inst, frm, amount)
        _receive(ctx, inst, to, amount)
        _transfer_event(ctx, inst, args[0], args[1], args[2])
        return SC_VOID
    if fn == b"balance":
        expect_args(args, 1, "balance")
        return sc_i128(read_balance(ctx, inst, as_address(args[0])))
    if fn == b"allowance":
        expect_args(args, 2, "allowance")
        return sc_i128(read_allowance(ctx, as_address(args[0]), as_address(args[1])))
    if fn == b"approve":
        expect_args(args, 4, "approve")
        frm, spender, amount, live_until = (as_address(args[0]), as_address(args[1]), as_i128(args[2]),
                                            as_u32(args[3]))
        _nonneg(amount)
        ctx.require_auth(frm)
        _write_allowance(ctx, frm, spender, amount, live_until)
        ctx.emit([SYM_APPROVE, args[0], args[1], name], sc_vec([args[2], args[3]]))
        return SC_VOID
    if fn == b"transfer_from":
        expect_args(args, 4, "transfer_from")
        spender, frm, to, amount = (as_address(args[0]), as_address(args[1]), as_address(args[2]),
                                    as_i128(args[3]))
        _nonneg(amount)
        ctx.require_auth(spender)
        _spend_allowance(ctx, frm, spender, amount)
        _spend(ctx, inst, frm, amount)
        _receive(ctx, inst, to, amount)
        _transfer_event(ctx, inst, args[1], args[2], args[3])
        return SC_VOID
    if fn == b"burn":
        expect_args(args, 2, "burn")
        frm, amount = as_address(args[0]), as_i128(args[1])
        _nonneg(amount)
        _not_issuer(inst, frm)
        ctx.require_auth(frm)
        _spend(ctx, inst, frm, amount)
        ctx.emit([SYM_BURN, args[0], name], args[1])
        return SC_VOID
    if fn == b"burn_from":
        expect_args(args, 3, "burn_from")
        spender, frm, amount = as_address(args[0]), as_address(args[1]), as_i128(args[2])
        _nonneg(amount)
        _not_issuer(inst, frm)
        ctx.require_auth(spender)
        _spend_allowance(ctx, frm, spender, amount)
        _spend(ctx, inst, frm, amount)
        ctx.emit([SYM_BURN, args[1], name], args[2])
        return SC_VOID
    if fn == b"clawback":
        expect_args(args, 2, "clawback")
        frm, amount = as_address(args[0]), as_i128(args[1])
        _nonneg(amount)
        # balance.rs check_clawbackable: nothing is clawbackable under an issuer without
        # AUTH_CLAWBACK_ENABLED (trustlines lack the flag, contract balances have clawback=false).
        if _is_issuer(inst, frm):
            raise ContractTrap(ERR_OPERATION_NOT_SUPPORTED, "cannot clawback from issuer")
        _require_trustline(ctx, inst, frm)
        if frm[:8] == ADDR_ACCOUNT:
            raise ContractTrap(ERR_BALANCE, "trustline isn't clawbackable")
        where = balance_key(ctx.contract, inst, frm)
        if where is None or ctx.get(where[0]) is None:
            raise ContractTrap(ERR_BALANCE, "no balance to clawback")
        raise ContractTrap(ERR_BALANCE, "balance isn't clawbackable")
    if fn == b"set_authorized":
        expect_args(args, 2, "set_authorized")
        addr, authorize = as_address(args[0]), as_bool(args[1])
        ctx.require_auth(inst["admin"])
        if not authorize:
            raise ContractTrap(ERR_OPERATION_NOT_SUPPORTED, "issuer does not have AUTH_REVOCABLE set")
        where = balance_key(ctx.contract, inst, addr)
        if where is not None:
            _require_trustline(ctx, inst, addr)
            old = ctx.get(where[0])
            _write_balance(ctx, where[0], where[1], old.val if old is not None else 0)  # authorized (always)
        ctx.emit([SYM_SET_AUTHORIZED, args[0], name], SC_TRUE if authorize else SC_FALSE)
        return SC_VOID
    if fn == b"authorized":
        expect_args(args, 1, "authorized")
        addr = as_address(args[0])
        _require_trustline(ctx, inst, addr)
        return SC_TRUE  # no AUTH_REQUIRED issuer: every trustline and contract balance is authorized
    if fn == b"mint":
        expect_args(args, 2, "mint")
        to, amount = as_address(args[0]), as_i128(args[1])
        _nonneg(amount)
        _not_issuer(inst, to)
        ctx.require_auth(inst["admin"])
        _receive(ctx, inst, to, amount)
        ctx.emit([SYM_MINT, args[0], name], args[1])
        return SC_VOID
    if fn == b"set_admin":
        expect_args(args, 1, "set_admin")
        new_admin = as_address(args[0])
        old_admin = inst["admin"]
        ctx.require_auth(old_admin)
        ctx.set_instance({**inst, "admin": new_admin})
        ctx.emit([SYM_SET_ADMIN, sc_address(old_admin), name], args[0])
        return SC_VOID
    if fn == b"admin":
        expect_args(args, 0, "admin")
        return sc_address(inst["admin"])
    if fn == b"trust":
        expect_args(args, 1, "trust")
        addr = as_address(args[0])
        where = balance_key(ctx.contract, inst, addr)
        if where is not None and where[1] == "trustline" and ctx.get(where[0]) is None:
            exists = ctx.auth.account_exists
            if exists is not None and not exists(addr[8:]):
                raise ContractTrap(ERR_ACCOUNT_MISSING, "account is missing")
            ctx.require_auth(addr)
            ctx.put(where[0], "trustline", 0)
        return SC_VOID
    if fn == b"decimals":
        expect_args(args, 0, "decimals")
        return sc_u32(DECIMALS)
    if fn == b"name":
        expect_args(args, 0, "name")
        return name
    if fn == b"symbol":
        expect_args(args, 0, "symbol")
        return scval.to_string(inst["code"])
    raise missing_function(fn)
