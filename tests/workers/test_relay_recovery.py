"""Recovery on the relay path, against a real devnet: a relay worker or drainer killed holding its
lease is taken over after the grace window through the queue's own claim and step (the lineage in
flight resolved, or resent with the same bytes, never replaced; the reservation settled once), a
dead owner's late writes match nothing, and recovery racing a live relay worker (real processes)
sends nothing twice with new bytes and settles or releases each reservation exactly once. Recovery
runs as deployed: a real process holding no lane or fee seed (the database, RPC, the journal keys)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.support.chain_env import ChainEnv, chain_environ, recovery_environ
from tests.support.cli import run_proc, spawn
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.drill_support import crash_tick
from tests.support.relay_support import admit_relay, allow_market, assert_relay_invariants, relay_rows, run_until_quiet

# Grace 11 s > rpc timeout 0.5 s + a relay_drainer tick (10 s), the longest of the recovered queues.
RECOVERY = {"PAYGATE_RPC_TIMEOUT": "0.5s", "PAYGATE_WEBHOOK_TIMEOUT": "1s", "PAYGATE_RECOVERY_GRACE": "11s"}
LAPSE_S = 1.0 + 11.0 + 0.5  # lease + grace + margin (DB time)


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=3, users=3)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    env = ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))
    env.environ.update(RECOVERY)
    return env


@pytest.fixture
def rdb(db: psycopg.Connection, devnet: DevnetHandle) -> psycopg.Connection:
    allow_market(db, devnet.genesis["contracts"]["market"])
    return db


def recover(chain: ChainEnv) -> dict:
    result = run_proc("run-tick", "recovery", "--json", environ=recovery_environ(chain.environ))
    assert result.code == 0, result.err
    return json.loads(result.out)["run_tick"]["last_details"]


def lineages_of(db: psycopg.Connection, entitlement: str) -> list[tuple]:
    return db.execute("SELECT id, state, inner_hash FROM paygate.lineages WHERE entitlement = %s ORDER BY id",
                      (entitlement,)).fetchall()


def test_a_relay_worker_killed_after_anchoring_is_recovered_through_its_lineage(
        chain: ChainEnv, rdb: psycopg.Connection) -> None:
    from paygate_cli.queues.relays import DISPOSE_INCLUDED_SQL

    users = chain.genesis["users"]
    relay = admit_relay(rdb, chain.devnet, users[0], "r-anchored")
    fresh = admit_relay(rdb, chain.devnet, users[1], "r-fresh")
    rdb.execute("UPDATE paygate.relays SET lease_expires_at = now() + interval '1 hour' WHERE id = %s", (fresh,))
    crash_tick(chain.environ, "relay", "relay.after_anchor")  # signed and journaled, never broadcast
    [(lineage, state, inner)] = lineages_of(rdb, f"relay:{relay}")
    assert state == "signed"
    dead_token = relay_rows(rdb)[relay]["lease_token"]
    assert recover(chain)["relays"] == {}  # the lease is still within its grace: hands off
    # `fresh` holds no lineage: once lapsed, recovery must hand it back untouched, never start it.
    rdb.execute("UPDATE paygate.relays SET lease_token = gen_random_uuid(), lease_expires_at = now() "
                "WHERE id = %s", (fresh,))
    time.sleep(LAPSE_S)
    details = recover(chain)
    assert details["relays"] == {"waiting": 1, "released": 1}  # same bytes resent; the fresh one left alone
    assert lineages_of(rdb, f"relay:{relay}") == [(lineage, "sent", inner)]
    assert lineages_of(rdb, f"relay:{fresh}") == []
    rows = relay_rows(rdb)
    assert rows[relay]["lease_token"] is None and rows[fresh]["lease_token"] is None  # handed back
    assert rows[fresh]["status"] == "queued" and rows[fresh]["lineage_id"] is None

    chain.devnet.close_ledger()
    # Make the row look abandoned again: recovery disposes of the included lineage itself.
    rdb.execute("UPDATE paygate.relays SET lease_token = gen_random_uuid(), lease_expires_at = now() - interval "
                "'1 hour' WHERE id = %s", (relay,))
    assert recover(chain)["relays"] == {"applied": 1}
    row = relay_rows(rdb)[relay]
    assert row["status"] == "applied" and row["tx_hash"] == inner
    assert rdb.execute("SELECT status, fee_charged FROM paygate.fee_reservations WHERE relay_id = %s",
                       (relay,)).fetchone() == ("settled", row["fee_charged"])
    # The dead owner's late disposition, with its old token: matches nothing.
    assert rdb.execute(DISPOSE_INCLUDED_SQL, {
        "ids": [relay], "tokens": [dead_token], "lineages": [lineage], "statuses": ["applied"], "fees": [1],
        "txs": [inner], "reasons": [None], "payloads": [Jsonb({})]}).fetchall() == []
    run_until_quiet(chain, rdb)  # the worker starts the fresh one
    assert relay_rows(rdb)[fresh]["status"] == "applied"
    assert lineages_of(rdb, f"relay:{relay}") == [(lineage, "applied", inner)]
    assert_relay_invariants(chain, rdb)


def test_recovery_racing_a_live_relay_worker_sends_nothing_twice_and_settles_once(
        chain: ChainEnv, rdb: psycopg.Connection) -> None:
    users = chain.genesis["users"]
    ids = [admit_relay(rdb, chain.devnet, user, f"r-race-{n}") for n, user in enumerate(users)]
    # The tick journaled all three envelopes (one commit), sent the first and died: all three leased.
    crash_tick(chain.environ, "relay", "relay.after_broadcast")
    sent_before = {e: (i, h) for i, e, h in rdb.execute(
        "SELECT id, entitlement, inner_hash FROM paygate.lineages WHERE state IN ('signed', 'sent')")}
    assert len(sent_before) == 3
    time.sleep(LAPSE_S)
    least = recovery_environ(chain.environ)
    procs = [spawn("run-tick", "recovery", "--every", "0.2s", "--for", "12s", environ=least),
             spawn("run-tick", "recovery", "--every", "0.2s", "--for", "12s", environ=least),
             spawn("run-tick", "relay", "--every", "0.2s", "--for", "12s", environ=chain.environ)]
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        chain.devnet.close_ledger()
        time.sleep(0.7)
    for proc in procs:
        proc.wait(timeout=60)
        assert proc.returncode == 0, (proc.args, proc.returncode, proc.stderr.read()[-3000:])
    run_until_quiet(chain, rdb)  # whatever is left, the worker finishes
    assert [relay_rows(rdb)[i]["status"] for i in ids] == ["applied"] * 3
    for entitlement, (lineage, inner) in sent_before.items():
        # The transactions journaled (one of them sent) before the kill were never replaced by new bytes.
        assert lineages_of(rdb, entitlement) == [(lineage, "applied", inner)]
    for relay in ids:
        assert len(lineages_of(rdb, f"relay:{relay}")) == 1
        assert rdb.execute("SELECT round, status FROM paygate.fee_reservations WHERE relay_id = %s",
                           (relay,)).fetchall() == [(1, "settled")]
    assert_relay_invariants(chain, rdb)  # settled total == the chain's feeCharged sum, accumulator agrees


def test_a_drainer_killed_after_broadcast_is_recovered_through_its_lineage(
        chain: ChainEnv, rdb: psycopg.Connection) -> None:
    from stellar_sdk import scval

    from paygate_cli.sandbox.devnet.contracts.market import ORDER_TTL_LEDGERS

    users = chain.genesis["users"]
    admit_relay(rdb, chain.devnet, users[0], "order")
    run_until_quiet(chain, rdb)
    chain.devnet.close_ledger(ORDER_TTL_LEDGERS + 1)
    job = rdb.execute("SELECT bot_job_id FROM paygate.admit_bot_job('close:0', %s, 'close_expired', %s)",
                      (chain.genesis["contracts"]["market"],
                       scval.to_vec([scval.to_address(users[0]["public"])]).to_xdr())).fetchone()[0]
    crash_tick(chain.environ, "relay_drainer", "relay_drainer.after_broadcast")  # sent, not yet recorded so
    [(lineage, state, inner)] = lineages_of(rdb, f"bot_job:{job}")
    assert state == "signed"
    chain.devnet.close_ledger()
    assert recover(chain)["bot_jobs"] == {}  # within the grace
    time.sleep(LAPSE_S)
    assert recover(chain)["bot_jobs"] == {"applied": 1}
    assert rdb.execute("SELECT status, tx_hash, lease_token FROM paygate.bot_jobs WHERE id = %s",
                       (job,)).fetchone() == ("applied", inner, None)
    assert lineages_of(rdb, f"bot_job:{job}") == [(lineage, "applied", inner)]
