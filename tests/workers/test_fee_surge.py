"""A fee surge on every money path (docs/architecture.md §4 "Fees and the fee market"): funding,
settlement, the relay and bot jobs, each against a real devnet whose ledgers hold six Soroban
transactions and a surge of competing transactions bidding 2,000 stroops per operation (20x the
base fee) for ten ledgers.

The market is warmed up first: one ledger where the surge alone overflows the capacity, so every
included transaction is charged the surge price and getFeeStats says 2,000 before anything of ours
is bid. Then:

- within the cap (max_inclusion_fee 100,000): the surge takes four of the six slots of each ledger;
  every unit lands while it lasts, each bid following getFeeStats (at least the surge rate, at most
  the cap; the price remembered in paygate.fee_market), each fee recorded once and equal to the
  chain's feeCharged;
- a cap below the surge price (PAYGATE_MAX_INCLUSION_FEE=1000): the surge takes every slot; the
  units bid their cap, starve, and park as fee-capped (fee_capped_at and the rate they would need
  on their lineages, `paygate status --json` shows them under their path, the path's tick exits 1
  with the stall reason); once the surge is over they land with no operator, nothing failed,
  nothing lost, no fee settled twice.

Few units, small ledgers, manual closes: each test is a few seconds of ticks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from paygate_cli.sandbox.devnet.contracts.market import ORDER_TTL_LEDGERS
from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.charges_support import admit_charge, check_invariants, fund, open_work
from tests.support.cli import Result
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.fee_market import (
    FRESH_FEE_STATS,
    capacity_args,
    fee_capped,
    fee_market_row,
    landing,
    landings,
    market_price,
    status_json,
    surge,
)
from tests.support.funding import admit as admit_deposit
from tests.support.funding import assert_invariants
from tests.support.relay_support import (
    admit_close,
    admit_relay,
    allow_market,
    assert_relay_invariants,
    chain_fee,
    relay_rows,
)
from tests.support.relay_support import run_until_quiet as relays_quiet

CAPACITY = 6  # Soroban transactions per ledger
SURGE_RATE = 2_000  # 20x the base fee, per operation
SURGE_LEDGERS = 10
MOST_OF_IT = 4  # the surge's transactions per ledger when it leaves room
CAP_BELOW = 1_000  # PAYGATE_MAX_INCLUSION_FEE under the surge price
DEFAULT_CAP = 100_000
DEPOSIT = 30_000_000


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=4, users=4, extra_args=capacity_args(CAPACITY))
    yield handle
    handle.stop()


def wired(devnet: DevnetHandle, dsn: str, tmp_path: Path, **extra: str) -> ChainEnv:
    environ = chain_environ(devnet, dsn, tmp_path / "keys")
    # the settlement and observer settings of the charge-side tests (charges_support.charge_chain)
    environ.update(PAYGATE_OBSERVER_START_LEDGER="1", PAYGATE_SETTLEMENT_LEASE="1s", **FRESH_FEE_STATS, **extra)
    return ChainEnv(devnet, dsn, environ)


# -- the paths -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MoneyPath:
    name: str  # the path as status names it
    workers: tuple[str, ...]  # ticked in this order each round
    lineages_sql: str  # the path's lineages under test (warm-ups and earlier fundings left out)
    prepare: Callable[[ChainEnv, psycopg.Connection], dict[str, Any]]  # before the market is warmed up
    admit: Callable[[ChainEnv, psycopg.Connection, dict[str, Any]], list[int]]  # the units
    done: Callable[[psycopg.Connection], bool]
    settled: Callable[[ChainEnv, psycopg.Connection, dict[str, Any], list[int]], None]
    args: dict[str, tuple[str, ...]] = field(default_factory=dict)  # a worker's tick arguments


def _nothing(chain: ChainEnv, db: psycopg.Connection) -> dict[str, Any]:
    return {}


def _live(db: psycopg.Connection) -> int:
    return int(db.execute("SELECT count(*) FROM paygate.lineages WHERE state IN ('allocated', 'signed', 'sent')"
                          ).fetchone()[0])


# funding: a deposit each for three users (the transfer, then the credit)
def _deposits(chain: ChainEnv, db: psycopg.Connection, ctx: dict[str, Any]) -> list[int]:
    return [admit_deposit(chain, db, user=u, amount=DEPOSIT) for u in range(3)]


def _funding_done(db: psycopg.Connection) -> bool:
    return not db.execute("SELECT count(*) FROM paygate.deposits WHERE status = 'pending'").fetchone()[0] \
        and not _live(db)


def _funding_settled(chain: ChainEnv, db: psycopg.Connection, ctx: dict[str, Any], units: list[int]) -> None:
    assert_invariants(chain, db, units)  # one transfer and one credit each, balances = chain


# settlement: two funded accounts (funded before the surge), six charges in batches of two
def _fund_two(chain: ChainEnv, db: psycopg.Connection) -> dict[str, Any]:
    users = chain.genesis["users"]
    fund(chain, db, [(users[0], DEPOSIT), (users[1], DEPOSIT)])
    return {"accounts": [users[0]["public"], users[1]["public"]],
            "before": int(db.execute("SELECT coalesce(max(id), 0) FROM paygate.lineages").fetchone()[0])}


def _charges(chain: ChainEnv, db: psycopg.Connection, ctx: dict[str, Any]) -> list[int]:
    return [admit_charge(db, ctx["accounts"][i % 2], 1_000_000 + i, f"surge-{i}")[0] for i in range(6)]


def _settlement_done(db: psycopg.Connection) -> bool:
    return not open_work(db)


def _settlement_settled(chain: ChainEnv, db: psycopg.Connection, ctx: dict[str, Any], units: list[int]) -> None:
    counts = check_invariants(chain, db, ctx["accounts"])  # one debit per charge id, balances = chain
    assert counts["charged"] == len(units) and counts["failed"] == 0, counts
    rows = db.execute("SELECT status, attempts FROM paygate.charges WHERE id = ANY(%s)", (units,)).fetchall()
    # A lineage that starved for the fee is no attempt: the charge's attempt limit never sees it.
    assert rows == [("settled", 0)] * len(units), rows


# the relay: a warm-up relay first (the market's first buy creates its order counter), then three
def _warm_up(chain: ChainEnv, db: psycopg.Connection) -> dict[str, Any]:
    allow_market(db, chain.genesis["contracts"]["market"])
    admit_relay(db, chain.devnet, chain.genesis["users"][3], "warm-up", "pen", 1)
    relays_quiet(chain, db)
    return {"before": int(db.execute("SELECT max(id) FROM paygate.lineages").fetchone()[0])}


def _relays(chain: ChainEnv, db: psycopg.Connection, ctx: dict[str, Any]) -> list[int]:
    return [admit_relay(db, chain.devnet, chain.genesis["users"][u], f"surge-{u}", "book", 3 + u) for u in range(3)]


def _relay_done(db: psycopg.Connection) -> bool:
    return not db.execute("SELECT count(*) FROM paygate.relays WHERE status = 'queued'").fetchone()[0] \
        and not _live(db)


def _relay_settled(chain: ChainEnv, db: psycopg.Connection, ctx: dict[str, Any], units: list[int]) -> None:
    rows = relay_rows(db)
    assert [rows[u]["status"] for u in units] == ["applied"] * len(units), rows
    for u in units:
        # the fee disposition: one reservation each, settled once with the fee the chain charged
        assert db.execute("SELECT status, fee_charged FROM paygate.fee_reservations WHERE relay_id = %s",
                          (u,)).fetchall() == [("settled", chain_fee(chain, bytes(rows[u]["tx_hash"]))[1])]
    assert_relay_invariants(chain, db)


# bot jobs: orders bought through the relay and left to expire, then a close_expired job for each
def _expired_orders(chain: ChainEnv, db: psycopg.Connection) -> dict[str, Any]:
    ctx = _warm_up(chain, db)
    for u in range(3):
        admit_relay(db, chain.devnet, chain.genesis["users"][u], f"order-{u}", "book", 3 + u)
    relays_quiet(chain, db)
    chain.devnet.close_ledger(ORDER_TTL_LEDGERS + 1)
    return {**ctx, "before": int(db.execute("SELECT max(id) FROM paygate.lineages").fetchone()[0])}


def _bot_jobs(chain: ChainEnv, db: psycopg.Connection, ctx: dict[str, Any]) -> list[int]:
    return [admit_close(db, chain.devnet, chain.genesis["users"][u]["public"]) for u in range(3)]


def _bot_jobs_done(db: psycopg.Connection) -> bool:
    return not db.execute("SELECT count(*) FROM paygate.bot_jobs WHERE status = 'queued'").fetchone()[0] \
        and not _live(db)


def _bot_jobs_settled(chain: ChainEnv, db: psycopg.Connection, ctx: dict[str, Any], units: list[int]) -> None:
    rows = db.execute("SELECT id, status, fee_charged, tx_hash FROM paygate.bot_jobs WHERE id = ANY(%s) ORDER BY id",
                      (units,)).fetchall()
    assert [(r[0], r[1]) for r in rows] == [(u, "applied") for u in sorted(units)], rows
    for _, _, fee, tx_hash in rows:
        assert fee == chain_fee(chain, bytes(tx_hash))[1]
    assert_relay_invariants(chain, db)


PATHS = {
    "funding": MoneyPath("funding", ("funding",), "purpose IN ('deposit', 'credit')", _nothing, _deposits,
                         _funding_done, _funding_settled),
    "settlement": MoneyPath("settlement", ("settlement", "observer"),
                            "purpose = 'charge_batch' AND id > %(before)s", _fund_two, _charges, _settlement_done,
                            _settlement_settled, {"settlement": ("--batch", "2")}),
    "relay": MoneyPath("relay", ("relay",), "entitlement LIKE 'relay:%%' AND id > %(before)s", _warm_up, _relays,
                       _relay_done, _relay_settled),
    "bot_jobs": MoneyPath("bot_jobs", ("relay_drainer",), "entitlement LIKE 'bot_job:%%' AND id > %(before)s",
                          _expired_orders, _bot_jobs, _bot_jobs_done, _bot_jobs_settled),
}


# -- steps -----------------------------------------------------------------------------------------

def path_lineages(db: psycopg.Connection, path: MoneyPath, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    cursor = db.execute(f"SELECT * FROM paygate.lineages WHERE {path.lineages_sql} ORDER BY id",
                        {"before": ctx.get("before", 0)})
    names = [c.name for c in cursor.description]
    return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


def states_of(db: psycopg.Connection, path: MoneyPath, ctx: dict[str, Any]) -> list[tuple[int, str]]:
    return [(x["id"], x["state"]) for x in path_lineages(db, path, ctx)]


def warm_market(devnet: DevnetHandle) -> None:
    """One ledger the surge alone overflows: every included transaction is charged the surge price,
    so getFeeStats says it before anything of ours bids."""
    surge(devnet, rate=SURGE_RATE, txs=CAPACITY + 2, ledgers=1)
    devnet.close_ledger()
    assert market_price(devnet) == SURGE_RATE


def tick_round(chain: ChainEnv, path: MoneyPath) -> list[Result]:
    results = []
    for worker in path.workers:
        result = chain.tick(worker, "--once", *path.args.get(worker, ()))
        assert result.code in (0, 1), (worker, result.code, result.err[-3000:])
        results.append(result)
    return results


def assert_fees_are_the_chains(chain: ChainEnv, lineages: list[dict[str, Any]]) -> None:
    """Every included lineage: one landing of its inner transaction, the fee recorded = feeCharged."""
    for x in lineages:
        if x["state"] not in ("applied", "failed"):
            continue
        landed = landing(chain, bytes(x["inner_hash"]))
        assert (x["fee_charged"], x["ledger"]) == (landed.fee_charged, landed.ledger), (x["id"], landed)
        assert landed.outer_hash == bytes(x["outer_hash"]) and landed.outer_rate == x["bid_rate"], (x["id"], landed)
        assert landings(chain, bytes(x["inner_hash"])) == 1


# -- the tests -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(PATHS))
def test_every_unit_lands_during_the_surge_bidding_the_market(devnet: DevnetHandle, dsn: str, db: psycopg.Connection,
                                                               tmp_path: Path, name: str) -> None:
    path = PATHS[name]
    chain = wired(devnet, dsn, tmp_path)
    ctx = path.prepare(chain, db)
    units = path.admit(chain, db, ctx)
    warm_market(devnet)
    surge(devnet, rate=SURGE_RATE, txs=MOST_OF_IT, ledgers=SURGE_LEDGERS)
    first, last = devnet.latest_ledger() + 1, devnet.latest_ledger() + SURGE_LEDGERS  # the surge's ledgers
    for _ in range(3 * SURGE_LEDGERS):
        tick_round(chain, path)
        if path.done(db):
            break
        devnet.close_ledger()
    else:
        raise AssertionError(f"{name}: not done; lineages {states_of(db, path, ctx)}")
    lineages = path_lineages(db, path, ctx)
    assert lineages and {x["state"] for x in lineages} == {"applied"}, [(x["id"], x["state"]) for x in lineages]
    market = fee_market_row(db)
    # The figure getFeeStats gave: the surge's rate at least (our own fee bumps, charged what the surge
    # asked of them, show twice their rate there and nudge it up while they are the lowest included).
    assert market is not None and market["percentile"] == "p90" and market["price"] >= SURGE_RATE, market
    lowest, highest = SURGE_RATE + 1, market["price"] + 1
    for x in lineages:
        # Landed while the surge lasted, having bid what getFeeStats said: one stroop over the figure per
        # operation (journal/fee_market.py), or a
        # replacement at max(10x the bid before it, the figure + 1), never above the cap.
        assert first <= x["ledger"] <= last, (x["id"], x["ledger"], first, last)
        if x["replacements"] == 0:
            assert lowest <= x["bid_rate"] <= highest, (x, lowest, highest)
        else:
            assert x["bid_rate"] >= min(DEFAULT_CAP, max(10 * lowest, SURGE_RATE + 1)), x
        assert x["bid_rate"] <= DEFAULT_CAP and x["cap_rate"] == DEFAULT_CAP, x
        assert x["fee_capped_at"] is None
    assert_fees_are_the_chains(chain, lineages)
    path.settled(chain, db, ctx, units)


@pytest.mark.parametrize("name", list(PATHS))
def test_over_the_cap_units_park_fee_capped_then_land_after_the_surge(devnet: DevnetHandle, dsn: str,
                                                                      db: psycopg.Connection, tmp_path: Path,
                                                                      name: str) -> None:
    path = PATHS[name]
    chain = wired(devnet, dsn, tmp_path, PAYGATE_MAX_INCLUSION_FEE=str(CAP_BELOW))
    ctx = path.prepare(chain, db)
    units = path.admit(chain, db, ctx)
    warm_market(devnet)
    surge(devnet, rate=SURGE_RATE, txs=CAPACITY, ledgers=SURGE_LEDGERS)  # every slot: a bid at the cap never fits
    last = devnet.latest_ledger() + SURGE_LEDGERS
    parked: list[dict[str, Any]] = []
    for _ in range(4 * SURGE_LEDGERS):
        results = tick_round(chain, path)
        capped = fee_capped(db)
        if capped and not parked:
            parked = capped
            # The path's tick says why its work is not moving (exit 1, the stall reason).
            signer = results[0]
            assert signer.code == 1 and "fee-capped" in signer.err, (signer.code, signer.err[-2000:])
            shown = {p["path"]: p for p in status_json(chain)["fee_market"]["paths"]}[path.name]
            assert shown["fee_capped"] == len(capped)
            assert sorted(u["lineage_id"] for u in shown["units"]) == [x["id"] for x in capped]
        if path.done(db):
            break
        devnet.close_ledger()
    else:
        raise AssertionError(f"{name}: not done; lineages {states_of(db, path, ctx)}")
    assert parked, "nothing was ever fee-capped"
    for x in parked:
        # It bid its cap, and the replacement it would need (10x its bid, above the market) is over it.
        assert (x["bid_rate"], x["cap_rate"], x["fee_required"]) == (CAP_BELOW, CAP_BELOW, 10 * CAP_BELOW), x
    lineages = path_lineages(db, path, ctx)
    states = [x["state"] for x in lineages]
    assert "failed" not in states and "superseded" not in states, states
    for x in lineages:
        if x["state"] == "applied":
            assert x["ledger"] > last, (x["id"], x["ledger"], last)  # landed once the surge was over
            # re-prepared at the new price: the market (its window still remembers the surge) clamped to the cap
            assert (x["bid_rate"], x["replacements"]) == (CAP_BELOW, 0), x
        else:
            # A starved lineage: proven dead by its maxTime, never failed for its fee.
            assert x["state"] == "expired" and (x["fee_capped_at"] is not None or x["replacements"] > 0), x
    assert not fee_capped(db)
    assert_fees_are_the_chains(chain, lineages)
    path.settled(chain, db, ctx, units)
