"""The fee market: how many ledgers a unit of money takes, and what it pays, under a surge of competing
demand, against the floor measured in the same run. A benchmark, not a test: it prints figures and
ratios, asserts nothing.

The world: a private Postgres and a devnet in manual mode (a ledger closes only when this script
closes it, so a ledger is a well-defined unit) whose ledgers hold `--capacity` Soroban transactions
(10), and paygate with `--lanes` lanes (16: the floor run keeps half of them busy, so what the surge
adds is not lanes running out). The workers run in-process (`run-tick WORKER`, a tick of each a
ledger, then one close). Units are admitted `--per-ledger` at a time (4), up to `--units` per path
(32); a unit's latency is the ledgers from the one it was admitted in to the one its row was first
seen settled (deposits, charges) or applied (relays):

- deposit: `run-tick funding` (the SAC transfer, then the billing contract's credit);
- charge: `run-tick settlement` (one charge_batch for the ledger's charges), then `run-tick observer`
  (the chain's charge event settles the row);
- relay: `run-tick relay` (the user's market.buy).

Each path runs twice: first with no competing demand (the floor: what the flow takes when nothing
competes; beside it the transactions the path needs, one ledger each), then under a surge: the
devnet's `surge` fault, `--phantoms` (8) phantom transactions bidding `--rate` (2000 stroops per
operation, 20x the base fee) in every ledger, so most of each ledger is taken and paygate's bids
compete for the rest (docs/architecture.md §4 "Fees and the fee market": bids follow getFeeStats,
a lineage not included after `rebump_after_ledgers` is replaced at 10x). The fees: the sum of the
chain's feeCharged over the run's included lineages against what the surge price required for the
same lineages (rate x fee_ops + their resource fee; the base fee for the floor run), and the
inclusion part alone (the CAP-67 fee event charged before apply, less the declared resource fee)
against rate x fee_ops. getFeeStats' sorobanInclusionFee is each transaction's whole inclusion fee
(stellar-rpc's fee window), so a fee bump of one operation shows there at twice its rate: the market
figures printed are that.

Targets (reported, not asserted): under the surge, p99 within the floor + 3 ledgers while the cap
allows it; fees within 1.1x of what the surge price required.

    .venv/bin/python bench/fee_market.py [--units 32] [--per-ledger 4] [--lanes 16] [--capacity 10]
                                         [--phantoms 8] [--rate 2000] [--rebump-after 2]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from stellar_sdk import scval, xdr

from bench.meter import chain_world
from tests.support.chain_env import ChainEnv, admit_deposit, sign_deposit
from tests.support.charges_support import admit_charge, fund
from tests.support.relay_support import MAX_FEE, admit_relay, allow_market

BASE_FEE = 100  # the network's base inclusion fee per operation (charged when a ledger is not full)
DEPOSIT = 1_000_000
FUNDING = 2 * 10**9  # per user, for the charges (of the 1,000 USDC each devnet user holds)
# The transactions each path needs, one ledger each: what the chain itself cannot do faster.
CHAIN_FLOOR = {"deposit": 2, "charge": 1, "relay": 1}
STATUS_SQL = {
    "deposit": "SELECT id, status FROM paygate.deposits WHERE id = ANY(%s)",
    "charge": "SELECT id, status FROM paygate.charges WHERE id = ANY(%s)",
    "relay": "SELECT id, status FROM paygate.relays WHERE id = ANY(%s)",
}
DONE = {"settled", "applied"}
TERMINAL = DONE | {"failed", "expired", "rejected"}
WORKERS = {"deposit": ("funding",), "charge": ("settlement", "observer"), "relay": ("relay",)}
FEES_SQL = """
SELECT count(*), coalesce(sum(fee_charged), 0), coalesce(sum(%(rate)s * fee_ops + resource_fee), 0),
       coalesce(sum(bid_rate * fee_ops + resource_fee), 0), coalesce(sum(replacements), 0),
       count(*) FILTER (WHERE fee_capped_at IS NOT NULL), min(bid_rate), max(bid_rate),
       count(*) FILTER (WHERE bid_rate IS NULL OR fee_ops IS NULL OR resource_fee IS NULL)
