"""Billing-contract bindings for the charge side: the `charge_batch` invocation, the resource check
that keeps a batch inside Soroban's per-transaction limits, and the `getEvents` reader + decoder
the observer uses. (A separate module from contracts.py so the funding side stays untouched.)"""

from __future__ import annotations

import base64
import functools
import re
import struct
from dataclasses import dataclass
from typing import Any

import requests
from stellar_sdk import Address, scval, xdr

from paygate_cli.chain.contracts import Invocation, SignedTransaction
from paygate_cli.chain.rpc import MAX_LEDGER, ChainClient, MalformedAnswer
from paygate_cli.errors import PaygateError, Unavailable

# Soroban per-transaction limits (the network's published values; the devnet enforces the same, docs/devnet.md).
MAX_FOOTPRINT_KEYS = 100
MAX_WRITE_ENTRIES = 50
CONTRACT_MAX_BATCH = 100


class BatchTooLarge(PaygateError):
    """The prepared batch would exceed a network resource limit; split it and try again."""

    msgid = "settlement.batch_too_large"


class RetentionGap(PaygateError):
    """The cursor is older than the RPC's oldest ledger: events in between may be lost."""

    msgid = "observer.retention_gap"


class ReadersBehind(PaygateError):
    """Every read endpoint that answered is behind the observer's position (its latest ledger is
    before the cursor's): nothing is lost, the nodes have not caught up. Wait, or read elsewhere."""

    msgid = "observer.readers_behind"


class _OutOfRange(Exception):
    """getEvents refused the position as outside the node's ledger range (either side of it)."""


def charge_batch(billing: str, operator: str, accounts: list[str], amounts: list[int],
                 charge_ids: list[bytes]) -> Invocation:
    """The `charge_batch` invocation, with the operator's authorisation: SOURCE_ACCOUNT credentials
    (the operator is the lane, the transaction's source) over exactly this call — the entry a
    recording simulation returns, so simulation runs in enforce mode and nothing is decoded back.

    Its three vectors are encoded straight to XDR bytes (a template per value type) and carried as
    EncodedSCVal, in the call and in its authorisation alike: a transaction is packed five times on
    its way out (simulation request, the hash signed, its hash again, the fee bump's hash, the
    envelope), and walking 2 x 3 x 42 values through the SDK's packers each time was most of
    settlement's CPU."""
    args = [
        scval.to_address(operator),
        EncodedSCVal(_vec(_address_xdr(a) for a in accounts)),
        EncodedSCVal(_vec(_i128_xdr(a) for a in amounts)),
        EncodedSCVal(_vec(_bytes_xdr(c) for c in charge_ids)),
    ]
    function = xdr.SorobanAuthorizedFunction(
        xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN,
        contract_fn=xdr.InvokeContractArgs(Address(billing).to_xdr_sc_address(), xdr.SCSymbol(b"charge_batch"), args))
    auth = xdr.SorobanAuthorizationEntry(
        credentials=xdr.SorobanCredentials(xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_SOURCE_ACCOUNT),
        root_invocation=xdr.SorobanAuthorizedInvocation(function=function, sub_invocations=[]))
    return Invocation(billing, "charge_batch", args, [auth])


class EncodedSCVal(xdr.SCVal):
    """An SCVal held as its XDR encoding: packing it copies the bytes. Its fields (type, vec, …) are
    decoded on first read, so code that inspects it sees an ordinary SCVal; a test holds the bytes
    equal to the SDK's own encoding of the same value."""

    def __init__(self, encoded: bytes) -> None:  # fields are decoded lazily (__getattr__)
        if len(encoded) % 4:
            raise ValueError("XDR is a whole number of 4-byte units")
        self.__dict__["_encoded"] = encoded

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_encoded":
            raise AttributeError(name)
        self.__dict__.update(xdr.SCVal.from_xdr_bytes(self.__dict__["_encoded"]).__dict__)
        return self.__dict__[name]

    def pack(self, packer: Any) -> None:
        encoded = self.__dict__["_encoded"]
        packer.pack_fopaque(len(encoded), encoded)  # fixed-length opaque of a 4-byte multiple: the bytes as they are

    def to_xdr_bytes(self) -> bytes:
        return self.__dict__["_encoded"]


_SCV_VEC = struct.pack(">iI", xdr.SCValType.SCV_VEC.value, 1)  # type, then the optional vec is present
_SCV_I128 = xdr.SCValType.SCV_I128.value
_SCV_BYTES = xdr.SCValType.SCV_BYTES.value
_U64 = (1 << 64) - 1


