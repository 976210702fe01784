"""Hostile input against every admission function, property-based, on the real database.

Each example corrupts exactly one argument of an otherwise valid call (bad base64/XDR, huge
payloads, amounts <= 0 or beyond i128, NaN/Infinity, addresses of the wrong kind or with a bad
checksum, control/invisible/bidirectional characters, NUL bytes and lone surrogates in keys) and
asserts: refused with SQLSTATE 22023 and a one-line message naming the function, or refused by the
driver before anything is sent (NUL, surrogates); and nothing written (every table the functions
touch counted before and after). The connection is in autocommit, so each refused call is its own
committed-or-not transaction: nothing hides behind a rollback the test did itself. A valid call is
admitted after the corpus, so the queue is unaffected."""

from __future__ import annotations

import itertools
import string
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stellar_sdk import Keypair, StrKey, xdr

from tests.support.relay_admission import MARKET, USER, args_xdr, auth_entry, source_account_entry

HOSTILE = settings(max_examples=50, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

ACCOUNT = USER.public_key
CONTRACT_ACCOUNT = StrKey.encode_contract(bytes([7]) * 32)
GOOD_ENTRY = "AAAAAQ=="  # admit_deposit checks the base64 shape; the funding worker decodes the XDR
TABLES = ("accounts", "deposits", "charges", "subscriptions", "relays", "fee_reservations", "bot_jobs",
          "idempotency_keys", "webhook_outbox", "lineages")
SNAPSHOT_SQL = ("SELECT " + ", ".join(f"(SELECT count(*) FROM paygate.{t})" for t in TABLES)
                + ", (SELECT sum(cached_balance) FROM paygate.accounts)"
                + ", (SELECT (reserved, settled, released)::text FROM paygate.relay_fee_totals)")

# -- the corpus ---------------------------------------------------------------------------------------

BASE32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
BAD_KEY_CHARS = "\x00\x01\x07\x1b\x7f\x85\x9f\u00ad\u061c\u200b\u200e\u202e\u2066\ufeff\ufffe\uffff\ud800"


def _bad_checksum(address: str, data: st.DataObject) -> str:
    pos = data.draw(st.integers(1, 55))
    char = data.draw(st.sampled_from(BASE32).filter(lambda c: c != address[pos]))
    mutated = address[:pos] + char + address[pos + 1:]
    return mutated


@st.composite
def bad_address(draw: st.DrawFn, kind: str) -> Any:
    """Anything that is not a valid StrKey of `kind` ('G', 'C' or 'GC')."""
    valid_g = Keypair.from_raw_ed25519_seed(draw(st.binary(min_size=32, max_size=32))).public_key
    valid_c = StrKey.encode_contract(draw(st.binary(min_size=32, max_size=32)))
    choices: list[Any] = [
        None, "", draw(st.text(max_size=80)), "x" * draw(st.integers(57, 300_000)),
        valid_g.lower(), valid_g[:-1], valid_g + "A", " " + valid_g, valid_g + "\n",
        "M" + valid_g[1:] + "AAAAAAAAAAAAA",  # muxed-account shaped
        Keypair.random().secret,  # a seed where an address is due: refused, and never echoed back
        _bad_checksum(valid_g, draw(st.data())), _bad_checksum(valid_c, draw(st.data())),
    ]
    if "C" not in kind:
        choices.append(valid_c)  # a contract where an account is due
    if "G" not in kind:
        choices.append(valid_g)  # an account where a contract is due
    return draw(st.sampled_from(choices))


@st.composite
def bad_key(draw: st.DrawFn) -> Any:
    alphabet = st.sampled_from(string.ascii_letters + string.digits + "-_:.é漢🙂" + BAD_KEY_CHARS)
    text = draw(st.text(alphabet, min_size=1, max_size=40))
    poisoned = draw(st.sampled_from(BAD_KEY_CHARS))
    at = draw(st.integers(0, len(text)))
    return draw(st.sampled_from([None, "", "k" * draw(st.integers(256, 100_000)), text[:at] + poisoned + text[at:]]))


def bad_amount() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from([None, 0, -1, 2**127, 2**127 + 1, 10**39, 10**100, -(2**127)]),
        st.integers(max_value=0), st.integers(min_value=2**127, max_value=2**200),
        st.sampled_from([Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity"), Decimal("0.5"),
                         Decimal("1e-100"), Decimal("1.000000001"), Decimal("1e400")]),
        st.decimals(allow_nan=False, allow_infinity=False, places=3).filter(lambda d: d != d.to_integral_value()),
    )


def bad_base64(limit: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from([None, "", "====", "AAAA=", "AAAAAQ", "AAAA AQ==", "AAAA\nAQ==", "AA==AA==", "-_-_"]),
        st.text(max_size=60).filter(lambda t: any(c not in string.ascii_letters + string.digits + "+/=" for c in t)),
        st.integers(limit + 1, limit + 5000).map(lambda n: "A" * (n + (-n) % 4)),  # over the size limit
    )


