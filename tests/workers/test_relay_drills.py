"""Crash drills for the relay path and the bot-job drainer.

Each drill kills a real `paygate run-tick relay|relay_drainer --once` process with SIGKILL at one
named crash point, checks it died there (exit -9, the crash point's marker on stderr, and the
journal/row state that point leaves behind), then ticks until quiet with ledgers closing and checks
the invariants against the chain: at most one applied lineage per relay / bot job; settled fees ==
the sum of feeCharged of our applied+failed relay transactions on chain, exactly; every reservation
settled or released, never both, never twice; no relay broadcast after its expiry.

Credential versions: a relay carries the user's own auth entry (market.buy signed by the
user), so the relay drill matrix signs it as ADDRESS_V2 (a current wallet) and every crash point runs
once more, without faults, with legacy ADDRESS (v1) entries; each checks that the relay transactions
that landed carry the version the user signed. Bot jobs carry no authorisation at all
(market.close_expired is permissionless), so the drainer drills have nothing to vary."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from stellar_sdk import xdr

from tests.support.chain_env import ChainEnv, chain_environ, credentials_type, landed_auth_types
from tests.support.cli import Result
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.drill_support import crash_tick as drill_crash_tick
from tests.support.relay_support import admit_close, admit_relay, allow_market, assert_relay_invariants, relay_rows


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
    return db


def crash_tick(chain: ChainEnv, worker: str, point: str) -> Result:
    """A real tick process that must die at `point`: SIGKILL exit and the crash point's own marker."""
    return drill_crash_tick(chain.environ, worker, point)


def wait_for_leases(db: psycopg.Connection, table: str) -> None:
    left = db.execute(f"SELECT coalesce(extract(epoch FROM max(lease_expires_at) - now()), 0)::float8 "
                      f"FROM paygate.{table} WHERE status = 'queued' AND lease_expires_at > now()").fetchone()[0]
    if left > 0:
        time.sleep(left + 0.05)


def run_until_quiet(chain: ChainEnv, db: psycopg.Connection, worker: str = "relay", rounds: int = 30) -> None:
    table = "relays" if worker == "relay" else "bot_jobs"
    for _ in range(rounds):
        wait_for_leases(db, table)
        result = chain.tick(worker, "--once")
        assert result.code in (0, 1), (result.code, result.err)
        queued = db.execute(f"SELECT count(*) FROM paygate.{table} WHERE status = 'queued'").fetchone()[0]
        live = db.execute("SELECT count(*) FROM paygate.lineages WHERE state IN ('allocated','signed','sent')"
                          ).fetchone()[0]
        if not queued and not live:
            return
        chain.devnet.close_ledger()
    rows = db.execute(f"SELECT id, status FROM paygate.{table}").fetchall()
    raise AssertionError(f"{worker} did not go quiet: {rows} {lineage_states(db)}")


def lineage_states(db: psycopg.Connection) -> list[str]:
    """States of the lineages of the relays/bot jobs under test (the warm-up relay's excluded)."""
    return [r[0] for r in db.execute("SELECT state FROM paygate.lineages WHERE entitlement <> 'relay:1' "
                                     "ORDER BY id")]


def warm_up(chain: ChainEnv, db: psycopg.Connection) -> None:
    """Relay 1, run to the end before the drill: the market's first buy creates its global order
    counter. Two first-ever buys in one ledger would both simulate without it and the second would
    read more than it declared on apply (a real Soroban resource failure, not what a drill is about)."""
    relay = admit_relay(db, chain.devnet, chain.genesis["users"][2], "warm-up", "pen", 1)
    assert relay == 1
    run_until_quiet(chain, db)


# What each crash point leaves behind: the proof the process died there and not elsewhere.
def _claimed(db: psycopg.Connection) -> bool:
    return lineage_states(db) == [] and db.execute(
        "SELECT count(*) FROM paygate.relays WHERE lease_token IS NOT NULL").fetchone()[0] == 2


def _installed(db: psycopg.Connection) -> int:
    """Relays under test pointing at the hash of their journaled lineage's envelope."""
    return db.execute("SELECT count(*) FROM paygate.relays r JOIN paygate.lineages x ON x.id = r.lineage_id "
                      "WHERE r.id <> 1 AND r.tx_hash = x.inner_hash").fetchone()[0]


