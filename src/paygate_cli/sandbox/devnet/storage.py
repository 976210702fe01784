"""Ledger-entry storage for the devnet host: fast XDR key encoding, native entry values, staging.

Why this module exists: the stellar-sdk XDR classes are pure Python and slow (building one
LedgerKey through the SDK costs ~170 µs, encoding one ~30 µs). The devnet must apply hundreds of
`charge_batch` transactions per second, so the host keys its storage by the *exact* LedgerKey XDR
bytes, built by hand with `struct` for the handful of shapes the modelled contracts use, and keeps
entry values as plain Python values. Real `xdr.LedgerEntry` objects are only materialised on the
slow paths (`getLedgerEntries`, snapshot). Tests pin every hand encoder to the SDK's own encoding.
"""

from __future__ import annotations

import base64
import heapq
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from stellar_sdk import scval, xdr

from . import fees

# --- constants (protocol reference values) ---------------------------------

MAX_ENTRY_TTL = 3_110_400  # ledgers; bounds signatureExpirationLedger (CAP-46-11)
PERSISTENT_TTL = 2_073_600  # 120 days of 5 s ledgers: TTL given to a newly created persistent entry
TEMPORARY_TTL = 17_280  # 1 day: TTL given to a newly created temporary entry (nonces use their expiry)


@dataclass(frozen=True)
class TtlConfig:
    """The network's state archival settings (StateArchivalSettings), `paygate devnet start` options.

    A new entry lives `min_*` ledgers counting the one it is created in (liveUntil = ledger + min - 1,
    soroban-env-host's min_live_until_ledger); nothing lives past ledger + max_entry - 1."""

    min_persistent: int = PERSISTENT_TTL
    min_temporary: int = TEMPORARY_TTL
    max_entry: int = MAX_ENTRY_TTL


DEFAULT_TTL = TtlConfig()

_U32 = struct.Struct(">I").pack
_I64 = struct.Struct(">q").pack
_U64 = struct.Struct(">Q").pack
_I64_U64 = struct.Struct(">qQ").pack

T_ACCOUNT = b"\x00\x00\x00\x00"
T_TRUSTLINE = b"\x00\x00\x00\x01"
T_CONTRACT_DATA = b"\x00\x00\x00\x06"
T_CONTRACT_CODE = b"\x00\x00\x00\x07"
DUR_TEMPORARY = b"\x00\x00\x00\x00"
DUR_PERSISTENT = b"\x00\x00\x00\x01"

# SCAddress XDR prefixes: SC_ADDRESS_TYPE_ACCOUNT + PUBLIC_KEY_TYPE_ED25519, SC_ADDRESS_TYPE_CONTRACT.
ADDR_ACCOUNT = b"\x00\x00\x00\x00\x00\x00\x00\x00"
ADDR_CONTRACT = b"\x00\x00\x00\x01"
_CD_CONTRACT = T_CONTRACT_DATA + ADDR_CONTRACT

_SCV = xdr.SCValType


class StorageTrap(Exception):
    """A host-level failure raised while touching storage (footprint, missing value)."""

    def __init__(self, code: str, detail: str, kind: str = "trapped") -> None:
        super().__init__(f"HostError: Error({code})")
        self.code = code
        self.detail = detail
        self.kind = kind


class ValueTrap(StorageTrap):
    """An SCVal had the wrong type or size (what a real contract's argument conversion rejects)."""

    def __init__(self, detail: str, code: str = "Value, UnexpectedType") -> None:
        super().__init__(code, detail)


# --- fast XDR encoders -------------------------------------------------------------------------


def _pad(n: int) -> bytes:
    return b"\x00" * (-n % 4)


def enc_opaque(b: bytes) -> bytes:
    return _U32(len(b)) + b + _pad(len(b))


def enc_symbol(s: bytes) -> bytes:
    """SCVal SCV_SYMBOL."""
    return b"\x00\x00\x00\x0f" + enc_opaque(s)