def _vec(items: Any) -> bytes:
    encoded = list(items)
    return _SCV_VEC + struct.pack(">I", len(encoded)) + b"".join(encoded)


@functools.lru_cache(maxsize=4096)
def _address_xdr(address: str) -> bytes:
    return scval.to_address(address).to_xdr_bytes()  # a few accounts recur across every batch


def _i128_xdr(amount: int) -> bytes:
    if not -(1 << 127) <= amount < 1 << 127:
        raise ValueError(f"amount {amount} does not fit an i128")
    return struct.pack(">iqQ", _SCV_I128, amount >> 64, amount & _U64)


def _bytes_xdr(value: bytes) -> bytes:
    padding = -len(value) % 4
    return struct.pack(">iI", _SCV_BYTES, len(value)) + value + b"\0" * padding


def claim_estimate() -> dict[str, int]:
    """Before simulating, the claim's footprint estimate as the limits its query applies to each
    prefix of candidates (queues/charges.CLAIM_SQL): each entry writes its charge-id entry, each
    distinct account its balance entry, so read-write keys = entries + distinct accounts (limit 50);
    the contract instance and code are read-only (total limit 100)."""
    return {"max_entries": CONTRACT_MAX_BATCH, "max_write": MAX_WRITE_ENTRIES, "read_only": 2,
            "max_keys": MAX_FOOTPRINT_KEYS}


def check_resources(signed: SignedTransaction, call: Invocation | None = None) -> None:
    """After simulation: the footprint the network will see, checked against its limits (simulation
    itself does not refuse an over-limit footprint; sendTransaction would, as txSOROBAN_INVALID).
    `call`, the invocation the transaction was built from, lets the footprint be counted without
    decoding the envelope (see _footprint_after_call)."""
    raw = base64.b64decode(signed.envelope_xdr)
    counts = _footprint_after_call(raw, call) if call is not None else None
    if counts is None:
        envelope = xdr.TransactionEnvelope.from_xdr_bytes(raw)
        inner = envelope.fee_bump.tx.inner_tx.v1.tx if envelope.fee_bump else envelope.v1.tx
        data = inner.ext.soroban_data
        if data is None:
            return
        counts = len(data.resources.footprint.read_only), len(data.resources.footprint.read_write)
    reads, writes = counts
    if writes > MAX_WRITE_ENTRIES or reads + writes > MAX_FOOTPRINT_KEYS:
        raise BatchTooLarge(f"footprint has {reads} read-only + {writes} read-write keys "
                            f"(limits {MAX_FOOTPRINT_KEYS} total, {MAX_WRITE_ENTRIES} read-write)")


_U32 = struct.Struct(">I")
_SIGNATURE_SIZE = 4 + 4 + 64  # DecoratedSignature: hint, then opaque<64> (length + ed25519 signature)


def _footprint_after_call(raw: bytes, call: Invocation) -> tuple[int, int] | None:
    """(read-only, read-write) key counts of the inner transaction's footprint, read without decoding
    the 2 x 3 x 42 values of a charge batch or the footprint's keys (decoding them cost as much as
    building the transaction).

    A one-operation contract call whose only authorisation is the source account's carries the call's
    InvokeContractArgs twice, back to back but for the auth header: the operation's, then
    [auth count = 1][credentials SOURCE_ACCOUNT][function CONTRACT_FN] and the root invocation's,
    [no sub-invocations], then the transaction's ext (v1) = SorobanTransactionData, the inner
    signatures, the fee bump's ext (v0) and its signatures, which must end the envelope exactly.
    Every one of those is checked, and the keys are only measured (_skip_ledger_key); anything else
    (another shape, an unexpected byte, a key kind not measured here) returns None and the caller
    decodes the whole envelope."""
    args = xdr.InvokeContractArgs(Address(call.contract).to_xdr_sc_address(),
                                  xdr.SCSymbol(call.function.encode()), call.args).to_xdr_bytes()
    first = raw.find(args)
    if first < 0:
        return None
    auth_header = _U32.pack(1) + _U32.pack(xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_SOURCE_ACCOUNT.value) + \
        _U32.pack(xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN.value)
    second = first + len(args) + len(auth_header)
    if raw[first + len(args):second] != auth_header or raw[second:second + len(args)] != args:
        return None
    position = second + len(args)
    if raw[position:position + 8] != _U32.pack(0) + _U32.pack(1):  # no sub-invocations; ext v1
        return None
    try:
        position += 8
        version = _U32.unpack_from(raw, position)[0]  # SorobanTransactionData.ext
        position += 4
        if version == 1:  # SorobanResourcesExtV0: archivedSorobanEntries<uint32>
            position += 4 + 4 * _U32.unpack_from(raw, position)[0]
        elif version != 0:
            return None
        counts = []
        for _ in range(2):  # footprint.readOnly, footprint.readWrite
            keys = _U32.unpack_from(raw, position)[0]
            position += 4
            for _ in range(keys):
                position = _skip_ledger_key(raw, position)
            counts.append(keys)
        position += 3 * 4 + 8  # instructions, diskReadBytes, writeBytes; resourceFee
        inner_signatures = _U32.unpack_from(raw, position)[0]
        position += 4 + inner_signatures * _SIGNATURE_SIZE
        if raw[position:position + 4] != _U32.pack(0):  # the fee bump's ext, v0
            return None
        outer_signatures = _U32.unpack_from(raw, position + 4)[0]
        if len(raw) != position + 8 + outer_signatures * _SIGNATURE_SIZE:
            return None
    except (struct.error, _NotMeasured):
        return None
    return counts[0], counts[1]


