"""Crash drills for the re-bump (docs/architecture.md §4 "Fees and the fee market"): a sent lineage
that starves gets a replacement fee bump around the same inner transaction, journaled before it is
broadcast; whichever of its outer envelopes lands, the lineage settles once, from that landing's
receipt.

The starving lineage: a devnet that includes one Soroban transaction per ledger, and a surge whose
one competing transaction a ledger bids 1,000 stroops per operation against our first bid of 200
(the floor: the market read before the surge says 100). Two ledgers later the market says 1,000,
the bid is still 200, so the next tick of the path journals a replacement at 10 x 200 = 2,000 and
broadcasts it. Each drill kills that tick (a real process, SIGKILL at the named crash point, the
point's marker checked) or races the two envelopes, then lets ordinary ticks converge and checks
against the chain: one landing per inner transaction (getTransaction by inner hash, every ledger
scanned), the lane's sequence advanced once, the fee recorded equal to the landing's feeCharged
(and for a relay the fee disposition settled once with it), the unit settled once.

Paths: funding (the deposit's transfer; `funding.*`), settlement (a charge_batch; `settlement.*`,
the charge settled by the observer from the batch's events) and the relay (`relay.*`, whose fee
reservation settles the fee actually charged)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.charges_support import admit_charge, check_invariants, fund, open_work
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.drill_support import crash_tick
from tests.support.fee_market import (
    FEE_OPS,
    FLOOR_RATE,
    FRESH_FEE_STATS,
    capacity_args,
    end_surge,
    journaled_envelope,
    landing,
    landings,
    lane_sequence,
    lineage_row,
    lineage_rows,
    market_price,
    ours_queued,
    outer_status,
    replaced_envelopes,
    send_raw,
    surge,
)
from tests.support.funding import admit as admit_deposit
from tests.support.funding import assert_invariants, row_of
from tests.support.relay_support import admit_relay, allow_market, assert_relay_invariants, relay_rows

SURGE_RATE = 1_000  # the competing bid: above our first bid (200), below the replacement's (2,000)
REPLACEMENT_RATE = 10 * FLOOR_RATE  # replace-by-fee needs 10x the queued rate


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=3, extra_args=capacity_args(1))
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    environ = chain_environ(devnet, dsn, tmp_path / "keys")
    # the charge side's settings (charges_support.charge_chain): the observer reads from ledger 1, a
    # killed settlement tick's batch lease lapses after a second
    environ.update(FRESH_FEE_STATS, PAYGATE_OBSERVER_START_LEDGER="1", PAYGATE_SETTLEMENT_LEASE="1s")
    return ChainEnv(devnet, dsn, environ)


# -- the paths -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MoneyPath:
    worker: str  # the worker whose tick drives (and re-bumps) the unit's lineage; its crash-point prefix
    table: str  # the table whose lease a killed tick held (waited out before the next tick)
    admit: Callable[[ChainEnv, psycopg.Connection], int]  # -> the unit's id (anything it needs done before)
    entitlement: Callable[[psycopg.Connection, int], str]  # the unit's lineages' entitlement, once sent
    settled: Callable[[ChainEnv, psycopg.Connection, int], None]  # the unit settled once, invariants hold
    unit_status: Callable[[psycopg.Connection, int], str]
    open_status: str  # the unit's status while it is in flight
    done: Callable[[psycopg.Connection], bool]  # nothing of the path open any more
    workers: tuple[str, ...] = ()  # ticked after `worker` each round (the observer settles charges)


def _admit_deposit(chain: ChainEnv, db: psycopg.Connection) -> int:
    return admit_deposit(chain, db, user=0)


def _deposit_settled(chain: ChainEnv, db: psycopg.Connection, pending_id: int) -> None:
    # One credit and one transfer on chain, balance credited once (= the chain's), nothing live.
    assert_invariants(chain, db, [pending_id])


def _admit_charge(chain: ChainEnv, db: psycopg.Connection) -> int:
    user = chain.genesis["users"][0]
    fund(chain, db, [(user, 30_000_000)])  # before the drill: the account's deposit and credit
    charge, _ = admit_charge(db, user["public"], 1_000_000, "c-starved")
    return charge


def _batch_of(db: psycopg.Connection, charge: int) -> str:
    """The entitlement of the charge_batch lineage the charge was claimed into."""
    [(entitlement,)] = db.execute("SELECT x.entitlement FROM paygate.charges c JOIN paygate.lineages x "
                                  "ON x.id = c.lineage_id WHERE c.id = %s", (charge,)).fetchall()
    return str(entitlement)


def _charge_settled(chain: ChainEnv, db: psycopg.Connection, charge: int) -> None:
    account = chain.genesis["users"][0]["public"]
    counts = check_invariants(chain, db, [account])  # one debit of the charge id on chain, balance = chain
    assert (counts["charged"], counts["failed"]) == (1, 0), counts
    assert db.execute("SELECT status, attempts, dead_lineages FROM paygate.charges WHERE id = %s",
                      (charge,)).fetchone() == ("settled", 0, [])


def _admit_relay(chain: ChainEnv, db: psycopg.Connection) -> int:
    allow_market(db, chain.genesis["contracts"]["market"])
    # The market's first buy creates its order counter: done before the drill, on its own
    # (docs of tests/workers/test_relay_drills.py warm_up).
    warm = admit_relay(db, chain.devnet, chain.genesis["users"][2], "warm-up", "pen", 1)
    _quiet(chain, db, PATHS["relay"])
    assert relay_rows(db)[warm]["status"] == "applied"
    return admit_relay(db, chain.devnet, chain.genesis["users"][0], "r-starved", "book", 3)


def _relay_settled(chain: ChainEnv, db: psycopg.Connection, relay: int) -> None:
    row = relay_rows(db)[relay]
    assert row["status"] == "applied", row
    [applied] = [x for x in lineage_rows(db, f"relay:{relay}") if x["state"] == "applied"]
    # The fee disposition: the one reservation of the relay settled once, with the fee charged on chain.
    reservations = db.execute("SELECT status, fee_charged FROM paygate.fee_reservations WHERE relay_id = %s",
                              (relay,)).fetchall()
    assert reservations == [("settled", applied["fee_charged"])], reservations
    assert row["fee_charged"] == applied["fee_charged"]
    assert_relay_invariants(chain, db)


def _quiet_table(table: str) -> Callable[[psycopg.Connection], bool]:
    def done(db: psycopg.Connection) -> bool:
        return not db.execute(f"SELECT count(*) FROM paygate.{table} WHERE status IN ('pending', 'queued')"
                              ).fetchone()[0] and not _live(db)
    return done


PATHS = {
    "funding": MoneyPath("funding", "deposits", _admit_deposit, lambda db, unit: f"deposit:{unit}:deposit",
                         _deposit_settled,
                         lambda db, unit: str(row_of(db, unit)["status"]), "pending", _quiet_table("deposits")),
    "settlement": MoneyPath("settlement", "charge_batches", _admit_charge, _batch_of, _charge_settled,
                            lambda db, unit: str(db.execute("SELECT status FROM paygate.charges WHERE id = %s",
                                                            (unit,)).fetchone()[0]),
                            "authorized", lambda db: not open_work(db), ("observer",)),
    "relay": MoneyPath("relay", "relays", _admit_relay, lambda db, unit: f"relay:{unit}", _relay_settled,
                       lambda db, unit: str(relay_rows(db)[unit]["status"]), "queued", _quiet_table("relays")),
}


# -- steps -----------------------------------------------------------------------------------------

def _wait_for_leases(db: psycopg.Connection, table: str) -> None:
    """A killed process's claim lapses (DB time) before the next tick runs."""
    left = db.execute(f"SELECT coalesce(extract(epoch FROM max(lease_expires_at) - now()), 0)::float8 "
                      f"FROM paygate.{table} WHERE lease_expires_at > now()").fetchone()[0]
    if left > 0:
        time.sleep(left + 0.05)


