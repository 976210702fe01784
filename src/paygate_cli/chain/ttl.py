"""State archival on the chain side (docs/architecture.md §4 "State archival (TTL)"): the ledger keys
of what paygate keeps alive, their TTLs as the RPC reports them, and the footprint-operation calls
(ExtendFootprintTTL, RestoreFootprint) that chain/contracts.py build_signed turns into transactions.

What is kept: the billing contract's instance and code, the billing contract's USDC balance in the
SAC, and each account's balance entry in the billing contract (sandbox/devnet/contracts/billing.py:
persistent `Vec[Symbol("Balance"), Address]`). A G account's own USDC is a trustline: classic, no TTL."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stellar_sdk import xdr

from paygate_cli.chain.contracts import FootprintCall, _sc_address
from paygate_cli.errors import Unavailable

if TYPE_CHECKING:
    from paygate_cli.chain.rpc import ChainClient

# getLedgerEntries answers at most this many keys per request (stellar-rpc's limit).
MAX_KEYS_PER_READ = 200


def _data_key(contract: str, key: xdr.SCVal) -> xdr.LedgerKey:
    return xdr.LedgerKey(type=xdr.LedgerEntryType.CONTRACT_DATA, contract_data=xdr.LedgerKeyContractData(
        contract=_sc_address(contract), key=key, durability=xdr.ContractDataDurability.PERSISTENT))


def _balance_key(contract: str, holder: str) -> xdr.LedgerKey:
    """Persistent `Vec[Symbol("Balance"), Address(holder)]`: the SAC's layout for a contract's balance
    and the billing contract's for an account's."""
    return _data_key(contract, xdr.SCVal(type=xdr.SCValType.SCV_VEC, vec=xdr.SCVec([
        xdr.SCVal(type=xdr.SCValType.SCV_SYMBOL, sym=xdr.SCSymbol(b"Balance")),
        xdr.SCVal(type=xdr.SCValType.SCV_ADDRESS, address=_sc_address(holder))])))


def instance_key(contract: str) -> xdr.LedgerKey:
    """The contract's instance entry (persistent, key SCV_LEDGER_KEY_CONTRACT_INSTANCE)."""
    return _data_key(contract, xdr.SCVal(type=xdr.SCValType.SCV_LEDGER_KEY_CONTRACT_INSTANCE))


def code_key_of(wasm_hash: bytes) -> xdr.LedgerKey:
    return xdr.LedgerKey(type=xdr.LedgerEntryType.CONTRACT_CODE,
                         contract_code=xdr.LedgerKeyContractCode(hash=xdr.Hash(wasm_hash)))


def code_key(chain: ChainClient, contract: str) -> xdr.LedgerKey:
    """The contract's code entry, by the wasm hash its instance names now (read from the chain: an
    upgrade changes it). An archived instance still answers (getLedgerEntries returns it), so its
    code stays known. Unavailable when the instance cannot be read or names no wasm (a SAC)."""
    answer = chain.ledger_entries([instance_key(contract)])
    entries = answer.entries or []
    if not entries:
        raise Unavailable(f"the instance of contract {contract} is not on chain: its code entry is unknown",
                          msgid="ttl.no_instance")
    try:
        data = xdr.LedgerEntryData.from_xdr(entries[0].xdr)
        executable = data.contract_data.val.instance.executable
    except Exception as exc:  # foreign bytes: the node is outside paygate
        raise Unavailable(f"the instance of contract {contract} does not decode ({type(exc).__name__})",
                          msgid="rpc.malformed") from None
    if executable.type != xdr.ContractExecutableType.CONTRACT_EXECUTABLE_WASM or executable.wasm_hash is None:
        raise Unavailable(f"contract {contract} runs no wasm: it has no code entry", msgid="ttl.no_code")
    return code_key_of(executable.wasm_hash.hash)


def sac_balance_key(usdc: str, holder: str) -> xdr.LedgerKey:
    """A contract address's balance in the SAC (the billing contract's USDC). The SAC extends it to
    30 days itself when it is touched, but an idle one still archives."""
    return _balance_key(usdc, holder)


def account_balance_key(billing: str, account: str) -> xdr.LedgerKey:
    """An account's balance entry in the billing contract (never extended by the contract)."""
    return _balance_key(billing, account)


@dataclass(frozen=True)
class EntryTtl:
    """One entry as getLedgerEntries reports it. `live_until`: the last ledger it is live in (None when
    archived or absent); `archived`: in the hot archive (stellar-rpc answers liveUntilLedgerSeq 0, or
    a liveUntil already behind the latest ledger); `absent`: no such entry at all."""

    live_until: int | None
    archived: bool
    absent: bool


def _canonical(key: str | xdr.LedgerKey) -> str:
    if isinstance(key, str):
        return xdr.LedgerKey.from_xdr(key).to_xdr()
    return key.to_xdr()


def read_ttls(chain: ChainClient, keys: list[str] | list[xdr.LedgerKey]) -> dict[str, EntryTtl]:
    """{key as given (base64 LedgerKey XDR): EntryTtl} for every key asked, MAX_KEYS_PER_READ a request.
    A key the answer omits is absent (an expired temporary entry, or one never written). An answer
    that does not hold together is Unavailable (the node is outside paygate: read again later)."""
    wanted: dict[str, str] = {}  # canonical base64 -> as given
    for key in keys:
        given = key if isinstance(key, str) else key.to_xdr()
        wanted[_canonical(key)] = given
    found: dict[str, EntryTtl] = {}
    canonical = list(wanted)
    for start in range(0, len(canonical), MAX_KEYS_PER_READ):
        chunk = canonical[start:start + MAX_KEYS_PER_READ]
        answer = chain.ledger_entries([xdr.LedgerKey.from_xdr(k) for k in chunk])
        latest = int(answer.latest_ledger)
        for entry in answer.entries or []:
            try:
                key = _canonical(entry.key)
            except Exception:  # foreign bytes
                raise Unavailable("getLedgerEntries answered a key that does not decode",
                                  msgid="rpc.malformed") from None
            if key not in wanted:
                continue
            live_until = entry.live_until_ledger
            if live_until is None:
                raise Unavailable(f"getLedgerEntries answered no liveUntilLedgerSeq for {key[:40]}…",
                                  msgid="rpc.malformed")
            archived = int(live_until) == 0 or int(live_until) < latest
            found[wanted[key]] = EntryTtl(int(live_until) if int(live_until) > 0 else None, archived, False)
    for given in wanted.values():
        found.setdefault(given, EntryTtl(None, False, True))
    return found


def extend_call(keys: list[str], extend_to: int) -> FootprintCall:
    """ExtendFootprintTTL of `keys` (read-only footprint) to `extend_to` ledgers past the ledger it
    applies in; simulation narrows the footprint to the entries it will extend and prices the rent."""
    if not keys:
        raise ValueError("an extension needs at least one key")
    if extend_to <= 0:
        raise ValueError("extend_to must be a positive number of ledgers")
    return FootprintCall("extend", tuple(_checked(k) for k in keys), extend_to)


def restore_call(keys: list[str]) -> FootprintCall:
    """RestoreFootprint of `keys` (read-write footprint); simulation narrows it to the archived ones."""
    if not keys:
        raise ValueError("a restore needs at least one key")
    return FootprintCall("restore", tuple(_checked(k) for k in keys), None)


def _checked(key: str) -> str:
    """A base64 LedgerKey XDR, canonical (the form build_signed packs and the RPC answers)."""
    try:
        base64.b64decode(key, validate=True)
        return _canonical(key)
    except Exception:
        raise ValueError(f"not a base64 LedgerKey: {key[:40]!r}") from None
