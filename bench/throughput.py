"""Throughput at the chain's ceiling: backlogs of charges, deposits and relays drained with several lane
counts and several processes of each multi-slot worker, settled units per ledger against the ceiling.

The ceiling (measured in the same run, from the devnet's and the contract's limits): one transaction
in flight per lane (stellar-core queues one per source account), so per ledger
  settlement: min(lanes, ledger capacity) x the batch the footprint allows for the backlog's order of
              accounts (entries + distinct accounts <= 50 read-write keys, <= 100 keys, the claim's 48),
  funding:    min(lanes, ledger capacity) / 2 deposits (a transfer, then a credit),
  relay:      min(lanes, ledger capacity) relays,
where the ledger capacity is the devnet's Soroban transactions per ledger (devnet_setLimits).

Ledgers: the devnet in manual mode, a ledger closed when every process finished its tick of it (then,
for settlement, the observer's tick promotes what the ledger applied). A timer would count the
machine's load as paygate's; this way a ledger is never closed under a tick that is still working,
and the figure is what paygate's ticks put into each ledger. Each process is a forked worker process
with its own work connection and slot (as `run-tick <worker> --every` on one host), ticking when told.

Per (lanes, processes): units per ledger over the ledgers the drain used (its rounds of tick + close,
less one for funding and relay, which count a unit at the tick after its last transaction's ledger;
the last ledger may be part-full, so small backlogs read a little under the ceiling), its ratio to
the ceiling, the wall time per ledger split into the ticks (the slowest process), the devnet's close
and the observer's tick, the devnet process's CPU per ledger (its RPC serving inside the ticks and
its closes: when it nears the wall time per ledger, the devnet is the bottleneck, not paygate), and
the ticks' outcome counts summed (no_free_lane: a claim that found no lane free, or lost one to
another process). Then settlement's claim+record without the chain (bench/settlement.py's rounds)
in 1, 2 and 4 processes sharing the lanes: their scaling.
Prints figures; asserts nothing.

    .venv/bin/python bench/throughput.py [--charges 100000 --accounts 10000 --deposits 10000 --relays 10000]
        [--lanes 4,8,16] [--procs 1,2,4] [--quick] [--ledger-capacity N] [--claims-only]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from bench.meter import chain_world, machine_busy
from paygate_cli.catalogue import WORKERS
from paygate_cli.chain.charges import claim_estimate
from paygate_cli.context import TickContext
from paygate_cli.db.connect import connect
from paygate_cli.env import Env
from paygate_cli.logs import get_logger
from tests.support.chain_env import ChainEnv, admit_deposit, sign_deposit
from tests.support.relay_support import MAX_FEE, admit_relay, allow_market

DEPOSIT = 1_000_000  # of the 10^10 USDC base units each devnet user holds; enough for many charges
SETTLEMENT_BATCH = WORKERS["settlement"].batch or 48
LIVE_LINEAGES_SQL = "SELECT count(*) FROM paygate.lineages WHERE paygate.lineage_is_live(state)"


# -- the ceiling -------------------------------------------------------------------------------------

def batch_by_footprint(accounts: list[str], batch: int) -> float:
    """Average charges per charge_batch when the backlog (in admission order) is cut into batches by the
    claim's rule (queues/charges.py CLAIM_SQL with chain/charges.py claim_estimate's limits)."""
    limits = claim_estimate()
    sizes, i = [], 0
    while i < len(accounts):
        distinct: set[str] = set()
        n = 0
        while i + n < len(accounts) and n < min(batch, limits["max_entries"]):
            grown = distinct | {accounts[i + n]}
            writes = n + 1 + len(grown)
            if writes > limits["max_write"] or writes + limits["read_only"] > limits["max_keys"]:
                break
            distinct, n = grown, n + 1
        sizes.append(n)
        i += n
    return sum(sizes) / max(1, len(sizes))


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ledger_capacity(chain: ChainEnv) -> int:
    """The devnet's Soroban transactions per ledger (devnet_setLimits with nothing to set reads them)."""
    return int(chain.devnet.rpc("devnet_setLimits", {})["ledgerMaxSorobanTxs"])


# -- worker processes --------------------------------------------------------------------------------

