"""A lane's sequence number on chain, read without stellar-sdk: the one implementation of "read a
lane's sequence" (ChainClient.account_sequence runs it over its pooled sessions; `nonce-inspect
--lane` runs it over urllib, so a cold command never imports stellar-sdk, ~300 ms of CPU).

What stellar-sdk did for this read is done here by hand, and no more loosely or strictly than it:
- the G... address to its 32-byte key (StrKey: base32, version byte, CRC16-XModem checksum);
- the ACCOUNT LedgerKey as base64 XDR for getLedgerEntries, as docs/devnet.md (RPC methods) shows;
- the returned LedgerEntryData read as an AccountEntry, byte for byte as the SDK's generated decoder
  reads it (stellar_sdk/xdr/account_entry.py and the types it nests): every field is walked, trailing
  bytes refuse, and only the owner and seqNum are kept. tests/chain/test_account_sequence.py compares the
  two decoders on real entries and on mangled ones.

The read policy (what ChainClient.account_sequence always did): the first read endpoint that answers,
each tried with bounded retries; "not found" proves a lane missing only by a quorum of caught-up
read hosts (LaneMissing, 78), otherwise the lane is "not visible yet" (LaneNotVisible, 69); an
answer that does not hold together is no answer (Unavailable, 69)."""

from __future__ import annotations

import base64
import binascii
import json
import random
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from paygate_cli.errors import ConfigError, Unavailable


class MalformedAnswer(ValueError):
    """An RPC answer that does not hold together (an RPC node is outside paygate): the endpoint's
    view is unknown, exactly as if no answer had come."""


class LaneMissing(ConfigError):
    """A lane's account is proven absent (a quorum of caught-up read hosts): the lane, not the run,
    is broken. The engine fences it and moves the work to another lane."""

    msgid = "rpc.lane_missing"


class LaneNotVisible(Unavailable):
    """A lane account was "not found" by read nodes that are not proven caught up: a lagging read
    ("not there yet"), never a configuration error. Retry later (exit 69 if it ends the run)."""

    msgid = "rpc.lane_not_visible"


class NoAnswer(Exception):
    """The request may or may not have reached the node: no answer, or one that is not JSON-RPC."""


class RpcErrorAnswer(Exception):
    """The node answered with a JSON-RPC `error` member."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"RPC error {code}: {message}"[:300])
        self.code = code


# -- one JSON-RPC endpoint, whatever carries the bytes ----------------------------------------------

# (method, params) -> the answer's `result` member; raises NoAnswer, RpcErrorAnswer or MalformedAnswer.
PostFn = Callable[[str, dict[str, Any]], Any]


@dataclass(frozen=True)
class Endpoint:
    url: str
    post: PostFn


def result_of(status: int, body: bytes | str) -> Any:
    """The `result` of a JSON-RPC answer body, read as the SDK reads it: a JSON body is the answer
    whatever the HTTP status; a body that is not JSON is no answer."""
    try:
        document = json.loads(body)
    except ValueError:
        raise NoAnswer(f"HTTP {status}: the answer is not JSON") from None
    if not isinstance(document, dict):
        raise NoAnswer(f"HTTP {status}: the answer is not a JSON-RPC object")
    error = document.get("error")
    if error is not None:
        if not isinstance(error, dict) or isinstance(error.get("code"), bool) or not isinstance(error.get("code"), int):
            raise NoAnswer(f"HTTP {status}: the answer's error member is not a JSON-RPC error")
        raise RpcErrorAnswer(error["code"], str(error.get("message") or ""))
    if document.get("result") is None:
        raise MalformedAnswer("the answer has neither result nor error")
    return document["result"]


def request_body(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


def urllib_endpoint(url: str, timeout: float) -> Endpoint:
    """An endpoint over urllib (no requests, no stellar-sdk): proxies from the environment ignored,
    credentials in the URL sent as basic auth, as ChainClient's sessions do."""
    from paygate_cli.endpoints import split_credentials

    target, headers = split_credentials(url)

    def post(method: str, params: dict[str, Any]) -> Any:
        import http.client
        import urllib.error
        import urllib.request

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        request = urllib.request.Request(target, data=json.dumps(request_body(method, params)).encode(),
                                         headers=headers, method="POST")
        try:
            try:
                with opener.open(request, timeout=max(0.1, timeout)) as answer:
                    status, body = answer.status, answer.read()
            except urllib.error.HTTPError as exc:  # a JSON body is still the answer (as the SDK reads it)
                status, body = exc.code, exc.read()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            from paygate_cli.endpoints import redact_urls

            raise NoAnswer(f"{type(exc).__name__}: {redact_urls(str(exc))}"[:300]) from None
        return result_of(status, body)

    return Endpoint(url, post)