class _NotMeasured(Exception):
    pass


_FIXED_SCVAL_SIZE = {xdr.SCValType.SCV_BOOL.value: 4, xdr.SCValType.SCV_VOID.value: 0,
                     xdr.SCValType.SCV_ERROR.value: 8, xdr.SCValType.SCV_U32.value: 4, xdr.SCValType.SCV_I32.value: 4,
                     xdr.SCValType.SCV_U64.value: 8, xdr.SCValType.SCV_I64.value: 8,
                     xdr.SCValType.SCV_TIMEPOINT.value: 8, xdr.SCValType.SCV_DURATION.value: 8,
                     xdr.SCValType.SCV_U128.value: 16, xdr.SCValType.SCV_I128.value: 16,
                     xdr.SCValType.SCV_U256.value: 32, xdr.SCValType.SCV_I256.value: 32,
                     xdr.SCValType.SCV_LEDGER_KEY_CONTRACT_INSTANCE.value: 0,
                     xdr.SCValType.SCV_LEDGER_KEY_NONCE.value: 8}
_OPAQUE_SCVALS = {xdr.SCValType.SCV_BYTES.value, xdr.SCValType.SCV_STRING.value, xdr.SCValType.SCV_SYMBOL.value}
_SC_ADDRESS_SIZE = {xdr.SCAddressType.SC_ADDRESS_TYPE_ACCOUNT.value: 4 + 32,  # PublicKey: type, ed25519
                    xdr.SCAddressType.SC_ADDRESS_TYPE_CONTRACT.value: 32,
                    xdr.SCAddressType.SC_ADDRESS_TYPE_MUXED_ACCOUNT.value: 8 + 32,
                    xdr.SCAddressType.SC_ADDRESS_TYPE_CLAIMABLE_BALANCE.value: 4 + 32,
                    xdr.SCAddressType.SC_ADDRESS_TYPE_LIQUIDITY_POOL.value: 32}


def _skip_sc_address(raw: bytes, position: int) -> int:
    size = _SC_ADDRESS_SIZE.get(_U32.unpack_from(raw, position)[0])
    if size is None:
        raise _NotMeasured
    return position + 4 + size


