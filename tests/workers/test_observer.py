"""The billing observer: first-run start ledger, retention gap (exit 3), poison events quarantined
while the cursor moves on, pages applied exactly once, credit events winning funding's settle CAS."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import Keypair, TransactionBuilder, scval

from paygate_cli.chain.charges import EventsPage, RawEvent, cursor_ledger
from paygate_cli.errors import NeedsHuman
from paygate_cli.workers.observer import apply_page
from tests.support.chain_env import ChainEnv, admit_deposit, billing_balance, chain_environ, sign_deposit
from tests.support.charges_support import admit_charge, fund
from tests.support.cli import run_proc
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.drill_support import crash_tick

DEPOSIT = 20_000_000


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=4, users=3)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    # paygate uses lanes 0-2; lane 3 plays a second operator the gateway does not control.
    environ = chain_environ(devnet, dsn, tmp_path / "keys", lanes=3)
    environ.update(PAYGATE_OBSERVER_START_LEDGER="1", PAYGATE_SETTLEMENT_LEASE="1s")
    return ChainEnv(devnet, dsn, environ)


def cursor(db: psycopg.Connection) -> str | None:
    row = db.execute("SELECT cursor FROM paygate.observer_cursor").fetchone()
    return row[0] if row else None


def rogue_charge_batch(chain: ChainEnv, entries: list[tuple[str, int, bytes]]) -> None:
    """charge_batch sent by an operator key outside paygate (lane 3), then a ledger closed."""
    g = chain.genesis
    lane = Keypair.from_secret(g["lanes"][3]["secret"])
    with chain.server() as server:
        tx = (TransactionBuilder(server.load_account(lane.public_key), g["passphrase"], base_fee=100)
              .append_invoke_contract_function_op(g["contracts"]["billing"], "charge_batch", [
                  scval.to_address(lane.public_key),
                  scval.to_vec([scval.to_address(a) for a, _, _ in entries]),
                  scval.to_vec([scval.to_int128(n) for _, n, _ in entries]),
                  scval.to_vec([scval.to_bytes(c) for _, _, c in entries])])
              .set_timeout(300).build())
        tx = server.prepare_transaction(tx)
        tx.sign(lane)
        assert server.send_transaction(tx).status.value == "PENDING"
    applied = chain.devnet.close_ledger()["applied"]
    assert applied and applied[0]["status"] == "SUCCESS", applied


def test_first_run_without_cursor_or_start_ledger_refuses(chain: ChainEnv, db: psycopg.Connection) -> None:
    environ = {k: v for k, v in chain.environ.items() if k != "PAYGATE_OBSERVER_START_LEDGER"}
    result = run_proc("run-tick", "observer", "--once", environ=environ)
    assert result.code == 78, result.err
    assert "PAYGATE_OBSERVER_START_LEDGER is not set" in result.err and "genesis" in result.err
    assert cursor(db) is None


def test_cursor_is_stored_for_empty_pages_and_only_moves_forward(chain: ChainEnv, db: psycopg.Connection) -> None:
    assert chain.tick("observer").code == 0
    first = cursor(db)
    assert first is not None and cursor_ledger(first) == chain.devnet.latest_ledger()
    chain.devnet.close_ledger(n=3)
    assert chain.tick("observer").code == 0
    second = cursor(db)
    assert second > first and cursor_ledger(second) == chain.devnet.latest_ledger()
    with pytest.raises(psycopg.errors.CheckViolation, match="backwards"):
        db.execute("UPDATE paygate.observer_cursor SET cursor = %s", (first,))


def test_cursor_behind_retention_stops_with_exit_3(dsn: str, db: psycopg.Connection, tmp_path: Path) -> None:
    devnet = start_devnet(tmp_path / "short", lanes=2, users=1, retention=8)
    try:
        environ = chain_environ(devnet, dsn, tmp_path / "keys", lanes=2)
        _retention_gap(ChainEnv(devnet, dsn, {**environ, "PAYGATE_OBSERVER_START_LEDGER": "1"}), db)
    finally:
        devnet.stop()


def _retention_gap(chain: ChainEnv, db: psycopg.Connection) -> None:
    assert chain.tick("observer").code == 0
    before = cursor(db)
    chain.devnet.close_ledger(n=20)  # retention is 8 ledgers: the cursor's ledger is forgotten
    result = chain.tick("observer")
    assert result.code == 3, result.err
    assert "events may have been lost" in result.err
    assert cursor(db) == before  # it did not skip ahead silently


def test_poison_events_are_quarantined_and_the_cursor_moves_on(chain: ChainEnv, db: psycopg.Connection) -> None:
    user = chain.genesis["users"][0]["public"]
    fund(chain, db, [(chain.genesis["users"][0], DEPOSIT)])
    row_id, charge_id = admit_charge(db, user, 500, "real")
    stranger = os.urandom(32)
    # One unknown charge id, and the real charge id debited with a different amount.
    rogue_charge_batch(chain, [(user, 100, stranger), (user, 777, charge_id)])
    result = chain.tick("observer")
    assert result.code == 3, result.err  # alarmed
    assert "quarantined" in result.err
    rows = dict(db.execute("SELECT payload->>'ref', quarantine_reason FROM paygate.chain_events WHERE quarantined"
                           ).fetchall())
    assert "unknown charge id" in rows[stranger.hex()]
    assert "amount/account mismatch" in rows[charge_id.hex()]
    assert db.execute("SELECT status FROM paygate.charges WHERE id = %s", (row_id,)).fetchone()[0] == "authorized"
    moved = cursor(db)
    assert cursor_ledger(moved) == chain.devnet.latest_ledger()
    # The next tick does not re-alarm or re-apply: the events are stored once.
    chain.devnet.close_ledger()
    assert chain.tick("observer").code == 0
    assert db.execute("SELECT count(*) FROM paygate.chain_events WHERE quarantined").fetchone()[0] == 2
    assert cursor(db) > moved
    # paygate's own batch for that charge lands, but the contract skips the consumed id: no event.
    # The observer never guesses an outcome for it; once it has read past that ledger it asks a human.
    assert chain.tick("settlement").code == 0
    chain.devnet.close_ledger()
    assert chain.tick("settlement").code == 0
    assert db.execute("SELECT state FROM paygate.lineages WHERE purpose = 'charge_batch'").fetchone()[0] == "applied"
    chain.devnet.close_ledger()
    result = chain.tick("observer")
    assert result.code == 3 and "consumed by a transaction that is not ours" in result.err, result.err
    assert db.execute("SELECT status FROM paygate.charges WHERE id = %s", (row_id,)).fetchone()[0] == "authorized"


def test_a_page_is_applied_once_and_undecodable_events_are_quarantined(db: psycopg.Connection) -> None:
    account = Keypair.random().public_key
    db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 1000)", (account,))
    row_id, charge_id = admit_charge(db, account, 400, "k")
    from stellar_sdk import xdr

    def event(n: int, topics: list, value: object) -> RawEvent:
        return RawEvent(f"{(5 << 32) + n:019d}-0000000000", 5, "ab" * 32, "C" + "A" * 55,
                        [t.to_xdr() for t in topics],
                        value.to_xdr() if isinstance(value, xdr.SCVal) else str(value))

    who = scval.to_address(account)
    page = EventsPage([
        event(1, [scval.to_symbol("charge_failed"), who],
              scval.to_vec([scval.to_int128(400), scval.to_bytes(charge_id), scval.to_symbol("insufficient_balance")])),
        RawEvent(f"{(5 << 32) + 2:019d}-0000000000", 5, None, None, ["!!notxdr"], "AAAA"),
        event(3, [scval.to_symbol("surprise"), who], scval.to_int128(1)),
    ], f"{(6 << 32) - 1:019d}-4294967295", 6, 1)
    log = logging.getLogger("test")
    with db.transaction():
        stats = apply_page(db, page, None, log)
    assert stats.failed == 1 and len(stats.quarantined) == 2
    reasons = [r for _, r in stats.quarantined]
    assert any("undecodable: topic/value is not valid SCVal XDR" in r for r in reasons)
    assert any("unknown billing event type 'surprise'" in r for r in reasons)
    assert db.execute("SELECT status, failed_by FROM paygate.charges WHERE id = %s", (row_id,)).fetchone() == (
        "failed", "observer")
    assert db.execute("SELECT cached_balance FROM paygate.accounts").fetchone()[0] == 1000
    # The same page again (a crash after commit, a lagging node): nothing is applied twice.
    with db.transaction():
        again = apply_page(db, page, page.cursor, log)
    assert again.new == 0 and again.failed == 0 and not again.quarantined
    assert db.execute("SELECT cached_balance FROM paygate.accounts").fetchone()[0] == 1000
    assert db.execute("SELECT count(*) FROM paygate.chain_events").fetchone()[0] == 3


def test_a_catch_up_reads_the_next_page_ahead_and_a_kill_mid_catch_up_loses_and_doubles_nothing(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    """Pages of 2 events: each full page's successor is read (on a thread) while it is applied.
    A process killed after applying one page, its read-ahead in flight, leaves that page applied
    and its cursor stored; the next tick applies the rest once."""
    users = chain.genesis["users"][:3]
    fund(chain, db, [(u, DEPOSIT) for u in users])
    for i in range(9):
        admit_charge(db, users[i % 3]["public"], 100 + i, f"ahead-{i}")
    for _ in range(5):
        assert chain.tick("settlement").code == 0
        chain.devnet.close_ledger()
        if not db.execute("SELECT count(*) FROM paygate.charges WHERE status = 'authorized' AND lineage_id IS NULL"
                          " OR lineage_id IN (SELECT id FROM paygate.lineages WHERE state <> 'applied')"
                          ).fetchone()[0]:
            break
    on_chain = db.execute("SELECT count(*) FROM paygate.charges").fetchone()[0] + len(users)  # + the credits
    killed = crash_tick(chain.environ, "observer", "observer.after_apply", "--batch", "2")
    assert killed.code == -9, killed.err
    assert db.execute("SELECT count(*) FROM paygate.chain_events").fetchone()[0] == 2  # the first page, stored
    first_cursor = cursor(db)
    assert first_cursor is not None
    result = chain.tick("observer", "--batch", "2")
    assert result.code == 0, result.err
    details = json.loads(result.out)["run_tick"]["last_details"]
    remaining = on_chain - 2
    assert details["pages"] == remaining // 2 + 1  # full pages, then the short (or empty) last one
    assert details["read_ahead"] == details["pages"] - 1  # every full page's successor was read ahead
    assert details["events"] == remaining and details["quarantined"] == 0
    # Each event stored once, every charge settled from its own event, the cursor at the head.
    assert db.execute("SELECT count(*), count(DISTINCT event_id) FROM paygate.chain_events").fetchone() == (
        on_chain, on_chain)
    assert db.execute("SELECT count(*) FROM paygate.charges WHERE status <> 'settled'").fetchone()[0] == 0
    assert cursor_ledger(cursor(db)) == chain.devnet.latest_ledger() and cursor(db) > first_cursor


def test_credit_event_settles_a_deposit_whose_funding_process_died(chain: ChainEnv, db: psycopg.Connection) -> None:
    user = chain.genesis["users"][1]
    entry, nonce, expiration = sign_deposit(chain.devnet, user["secret"], DEPOSIT, valid_ledgers=500)
    pending_id = admit_deposit(db, user["public"], DEPOSIT, entry, nonce, expiration, "dep")
    crash = {**chain.environ, "PAYGATE_ENABLE_CRASHPOINTS": "1", "PAYGATE_CRASH_AT": "funding.before_settle"}
    for _ in range(10):
        result = run_proc("run-tick", "funding", "--once", environ=crash)
        if result.code == -9:
            break
        assert result.code == 0, result.err
        chain.devnet.close_ledger()
    else:
        raise AssertionError("funding never reached the settle step")
    assert db.execute("SELECT status FROM paygate.deposits WHERE id = %s", (pending_id,)).fetchone()[0] == \
        "pending"
    assert chain.tick("observer").code == 0
    status, by = db.execute("SELECT status, settled_by FROM paygate.deposits WHERE id = %s",
                            (pending_id,)).fetchone()
    assert (status, by) == ("settled", "observer")
    # Funding comes back: its settle CAS loses, the increment is not applied twice.
    assert chain.tick("funding").code == 0
    cached = db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s",
                        (user["public"],)).fetchone()[0]
    assert cached == DEPOSIT == billing_balance(chain, user["public"])
    assert db.execute("SELECT effect FROM paygate.chain_events").fetchone()[0] == "credited"


def test_the_observer_is_a_single_writer(chain: ChainEnv, db: psycopg.Connection) -> None:
    import subprocess
    import time

    from tests.support.cli import paygate_cmd

    first = subprocess.Popen(paygate_cmd("run-tick", "observer", "--every", "0.2s", "--for", "20s"),
                             env=chain.environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if cursor(db) is not None:
                break
            time.sleep(0.1)
        second = run_proc("run-tick", "observer", "--once", "--lock-wait", "0", environ=chain.environ)
        assert second.code == 75, second.err  # skipped: the lock is held
    finally:
        first.terminate()
        assert first.wait(30) == 0


def test_a_stale_cursor_never_overwrites_a_newer_one(db: psycopg.Connection) -> None:
    log = logging.getLogger("test")
    first = EventsPage([], f"{(8 << 32) - 1:019d}-4294967295", 7, 1)
    second = EventsPage([], f"{(9 << 32) - 1:019d}-4294967295", 8, 1)
    with db.transaction():
        apply_page(db, first, None, log)
    with db.transaction():
        apply_page(db, second, first.cursor, log)
    # A writer that still believes the cursor is `first` (a second observer) changes nothing.
    with pytest.raises(NeedsHuman, match="second observer is writing"), db.transaction():
        apply_page(db, EventsPage([], f"{(10 << 32) - 1:019d}-4294967295", 9, 1), first.cursor, log)
    with pytest.raises(NeedsHuman, match="second observer is writing"), db.transaction():
        apply_page(db, first, None, log)
    assert cursor(db) == second.cursor


def _charge_event(n: int, account: str, amount: int, charge_id: bytes, kind: str = "charge",
                  reason: str | None = None) -> RawEvent:
    value = [scval.to_int128(amount), scval.to_bytes(charge_id)] + ([scval.to_symbol(reason)] if reason else [])
    return RawEvent(f"{(5 << 32) + n:019d}-0000000000", 5, "cd" * 32, "C" + "B" * 55,
                    [scval.to_symbol(kind).to_xdr(), scval.to_address(account).to_xdr()], scval.to_vec(value).to_xdr())


def _counting(db: psycopg.Connection) -> list[str]:
    """Every statement `db` runs from now on (a real connection; the list is what was sent)."""
    sent: list[str] = []
    original = db.execute

    def execute(query: object, *args: object, **kwargs: object) -> object:
        sent.append(str(query))
        return original(query, *args, **kwargs)

    db.execute = execute  # type: ignore[method-assign]
    return sent


def test_a_page_is_applied_set_based_with_what_each_event_did(db: psycopg.Connection) -> None:
    from tests.support.charges_support import add_endpoint

    add_endpoint(db)
    accounts = [Keypair.random().public_key for _ in range(3)]
    for account in accounts:
        db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 10000)", (account,))
    charges = [admit_charge(db, accounts[i % 3], 100 + i, f"p{i}") for i in range(30)]
    mismatched_id, mismatched_charge = charges[5]
    events = [_charge_event(i, accounts[i % 3], 100 + i, charge_id) for i, (_, charge_id) in enumerate(charges)
              if i not in (5, 7)]
    events.append(_charge_event(5, accounts[5 % 3], 999, mismatched_charge))  # amount differs from the row
    events.append(_charge_event(7, accounts[7 % 3], 107, charges[7][1], "charge_failed", "insufficient_balance"))
    events.append(_charge_event(40, accounts[0], 1, os.urandom(32)))  # no such charge
    log = logging.getLogger("test")
    page = EventsPage(events, f"{(6 << 32) - 1:019d}-4294967295", 6, 1)
    sent = _counting(db)
    with db.transaction():
        stats = apply_page(db, page, None, log)
    assert (stats.settled, stats.failed, len(stats.quarantined)) == (28, 1, 2)
    # Set-based: the cursor, the seen-check, one statement per kind, one insert; plus one diagnosis per
    # event that matched nothing. Never one statement per event.
    assert len(sent) == 5 + 2, sent
    stored = {r[0]: r[1:] for r in db.execute(
        "SELECT event_id, kind, payload, applied_to, effect, quarantined, quarantine_reason FROM paygate.chain_events")}
    first = stored[events[0].id]
    assert first == ("charge", {"account": accounts[0], "amount": "100", "ref": charges[0][1].hex()},
                     f"charge:{charges[0][0]}", "settled", False, None)
    failed = stored[events[-2].id]
    assert failed[1] == {"account": accounts[1], "amount": "107", "ref": charges[7][1].hex(),
                         "reason": "insufficient_balance"} and failed[3] == "failed"
    assert "amount/account mismatch" in stored[events[-3].id][5]
    assert "unknown charge id" in stored[events[-1].id][5]
    assert db.execute("SELECT status FROM paygate.charges WHERE id = %s", (mismatched_id,)).fetchone()[0] == \
        "authorized"
    outbox = dict(db.execute("SELECT event_type, count(*) FROM paygate.webhook_outbox "
                             "WHERE event_type IN ('charge.settled', 'charge.failed') GROUP BY 1").fetchall())
    assert outbox == {"charge.settled": 28, "charge.failed": 1}
    payload = db.execute("SELECT payload FROM paygate.webhook_outbox WHERE event_type = 'charge.failed'").fetchone()[0]
    assert payload["balance"] == str(10000 - sum(100 + i for i in range(30) if i % 3 == 1) + 107)
    assert payload["reason"] == "insufficient_balance" and payload["charge_row_id"] == charges[7][0]
