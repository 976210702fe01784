"""An in-flight lineage whose stored envelope no longer decrypts (docs/architecture.md §4): on every
money path its unit ends needs_human with the reason, its lineage is parked (still live, never
called dead by guess), its lane is fenced with a drain_reason, fresh work of the same path moves on
another lane, and the tick exits 3 once — not on every later tick. Real devnet, real Postgres, the
real CLI; the tampering itself is a byte flipped in the database (what an altered or swapped row
looks like), with the journal's trigger bypassed for that one statement as an attacker would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import scval

from tests.support.chain_env import ChainEnv, admit_deposit, chain_environ, sign_deposit
from tests.support.charges_support import admit_charge, charge_chain, fund
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.relay_support import admit_close, admit_relay, allow_market, relay_rows


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=3, users=3)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))


@pytest.fixture
def rdb(db: psycopg.Connection, devnet: DevnetHandle) -> psycopg.Connection:
    allow_market(db, devnet.genesis["contracts"]["market"])
    if db.execute("SELECT to_regclass('paygate.bot_job_allowlist') IS NOT NULL").fetchone()[0]:
        # Bot jobs' own allow-list, where the schema has one.
        db.execute("INSERT INTO paygate.bot_job_allowlist (contract, function) VALUES (%s, 'close_expired') "
                   "ON CONFLICT DO NOTHING", (devnet.genesis["contracts"]["market"],))
    return db


def tamper(db: psycopg.Connection, lineage_id: int) -> None:
    """Flip one byte of the stored ciphertext (the journal's guard trigger would refuse it: bypassed)."""
    with db.transaction():
        db.execute("SET LOCAL session_replication_role = replica")
        db.execute("UPDATE paygate.lineages SET envelope = set_byte(envelope, 20, get_byte(envelope, 20) # 1) "
                   "WHERE id = %s", (lineage_id,))


def in_flight(db: psycopg.Connection, lineage_id: int) -> tuple[str, str]:
    state, lane = db.execute("SELECT state, lane FROM paygate.lineages WHERE id = %s", (lineage_id,)).fetchone()
    assert state in ("signed", "sent"), state
    return state, lane


def assert_parked_and_fenced(db: psycopg.Connection, lineage_id: int, lane: str) -> None:
    state, parked = db.execute("SELECT state, parked_reason FROM paygate.lineages WHERE id = %s",
                               (lineage_id,)).fetchone()
    # Still live: its bytes may land; only the chain may end it.
    assert state in ("signed", "sent") and "does not decrypt" in parked
    status, drained_by, why = db.execute(
        "SELECT status, drained_by, drain_reason FROM paygate.lanes WHERE address = %s", (lane,)).fetchone()
    assert status == "drained" and drained_by == "paygate:envelope_tampered" and "does not decrypt" in why
    assert db.execute("SELECT count(*) FROM paygate.audit_log WHERE action = 'lane.fence' AND target = %s",
                      (lane,)).fetchone()[0] == 1


def tick_until(chain: ChainEnv, worker: str, done: object, rounds: int = 12) -> None:
    """Ticks (never exit 3 again) until done() holds."""
    for _ in range(rounds):
        result = chain.tick(worker)
        assert result.code in (0, 1), (result.code, result.err)
        if done():  # type: ignore[operator]
            return
        chain.devnet.close_ledger()
    raise AssertionError(f"{worker} did not get there")


def test_a_relay_whose_envelope_does_not_decrypt_needs_a_human_and_blocks_nothing(
        chain: ChainEnv, rdb: psycopg.Connection) -> None:
    users = chain.genesis["users"]
    stuck = admit_relay(rdb, chain.devnet, users[0], "r-tampered")
    chain.devnet.set_fault("drop_next")  # accepted, never included: the lineage stays in flight
    assert chain.tick("relay").code == 0
    lineage_id = relay_rows(rdb)[stuck]["lineage_id"]
    _, lane = in_flight(rdb, lineage_id)
    tamper(rdb, lineage_id)
    fresh = admit_relay(rdb, chain.devnet, users[1], "r-fresh")
    chain.devnet.close_ledger()

    first = chain.tick("relay")
    assert first.code == 3, first.err
    row = relay_rows(rdb)[stuck]
    assert row["status"] == "needs_human" and "does not decrypt" in row["reason"]
    assert row["lineage_id"] == lineage_id  # the evidence stays attached
    assert rdb.execute("SELECT status FROM paygate.fee_reservations WHERE relay_id = %s", (stuck,)).fetchone() == (
        "reserved",)  # its bytes may still burn a fee: a human decides
    assert_parked_and_fenced(rdb, lineage_id, lane)

    tick_until(chain, "relay", lambda: relay_rows(rdb)[fresh]["status"] == "applied")
    fresh_lane = rdb.execute("SELECT x.lane FROM paygate.relays r JOIN paygate.lineages x ON x.id = r.lineage_id "
                             "WHERE r.id = %s", (fresh,)).fetchone()[0]
    assert fresh_lane != lane
    attempts = relay_rows(rdb)[stuck]["attempts"]
    assert chain.tick("relay").code == 0  # never claimed again, never reported again
    assert relay_rows(rdb)[stuck]["attempts"] == attempts


def test_a_deposit_whose_envelope_does_not_decrypt_needs_a_human_and_blocks_nothing(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    users = chain.genesis["users"]
    entry, nonce, expiration = sign_deposit(chain.devnet, users[0]["secret"], 500)
    stuck = admit_deposit(db, users[0]["public"], 500, entry, nonce, expiration, "d-tampered")
    chain.devnet.set_fault("drop_next")
    assert chain.tick("funding").code == 0
    lineage_id = db.execute("SELECT deposit_lineage_id FROM paygate.deposits WHERE id = %s",
                            (stuck,)).fetchone()[0]
    _, lane = in_flight(db, lineage_id)
    tamper(db, lineage_id)
    entry, nonce, expiration = sign_deposit(chain.devnet, users[1]["secret"], 700)
    fresh = admit_deposit(db, users[1]["public"], 700, entry, nonce, expiration, "d-fresh")
    chain.devnet.close_ledger()

    first = chain.tick("funding")
    assert first.code == 3, first.err
    status, reason = db.execute("SELECT status, reason FROM paygate.deposits WHERE id = %s",
                                (stuck,)).fetchone()
    assert status == "needs_human" and "does not decrypt" in reason
    assert_parked_and_fenced(db, lineage_id, lane)

    def settled() -> bool:
        return db.execute("SELECT status FROM paygate.deposits WHERE id = %s",
                          (fresh,)).fetchone()[0] == "settled"

    tick_until(chain, "funding", settled)  # the parked lineage is swept every tick, reported never again
    lanes = {r[0] for r in db.execute("SELECT lane FROM paygate.lineages WHERE entitlement LIKE %s",
                                      (f"deposit:{fresh}:%",))}
    assert lane not in lanes


def test_a_charge_batch_whose_envelope_does_not_decrypt_needs_a_human_and_blocks_nothing(
        devnet: DevnetHandle, dsn: str, tmp_path: Path, db: psycopg.Connection) -> None:
    chain = charge_chain(devnet, dsn, tmp_path / "keys")
    users = chain.genesis["users"]
    fund(chain, db, [(users[0], 10_000)])
    held = [admit_charge(db, users[0]["public"], 10, f"c-{n}")[0] for n in range(2)]
    chain.devnet.set_fault("drop_next")
    assert chain.tick("settlement").code == 0
    lineage_id = db.execute("SELECT lineage_id FROM paygate.charges WHERE id = %s", (held[0],)).fetchone()[0]
    _, lane = in_flight(db, lineage_id)
    tamper(db, lineage_id)
    chain.devnet.close_ledger()

    first = chain.tick("settlement")
    assert first.code == 3, first.err
    rows = db.execute("SELECT status, reason, lineage_id FROM paygate.charges WHERE id = ANY(%s)", (held,)).fetchall()
    assert all(s == "needs_human" and "does not decrypt" in r and x == lineage_id for s, r, x in rows), rows
    assert db.execute("SELECT outcome FROM paygate.charge_batches WHERE lineage_id = %s",
                      (lineage_id,)).fetchone() == ("needs_human",)
    assert_parked_and_fenced(db, lineage_id, lane)

    fresh = admit_charge(db, users[0]["public"], 10, "c-fresh")[0]

    def batched() -> bool:
        row = db.execute("SELECT x.state, x.lane FROM paygate.charges c JOIN paygate.lineages x ON x.id = c.lineage_id "
                         "WHERE c.id = %s", (fresh,)).fetchone()
        return row is not None and row[0] == "applied"

    tick_until(chain, "settlement", batched)
    assert db.execute("SELECT x.lane FROM paygate.charges c JOIN paygate.lineages x ON x.id = c.lineage_id "
                      "WHERE c.id = %s", (fresh,)).fetchone()[0] != lane
    assert {r[0] for r in db.execute("SELECT status FROM paygate.charges WHERE id = ANY(%s)", (held,))} == {
        "needs_human"}  # never claimed again while their lineage could land


def test_a_bot_job_whose_envelope_does_not_decrypt_needs_a_human_and_blocks_nothing(
        chain: ChainEnv, rdb: psycopg.Connection) -> None:
    from paygate_cli.sandbox.devnet.contracts.market import ORDER_TTL_LEDGERS

    users = chain.genesis["users"]
    admit_relay(rdb, chain.devnet, users[0], "order-0")
    admit_relay(rdb, chain.devnet, users[1], "order-1")
    tick_until(chain, "relay", lambda: rdb.execute(
        "SELECT count(*) FROM paygate.relays WHERE status = 'applied'").fetchone()[0] == 2)
    chain.devnet.close_ledger(ORDER_TTL_LEDGERS + 1)
    stuck = admit_close(rdb, chain.devnet, users[0]["public"])
    chain.devnet.set_fault("drop_next")
    assert chain.tick("relay_drainer").code == 0
    lineage_id = rdb.execute("SELECT lineage_id FROM paygate.bot_jobs WHERE id = %s", (stuck,)).fetchone()[0]
    _, lane = in_flight(rdb, lineage_id)
    tamper(rdb, lineage_id)
    fresh = rdb.execute("SELECT bot_job_id FROM paygate.admit_bot_job('close:fresh', %s, 'close_expired', %s)",
                        (chain.genesis["contracts"]["market"],
                         scval.to_vec([scval.to_address(users[1]["public"])]).to_xdr())).fetchone()[0]
    chain.devnet.close_ledger()

    first = chain.tick("relay_drainer")
    assert first.code == 3, first.err
    status, reason, pointer = rdb.execute("SELECT status, reason, lineage_id FROM paygate.bot_jobs WHERE id = %s",
                                          (stuck,)).fetchone()
    assert status == "needs_human" and "does not decrypt" in reason and pointer == lineage_id
    assert_parked_and_fenced(rdb, lineage_id, lane)

    tick_until(chain, "relay_drainer", lambda: rdb.execute(
        "SELECT status FROM paygate.bot_jobs WHERE id = %s", (fresh,)).fetchone()[0] == "applied")
    assert rdb.execute("SELECT x.lane FROM paygate.bot_jobs j JOIN paygate.lineages x ON x.id = j.lineage_id "
                       "WHERE j.id = %s", (fresh,)).fetchone()[0] != lane


def test_a_parked_batch_that_lands_after_all_is_settled_from_the_chains_events(
        devnet: DevnetHandle, dsn: str, tmp_path: Path, db: psycopg.Connection) -> None:
    """The parked lineage's bytes were accepted and stay queued: they land after the lineage was
    parked. The chain is the fact: the sweep records the receipt by hash (no decryption needed), and
    the observer settles the charges that were handed to a human, once, quarantining nothing."""
    chain = charge_chain(devnet, dsn, tmp_path / "keys")
    users = chain.genesis["users"]
    fund(chain, db, [(users[0], 10_000)])
    held = [admit_charge(db, users[0]["public"], 10, f"late-{n}")[0] for n in range(2)]
    chain.devnet.set_fault("hold_next", ledgers=3)
    assert chain.tick("settlement").code == 0
    lineage_id = db.execute("SELECT lineage_id FROM paygate.charges WHERE id = %s", (held[0],)).fetchone()[0]
    in_flight(db, lineage_id)
    tamper(db, lineage_id)
    chain.devnet.close_ledger()
    assert chain.tick("settlement").code == 3
    assert {r[0] for r in db.execute("SELECT status FROM paygate.charges WHERE id = ANY(%s)", (held,))} == {
        "needs_human"}
    balance = db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s",
                         (users[0]["public"],)).fetchone()[0]

    chain.devnet.close_ledger(4)  # the held bytes land
    # With no other charge work, settlement's sweep records the receipt (the lineage is an orphan
    # once it is a few seconds old); then the observer reads the events.
    import time

    def applied() -> bool:
        time.sleep(1)
        return db.execute("SELECT state FROM paygate.lineages WHERE id = %s", (lineage_id,)).fetchone()[0] == "applied"

    tick_until(chain, "settlement", applied)
    result = chain.tick("observer")
    assert result.code == 0, result.err[-2000:]
    rows = db.execute("SELECT status, settled_ledger FROM paygate.charges WHERE id = ANY(%s)", (held,)).fetchall()
    assert all(status == "settled" and ledger is not None for status, ledger in rows), rows
    assert db.execute("SELECT count(*) FROM paygate.chain_events WHERE quarantined").fetchone()[0] == 0
    assert db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s",
                      (users[0]["public"],)).fetchone()[0] == balance  # debited once, at admission


