"""`replay relays` and `replay bot_jobs` against a real devnet and a real Postgres: a dead relay goes
back to queued under its idempotency key with its fee reserved again through admission's budget
rule, and applies; refusals per row when the lineage is not terminal, the effect is on chain (an
applied lineage, or the authorisation nonce consumed as a majority of read endpoints see it), the
authorisation expired, or the budget cannot cover it; a dead bot job replayed applies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import Keypair, TransactionBuilder, scval, xdr

from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.cli import run_cli
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.pg import hand_edit
from tests.support.relay_support import (
    MAX_FEE,
    admit_relay,
    allow_market,
    assert_relay_invariants,
    relay_rows,
    run_until_quiet,
    sign_buy,
)


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=3)
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


def replay(chain: ChainEnv, queue: str, *args: str) -> tuple[int, dict[int, dict]]:
    result = run_cli("replay", queue, *args, "--yes", "--json", environ=chain.environ)
    assert result.out, result.err
    return result.code, {r["id"]: r for r in json.loads(result.out)["replay"]["rows"]}


def reservations(db: psycopg.Connection, relay_id: int) -> list[tuple]:
    return db.execute("SELECT round, status, amount FROM paygate.fee_reservations WHERE relay_id = %s ORDER BY round",
                      (relay_id,)).fetchall()


def set_allowed(db: psycopg.Connection, market: str, enabled: bool) -> None:
    db.execute("UPDATE paygate.relay_allowlist SET enabled = %s WHERE contract = %s AND function = 'buy'",
               (enabled, market))


def test_a_rejected_relay_replayed_reserves_its_fee_again_and_applies(chain: ChainEnv, rdb: psycopg.Connection) -> None:
    market = chain.genesis["contracts"]["market"]
    users = chain.genesis["users"]
    relay = admit_relay(rdb, chain.devnet, users[0], "r-replay")
    set_allowed(rdb, market, False)  # taken off the allow-list after admission: the worker quarantines it
    run_until_quiet(chain, rdb)
    row = relay_rows(rdb)[relay]
    assert row["status"] == "rejected" and "allow-list" in row["reason"]
    assert reservations(rdb, relay) == [(1, "released", MAX_FEE)]

    code, rows = replay(chain, "relays", str(relay))  # still off the list: it would be rejected again
    assert code == 1 and "not on the relay allow-list" in rows[relay]["reason"]
    set_allowed(rdb, market, True)
    dry = run_cli("replay", "relays", "--all-dead", "--dry-run", "--json", environ=chain.environ)
    assert dry.code == 0 and [(r["id"], r["outcome"]) for r in json.loads(dry.out)["replay"]["rows"]] == [
        (relay, "would_replay")]
    assert relay_rows(rdb)[relay]["status"] == "rejected"  # a dry run changes nothing

    code, rows = replay(chain, "relays", "--all-dead")
    assert code == 0 and rows[relay]["outcome"] == "replayed", rows
    row = relay_rows(rdb)[relay]
    assert (row["status"], row["attempts"], row["reason"], row["idempotency_key"]) == ("queued", 0, None, "r-replay")
    assert reservations(rdb, relay) == [(1, "released", MAX_FEE), (2, "reserved", MAX_FEE)]
    assert rdb.execute("SELECT reserved, released FROM paygate.relay_fee_totals").fetchone() == (MAX_FEE, MAX_FEE)
    assert rdb.execute("SELECT action, target FROM paygate.audit_log").fetchall() == [
        ("replay.relays", f"relays:{relay}")]
    assert rdb.execute("SELECT count(*) FROM paygate.webhook_outbox WHERE event_type = 'relay.replayed'"
                       ).fetchone()[0] == 1

    run_until_quiet(chain, rdb)
    row = relay_rows(rdb)[relay]
    assert row["status"] == "applied" and row["fee_charged"] > 0
    assert reservations(rdb, relay)[1][1] == "settled"
    assert_relay_invariants(chain, rdb)
    code, rows = replay(chain, "relays", str(relay))
    assert code == 1 and rows[relay]["reason"] == "not dead (status applied)"


def test_replay_refuses_a_relay_whose_budget_is_gone_and_rolls_back_if_it_went_while_replaying(
        chain: ChainEnv, rdb: psycopg.Connection) -> None:
    from paygate_cli.ops import replay as ops_replay

    market = chain.genesis["contracts"]["market"]
    users = chain.genesis["users"]
    relay = admit_relay(rdb, chain.devnet, users[0], "r-budget")
    set_allowed(rdb, market, False)
    run_until_quiet(chain, rdb)
    set_allowed(rdb, market, True)
    admit_relay(rdb, chain.devnet, users[1], "r-holding")  # queued, holds MAX_FEE of the budget
    rdb.execute("UPDATE paygate.relay_config SET fee_budget = %s", (MAX_FEE + MAX_FEE // 2,))
    code, rows = replay(chain, "relays", str(relay))
    assert code == 1 and "fee budget cannot cover it" in rows[relay]["reason"]

    # Planned while the budget covered it; gone by the time the replay's transaction runs: the CAS
    # that put the row back is rolled back with the refused reservation.
    rdb.execute("UPDATE paygate.relay_config SET fee_budget = %s", (2 * MAX_FEE,))
    from paygate_cli.db.connect import connect
    from paygate_cli.settings import load_settings

    settings = load_settings(chain.environ)
    spec = ops_replay.queue_spec("relays")
    with connect(settings, "test-replay") as conn:
        from paygate_cli.chain.rpc import ChainClient

        client = ChainClient(settings, guard_conn=conn)
        try:
            planned = ops_replay.plan(conn, client, spec, ids=[relay], since=None)
        finally:
            client.close()
        assert planned[0]["refusal"] is None
        rdb.execute("UPDATE paygate.relay_config SET fee_budget = %s", (MAX_FEE,))
        outcomes = ops_replay.apply(conn, spec, planned, actor="test", dry_run=False)
    assert outcomes[0]["outcome"] == "refused" and "fee budget cannot cover it" in outcomes[0]["reason"]
    assert relay_rows(rdb)[relay]["status"] == "rejected"
    assert reservations(rdb, relay) == [(1, "released", MAX_FEE)]
    assert rdb.execute("SELECT reserved FROM paygate.relay_fee_totals").fetchone()[0] == MAX_FEE
    assert rdb.execute("SELECT count(*) FROM paygate.audit_log").fetchone()[0] == 0


def test_replay_refuses_relays_in_flight_on_chain_or_expired(chain: ChainEnv, rdb: psycopg.Connection) -> None:
    g = chain.genesis
    users, market = g["users"], g["contracts"]["market"]
    # Expired: its authorisation ran out before it could be used.
    late = admit_relay(rdb, chain.devnet, users[0], "r-late", valid_ledgers=1)
    chain.devnet.close_ledger(2)
    run_until_quiet(chain, rdb)
    assert relay_rows(rdb)[late]["status"] == "expired"

    # Consumed elsewhere: someone submitted the user's authorisation without the gateway.
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
    assert chain.tick("relay").code == 3
    assert relay_rows(rdb)[spent]["status"] == "needs_human"

    # In flight: a lineage sent and not yet decided, on a row somebody marked dead by hand.
    flying = admit_relay(rdb, chain.devnet, users[2], "r-flying")
    chain.devnet.set_fault("drop_next")
    assert chain.tick("relay").code == 0
    lineage = relay_rows(rdb)[flying]["lineage_id"]
    assert rdb.execute("SELECT state FROM paygate.lineages WHERE id = %s", (lineage,)).fetchone()[0] == "sent"
    rdb.execute("UPDATE paygate.relays SET status = 'rejected', reason = 'by hand', finished_at = now() "
                "WHERE id = %s", (flying,))

    code, rows = replay(chain, "relays", "--all-dead")
    assert code == 1 and sorted(rows) == sorted([late, spent, flying])
    assert all(r["outcome"] == "refused" for r in rows.values()), rows
    assert "authorisation expired at ledger" in rows[late]["reason"]
    assert "effect already on chain: authorisation nonce" in rows[spent]["reason"]
    assert f"lineage {lineage}:sent is not terminal" in rows[flying]["reason"]
    assert rdb.execute("SELECT count(*) FROM paygate.audit_log").fetchone()[0] == 0
    assert rdb.execute("SELECT count(*) FROM paygate.fee_reservations WHERE round > 1").fetchone()[0] == 0


def test_a_relay_with_an_applied_lineage_is_refused_as_on_chain(chain: ChainEnv, rdb: psycopg.Connection) -> None:
    users = chain.genesis["users"]
    relay = admit_relay(rdb, chain.devnet, users[0], "r-done")
    run_until_quiet(chain, rdb)
    lineage = relay_rows(rdb)[relay]["lineage_id"]
    # The row says dead (a hand edit, a bug); the journal says its lineage applied.
    hand_edit(rdb, "UPDATE paygate.relays SET status = 'rejected', reason = 'by hand' WHERE id = %s", (relay,))
    code, rows = replay(chain, "relays", str(relay))
    assert code == 1 and rows[relay]["reason"] == f"effect already on chain: lineage {lineage} applied"


def test_a_dead_bot_job_replayed_applies_and_non_dead_ones_are_refused(chain: ChainEnv,
                                                                      rdb: psycopg.Connection) -> None:
    from paygate_cli.sandbox.devnet.contracts.market import ORDER_TTL_LEDGERS

    users = chain.genesis["users"]
    admit_relay(rdb, chain.devnet, users[0], "order")
    run_until_quiet(chain, rdb)
    chain.devnet.close_ledger(ORDER_TTL_LEDGERS + 1)
    job = rdb.execute("SELECT bot_job_id FROM paygate.admit_bot_job('close:once', %s, 'close_expired', %s, 1)",
                      (chain.genesis["contracts"]["market"],
                       scval.to_vec([scval.to_address(users[0]["public"])]).to_xdr())).fetchone()[0]
    chain.devnet.set_fault("drop_next", count=1)  # its one attempt accepted, never included
    for _ in range(12):
        assert chain.tick("relay_drainer").code in (0, 1)
        if rdb.execute("SELECT status FROM paygate.bot_jobs WHERE id = %s", (job,)).fetchone()[0] != "queued":
            break
        chain.devnet.close_ledger(advance_seconds=70)  # past its lineage's maxTime: provably dead
    assert rdb.execute("SELECT status, attempts FROM paygate.bot_jobs WHERE id = %s", (job,)).fetchone() == ("dead", 1)

    code, rows = replay(chain, "bot_jobs", "--all-dead")
    assert code == 0 and rows[job]["outcome"] == "replayed", rows
    status, attempts, key, dead = rdb.execute("SELECT status, attempts, job_key, dead_lineages FROM paygate.bot_jobs "
                                              "WHERE id = %s", (job,)).fetchone()
    assert (status, attempts, key, len(dead)) == ("queued", 0, "close:once", 1)  # history kept
    assert rdb.execute("SELECT action FROM paygate.audit_log").fetchall() == [("replay.bot_jobs",)]
    run_until_quiet(chain, rdb, worker="relay_drainer")
    assert rdb.execute("SELECT status FROM paygate.bot_jobs WHERE id = %s", (job,)).fetchone()[0] == "applied"
    states = [r[0] for r in rdb.execute("SELECT state FROM paygate.lineages WHERE entitlement = %s ORDER BY id",
                                        (f"bot_job:{job}",))]
    assert states == ["expired", "applied"]

    code, rows = replay(chain, "bot_jobs", str(job))
    assert code == 1 and rows[job]["reason"] == "not dead (status applied)"
    # A row marked dead by hand whose lineage applied: the effect is on chain.
    hand_edit(rdb, "UPDATE paygate.bot_jobs SET status = 'dead', reason = 'by hand' WHERE id = %s", (job,))
    code, rows = replay(chain, "bot_jobs", str(job))
    assert code == 1 and rows[job]["reason"].startswith("effect already on chain: lineage")