def enc_scaddress(a: xdr.SCAddress) -> bytes:
    """SCAddress XDR for account/contract addresses; other kinds fall back to the SDK."""
    t = a.type
    if t == 0:
        return ADDR_ACCOUNT + a.account_id.account_id.ed25519.uint256  # type: ignore[union-attr]
    if t == 1:
        return ADDR_CONTRACT + a.contract_id.contract_id.hash  # type: ignore[union-attr]
    return a.to_xdr_bytes()


_SYM_CACHE: dict[bytes, bytes] = {}


def enc_scval(v: xdr.SCVal) -> bytes:
    """SCVal XDR, hand-encoded for the common shapes (keys and contract args)."""
    t = v.type
    if t == 18:  # ADDRESS
        a = v.address
        if a.type == 0:  # type: ignore[union-attr]
            return b"\x00\x00\x00\x12" + ADDR_ACCOUNT + a.account_id.account_id.ed25519.uint256  # type: ignore[union-attr]
        return b"\x00\x00\x00\x12" + enc_scaddress(a)  # type: ignore[arg-type]
    if t == 15:  # SYMBOL: a handful of distinct names, so cache their encodings
        sym = v.sym.sc_symbol  # type: ignore[union-attr]
        enc = _SYM_CACHE.get(sym)
        if enc is None:
            enc = b"\x00\x00\x00\x0f" + enc_opaque(sym)
            if len(_SYM_CACHE) < 4096:
                _SYM_CACHE[sym] = enc
        return enc
    if t == 13:  # BYTES
        b = v.bytes.sc_bytes  # type: ignore[union-attr]
        if len(b) == 32:
            return b"\x00\x00\x00\x0d\x00\x00\x00\x20" + b
        return b"\x00\x00\x00\x0d" + enc_opaque(b)
    if t == 16 and v.vec is not None:  # VEC (present)
        items = v.vec.sc_vec
        return b"\x00\x00\x00\x10\x00\x00\x00\x01" + _U32(len(items)) + b"".join([enc_scval(i) for i in items])
    if t == 10:  # I128
        p = v.i128
        return b"\x00\x00\x00\x0a" + _I64_U64(p.hi.int64, p.lo.uint64)  # type: ignore[union-attr]
    if t == 21:  # LEDGER_KEY_NONCE
        return b"\x00\x00\x00\x15" + _I64(v.nonce_key.nonce.int64)  # type: ignore[union-attr]
    if t == 20:  # LEDGER_KEY_CONTRACT_INSTANCE
        return b"\x00\x00\x00\x14"
    if t == 3:  # U32
        return b"\x00\x00\x00\x03" + _U32(v.u32.uint32)  # type: ignore[union-attr]
    if t == 5:  # U64
        return b"\x00\x00\x00\x05" + _U64(v.u64.uint64)  # type: ignore[union-attr]
    return v.to_xdr_bytes()


def enc_ledger_key(k: xdr.LedgerKey) -> bytes:
    """LedgerKey XDR, hand-encoded for ACCOUNT / TRUSTLINE / CONTRACT_DATA / CONTRACT_CODE."""
    t = k.type
    if t == 6:
        cd = k.contract_data
        c = cd.contract  # type: ignore[union-attr]
        # Contract owners dominate (every modelled key but nonces), so skip the generic call for them.
        head = (
            _CD_CONTRACT + c.contract_id.contract_id.hash  # type: ignore[union-attr]
            if c.type == 1
            else T_CONTRACT_DATA + enc_scaddress(c)
        )
        return head + enc_scval(cd.key) + (DUR_PERSISTENT if cd.durability == 1 else DUR_TEMPORARY)  # type: ignore[union-attr]
    if t == 0:
        return T_ACCOUNT + b"\x00\x00\x00\x00" + k.account.account_id.account_id.ed25519.uint256  # type: ignore[union-attr]
    if t == 7:
        return T_CONTRACT_CODE + k.contract_code.hash.hash  # type: ignore[union-attr]
    return k.to_xdr_bytes()


# --- hand-built keys (hot path) -------------------------------------------------------------------


def account_key(ed25519: bytes) -> bytes:
    return T_ACCOUNT + b"\x00\x00\x00\x00" + ed25519