def test_a_parked_relay_lineage_is_driven_to_its_end_with_no_other_relay_waiting(
        chain: ChainEnv, rdb: psycopg.Connection) -> None:
    """A quiet relay queue still resolves the lineages no queued relay holds (here the parked one,
    whose held bytes land after all): nothing else would, and a live lineage pins its lane."""
    users = chain.genesis["users"]
    stuck = admit_relay(rdb, chain.devnet, users[0], "r-parked-quiet")
    chain.devnet.set_fault("hold_next", ledgers=3)
    assert chain.tick("relay").code == 0
    lineage_id = relay_rows(rdb)[stuck]["lineage_id"]
    in_flight(rdb, lineage_id)
    tamper(rdb, lineage_id)
    chain.devnet.close_ledger()
    assert chain.tick("relay").code == 3
    assert relay_rows(rdb)[stuck]["status"] == "needs_human"
    chain.devnet.close_ledger(4)  # the held bytes land
    with rdb.transaction():  # as if the orphan grace (a minute) had passed, without waiting for it
        rdb.execute("SET LOCAL session_replication_role = replica")
        rdb.execute("UPDATE paygate.lineages SET created_at = created_at - interval '2 minutes' WHERE id = %s",
                    (lineage_id,))
    result = chain.tick("relay")
    assert result.code == 0, result.err[-2000:]
    assert rdb.execute("SELECT state FROM paygate.lineages WHERE id = %s", (lineage_id,)).fetchone()[0] == "applied"