# -- answers' fields, as the SDK's models take them ----------------------------------------------------

_LAX_INT = re.compile(r"\s*[+-]?[0-9]+\s*")


def _lax_int(value: Any, what: str) -> int:
    """An integer field as pydantic's lax mode (the SDK's models) accepts it."""
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _LAX_INT.fullmatch(value):
        return int(value)
    raise MalformedAnswer(f"{what} {str(value)[:40]!r} is not an integer")


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise MalformedAnswer(f"{what} is not a string")
    return value


@dataclass(frozen=True)
class EntriesAnswer:
    entries: list[str]  # each entry's `xdr` (base64 LedgerEntryData), in request order
    latest_ledger: int
    last_modified: tuple[int, ...] = ()  # each entry's lastModifiedLedgerSeq, in the same order


def entries_answer(result: Any) -> EntriesAnswer:
    """A getLedgerEntries result with the fields GetLedgerEntriesResponse requires."""
    if not isinstance(result, dict):
        raise MalformedAnswer("getLedgerEntries result is not an object")
    latest = _lax_int(result.get("latestLedger"), "getLedgerEntries latestLedger")
    listed = result.get("entries")
    if listed is None:
        return EntriesAnswer([], latest)
    if not isinstance(listed, list):
        raise MalformedAnswer("getLedgerEntries entries is not a list")
    xdrs, modified = [], []
    for item in listed:
        if not isinstance(item, dict):
            raise MalformedAnswer("getLedgerEntries entry is not an object")
        _str(item.get("key"), "getLedgerEntries entry key")
        modified.append(_lax_int(item.get("lastModifiedLedgerSeq"), "getLedgerEntries lastModifiedLedgerSeq"))
        if item.get("liveUntilLedgerSeq") is not None:
            _lax_int(item["liveUntilLedgerSeq"], "getLedgerEntries liveUntilLedgerSeq")
        xdrs.append(_str(item.get("xdr"), "getLedgerEntries entry xdr"))
    return EntriesAnswer(xdrs, latest, tuple(modified))


def latest_ledger_of(result: Any) -> int:
    """The `sequence` of a getLatestLedger result with the fields GetLatestLedgerResponse requires."""
    if not isinstance(result, dict):
        raise MalformedAnswer("getLatestLedger result is not an object")
    _str(result.get("id"), "getLatestLedger id")
    for name in ("protocolVersion", "closeTime"):
        _lax_int(result.get(name), f"getLatestLedger {name}")
    for name in ("headerXdr", "metadataXdr"):
        _str(result.get(name), f"getLatestLedger {name}")
    return _lax_int(result.get("sequence"), "getLatestLedger sequence")


# -- StrKey and XDR -----------------------------------------------------------------------------------

_ACCOUNT_VERSION = 6 << 3  # StrKey version byte of an ed25519 public key: "G"


def account_public_key(address: str) -> bytes:
    """The 32-byte ed25519 key of a G... address; ValueError for anything else (as the SDK's
    Keypair.from_public_key refuses it)."""
    try:
        raw = base64.b32decode(address.encode("ascii") + b"=" * (-len(address) % 8))
    except (UnicodeError, binascii.Error, AttributeError):
        raise ValueError(f"{str(address)[:60]!r} is not a G... account address") from None
    if len(raw) != 35 or raw[0] != _ACCOUNT_VERSION or struct.pack("<H", binascii.crc_hqx(raw[:33], 0)) != raw[33:]:
        raise ValueError(f"{address[:60]!r} is not a G... account address (version, length or checksum)")
    return raw[1:33]


