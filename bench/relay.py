"""Relay throughput: market.buy relays admitted -> applied against the devnet in manual mode, 8 lanes.

paygate: N relays admitted through paygate.admit_relay (each with the user's signed authorisation
and a fee reservation), then relay ticks (in-process, one work connection kept across ticks as in a
`run-tick --every` loop, the registry's batch) and a ledger close, repeated until every relay is
applied and its fee settled. Reported: relays/s end to end, paygate's own (non-RPC) time per relay
= tick wall time minus time spent waiting on RPC (target <= 5 ms), and the Postgres statements and
time per relay.
Baseline, same run, same devnet: the same calls (simulate in enforce mode, sign, fee-bump, send, one
per lane per ledger) by bare stellar-sdk with no journal, no database, no receipts: the ratio
paygate / bare should be >= 0.8. Prints figures; asserts nothing.

    .venv/bin/python bench/relay.py [--relays 500] [--lanes 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from stellar_sdk import Keypair, SorobanServer, TransactionBuilder, xdr
from stellar_sdk.client.requests_client import RequestsClient

from bench.meter import Meter, Profile, baseline_lanes, chain_world, sql_meters
from paygate_cli.catalogue import WORKERS
from paygate_cli.chain.rpc import ChainClient
from paygate_cli.context import TickContext
from paygate_cli.db.connect import connect
from paygate_cli.env import Env
from paygate_cli.logs import get_logger
from paygate_cli.workers.relay import tick as relay_tick
from tests.support.chain_env import ChainEnv
from tests.support.devnet_support import DevnetHandle
from tests.support.relay_support import MAX_FEE, admit_relay, allow_market, sign_buy

OPEN_SQL = "SELECT count(*) FROM paygate.relays WHERE status = 'queued'"


def tick_until_done(ctx: TickContext, db: psycopg.Connection, chain: ChainEnv, limit: int,
                    meters: tuple[Meter, ...] = (), profile: Profile | None = None) -> tuple[float, float, int]:
    """(tick wall seconds, tick CPU seconds, ledgers). Meters count only inside the ticks."""
    seconds, cpu, ledgers = 0.0, 0.0, 0
    while db.execute(OPEN_SQL).fetchone()[0]:
        before, cpu_before = time.perf_counter(), time.process_time()
        for meter in meters:
            meter.enabled = True
        if profile is not None:
            with profile.running():
                relay_tick(ctx)
        else:
            relay_tick(ctx)
        for meter in meters:
            meter.enabled = False
        seconds += time.perf_counter() - before
        cpu += time.process_time() - cpu_before
        chain.devnet.close_ledger()
        ledgers += 1
        if ledgers > limit:
            raise SystemExit("relay did not finish")
    return seconds, cpu, ledgers


def run_paygate(chain: ChainEnv, db: psycopg.Connection, relays: int, *, tag: str = "bench",
                profile: Profile | None = None) -> dict[str, float]:
    users = chain.genesis["users"]
    allow_market(db, chain.genesis["contracts"]["market"])
    # Room in the fee budget for every relay's reservation at once (the default holds 200 of these).
    db.execute("UPDATE paygate.relay_config SET fee_budget = %s", (4 * (relays + 16) * MAX_FEE,))
    env = Env(environ=chain.environ)
    work = connect(env.settings, "bench:relay")
    ctx = TickContext(conn=work, settings=env.settings, worker="relay", instance_id="bench", slot=0,
                      batch=WORKERS["relay"].batch or 16, log=get_logger("relay"))
    # Warm-up, not measured: each user's first buy creates the market's per-user entries (two first
    # buys by one user in one ledger would read more on apply than they declared at simulation).
    admit_relay(db, chain.devnet, users[0], f"warm-up-{tag}-0", valid_ledgers=2000)
    tick_until_done(ctx, db, chain, 20)
    for n, user in enumerate(users[1:], start=1):
        admit_relay(db, chain.devnet, user, f"warm-up-{tag}-{n}", valid_ledgers=2000)
    tick_until_done(ctx, db, chain, 20)
    for i in range(relays):
        admit_relay(db, chain.devnet, users[i % len(users)], f"{tag}-{i}", "book", 1 + i % 50, valid_ledgers=2000)
    rpc = Meter()
    for name in ("send", "probe", "simulate", "ledger_entries", "latest_ledger", "account_sequence"):
        rpc.wrap(ChainClient, name)
    sql, control = sql_meters()
    started = time.perf_counter()
    tick_seconds, tick_cpu, ledgers = tick_until_done(ctx, db, chain, 40 + relays, (rpc, sql, control), profile)
    elapsed = time.perf_counter() - started
    work.close()
    applied = db.execute("SELECT count(*) FROM paygate.relays WHERE status = 'applied' AND "
                         "idempotency_key LIKE %s", (f"{tag}-%",)).fetchone()[0]
    own = tick_seconds - rpc.seconds
    return {"seconds": elapsed, "applied": applied, "ledgers": ledgers, "own_ms": own * 1000 / relays,
            "cpu_ms": tick_cpu * 1000 / relays,
            "sql_ms": (sql.seconds + control.seconds) * 1000 / relays, "rpc_ms": rpc.seconds * 1000 / relays,
            "sql_calls": sql.calls / relays, "sql_control": control.calls / relays, "rpc_calls": rpc.calls / relays}


def run_bare_sdk(devnet: DevnetHandle, relays: int, lanes: int) -> dict[str, float]:
    """The same chain work with bare stellar-sdk calls: no journal, no database, no proofs."""
    g = devnet.genesis
    passphrase, market = g["passphrase"], g["contracts"]["market"]
    lane_keys = [Keypair.from_secret(p["secret"]) for p in baseline_lanes(g, lanes)]
    fee = Keypair.from_secret(g["fee_account"]["secret"])
    users = g["users"]
    server = SorobanServer(devnet.url, client=RequestsClient(num_retries=0))
    work = []
    for i in range(relays):
        args, entry = sign_buy(devnet, users[i % len(users)]["secret"], "book", 1 + i % 50, valid_ledgers=2000)
        work.append((list(xdr.SCVal.from_xdr(args).vec.sc_vec), xdr.SorobanAuthorizationEntry.from_xdr(entry)))
    started, cpu = time.perf_counter(), time.process_time()
    while work:
        for lane in lane_keys:
            if not work:
                break
            args, auth = work.pop(0)
            account = server.load_account(lane.public_key)
            tx = (TransactionBuilder(account, passphrase, base_fee=100)
                  .append_invoke_contract_function_op(market, "buy", args, auth=[auth]).set_timeout(300).build())
            tx = server.prepare_transaction(tx, server.simulate_transaction(tx))
            tx.sign(lane)
            bumped = TransactionBuilder.build_fee_bump_transaction(fee.public_key, 200, tx, passphrase)
            bumped.sign(fee)
            server.send_transaction(bumped)
        devnet.close_ledger()
    return {"seconds": time.perf_counter() - started, "cpu": time.process_time() - cpu}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--relays", type=int, default=500)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled second pass")
    parser.add_argument("--profile-out", help="also write the second pass's pstats to this file")
    args = parser.parse_args()
    profile = Profile()
    profiled = min(args.relays, 100)
    with chain_world("pgr-", args.lanes) as (devnet, (chain, db)):
        ours = run_paygate(chain, db, args.relays)
        bare = run_bare_sdk(devnet, args.relays, args.lanes)
        if not args.no_profile:  # a second, smaller pass under cProfile (slower): its figures are not reported
            run_paygate(chain, db, profiled, tag="profiled", profile=profile)
    print(f"relay: {args.relays} market.buy relays, {args.lanes} lanes, devnet in manual mode")
    print(f"  paygate   : {ours['applied']} applied in {ours['seconds']:.2f} s over {ours['ledgers']} ledgers "
          f"= {args.relays / ours['seconds']:.1f} relays/s")
    print(f"  own (non-RPC) time per relay     : {ours['own_ms']:6.2f} ms  (target <= 5; includes XDR build+sign)")
    print(f"  CPU (process_time) per relay     : {ours['cpu_ms']:6.2f} ms  (this process: Python, XDR, client side)")
    print(f"  Postgres per relay               : {ours['sql_ms']:6.2f} ms ({ours['sql_calls']:.1f} statements"
          f" + {ours['sql_control']:.1f} BEGIN/COMMIT/SAVEPOINT round trips)")
    print(f"  waiting on RPC per relay         : {ours['rpc_ms']:6.2f} ms ({ours['rpc_calls']:.1f} calls)")
    print(f"  baseline, bare stellar-sdk (no journal, no DB): {args.relays / bare['seconds']:.1f} relays/s")
    print(f"  ratio paygate / bare             : {bare['seconds'] / ours['seconds']:.2f}  (target >= 0.8)")
    print(f"  bare stellar-sdk CPU per relay   : {bare['cpu'] * 1000 / args.relays:6.2f} ms  (cf. paygate's)")
    if not args.no_profile:
        print(f"  profile (second pass under cProfile, {profiled} relays), paygate's own code by cumulative time:")
        print(profile.summary(profiled))
        print("  hottest functions by own time (any module):")
        print(profile.hottest(profiled))
        if args.profile_out:
            profile.profiler.dump_stats(args.profile_out)


if __name__ == "__main__":
    main()