# -- the five admission functions: a valid call and the hostile variants of each argument ------------

class Admission:
    def __init__(self, name: str, sql: str, valid: Callable[[str], list[Any]], hostile: dict[int, Any]) -> None:
        self.name, self.sql, self.valid, self.hostile = name, sql, valid, hostile


def _relay_entries_bad() -> st.SearchStrategy[Any]:
    good = auth_entry()
    raw = xdr.SorobanAuthorizationEntry.from_xdr(good).to_xdr_bytes()
    import base64

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return st.one_of(
        st.sampled_from([None, [], [good] * 9, [[good], [good]], [None], [""], ["AAAA"], [source_account_entry()],
                         [b64(raw[:40])],  # truncated
                         [b64(b"\x00\x00\x00\x07" + raw[4:])],  # no such credentials type
                         [b64(raw[:4] + b"\x00\x00\x00\x09" + raw[8:])],  # no such address type
                         [good, "not base64!"], ["A" * 16388]]),
        st.binary(min_size=1, max_size=200).filter(lambda b: b[:3] != b"\x00\x00\x00").map(lambda b: [b64(b)]),
    )


ADMISSIONS = {
    "admit_deposit": Admission(
        "admit_deposit", "SELECT * FROM paygate.admit_deposit(%s, %s::numeric, %s, %s, %s, %s)",
        lambda key: [ACCOUNT, 5, GOOD_ENTRY, int(key.rsplit("-", 1)[1]), 100, key],
        {0: bad_address("G"), 1: bad_amount(), 2: bad_base64(16384), 4: st.sampled_from([None, 0, -1, -(2**31)]),
         5: bad_key()}),
    "admit_charge": Admission(
        "admit_charge", "SELECT * FROM paygate.admit_charge(%s, %s::numeric, %s, %s, %s, %s, %s::interval)",
        lambda key: [ACCOUNT, 1, key, None, None, None, "1 hour"],
        {0: bad_address("GC"), 1: bad_amount(), 2: bad_key(), 3: st.text(min_size=1001, max_size=1200),
         4: st.integers(1, 2**62), 6: st.sampled_from(["0", "-5 days", "400 days", "1000000 years"])}),
    "create_subscription": Admission(
        "create_subscription",
        "SELECT * FROM paygate.create_subscription(%s, %s::numeric, %s::interval, %s::timestamptz, %s, %s)",
        lambda key: [ACCOUNT, 10, "1 day", "2026-01-01T00:00:00Z", key, None],
        {0: bad_address("GC"), 1: bad_amount(),
         2: st.sampled_from([None, "0", "59 seconds", "-1 day", "11 years", "100000000 years"]),
         3: st.sampled_from([None, "infinity", "-infinity", "0001-01-01", "9999-12-31", "294276-01-01"]),
         4: bad_key(), 5: st.text(min_size=1001, max_size=1100)}),
    "admit_relay": Admission(
        "admit_relay", "SELECT * FROM paygate.admit_relay(%s, %s, %s, %s, %s, %s, %s)",
        lambda key: [ACCOUNT, MARKET, "buy", args_xdr(), [auth_entry()], 1000, key],
        {0: bad_address("GC"), 1: bad_address("C"),
         2: st.sampled_from([None, "", "a" * 33, "buy;drop", "b\u00fcy", "buy\n"]),
         3: st.one_of(bad_base64(65536), st.sampled_from(["AAAAAQ==", "AAAAEAAAAAA=", "AAAAAw=="])),
         4: _relay_entries_bad(), 5: st.sampled_from([None, 0, -1, -(2**63)]), 6: bad_key()}),
    "admit_bot_job": Admission(
        "admit_bot_job", "SELECT * FROM paygate.admit_bot_job(%s, %s, %s, %s, %s)",
        lambda key: [key, MARKET, "close_expired", args_xdr(), None],
        {0: bad_key(), 1: bad_address("C"), 2: st.sampled_from([None, "", "x" * 33, "close expired"]),
         3: st.one_of(bad_base64(65536), st.sampled_from(["AAAAAQ==", "AAAAEAAAAAA="])),
         4: st.sampled_from([0, -1, -(2**31)])}),
}