def account_address(public_key: bytes) -> str:
    payload = bytes([_ACCOUNT_VERSION]) + public_key
    return base64.b32encode(payload + struct.pack("<H", binascii.crc_hqx(payload, 0))).decode().rstrip("=")


def account_key_xdr(address: str) -> str:
    """The base64 XDR LedgerKey of an account: type ACCOUNT (0), AccountID = PUBLIC_KEY_TYPE_ED25519 (0)."""
    return base64.b64encode(struct.pack(">ii", 0, 0) + account_public_key(address)).decode()


_ENTRY_TYPES = ("ACCOUNT", "TRUSTLINE", "OFFER", "DATA", "CLAIMABLE_BALANCE", "LIQUIDITY_POOL", "CONTRACT_DATA",
                "CONTRACT_CODE", "CONFIG_SETTING", "TTL")  # LedgerEntryType, by value


class _XdrReader:
    """Reads as xdrlib3's Unpacker does (which the SDK uses): padding is skipped, not checked."""

    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def take(self, n: int) -> bytes:
        end = self.pos + (n + 3) // 4 * 4
        if end > len(self.buf):
            raise EOFError
        data, self.pos = self.buf[self.pos:self.pos + n], end
        return data

    def u32(self) -> int:
        return int.from_bytes(self.take(4), "big")

    def i32(self) -> int:
        return int.from_bytes(self.take(4), "big", signed=True)

    def i64(self) -> int:
        return int.from_bytes(self.take(8), "big", signed=True)

    def var_opaque(self, limit: int) -> bytes:
        n = self.u32()
        if n > limit:
            raise ValueError("opaque longer than its bound")
        return self.take(n)

    def account_id(self) -> bytes:
        if self.i32() != 0:  # PublicKeyType has one member: PUBLIC_KEY_TYPE_ED25519
            raise ValueError("unknown public key type")
        return self.take(32)

    def array_length(self) -> int:
        n = self.u32()
        if n > len(self.buf) - self.pos:  # the SDK refuses a length beyond the bytes left
            raise ValueError("array longer than the input")
        return n


def _account_entry(r: _XdrReader) -> tuple[bytes, int, tuple[int, int] | None]:
    """AccountEntry (Stellar-ledger-entries.x), every field walked: (owner key, seqNum, and
    (seqLedger, seqTime) when the entry carries AccountEntryExtensionV3, else None)."""
    owner = r.account_id()
    r.i64()  # balance
    seq = r.i64()
    r.u32()  # numSubEntries
    if r.u32():  # inflationDest: optional (any non-zero flag is "present", as xdrlib3 reads it)
        r.account_id()
    r.u32()  # flags
    r.var_opaque(32)  # homeDomain string32
    r.take(4)  # thresholds
    for _ in range(r.array_length()):  # signers
        key_type = r.i32()
        if key_type not in (0, 1, 2, 3):  # ED25519, PRE_AUTH_TX, HASH_X, ED25519_SIGNED_PAYLOAD
            raise ValueError("unknown signer key type")
        r.take(32)
        if key_type == 3:
            r.var_opaque(64)  # the signed payload
        r.u32()  # weight
    v = r.i32()  # AccountEntry.ext
    seq_at: tuple[int, int] | None = None
    if v == 1:  # AccountEntryExtensionV1: liabilities, then its own ext
        r.i64()
        r.i64()
        v = r.i32()
        if v == 2:  # AccountEntryExtensionV2
            r.u32()  # numSponsored
            r.u32()  # numSponsoring
            for _ in range(r.array_length()):  # signerSponsoringIDs: optional AccountIDs
                if r.u32():
                    r.account_id()
            v = r.i32()
            if v == 3:  # AccountEntryExtensionV3: ExtensionPoint, seqLedger, seqTime
                if r.i32() != 0:
                    raise ValueError("unknown ExtensionPoint")
                seq_at = (r.u32(), int.from_bytes(r.take(8), "big"))
            elif v != 0:
                raise ValueError("unknown AccountEntryExtensionV2 ext")
        elif v != 0:
            raise ValueError("unknown AccountEntryExtensionV1 ext")
    elif v != 0:
        raise ValueError("unknown AccountEntry ext")
    return owner, seq, seq_at


