"""Observer catch-up: N billing events on the devnet, read and applied from a cold cursor.
A benchmark, not a test: it prints figures and ratios, asserts nothing.

Seeding (not timed): 8 accounts funded through funding, N charges admitted and settled on chain by
the settlement worker (ledger after ledger, the observer not running), so the devnet holds N real
`charge` events and paygate holds N authorized charges waiting for them. That database is the
template of every repetition: each one is a fresh copy, observer cursor empty.

Measured per repetition (in-process `run-tick observer --once --batch LIMIT`, PAYGATE_OBSERVER_START_LEDGER=1):
- events/s of the catch-up (wall time, under whatever load the machine has);
- the split: fetch (getEvents round trips: the devnet's encoding + transfer + JSON parse), decode
  (topic/value XDR -> billing event), apply (Postgres round trips of apply_page), rest (Python
  bookkeeping), each also as CPU time of this process where that is meaningful;
- statements per page (every psycopg execute while the tick runs, divided by pages).

Baselines, same run, same devnet, same pages:
- fetch only: a bare loop of raw getEvents POSTs (requests + json), nothing decoded or applied —
  the floor any consumer of these pages pays;
- fetch + decode with stellar-sdk: SorobanServer.get_events and scval.to_native on every topic and
  value (what a straightforward SDK consumer does), nothing applied.

Then one more repetition under cProfile: the top functions by own time.

    .venv/bin/python bench/observer.py [--charges 10000] [--limit 1000] [--reps 3] [--lanes 8]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

import paygate_cli.chain.charges as chain_charges
from bench.meter import Meter, postgres_cpu, process_cpu
from paygate_cli.catalogue import WORKERS
from paygate_cli.db.migrate import migrate
from paygate_cli.sandbox.pg_cluster import Cluster
from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.charges_support import fund
from tests.support.cli import run_cli
from tests.support.devnet_support import start_devnet

USERS = 8
DEPOSIT = 5 * 10**9
SEED_DB = "seeded"


def seed(chain: ChainEnv, db: psycopg.Connection, charges: int) -> int:
    """N charges settled on chain by the settlement worker, never observed. Returns the event count."""
    users = chain.genesis["users"][:USERS]
    fund(chain, db, [(u, DEPOSIT) for u in users], rounds=30)
    with db.pipeline():
        for i in range(charges):
            db.execute("SELECT paygate.admit_charge(%s, %s, %s)", (users[i % USERS]["public"], 1000 + i % 7, f"o{i}"))
    for _ in range(200 + charges // 40):
        result = chain.tick("settlement", "--batch", "48")
        if result.code not in (0, 1):
            raise SystemExit(f"settlement tick failed ({result.code}): {result.err}")
        chain.devnet.close_ledger()
        open_work = db.execute("""
            SELECT (SELECT count(*) FROM paygate.charges WHERE status = 'authorized' AND lineage_id IS NULL)
                 + (SELECT count(*) FROM paygate.charge_batches WHERE closed_at IS NULL)""").fetchone()[0]
        if not open_work:
            break
    else:
        raise SystemExit("settlement did not put every charge on chain")
    events = sum(1 for _ in _raw_pages(chain.devnet.url, chain.environ["PAYGATE_BILLING_CONTRACT"], 10_000)
                 for _ in _)
    return events


def _raw_pages(url: str, contract: str, limit: int) -> Any:
    """Every page of the billing contract's events from ledger 1, as raw JSON event lists."""
    import requests

    session = requests.Session()
    session.trust_env = False
    cursor = None
    while True:
        params: dict[str, Any] = {"filters": [{"type": "contract", "contractIds": [contract]}],
                                  "pagination": {"limit": limit, **({"cursor": cursor} if cursor else {})}}
        if cursor is None:
            params["startLedger"] = 1
        body = session.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "getEvents", "params": params},
                            timeout=60).json()["result"]
        events = body["events"]
        yield events
        cursor = body["cursor"]
        if len(events) < limit:
            return


def baseline_fetch(url: str, contract: str, limit: int) -> dict[str, float]:
    started, cpu = time.perf_counter(), time.process_time()
    n = sum(len(page) for page in _raw_pages(url, contract, limit))
    return {"events": n, "seconds": time.perf_counter() - started, "cpu": time.process_time() - cpu}


def baseline_sdk(url: str, contract: str, limit: int) -> dict[str, float]:
    from stellar_sdk import SorobanServer, scval, xdr
    from stellar_sdk.client.requests_client import RequestsClient
    from stellar_sdk.soroban_rpc import EventFilter, EventFilterType

    server = SorobanServer(url, client=RequestsClient(num_retries=0, post_timeout=60))
    filters = [EventFilter(event_type=EventFilterType.CONTRACT, contract_ids=[contract])]
    started, cpu = time.perf_counter(), time.process_time()
    n, cursor = 0, None
    while True:
        answer = (server.get_events(start_ledger=1, filters=filters, limit=limit) if cursor is None
                  else server.get_events(filters=filters, cursor=cursor, limit=limit))
        for event in answer.events:
            [scval.to_native(xdr.SCVal.from_xdr(t)) for t in event.topic]
            scval.to_native(xdr.SCVal.from_xdr(event.value))
            n += 1
        cursor = answer.cursor
        if len(answer.events) < limit:
            break
    server.close()
    return {"events": n, "seconds": time.perf_counter() - started, "cpu": time.process_time() - cpu}