def _live(db: psycopg.Connection) -> int:
    return int(db.execute("SELECT count(*) FROM paygate.lineages WHERE state IN ('allocated', 'signed', 'sent')"
                          ).fetchone()[0])


def _quiet(chain: ChainEnv, db: psycopg.Connection, path: MoneyPath, rounds: int = 30) -> None:
    """Ordinary in-process ticks, a ledger closing after each round, until the path has nothing open."""
    for _ in range(rounds):
        _wait_for_leases(db, path.table)
        for worker in (path.worker, *path.workers):
            result = chain.tick(worker, "--once")
            assert result.code in (0, 1), (worker, result.code, result.err[-3000:])
        if path.done(db):
            return
        chain.devnet.close_ledger()
    raise AssertionError(f"{path.worker} did not go quiet: {lineage_states(db)}")


def lineage_states(db: psycopg.Connection) -> list[tuple[int, str, str]]:
    return [(r[0], r[1], r[2]) for r in db.execute("SELECT id, entitlement, state FROM paygate.lineages ORDER BY id")]


@dataclass
class Starved:
    unit: int
    lineage_id: int
    lane: str
    first_outer: bytes
    first_envelope: str  # the first outer envelope's bytes (a late copy of its broadcast can be sent again)
    lane_seq_before: int