def decode_account_seq(entry_xdr: Any, address: str | None = None) -> int:
    """The sequence number in an ACCOUNT ledger entry (base64 LedgerEntryData, as getLedgerEntries
    returns it), of `address` when given. MalformedAnswer for anything else."""
    return decode_account(entry_xdr, address)[0]


def decode_account(entry_xdr: Any, address: str | None = None) -> tuple[int, tuple[int, int] | None]:
    """decode_account_seq, with the entry's (seqLedger, seqTime) when it carries them (ext v3: the
    ledger and close time at which the sequence number last changed), else None."""
    owner, seq, seq_at = _decode_account_entry(entry_xdr)
    if address is not None and owner != account_public_key(address):
        raise MalformedAnswer(f"ledger entry is the account {account_address(owner)}, not {address}")
    return seq, seq_at


def _decode_account_entry(entry_xdr: Any) -> tuple[bytes, int, tuple[int, int] | None]:
    """(owner key, seqNum, (seqLedger, seqTime) or None) of an ACCOUNT ledger entry; MalformedAnswer
    for anything else."""
    try:
        reader = _XdrReader(base64.b64decode(entry_xdr.encode()))  # lenient base64, as the SDK's from_xdr
        entry_type = reader.i32()
        if not 0 <= entry_type < len(_ENTRY_TYPES):
            raise ValueError("unknown ledger entry type")
        if entry_type != 0:
            raise MalformedAnswer(f"ledger entry is a {_ENTRY_TYPES[entry_type]}, not an account")
        owner, seq, seq_at = _account_entry(reader)
        if reader.pos != len(reader.buf):
            raise ValueError("trailing bytes")
    except MalformedAnswer:
        raise
    except Exception as exc:  # any decode failure of foreign bytes: not an account entry
        raise MalformedAnswer(f"ledger entry does not decode ({type(exc).__name__})") from None
    if seq < 0:
        raise MalformedAnswer(f"account sequence {seq} is negative")
    return owner, seq, seq_at


# -- the read policy ----------------------------------------------------------------------------------

_TRANSIENT_RPC_CODES = (-32603, -32001)  # internal error / over the processing limit


def _retrying(what: str, call: Callable[[], Any], attempts: int) -> Any:
    """`call` with bounded retries of what may pass (no answer, a garbled one, a busy node), waiting
    as ChainClient._retrying does (tenacity's wait_random_exponential(multiplier=0.1, max=1)). Every
    failure that remains is Unavailable: this endpoint's view is unknown."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except RpcErrorAnswer as exc:
            if exc.code not in _TRANSIENT_RPC_CODES or attempt == attempts:
                raise Unavailable(f"Stellar RPC answered {what} with {exc}"[:500], msgid="rpc.error") from None
        except (NoAnswer, MalformedAnswer) as exc:
            if attempt == attempts:
                raise Unavailable(f"Stellar RPC unavailable for {what}: {type(exc).__name__}: {exc}"[:500],
                                  msgid="rpc.unavailable") from None
        time.sleep(random.uniform(0, min(1.0, 0.1 * 2 ** (attempt - 1))))
    raise AssertionError("unreachable")


def _host(url: str) -> str:
    from paygate_cli.endpoints import endpoint_name

    return endpoint_name(url)


def read_account_sequence(address: str, *, write: Endpoint, readers: list[Endpoint],
                          guard: Callable[[str], None]) -> int:
    """The account's sequence number from the first read endpoint that answers (an ordinary read:
    allocation and inspection; decisions use ChainClient.probe). `readers` are the distinct read
    hosts; `guard` is docs/architecture.md §1 rule 2's check, run before any network call."""
    guard("getLedgerEntries")
    params = {"keys": [account_key_xdr(address)]}
    last: Unavailable | None = None
    for reader in readers:
        try:
            answer = _retrying("getLedgerEntries",
                               lambda reader=reader: entries_answer(reader.post("getLedgerEntries", params)), 3)
            break
        except Unavailable as exc:
            last = exc
    else:
        assert last is not None
        raise last
    if not answer.entries:
        return _account_not_found(address, params, write, readers)
    try:
        return decode_account_seq(answer.entries[0], address)
    except MalformedAnswer as exc:  # the node's answer is unusable: like no answer at all
        raise Unavailable(f"Stellar RPC answered getLedgerEntries for {address} with {exc}"[:500],
                          msgid="rpc.malformed") from None