def data_key(owner: bytes, key_scval: bytes, persistent: bool = True) -> bytes:
    """CONTRACT_DATA LedgerKey bytes; `owner` is SCAddress XDR (a contract, or an account for nonces)."""
    return T_CONTRACT_DATA + owner + key_scval + (DUR_PERSISTENT if persistent else DUR_TEMPORARY)


def instance_key(contract: bytes) -> bytes:
    return data_key(contract, b"\x00\x00\x00\x14", True)


def nonce_key(owner: bytes, nonce: int) -> bytes:
    return data_key(owner, b"\x00\x00\x00\x15" + _I64(nonce), False)


def code_key(wasm_hash: bytes) -> bytes:
    return T_CONTRACT_CODE + wasm_hash


def tagged_key_prefix(tag: str) -> bytes:
    """SCVal bytes of `Vec[Symbol(tag), <one more item>]` up to (excluding) the second item."""
    return b"\x00\x00\x00\x10\x00\x00\x00\x01\x00\x00\x00\x02" + enc_symbol(tag.encode())


def trustline_key(ed25519: bytes, asset: bytes) -> bytes:
    """TRUSTLINE LedgerKey; `asset` is TrustLineAsset XDR."""
    return T_TRUSTLINE + b"\x00\x00\x00\x00" + ed25519 + asset


def trustline_asset(code: str, issuer_ed25519: bytes) -> bytes:
    c = code.encode()
    if 1 <= len(c) <= 4:
        return b"\x00\x00\x00\x01" + c.ljust(4, b"\x00") + b"\x00\x00\x00\x00" + issuer_ed25519
    if len(c) <= 12:
        return b"\x00\x00\x00\x02" + c.ljust(12, b"\x00") + b"\x00\x00\x00\x00" + issuer_ed25519
    raise ValueError(f"bad asset code {code!r}")


# --- SCVal helpers ----------------------------------------------------------------------------------


def scaddress_from_bytes(b: bytes) -> xdr.SCAddress:
    if b[:4] == ADDR_CONTRACT:
        return xdr.SCAddress(xdr.SCAddressType.SC_ADDRESS_TYPE_CONTRACT, contract_id=xdr.ContractID(xdr.Hash(b[4:])))
    return xdr.SCAddress(
        xdr.SCAddressType.SC_ADDRESS_TYPE_ACCOUNT,
        account_id=xdr.AccountID(xdr.PublicKey(xdr.PublicKeyType.PUBLIC_KEY_TYPE_ED25519, xdr.Uint256(b[8:]))),
    )


def sc_address(b: bytes) -> xdr.SCVal:
    return xdr.SCVal(_SCV.SCV_ADDRESS, address=scaddress_from_bytes(b))


def sc_i128(n: int) -> xdr.SCVal:
    return xdr.SCVal(_SCV.SCV_I128, i128=xdr.Int128Parts(xdr.Int64(n >> 64), xdr.Uint64(n & 0xFFFFFFFFFFFFFFFF)))


def sc_u32(n: int) -> xdr.SCVal:
    return xdr.SCVal(_SCV.SCV_U32, u32=xdr.Uint32(n))


def sc_u64(n: int) -> xdr.SCVal:
    return xdr.SCVal(_SCV.SCV_U64, u64=xdr.Uint64(n))


def sc_vec(items: list[xdr.SCVal]) -> xdr.SCVal:
    return xdr.SCVal(_SCV.SCV_VEC, vec=xdr.SCVec(items))


def sc_sym(s: str) -> xdr.SCVal:
    return xdr.SCVal(_SCV.SCV_SYMBOL, sym=xdr.SCSymbol(s.encode()))


SC_VOID = xdr.SCVal(_SCV.SCV_VOID)
SC_TRUE = xdr.SCVal(_SCV.SCV_BOOL, b=True)
SC_FALSE = xdr.SCVal(_SCV.SCV_BOOL, b=False)