def _serve(environ: dict[str, str], worker: str, slot: int, batch: int, pipe: Any) -> None:
    """One worker process: its own work connection and slot; one tick per message, until None."""
    env = Env(environ=environ)
    tick = WORKERS[worker].load()
    ctx = TickContext(conn=connect(env.settings, f"bench:{worker}:{slot}"), settings=env.settings, worker=worker,
                      instance_id=f"bench-{slot}", slot=slot, batch=batch, log=get_logger(worker))
    while pipe.recv() is not None:
        started = time.perf_counter()
        try:
            result = tick(ctx)
        except BaseException:  # reported to the parent, which stops the run
            pipe.send(("error", traceback.format_exc()))
            continue
        counts = {k: v for k, v in (result.details or {}).items() if isinstance(v, int)}
        pipe.send(("ok", (time.perf_counter() - started, counts)))
    ctx.conn.close()


class Processes:
    """`count` forked processes of `worker`, slots 0..count-1, each ticking once per `tick_all()`."""

    def __init__(self, environ: dict[str, str], worker: str, count: int, batch: int) -> None:
        context = multiprocessing.get_context("fork")
        self.pipes, self.processes = [], []
        for slot in range(count):
            ours, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(environ, worker, slot, batch, theirs), daemon=True)
            process.start()
            self.pipes.append(ours)
            self.processes.append(process)

    def tick_all(self) -> tuple[float, Counter[str]]:
        """Every process ticks once, at the same time: (the slowest tick's seconds, outcome counts)."""
        for pipe in self.pipes:
            pipe.send(True)
        slowest, counts = 0.0, Counter[str]()
        for pipe in self.pipes:
            status, payload = pipe.recv()
            if status != "ok":
                raise SystemExit(f"a worker process failed:\n{payload}")
            slowest = max(slowest, payload[0])
            counts.update(payload[1])
        return slowest, counts

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for process in self.processes:
            process.join(timeout=30)


# -- one drain ---------------------------------------------------------------------------------------

@dataclass
class Drain:
    worker: str
    lanes: int
    procs: int
    units: int
    ceiling: float  # units per ledger
    # Rounds after the last ledger that carried work before its units count: funding and relay record
    # a receipt at their next tick (1); settlement's units count when the observer reads the ledger (0).
    record_lag: int
    done_per_ledger: list[int] = field(default_factory=list)
    tick_s: float = 0.0
    close_s: float = 0.0
    observer_s: float = 0.0
    devnet_cpu_s: float = 0.0  # the devnet process's CPU over the drain: its RPC serving and closes
    counts: Counter[str] = field(default_factory=Counter)

    @property
    def ledgers(self) -> int:
        """Ledgers the drain used: its rounds (tick, close) less the record lag."""
        return max(1, len(self.done_per_ledger) - self.record_lag)

    @property
    def per_ledger(self) -> float:
        return sum(self.done_per_ledger) / self.ledgers

    def line(self) -> str:
        ledgers = self.ledgers
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()) if v) or "-"
        return (f"  {self.worker:10s} lanes {self.lanes:2d} procs {self.procs}: {sum(self.done_per_ledger):6d} in "
                f"{self.ledgers:4d} ledgers, {self.per_ledger:7.1f}/ledger, "
                f"ceiling {self.ceiling:6.1f} -> {self.per_ledger / self.ceiling:4.2f}; per ledger "
                f"ticks {self.tick_s * 1000 / ledgers:5.0f} ms, close {self.close_s * 1000 / ledgers:4.0f} ms, "
                f"observer {self.observer_s * 1000 / ledgers:4.0f} ms, "
                f"devnet CPU {self.devnet_cpu_s * 1000 / ledgers:4.0f} ms; "
                f"{counts}")


