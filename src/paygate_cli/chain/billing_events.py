"""Billing events decoded in bulk for the observer's catch-up: the same verdicts as
`charges.decode_billing_event`, at a fraction of its cost.

stellar-sdk decodes every topic and value into objects and back (~100 us per event, most of a page's
CPU). Two facts make most of that unnecessary:

- topics repeat: an event's topics are its kind and its account, so a page of 10,000 events carries
  a handful of distinct topic strings. Each distinct string is decoded once, by stellar-sdk, and
  remembered;
- the value of a `charge` or `credit` event has one canonical encoding, `Vec[I128, Bytes(32)]`:
  72 bytes whose layout is fixed. Those bytes are read with one struct unpack.

Anything else (a `charge_failed`, whose reason may be any value; a value in another shape; a topic
that is not exactly [kind, address]; bytes that do not parse) goes to `decode_billing_event`
unchanged, so an event is never accepted, rejected or read differently from the reference decoder
(tests/workers/test_observer_decode.py compares the two on valid and mangled events)."""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Sequence

from paygate_cli.chain.charges import BillingEvent, RawEvent, UndecodableEvent, decode_billing_event

# SCVal discriminants (Stellar-contract.x): SCV_I128 = 10, SCV_BYTES = 13, SCV_SYMBOL = 15, SCV_VEC = 16.
_SCV_I128, _SCV_BYTES, _SCV_SYMBOL, _SCV_VEC = 10, 13, 15, 16
# Vec present (1), 2 elements; I128 (hi int64, lo uint64); Bytes of length 32 (a multiple of 4: no padding).
_PAIR = struct.Struct(">iIIiqQiI32s")
_KINDS_WITH_PAIR = ("charge", "credit")  # charge_failed carries a third, free-form element: the reference path


def _symbol_xdr(name: str) -> str:
    raw = name.encode()
    padded = raw + b"\0" * (-len(raw) % 4)
    return base64.b64encode(struct.pack(">iI", _SCV_SYMBOL, len(raw)) + padded).decode()


# The canonical base64 of each kind's topic symbol: an exact string match is the whole decode.
_KIND_TOPICS = {_symbol_xdr(kind): kind for kind in _KINDS_WITH_PAIR}

# topic string -> the account (strkey) it decodes to, or None when it is not an address. Bounded:
# a hostile RPC could send a new string with every event.
_ACCOUNTS: dict[str, str | None] = {}
_ACCOUNTS_MAX = 100_000


def _account_of(topic: str) -> str | None:
    account = _ACCOUNTS.get(topic, "")
    if account != "":
        return account
    from stellar_sdk import Address, scval, xdr

    try:
        native = scval.to_native(xdr.SCVal.from_xdr(topic))
    except Exception:  # not valid XDR: the reference decoder says why
        native = None
    account = native.address if isinstance(native, Address) else None
    if len(_ACCOUNTS) >= _ACCOUNTS_MAX:
        _ACCOUNTS.clear()
    _ACCOUNTS[topic] = account
    return account


def _fast(event: RawEvent) -> BillingEvent | None:
    """The event decoded from its canonical form, or None when only the reference decoder may judge it."""
    topic = event.topic
    if len(topic) != 2:
        return None
    kind = _KIND_TOPICS.get(topic[0])
    if kind is None:
        return None
    account = _account_of(topic[1])
    if account is None:
        return None
    try:
        raw = base64.b64decode(event.value)  # as stellar-sdk's from_xdr reads it
    except (binascii.Error, ValueError, TypeError):
        return None
    if len(raw) != _PAIR.size:
        return None
    vec, present, count, i128, hi, lo, bytes_type, length, ref = _PAIR.unpack(raw)
    if (vec, present, count, i128, bytes_type, length) != (_SCV_VEC, 1, 2, _SCV_I128, _SCV_BYTES, 32):
        return None
    return BillingEvent(kind, account, (hi << 64) | lo, ref)


def decode_billing_events(events: Sequence[RawEvent]) -> dict[str, BillingEvent | UndecodableEvent]:
    """Every event's decode by id: a BillingEvent, or the UndecodableEvent saying why it is poison."""
    decoded: dict[str, BillingEvent | UndecodableEvent] = {}
    for event in events:
        billing = _fast(event)
        if billing is None:
            try:
                billing = decode_billing_event(event)
            except UndecodableEvent as exc:
                decoded[event.id] = exc
                continue
        decoded[event.id] = billing
    return decoded
