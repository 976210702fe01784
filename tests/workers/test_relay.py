"""The relay worker, relay expiry and the bot-job drainer against a real devnet and a real Postgres."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import xdr

from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.relay_support import (
    MAX_FEE,
    admit_close,
    admit_relay,
    allow_market,
    assert_relay_invariants,
    chain_fee,
    relay_rows,
    run_until_quiet,
    sign_buy,
)


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=4, users=3)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))


@pytest.fixture
def rdb(db: psycopg.Connection, devnet: DevnetHandle) -> psycopg.Connection:
    allow_market(db, devnet.genesis["contracts"]["market"])
    db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES ('http://127.0.0.1:9/h', "
               "'0123456789abcdef0123')")
    return db


def details(result: object) -> dict:
    return json.loads(result.out)["run_tick"]["last_details"]  # type: ignore[attr-defined]


def test_relays_apply_or_fail_on_chain_and_settle_the_exact_fee(chain: ChainEnv, rdb: psycopg.Connection) -> None:
    users = chain.genesis["users"]
    ok = admit_relay(rdb, chain.devnet, users[0], "r-ok", "book", 7)
    run_until_quiet(chain, rdb)
    first = admit_relay(rdb, chain.devnet, users[1], "r-limited-1", "limited", 9)
    second = admit_relay(rdb, chain.devnet, users[2], "r-limited-2", "limited", 9)
    tick = chain.tick("relay")
    assert tick.code == 0, tick.err
    assert details(tick) == {"sent": 2}  # both simulate fine and go out in one tick, on two lanes
    run_until_quiet(chain, rdb)
    rows = relay_rows(rdb)
    assert rows[ok]["status"] == "applied"
    # The one-of-a-kind item: whichever applied first got it, the other failed on chain (fee burned).
    outcomes = [(r["status"], r["reason"]) for r in rows.values()]
    assert sorted([rows[first]["status"], rows[second]["status"]]) == ["applied", "failed"], outcomes
    loser = rows[first] if rows[first]["status"] == "failed" else rows[second]
    assert "failed on chain" in loser["reason"]
    for row in rows.values():
        status, fee = chain_fee(chain, bytes(row["tx_hash"]))
        assert status == ("SUCCESS" if row["status"] == "applied" else "FAILED")
        assert row["fee_charged"] == fee and 0 < fee <= MAX_FEE
    assert_relay_invariants(chain, rdb)
    events = [r[0] for r in rdb.execute("SELECT event_type FROM paygate.webhook_outbox WHERE event_type LIKE 'relay.%' "
                                         "AND event_type <> 'relay.queued'")]
    assert sorted(events) == ["relay.applied", "relay.applied", "relay.failed"]


def test_expired_authorisation_is_an_early_terminal_and_releases_the_reservation(
        chain: ChainEnv, rdb: psycopg.Connection) -> None:
    users = chain.genesis["users"]
    late = admit_relay(rdb, chain.devnet, users[0], "r-late", valid_ledgers=1)
    chain.devnet.close_ledger(2)
    run_until_quiet(chain, rdb)
    row = relay_rows(rdb)[late]
    assert row["status"] == "expired" and "expired at ledger" in row["reason"] and row["lineage_id"] is None
    assert rdb.execute("SELECT status FROM paygate.fee_reservations WHERE relay_id = %s", (late,)).fetchone() == (
        "released",)
    assert rdb.execute("SELECT count(*) FROM paygate.lineages").fetchone()[0] == 0  # nothing was ever signed
    assert_relay_invariants(chain, rdb)


def test_relay_expiry_worker_expires_once_and_never_a_relay_in_flight(chain: ChainEnv, rdb: psycopg.Connection) -> None:
    users = chain.genesis["users"]
    idle = admit_relay(rdb, chain.devnet, users[0], "r-idle", valid_ledgers=2)
    flying = admit_relay(rdb, chain.devnet, users[1], "r-flying", valid_ledgers=2)
    # Put `flying` in flight (signed and sent) without letting `idle` be claimed: expiry must wait for it.
    rdb.execute("UPDATE paygate.relays SET lease_expires_at = now() + interval '1 hour' WHERE id = %s", (idle,))
    # The devnet accepts the transaction and never includes it while the ledgers pass its authorisation.
    chain.devnet.set_fault("drop_next")
    assert chain.tick("relay").code == 0
    rdb.execute("UPDATE paygate.relays SET lease_expires_at = NULL WHERE id = %s", (idle,))
    assert relay_rows(rdb)[flying]["lineage_id"] is not None
    chain.devnet.close_ledger(4)
    first = chain.tick("relay_expiry")
    assert first.code == 0, first.err
    rows = relay_rows(rdb)
    assert rows[idle]["status"] == "expired" and rows[flying]["status"] == "queued"  # its lineage could land
    assert chain.tick("relay_expiry").code == 0  # again: nothing new, no second event
    chain.devnet.clear_faults()
    run_until_quiet(chain, rdb)  # the relay worker proves the lineage dead, then ends the relay expired
    rows = relay_rows(rdb)
    assert rows[flying]["status"] == "expired"
    expired_events = rdb.execute("SELECT payload->>'relay_id' FROM paygate.webhook_outbox "
                                 "WHERE event_type = 'relay.expired' ORDER BY 1").fetchall()
    assert expired_events == [(str(idle),), (str(flying),)]
    assert_relay_invariants(chain, rdb)


def test_bad_input_is_quarantined_with_the_reason_and_the_queue_keeps_moving(
        chain: ChainEnv, rdb: psycopg.Connection) -> None:
    g = chain.genesis
    users, market = g["users"], g["contracts"]["market"]
    good = admit_relay(rdb, chain.devnet, users[0], "good")
    other_net = admit_relay(rdb, chain.devnet, users[1], "other-net", passphrase="Test SDF Network ; September 2015")
    # An entry signed by one of our lanes, as ADDRESS credentials, for a relay "of" that lane.
    lane = g["lanes"][0]
    args, entry = sign_buy(chain.devnet, lane["secret"])
    own = rdb.execute("SELECT relay_id FROM paygate.admit_relay(%s, %s, 'buy', %s, %s, %s, 'own')",
                      (lane["public"], market, args, [entry], MAX_FEE)).fetchone()[0]
    # Passes the SQL shape checks (credentials, nonce, expiration) but is garbage after them.
    _, real = sign_buy(chain.devnet, users[2]["secret"])
    raw = xdr.SorobanAuthorizationEntry.from_xdr(real).to_xdr_bytes()
    import base64
    garbage = base64.b64encode(raw[:60] + b"\xff" * 40).decode()
    malformed = rdb.execute("SELECT relay_id FROM paygate.admit_relay(%s, %s, 'buy', %s, %s, %s, 'garbage')",
                            (users[2]["public"], market, sign_buy(chain.devnet, users[2]["secret"])[0], [garbage],
                             MAX_FEE)).fetchone()[0]
    # Allow-listed at admission, removed by the operator since: quarantined by the worker.
    rdb.execute("INSERT INTO paygate.relay_allowlist (contract, function) VALUES (%s, 'orders')", (market,))
    from stellar_sdk import scval
    orders_args = scval.to_vec([scval.to_address(users[0]["public"])]).to_xdr()
    unlisted = rdb.execute("SELECT relay_id FROM paygate.admit_relay(%s, %s, 'orders', %s, %s, %s, 'unlisted')",
                           (users[0]["public"], market, orders_args, [entry], MAX_FEE)).fetchone()[0]
    rdb.execute("DELETE FROM paygate.relay_allowlist WHERE function = 'orders'")
    run_until_quiet(chain, rdb)
    rows = relay_rows(rdb)
    assert rows[good]["status"] == "applied"
    assert rows[other_net]["status"] == "rejected" and "does not verify for this network" in rows[other_net]["reason"]
    assert rows[own]["status"] == "rejected" and "gateway's own accounts" in rows[own]["reason"]
    assert rows[malformed]["status"] == "rejected" and "not a SorobanAuthorizationEntry" in rows[malformed]["reason"]
    assert rows[unlisted]["status"] == "rejected" and "allow-list" in rows[unlisted]["reason"]
    assert_relay_invariants(chain, rdb)


def test_bot_jobs_close_expired_orders_once_per_job_key(chain: ChainEnv, rdb: psycopg.Connection) -> None:
    from paygate_cli.sandbox.devnet.contracts.market import ORDER_TTL_LEDGERS

    users = chain.genesis["users"]
    admit_relay(rdb, chain.devnet, users[0], "order-1")
    run_until_quiet(chain, rdb)
    early = admit_close(rdb, chain.devnet, users[0]["public"], key="close:early")
    run_until_quiet(chain, rdb, "relay_drainer")
    row = rdb.execute("SELECT status, reason FROM paygate.bot_jobs WHERE id = %s", (early,)).fetchone()
    assert row[0] == "failed" and "#4" in row[1]  # not expired yet: refused at simulation, nothing sent
    chain.devnet.close_ledger(ORDER_TTL_LEDGERS + 1)
    job = admit_close(rdb, chain.devnet, users[0]["public"])
    assert admit_close(rdb, chain.devnet, users[0]["public"]) == job  # dedup per job key
    run_until_quiet(chain, rdb, "relay_drainer")
    status, fee, tx = rdb.execute("SELECT status, fee_charged, tx_hash FROM paygate.bot_jobs WHERE id = %s",
                                  (job,)).fetchone()
    assert status == "applied" and chain_fee(chain, bytes(tx)) == ("SUCCESS", fee)
    assert rdb.execute("SELECT count(*) FROM paygate.lineages WHERE entitlement = %s AND state = 'applied'",
                       (f"bot_job:{job}",)).fetchone()[0] == 1


def test_nonce_spent_elsewhere_needs_a_human_and_nonce_inspect_shows_it(
        chain: ChainEnv, rdb: psycopg.Connection) -> None:
    from stellar_sdk import Keypair, TransactionBuilder

    from tests.support.cli import run_cli

    g = chain.genesis
    users, market = g["users"], g["contracts"]["market"]
    applied = admit_relay(rdb, chain.devnet, users[0], "r-applied")
    run_until_quiet(chain, rdb)
    # The user (or anyone holding the entry) submits the same authorisation without the gateway.
    args, entry = sign_buy(chain.devnet, users[1]["secret"])
    spent = rdb.execute("SELECT relay_id FROM paygate.admit_relay(%s, %s, 'buy', %s, %s, %s, 'spent')",
                        (users[1]["public"], market, args, [entry], MAX_FEE)).fetchone()[0]
    other = Keypair.from_secret(users[2]["secret"])
    with chain.server() as server:
        tx = (TransactionBuilder(server.load_account(other.public_key), g["passphrase"], base_fee=100)
              .append_invoke_contract_function_op(market, "buy", list(xdr.SCVal.from_xdr(args).vec.sc_vec),
                                                  auth=[xdr.SorobanAuthorizationEntry.from_xdr(entry)])
              .set_timeout(300).build())
        tx = server.prepare_transaction(tx)
        tx.sign(other)
        assert server.send_transaction(tx).status.value == "PENDING"
    chain.devnet.close_ledger()
    result = chain.tick("relay")
    assert result.code == 3, result.err  # needs a human: never guessed
    row = relay_rows(rdb)[spent]
    assert row["status"] == "needs_human" and "consumed on chain" in row["reason"]
    assert rdb.execute("SELECT status FROM paygate.fee_reservations WHERE relay_id = %s", (spent,)).fetchone() == (
        "reserved",)  # a human decides; nothing released or settled by guess

    ok = run_cli("nonce-inspect", "--json", "--relay", str(applied), environ=chain.environ)
    assert ok.code == 0, ok.err
    report = json.loads(ok.out)["relay"]
    assert report["authorisation"]["consumed_on_chain"] == report["authorisation"]["nonces"]
    assert [lin["state"] for lin in report["lineages"]] == ["applied"]
    assert report["fee_reservation"]["status"] == "settled" and report["fee_reservation"]["settled_fee"] > 0
    bad = run_cli("nonce-inspect", "--json", "--relay", str(spent), environ=chain.environ)
    assert bad.code == 3 and json.loads(bad.out)["needs_human"] is True
    plain = run_cli("nonce-inspect", "--relay", str(applied), environ=chain.environ)
    assert plain.code == 0 and entry not in plain.out + plain.err and "relay" in plain.out
    for lineage_envelope in rdb.execute("SELECT encode(envelope, 'base64') FROM paygate.lineages"):
        assert lineage_envelope[0][:40] not in ok.out


def test_a_settle_that_fails_rolls_the_disposition_flip_back(chain: ChainEnv, rdb: psycopg.Connection) -> None:
    """Only the flip's winner settles, and a settle that finds no open reservation undoes the flip:
    the relay is not recorded applied with its fee unaccounted; it stays queued and re-ticks."""
    users = chain.genesis["users"]
    relay = admit_relay(rdb, chain.devnet, users[0], "r-settle")
    assert chain.tick("relay").code == 0
    chain.devnet.close_ledger()
    # Something closed the reservation behind the worker's back (a bug, a hand-written UPDATE).
    assert rdb.execute("SELECT paygate.release_relay_fee(%s, 'closed by hand')", (relay,)).fetchone()[0] is True
    result = chain.tick("relay")
    assert result.code == 1 and details(result) == {"settle_failed": 1}, result.err
    row = relay_rows(rdb)[relay]
    assert row["status"] == "queued" and row["fee_charged"] is None and row["finished_at"] is None
    assert rdb.execute("SELECT state, inner_hash FROM paygate.lineages WHERE id = %s", (row["lineage_id"],)
                       ).fetchone() == ("applied", row["tx_hash"])  # the installed pointer, nothing more
    totals = rdb.execute("SELECT reserved, settled, released FROM paygate.relay_fee_totals").fetchone()
    assert totals == (0, 0, MAX_FEE)  # nothing settled by the rolled-back flip
    assert rdb.execute("SELECT count(*) FROM paygate.webhook_outbox WHERE event_type = 'relay.applied'"
                       ).fetchone()[0] == 0


def test_a_settle_failure_in_the_ticks_shared_disposition_stays_that_relays(
        chain: ChainEnv, rdb: psycopg.Connection) -> None:
    """A tick disposes of its included relays in one statement; one relay whose settle fails rolls
    that statement back, and the relays are then disposed of one by one: the other is applied and
    settled in the same tick, only the failing one stays queued."""
    users = chain.genesis["users"]
    broken, fine = (admit_relay(rdb, chain.devnet, user, f"r-shared-{n}") for n, user in enumerate(users[:2]))
    assert details(chain.tick("relay")) == {"sent": 2}
    chain.devnet.close_ledger()
    assert rdb.execute("SELECT paygate.release_relay_fee(%s, 'closed by hand')", (broken,)).fetchone()[0] is True
    result = chain.tick("relay")
    assert result.code == 1 and details(result) == {"applied": 1, "settle_failed": 1}, result.err
    rows = relay_rows(rdb)
    assert rows[broken]["status"] == "queued" and rows[broken]["fee_charged"] is None
    assert rows[fine]["status"] == "applied" and rows[fine]["fee_charged"] == chain_fee(chain, rows[fine]["tx_hash"])[1]
    assert rdb.execute("SELECT relay_id, status FROM paygate.fee_reservations ORDER BY relay_id").fetchall() == [
        (broken, "released"), (fine, "settled")]
    assert rdb.execute("SELECT settled FROM paygate.relay_fee_totals").fetchone()[0] == rows[fine]["fee_charged"]
    assert rdb.execute("SELECT count(*) FROM paygate.webhook_outbox WHERE event_type = 'relay.applied'"
                       ).fetchone()[0] == 1


def test_a_drained_instance_finishes_relays_in_flight_but_claims_nothing_new(
        chain: ChainEnv, rdb: psycopg.Connection) -> None:
    import logging
    import time

    from paygate_cli.context import TickContext
    from paygate_cli.db.connect import connect
    from paygate_cli.settings import load_settings
    from paygate_cli.workers import relay as relay_worker

    def drained_tick() -> None:
        settings = load_settings(chain.environ)
        with connect(settings, "test-relay") as conn:
            relay_worker.tick(TickContext(conn=conn, settings=settings, worker="relay", instance_id="drained-host",
                                          slot=0, batch=16, log=logging.getLogger("relay"), draining=True))

    users = chain.genesis["users"]
    in_flight = admit_relay(rdb, chain.devnet, users[0], "r-in-flight")
    assert chain.tick("relay").code == 0  # sent
    fresh = admit_relay(rdb, chain.devnet, users[1], "r-fresh")
    for _ in range(3):
        chain.devnet.close_ledger()
        time.sleep(1.05)  # the first tick's lease (1 s) lapses
        drained_tick()
    rows = relay_rows(rdb)
    assert rows[in_flight]["status"] == "applied"
    assert rows[fresh]["status"] == "queued" and rows[fresh]["lineage_id"] is None and rows[fresh]["attempts"] == 0


def test_bot_job_is_dead_after_its_attempts_are_each_proven_dead(chain: ChainEnv, rdb: psycopg.Connection) -> None:
    from paygate_cli.sandbox.devnet.contracts.market import ORDER_TTL_LEDGERS

    users = chain.genesis["users"]
    admit_relay(rdb, chain.devnet, users[0], "order")
    run_until_quiet(chain, rdb)
    chain.devnet.close_ledger(ORDER_TTL_LEDGERS + 1)
    from stellar_sdk import scval

    job = rdb.execute("SELECT bot_job_id FROM paygate.admit_bot_job('close:twice', %s, 'close_expired', %s, 2)",
                      (chain.genesis["contracts"]["market"],
                       scval.to_vec([scval.to_address(users[0]["public"])]).to_xdr())).fetchone()[0]
    chain.devnet.set_fault("drop_next", count=2)  # both attempts accepted, never included
    for _ in range(12):
        assert chain.tick("relay_drainer").code in (0, 1)
        if rdb.execute("SELECT status FROM paygate.bot_jobs WHERE id = %s", (job,)).fetchone()[0] != "queued":
            break
        chain.devnet.close_ledger(advance_seconds=70)  # past each lineage's maxTime: provably dead
    status, attempts, dead, reason = rdb.execute(
        "SELECT status, attempts, dead_lineages, reason FROM paygate.bot_jobs WHERE id = %s", (job,)).fetchone()
    assert status == "dead" and attempts == 2 and len(dead) == 2 and "proven dead" in reason
    states = [r[0] for r in rdb.execute("SELECT state FROM paygate.lineages WHERE entitlement = %s ORDER BY id",
                                        (f"bot_job:{job}",))]
    assert states == ["expired", "expired"]