def drain(chain: ChainEnv, db: psycopg.Connection, run: Drain, done_sql: str, batch: int,
          observer: TickContext | None = None, *, statuses_sql: str) -> Drain:
    """Tick every process, close a ledger (then the observer's tick), until `done_sql` counts run.units;
    a drain that does not finish stops the run with the units' statuses (`statuses_sql`)."""
    processes = Processes(chain.environ, run.worker, run.procs, batch)
    observe = WORKERS["observer"].load()
    try:
        done_before = last = int(db.execute(done_sql).fetchone()[0])
        devnet_cpu = process_cpu(chain.devnet.proc.pid)
        target = done_before + run.units
        while last < target:
            seconds, counts = processes.tick_all()
            run.tick_s += seconds
            run.counts.update(counts)
            started = time.perf_counter()
            chain.devnet.close_ledger()
            run.close_s += time.perf_counter() - started
            if observer is not None:
                started = time.perf_counter()
                observe(observer)
                run.observer_s += time.perf_counter() - started
            now = int(db.execute(done_sql).fetchone()[0])
            run.done_per_ledger.append(now - last)
            last = now
            if len(run.done_per_ledger) > 50 + 4 * run.units / max(1.0, run.ceiling):
                statuses = ", ".join(f"{status} {n}" for status, n in db.execute(statuses_sql).fetchall())
                raise SystemExit(f"{run.worker} did not drain: {last - done_before} of {run.units} "
                                 f"(every row by status: {statuses})")
        run.devnet_cpu_s = process_cpu(chain.devnet.proc.pid) - devnet_cpu
        # What the last ledger applied is resolved by the next ticks (a lane is held until then): ticked
        # out here, not counted, so the next drain starts with every lane free.
        for _ in range(10):
            if not db.execute(LIVE_LINEAGES_SQL).fetchone()[0]:
                break
            processes.tick_all()
            chain.devnet.close_ledger()
    finally:
        processes.close()
    return run


# -- the three workers ------------------------------------------------------------------------------

def valid_ledgers(units: int, ceiling: float) -> int:
    """Ledgers a user's authorisation stays valid: four times what draining the whole backlog at the
    ceiling takes, so the backlog's last units are not refused as expired (which a user who signed
    them that long ago would be)."""
    return int(4 * units / ceiling) + 1000


def run_funding(chain: ChainEnv, db: psycopg.Connection, users: list[dict[str, str]], deposits: int,
                lanes: int, procs: int, tag: str, batch: int) -> Drain:
    run = Drain("funding", lanes, procs, deposits, min(lanes, ledger_capacity(chain)) / 2, 1)
    for i in range(deposits):
        user = users[i % len(users)]
        entry, nonce, expiration = sign_deposit(chain.devnet, user["secret"], DEPOSIT,
                                                valid_ledgers=valid_ledgers(deposits, run.ceiling))
        admit_deposit(db, user["public"], DEPOSIT, entry, nonce, expiration, f"{tag}-{i}")
    return drain(chain, db, run, "SELECT count(*) FROM paygate.deposits WHERE status = 'settled'", batch,
                 statuses_sql="SELECT status, count(*) FROM paygate.deposits GROUP BY 1")


def run_settlement(chain: ChainEnv, db: psycopg.Connection, accounts: list[str], charges: int, lanes: int,
                   procs: int, tag: str, observer: TickContext) -> Drain:
    order = [accounts[i % len(accounts)] for i in range(charges)]
    with db.pipeline():
        for i, account in enumerate(order):
            db.execute("SELECT paygate.admit_charge(%s, %s, %s)", (account, 1 + i % 7, f"{tag}-{i}"))
    ceiling = min(lanes, ledger_capacity(chain)) * batch_by_footprint(order, SETTLEMENT_BATCH)
    run = Drain("settlement", lanes, procs, charges, ceiling, 0)
    return drain(chain, db, run, "SELECT count(*) FROM paygate.charges WHERE status = 'settled'",
                 SETTLEMENT_BATCH, observer, statuses_sql="SELECT status, count(*) FROM paygate.charges GROUP BY 1")


def run_relay(chain: ChainEnv, db: psycopg.Connection, users: list[dict[str, str]], relays: int,
              lanes: int, tag: str, batch: int) -> Drain:
    allow_market(db, chain.genesis["contracts"]["market"])
    db.execute("UPDATE paygate.relay_config SET fee_budget = %s", (4 * (relays + len(users) + 16) * MAX_FEE,))
    applied = "SELECT count(*) FROM paygate.relays WHERE status = 'applied'"
    # Each user's first buy creates the market's per-user entries (two first buys by one user in one
    # ledger would read more on apply than they declared at simulation): one each first, unmeasured.
    statuses = "SELECT status, count(*) FROM paygate.relays GROUP BY 1"
    for n, user in enumerate(users):
        admit_relay(db, chain.devnet, user, f"{tag}-warm-up-{n}", valid_ledgers=5000)
    drain(chain, db, Drain("relay", lanes, 1, len(users), min(lanes, ledger_capacity(chain)), 1), applied, batch,
          statuses_sql=statuses)
    run = Drain("relay", lanes, 1, relays, min(lanes, ledger_capacity(chain)), 1)
    for i in range(relays):
        admit_relay(db, chain.devnet, users[i % len(users)], f"{tag}-{i}", "book", 1 + i % 50,
                    valid_ledgers=valid_ledgers(relays, run.ceiling))
    return drain(chain, db, run, applied, batch, statuses_sql=statuses)


