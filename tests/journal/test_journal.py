"""The transaction journal: the rule-2 guard, the keyring's binding of ciphertext to its row, the
journal keys' configuration errors, the lineage state machine enforced in SQL, and judge/decide."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stellar_sdk import Asset, Keypair, TransactionBuilder

from paygate_cli.chain.rpc import ChainClient, Probe
from paygate_cli.db.connect import TransactionOpenAcrossNetworkCall
from paygate_cli.errors import ConfigError, ExitCode
from paygate_cli.journal import lineage as lineages
from paygate_cli.journal.keyring import EnvelopeTampered, Keyring
from paygate_cli.journal.lineage import Lineage
from paygate_cli.journal.resolve import decide, judge
from paygate_cli.settings import load_settings
from tests.support.chain_env import JOURNAL_KEY_ID, ChainEnv, admit_deposit, chain_environ
from tests.support.cli import base_environ, run_cli
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.funding import (
    admit,
    assert_invariants,
    crash_tick,
    lineages_of,
    run_until_quiet,
    wait_for_leases,
)

DEAD = ("applied", "failed", "expired", "superseded", "abandoned")


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=3)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))


def keyring(*ids: str) -> Keyring:
    return Keyring({k: os.urandom(32) for k in ids or ("k1",)}, (ids or ("k1",))[0])


# -- rule 2: no chain call with a transaction open ---------------------------------------------------

def _payment_envelope(chain: ChainEnv) -> str:
    g = chain.genesis
    payer = Keypair.from_secret(g["users"][2]["secret"])
    with chain.server() as server:
        tx = (TransactionBuilder(server.load_account(payer.public_key), g["passphrase"], base_fee=100)
              .append_payment_op(g["users"][1]["public"], Asset.native(), "1").set_timeout(300).build())
    tx.sign(payer)
    return tx.to_xdr()


def test_chain_client_refuses_every_call_inside_a_transaction(chain: ChainEnv, db: psycopg.Connection) -> None:
    client = ChainClient(load_settings(chain.environ), guard_conn=db)
    lane = chain.genesis["lanes"][0]["public"]
    envelope = _payment_envelope(chain)
    calls = {
        "latest_ledger": lambda: client.latest_ledger(),
        "account_sequence": lambda: client.account_sequence(lane),
        "ledger_entries": lambda: client.ledger_entries([]),
        "probe": lambda: client.probe(lane, "00" * 32),
        "simulate": lambda: client.simulate(None),
        "send": lambda: client.send(envelope),
    }
    try:
        with db.transaction():
            db.execute("SELECT 1")
            for name, call in calls.items():
                with pytest.raises(TransactionOpenAcrossNetworkCall, match="inside a transaction") as caught:
                    call()
                assert caught.value.exit_code == ExitCode.SOFTWARE, name
        assert chain.devnet.state()["queue"] == []  # the refused send never reached the network
        # the same client, outside any transaction, talks to the chain
        assert client.latest_ledger().sequence == chain.devnet.latest_ledger()
        assert client.send(envelope).status == "PENDING"
        assert len(chain.devnet.state()["queue"]) == 1
    finally:
        client.close()


def test_guard_sees_implicit_and_failed_transactions(chain: ChainEnv, dsn: str) -> None:
    with psycopg.connect(dsn) as conn:  # not autocommit: the first statement opens a transaction
        client = ChainClient(load_settings(chain.environ), guard_conn=conn)
        try:
            conn.execute("SELECT 1")
            with pytest.raises(TransactionOpenAcrossNetworkCall):
                client.latest_ledger()
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("SELECT 1/0")
            with pytest.raises(TransactionOpenAcrossNetworkCall):  # a failed transaction is still open
                client.latest_ledger()
            conn.rollback()
            assert client.latest_ledger().sequence >= 1
        finally:
            client.close()


# -- the keyring: a ciphertext decrypts only as its own row ---------------------------------------

LANES = [Keypair.random().public_key for _ in range(2)]


def _signed_lineage(db: psycopg.Connection, ring: Keyring, lane: str, entitlement: str, seq: int,
                    plaintext: bytes) -> int:
    lineages.sync_lanes(db, LANES)
    with db.transaction():
        allocated = lineages.allocate(db, purpose="deposit", entitlement=entitlement, lanes=[lane])
    assert allocated is not None
    lineage_id = allocated[0]
    key_id, blob = ring.encrypt(plaintext, lineage_id=lineage_id, source=lane, seq=seq)
    with db.transaction():
        assert lineages.anchor(db, lineage_id, seq=seq, key_id=key_id, envelope=blob, inner_hash=os.urandom(32),
                               outer_hash=os.urandom(32), max_time=2_000_000_000, signed_at_ledger=5)
    return lineage_id


def _decrypt(ring: Keyring, row: Lineage, envelope: bytes | None = None) -> bytes:
    return ring.decrypt(envelope if envelope is not None else bytes(row.envelope or b""), key_id=row.key_id or "",
                        lineage_id=row.id, source=row.lane, seq=row.source_seq or 0)


def test_swapped_and_altered_ciphertexts_fail_to_decrypt(db: psycopg.Connection) -> None:
    ring = keyring("k1")
    a = lineages.load(db, _signed_lineage(db, ring, LANES[0], "deposit:1:deposit", 10, b"envelope A"))
    b = lineages.load(db, _signed_lineage(db, ring, LANES[1], "deposit:2:deposit", 20, b"envelope B"))
    assert _decrypt(ring, a) == b"envelope A" and _decrypt(ring, b) == b"envelope B"
    # B's bytes presented as A's row (same key, same table): refused, not decrypted into A's entitlement
    with pytest.raises(EnvelopeTampered, match=f"lineage {a.id}"):
        _decrypt(ring, a, bytes(b.envelope or b""))
    altered = bytearray(a.envelope or b"")
    altered[-1] ^= 0x01
    with pytest.raises(EnvelopeTampered):
        _decrypt(ring, a, bytes(altered))
    altered_nonce = bytearray(a.envelope or b"")
    altered_nonce[0] ^= 0x80
    with pytest.raises(EnvelopeTampered):
        _decrypt(ring, a, bytes(altered_nonce))
    # and the database refuses the swap itself: a signed envelope is never replaced
    with pytest.raises(psycopg.errors.CheckViolation, match="never replaced"):
        db.execute("UPDATE paygate.lineages SET envelope = %s WHERE id = %s", (b.envelope, a.id))
    assert _decrypt(ring, lineages.load(db, a.id)) == b"envelope A"


@pytest.mark.parametrize("field", ["lineage_id", "key_id", "source", "seq"])
def test_associated_data_binds_every_field(field: str) -> None:
    key = os.urandom(32)
    ring = Keyring({"k1": key, "k2": key}, "k1")  # same key bytes under two ids: only the AAD differs
    bound = {"key_id": "k1", "lineage_id": 7, "source": LANES[0], "seq": 99}
    _, blob = ring.encrypt(b"tx", lineage_id=7, source=LANES[0], seq=99)
    assert ring.decrypt(blob, **bound) == b"tx"
    other = {"lineage_id": 8, "key_id": "k2", "source": LANES[1], "seq": 100}[field]
    with pytest.raises(EnvelopeTampered):
        ring.decrypt(blob, **{**bound, field: other})


def test_old_keys_stay_loadable_and_unknown_ones_are_named() -> None:
    old = keyring("old")
    _, blob = old.encrypt(b"tx", lineage_id=1, source=LANES[0], seq=1)
    rotated = Keyring({"old": old.keys["old"], "new": os.urandom(32)}, "new")
    assert rotated.decrypt(blob, key_id="old", lineage_id=1, source=LANES[0], seq=1) == b"tx"
    assert rotated.encrypt(b"tx", lineage_id=2, source=LANES[0], seq=2)[0] == "new"
    with pytest.raises(ConfigError, match="'old'"):
        keyring("new").decrypt(blob, key_id="old", lineage_id=1, source=LANES[0], seq=1)


# -- journal keys misconfigured: the funding tick exits 78 naming the key id / variable -------------

def _funding_environ(dsn: str, directory: Path, keys: str | None, active: str | None) -> dict[str, str]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "lanes").write_text(Keypair.random().secret + "\n")
    (directory / "fee").write_text(Keypair.random().secret + "\n")
    extra = {"PAYGATE_LANE_SECRETS_FILE": str(directory / "lanes"), "PAYGATE_FEE_SECRET_FILE": str(directory / "fee")}
    if keys is not None:
        (directory / "journal-keys").write_text(keys)
        extra["PAYGATE_JOURNAL_KEYS_FILE"] = str(directory / "journal-keys")
    if active is not None:
        extra["PAYGATE_JOURNAL_ACTIVE_KEY_ID"] = active
    return base_environ(dsn, PAYGATE_RPC_URL="http://127.0.0.1:9", PAYGATE_RPC_TIMEOUT="1s",
                        PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT="1",
                        PAYGATE_BILLING_CONTRACT="C" + "A" * 55, PAYGATE_USDC_CONTRACT="C" + "B" * 55, **extra)


GOOD_KEYS = json.dumps({"k1": "ab" * 32})


@pytest.mark.parametrize(("keys", "active", "named"), [
    (None, "k1", "PAYGATE_JOURNAL_KEYS_FILE"),
    (GOOD_KEYS, None, "PAYGATE_JOURNAL_ACTIVE_KEY_ID"),
    (GOOD_KEYS, "k9", "'k9'"),
    (json.dumps({"k1": "zz" * 32}), "k1", "'k1'"),
    (json.dumps({"k1": "ab" * 16}), "k1", "'k1'"),
    ("{not json", "k1", "journal-keys"),
    (json.dumps({}), "k1", "journal-keys"),
], ids=["keys-file-unset", "active-unset", "active-not-in-file", "not-hex", "short-key", "not-json", "empty"])
def test_bad_journal_keys_exit_78_naming_the_key(dsn: str, db: psycopg.Connection, tmp_path: Path,
                                                 keys: str | None, active: str | None, named: str) -> None:
    admit_deposit(db, Keypair.random().public_key, 5, "AAAAAQ==", 1, 100, "k")  # work, so the tick needs keys
    result = run_cli("run-tick", "funding", "--once", environ=_funding_environ(dsn, tmp_path / "k", keys, active))
    assert result.code == ExitCode.CONFIG, (result.code, result.err)
    assert named in result.err
    assert "ab" * 32 not in result.err  # the key material itself is never printed


def test_missing_journal_keys_file_exits_78(dsn: str, tmp_path: Path) -> None:
    environ = _funding_environ(dsn, tmp_path / "k", None, "k1")
    environ["PAYGATE_JOURNAL_KEYS_FILE"] = str(tmp_path / "nowhere.json")
    result = run_cli("run-tick", "funding", "--once", environ=environ)
    assert result.code == ExitCode.CONFIG and "PAYGATE_JOURNAL_KEYS_FILE" in result.err, result.err


def test_a_lineage_under_a_removed_key_stops_the_tick_naming_it(chain: ChainEnv, db: psycopg.Connection) -> None:
    """Anchored under k2026, then k2026 leaves the keys file: the resend cannot decrypt, so the tick
    exits 78 naming the key. Put back as an old key beside a new active one: the old envelope is
    resent, the next lineage is encrypted under the new key, the deposit settles once."""
    keys_file = Path(chain.environ["PAYGATE_JOURNAL_KEYS_FILE"])
    original = json.loads(keys_file.read_text())
    pending_id = admit(chain, db)
    crash_tick(chain, "funding.after_anchor")
    keys_file.write_text(json.dumps({"k2027": os.urandom(32).hex()}))
    wait_for_leases(db)
    result = chain.tick("funding", "--once", PAYGATE_JOURNAL_ACTIVE_KEY_ID="k2027")
    assert result.code == ExitCode.CONFIG, (result.code, result.err)
    assert f"'{JOURNAL_KEY_ID}'" in result.err
    keys_file.write_text(json.dumps({**original, "k2027": os.urandom(32).hex()}))
    chain.environ["PAYGATE_JOURNAL_ACTIVE_KEY_ID"] = "k2027"
    run_until_quiet(chain, db)
    assert [(x["purpose"], x["key_id"], x["state"]) for x in lineages_of(db)] == [
        ("deposit", JOURNAL_KEY_ID, "applied"), ("credit", "k2027", "applied")]
    assert_invariants(chain, db, [pending_id])


# -- the lineage state machine, enforced in SQL -------------------------------------------------------

def _terminal(db: psycopg.Connection, state: str, n: int) -> int:
    ring = keyring()
    if state == "abandoned":
        lineages.sync_lanes(db, LANES)
        with db.transaction():
            allocated = lineages.allocate(db, purpose="credit", entitlement=f"e:{n}", lanes=[LANES[0]])
        assert allocated is not None
        assert lineages.abandon(db, allocated[0], "test")
        return allocated[0]
    lineage_id = _signed_lineage(db, ring, LANES[0], f"e:{n}", 100 + n, b"x")
    assert lineages.finish(db, lineage_id, state, ledger=9 if state in ("applied", "failed") else None,
                           resolution="test")
    return lineage_id


@pytest.mark.parametrize("state", DEAD)
def test_terminal_rows_never_change(db: psycopg.Connection, state: str) -> None:
    lineage_id = _terminal(db, state, 1)
    for assignment, value in [("state = %s", "sent"), ("state = %s", "signed"), ("resolution = %s", "rewritten"),
                              ("ledger = %s", 12345), ("result_code = %s", "txSUCCESS")]:
        with pytest.raises(psycopg.errors.CheckViolation, match="is terminal"):
            db.execute(f"UPDATE paygate.lineages SET {assignment} WHERE id = %s", (value, lineage_id))
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="never deleted"):
        db.execute("DELETE FROM paygate.lineages WHERE id = %s", (lineage_id,))
    # the CAS helpers simply do not match a terminal row
    assert not lineages.finish(db, lineage_id, "applied", ledger=1, resolution="again")
    assert not lineages.mark_sent(db, lineage_id, "PENDING")
    assert not lineages.abandon(db, lineage_id, "again")
    assert lineages.load(db, lineage_id).state == state


@pytest.mark.parametrize(("start", "target"), [
    ("allocated", "sent"), ("allocated", "applied"), ("allocated", "expired"), ("allocated", "superseded"),
    ("signed", "allocated"), ("signed", "abandoned"),
    ("sent", "signed"), ("sent", "allocated"), ("sent", "abandoned"),
])
def test_invalid_transitions_are_refused(db: psycopg.Connection, start: str, target: str) -> None:
    lineages.sync_lanes(db, LANES)
    if start == "allocated":
        with db.transaction():
            allocated = lineages.allocate(db, purpose="deposit", entitlement="e", lanes=[LANES[0]])
        assert allocated is not None
        lineage_id = allocated[0]
    else:
        lineage_id = _signed_lineage(db, keyring(), LANES[0], "e", 5, b"x")
        if start == "sent":
            assert lineages.mark_sent(db, lineage_id, "PENDING")
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute("UPDATE paygate.lineages SET state = %s, ledger = 3 WHERE id = %s", (target, lineage_id))
    assert lineages.load(db, lineage_id).state == start
    # non-terminal rows are never deleted either
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        db.execute("DELETE FROM paygate.lineages WHERE id = %s", (lineage_id,))


def test_one_live_lineage_per_lane_and_per_entitlement(db: psycopg.Connection) -> None:
    lineages.sync_lanes(db, LANES)
    with db.transaction():
        first = lineages.allocate(db, purpose="deposit", entitlement="e:1", lanes=[LANES[0]])
    assert first is not None
    with db.transaction():  # the only lane is busy: nothing to allocate
        assert lineages.allocate(db, purpose="deposit", entitlement="e:2", lanes=[LANES[0]]) is None
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute("INSERT INTO paygate.lineages (purpose, entitlement, lane) VALUES ('deposit', 'e:2', %s)",
                   (LANES[0],))
    with pytest.raises(psycopg.errors.UniqueViolation):  # same entitlement, other lane
        db.execute("INSERT INTO paygate.lineages (purpose, entitlement, lane) VALUES ('deposit', 'e:1', %s)",
                   (LANES[1],))
    db.execute("UPDATE paygate.lanes SET status = 'drained', drained_at = now() WHERE address = %s", (LANES[1],))
    with db.transaction():  # a drained lane takes no new work
        assert lineages.allocate(db, purpose="deposit", entitlement="e:3", lanes=LANES) is None


def test_next_sequence_never_reuses_a_number_the_journal_knows_was_consumed(db: psycopg.Connection) -> None:
    lineage_id = _signed_lineage(db, keyring(), LANES[0], "e:1", 42, b"x")
    assert lineages.next_sequence(db, LANES[0], 40) == 41  # nothing consumed yet: chain + 1
    assert lineages.finish(db, lineage_id, "applied", ledger=3, resolution="test")
    assert lineages.next_sequence(db, LANES[0], 40) == 43  # a lagging read (40) cannot take 42 again
    assert lineages.next_sequence(db, LANES[0], 50) == 51


# -- judge and decide --------------------------------------------------------------------------------

SIGNED_AT, SEQ, MAX_TIME = 100, 5000, 1_000_000


def _lineage() -> Lineage:
    return Lineage(id=1, purpose="deposit", entitlement="e", lane=LANES[0], state="sent", source_seq=SEQ,
                   key_id="k", envelope=b"", inner_hash=b"\0" * 32, outer_hash=b"\1" * 32, max_time=MAX_TIME,
                   signed_at_ledger=SIGNED_AT, ledger=None, fee_charged=None, result_code=None, resolution=None)


def _probe(**kw: Any) -> Probe:
    base: dict[str, Any] = {"endpoint": "e", "account_seq": SEQ - 1, "seq_ledger": 120, "tx_status": "NOT_FOUND",
                            "latest_ledger": 120, "latest_close_time": MAX_TIME - 10, "oldest_ledger": 1}
    return Probe(**{**base, **kw})


@pytest.mark.parametrize(("probe", "verdict"), [
    (_probe(error="boom", tx_status=None), "unknown"),
    (_probe(tx_status="SUCCESS", tx_ledger=110), "applied"),
    (_probe(tx_status="FAILED", tx_ledger=110), "failed"),
    (_probe(), "pending"),
    (_probe(account_seq=SEQ), "superseded"),
    (_probe(account_seq=SEQ + 3, latest_close_time=MAX_TIME + 1), "superseded"),
    (_probe(latest_close_time=MAX_TIME + 1), "expired"),
    (_probe(latest_close_time=MAX_TIME), "pending"),  # maxTime is inclusive: not dead yet
    # the transaction answer is older than the sequence read: it proves nothing
    (_probe(account_seq=SEQ, seq_ledger=121, latest_ledger=120), "unknown"),
    # the node forgot the ledgers where it could have landed
    (_probe(account_seq=SEQ, oldest_ledger=SIGNED_AT + 1), "unknown"),
    (_probe(latest_close_time=MAX_TIME + 1, oldest_ledger=SIGNED_AT + 1), "unknown"),
    (_probe(seq_ledger=None, account_seq=SEQ), "unknown"),
], ids=["error", "success", "failed", "pending", "seq-consumed", "both-dead", "expired", "max-time-inclusive",
        "tx-answer-older-than-seq-read", "forgot-the-ledgers", "forgot-expired", "no-seq-read"])
def test_judge(probe: Probe, verdict: str) -> None:
    assert judge(probe, _lineage()) == verdict


@pytest.mark.parametrize(("verdicts", "decision"), [
    (["applied"], "applied"),
    (["applied", "applied", "unknown"], "applied"),
    (["applied", "unknown", "unknown"], "wait"),
    (["failed", "failed", "pending"], "failed"),
    (["superseded", "superseded", "unknown"], "superseded"),
    (["superseded", "expired", "pending"], "expired"),
    (["superseded", "unknown", "unknown"], "wait"),
    (["expired", "expired", "applied"], "wait"),
    (["pending", "unknown", "unknown"], "pending"),
    (["unknown", "unknown", "unknown"], "wait"),
    (["expired", "pending"], "pending"),  # two endpoints: one is not a majority
    (["expired", "expired"], "expired"),
])
def test_decide(verdicts: list[str], decision: str) -> None:
    assert decide(verdicts) == decision


VERDICTS = st.sampled_from(["applied", "failed", "superseded", "expired", "pending", "unknown"])


@given(st.lists(VERDICTS, min_size=1, max_size=7))
def test_decide_needs_a_majority_for_every_terminal_decision(verdicts: list[str]) -> None:
    decision = decide(verdicts)
    majority = len(verdicts) // 2 + 1
    if decision in ("applied", "failed"):
        assert verdicts.count(decision) >= majority
    if decision == "superseded":
        assert verdicts.count("superseded") >= majority
    if decision == "expired":
        assert verdicts.count("expired") + verdicts.count("superseded") >= majority
    assert decision in ("applied", "failed", "superseded", "expired", "pending", "wait")


@given(st.lists(VERDICTS, min_size=0, max_size=6), st.sampled_from(["applied", "failed"]), st.integers(0, 6))
def test_a_single_endpoint_that_saw_it_blocks_a_dead_verdict(others: list[str], seen: str, at: int) -> None:
    verdicts = [*others[:at], seen, *others[at:]]
    assert decide(verdicts) not in ("expired", "superseded")


@st.composite
def landed_world(draw: st.DrawFn) -> tuple[int, list[Probe]]:
    """The transaction really landed in ledger `landed` (so its sequence is consumed from there on).
    Each endpoint is lagging by its own amount, independently for its sequence read and its
    transaction read (different backends behind one URL), and may have a short retention."""
    landed = draw(st.integers(SIGNED_AT + 1, SIGNED_AT + 12))
    tip = draw(st.integers(landed, landed + 20))
    probes = []
    for _ in range(draw(st.integers(1, 5))):
        seq_view = draw(st.integers(SIGNED_AT, tip))
        tx_view = draw(st.integers(SIGNED_AT, tip))
        oldest = max(1, tx_view - draw(st.integers(1, 200)) + 1)
        close = MAX_TIME - 5 * (landed - tx_view) - 1  # close times rise 5 s a ledger; landed before maxTime
        seen = tx_view >= landed and oldest <= landed
        probes.append(Probe(
            "e", account_seq=SEQ if seq_view >= landed else SEQ - 1, seq_ledger=seq_view,
            tx_status="SUCCESS" if seen else "NOT_FOUND", tx_ledger=landed if seen else None,
            latest_ledger=tx_view, latest_close_time=close, oldest_ledger=oldest))
    return landed, probes


@settings(max_examples=300)
@given(landed_world())
def test_a_lagging_node_never_turns_not_seen_yet_into_dead(world: tuple[int, list[Probe]]) -> None:
    _, probes = world
    lineage = _lineage()
    verdicts = [judge(p, lineage) for p in probes]
    assert not set(verdicts) & {"superseded", "expired", "failed"}, (verdicts, probes)
    assert decide(verdicts) in ("applied", "pending", "wait")


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(SIGNED_AT, SIGNED_AT + 30), st.integers(1, 200)), min_size=1, max_size=5))
def test_an_unlanded_live_transaction_is_never_dead(views: list[tuple[int, int]]) -> None:
    """Still in flight (sequence unspent, maxTime not passed at the tip): whatever each endpoint lags
    by, nothing may call it dead."""
    lineage = _lineage()
    probes = [Probe("e", account_seq=SEQ - 1, seq_ledger=view, tx_status="NOT_FOUND", latest_ledger=view,
                    latest_close_time=MAX_TIME - 5 * (SIGNED_AT + 30 - view), oldest_ledger=max(1, view - keep + 1))
              for view, keep in views]
    verdicts = [judge(p, lineage) for p in probes]
    assert set(verdicts) <= {"pending", "unknown"}
    assert decide(verdicts) in ("pending", "wait")


def test_a_tampered_journal_row_stops_the_deposit_and_sends_nothing(chain: ChainEnv, db: psycopg.Connection) -> None:
    """Someone with table-owner rights (trigger disabled) alters an anchored envelope. The resend
    refuses to decrypt it: the deposit stops as needs_human (exit 3), nothing reaches the network,
    and the lineage stays live (its lane busy) for a human to look at."""
    pending_id = admit(chain, db)
    crash_tick(chain, "funding.after_anchor")
    [lineage] = lineages_of(db)
    with db.transaction():
        db.execute("ALTER TABLE paygate.lineages DISABLE TRIGGER lineage_transition_guard")
        db.execute("UPDATE paygate.lineages SET envelope = set_byte(envelope, 20, get_byte(envelope, 20) # 1) "
                   "WHERE id = %s", (lineage["id"],))
        db.execute("ALTER TABLE paygate.lineages ENABLE TRIGGER lineage_transition_guard")
    wait_for_leases(db)
    result = chain.tick("funding", "--once")
    assert result.code == ExitCode.NEEDS_HUMAN, (result.code, result.err)
    assert "journal.envelope_tampered" in result.err
    row = db.execute("SELECT status, reason FROM paygate.deposits WHERE id = %s", (pending_id,)).fetchone()
    assert row[0] == "needs_human" and "altered or swapped" in row[1]
    assert chain.devnet.state()["queue"] == []
    assert [x["state"] for x in lineages_of(db)] == ["signed"]