def sc_map(pairs: Iterable[tuple[xdr.SCVal, xdr.SCVal]]) -> xdr.SCVal:
    """A SCMap with keys sorted by their XDR encoding (good enough for the symbol/vec keys used here)."""
    entries = sorted(pairs, key=lambda kv: (kv[0].type, enc_scval(kv[0])))
    return xdr.SCVal(_SCV.SCV_MAP, map=xdr.SCMap([xdr.SCMapEntry(k, v) for k, v in entries]))


# --- entries --------------------------------------------------------------------------------------------

# Value kinds and the exact XDR size of their SCVal (used for byte estimates without encoding).
_VAL_SIZE = {"i128": 20, "u64": 12, "bool": 8, "void": 4, "sac_balance": 100}
ACCOUNT_ENTRY_SIZE = 92  # plain AccountEntry without extensions (the RPC side owns accounts)


class Entry:
    """One ledger entry value, kept native. Never mutated in place: writes replace the object."""

    __slots__ = ("kind", "last_modified", "live_until", "val")

    def __init__(self, kind: str, val: Any, live_until: int | None, last_modified: int = 0) -> None:
        self.kind = kind
        self.val = val
        self.live_until = live_until
        self.last_modified = last_modified


# Instance materialisers, registered by the contract models: contract kind -> native val -> SCContractInstance.
InstanceCodec = tuple[Callable[[Any], xdr.SCContractInstance], Callable[[Any], Any], Callable[[Any], Any]]
INSTANCE_CODECS: dict[str, InstanceCodec] = {}


def entry_val_scval(e: Entry) -> xdr.SCVal:
    k = e.kind
    if k == "i128":
        return sc_i128(e.val)
    if k == "u64":
        return sc_u64(e.val)
    if k == "bool":
        return SC_TRUE if e.val else SC_FALSE
    if k == "void":
        return SC_VOID
    if k == "sac_balance":
        return scval.to_map(
            {
                scval.to_symbol("amount"): scval.to_int128(e.val),
                scval.to_symbol("authorized"): scval.to_bool(True),
                scval.to_symbol("clawback"): scval.to_bool(False),
            }
        )
    if k == "sac_allowance":  # the SAC's AllowanceValue
        return sc_map([(sc_sym("amount"), sc_i128(e.val[0])), (sc_sym("live_until_ledger"), sc_u32(e.val[1]))])
    if k == "instance":
        return xdr.SCVal(_SCV.SCV_CONTRACT_INSTANCE, instance=INSTANCE_CODECS[e.val["contract_kind"]][0](e.val))
    raise ValueError(f"no SCVal for entry kind {k}")


def entry_size(key: bytes, e: Entry) -> int:
    """Exact XDR size of the LedgerEntry for (key, e) — computed, not encoded, on the hot path."""
    k = e.kind
    if k == "trustline":
        # lastModified + type + (key body: account + asset) + balance + limit + flags + 2 ext
        return len(key) + 32
    if k == "code":
        return 4 + 4 + 4 + 32 + 4 + len(e.val) + (-len(e.val) % 4) + 4
    size = _VAL_SIZE.get(k)
    if size is None:
        size = len(entry_val_scval(e).to_xdr_bytes())
    # LedgerEntry = lastModified + LedgerKey body (type is shared) + ContractDataEntry.ext + val + ext
    return len(key) + 12 + size


def materialize(key: bytes, e: Entry) -> xdr.LedgerEntry:
    """Build the real `xdr.LedgerEntry` for a stored entry (slow path: reads and snapshots)."""
    lk = xdr.LedgerKey.from_xdr_bytes(key)
    if e.kind == "trustline":
        tl = lk.trust_line
        assert tl is not None
        data = xdr.LedgerEntryData(
            xdr.LedgerEntryType.TRUSTLINE,
            trust_line=xdr.TrustLineEntry(
                account_id=tl.account_id,
                asset=tl.asset,
                balance=xdr.Int64(e.val),
                limit=xdr.Int64(2**63 - 1),
                flags=xdr.Uint32(xdr.TrustLineFlags.AUTHORIZED_FLAG.value),
                ext=xdr.TrustLineEntryExt(0),
            ),
        )
    elif e.kind == "code":
        cc = lk.contract_code
        assert cc is not None
        data = xdr.LedgerEntryData(
            xdr.LedgerEntryType.CONTRACT_CODE,
            contract_code=xdr.ContractCodeEntry(ext=xdr.ContractCodeEntryExt(0), hash=cc.hash, code=e.val),
        )
    else:
        cd = lk.contract_data
        assert cd is not None
        data = xdr.LedgerEntryData(
            xdr.LedgerEntryType.CONTRACT_DATA,
            contract_data=xdr.ContractDataEntry(
                ext=xdr.ExtensionPoint(0),
                contract=cd.contract,
                key=cd.key,
                durability=cd.durability,
                val=entry_val_scval(e),
            ),
        )
    return xdr.LedgerEntry(last_modified_ledger_seq=xdr.Uint32(e.last_modified), data=data, ext=xdr.LedgerEntryExt(0))