def observer_context(chain: ChainEnv) -> TickContext:
    env = Env(environ=chain.environ)
    return TickContext(conn=connect(env.settings, "bench:observer"), settings=env.settings, worker="observer",
                       instance_id="bench", slot=0, batch=10_000, log=get_logger("observer"))


# -- claim+record without the chain, across processes -----------------------------------------------

@dataclass
class ClaimScaling:
    """One claim+record run: charges per second, CPU per charge (the processes and every Postgres
    process, so lost work shows whoever does it), and the machine's cores in use meanwhile."""
    procs: int
    rate: float
    cpu_us: float
    busy_cores: float


def claim_record_scaling(charges: int, lanes: int, procs: list[int]) -> list[ClaimScaling]:
    """bench/settlement.py's claim+record rounds (the worker's own SQL, the chain's steps replaced by
    their results) in k processes sharing the lanes, each k on a fresh database."""
    import shutil
    import tempfile

    from bench import settlement as settlement_bench
    from paygate_cli.db.migrate import migrate
    from paygate_cli.sandbox.pg_cluster import Cluster

    tmp = Path(tempfile.mkdtemp(prefix="pgt-", dir="/tmp"))
    tmp.chmod(0o755)
    cluster = Cluster.at(tmp / "pg")
    cluster.init(fast=True)
    cluster.start()
    settlement_bench.SERVER_CPU = settlement_bench.ServerCPU(cluster)
    runs = []
    try:
        for k in procs:
            with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
                admin.execute(f"CREATE DATABASE claims{k}")
            dsn = cluster.dsn(f"claims{k}")
            with psycopg.connect(dsn, autocommit=True) as fresh:
                migrate(fresh)
            _users, lane_keys = settlement_bench.prepare_db_only(dsn, charges, lanes)
            busy, total = machine_busy()
            result = settlement_bench.run_concurrently(
                settlement_bench._paygate_process, [(dsn, lane_keys, f"bench-{p}") for p in range(k)])
            busy_after, total_after = machine_busy()
            done = max(1, result["done"])
            runs.append(ClaimScaling(k, done / result["seconds"], (result["cpu"] + result["server"]) * 1e6 / done,
                                     (busy_after - busy) / (total_after - total) * (os.cpu_count() or 1)))
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return runs