FROM paygate.lineages WHERE id > %(after)s AND state IN ('applied', 'failed')
"""
INCLUDED_SQL = """
SELECT inner_hash, fee_ops, resource_fee FROM paygate.lineages
WHERE id > %(after)s AND state IN ('applied', 'failed') AND fee_ops IS NOT NULL AND resource_fee IS NOT NULL
"""


@dataclass
class Run:
    path: str
    surge: bool
    latencies: list[int] = field(default_factory=list)
    unfinished: dict[str, int] = field(default_factory=dict)  # unit status -> n, for units not settled/applied
    ledgers: int = 0
    seconds: float = 0.0
    stalled_ticks: int = 0
    prices: list[int] = field(default_factory=list)  # getFeeStats' p90 (stroops/op) each ledger of the run
    fees: dict[str, int] = field(default_factory=dict)

    def pct(self, q: float) -> float:
        """Nearest-rank percentile of the latencies (q in 0..100)."""
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return float(ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1])


class Bench:
    def __init__(self, chain: ChainEnv, db: psycopg.Connection, args: argparse.Namespace) -> None:
        self.chain, self.db, self.args = chain, db, args
        self.users = chain.genesis["users"]
        self.n = 0

    def latest(self) -> int:
        return self.chain.devnet.latest_ledger()

    def price(self) -> int:
        with self.chain.server() as server:
            return int(server.get_fee_stats().soroban_inclusion_fee.p90)

    def inclusion_charged(self, inner_hash: bytes, resource_fee: int) -> int:
        """The inclusion part of what the chain charged: the fee event charged before the ledger's
        transactions apply (inclusion fee plus the whole declared resource fee, CAP-67) less the
        declared resource fee. The refund of unused resource fee comes after, so feeCharged alone
        mixes the market's price with the resources the call really used."""
        with self.chain.server() as server:
            tx = server.get_transaction(inner_hash.hex())
        before = xdr.TransactionEventStage.TRANSACTION_EVENT_STAGE_BEFORE_ALL_TXS
        for raw in (tx.events.transaction_events_xdr or []) if tx.events else []:
            event = xdr.TransactionEvent.from_xdr(raw)
            if event.stage == before:
                return int(scval.to_native(event.event.body.v0.data)) - resource_fee
        raise SystemExit(f"no fee event for {inner_hash.hex()}")

    def tick(self, worker: str) -> int:
        result = self.chain.tick(worker)
        if result.code not in (0, 1):  # 1: a stalled tick (e.g. units fee-capped), reported
            raise SystemExit(f"{worker} tick failed ({result.code}): {result.err[-2000:]}")
        return result.code

    def admit(self, path: str) -> int:
        self.n += 1
        user = self.users[self.n % len(self.users)]
        if path == "deposit":
            entry, nonce, expiration = sign_deposit(self.chain.devnet, user["secret"], DEPOSIT, valid_ledgers=2000)
            return admit_deposit(self.db, user["public"], DEPOSIT, entry, nonce, expiration, f"fm-dep-{self.n}")
        if path == "charge":
            return admit_charge(self.db, user["public"], 1000 + self.n % 7, f"fm-chg-{self.n}")[0]
        return admit_relay(self.db, self.chain.devnet, user, f"fm-rel-{self.n}", f"fm_{self.n}", 7,
                           valid_ledgers=2000)

    def run(self, path: str, surge: bool) -> Run:
        out = Run(path, surge)
        after = self.db.execute("SELECT coalesce(max(id), 0) FROM paygate.lineages").fetchone()[0]
        admitted: dict[int, int] = {}  # unit id -> the ledger it was admitted in
        finished: set[int] = set()
        started = time.perf_counter()
        while len(finished) < self.args.units:
            latest = self.latest()
            for _ in range(min(self.args.per_ledger, self.args.units - len(admitted))):
                admitted[self.admit(path)] = latest
            for worker in WORKERS[path]:
                out.stalled_ticks += self.tick(worker)
            for unit, status in self.db.execute(STATUS_SQL[path], (list(admitted),)):
                if unit in finished or status not in TERMINAL:
                    continue
                finished.add(unit)
                if status in DONE:
                    out.latencies.append(latest - admitted[unit])
                else:
                    out.unfinished[status] = out.unfinished.get(status, 0) + 1
            if surge:
                out.prices.append(self.price())
            self.chain.devnet.close_ledger()
            out.ledgers += 1
            if out.ledgers > 60 + 10 * self.args.units:
                raise SystemExit(f"{path}: {self.args.units - len(finished)} units did not finish")
        out.seconds = time.perf_counter() - started
        rate = self.args.rate if surge else BASE_FEE
        row = self.db.execute(FEES_SQL, {"rate": rate, "after": after}).fetchone()
        out.fees = dict(zip(("lineages", "charged", "required", "bid", "replacements", "capped", "min_bid",
                             "max_bid", "unrecorded"), (int(v or 0) for v in row), strict=True))
        included = self.db.execute(INCLUDED_SQL, {"after": after}).fetchall()
        out.fees["inclusion"] = sum(self.inclusion_charged(bytes(h), int(r)) for h, _, r in included)
        out.fees["inclusion_required"] = sum(rate * int(ops) for _, ops, _ in included)
        out.fees["ops"] = sum(int(ops) for _, ops, _ in included)
        return out


