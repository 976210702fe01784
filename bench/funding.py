"""Funding throughput: deposits admitted -> settled against the devnet in manual mode with 8 lanes.

paygate: N deposits admitted through paygate.admit_deposit, then funding ticks (in-process, one
work connection kept across ticks as in a `run-tick --every` loop, the worker's own batch) and a ledger close,
repeated until every deposit is settled; a warm-up pass of N deposits first, on the same work
connection, unmeasured (reported apart: a loop's first ticks plan its statements and fill the
backend's caches once per process). Reported: deposits/s end to end, paygate's own (non-chain)
time per deposit = tick wall time minus time spent waiting on RPC (target <= 5 ms), and the
Postgres round-trip time per deposit.
Baseline, same run, same devnet: the same deposits (SAC transfer + credit per deposit, 8 lanes) done
by bare stellar-sdk calls with no journal and no database: what a user would get without paygate's
at-most-once machinery. Prints figures; asserts nothing.

    .venv/bin/python bench/funding.py [--deposits 64] [--lanes 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from stellar_sdk import Keypair, SorobanServer, TransactionBuilder, scval
from stellar_sdk.client.requests_client import RequestsClient

from bench.meter import Meter, Profile, baseline_lanes, chain_world, sql_meters
from paygate_cli.catalogue import WORKERS
from paygate_cli.chain.rpc import ChainClient
from paygate_cli.context import TickContext
from paygate_cli.db.connect import connect
from paygate_cli.env import Env
from paygate_cli.logs import get_logger
from paygate_cli.workers.funding import tick as funding_tick
from tests.support.chain_env import ChainEnv, admit_deposit, sign_deposit
from tests.support.devnet_support import DevnetHandle

AMOUNT = 1_000_000
WARM_UP = 64  # deposits through the work connection first: enough ticks for its statements to reach the plans
# a long-running loop uses (psycopg prepares a statement at its 6th execution, Postgres settles on a
# generic plan after 5 more); the metered pass is then the steady state
SETTLED_SQL = "SELECT count(*) FROM paygate.deposits WHERE status = 'settled'"


def work_context(chain: ChainEnv) -> TickContext:
    """The tick context of a `run-tick funding --every …` loop: one process, one work connection kept
    across ticks (statement plans and trigger functions stay cached), the worker's configured batch
    (16: up to 8 deposits in flight and 8 starting on 8 lanes). The passes share it."""
    env = Env(environ=chain.environ)
    return TickContext(conn=connect(env.settings, "bench:funding"), settings=env.settings, worker="funding",
                       instance_id="bench", slot=0, batch=WORKERS["funding"].batch or 16,
                       log=get_logger("funding"))


def run_paygate(chain: ChainEnv, db: psycopg.Connection, ctx: TickContext, deposits: int, *, tag: str = "bench",
                profile: Profile | None = None) -> dict[str, float]:
    users = chain.genesis["users"]
    settled_before = db.execute(SETTLED_SQL).fetchone()[0]
    for i in range(deposits):
        user = users[i % len(users)]
        entry, nonce, expiration = sign_deposit(chain.devnet, user["secret"], AMOUNT, valid_ledgers=500)
        admit_deposit(db, user["public"], AMOUNT, entry, nonce, expiration, f"{tag}-{i}")
    rpc = Meter()
    for name in ("send", "probe", "simulate", "ledger_entries", "latest_ledger", "account_sequence"):
        rpc.wrap(ChainClient, name)
    sql, control = sql_meters()
    sql.enabled = control.enabled = False
    tick_seconds = tick_cpu = 0.0
    started = time.perf_counter()
    ledgers = 0
    while db.execute("SELECT count(*) FROM paygate.deposits WHERE status = 'pending'").fetchone()[0]:
        before, cpu = time.perf_counter(), time.process_time()
        sql.enabled = control.enabled = rpc.enabled = True
        if profile is not None:
            with profile.running():
                funding_tick(ctx)
        else:
            funding_tick(ctx)
        sql.enabled = control.enabled = rpc.enabled = False
        tick_seconds += time.perf_counter() - before
        tick_cpu += time.process_time() - cpu
        chain.devnet.close_ledger()
        ledgers += 1
        if ledgers > 40 + deposits:
            raise SystemExit("funding did not finish")
    elapsed = time.perf_counter() - started
    settled = db.execute(SETTLED_SQL).fetchone()[0] - settled_before
    # psycopg's execute also covers the nested round trips of RPC-free SQL only; RPC calls never nest SQL.
    own = tick_seconds - rpc.seconds
    return {"seconds": elapsed, "settled": settled, "ledgers": ledgers, "own_ms": own * 1000 / deposits,
            "cpu_ms": tick_cpu * 1000 / deposits,
            "sql_ms": (sql.seconds + control.seconds) * 1000 / deposits, "rpc_ms": rpc.seconds * 1000 / deposits,
            "sql_calls": sql.calls / deposits, "sql_control": control.calls / deposits,
            "rpc_calls": rpc.calls / deposits}


def run_bare_sdk(devnet: DevnetHandle, deposits: int, lanes: int) -> dict[str, float]:
    """The same chain work with bare stellar-sdk calls: no journal, no database, no proofs."""
    g = devnet.genesis
    passphrase = g["passphrase"]
    lane_keys = [Keypair.from_secret(p["secret"]) for p in baseline_lanes(g, lanes)]
    fee = Keypair.from_secret(g["fee_account"]["secret"])
    users = g["users"]
    server = SorobanServer(devnet.url, client=RequestsClient(num_retries=0))
    from stellar_sdk import xdr

    def submit(lane: Keypair, contract: str, fn: str, args: list, auth: list | None) -> str:
        account = server.load_account(lane.public_key)
        tx = (TransactionBuilder(account, passphrase, base_fee=100)
              .append_invoke_contract_function_op(contract, fn, args, auth=auth).set_timeout(300).build())
        tx = server.prepare_transaction(tx, server.simulate_transaction(tx))
        tx.sign(lane)
        bumped = TransactionBuilder.build_fee_bump_transaction(fee.public_key, 200, tx, passphrase)
        bumped.sign(fee)
        server.send_transaction(bumped)
        return tx.hash_hex()

    work = []
    for i in range(deposits):  # the users' side, done before the clock starts (as admission is for paygate)
        user = users[i % len(users)]
        entry, _, _ = sign_deposit(devnet, user["secret"], AMOUNT, valid_ledgers=500)
        work.append((user["public"], xdr.SorobanAuthorizationEntry.from_xdr(entry)))
    started, cpu = time.perf_counter(), time.process_time()
    credits: list[tuple[str, bytes]] = []
    while work or credits:
        for lane in lane_keys:
            if credits:
                account, deposit_tx = credits.pop(0)
                submit(lane, g["contracts"]["billing"], "credit", [scval.to_address(lane.public_key),
                       scval.to_address(account), scval.to_int128(AMOUNT), scval.to_bytes(deposit_tx)], None)
            elif work:
                account, auth = work.pop(0)
                inner = submit(lane, g["contracts"]["usdc"], "transfer", [scval.to_address(account),
                               scval.to_address(g["contracts"]["billing"]), scval.to_int128(AMOUNT)], [auth])
                credits.append((account, bytes.fromhex(inner)))
        devnet.close_ledger()
    return {"seconds": time.perf_counter() - started, "cpu": time.process_time() - cpu}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deposits", type=int, default=64)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled second pass")
    parser.add_argument("--profile-out", help="also write the second pass's pstats to this file")
    args = parser.parse_args()
    profile = Profile()
    with chain_world("pgf-", args.lanes) as (devnet, (chain, db)):
        ctx = work_context(chain)
        # Both sides warmed up first, unmeasured: paygate's work connection plans its statements and
        # fills its caches, as a loop's first ticks do once per process; the bare loop's HTTP session.
        cold = run_paygate(chain, db, ctx, WARM_UP, tag="warm-up")
        run_bare_sdk(devnet, WARM_UP, args.lanes)
        ours = run_paygate(chain, db, ctx, args.deposits)
        bare = run_bare_sdk(devnet, args.deposits, args.lanes)
        if not args.no_profile:  # a third pass under cProfile (slower): its figures are not reported
            run_paygate(chain, db, ctx, args.deposits, tag="profiled", profile=profile)
        ctx.conn.close()
    print(f"funding: {args.deposits} deposits, {args.lanes} lanes, devnet in manual mode")
    print(f"  paygate   : {ours['settled']} settled in {ours['seconds']:.2f} s over {ours['ledgers']} ledgers "
          f"= {args.deposits / ours['seconds']:.1f} deposits/s")
    print(f"  own (non-RPC) time per deposit   : {ours['own_ms']:6.2f} ms  (target <= 5; includes XDR build+sign; "
          f"the first {WARM_UP} through a fresh work connection: {cold['own_ms']:.2f} ms)")
    print(f"  CPU (process_time) per deposit   : {ours['cpu_ms']:6.2f} ms  (this process: Python, XDR, client side)")
    print(f"  Postgres time per deposit        : {ours['sql_ms']:6.2f} ms ({ours['sql_calls']:.1f} statements,"
          f" target <= 12; + {ours['sql_control']:.1f} BEGIN/COMMIT/SAVEPOINT round trips)")
    print(f"  waiting on RPC per deposit       : {ours['rpc_ms']:6.2f} ms ({ours['rpc_calls']:.1f} calls)")
    print(f"  baseline, bare stellar-sdk (no journal, no DB): {args.deposits / bare['seconds']:.1f} deposits/s")
    print(f"  ratio paygate / bare             : {bare['seconds'] / ours['seconds']:.2f}  (target >= 0.8)")
    print(f"  bare stellar-sdk CPU per deposit : {bare['cpu'] * 1000 / args.deposits:6.2f} ms  (cf. paygate's)")
    if not args.no_profile:
        print("  profile (second pass under cProfile), paygate's own code by cumulative time:")
        print(profile.summary(args.deposits))
        print("  hottest functions by own time (any module):")
        print(profile.hottest(args.deposits))
        if args.profile_out:
            profile.profiler.dump_stats(args.profile_out)


if __name__ == "__main__":
    main()