def scaling_lines(runs: list[ClaimScaling]) -> list[str]:
    """Each k against one process, and against what the machine's cores allow: k times one process's
    rate, or all the cores at one process's CPU per charge, whichever is less. CPU per charge that
    grows with k is work lost to contention (claims that lose a lane and roll back, lock waits spun);
    flat CPU per charge with every core busy is the machine's bound, not paygate's."""
    one = runs[0]
    cores = os.cpu_count() or 1
    lines = []
    for run in runs:
        allowed = min(run.procs * one.rate, cores * 1e6 / one.cpu_us)
        lines.append(f"    {run.procs} procs: {run.rate:7.0f}/s ({run.rate / one.rate:.2f}x one), CPU per charge "
                     f"{run.cpu_us:4.0f} us ({run.cpu_us / one.cpu_us:.2f}x one's), cores busy {run.busy_cores:.2f} "
                     f"of {cores}; the cores allow {allowed:7.0f}/s at one's CPU per charge "
                     f"-> {run.rate / allowed:.2f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--charges", type=int, default=100_000)
    parser.add_argument("--accounts", type=int, default=10_000)
    parser.add_argument("--deposits", type=int, default=10_000)
    parser.add_argument("--relays", type=int, default=10_000)
    parser.add_argument("--lanes", default="4,8,16", help="lane counts, comma-separated")
    parser.add_argument("--procs", default="1,2,4", help="processes of each multi-slot worker, comma-separated")
    parser.add_argument("--relay-users", type=int, default=8, help="users the relays are spread over")
    # A funding or relay claim takes up to the batch in flight and up to the batch fresh, each on its own
    # (docs/performance.md): the registry's 16 fills 16 lanes.
    parser.add_argument("--funding-batch", type=int, default=WORKERS["funding"].batch or 16)
    parser.add_argument("--relay-batch", type=int, default=WORKERS["relay"].batch or 16)
    parser.add_argument("--quick", action="store_true", help="a short trial: 1,000 charges over 64 accounts, "
                        "64 deposits, 48 relays, lanes 4,8, processes 1,2")
    parser.add_argument("--ledger-capacity", type=int, help="the devnet's Soroban transactions per ledger "
                        "(devnet_setLimits; default: the devnet's own, 100): below the lane count, the ledger binds")
    parser.add_argument("--claims-only", action="store_true",
                        help="only the claim+record scaling without the chain (20,000 charges at most)")
    args = parser.parse_args()
    if args.claims_only:
        lanes = max(int(x) for x in args.lanes.split(","))
        print(f"settlement claim+record without the chain, {min(args.charges, 20_000)} charges, {lanes} lanes:")
        print("\n".join(scaling_lines(claim_record_scaling(min(args.charges, 20_000), lanes,
                                                            [int(x) for x in args.procs.split(",")]))))
        return
    if args.quick:
        args.charges, args.accounts, args.deposits, args.relays = 1000, 64, 64, 48
        args.lanes, args.procs = "4,8", "1,2"
    lane_counts = [int(x) for x in args.lanes.split(",")]
    proc_counts = [int(x) for x in args.procs.split(",")]
    # Every account is funded by the funding backlog before settlement charges it.
    accounts = min(args.accounts, args.deposits)
    drains: list[Drain] = []
    started = time.perf_counter()
    for lanes in lane_counts:
        with chain_world("pgt-", lanes, users=max(accounts, args.relay_users)) as (_devnet, (chain, db)):
            users = chain.genesis["users"]
            # The observer reads from the first ledger; a transaction stays valid over many manual closes.
            chain.environ.update(PAYGATE_OBSERVER_START_LEDGER="1", PAYGATE_TX_VALIDITY="600s",
                                 PAYGATE_LOG_LEVEL="warning")
            if args.ledger_capacity:
                chain.devnet.rpc("devnet_setLimits", {"ledgerMaxSorobanTxs": args.ledger_capacity})
            for procs in proc_counts:
                drains.append(run_funding(chain, db, users[:accounts], args.deposits, lanes, procs, f"d{procs}",
                                          args.funding_batch))
                print(drains[-1].line(), flush=True)
            observer = observer_context(chain)
            for procs in proc_counts:
                drains.append(run_settlement(chain, db, [u["public"] for u in users[:accounts]], args.charges,
                                             lanes, procs, f"c{procs}", observer))
                print(drains[-1].line(), flush=True)
            observer.conn.close()
            drains.append(run_relay(chain, db, users[:args.relay_users], args.relays, lanes, "r", args.relay_batch))
            print(drains[-1].line(), flush=True)
    claims = claim_record_scaling(min(args.charges, 20_000), max(lane_counts), proc_counts)
    print(f"throughput: {args.charges} charges over {accounts} accounts, {args.deposits} deposits, {args.relays} "
          f"relays over {args.relay_users} users; lanes {args.lanes}, processes {args.procs}; batches: funding "
          f"{args.funding_batch}, relay {args.relay_batch}, settlement {SETTLEMENT_BATCH}; devnet in manual "
          f"mode, a ledger closed when every process finished its tick ({time.perf_counter() - started:.0f} s)")
    for run in drains:
        print(run.line())
    print("  settlement claim+record without the chain (bench/settlement.py's rounds, "
          f"{min(args.charges, 20_000)} charges, {max(lane_counts)} lanes):")
    print("\n".join(scaling_lines(claims)))
    for worker in ("settlement", "funding", "relay"):
        runs = [r for r in drains if r.worker == worker]
        best = max(r.per_ledger / r.ceiling for r in runs)
        worst = min(r.per_ledger / r.ceiling for r in runs)
        print(f"throughput {worker}: {best:.2f} of the ceiling (best configuration; worst {worst:.2f})")


if __name__ == "__main__":
    main()