@contextmanager
def metered(meter: Meter, owner: Any, name: str) -> Iterator[None]:
    """Meter `owner.name` for the block, then put the original back."""
    original = getattr(owner, name)
    meter.wrap(owner, name)
    try:
        yield
    finally:
        setattr(owner, name, original)


def observe(environ: dict[str, str], limit: int, pids: tuple[int, int],
            profile: cProfile.Profile | None = None) -> dict[str, Any]:
    """One cold catch-up, in-process (`run-tick observer --once`), metered. `pids`: the postmaster
    and the devnet, whose CPU over the tick is counted too."""
    import paygate_cli.workers.observer as observer
    from paygate_cli.chain.threads import ReadAhead

    fetch, decode, sql, apply = Meter(True), Meter(True), Meter(True), Meter(True)
    # What the tick itself waits for the RPC: its own reads (the first page) and the read-aheads it
    # had to wait for (ReadAhead.answer); the rest of the fetching overlapped a page being applied.
    own_fetch, waited = Meter(True), Meter(True)
    original_get_events = chain_charges.get_events

    def fetch_on_main_thread(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return original_get_events(*args, **kwargs)
        started = time.perf_counter()
        try:
            return original_get_events(*args, **kwargs)
        finally:
            own_fetch.seconds += time.perf_counter() - started
            own_fetch.calls += 1

    per_page: list[int] = []
    original_apply = observer.apply_page

    def counting_apply(*args: Any, **kwargs: Any) -> Any:
        before = sql.calls
        try:
            return original_apply(*args, **kwargs)
        finally:
            per_page.append(sql.calls - before)

    with ExitStack() as stack:
        stack.callback(setattr, observer, "apply_page", original_apply)
        observer.apply_page = counting_apply
        stack.callback(setattr, chain_charges, "get_events", original_get_events)
        chain_charges.get_events = fetch_on_main_thread
        stack.enter_context(metered(fetch, chain_charges, "get_events"))
        stack.enter_context(metered(waited, ReadAhead, "answer"))
        try:  # the bulk decoder the observer uses since before it, the reference decoder per event
            import paygate_cli.chain.billing_events as bulk

            stack.enter_context(metered(decode, bulk, "decode_billing_events"))
        except ImportError:
            stack.enter_context(metered(decode, chain_charges, "decode_billing_event"))
        stack.enter_context(metered(sql, psycopg.Connection, "execute"))
        stack.enter_context(metered(apply, observer, "apply_page"))
        pg_cpu, devnet_cpu = postgres_cpu(pids[0]), process_cpu(pids[1])
        cpu, started = time.process_time(), time.perf_counter()
        if profile:
            profile.enable()
        result = run_cli("run-tick", "observer", "--once", "--json", "--batch", str(limit), environ=environ)
        if profile:
            profile.disable()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        pg_cpu, devnet_cpu = postgres_cpu(pids[0]) - pg_cpu, process_cpu(pids[1]) - devnet_cpu
    if result.code not in (0, 1):
        raise SystemExit(f"observer tick failed ({result.code}): {result.err}")
    details = json.loads(result.out)["run_tick"]
    return {"seconds": seconds, "cpu": cpu, "fetch_s": fetch.seconds, "fetch_calls": fetch.calls,
            "waited_s": own_fetch.seconds + waited.seconds,
            "read_ahead": details.get("last_details", {}).get("read_ahead", 0),
            "decode_s": decode.seconds, "apply_s": apply.seconds, "sql_s": sql.seconds, "sql_calls": sql.calls,
            "processed": details.get("processed"), "details": details, "per_page": per_page,
            "pg_cpu": pg_cpu, "devnet_cpu": devnet_cpu}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--charges", type=int, default=10_000)
    parser.add_argument("--limit", type=int, default=WORKERS["observer"].batch,
                        help="events per getEvents page (the tick's --batch; default: the observer's own)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--lanes", type=int, default=8)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pgo-", dir="/tmp"))
    tmp.chmod(0o755)
    cluster = Cluster.at(tmp / "pg")
    cluster.init(fast=True)
    cluster.start()
    devnet = start_devnet(tmp / "devnet", lanes=args.lanes, users=USERS)
    runs: list[dict[str, Any]] = []
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {SEED_DB}")
        environ = chain_environ(devnet, cluster.dsn(SEED_DB), tmp / "keys")
        environ.update(PAYGATE_OBSERVER_START_LEDGER="1", PAYGATE_TX_VALIDITY="600s",
                       PAYGATE_SETTLEMENT_BATCHES_PER_TICK=str(args.lanes), PAYGATE_LOG_LEVEL="error",
                       PAYGATE_OBSERVER_MAX_PAGES="1000")
        seeding = time.perf_counter()
        with psycopg.connect(cluster.dsn(SEED_DB), autocommit=True) as db:
            migrate(db)
            events = seed(ChainEnv(devnet, cluster.dsn(SEED_DB), environ), db, args.charges)
        seeding = time.perf_counter() - seeding
        contract = environ["PAYGATE_BILLING_CONTRACT"]
        # Imports out of the timings: a long-running observer (`--every 2s --for 65s`) has them.
        import paygate_cli.chain.rpc
        import paygate_cli.workers.observer  # noqa: F401

        def fresh(name: str) -> dict[str, str]:
            with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
                admin.execute(f"CREATE DATABASE {name} TEMPLATE {SEED_DB}")
            return {**environ, "PAYGATE_DATABASE_URL": cluster.dsn(name)}

        postmaster = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
        pids = (postmaster, devnet.proc.pid)
        observe(fresh("warmup"), args.limit, pids)  # first-use costs (sessions, caches) out of the figures
        fetch_only, sdk = [], []
        for rep in range(args.reps):  # interleaved, so load drift hits every variant alike
            fetch_only.append(baseline_fetch(devnet.url, contract, args.limit))
            sdk.append(baseline_sdk(devnet.url, contract, args.limit))
            runs.append(observe(fresh(f"rep{rep}"), args.limit, pids))
            profile = cProfile.Profile()
        observe(fresh("profiled"), args.limit, pids, profile)
        with psycopg.connect(cluster.dsn("profiled")) as check:
            settled = check.execute("SELECT count(*) FROM paygate.charges WHERE status = 'settled'").fetchone()[0]
            quarantined = check.execute("SELECT count(*) FROM paygate.chain_events WHERE quarantined").fetchone()[0]
    finally:
        devnet.stop()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    best = min(runs, key=lambda r: r["seconds"])
    pages = best["fetch_calls"]
    rate = events / med(runs, "seconds")
    print(f"observer catch-up: {events} billing events ({args.charges} charges), getEvents limit {args.limit}, "
          f"{args.reps} repetitions (medians; wall figures under load), seeding took {seeding:.0f} s")
    us = 1e6 / events
    print(f"  paygate observer, cold cursor     : {rate:8.0f} events/s  ({med(runs, 'seconds'):.3f} s wall; "
          "target >= 5,000 events/s)")
    cpu_rate = events / (med(runs, "cpu") + med(runs, "pg_cpu"))
    print(f"    CPU per event                    : observer process {med(runs, 'cpu') * us:6.1f} us, Postgres "
          f"{med(runs, 'pg_cpu') * us:6.1f} us, devnet (serving getEvents) {med(runs, 'devnet_cpu') * us:6.1f} us")
    print(f"    events/s on CPU alone            : {cpu_rate:8.0f} (1 / (observer + Postgres CPU per event): what one "
          "otherwise idle core sustains, the RPC elsewhere; robust to load)")
    rest = med(runs, "seconds") - med(runs, "waited_s") - med(runs, "apply_s")
    print(f"    wall split: fetch (getEvents, {pages} page(s), {best['read_ahead']} read ahead while the page "
          f"before was applied) {med(runs, 'fetch_s') * us:6.1f} us/event, of which the tick waited "
          f"{med(runs, 'waited_s') * us:6.1f}; decode "
          f"{med(runs, 'decode_s') * us:6.1f} us/event (inside apply), apply {med(runs, 'apply_s') * us:6.1f} "
          f"us/event (Postgres round trips {med(runs, 'sql_s') * us:6.1f}), rest (connect, lock, commit, "
          f"heartbeat) {rest * 1e3:6.1f} ms per tick")
    print(f"    statements                       : {best['sql_calls']} in the tick; per page "
          f"{best['per_page']} (the first page holds the 8 credits: 2 statements each); processed "
          f"{best['processed']}")
    fetch_rate = events / med(fetch_only, "seconds")
    sdk_rate = events / med(sdk, "seconds")
    print(f"  baseline fetch only (raw getEvents) : {fetch_rate:8.0f} events/s "
          f"(CPU {med(fetch_only, 'cpu') * 1e6 / events:6.1f} us/event)")
    print(f"  baseline fetch + stellar-sdk decode : {sdk_rate:8.0f} events/s "
          f"(CPU {med(sdk, 'cpu') * 1e6 / events:6.1f} us/event)")
    print(f"  ratio observer / fetch+sdk decode   : {rate / sdk_rate:.2f}x ; observer / fetch only: "
          f"{rate / fetch_rate:.2f}x (not asserted)")
    print(f"  check: {settled} charges settled, {quarantined} events quarantined in the profiled repetition")
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(12)
    print("  profile of one catch-up (top 12 by own time):")
    started = False
    for line in out.getvalue().splitlines():
        if line.strip().startswith("ncalls"):
            started = True
        if started and line.strip():
            print("    " + line.strip()[:150])


if __name__ == "__main__":
    main()