def _account_not_found(address: str, params: dict[str, Any], write: Endpoint, readers: list[Endpoint]) -> int:
    """One node said "no such account". A lagging node says that about a brand-new lane,
    so it proves nothing by itself: the lane is missing (78) only when a majority of the distinct
    read hosts say so from at least the highest ledger any endpoint admits to — read before the
    entries, and vouched for by two hosts or more (one node cannot tell that it lags, so under the
    single-endpoint development override a lane is never proven missing). Otherwise the read is
    "not visible yet" (LaneNotVisible, transient)."""
    reference, hosts = 0, set()
    for endpoint in [write, *readers]:
        try:
            seen = _retrying("getLatestLedger",
                             lambda e=endpoint: latest_ledger_of(e.post("getLatestLedger", {})), 2)
        except Unavailable:
            continue
        reference = max(reference, seen)
        hosts.add(_host(endpoint.url))
    absent, views = 0, []
    for endpoint in readers:
        try:
            answer = _retrying("getLedgerEntries",
                               lambda e=endpoint: entries_answer(e.post("getLedgerEntries", params)), 2)
        except Unavailable:
            views.append(f"{_host(endpoint.url)} did not answer")
            continue
        if answer.entries:
            try:
                return decode_account_seq(answer.entries[0], address)  # it exists: this node has caught up
            except MalformedAnswer as exc:
                views.append(f"{_host(endpoint.url)}: {exc}"[:200])
                continue
        if answer.latest_ledger >= reference:
            absent += 1
            views.append(f"{_host(endpoint.url)} at ledger {answer.latest_ledger}: not found")
        else:
            views.append(f"{_host(endpoint.url)} at ledger {answer.latest_ledger}: behind ledger {reference}")
    seen_by = f"({'; '.join(views)})"
    if len(hosts) >= 2 and absent >= len(readers) // 2 + 1:
        raise LaneMissing(f"lane {address} does not exist on chain: not found by {absent} of "
                          f"{len(readers)} read endpoints caught up to ledger {reference} {seen_by}")
    raise LaneNotVisible(f"lane {address} is not visible on chain yet {seen_by}: the read nodes may lag; "
                         f"retrying later (if it persists, create the account or remove the lane)"[:500])


@dataclass(frozen=True)
class AccountView:
    """One read endpoint's view of an account, for a decision that needs a quorum (a lane's chain
    sequence against the journal's: journal/engine.py prepare)."""

    endpoint: str
    seq: int | None = None
    seq_ledger: int | None = None  # AccountEntryExtensionV3 seqLedger: where the sequence last changed
    seq_time: int | None = None  # ... and that ledger's close time (None: the entry has no ext v3)
    last_modified: int | None = None  # the entry's lastModifiedLedgerSeq (a bound when there is no ext v3)
    latest_ledger: int | None = None
    error: str | None = None  # no usable answer from this endpoint ("not found" included)


def read_account_views(address: str, *, readers: list[Endpoint], guard: Callable[[str], None]
                       ) -> list[AccountView]:
    """The account as each read endpoint (one per distinct host) sees it, each judged on its own: an
    endpoint that does not answer, answers garbled or does not know the account has an `error` and
    counts for nothing."""
    guard("getLedgerEntries")
    params = {"keys": [account_key_xdr(address)]}
    views = []
    for reader in readers:
        try:
            answer = _retrying("getLedgerEntries",
                               lambda reader=reader: entries_answer(reader.post("getLedgerEntries", params)), 2)
        except Unavailable as exc:
            views.append(AccountView(reader.url, error=str(exc)[:300]))
            continue
        if not answer.entries:
            views.append(AccountView(reader.url, latest_ledger=answer.latest_ledger, error="not found"))
            continue
        try:
            seq, seq_at = decode_account(answer.entries[0], address)
        except MalformedAnswer as exc:
            views.append(AccountView(reader.url, latest_ledger=answer.latest_ledger, error=str(exc)[:300]))
            continue
        modified = answer.last_modified[0] if answer.last_modified else None
        views.append(AccountView(reader.url, seq, seq_at[0] if seq_at else None, seq_at[1] if seq_at else None,
                                 modified, answer.latest_ledger))
    return views


