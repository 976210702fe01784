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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from stellar_sdk import Address, Asset, Network, StrKey, xdr

from .auth import AuthContext, deterministic_nonce
from .contracts import billing, market
from .contracts import sac as sac_model
from .contracts.base import Ctx, addr_bytes
from .storage import (
    ACCOUNT_ENTRY_SIZE,
    ADDR_CONTRACT,
    PERSISTENT_TTL,
    T_ACCOUNT,
    T_TRUSTLINE,
    Entry,
    Staging,
    StorageTrap,
    code_key,
    enc_ledger_key,
    enc_scaddress,
    entry_from_json,
    entry_size,
    entry_to_json,
    instance_key,
    is_temporary,
    materialize,
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
    error_kind: str | None  # "trapped" | "resource_limit_exceeded" | None
    return_value: xdr.SCVal | None
    events: list[xdr.ContractEvent] = field(default_factory=list)  # only meaningful when ok
    read_only: list[xdr.LedgerKey] = field(default_factory=list)  # footprint the call touched
    read_write: list[xdr.LedgerKey] = field(default_factory=list)
    auth: list[xdr.SorobanAuthorizationEntry] = field(default_factory=list)  # record mode: entries to sign
    instructions: int = 0  # deterministic estimate for resource fees
    read_bytes: int = 0  # classic entries read (P23 "disk read" semantics: live Soroban state is free)
    write_bytes: int = 0  # XDR size of every entry written


def format_host_error(code: str, detail: str) -> str:
    """The shape real hosts give simulation errors: first line is the error, then the event log."""
    return (
        f"HostError: Error({code})\n\nEvent log (newest first):\n"
        f'   0: [Diagnostic Event] topics:[error, Error({code})], data:"{detail}"'
    )


class ContractHost:
    def __init__(self, network_passphrase: str) -> None:
        self.network_passphrase = network_passphrase
        self._network_id = Network(network_passphrase).network_id()
        self._entries: dict[bytes, Entry] = {}
        # One invocation at a time: a simulation must never see half of a committing apply.
        self._lock = threading.RLock()
        self._nonce_seed = hashlib.sha256(b"paygate-devnet-nonce:" + network_passphrase.encode()).digest()
        self._nonce_counter = 0
        self._addr_cache: dict[str, bytes] = {}
        # (liveUntil, key) of TEMPORARY entries, so expired ones (nonces) are evicted as in a real
        # ledger instead of accumulating forever in memory and in --state files.
        self._temp_heap: list[tuple[int, bytes]] = []
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
            st = Staging(self._entries, ledger_seq, None)
            old = st.get(key)
            st.put(key, kind, (old.val if old is not None else 0) + amount)
            st.commit()

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
        """CONTRACT_DATA / CONTRACT_CODE / TRUSTLINE entries; ACCOUNT keys belong to the RPC side."""
        kb = enc_ledger_key(key)
        with self._lock:
            e = self._entries.get(kb)
            if e is None:
                return None
            if is_temporary(kb) and e.live_until is not None and e.live_until < ledger_seq:
                return None  # an expired temporary entry is gone (e.g. a nonce past its expiration)
            return materialize(kb, e), e.live_until

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
    ) -> InvokeOutcome:
        """Run one host function. Never raises: any failure is an outcome with ok=False.

        Extensions of the fixed interface (both optional, defaults keep its behaviour):
        `use_upgraded_auth` (default True, like the SDK and RPC v27.1+) selects ADDRESS_V2 vs legacy
        ADDRESS credentials for record mode. `commit_if`, in apply mode, sees the successful outcome
        before anything is committed and can veto the commit (e.g. when the transaction declared
        fewer resources than the call used), so the caller needs no separate dry run.
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
                staging = Staging(self._entries, ledger_seq, fp_sets)
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
                    staging.touch_read(code_key(wasm_hash))  # a wasm contract's code is in its footprint
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
                    staging.commit()
                    self._track_and_evict_temporaries(staging, ledger_seq)
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
            read_bytes=self._read_bytes(staging, ro + rw),
            write_bytes=sum(entry_size(k, e) for k, e in staging.written_entries()),
        )

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

    # --- persistence ----------------------------------------------------------------------------------

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "version": SNAPSHOT_VERSION,
                "network_passphrase": self.network_passphrase,
                "nonce_counter": self._nonce_counter,
                "entries": [entry_to_json(k, e) for k, e in self._entries.items()],
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
            if is_temporary(k) and e.live_until is not None:
                host._temp_heap.append((e.live_until, k))
        heapq.heapify(host._temp_heap)
        return host

    # --- helpers ----------------------------------------------------------------------------------------

    def _addr(self, s: str) -> bytes:
        b = self._addr_cache.get(s)
        if b is None:
            b = addr_bytes(s)
            if len(self._addr_cache) < 100_000:
                self._addr_cache[s] = b
        return b

    def _track_and_evict_temporaries(self, staging: Staging, ledger_seq: int) -> None:
        heap = self._temp_heap
        for k, e in staging.written_entries():
            if e.live_until is not None and is_temporary(k):
                heapq.heappush(heap, (e.live_until, k))
        # Dead for every ledger a reader may still ask about (the latest closed one is ledger_seq - 1).
        horizon = ledger_seq - 1
        while heap and heap[0][0] < horizon:
            _, k = heapq.heappop(heap)
            e = self._entries.get(k)
            if e is not None and e.live_until is not None and e.live_until < horizon:
                del self._entries[k]

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
            live_until = ledger_seq + PERSISTENT_TTL - 1
            self._entries[ik] = Entry("instance", inst, live_until, ledger_seq)
            if wasm is not None:
                ck = code_key(hashlib.sha256(wasm).digest())
                if ck not in self._entries:
                    self._entries[ck] = Entry("code", wasm, live_until, ledger_seq)

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