def prepare(bench: Bench) -> None:
    """Everything the measured runs must not pay for: funded accounts for the charges, the market
    allow-listed with room in the relay fee budget, and each user's first buy (it creates the market's
    per-user entries: two first buys by one user in one ledger would read more than they declared)."""
    chain, db = bench.chain, bench.db
    fund(chain, db, [(u, FUNDING) for u in bench.users], rounds=30)
    allow_market(db, chain.genesis["contracts"]["market"])
    db.execute("UPDATE paygate.relay_config SET fee_budget = %s", (4 * (bench.args.units + 16) * MAX_FEE,))
    for n, user in enumerate(bench.users):
        admit_relay(db, chain.devnet, user, f"fm-warm-up-{n}", valid_ledgers=2000)
    for _ in range(20):
        bench.tick("relay")
        if not db.execute("SELECT count(*) FROM paygate.relays WHERE status = 'queued'").fetchone()[0]:
            break
        chain.devnet.close_ledger()
    chain.devnet.close_ledger()
    bench.tick("observer")


def _fmt(x: float) -> str:
    return "-" if x != x else f"{x:.0f}"


def report(args: argparse.Namespace, runs: dict[tuple[str, bool], Run], chain_floor: dict[str, int]) -> None:
    print(f"fee market: {args.units} units per path, {args.per_ledger} admitted per ledger, {args.lanes} lanes, "
          f"devnet in manual mode, {args.capacity} Soroban transactions per ledger; surge: {args.phantoms} "
          f"phantoms per ledger bidding {args.rate} stroops/op ({args.rate // BASE_FEE}x the base fee)")
    print("  latency in ledgers, admission -> settled/applied (nearest rank):")
    print(f"    {'path':8s} {'chain':>5s} {'floor':>11s} {'surge':>11s} {'surge p99':>10s} {'ledgers':>9s} "
          f"{'replaced':>8s} {'capped':>6s} {'stalled':>7s}")
    print(f"    {'':8s} {'txs':>5s} {'p50/p99':>11s} {'p50/p99':>11s} {'- floor':>10s} {'floor/surge':>9s} "
          f"{'':>8s} {'':>6s} {'ticks':>7s}")
    for path in CHAIN_FLOOR:
        floor, surge = runs[(path, False)], runs[(path, True)]
        over = surge.pct(99) - floor.pct(99)
        print(f"    {path:8s} {chain_floor[path]:5d} {_fmt(floor.pct(50)):>5s}/{_fmt(floor.pct(99)):<5s} "
              f"{_fmt(surge.pct(50)):>5s}/{_fmt(surge.pct(99)):<5s} {_fmt(over):>10s} "
              f"{floor.ledgers:>4d}/{surge.ledgers:<4d} {surge.fees['replacements']:8d} {surge.fees['capped']:6d} "
              f"{surge.stalled_ticks:7d}")
    print("  fees of the included lineages (stroops; required = rate x fee_ops + resource fee, rate = the surge's "
          f"{args.rate} under the surge, the base {BASE_FEE} for the floor):")
    print(f"    {'path':8s} {'run':6s} {'lineages':>8s} {'charged':>12s} {'required':>12s} {'charged/':>9s} "
          f"{'bids':>12s} {'bid rate':>13s}")
    print(f"    {'':8s} {'':6s} {'':>8s} {'':>12s} {'':>12s} {'required':>9s} {'(outer fees)':>12s} {'min-max':>13s}")
    for path in CHAIN_FLOOR:
        for surge in (False, True):
            f = runs[(path, surge)].fees
            print(f"    {path:8s} {'surge' if surge else 'floor':6s} {f['lineages']:8d} {f['charged']:12d} "
                  f"{f['required']:12d} {f['charged'] / max(1, f['required']):9.3f} {f['bid']:12d} "
                  f"{f['min_bid']:>6d}-{f['max_bid']:<6d}")
    print("  of which the inclusion fee (the fee event before apply less the declared resource fee; required = "
          "rate x fee_ops):")
    print(f"    {'path':8s} {'run':6s} {'charged':>12s} {'required':>12s} {'charged/':>9s} {'charged rate':>12s}")
    print(f"    {'':8s} {'':6s} {'':>12s} {'':>12s} {'required':>9s} {'per op':>12s}")
    for path in CHAIN_FLOOR:
        for surge in (False, True):
            f = runs[(path, surge)].fees
            print(f"    {path:8s} {'surge' if surge else 'floor':6s} {f['inclusion']:12d} "
                  f"{f['inclusion_required']:12d} {f['inclusion'] / max(1, f['inclusion_required']):9.3f} "
                  f"{f['inclusion'] / max(1, f['ops']):12.0f}")
    for (path, surge), run in runs.items():
        if run.unfinished:
            print(f"    {path} ({'surge' if surge else 'floor'}): units not settled/applied: {run.unfinished}")
        if run.fees["unrecorded"]:
            print(f"    {path} ({'surge' if surge else 'floor'}): {run.fees['unrecorded']} lineages without "
                  "their bid recorded (bid_rate/fee_ops/resource_fee)")
    prices = [p for (_, surge), run in runs.items() if surge for p in run.prices]
    if prices:
        print(f"  market during the surge runs (getFeeStats sorobanInclusionFee p90, per transaction: a fee bump "
              f"of one operation shows twice its rate): min {min(prices)}, median {statistics.median(prices):.0f}, "
              f"max {max(prices)} stroops")
    print("  against the targets (not asserted):")
    for path in CHAIN_FLOOR:
        floor, surge = runs[(path, False)], runs[(path, True)]
        f = surge.fees
        print(f"    {path:8s} surge p99 {_fmt(surge.pct(99))} vs floor p99 {_fmt(floor.pct(99))} + 3 "
              f"({'within' if surge.pct(99) <= floor.pct(99) + 3 else 'OVER'}); fees "
              f"{f['charged'] / max(1, f['required']):.3f}x what the surge price required, inclusion "
              f"{f['inclusion'] / max(1, f['inclusion_required']):.3f}x (target <= 1.1)")
    print(f"  wall time: {sum(r.seconds for r in runs.values()):.1f} s over "
          f"{sum(r.ledgers for r in runs.values())} ledgers")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--units", type=int, default=32, help="units per path (each run)")
    parser.add_argument("--per-ledger", type=int, default=4, help="units admitted per ledger")
    parser.add_argument("--lanes", type=int, default=16)
    parser.add_argument("--capacity", type=int, default=10, help="Soroban transactions a ledger holds")
    parser.add_argument("--phantoms", type=int, default=8, help="the surge's competing transactions per ledger")
    parser.add_argument("--rate", type=int, default=2000, help="the surge's bid, stroops per operation")
    parser.add_argument("--rebump-after", type=int, default=2,
                        help="PAYGATE_REBUMP_AFTER_LEDGERS (2, the default: a starving envelope's wait)")
    args = parser.parse_args()
    with chain_world("pgfm-", args.lanes) as (devnet, (chain, db)):
        devnet.rpc("devnet_setLimits", {"ledgerMaxSorobanTxs": args.capacity})
        chain.environ.update(
            PAYGATE_OBSERVER_START_LEDGER="1",
            PAYGATE_TX_VALIDITY="600s",  # manual closes advance 5 s each: no lineage expires in the run
            PAYGATE_FEE_STATS_CACHE="0s",  # a tick a ledger here: each tick reads the market afresh
            PAYGATE_SETTLEMENT_BATCHES_PER_TICK=str(args.lanes),
            PAYGATE_LOG_LEVEL="warning",
            PAYGATE_REBUMP_AFTER_LEDGERS=str(args.rebump_after),
        )
        print(f"  rebump_after_ledgers {args.rebump_after}")
        bench = Bench(chain, db, args)
        prepare(bench)
        runs: dict[tuple[str, bool], Run] = {}
        for path in CHAIN_FLOOR:
            runs[(path, False)] = bench.run(path, surge=False)
        devnet.set_fault("surge", rate=args.rate, txs=args.phantoms)  # until cleared
        devnet.close_ledger(2)
        for path in CHAIN_FLOOR:
            runs[(path, True)] = bench.run(path, surge=True)
        devnet.clear_faults()
    report(args, runs, CHAIN_FLOOR)


if __name__ == "__main__":
    main()
