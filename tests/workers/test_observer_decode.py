"""The observer's bulk decoder (chain/billing_events.py) must say exactly what the reference decoder
(charges.decode_billing_event, stellar-sdk all the way) says: the same billing event, or poison with
the same reason, for valid events and for mangled ones."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stellar_sdk import Keypair, StrKey, scval

from paygate_cli.chain import billing_events
from paygate_cli.chain.billing_events import decode_billing_events
from paygate_cli.chain.charges import RawEvent, UndecodableEvent, decode_billing_event

ACCOUNTS = [Keypair.random().public_key for _ in range(3)]
CONTRACT = StrKey.encode_contract(bytes(range(32)))
I128 = st.integers(min_value=-(2**127), max_value=2**127 - 1)


def _event(kind: str, account: str, value: str, n: int = 0) -> RawEvent:
    topic = [scval.to_symbol(kind).to_xdr(), scval.to_address(account).to_xdr()]
    return RawEvent(f"{n:019d}-0000000001", 7, "ab" * 32, CONTRACT, topic, value)


def _pair(amount: int, ref: bytes) -> str:
    return scval.to_vec([scval.to_int128(amount), scval.to_bytes(ref)]).to_xdr()


def _reference(event: RawEvent) -> object:
    try:
        return decode_billing_event(event)
    except UndecodableEvent as exc:
        return ("poison", str(exc))


def _bulk(event: RawEvent) -> object:
    result = decode_billing_events([event])[event.id]
    return ("poison", str(result)) if isinstance(result, UndecodableEvent) else result


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(["charge", "credit"]), account=st.sampled_from([*ACCOUNTS, CONTRACT]),
       amount=I128, ref=st.binary(min_size=32, max_size=32))
def test_canonical_events_decode_as_the_reference_does(kind: str, account: str, amount: int, ref: bytes) -> None:
    event = _event(kind, account, _pair(amount, ref))
    assert billing_events._fast(event) is not None  # the fast path really decoded it
    assert _bulk(event) == _reference(event)
    assert _bulk(event).amount == amount and _bulk(event).ref == ref and _bulk(event).account == account


@settings(max_examples=300, deadline=None)
@given(amount=I128, ref=st.binary(min_size=32, max_size=32), position=st.integers(min_value=0, max_value=71),
       byte=st.integers(min_value=0, max_value=255), cut=st.integers(min_value=0, max_value=80),
       tail=st.binary(max_size=8))
def test_mangled_values_get_the_reference_verdict(amount: int, ref: bytes, position: int, byte: int, cut: int,
                                                  tail: bytes) -> None:
    raw = bytearray(base64.b64decode(_pair(amount, ref)))
    raw[position] = byte
    for mangled in (bytes(raw), bytes(raw[:cut]), bytes(raw) + tail):
        event = _event("charge", ACCOUNTS[0], base64.b64encode(mangled).decode())
        assert _bulk(event) == _reference(event)


@pytest.mark.parametrize("value", [
    scval.to_vec([scval.to_int128(5), scval.to_bytes(b"\1" * 31)]).to_xdr(),  # a 31-byte ref
    scval.to_vec([scval.to_int128(5), scval.to_bytes(b"\1" * 36)]).to_xdr(),
    scval.to_vec([scval.to_uint128(5), scval.to_bytes(b"\1" * 32)]).to_xdr(),  # u128, not i128
    scval.to_vec([scval.to_int128(5)]).to_xdr(),
    scval.to_vec([scval.to_int128(5), scval.to_bytes(b"\1" * 32), scval.to_symbol("x")]).to_xdr(),
    scval.to_bytes(b"\1" * 64).to_xdr(),
    "not base64 at all!",
    "",
    _pair(5, b"\2" * 32) + "==",
    " " + _pair(5, b"\2" * 32),
])
def test_other_shapes_and_junk_get_the_reference_verdict(value: str) -> None:
    for kind in ("charge", "credit", "charge_failed"):
        event = _event(kind, ACCOUNTS[1], value)
        assert _bulk(event) == _reference(event)


@pytest.mark.parametrize("reason", [scval.to_symbol("insufficient_balance"), scval.to_string("no funds"),
                                    scval.to_uint32(7)])
def test_charge_failed_goes_through_the_reference_decoder(reason: object) -> None:
    value = scval.to_vec([scval.to_int128(9), scval.to_bytes(b"\3" * 32), reason]).to_xdr()
    event = _event("charge_failed", ACCOUNTS[2], value)
    assert billing_events._fast(event) is None
    assert _bulk(event) == _reference(event) and _bulk(event).reason is not None


@pytest.mark.parametrize("topic", [
    [scval.to_symbol("charge").to_xdr()],
    [scval.to_symbol("charge").to_xdr(), scval.to_symbol("GABC").to_xdr()],
    [scval.to_symbol("refund").to_xdr(), scval.to_address(ACCOUNTS[0]).to_xdr()],
    [scval.to_string("charge").to_xdr(), scval.to_address(ACCOUNTS[0]).to_xdr()],
    [scval.to_symbol("charge").to_xdr(), "garbage"],
    [scval.to_symbol("charge").to_xdr(), scval.to_address(ACCOUNTS[0]).to_xdr(), scval.to_symbol("x").to_xdr()],
])
def test_odd_topics_get_the_reference_verdict(topic: list[str]) -> None:
    event = RawEvent("0000000000000000001-0000000001", 7, None, None, topic, _pair(5, b"\4" * 32))
    assert _bulk(event) == _reference(event)


def test_a_page_keeps_every_event_and_each_verdict() -> None:
    good = [_event("charge", ACCOUNTS[i % 3], _pair(100 + i, bytes([i]) * 32), n=i) for i in range(50)]
    bad = _event("charge", ACCOUNTS[0], "AAAA", n=99)
    decoded = decode_billing_events([*good, bad])
    assert len(decoded) == 51 and isinstance(decoded[bad.id], UndecodableEvent)
    assert [decoded[e.id].amount for e in good] == [100 + i for i in range(50)]