MARKERS: dict[str, Any] = {
    "relay.after_claim": _claimed,
    # The tick's allocations are one statement: both relays hold a lineage before the first is built.
    "relay.after_allocate": lambda db: lineage_states(db) == ["allocated", "allocated"],
    "relay.after_sign": lambda db: lineage_states(db) == ["allocated", "allocated"] and not _installed(db),
    # The atomic install: the envelope and the relay's pointer to it committed together — for both
    # relays of the tick at once (one synchronous commit), before the first broadcast.
    "relay.after_anchor": lambda db: lineage_states(db) == ["signed", "signed"] and _installed(db) == 2,
    # The first sent, neither marked yet (the tick's marks are written together after the sends).
    "relay.after_broadcast": lambda db: lineage_states(db) == ["signed", "signed"],
    "relay.before_resolve": lambda db: lineage_states(db) == ["sent", "sent"],
    "relay.after_resolve": lambda db: lineage_states(db)[0] == "applied",
    # Killed inside the disposition transaction: the flip rolled back with it.
    "relay.in_disposition": lambda db: lineage_states(db)[0] == "applied" and db.execute(
        "SELECT count(*) FROM paygate.fee_reservations WHERE status = 'reserved'").fetchone()[0] == 2
    and db.execute("SELECT count(*) FROM paygate.relays WHERE status = 'queued'").fetchone()[0] == 2,
}
# In-process ticks (each followed by a ledger close) before the point is on the next tick's path.
TICKS_BEFORE = {"relay.before_resolve": 1, "relay.after_resolve": 1, "relay.in_disposition": 1}

FAULTS: dict[str, tuple[str, dict[str, Any]] | None] = {
    "plain": None,
    "answer_lost": ("lose_send_answer", {"count": 2}),
    "late_landing": ("hold_next", {"ledgers": 3}),
    "sequence_lag": ("account_lag", {"ledgers": 3}),
    "dropped": ("drop_next", {}),
}

FAULT_DRILLS = [pytest.param(point, "plain", id=point.split(".")[1]) for point in MARKERS] + [
    pytest.param("relay.after_anchor", "answer_lost", id="after_anchor+answer_lost"),
    pytest.param("relay.after_broadcast", "late_landing", id="after_broadcast+late_landing"),
    pytest.param("relay.after_sign", "sequence_lag", id="after_sign+sequence_lag"),
    pytest.param("relay.after_broadcast", "dropped", id="after_broadcast+dropped"),
]
# (point, fault, upgraded): the matrix above with ADDRESS_V2, every crash point once more with v1.
DRILLS = [pytest.param(*p.values, True, id=p.id) for p in FAULT_DRILLS] + [
    pytest.param(point, "plain", False, id=point.split(".")[1] + "@v1") for point in MARKERS]


def landed_relay_auth(db: psycopg.Connection, chain: ChainEnv, relay: int) -> list[xdr.SorobanCredentialsType]:
    """The credential types on chain of the relay's one applied lineage."""
    [(inner,)] = db.execute("SELECT inner_hash FROM paygate.lineages WHERE entitlement = %s AND state = 'applied'",
                            (f"relay:{relay}",)).fetchall()
    return landed_auth_types(chain, bytes(inner))


@pytest.mark.parametrize(("point", "fault", "upgraded"), DRILLS)
def test_relay_crash_drill(chain: ChainEnv, rdb: psycopg.Connection, point: str, fault: str, upgraded: bool) -> None:
    if fault == "sequence_lag":
        chain.devnet.close_ledger(4)  # history for the lagging reads
    users = chain.genesis["users"]
    warm_up(chain, rdb)
    first = admit_relay(rdb, chain.devnet, users[0], "r0", "book", 3, upgraded=upgraded)
    second = admit_relay(rdb, chain.devnet, users[1], "r1", "book", 4, upgraded=upgraded)
    ctype = credentials_type(upgraded)
    assert {xdr.SorobanAuthorizationEntry.from_xdr(e).credentials.type
            for r in (first, second) for e in relay_rows(rdb)[r]["auth_entries"]} == {ctype}
    for _ in range(TICKS_BEFORE.get(point, 0)):
        assert chain.tick("relay", "--once").code == 0
        chain.devnet.close_ledger()
    spec = FAULTS[fault]
    if spec is not None:
        chain.devnet.set_fault(spec[0], **spec[1])
    crash_tick(chain, "relay", point)
    assert MARKERS[point](rdb), (point, lineage_states(rdb), relay_rows(rdb))
    run_until_quiet(chain, rdb)
    chain.devnet.clear_faults()
    rows = relay_rows(rdb)
    assert rows[first]["status"] == rows[second]["status"] == "applied", rows
    assert_relay_invariants(chain, rdb)
    assert landed_relay_auth(rdb, chain, first) == landed_relay_auth(rdb, chain, second) == [ctype]
    if fault == "dropped":  # the dropped attempt was proven dead, then a fresh lineage applied
        assert sorted(lineage_states(rdb)) == ["applied", "applied", "expired"], lineage_states(rdb)