@pytest.fixture
def world(db: psycopg.Connection) -> psycopg.Connection:
    """Allow-listed market, a funded account, an endpoint (so events would land in the outbox) and
    one good item already queued in every queue (it must be untouched by the corpus)."""
    db.execute("INSERT INTO paygate.relay_allowlist (contract, function) VALUES (%s, 'buy')", (MARKET,))
    db.execute("INSERT INTO paygate.bot_job_allowlist (contract, function) VALUES (%s, 'close_expired')", (MARKET,))
    db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES ('http://127.0.0.1:9/h', %s)", ("s" * 32,))
    db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 1000), (%s, 1000)",
               (ACCOUNT, CONTRACT_ACCOUNT))
    for admission in ADMISSIONS.values():
        db.execute(admission.sql, admission.valid("queued-0"))
    return db


def snapshot(db: psycopg.Connection) -> tuple:
    return db.execute(SNAPSHOT_SQL).fetchone()


def call_hostile(db: psycopg.Connection, admission: Admission, args: list[Any]) -> None:
    """The call must be refused: by the database with 22023 and a clear one-line message, or by the
    driver before anything is sent (text with NUL bytes or lone surrogates cannot be encoded)."""
    try:
        row = db.execute(admission.sql, args).fetchall()
    except psycopg.Error as exc:
        if isinstance(exc, psycopg.DataError) and exc.sqlstate is None:
            assert "NUL" in str(exc)  # psycopg refuses NUL before sending: nothing reached the server
            return
        assert exc.sqlstate == "22023", (exc.sqlstate, str(exc), args)
        message = exc.diag.message_primary or ""
        assert message.startswith(f"{admission.name}: "), message
        assert "\n" not in message and len(message) < 300, message  # never echoes a huge or hostile value
        return
    except UnicodeEncodeError:
        return  # a lone surrogate: not UTF-8, the driver refuses to send it
    raise AssertionError(f"{admission.name} admitted hostile input {args!r:.300}: {row}")


@pytest.mark.parametrize("name", list(ADMISSIONS))
def test_hostile_input_is_refused_with_22023_and_nothing_is_written(world: psycopg.Connection, name: str) -> None:
    admission = ADMISSIONS[name]
    keys = itertools.count(1)
    before = snapshot(world)

    @HOSTILE
    @given(data=st.data(), position=st.sampled_from(sorted(admission.hostile)))
    def corpus(data: st.DataObject, position: int) -> None:
        args = admission.valid(f"hostile-{next(keys)}")
        args[position] = data.draw(admission.hostile[position], label=f"argument {position}")
        call_hostile(world, admission, args)
        assert snapshot(world) == before

    corpus()
    # The queue is unaffected: the good item is still there, and the next valid call is admitted.
    admitted = world.execute(admission.sql, admission.valid("after-9999")).fetchone()
    assert admitted is not None and snapshot(world) != before


def test_a_nul_byte_that_reaches_the_server_is_refused_before_the_function_runs(world: psycopg.Connection) -> None:
    """Drivers other than psycopg may send the bytes: PostgreSQL refuses a NUL in text (22021)."""
    before = snapshot(world)
    with pytest.raises(psycopg.errors.CharacterNotInRepertoire):
        world.execute("SELECT * FROM paygate.admit_charge(%s, 1, convert_from('\\x6b00'::bytea, 'UTF8'))",
                      (ACCOUNT,))
    assert snapshot(world) == before


@pytest.mark.parametrize("address", [
    "G" + "A" * 55,  # the pattern's favourite: right alphabet, right length, wrong checksum
    Keypair.from_raw_ed25519_seed(bytes(32)).public_key[:-1] + "B",
])
def test_addresses_with_a_bad_checksum_are_refused_everywhere(world: psycopg.Connection, address: str) -> None:
    assert not StrKey.is_valid_ed25519_public_key(address)  # the test's own premise
    before = snapshot(world)
    for admission in ADMISSIONS.values():
        if admission.name == "admit_bot_job":
            continue  # no account argument
        args = admission.valid("checksum-1")
        args[0] = address
        call_hostile(world, admission, args)
    assert snapshot(world) == before
    assert world.execute("SELECT paygate.strkey_is_valid(%s, 'G')", (ACCOUNT,)).fetchone()[0] is True


def test_strkey_check_agrees_with_the_sdk(db: psycopg.Connection) -> None:
    """The SQL checksum is a reimplementation: prove it against stellar_sdk on single-character typos."""

    @settings(max_examples=150, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(seed=st.binary(min_size=32, max_size=32), data=st.data(), kind=st.sampled_from("GC"))
    def agree(seed: bytes, data: st.DataObject, kind: str) -> None:
        address = Keypair.from_raw_ed25519_seed(seed).public_key if kind == "G" else StrKey.encode_contract(seed)
        typo = _bad_checksum(address, data) if data.draw(st.booleans()) else address
        expected = StrKey.is_valid_ed25519_public_key(typo) if kind == "G" else StrKey.is_valid_contract(typo)
        assert db.execute("SELECT paygate.strkey_is_valid(%s, %s)", (typo, kind)).fetchone()[0] is expected

    agree()
