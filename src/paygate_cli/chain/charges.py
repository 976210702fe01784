"""Billing-contract bindings for the charge side: the `charge_batch` invocation, the resource check
that keeps a batch inside Soroban's per-transaction limits, and the `getEvents` reader + decoder
the observer uses. (A separate module from contracts.py so the funding side stays untouched.)"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import requests
from stellar_sdk import Address, scval, xdr

from paygate_cli.chain.contracts import Invocation, SignedTransaction
from paygate_cli.chain.rpc import MAX_LEDGER, ChainClient, MalformedAnswer
from paygate_cli.errors import PaygateError, Unavailable

# Soroban per-transaction limits (reference/stellar.md §2.5; the devnet enforces the same values).
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
    return Invocation(billing, "charge_batch", [
        scval.to_address(operator),
        scval.to_vec([scval.to_address(a) for a in accounts]),
        scval.to_vec([scval.to_int128(a) for a in amounts]),
        scval.to_vec([scval.to_bytes(c) for c in charge_ids]),
    ], [])


def fits_estimate(entries: int, distinct_accounts: int) -> bool:
    """Before simulating: each entry writes its charge-id entry, each distinct account its balance
    entry, so read-write keys = entries + distinct accounts (limit 50); the contract instance and
    code are read-only (total limit 100)."""
    return (entries <= CONTRACT_MAX_BATCH and entries + distinct_accounts <= MAX_WRITE_ENTRIES
            and entries + distinct_accounts + 2 <= MAX_FOOTPRINT_KEYS)


def check_resources(signed: SignedTransaction) -> None:
    """After simulation: the footprint the network will see, checked against its limits (simulation
    itself does not refuse an over-limit footprint; sendTransaction would, as txSOROBAN_INVALID)."""
    envelope = xdr.TransactionEnvelope.from_xdr(signed.envelope_xdr)
    inner = envelope.fee_bump.tx.inner_tx.v1.tx if envelope.fee_bump else envelope.v1.tx
    data = inner.ext.soroban_data
    if data is None:
        return
    footprint = data.resources.footprint
    reads, writes = len(footprint.read_only), len(footprint.read_write)
    if writes > MAX_WRITE_ENTRIES or reads + writes > MAX_FOOTPRINT_KEYS:
        raise BatchTooLarge(f"footprint has {reads} read-only + {writes} read-write keys "
                            f"(limits {MAX_FOOTPRINT_KEYS} total, {MAX_WRITE_ENTRIES} read-write)")


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
    it is merely behind (issue 8 defect 7), so the next endpoint is tried, and when none can serve it
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
    from urllib.parse import urlsplit

    return urlsplit(url).netloc.rpartition("@")[2]


def _session(chain: ChainClient) -> requests.Session:
    session = getattr(chain, "_events_session", None)
    if session is None:
        session = requests.Session()
        chain._events_session = session  # type: ignore[attr-defined]
    return session


def cursor_ledger(cursor: str) -> int:
    """The ledger a cursor points into: TOID(ledger, tx, op) >> 32 (reference/stellar.md §1.5)."""
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