def starve(chain: ChainEnv, db: psycopg.Connection, path: MoneyPath) -> Starved:
    """Admit a unit, send it at the floor rate against a surge that outbids it, and close ledgers
    until the next tick is due to re-bump it (journaled rebump_after_ledgers ledgers ago, the market
    at or above its bid): the state every drill starts from."""
    unit = path.admit(chain, db)
    surge(chain.devnet, rate=SURGE_RATE, txs=1, ledgers=12)
    first = chain.tick(path.worker, "--once")
    assert first.code == 0, first.err[-3000:]
    entitlement = path.entitlement(db, unit)
    [row] = [x for x in lineage_rows(db, entitlement) if x["state"] in ("signed", "sent")]
    # The first bid followed the market read before the surge (the base fee), lifted to the floor.
    assert (row["bid_rate"], row["fee_ops"], row["replacements"]) == (FLOOR_RATE, FEE_OPS, 0), row
    lane_seq_before = lane_sequence(chain, row["lane"])
    assert row["source_seq"] == lane_seq_before + 1
    starved = Starved(unit, row["id"], row["lane"], bytes(row["outer_hash"]), journaled_envelope(chain, row),
                      lane_seq_before)
    # One ledger: the competing bid takes the only slot; the lineage is not yet due for a replacement.
    chain.devnet.close_ledger()
    assert market_price(chain.devnet) == SURGE_RATE
    again = chain.tick(path.worker, "--once")
    assert again.code == 0, again.err[-3000:]
    row = lineage_row(db, starved.lineage_id)
    assert row["state"] == "sent" and row["replacements"] == 0, row
    chain.devnet.close_ledger()  # a second ledger without it: due now (rebump_after_ledgers = 2)
    assert landing(chain, bytes(row["inner_hash"])).status == "NOT_FOUND"
    assert ours_queued(chain.devnet, starved.lane) == [starved.first_outer.hex()]
    return starved


def assert_replacement_journaled(db: psycopg.Connection, s: Starved) -> dict[str, Any]:
    """The replacement committed: same inner transaction and sequence, a new outer envelope at 10x the
    bid, the replaced outer recorded."""
    row = lineage_row(db, s.lineage_id)
    assert row["replacements"] == 1 and row["bid_rate"] == REPLACEMENT_RATE, row
    assert bytes(row["outer_hash"]) != s.first_outer
    assert row["source_seq"] == s.lane_seq_before + 1 and row["lane"] == s.lane
    assert [(e["replaced_by"], bytes(e["outer_hash"]), e["bid_rate"]) for e in replaced_envelopes(db, s.lineage_id)
            ] == [(1, s.first_outer, FLOOR_RATE)]
    return row


def assert_landed_once(chain: ChainEnv, db: psycopg.Connection, path: MoneyPath, s: Starved,
                       outer: bytes) -> None:
    """One landing of the inner transaction, through `outer`; the lane's sequence moved once; the
    journal's fee is the chain's; the unit settled once."""
    row = lineage_row(db, s.lineage_id)
    assert row["state"] == "applied", row
    landed = landing(chain, bytes(row["inner_hash"]))
    assert landed.status == "SUCCESS" and landed.outer_hash == outer, (landed, outer.hex())
    assert landings(chain, bytes(row["inner_hash"])) == 1
    assert row["fee_charged"] == landed.fee_charged and row["ledger"] == landed.ledger, (row, landed)
    assert lane_sequence(chain, s.lane) == s.lane_seq_before + 1 + _later_on_lane(db, s)
    path.settled(chain, db, s.unit)


def _later_on_lane(db: psycopg.Connection, s: Starved) -> int:
    """Sequences the lane consumed after this lineage's (the path's next phases, e.g. the credit)."""
    return int(db.execute("SELECT count(*) FROM paygate.lineages WHERE lane = %s AND id > %s "
                          "AND state IN ('applied', 'failed')", (s.lane, s.lineage_id)).fetchone()[0])