# getLedgerEntries takes at most 200 keys a request (Stellar RPC's limit).
ENTRIES_PER_REQUEST = 200


def read_many_account_views(addresses: list[str], *, readers: list[Endpoint], guard: Callable[[str], None]
                            ) -> dict[str, list[AccountView]]:
    """read_account_views for many accounts at once: one getLedgerEntries per read endpoint (per 200
    accounts), each endpoint's answer judged on its own exactly as there. The answer lists the
    entries it found in any order, so each is matched to its account by the owner it names."""
    guard("getLedgerEntries")
    views: dict[str, list[AccountView]] = {address: [] for address in addresses}
    wanted = {account_public_key(address): address for address in addresses}
    for start in range(0, len(addresses), ENTRIES_PER_REQUEST):
        chunk = addresses[start:start + ENTRIES_PER_REQUEST]
        params = {"keys": [account_key_xdr(address) for address in chunk]}
        for reader in readers:
            try:
                answer = _retrying("getLedgerEntries",
                                   lambda reader=reader, params=params: entries_answer(
                                       reader.post("getLedgerEntries", params)), 2)
            except Unavailable as exc:
                for address in chunk:
                    views[address].append(AccountView(reader.url, error=str(exc)[:300]))
                continue
            seen: dict[str, AccountView] = {}
            try:
                for index, entry in enumerate(answer.entries):
                    owner, seq, seq_at = _decode_account_entry(entry)
                    address = wanted.get(owner)
                    if address not in chunk or address in seen:
                        raise MalformedAnswer(f"ledger entry {index} is an account this request did not ask for")
                    modified = answer.last_modified[index] if index < len(answer.last_modified) else None
                    seen[address] = AccountView(reader.url, seq, seq_at[0] if seq_at else None,
                                                seq_at[1] if seq_at else None, modified, answer.latest_ledger)
            except MalformedAnswer as exc:  # one garbled entry: this endpoint's whole answer is unusable
                for address in chunk:
                    views[address].append(AccountView(reader.url, latest_ledger=answer.latest_ledger,
                                                      error=str(exc)[:300]))
                continue
            for address in chunk:
                views[address].append(seen.get(address) or AccountView(reader.url, latest_ledger=answer.latest_ledger,
                                                                       error="not found"))
    return views


def lane_sequence(settings: Any, address: str, guard: Callable[[str], None]) -> int:
    """read_account_sequence over urllib, for commands that must start cold (no stellar-sdk, no
    requests): the same endpoints as ChainClient (one vote per distinct read host)."""
    from paygate_cli.settings import distinct_read_urls

    if not settings.rpc_url:
        raise ConfigError("no Stellar RPC configured: set PAYGATE_RPC_URL")
    timeout = float(settings.rpc_timeout)
    readers = [urllib_endpoint(url, timeout) for url in distinct_read_urls(list(settings.rpc_read_urls),
                                                                          settings.rpc_url)]
    return read_account_sequence(address, write=urllib_endpoint(settings.rpc_url, timeout), readers=readers,
                                 guard=guard)


def many_lane_views(settings: Any, addresses: list[str], guard: Callable[[str], None]
                    ) -> dict[str, list[AccountView]]:
    """read_many_account_views over urllib (no stellar-sdk: a recovery tick that only compares stays
    cold), one vote per distinct read host, as ChainClient counts them."""
    from paygate_cli.settings import distinct_read_urls

    if not settings.rpc_url:
        raise ConfigError("no Stellar RPC configured: set PAYGATE_RPC_URL")
    timeout = float(settings.rpc_timeout)
    readers = [urllib_endpoint(url, timeout) for url in distinct_read_urls(list(settings.rpc_read_urls),
                                                                          settings.rpc_url)]
    return read_many_account_views(addresses, readers=readers, guard=guard)