def is_temporary(key: bytes) -> bool:
    return key[:4] == T_CONTRACT_DATA and key[-4:] == DUR_TEMPORARY


def has_ttl(key: bytes) -> bool:
    """Contract data and code carry a liveUntilLedgerSeq; classic entries (trustlines) do not."""
    return key[:4] in (T_CONTRACT_DATA, T_CONTRACT_CODE)


def is_persistent(key: bytes) -> bool:
    """Persistent contract data (instances included) and contract code: archived at expiry, restorable."""
    return key[:4] == T_CONTRACT_CODE or (key[:4] == T_CONTRACT_DATA and key[-4:] == DUR_PERSISTENT)


def rent_change(key: bytes, old: Entry | None, old_size: int, new_size: int, new_live_until: int
                ) -> fees.RentChange:
    """One entry's rent-relevant change; `old` None = a new (or restored) entry, charged from scratch."""
    old_lu = (old.live_until or 0) if old is not None else 0
    return fees.RentChange(persistent=not is_temporary(key), code=key[:4] == T_CONTRACT_CODE,
                           old_size=old_size if old is not None else 0, new_size=new_size,
                           old_live_until=old_lu, new_live_until=max(new_live_until, old_lu))


def entry_to_json(key: bytes, e: Entry) -> dict[str, Any]:
    val: Any = e.val
    if e.kind in ("i128", "u64", "sac_balance", "trustline"):
        val = str(val)
    elif e.kind == "code":
        val = val.hex()
    elif e.kind == "sac_allowance":
        val = [str(val[0]), val[1]]
    elif e.kind == "instance":
        val = INSTANCE_CODECS[val["contract_kind"]][1](val)
    return {
        "key": base64.b64encode(key).decode(),
        "kind": e.kind,
        "val": val,
        "live_until": e.live_until,
        "last_modified": e.last_modified,
    }


def entry_from_json(d: dict[str, Any]) -> tuple[bytes, Entry]:
    kind = d["kind"]
    val: Any = d["val"]
    if kind in ("i128", "u64", "sac_balance", "trustline"):
        val = int(val)
    elif kind == "code":
        val = bytes.fromhex(val)
    elif kind == "sac_allowance":
        val = (int(val[0]), int(val[1]))
    elif kind == "instance":
        val = INSTANCE_CODECS[val["contract_kind"]][2](val)
    return base64.b64decode(d["key"]), Entry(kind, val, d["live_until"], d["last_modified"])


# --- staging ------------------------------------------------------------------------------------------

# What an access to an archived entry does (docs/devnet.md "State archival"):
# - "auto": recording (simulation, no declared footprint): the entry is restored as the transaction
#   runs, recorded in the read-write footprint and in `restored` (protocol 23 auto-restore);
# - "as_live": recording "as if already restored" (soroban-simulation's AutoRestoringSnapshotSource):
#   the entry reads as live with the minimum persistent TTL, its key is collected in `preamble`;
# - "strict": a declared footprint; the host restored what the transaction marked before running, so
#   reaching an archived entry here is an invariant failure (a trap, never a silent restore).
RestoreMode = Literal["auto", "as_live", "strict"]


