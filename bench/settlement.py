"""Settlement throughput: N admitted charges -> settled (observer-promoted) against the devnet in
manual mode with 8 lanes. A benchmark, not a test: it prints figures and a ratio, asserts nothing.

paygate: N charges admitted through paygate.admit_charge (8 funded accounts), then repeatedly
`run-tick settlement` (in-process; batch 48, up to one new batch per lane per tick), a ledger close,
and `run-tick observer`, until every charge is settled. Reported: charges/s end to end, Postgres
time per charge (every SQL round trip of both workers, heartbeats included), paygate's own time
per charge (tick wall time minus time waiting on RPC; includes XDR build + signing), observer
events/s.

Batch size: the issue asks for batches of 100; Soroban's per-transaction limits do not allow it for
distinct accounts (each entry writes its charge-id entry and each account its balance: at most 50
read-write footprint keys), so with 8 accounts a batch holds 42 charges. See workers/settlement.py.

paygate without the chain, same run, same Postgres (a fresh database): the workers' own SQL for
claim + allocate, anchor, sent, resolve + close, and the observer's apply_page on real
encoded events, batch after batch: paygate's Postgres time per charge and its claim-and-record
throughput, free of the devnet's CPU on this machine.

Baseline, same run, same Postgres: the same claim-and-complete work done with pgqueuer (the nearest
Python Postgres queue): N jobs enqueued, a QueueManager in drain mode dequeues them in batches of 48
and each job records its completion with one UPDATE of a charge-like row (what the observer's
promotion does). Printed side by side with paygate's claim+record throughput measured on Postgres
time (the chain is not part of a queue's work); the ratio is printed, never asserted.

    .venv/bin/python bench/settlement.py [--charges 10000] [--lanes 8]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

import paygate_cli.chain.charges as chain_charges
from bench.meter import Meter
from paygate_cli.chain.rpc import ChainClient
from paygate_cli.db.cluster import Cluster
from paygate_cli.db.migrate import migrate
from tests.chain_env import ChainEnv, chain_environ
from tests.charges_support import fund
from tests.devnet_support import start_devnet

USERS = 8
UPDATE_ROWS = True
DEPOSIT = 5 * 10**9  # of the 1,000 USDC (10^10 base units) each devnet user holds


def run_paygate(chain: ChainEnv, db: psycopg.Connection, charges: int) -> dict[str, float]:
    users = chain.genesis["users"][:USERS]
    fund(chain, db, [(u, DEPOSIT) for u in users], rounds=30)
    started = time.perf_counter()
    with db.pipeline():
        for i in range(charges):
            db.execute("SELECT paygate.admit_charge(%s, %s, %s)", (users[i % USERS]["public"], 1000 + i % 7, f"b{i}"))
    admit_seconds = time.perf_counter() - started
    rpc, sql = Meter(), Meter()
    for name in ("send", "probe", "simulate", "ledger_entries", "latest_ledger"):
        rpc.wrap(ChainClient, name)
    rpc.wrap(chain_charges, "get_events")
    sql.wrap(psycopg.Connection, "execute")
    rpc.enabled = sql.enabled = True
    ticks = {"settlement": 0.0, "observer": 0.0}
    ledgers = 0
    started = time.perf_counter()
    while db.execute("SELECT count(*) FROM paygate.charges WHERE status <> 'settled'").fetchone()[0]:
        for worker in ("settlement", "observer"):
            before = time.perf_counter()
            result = chain.tick(worker, "--batch", "48" if worker == "settlement" else "10000")
            ticks[worker] += time.perf_counter() - before
            if result.code not in (0, 1):
                raise SystemExit(f"{worker} tick failed ({result.code}): {result.err}")
            if worker == "settlement":
                rpc.enabled = sql.enabled = False
                chain.devnet.close_ledger()
                ledgers += 1
                rpc.enabled = sql.enabled = True
        if ledgers > 100 + charges // 100:
            raise SystemExit("settlement did not finish")
    elapsed = time.perf_counter() - started
    rpc.enabled = sql.enabled = False
    events = db.execute("SELECT count(*) FROM paygate.chain_events WHERE kind = 'charge'").fetchone()[0]
    batches = db.execute("SELECT count(*), avg(entries) FROM paygate.charge_batches").fetchone()
    tick_total = ticks["settlement"] + ticks["observer"]
    return {"seconds": elapsed, "ledgers": ledgers, "admit_ms": admit_seconds * 1000 / charges,
            "sql_s": sql.seconds, "sql_calls": sql.calls, "rpc_s": rpc.seconds, "own_s": tick_total - rpc.seconds,
            "observer_s": ticks["observer"], "events": events, "batches": batches[0],
            "avg_batch": float(batches[1] or 0)}


def run_db_only(dsn: str, charges: int, lanes: int) -> dict[str, float]:
    """paygate's claim-and-record work with the chain taken out, on its own database: the workers'
    own SQL (claim + allocate, anchor, sent, resolve applied + close) per batch and the
    observer's apply_page on real encoded events. What a queue comparison should compare."""
    import os
    import uuid

    from stellar_sdk import Keypair, scval

    from paygate_cli.chain.charges import EventsPage, RawEvent
    from paygate_cli.db.connect import relaxed_transaction
    from paygate_cli.journal import lineage as lineages
    from paygate_cli.workers import observer, settlement

    sql = Meter()
    sql.wrap(psycopg.Connection, "execute")
    log = __import__("logging").getLogger("bench")
    with psycopg.connect(dsn, autocommit=True) as db:
        users = [Keypair.random().public_key for _ in range(USERS)]
        lane_keys = [Keypair.random().public_key for _ in range(lanes)]
        db.execute("INSERT INTO paygate.accounts (address, cached_balance) SELECT unnest(%s::text[]), 10^18",
                   (users,))
        lineages.sync_lanes(db, lane_keys)
        with db.pipeline():
            for i in range(charges):
                db.execute("SELECT paygate.admit_charge(%s, %s, %s)", (users[i % USERS], 1000 + i % 7, f"d{i}"))
        row = db.execute("SELECT cursor, ledger FROM paygate.observer_cursor").fetchone()
        cursor = row[0] if row else None
        ledger, seq = (row[1] if row else 0) + 1000, 1 << 32
        started = time.perf_counter()
        chain_side = 0.0
        sql.enabled = True
        while True:
            open_batches: dict[int, list[Any]] = {}
            for _ in range(lanes):
                token = uuid.uuid4()
                with relaxed_transaction(db):  # as the worker does
                    rows = [settlement.Entry(r[0], r[1], int(r[2]), bytes(r[3]))
                            for r in db.execute(settlement.CLAIM_CANDIDATES_SQL, {"batch": 48})]
                    rows = settlement.trim_to_fit(rows, 48)
                    if not rows:
                        break
                    lineage_id, lane = lineages.allocate(db, purpose="charge_batch", entitlement=f"b:{token}",
                                                         lanes=lane_keys)
                    db.execute(settlement.MARK_CLAIMED_SQL, {"owner": "bench", "lineage": lineage_id, "token": token,
                                                             "ids": [r.id for r in rows], "lease": 30})
                seq = lineages.next_sequence(db, lane, seq)
                with db.transaction():  # the engine's anchor: lease guard + CAS (journal/engine.py)
                    db.execute(settlement.HOLD_BATCH_SQL, {"lineage": lineage_id, "token": token, "lease": 30})
                    lineages.anchor(db, lineage_id, seq=seq, key_id="k", envelope=os.urandom(600),
                                    inner_hash=os.urandom(32), outer_hash=os.urandom(32), max_time=2**40,
                                    signed_at_ledger=ledger)
                with relaxed_transaction(db):  # the engine's mark-sent + the batch's on_sent
                    lineages.mark_sent(db, lineage_id, "PENDING")
                    db.execute(settlement.RELEASE_BATCH_LEASE_SQL, {"lineage": lineage_id, "token": token})
                open_batches[lineage_id] = rows
            if not open_batches:
                break
            ledger += 1
            with db.transaction():
                claimed = db.execute(settlement.CLAIM_OPEN_BATCHES_SQL, {"limit": lanes, "lease": 30,
                                                                         "owner": "bench"}).fetchall()
            events = []
            for lineage_id, token in claimed:
                lineages.finish(db, lineage_id, "applied", ledger=ledger, fee=100, code="txSUCCESS",
                                resolution="bench")
                with relaxed_transaction(db):
                    db.execute(settlement.CLOSE_BATCH_SQL, {"outcome": "applied", "lineage": lineage_id,
                                                            "token": token})
                encoding = time.perf_counter()
                for n, entry in enumerate(open_batches[lineage_id]):  # the chain's events for the batch
                    events.append(RawEvent(f"{(ledger << 32) + lineage_id:019d}-{n:010d}", ledger, None, None,
                                           [scval.to_symbol("charge").to_xdr(),
                                            scval.to_address(entry.account).to_xdr()],
                                           scval.to_vec([scval.to_int128(entry.amount),
                                                         scval.to_bytes(entry.charge_id)]).to_xdr()))
                chain_side += time.perf_counter() - encoding  # the chain's work, not paygate's
            page = EventsPage(events, f"{((ledger + 1) << 32) - 1:019d}-4294967295", ledger, 1)
            with db.transaction():
                observer.apply_page(db, page, cursor, log)
            cursor = page.cursor
        elapsed = time.perf_counter() - started - chain_side
        sql.enabled = False
        settled = db.execute("SELECT count(*) FROM paygate.charges WHERE status = 'settled' AND account = ANY(%s)",
                             (users,)).fetchone()[0]
    return {"seconds": elapsed, "sql_s": sql.seconds, "sql_calls": sql.calls, "settled": settled}