def test_crash_with_an_expiring_authorisation_never_broadcasts_after_expiry(
        chain: ChainEnv, rdb: psycopg.Connection) -> None:
    """Killed after anchoring a relay whose authorisation ends two ledgers later, with the devnet
    dropping the send: once the ledgers pass, the relay ends expired, nothing of it is on chain, its
    reservation is released, and no lineage of it was signed after its expiration ledger."""
    users = chain.genesis["users"]
    warm_up(chain, rdb)
    relay = admit_relay(rdb, chain.devnet, users[0], "r-short", valid_ledgers=2)
    chain.devnet.set_fault("drop_next")
    crash_tick(chain, "relay", "relay.after_anchor")
    assert lineage_states(rdb) == ["signed"]
    chain.devnet.close_ledger(5)
    run_until_quiet(chain, rdb)
    chain.tick("relay_expiry", "--once")
    row = relay_rows(rdb)[relay]
    assert row["status"] == "expired", row
    signed_after = rdb.execute("SELECT count(*) FROM paygate.lineages WHERE signed_at_ledger >= %s",
                               (row["auth_expiration_ledger"],)).fetchone()[0]
    assert signed_after == 0
    assert lineage_states(rdb) == ["expired"]
    assert_relay_invariants(chain, rdb)


@pytest.mark.parametrize("point", ["relay_drainer.after_claim", "relay_drainer.after_anchor",
                                   "relay_drainer.after_broadcast"])
def test_drainer_crash_drill(chain: ChainEnv, rdb: psycopg.Connection, point: str) -> None:
    from paygate_cli.sandbox.devnet.contracts.market import ORDER_TTL_LEDGERS

    users = chain.genesis["users"]
    warm_up(chain, rdb)
    admit_relay(rdb, chain.devnet, users[0], "order-1")
    admit_relay(rdb, chain.devnet, users[1], "order-2")
    run_until_quiet(chain, rdb)
    chain.devnet.close_ledger(ORDER_TTL_LEDGERS + 1)
    jobs = [admit_close(rdb, chain.devnet, users[0]["public"]), admit_close(rdb, chain.devnet, users[1]["public"])]
    crash_tick(chain, "relay_drainer", point)
    expected = {"relay_drainer.after_claim": [], "relay_drainer.after_anchor": ["signed"],
                "relay_drainer.after_broadcast": ["signed"]}[point]
    assert [s for s in lineage_states(rdb)[2:]] == expected
    run_until_quiet(chain, rdb, "relay_drainer")
    statuses = rdb.execute("SELECT id, status FROM paygate.bot_jobs ORDER BY id").fetchall()
    assert statuses == [(jobs[0], "applied"), (jobs[1], "applied")]
    for job in jobs:
        assert rdb.execute("SELECT count(*) FROM paygate.lineages WHERE entitlement = %s AND state = 'applied'",
                           (f"bot_job:{job}",)).fetchone()[0] == 1
    assert_relay_invariants(chain, rdb)


def test_signed_relay_whose_lane_sequence_is_taken_by_a_foreign_transaction(
        chain: ChainEnv, rdb: psycopg.Connection) -> None:
    """Anchored, killed before the broadcast; then a transaction we never journaled takes the lane's
    sequence. The relay's lineage is proven superseded, the lane fenced and a human asked about the
    lane (exit 3), and the relay goes out on another lane: applied once, its fee settled once."""
    from tests.support.cli import run_proc

    users = chain.genesis["users"]
    warm_up(chain, rdb)
    relay = admit_relay(rdb, chain.devnet, users[0], "r-competed")
    crash_tick(chain, "relay", "relay.after_anchor")
    [(lineage_id, lane)] = rdb.execute("SELECT id, lane FROM paygate.lineages WHERE entitlement = %s",
                                       (f"relay:{relay}",)).fetchall()
    chain.devnet.rpc("devnet_consumeSequence", {"account": lane})
    chain.devnet.close_ledger()
    wait_for_leases(rdb, "relays")
    resumed = run_proc("run-tick", "relay", "--once", "--json", environ=chain.environ)
    assert resumed.code == 3, resumed.err
    assert "journal.foreign_sequence_use" in resumed.err
    assert rdb.execute("SELECT state FROM paygate.lineages WHERE id = %s", (lineage_id,)).fetchone()[0] == "superseded"
    assert rdb.execute("SELECT status FROM paygate.lanes WHERE address = %s", (lane,)).fetchone()[0] == "drained"
    run_until_quiet(chain, rdb)
    row = relay_rows(rdb)[relay]
    assert row["status"] == "applied" and row["dead_lineages"] == [lineage_id]
    applied_lane = rdb.execute("SELECT lane FROM paygate.lineages WHERE entitlement = %s AND state = 'applied'",
                               (f"relay:{relay}",)).fetchone()[0]
    assert applied_lane != lane
    assert_relay_invariants(chain, rdb)