# -- the drills ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PATHS))
def test_killed_after_the_replacement_is_journaled_the_next_tick_sends_the_newest(
        chain: ChainEnv, db: psycopg.Connection, name: str) -> None:
    """Killed after the replacement's commit, before its broadcast: the network still holds only the
    first envelope. The next tick resends the newest committed one (lineages.outer_hash), which
    replaces it in the queue (10x) and lands."""
    path = PATHS[name]
    s = starve(chain, db, path)
    crash_tick(chain.environ, path.worker, f"{path.worker}.after_rebump_journal")
    row = assert_replacement_journaled(db, s)
    assert ours_queued(chain.devnet, s.lane) == [s.first_outer.hex()]  # nothing of the replacement was sent
    _wait_for_leases(db, path.table)
    resumed = chain.tick(path.worker, "--once")
    assert resumed.code == 0, resumed.err[-3000:]
    assert lineage_row(db, s.lineage_id)["replacements"] == 1  # resent, not replaced again
    assert ours_queued(chain.devnet, s.lane) == [bytes(row["outer_hash"]).hex()]
    chain.devnet.close_ledger()
    _quiet(chain, db, path)
    assert_landed_once(chain, db, path, s, bytes(row["outer_hash"]))


@pytest.mark.parametrize("name", sorted(PATHS))
def test_killed_after_the_replacement_is_broadcast_it_converges(chain: ChainEnv, db: psycopg.Connection,
                                                                 name: str) -> None:
    """Killed right after the replacement went out (its answer never recorded): it replaced the first
    envelope in the queue, lands, and the next ticks record that one landing."""
    path = PATHS[name]
    s = starve(chain, db, path)
    crash_tick(chain.environ, path.worker, f"{path.worker}.after_rebump_broadcast")
    row = assert_replacement_journaled(db, s)
    assert ours_queued(chain.devnet, s.lane) == [bytes(row["outer_hash"]).hex()]
    assert path.unit_status(db, s.unit) == path.open_status  # the dead process settled nothing
    chain.devnet.close_ledger()
    _quiet(chain, db, path)
    assert lineage_row(db, s.lineage_id)["replacements"] == 1
    assert_landed_once(chain, db, path, s, bytes(row["outer_hash"]))


@pytest.mark.parametrize("name", sorted(PATHS))
def test_the_replaced_envelope_lands_after_the_replacement_was_journaled(
        chain: ChainEnv, db: psycopg.Connection, name: str) -> None:
    """Killed after the replacement's commit; then the surge ends and the FIRST envelope, still
    queued, is included. The lineage settles from that landing (found by its inner hash), with that
    receipt's feeCharged, though its newest journaled envelope is another: never sent, never landed."""
    path = PATHS[name]
    s = starve(chain, db, path)
    crash_tick(chain.environ, path.worker, f"{path.worker}.after_rebump_journal")
    row = assert_replacement_journaled(db, s)
    end_surge(chain.devnet)
    chain.devnet.close_ledger()
    landed = landing(chain, bytes(row["inner_hash"]))
    assert landed.status == "SUCCESS" and landed.outer_hash == s.first_outer and landed.outer_rate == FLOOR_RATE
    _wait_for_leases(db, path.table)
    _quiet(chain, db, path)
    assert outer_status(chain, bytes(row["outer_hash"])) == "NOT_FOUND"
    assert lineage_row(db, s.lineage_id)["fee_charged"] == landed.fee_charged
    assert_landed_once(chain, db, path, s, s.first_outer)


@pytest.mark.parametrize("name", sorted(PATHS))
def test_both_envelopes_sent_the_newer_lands_and_the_replaced_one_never_can(
        chain: ChainEnv, db: psycopg.Connection, name: str) -> None:
    """An ordinary tick journals and broadcasts the replacement; a late copy of the first envelope's
    broadcast arrives after it (another node relaying it, say). The queue keeps the replacement (the
    older bid is under 10x it), the replacement lands, and the first envelope can never be included
    afterwards: its inner transaction's sequence is consumed."""
    path = PATHS[name]
    s = starve(chain, db, path)
    rebumped = chain.tick(path.worker, "--once")
    assert rebumped.code == 0, rebumped.err[-3000:]
    row = assert_replacement_journaled(db, s)
    assert ours_queued(chain.devnet, s.lane) == [bytes(row["outer_hash"]).hex()]
    late, _ = send_raw(chain, s.first_envelope)
    assert late != "PENDING", late
    assert ours_queued(chain.devnet, s.lane) == [bytes(row["outer_hash"]).hex()]
    chain.devnet.close_ledger()
    assert landing(chain, bytes(row["inner_hash"])).outer_hash == bytes(row["outer_hash"])
    status, code = send_raw(chain, s.first_envelope)  # too late for good now
    assert status != "PENDING" and (status == "TRY_AGAIN_LATER" or code == "txBAD_SEQ"), (status, code)
    _quiet(chain, db, path)
    chain.devnet.close_ledger(2)
    assert outer_status(chain, s.first_outer) == "NOT_FOUND"
    assert_landed_once(chain, db, path, s, bytes(row["outer_hash"]))
