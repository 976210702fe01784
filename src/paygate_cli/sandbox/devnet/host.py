"""The devnet's Soroban "host": auth, contract storage and native contract models.

The RPC layer owns accounts, sequence numbers, fees and ledgers; this layer owns everything a
Soroban invocation touches: CONTRACT_DATA (balances, consumed charge ids, nonces, instances),
CONTRACT_CODE, and the TRUSTLINE entries that hold G-accounts' USDC. `invoke` runs one
InvokeHostFunction op against a staged copy of that state and commits only in `apply` mode on
success, so a trapped invocation changes nothing (not even the nonces it would have consumed),
exactly like a failed Soroban transaction.

Performance note: storage is keyed by LedgerKey XDR bytes built by hand (see storage.py) and the
hot path never encodes/decodes through the SDK, except for the declared footprint, which is
encoded once per call with the fast encoder.
"""

from __future__ import annotations

import hashlib
import heapq
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Literal

from stellar_sdk import Address, Asset, Network, StrKey, xdr

from . import fees
from .auth import AuthContext, deterministic_nonce
from .contracts import billing, market
from .contracts import sac as sac_model
from .contracts.base import Ctx, addr_bytes
from .storage import (
    ACCOUNT_ENTRY_SIZE,
    ADDR_CONTRACT,
    DEFAULT_TTL,
    T_ACCOUNT,
    T_CONTRACT_CODE,
    T_TRUSTLINE,
    Entry,
    RestoreMode,
    Staging,
    StorageTrap,
    TtlConfig,
    code_key,
    enc_ledger_key,
    enc_scaddress,
    entry_from_json,
    entry_size,
    entry_to_json,
    has_ttl,
    instance_key,
    is_persistent,
    is_temporary,
    materialize,
    rent_change,
)

_MODELS: dict[str, Any] = {sac_model.KIND: sac_model, billing.KIND: billing, market.KIND: market}

# Network reference limits (the published Soroban limits): exceeding them is RESOURCE_LIMIT_EXCEEDED.
MAX_INSTRUCTIONS = 100_000_000
MAX_EVENTS_AND_RETURN_BYTES = 16_384
_MAX_EVENT_SIZE_GUESS = 256  # upper bound of one modelled event's XDR size; gates the exact check
SNAPSHOT_VERSION = 1


@dataclass
class InvokeOutcome:
    ok: bool  # False = the invocation trapped (auth failure, contract error, footprint violation …)
    error: str | None  # e.g. "HostError: Error(Auth, InvalidAction)"; None when ok
    error_kind: str | None  # "trapped" | "resource_limit_exceeded" | "entry_archived" | None
    return_value: xdr.SCVal | None
    events: list[xdr.ContractEvent] = field(default_factory=list)  # only meaningful when ok
    read_only: list[xdr.LedgerKey] = field(default_factory=list)  # footprint the call touched
    read_write: list[xdr.LedgerKey] = field(default_factory=list)
    auth: list[xdr.SorobanAuthorizationEntry] = field(default_factory=list)  # record mode: entries to sign
    instructions: int = 0  # deterministic estimate for resource fees
    read_bytes: int = 0  # classic and restored entries read (P23 "disk read": live Soroban state is free)
    write_bytes: int = 0  # XDR size of every entry written (restored ones included)
    rent_fee: int = 0  # refundable: rent of new, restored, grown and extended entries (fees.rent_fee)
    restored: list[int] = field(default_factory=list)  # read_write indices restored (SorobanResourcesExtV0)
    preamble: list[xdr.LedgerKey] = field(default_factory=list)  # restore="as_live": keys to restore first


@dataclass
class FootprintOutcome:
    """What an ExtendFootprintTTL / RestoreFootprint does with its footprint (apply or simulation)."""

    code: Literal["success", "resource_limit_exceeded", "insufficient_refundable_fee"]
    keys: list[bytes]  # the entries it extends / restores, in footprint order
    rent_fee: int
    entry_bytes: int  # XDR size of those entries (a restore reads and writes each)
    archived: list[bytes] = field(default_factory=list)  # extend: archived keys (skipped; restore them first)
    missing: list[bytes] = field(default_factory=list)  # restore: keys that exist nowhere