def _skip_scval(raw: bytes, position: int, depth: int = 0) -> int:
    kind = _U32.unpack_from(raw, position)[0]
    position += 4
    if kind in _FIXED_SCVAL_SIZE:
        return position + _FIXED_SCVAL_SIZE[kind]
    if kind in _OPAQUE_SCVALS:
        return position + 4 + -(-_U32.unpack_from(raw, position)[0] // 4) * 4
    if kind == xdr.SCValType.SCV_ADDRESS.value:
        return _skip_sc_address(raw, position)
    if kind in (xdr.SCValType.SCV_VEC.value, xdr.SCValType.SCV_MAP.value) and depth < 8:
        present = _U32.unpack_from(raw, position)[0]
        position += 4
        if present == 0:
            return position
        items = _U32.unpack_from(raw, position)[0] * (2 if kind == xdr.SCValType.SCV_MAP.value else 1)
        position += 4
        for _ in range(items):
            position = _skip_scval(raw, position, depth + 1)
        return position
    raise _NotMeasured  # a contract instance, a deeper value: the full decode handles it


def _skip_ledger_key(raw: bytes, position: int) -> int:
    kind = _U32.unpack_from(raw, position)[0]
    position += 4
    if kind == xdr.LedgerEntryType.CONTRACT_DATA.value:  # contract, key, durability
        return _skip_scval(raw, _skip_sc_address(raw, position)) + 4
    if kind == xdr.LedgerEntryType.CONTRACT_CODE.value:  # hash
        return position + 32
    if kind == xdr.LedgerEntryType.ACCOUNT.value:  # PublicKey: type, ed25519
        return position + 4 + 32
    raise _NotMeasured


def is_resource_failure(message: str) -> bool:
    """A simulation error that a smaller batch would avoid (budget, events size, footprint)."""
    lowered = message.lower()
    return any(word in lowered for word in ("exceededlimit", "exceed", "resource", "footprint", "too large"))


# -- events -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RawEvent:
    id: str
    ledger: int
    tx_hash: str | None
    contract_id: str | None
    topic: list[str]
    value: str


@dataclass(frozen=True)
class EventsPage:
    events: list[RawEvent]
    cursor: str
    latest_ledger: int
    oldest_ledger: int


def get_events(chain: ChainClient, contract: str, *, cursor: str | None = None, start_ledger: int | None = None,
               limit: int = 1000) -> EventsPage:
    """One getEvents page for the billing contract (raw JSON: the observer decodes only what it
    needs), from the first read endpoint that can serve the position.

    A node that refuses the position is asked where its range is: only a node whose oldest ledger is
    past the position proves events may be lost (RetentionGap); a node whose latest ledger is before
    it is merely behind, so the next endpoint is tried, and when none can serve it
    yet ReadersBehind says "wait" — never a false alarm."""
    chain._guard("getEvents")
    params: dict[str, Any] = {"filters": [{"type": "contract", "contractIds": [contract]}],
                              "pagination": {"limit": limit, **({"cursor": cursor} if cursor else {})}}
    if cursor is None:
        params["startLedger"] = start_ledger
    session = _session(chain)

    def call(srv: Any) -> dict[str, Any]:
        answer = session.post(srv.server_url, json={"jsonrpc": "2.0", "id": 1, "method": "getEvents",
                                                     "params": params}, timeout=30)
        answer.raise_for_status()
        body = answer.json()
        if "error" in body:
            error = body["error"]
            message = str(error.get("message", ""))
            if error.get("code") == -32600 and "ledger range" in message:
                raise _OutOfRange(message)
            raise ValueError(f"getEvents error {error.get('code')}: {message}")
        return body["result"]

    def window(srv: Any) -> tuple[int, int]:
        health = srv.get_health()
        return int(health.oldest_ledger), int(health.latest_ledger)

    position = cursor_ledger(cursor) if cursor else int(start_ledger or 0)
    behind: list[str] = []
    gap: str | None = None
    unavailable: Unavailable | None = None
    result: EventsPage | None = None
    for url, srv in zip(chain.read_urls, chain.readers, strict=True):
        try:
            try:
                answer = chain._retrying("getEvents", lambda srv=srv: call(srv))
            except _OutOfRange as exc:
                oldest, latest = chain._retrying("getHealth", lambda srv=srv: window(srv))
                if position < oldest:
                    gap = f"{_host(url)} keeps ledgers {oldest}-{latest} only ({exc})"
                else:
                    behind.append(f"{_host(url)} at ledger {latest}")
                continue
        except Unavailable as exc:
            unavailable = exc
            continue
        try:
            page = _page_from(answer, cursor)
        except MalformedAnswer as exc:  # an answer that does not hold together: as if none had come
            unavailable = Unavailable(f"getEvents from {_host(url)}: {exc}"[:500], msgid="rpc.malformed")
            continue
        if page.latest_ledger < position:  # answered, but from behind the position: not usable
            behind.append(f"{_host(url)} at ledger {page.latest_ledger}")
            continue
        result = page
        break
    if result is None:
        if gap is not None:
            raise RetentionGap(f"getEvents refused the observer's position ledger {position}: {gap}")
        if behind:
            raise ReadersBehind(f"every read endpoint that answered is behind the observer's position ledger "
                                f"{position} ({', '.join(behind)}): waiting for them to catch up")
        assert unavailable is not None
        raise unavailable
    return result


_CURSOR = re.compile(r"^[0-9]{19}-[0-9]{10}$")  # what observer_cursor's CHECK accepts


def _page_from(answer: Any, cursor: str | None) -> EventsPage:
    """A getEvents result, validated (an RPC node is outside paygate): the page's shape, a cursor the
    observer can store that does not move backwards, ledgers that agree with each other. A single odd
    event is not refused here (the observer quarantines it); a page that does not hold together is."""
    if not isinstance(answer, dict):
        raise MalformedAnswer("getEvents result is not an object")
    latest, oldest = answer.get("latestLedger"), answer.get("oldestLedger")
    for name, value in (("latestLedger", latest), ("oldestLedger", oldest)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LEDGER:
            raise MalformedAnswer(f"getEvents {name} {str(value)[:40]!r} is not a ledger number")
    if oldest > latest:
        raise MalformedAnswer(f"getEvents oldestLedger {oldest} is past its latestLedger {latest}")
    next_cursor = answer.get("cursor")
    if not isinstance(next_cursor, str) or not _CURSOR.match(next_cursor):
        raise MalformedAnswer(f"getEvents cursor {str(next_cursor)[:40]!r} is not a cursor")
    if cursor is not None and next_cursor < cursor:
        raise MalformedAnswer(f"getEvents cursor {next_cursor} is before the position {cursor}")
    listed = answer.get("events") or []
    if not isinstance(listed, list):
        raise MalformedAnswer("getEvents events is not a list")
    events = []
    for item in listed:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
            raise MalformedAnswer("getEvents returned an event without an id")
        ledger = item.get("ledger")
        if isinstance(ledger, bool) or not isinstance(ledger, int) or not 0 < ledger <= latest:
            raise MalformedAnswer(f"getEvents event {item['id'][:40]!r} has ledger {str(ledger)[:40]!r}")
        topic = item.get("topic") or []
        events.append(RawEvent(item["id"][:200], ledger, _opt_text(item.get("txHash")),
                               _opt_text(item.get("contractId")),
                               [str(t) for t in topic] if isinstance(topic, list) else [str(topic)],
                               item.get("value") if isinstance(item.get("value"), str) else ""))
    return EventsPage(events, next_cursor, latest, oldest)


def _opt_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _host(url: str) -> str:
    """Only the host of an endpoint in messages: its path or query may carry a provider's API key."""
    from paygate_cli.endpoints import endpoint_name

    return endpoint_name(url)


def _session(chain: ChainClient) -> requests.Session:
    session = getattr(chain, "_events_session", None)
    if session is None:
        session = requests.Session()
        chain._events_session = session  # type: ignore[attr-defined]
    return session


def cursor_ledger(cursor: str) -> int:
    """The ledger a cursor points into: TOID(ledger, tx, op) >> 32 (the TOID layout of stellar-rpc's event ids)."""
    return int(cursor.split("-")[0]) >> 32


@dataclass(frozen=True)
class BillingEvent:
    kind: str  # charge | charge_failed | credit
    account: str
    amount: int
    ref: bytes  # charge id (charge, charge_failed) or deposit tx hash (credit)
    reason: str | None = None


class UndecodableEvent(ValueError):
    pass


def decode_billing_event(event: RawEvent) -> BillingEvent:
    """Decode from the verified event itself (never from call arguments). Anything that is not
    exactly one of the three known shapes raises UndecodableEvent with the reason."""
    try:
        topics = [scval.to_native(xdr.SCVal.from_xdr(t)) for t in event.topic]
        value = scval.to_native(xdr.SCVal.from_xdr(event.value))
    except Exception as exc:  # any decode failure is poison, never a crash
        raise UndecodableEvent(f"topic/value is not valid SCVal XDR ({type(exc).__name__})") from None
    if len(topics) != 2 or not isinstance(topics[0], str) or not isinstance(topics[1], Address):
        raise UndecodableEvent(f"unexpected topics shape {_short(topics)}")
    kind, account = topics[0], topics[1].address
    if kind not in ("charge", "charge_failed", "credit"):
        raise UndecodableEvent(f"unknown billing event type {kind!r}")
    expected = 3 if kind == "charge_failed" else 2
    if not isinstance(value, list) or len(value) != expected:
        raise UndecodableEvent(f"{kind} value is not a Vec of {expected}: {_short(value)}")
    amount, ref = value[0], value[1]
    if not isinstance(amount, int) or isinstance(amount, bool) or not isinstance(ref, bytes) or len(ref) != 32:
        raise UndecodableEvent(f"{kind} value is not [i128, BytesN<32>, ...]: {_short(value)}")
    reason = None
    if kind == "charge_failed":
        reason = value[2] if isinstance(value[2], str) else str(value[2])
    return BillingEvent(kind, account, int(amount), ref, reason)


def _short(value: Any) -> str:
    return repr(value)[:200]