async def run_pgqueuer(dsn: str, jobs: int, batch: int) -> dict[str, float]:
    from pgqueuer.adapters.drivers.psycopg import PsycopgDriver
    from pgqueuer.adapters.persistence.queries import Queries
    from pgqueuer.core.qm import QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    work = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    driver = PsycopgDriver(conn)
    queries = Queries(driver)
    await queries.install()
    await work.execute("CREATE TABLE bench_jobs (id bigint PRIMARY KEY, status text NOT NULL DEFAULT 'queued')")
    await work.execute("INSERT INTO bench_jobs (id) SELECT generate_series(0, %s)", (jobs - 1,))
    for start in range(0, jobs, 1000):
        n = min(1000, jobs - start)
        await queries.enqueue(["charge"] * n, [str(start + i).encode() for i in range(n)], [0] * n)
    manager = QueueManager(queries)
    done = 0

    @manager.entrypoint("charge")
    async def complete(job: Any) -> None:
        nonlocal done
        if UPDATE_ROWS:
            await work.execute("UPDATE bench_jobs SET status = 'settled' WHERE id = %s", (int(job.payload),))
        done += 1

    started = time.perf_counter()
    await manager.run(batch_size=batch, mode=QueueExecutionMode.drain, dequeue_timeout=__import__("datetime")
                      .timedelta(seconds=1))
    elapsed = time.perf_counter() - started
    settled = (await (await work.execute("SELECT count(*) FROM bench_jobs WHERE status = 'settled'")).fetchone())[0]
    await queries.uninstall()
    await work.execute("DROP TABLE bench_jobs")
    await conn.close()
    await work.close()
    return {"seconds": elapsed, "done": done, "settled": settled}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--charges", type=int, default=10_000)
    parser.add_argument("--lanes", type=int, default=8)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pgs-", dir="/tmp"))
    tmp.chmod(0o755)
    cluster = Cluster.at(tmp / "pg")
    cluster.init(fast=True)
    cluster.start()
    devnet = start_devnet(tmp / "devnet", lanes=args.lanes, users=USERS)
    try:
        dsn = cluster.dsn()
        with psycopg.connect(dsn, autocommit=True) as db:
            migrate(db)
            environ = chain_environ(devnet, dsn, tmp / "keys")
            environ.update(PAYGATE_OBSERVER_START_LEDGER="1", PAYGATE_TX_VALIDITY="600s",
                           PAYGATE_SETTLEMENT_BATCHES_PER_TICK=str(args.lanes), PAYGATE_LOG_LEVEL="warning")
            ours = run_paygate(ChainEnv(devnet, dsn, environ), db, args.charges)
        base = asyncio.run(run_pgqueuer(dsn, args.charges, 48))
        wide = asyncio.run(run_pgqueuer(dsn, args.charges, 500))
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("CREATE DATABASE dbonly")
        with psycopg.connect(cluster.dsn("dbonly"), autocommit=True) as fresh:
            migrate(fresh)
        dbonly = run_db_only(cluster.dsn("dbonly"), args.charges, args.lanes)
    finally:
        devnet.stop()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    n = args.charges
    print(f"settlement: {n} charges, {USERS} accounts, {args.lanes} lanes, devnet in manual mode")
    print(f"  paygate end to end     : {n / ours['seconds']:8.1f} charges/s ({ours['seconds']:.1f} s, "
          f"{ours['ledgers']} ledgers, {ours['batches']} batches of {ours['avg_batch']:.1f} on average)")
    print(f"  admission (admit_charge, pipelined) : {ours['admit_ms']:6.3f} ms per charge")
    print(f"  Postgres time per charge            : {ours['sql_s'] * 1000 / n:6.3f} ms "
          f"({ours['sql_calls']} round trips, target <= 0.5)")
    print(f"  own (non-RPC) time per charge       : {ours['own_s'] * 1000 / n:6.3f} ms (includes XDR build + signing)")
    print(f"  waiting on RPC per charge           : {ours['rpc_s'] * 1000 / n:6.3f} ms")
    print(f"  observer                            : {ours['events'] / ours['observer_s']:8.1f} events/s "
          f"({ours['events']} events in {ours['observer_s']:.2f} s of observer ticks)")
    pgq_rate = max(base["done"] / base["seconds"], wide["done"] / wide["seconds"])
    db_rate = dbonly["settled"] / dbonly["seconds"]
    print(f"  paygate without the chain (same SQL, real apply_page), {dbonly['settled']} charges settled:")
    print(f"    Postgres time per charge          : {dbonly['sql_s'] * 1000 / n:6.3f} ms "
          f"({dbonly['sql_calls']} round trips, target <= 0.5)")
    print(f"    claim+record+complete throughput  : {db_rate:8.1f} charges/s")
    for label, run in (("batch 48", base), ("batch 500", wide)):
        print(f"  baseline pgqueuer claim+complete, {label:9s}: {run['done'] / run['seconds']:8.1f} jobs/s "
              f"({run['done']} jobs, {run['settled']} rows completed, drain mode, psycopg driver, defaults)")
    print(f"  ratio paygate / best pgqueuer       : {db_rate / pgq_rate:.2f}x (target >= 2; not asserted)")

if __name__ == "__main__":
    main()