def format_host_error(code: str, detail: str) -> str:
    """The shape real hosts give simulation errors: first line is the error, then the event log."""
    return (
        f"HostError: Error({code})\n\nEvent log (newest first):\n"
        f'   0: [Diagnostic Event] topics:[error, Error({code})], data:"{detail}"'
    )


class ContractHost:
    def __init__(self, network_passphrase: str, ttl: TtlConfig = DEFAULT_TTL) -> None:
        self.network_passphrase = network_passphrase
        self._network_id = Network(network_passphrase).network_id()
        self.ttl = ttl  # the network's state archival settings (`paygate devnet start` options)
        self._entries: dict[bytes, Entry] = {}
        # The hot archive (protocol 23, CAP-62): persistent entries whose TTL ran out, moved here when
        # a ledger closes past their liveUntil; restoring one moves it back.
        self._archive: dict[bytes, Entry] = {}
        # One invocation at a time: a simulation must never see half of a committing apply.
        self._lock = threading.RLock()
        self._nonce_seed = hashlib.sha256(b"paygate-devnet-nonce:" + network_passphrase.encode()).digest()
        self._nonce_counter = 0
        self._addr_cache: dict[str, bytes] = {}
        # (liveUntil, key) of every entry with a TTL, pushed when an entry's liveUntil changes, so
        # expiry visits only what expires (stale pairs of extended entries are skipped when popped).
        self._ttl_heap: list[tuple[int, bytes]] = []
        # Accounts belong to the RPC layer; when it sets this hook (G… strkey -> exists), ADDRESS
        # credentials of a missing account fail as on a real network. Unset: accounts are assumed.
        self.account_exists: Callable[[str], bool] | None = None

    # --- genesis ------------------------------------------------------------------------------------

    def deploy_sac(self, asset_code: str, issuer: str, *, ledger_seq: int = 1) -> str:
        contract_id = Asset(asset_code, issuer).contract_id(self.network_passphrase)
        self._install(contract_id, sac_model.make_instance(asset_code, issuer), None, ledger_seq)
        return contract_id

    def deploy_billing(self, admin: str, token: str, operators: list[str], *, ledger_seq: int = 1) -> str:
        contract_id = self._derive_contract_id(admin, b"paygate-devnet:billing")
        inst = billing.make_instance(self._addr(admin), self._addr(token), [self._addr(o) for o in operators])
        self._install(contract_id, inst, billing.WASM, ledger_seq)
        return contract_id

    def deploy_market(self, token: str, *, ledger_seq: int = 1) -> str:
        contract_id = self._derive_contract_id(token, b"paygate-devnet:market")
        self._install(contract_id, market.make_instance(self._addr(token)), market.WASM, ledger_seq)
        return contract_id

    def mint(self, sac: str, to: str, amount: int, *, ledger_seq: int = 1) -> None:
        """Genesis funding: G → trustline balance (created if missing), C → SAC contract-data balance."""
        if amount < 0:
            raise ValueError("amount must be >= 0")
        with self._lock:
            contract = self._addr(sac)
            inst = self._instance(contract, "sac")
            where = sac_model.balance_key(contract, inst, self._addr(to))
            if where is None:
                return  # the issuer's balance is unlimited
            key, kind = where
            st = self._staging(ledger_seq, None)
            old = st.get(key)
            st.put(key, kind, (old.val if old is not None else 0) + amount)
            st.commit(self._ttl_heap)

    def token_balance(self, sac: str, holder: str) -> int:
        with self._lock:
            contract = self._addr(sac)
            inst = self._instance(contract, "sac")
            where = sac_model.balance_key(contract, inst, self._addr(holder))
            if where is None:
                return sac_model.INT64_MAX
            e = self._entries.get(where[0])
            return e.val if e is not None else 0

    # --- reads --------------------------------------------------------------------------------------

    def get_ledger_entry(self, key: xdr.LedgerKey, ledger_seq: int) -> tuple[xdr.LedgerEntry, int | None] | None:
        """CONTRACT_DATA / CONTRACT_CODE / TRUSTLINE entries as of `ledger_seq`; ACCOUNT keys belong to
        the RPC side. An archived entry comes back with liveUntil 0, as stellar-core's query server
        (and so stellar-rpc's getLedgerEntries) reports it; an expired temporary one is gone."""
        kb = enc_ledger_key(key)
        with self._lock:
            e = self._entries.get(kb)
            if e is None:
                a = self._archive.get(kb)
                return None if a is None else (materialize(kb, a), 0)
            if e.live_until is not None and e.live_until < ledger_seq:
                if is_temporary(kb):
                    return None  # an expired temporary entry is gone (e.g. a nonce past its expiration)
                return materialize(kb, e), 0
            return materialize(kb, e), e.live_until

    def entry_state(self, key: bytes, ledger_seq: int) -> tuple[str, Entry | None]:
        """("live" | "archived" | "missing", entry) of a LedgerKey's bytes as of `ledger_seq`."""
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                a = self._archive.get(key)
                return ("missing", None) if a is None else ("archived", a)
            if e.live_until is not None and e.live_until < ledger_seq:
                return ("missing", None) if is_temporary(key) else ("archived", e)
            return "live", e

    # --- state archival -------------------------------------------------------------------------------

    def expire(self, as_of: int) -> tuple[int, int]:
        """Apply expiry as of ledger `as_of`: entries whose liveUntil is below it are not live there;
        temporary ones are deleted, persistent ones (instances, code included) move to the archive.
        Returns (deleted, archived). Cost: the entries that expire (plus stale heap pairs)."""
        deleted = archived = 0
        with self._lock:
            heap, entries = self._ttl_heap, self._entries
            while heap and heap[0][0] < as_of:
                lu, k = heapq.heappop(heap)
                e = entries.get(k)
                if e is None or e.live_until != lu:
                    continue  # extended, restored or deleted since: a stale pair
                del entries[k]
                if is_temporary(k):
                    deleted += 1
                else:
                    self._archive[k] = e
                    archived += 1
        return deleted, archived

    def archived_count(self) -> int:
        return len(self._archive)

    def _staging(self, ledger_seq: int, footprint: tuple[set[bytes], set[bytes]] | None,
                 restore: RestoreMode | None = None) -> Staging:
        return Staging(self._entries, ledger_seq, footprint, archive=self._archive, ttl=self.ttl,
                       restore_mode=restore)

    # --- execution ----------------------------------------------------------------------------------

    def invoke(
        self,
        *,
        host_function: xdr.HostFunction,
        auth: list[xdr.SorobanAuthorizationEntry],
        source_account: str,
        ledger_seq: int,
        ledger_close_time: int,
        mode: Literal["apply", "record", "enforce"],
        footprint: tuple[list[xdr.LedgerKey], list[xdr.LedgerKey]] | None = None,
        use_upgraded_auth: bool = True,
        commit_if: Callable[[InvokeOutcome], bool] | None = None,
        restore: RestoreMode | None = None,
        archived: Collection[int] = (),
    ) -> InvokeOutcome:
        """Run one host function. Never raises: any failure is an outcome with ok=False.

        Extensions of the fixed interface (all optional, defaults keep its behaviour):
        `use_upgraded_auth` (default True, like the SDK and RPC v27.1+) selects ADDRESS_V2 vs legacy
        ADDRESS credentials for record mode. `commit_if`, in apply mode, sees the successful outcome
        before anything is committed and can veto the commit (e.g. when the transaction declared
        fewer resources than the call used), so the caller needs no separate dry run.
        State archival: without a footprint (simulation) an archived entry is restored as the call
        runs (`restore` "auto", the default) or read as if already restored ("as_live"). With a
        declared footprint, every archived footprint entry must be a read-write one whose index is in
        `archived` (the transaction's archivedSorobanEntries): it is restored before the call;
        any other fails the call with ENTRY_ARCHIVED (error_kind "entry_archived"), as stellar-core.
        """
        with self._lock:
            staging: Staging | None = None
            key_objs: dict[bytes, xdr.LedgerKey] = {}
            actx: AuthContext | None = None
            ctx: Ctx | None = None
            try:
                fp_sets = None
                if footprint is not None:
                    ro_b = [enc_ledger_key(k) for k in footprint[0]]
                    rw_b = [enc_ledger_key(k) for k in footprint[1]]
                    key_objs = dict(zip(ro_b, footprint[0], strict=True))
                    key_objs.update(zip(rw_b, footprint[1], strict=True))
                    fp_sets = (set(ro_b), set(rw_b))
                staging = self._staging(ledger_seq, fp_sets, restore)
                if footprint is not None:
                    self._restore_marked(staging, ro_b, rw_b, archived)
                actx = AuthContext(
                    network_passphrase=self.network_passphrase,
                    entries=auth,
                    source_address=self._addr(source_account),
                    mode=mode,
                    staging=staging,
                    next_nonce=self._next_nonce,
                    use_upgraded_auth=use_upgraded_auth,
                    account_exists=self._account_exists_raw if self.account_exists is not None else None,
                )
                if host_function.type != xdr.HostFunctionType.HOST_FUNCTION_TYPE_INVOKE_CONTRACT:
                    raise StorageTrap(
                        "Context, InvalidAction", "only InvokeContract host functions are modelled by the devnet"
                    )
                ic = host_function.invoke_contract
                assert ic is not None
                if ic.contract_address.type != xdr.SCAddressType.SC_ADDRESS_TYPE_CONTRACT:
                    raise StorageTrap("Value, InvalidInput", "contract address is not a contract")
                contract = enc_scaddress(ic.contract_address)
                ik = instance_key(contract)
                inst = staging.get(ik)
                if inst is None:
                    raise StorageTrap("Storage, MissingValue", "trying to get non-existing value for contract instance")
                wasm_hash = inst.val.get("wasm_hash")
                if wasm_hash is not None:
                    staging.get(code_key(wasm_hash))  # a wasm contract's code is loaded: in its footprint
                fn = ic.function_name.sc_symbol
                ctx = Ctx(
                    staging=staging,
                    auth=actx,
                    contract=contract,
                    contract_addr=ic.contract_address,
                    fn=fn,
                    args=ic.args,
                    instance=inst,
                    instance_key=ik,
                )
                ret = _MODELS[inst.val["contract_kind"]].call(ctx, fn, ic.args)
                instructions = ctx.instructions + actx.instructions
                if instructions > MAX_INSTRUCTIONS:
                    raise StorageTrap(
                        "Budget, ExceededLimit",
                        f"{instructions} instructions exceed the limit",
                        kind="resource_limit_exceeded",
                    )
                if len(ctx.events) * _MAX_EVENT_SIZE_GUESS > MAX_EVENTS_AND_RETURN_BYTES:
                    size = sum(len(e.to_xdr_bytes()) for e in ctx.events) + len(ret.to_xdr_bytes())
                    if size > MAX_EVENTS_AND_RETURN_BYTES:
                        raise StorageTrap(
                            "Budget, ExceededLimit",
                            f"events and return value take {size} bytes",
                            kind="resource_limit_exceeded",
                        )
                outcome = self._outcome(staging, key_objs, actx, ctx, ok=True, ret=ret, mode=mode)
                if mode == "apply" and (commit_if is None or commit_if(outcome)):
                    staging.commit(self._ttl_heap)
                    # Dead for every ledger a reader may still ask about (the latest closed one is
                    # ledger_seq - 1), so in-process callers that close no ledgers still shed them.
                    self.expire(ledger_seq - 1)
                return outcome
            except StorageTrap as trap:
                return self._failure(staging, key_objs, actx, ctx, trap.kind, format_host_error(trap.code, trap.detail))
            except Exception as exc:  # a model bug must never take the RPC server down
                return self._failure(
                    staging,
                    key_objs,
                    actx,
                    ctx,
                    "trapped",
                    format_host_error("Context, InternalError", f"{type(exc).__name__}: {exc}"),
                )

    def _outcome(
        self,
        staging: Staging,
        key_objs: dict[bytes, xdr.LedgerKey],
        actx: AuthContext,
        ctx: Ctx,
        *,
        ok: bool,
        ret: xdr.SCVal,
        mode: str,
    ) -> InvokeOutcome:
        ro, rw = staging.footprint()
        sizes = {k: entry_size(k, e) for k, e in staging.written_entries()}
        restored = staging.restored
        # A restored entry is read from the archive (disk) and written back: both count.
        restored_bytes = sum(sizes[k] for k in restored if k in sizes)
        rent = fees.rent_fee(staging.rent_changes(sizes), staging.ledger_seq)
        return InvokeOutcome(
            ok=ok,
            error=None,
            error_kind=None,
            return_value=ret,
            events=ctx.events,
            read_only=[_key_obj(k, key_objs) for k in ro],
            read_write=[_key_obj(k, key_objs) for k in rw],
            auth=actx.recorded if mode == "record" else [],
            instructions=ctx.instructions + actx.instructions,
            read_bytes=self._read_bytes(staging, ro + rw) + restored_bytes,
            write_bytes=sum(sizes.values()),
            rent_fee=rent,
            restored=[i for i, k in enumerate(rw) if k in restored],
            preamble=[_key_obj(k, key_objs) for k in staging.preamble],
        )

    def _restore_marked(self, staging: Staging, ro: list[bytes], rw: list[bytes], marked: Collection[int]) -> None:
        """stellar-core's footprint load (protocol 23): every archived entry of the footprint must be
        a read-write one the transaction marked for restoration; those are restored before the host
        runs, any other fails the call with ENTRY_ARCHIVED before it starts."""
        seq = staging.ledger_seq
        marks = set(marked)
        for index, k in [(None, k) for k in ro] + list(enumerate(rw)):
            if not has_ttl(k):
                continue
            e = self._entries.get(k)
            from_archive = e is None
            if e is None:
                e = self._archive.get(k)
                if e is None:
                    continue
            elif e.live_until is None or e.live_until >= seq or not is_persistent(k):
                continue  # live, or an expired temporary entry (simply absent)
            if index is None or index not in marks:
                what = "contract code" if k[:4] == T_CONTRACT_CODE else "contract data"
                raise StorageTrap("Storage, InvalidInput", f"trying to access an archived {what} entry",
                                  kind="entry_archived")
            staging.restore_marked(k, e, from_archive)

    def _failure(
        self,
        staging: Staging | None,
        key_objs: dict[bytes, xdr.LedgerKey],
        actx: AuthContext | None,
        ctx: Ctx | None,
        kind: str,
        message: str,
    ) -> InvokeOutcome:
        ro: list[bytes] = []
        rw: list[bytes] = []
        if staging is not None:
            ro, rw = staging.footprint()
        try:
            ro_objs = [_key_obj(k, key_objs) for k in ro]
            rw_objs = [_key_obj(k, key_objs) for k in rw]
        except Exception:
            ro_objs, rw_objs = [], []
        return InvokeOutcome(
            ok=False,
            error=message,
            error_kind=kind,
            return_value=None,
            events=[],
            read_only=ro_objs,
            read_write=rw_objs,
            auth=[],
            instructions=(ctx.instructions if ctx else 0) + (actx.instructions if actx else 0),
            read_bytes=0,
            write_bytes=0,
        )

    def _read_bytes(self, staging: Staging, keys: list[bytes]) -> int:
        """Classic entries only (trustlines here, accounts estimated): P23 counts no live Soroban state."""
        total = 0
        for k in keys:
            t = k[:4]
            if t == T_TRUSTLINE:
                e = self._entries.get(k)
                if e is not None:
                    total += entry_size(k, e)
            elif t == T_ACCOUNT:
                total += ACCOUNT_ENTRY_SIZE
        return total

    # --- ExtendFootprintTTL / RestoreFootprint ---------------------------------------------------------

    def extend_footprint(self, keys: list[xdr.LedgerKey], extend_to: int, ledger_seq: int, *,
                         max_rent: int | None = None, commit: bool = False, as_live: bool = False
                         ) -> FootprintOutcome:
        """ExtendFootprintTTLOp (stellar-core): every live read-only footprint entry whose liveUntil is
        below ledger + extendTo gets exactly that (validation caps extendTo at max-entry-ttl - 1);
        archived and missing entries are skipped. Rent is refundable: above `max_rent` nothing changes
        (INSUFFICIENT_REFUNDABLE_FEE). `as_live` (simulation) counts archived entries as restored now,
        as stellar-rpc's preflight does, and lists them in `archived` for a restore preamble."""
        new_lu = ledger_seq + extend_to
        with self._lock:
            changes: list[fees.RentChange] = []
            out = FootprintOutcome("success", [], 0, 0)
            updates: list[tuple[bytes, Entry]] = []
            for key in keys:
                kb = enc_ledger_key(key)
                state, e = self.entry_state(kb, ledger_seq)
                if state == "missing" or e is None:
                    continue
                cur = e.live_until or 0
                if state == "archived":
                    if not as_live:
                        continue  # must be restored first
                    out.archived.append(kb)
                    cur = ledger_seq + self.ttl.min_persistent - 1
                if cur >= new_lu:
                    continue
                size = entry_size(kb, e)
                out.keys.append(kb)
                out.entry_bytes += size
                changes.append(rent_change(kb, Entry(e.kind, e.val, cur, e.last_modified), size, size, new_lu))
                updates.append((kb, Entry(e.kind, e.val, new_lu, e.last_modified)))
            return self._charge_rent(out, changes, updates, new_lu, ledger_seq, max_rent=max_rent, commit=commit)

    def _charge_rent(self, out: FootprintOutcome, changes: list[fees.RentChange], updates: list[tuple[bytes, Entry]],
                     new_lu: int, ledger_seq: int, *, max_rent: int | None, commit: bool) -> FootprintOutcome:
        """The rent of an extend or a restore (refundable: above `max_rent` nothing changes), then, when
        committing, the entries as they now live (a restored one leaves the archive). Under the lock."""
        out.rent_fee = fees.rent_fee(changes, ledger_seq)
        if max_rent is not None and out.rent_fee > max_rent:
            out.code = "insufficient_refundable_fee"
            return out
        if commit:
            for kb, e in updates:
                self._archive.pop(kb, None)
                self._entries[kb] = e
                heapq.heappush(self._ttl_heap, (new_lu, kb))
        return out

    def restore_footprint(self, keys: list[xdr.LedgerKey], ledger_seq: int, *, max_read_bytes: int | None = None,
                          max_write_bytes: int | None = None, max_rent: int | None = None, commit: bool = False
                          ) -> FootprintOutcome:
        """RestoreFootprintOp (stellar-core): every archived read-write footprint entry lives again until
        ledger + min-persistent-ttl - 1; live and missing ones are skipped. Each restored entry is read
        and written: over the declared bytes it is RESOURCE_LIMIT_EXCEEDED; rent above `max_rent` is
        INSUFFICIENT_REFUNDABLE_FEE; either way nothing changes."""
        new_lu = ledger_seq + self.ttl.min_persistent - 1
        with self._lock:
            changes: list[fees.RentChange] = []
            out = FootprintOutcome("success", [], 0, 0)
            updates: list[tuple[bytes, Entry]] = []
            for key in keys:
                kb = enc_ledger_key(key)
                state, e = self.entry_state(kb, ledger_seq)
                if state == "missing" or e is None:
                    out.missing.append(kb)
                    continue
                if state == "live":
                    continue
                from_archive = kb not in self._entries
                restored = Entry(e.kind, e.val, new_lu, ledger_seq if from_archive else e.last_modified)
                size = entry_size(kb, restored)
                out.keys.append(kb)
                out.entry_bytes += size
                if (max_read_bytes is not None and out.entry_bytes > max_read_bytes) or \
                        (max_write_bytes is not None and out.entry_bytes > max_write_bytes):
                    out.code = "resource_limit_exceeded"
                    return out
                changes.append(rent_change(kb, None, 0, size, new_lu))
                updates.append((kb, restored))
            return self._charge_rent(out, changes, updates, new_lu, ledger_seq, max_rent=max_rent, commit=commit)

    # --- persistence ----------------------------------------------------------------------------------

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "version": SNAPSHOT_VERSION,
                "network_passphrase": self.network_passphrase,
                "nonce_counter": self._nonce_counter,
                "entries": [entry_to_json(k, e) for k, e in self._entries.items()],
                "archive": [entry_to_json(k, e) for k, e in self._archive.items()],
            }

    @classmethod
    def restore(cls, network_passphrase: str, data: dict) -> ContractHost:
        if data.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unsupported host snapshot version {data.get('version')!r}")
        if data.get("network_passphrase") != network_passphrase:
            raise ValueError("host snapshot belongs to a different network passphrase")
        host = cls(network_passphrase)
        host._nonce_counter = int(data["nonce_counter"])
        for d in data["entries"]:
            k, e = entry_from_json(d)
            host._entries[k] = e
            if e.live_until is not None:
                host._ttl_heap.append((e.live_until, k))
        heapq.heapify(host._ttl_heap)
        for d in data.get("archive", []):  # absent in states written before state archival
            k, e = entry_from_json(d)
            host._archive[k] = e
        return host

    # --- helpers ----------------------------------------------------------------------------------------

    def _addr(self, s: str) -> bytes:
        b = self._addr_cache.get(s)
        if b is None:
            b = addr_bytes(s)
            if len(self._addr_cache) < 100_000:
                self._addr_cache[s] = b
        return b

    def _account_exists_raw(self, ed25519: bytes) -> bool:
        assert self.account_exists is not None
        return self.account_exists(StrKey.encode_ed25519_public_key(ed25519))

    def _next_nonce(self) -> int:
        self._nonce_counter += 1
        return deterministic_nonce(self._nonce_seed, self._nonce_counter)

    def _instance(self, contract: bytes, kind: str) -> dict[str, Any]:
        e = self._entries.get(instance_key(contract))
        if e is None or e.val["contract_kind"] != kind:
            raise ValueError(f"no {kind} contract deployed at that address")
        return e.val

    def _install(self, contract_id: str, inst: dict[str, Any], wasm: bytes | None, ledger_seq: int) -> None:
        with self._lock:
            ik = instance_key(ADDR_CONTRACT + StrKey.decode_contract(contract_id))
            if ik in self._entries:
                raise ValueError(f"contract {contract_id} is already deployed")
            live_until = ledger_seq + self.ttl.min_persistent - 1
            self._entries[ik] = Entry("instance", inst, live_until, ledger_seq)
            heapq.heappush(self._ttl_heap, (live_until, ik))
            if wasm is not None:
                ck = code_key(hashlib.sha256(wasm).digest())
                if ck not in self._entries:
                    self._entries[ck] = Entry("code", wasm, live_until, ledger_seq)
                    heapq.heappush(self._ttl_heap, (live_until, ck))

    def _derive_contract_id(self, deployer: str, salt_text: bytes) -> str:
        """A real contract id: sha256(HashIDPreimage CONTRACT_ID{networkID, FROM_ADDRESS{deployer, salt}})."""
        preimage = xdr.HashIDPreimage(
            type=xdr.EnvelopeType.ENVELOPE_TYPE_CONTRACT_ID,
            contract_id=xdr.HashIDPreimageContractID(
                network_id=xdr.Hash(self._network_id),
                contract_id_preimage=xdr.ContractIDPreimage(
                    type=xdr.ContractIDPreimageType.CONTRACT_ID_PREIMAGE_FROM_ADDRESS,
                    from_address=xdr.ContractIDPreimageFromAddress(
                        address=Address(deployer).to_xdr_sc_address(),
                        salt=xdr.Uint256(hashlib.sha256(salt_text).digest()),
                    ),
                ),
            ),
        )
        return StrKey.encode_contract(hashlib.sha256(preimage.to_xdr_bytes()).digest())


def _key_obj(k: bytes, known: dict[bytes, xdr.LedgerKey]) -> xdr.LedgerKey:
    obj = known.get(k)
    return obj if obj is not None else xdr.LedgerKey.from_xdr_bytes(k)