class Staging:
    """Copy-on-write view of the committed entries for one invocation.

    Records every key read and written (the footprint a simulation reports) and, when a declared
    footprint is given, refuses any access outside it the way the real host does. Entries whose TTL
    ran out read as the network has them: temporary ones are gone, persistent ones are archived
    (in `archive`, or still in `base` past their liveUntil until the next ledger close moves them).
    """

    __slots__ = ("archive", "base", "fp_ro", "fp_rw", "ledger_seq", "overlay", "preamble", "reads",
                 "restore_mode", "restored", "ttl", "writes")

    def __init__(
        self,
        base: dict[bytes, Entry],
        ledger_seq: int,
        footprint: tuple[set[bytes], set[bytes]] | None,
        *,
        archive: dict[bytes, Entry] | None = None,
        ttl: TtlConfig = DEFAULT_TTL,
        restore_mode: RestoreMode | None = None,
    ) -> None:
        self.base = base
        self.archive = archive
        self.ledger_seq = ledger_seq
        self.ttl = ttl
        self.overlay: dict[bytes, Entry | None] = {}
        self.reads: dict[bytes, None] = {}  # ordered set
        self.writes: dict[bytes, None] = {}
        self.restored: dict[bytes, None] = {}  # archived keys this invocation restores, in access order
        self.preamble: dict[bytes, Entry] = {}  # "as_live": archived keys read as if restored
        if footprint is None:
            self.fp_ro: set[bytes] | None = None
            self.fp_rw: set[bytes] | None = None
        else:
            self.fp_ro, self.fp_rw = footprint
        self.restore_mode: RestoreMode = restore_mode or ("auto" if footprint is None else "strict")

    def touch_read(self, key: bytes) -> None:
        if self.fp_ro is not None and key not in self.fp_ro and key not in self.fp_rw:  # type: ignore[operator]
            raise StorageTrap("Storage, ExceededLimit", "trying to access a ledger key outside of the footprint")
        self.reads[key] = None

    def touch_write(self, key: bytes) -> None:
        if self.fp_rw is not None and key not in self.fp_rw:
            raise StorageTrap(
                "Storage, ExceededLimit", "trying to write a ledger key outside of the read-write footprint"
            )
        self.writes[key] = None

    def min_live_until(self, key: bytes) -> int:
        """liveUntil of an entry created (or restored) now: this ledger counts (soroban-env-host)."""
        ttl = self.ttl.min_temporary if is_temporary(key) else self.ttl.min_persistent
        return self.ledger_seq + ttl - 1

    def _resolve(self, key: bytes) -> Entry | None:
        """The entry as this invocation sees it: None if missing or an expired temporary."""
        if key in self.overlay:
            return self.overlay[key]
        e = self.base.get(key)
        if e is None:
            e = self.archive.get(key) if self.archive is not None else None
            if e is None:
                return None
        elif e.live_until is None or e.live_until >= self.ledger_seq:
            return e
        elif is_temporary(key):
            return None  # a temporary entry past its liveUntil is dead: it reads as absent (CAP-46-12)
        return self._archived(key, e)

    def _archived(self, key: bytes, e: Entry) -> Entry:
        mode = self.restore_mode
        if mode == "strict":
            raise StorageTrap("Storage, InternalError", "trying to access an archived entry that was not restored",
                              kind="entry_archived")
        if mode == "auto":
            self.touch_write(key)  # restoring writes the entry: it moves to the read-write footprint
            self.restored[key] = None
            live = Entry(e.kind, e.val, self.min_live_until(key), self.ledger_seq)
        else:
            live = Entry(e.kind, e.val, self.min_live_until(key), e.last_modified)
            self.preamble[key] = live
        self.overlay[key] = live
        return live

    def restore_marked(self, key: bytes, e: Entry, from_archive: bool) -> None:
        """A declared-footprint transaction restores an entry it marked (SorobanResourcesExtV0) before
        running: live again with the minimum persistent TTL. An entry restored from the hot archive is
        rewritten (lastModified = this ledger); one still in the live state keeps its lastModified."""
        self.restored[key] = None
        self.writes[key] = None
        self.overlay[key] = Entry(e.kind, e.val, self.min_live_until(key),
                                  self.ledger_seq if from_archive else e.last_modified)

    def get(self, key: bytes) -> Entry | None:
        self.touch_read(key)
        return self._resolve(key)

    def put(self, key: bytes, kind: str, val: Any, live_until: int | None = None) -> None:
        """Write an entry; an existing live entry keeps its TTL, a new one gets the minimum TTL."""
        self.touch_write(key)
        old = self._resolve(key)
        if live_until is None:
            if old is not None:
                live_until = old.live_until
            elif kind != "trustline":
                live_until = self.min_live_until(key)
        self.overlay[key] = Entry(kind, val, live_until, self.ledger_seq)

    def extend_ttl(self, key: bytes, threshold: int, extend_to: int) -> None:
        """The host's extend_ttl: when the entry has `threshold` ledgers or fewer left, it lives
        `extend_to` ledgers past this one (a persistent entry is clamped to the network maximum; a
        temporary one past it is an error). Never shortens; the entry itself is not rewritten."""
        self.touch_read(key)
        if threshold > extend_to:
            raise StorageTrap("Storage, InvalidInput", "threshold must be <= extend_to")
        e = self._resolve(key)
        if e is None or e.live_until is None:
            raise StorageTrap("Storage, MissingValue", "trying to extend the TTL of a missing entry")
        seq = self.ledger_seq
        max_lu = seq + self.ttl.max_entry - 1
        if is_temporary(key) and extend_to > max_lu - seq:
            raise StorageTrap("Storage, InvalidAction",
                              "trying to extend temporary entry past max TTL allowed by network")
        if e.live_until - seq > threshold:
            return
        new = min(seq + extend_to, max_lu)
        if new > e.live_until:
            self.overlay[key] = Entry(e.kind, e.val, new, e.last_modified)

    def commit(self, heap: list[tuple[int, bytes]] | None = None) -> None:
        """Write the overlay into `base`; restored keys leave the archive. Every new liveUntil goes on
        `heap` (the owner's expiry schedule); unchanged TTLs do not, so the heap stays small."""
        base = self.base
        for k, e in self.overlay.items():
            if e is None:
                base.pop(k, None)
                continue
            if heap is not None and e.live_until is not None:
                old = base.get(k)
                if old is None or old.live_until != e.live_until:
                    heapq.heappush(heap, (e.live_until, k))
            base[k] = e
        if self.archive is not None:
            for k in self.restored:
                self.archive.pop(k, None)

    def footprint(self) -> tuple[list[bytes], list[bytes]]:
        ro = [k for k in self.reads if k not in self.writes]
        return ro, list(self.writes)

    def written_entries(self) -> list[tuple[bytes, Entry]]:
        """Entries this invocation writes (a TTL-only extension of a read entry is not a write)."""
        overlay = self.overlay
        return [(k, e) for k in self.writes if (e := overlay.get(k)) is not None]

    def rent_changes(self, sizes: dict[bytes, int]) -> list[fees.RentChange]:
        """What rent this invocation owes (soroban-env-host get_ledger_changes): every entry with a TTL
        that is new, restored, grew, or lives longer. `sizes` holds the written entries' sizes."""
        seq = self.ledger_seq
        out: list[fees.RentChange] = []
        for k, e in self.overlay.items():
            if e is None or e.live_until is None:
                continue
            if k in self.restored:
                old: Entry | None = None
            elif k in self.preamble:
                old = self.preamble[k]
            else:
                old = self.base.get(k)
                if old is not None and old.live_until is not None and old.live_until < seq:
                    old = None  # an expired temporary rewritten: a new entry
            new_size = sizes.get(k)
            if old is not None:
                if new_size is None and e.live_until <= (old.live_until or 0):
                    continue  # read only, TTL unchanged
                old_size = entry_size(k, old)
                if new_size is None:
                    new_size = old_size
                if e.live_until <= (old.live_until or 0) and new_size <= old_size:
                    continue  # rewritten in place: same TTL, not larger
            else:
                old_size = 0
                if new_size is None:
                    new_size = entry_size(k, e)
            out.append(rent_change(k, old, old_size, new_size, e.live_until))
        return out
