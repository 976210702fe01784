"""The TTL keeper's cost (docs/architecture.md §4 "State archival (TTL)", §6 "TTL keeper") per 10,000
accounts per day: RPC reads (getLedgerEntries calls and keys), transactions (extends, restores), rent
(stroops and XLM) and the keeper's own time per tick, against a naive keeper's reads (every kept entry
every tick) printed in the same run. A benchmark, not a test: it prints figures and ratios, asserts
nothing.

The world: a private Postgres and a devnet in manual mode with the network's real TTLs (a new
persistent entry lives 120 days) and the keeper's defaults (threshold 30 days, extend to 120 days
ahead, 200 reads and 20 keys per transaction, a tick a minute). `--funded` accounts (40) get a real
balance entry through the funding path (a deposit each); `--accounts` (500) accounts in all carry a
balance, the rest registered with money but no entry written yet (a read of one costs the same key;
nothing to extend). Measured, in-process ticks of `run-tick ttl`:

1. rotation: the ticks that read every kept entry once (at most 200 a tick), then an idle tick (all
   read within the hour), then every entry aged an hour and read again: keys and calls per tick and
   each tick's wall time;
2. extension: the devnet advanced 91 days, so every entry is inside the threshold; the keeper reads,
   sends and records the ExtendFootprintTTLs: transactions, keys each, feeCharged (the rent), ticks.

Scaled to 10,000 accounts per day by the rotation's arithmetic (said in the output): each entry read
hourly (24 keys a day) and extended once per (extend_to - threshold) = 90 days at the measured rent per
key; restores none (nothing archives while the keeper runs).

    .venv/bin/python bench/ttl.py [--accounts 500] [--funded 40]
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from stellar_sdk import Keypair

from paygate_cli.chain.rpc import ChainClient
from paygate_cli.db.migrate import migrate
from paygate_cli.sandbox.pg_cluster import Cluster
from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.charges_support import fund
from tests.support.devnet_support import start_devnet

DAY_LEDGERS = 86_400 // 5
THRESHOLD_DAYS, EXTEND_TO_DAYS = 30, 120  # the settings' defaults (PAYGATE_TTL_THRESHOLD / _EXTEND_TO)
READS_PER_TICK, KEYS_PER_TX, TICKS_PER_DAY = 200, 20, 1440  # defaults; cadence 60 s
READ_EVERY_HOURS = 1
SCALE = 10_000
CONTRACT_ENTRIES = 3  # instance, code, the SAC balance


class Reads:
    """Counts getLedgerEntries calls and keys (ChainClient.ledger_entries, wrapped in this process)."""

    def __init__(self) -> None:
        self.calls = 0
        self.keys = 0
        original = ChainClient.ledger_entries
        reads = self

        def counted(client: ChainClient, keys: list[Any]) -> Any:
            reads.calls += 1
            reads.keys += len(keys)
            return original(client, keys)

        ChainClient.ledger_entries = counted  # type: ignore[method-assign]

    def snapshot(self) -> tuple[int, int]:
        return self.calls, self.keys


def tick(chain: ChainEnv, reads: Reads) -> tuple[float, int, int, int]:
    """One keeper tick: (wall seconds, exit code, getLedgerEntries calls, keys)."""
    calls, keys = reads.snapshot()
    started = time.perf_counter()
    result = chain.tick("ttl", "--once")
    seconds = time.perf_counter() - started
    if result.code not in (0, 1):
        raise SystemExit(f"ttl tick failed ({result.code}): {result.err[-2000:]}")
    return seconds, result.code, reads.calls - calls, reads.keys - keys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--accounts", type=int, default=500)
    parser.add_argument("--funded", type=int, default=40)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pgttl-", dir="/tmp"))
    tmp.chmod(0o755)
    cluster = Cluster.at(tmp / "pg")
    cluster.init(fast=True)
    cluster.start()
    devnet = start_devnet(tmp / "devnet", lanes=4, users=args.funded)
    try:
        dsn = cluster.dsn()
        with psycopg.connect(dsn, autocommit=True) as db:
            migrate(db)
            environ = chain_environ(devnet, dsn, tmp / "keys")
            environ.update(PAYGATE_OBSERVER_START_LEDGER="1", PAYGATE_FEE_STATS_CACHE="0s", PAYGATE_LOG_LEVEL="warning")
            chain = ChainEnv(devnet, dsn, environ)
            run(chain, db, args)
    finally:
        devnet.stop()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def run(chain: ChainEnv, db: psycopg.Connection, args: argparse.Namespace) -> None:
    devnet = chain.devnet
    print(f"bench/ttl.py: {args.accounts} accounts with money ({args.funded} with a real balance entry), "
          f"keeper defaults (threshold {THRESHOLD_DAYS} d, extend to {EXTEND_TO_DAYS} d, {READS_PER_TICK} reads "
          f"and {KEYS_PER_TX} keys per transaction, a tick every {86400 // TICKS_PER_DAY} s)", flush=True)
    started = time.perf_counter()
    fund(chain, db, [(u, 10_000_000) for u in devnet.genesis["users"]], rounds=80)
    print(f"  funded {args.funded} accounts through the funding path in {time.perf_counter() - started:.0f} s")
    synthetic = [(Keypair.random().public_key, 1) for _ in range(args.accounts - args.funded)]
    with db.cursor() as cur:
        cur.executemany("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, %s)", synthetic)
    reads = Reads()
    entries = args.accounts + CONTRACT_ENTRIES

    # 1. rotation
    first: list[tuple[float, int, int, int]] = []
    while True:
        first.append(tick(chain, reads))
        unread = db.execute("SELECT count(*) FROM paygate.ttl_entries WHERE read_at IS NULL").fetchone()[0]
        if not unread or len(first) > 20:
            break
    idle = [tick(chain, reads) for _ in range(3)]
    db.execute("UPDATE paygate.ttl_entries SET read_at = read_at - interval '61 minutes'")
    again: list[tuple[float, int, int, int]] = []
    while True:
        again.append(tick(chain, reads))
        aged = db.execute("SELECT count(*) FROM paygate.ttl_entries WHERE read_at < now() - interval '1 hour'"
                          ).fetchone()[0]
        if not aged or len(again) > 20:
            break
    read_ticks = first + again
    read_keys = sum(t[3] for t in read_ticks)
    reading = [t for t in read_ticks if t[3]]
    per_read_tick = statistics.median(t[0] for t in reading) if reading else float("nan")
    keys_per_read_tick = read_keys / max(1, len(reading))
    print(f"  rotation: {entries} kept entries read in {len(first)} ticks, again after an hour in {len(again)} ticks; "
          f"{read_keys} keys in {sum(t[2] for t in read_ticks)} getLedgerEntries calls")
    print(f"    tick wall time: reading ~{keys_per_read_tick:.0f} keys median {per_read_tick * 1000:.0f} ms; "
          f"idle (nothing due) median {statistics.median(t[0] for t in idle) * 1000:.0f} ms, "
          f"{sum(t[3] for t in idle)} keys read")

    # 2. extension: 91 days on, everything inside the 30-day threshold
    devnet.rpc("devnet_advance", {"ledgers": (EXTEND_TO_DAYS - THRESHOLD_DAYS + 1) * DAY_LEDGERS})
    db.execute("UPDATE paygate.ttl_entries SET read_at = read_at - interval '61 minutes'")
    ext: list[tuple[float, int, int, int]] = []
    for _ in range(40):
        ext.append(tick(chain, reads))
        devnet.close_ledger()
        pending = db.execute("SELECT count(*) FROM paygate.ttl_jobs WHERE status = 'pending'").fetchone()[0]
        aged = db.execute("SELECT count(*) FROM paygate.ttl_entries WHERE read_at < now() - interval '1 hour'"
                          ).fetchone()[0]
        if len(ext) > 2 and not pending and not aged:
            break
    jobs = db.execute("SELECT j.kind, j.status, j.fee_charged, cardinality(j.keys_xdr),"
                      " (SELECT count(*) FROM paygate.ttl_entries e WHERE e.key_xdr = ANY(j.keys_xdr)"
                      "  AND e.kind = 'account_balance') FROM paygate.ttl_jobs j ORDER BY j.id").fetchall()
    applied = [j for j in jobs if j[1] == "applied" and j[0] == "extend"]
    restores = [j for j in jobs if j[0] == "restore"]
    rent = sum(int(j[2]) for j in applied)
    keys_extended = sum(j[3] for j in applied)
    pure = [j for j in applied if j[4] == j[3]]  # transactions of account balance entries only
    per_account_key = (sum(int(j[2]) for j in pure) / sum(j[3] for j in pure)) if pure else rent / max(1, keys_extended)
    states = dict(db.execute("SELECT state, count(*) FROM paygate.ttl_entries GROUP BY 1").fetchall())
    print(f"  extension (91 days on): {len(applied)} ExtendFootprintTTL applied ({keys_extended} keys, "
          f"{[j[3] for j in applied]} per transaction), {len(restores)} restores, rent {rent} stroops "
          f"({rent / 1e7:.4f} XLM) in {len(ext)} ticks; entries now {states}")
    print(f"    rent per account balance key extended by {EXTEND_TO_DAYS - THRESHOLD_DAYS}+ days: "
          f"{per_account_key:.0f} stroops (from {len(pure)} transactions of account keys only, their inclusion fee "
          f"included); tick wall time median {statistics.median(t[0] for t in ext) * 1000:.0f} ms, "
          f"max {max(t[0] for t in ext) * 1000:.0f} ms")

    # 3. per 10,000 accounts per day (the rotation's arithmetic)
    kept = SCALE + CONTRACT_ENTRIES
    keys_day = min(kept * 24 // READ_EVERY_HOURS, READS_PER_TICK * TICKS_PER_DAY)
    calls_day = math.ceil(keys_day / READS_PER_TICK)  # one call per reading tick: <= 200 keys each
    # What every tick reads besides the rotation (measured on the idle ticks: the instance, for its code key)
    idle_calls, idle_keys = sum(t[2] for t in idle) / len(idle), sum(t[3] for t in idle) / len(idle)
    calls_day += round(idle_calls * TICKS_PER_DAY)
    keys_day += round(idle_keys * TICKS_PER_DAY)
    naive_keys = kept * TICKS_PER_DAY
    naive_calls = math.ceil(kept / 200) * TICKS_PER_DAY
    extended_day = kept / (EXTEND_TO_DAYS - THRESHOLD_DAYS)
    txs_day = extended_day / KEYS_PER_TX
    rent_day = SCALE / (EXTEND_TO_DAYS - THRESHOLD_DAYS) * per_account_key
    reading_ticks_day = math.ceil(kept * 24 / READS_PER_TICK)
    time_day = reading_ticks_day * per_read_tick * READS_PER_TICK / max(1.0, keys_per_read_tick) + (
        TICKS_PER_DAY - reading_ticks_day) * statistics.median(t[0] for t in idle)
    print(f"  per {SCALE:,} accounts per day (scaled from the figures above: each of {kept:,} entries read hourly, "
          f"extended once per {EXTEND_TO_DAYS - THRESHOLD_DAYS} days, {KEYS_PER_TX} keys a transaction):")
    print(f"    reads:         {keys_day:,} keys in {calls_day:,} getLedgerEntries calls, {idle_calls:.0f} call of "
          f"{idle_keys:.0f} key(s) every tick included "
          f"(naive keeper, every entry every tick: {naive_keys:,} keys in {naive_calls:,} calls; "
          f"ratio {naive_keys / keys_day:.0f}x fewer keys, {naive_calls / calls_day:.0f}x fewer calls)")
    print(f"    rotation headroom: {READS_PER_TICK * TICKS_PER_DAY:,} keys/day at {READS_PER_TICK} a tick: hourly "
          f"holds up to {READS_PER_TICK * TICKS_PER_DAY // 24 - CONTRACT_ENTRIES:,} accounts")
    print(f"    transactions:  {txs_day:.1f} ExtendFootprintTTL ({extended_day:.0f} keys), 0 restores")
    print(f"    rent:          {rent_day:,.0f} stroops = {rent_day / 1e7:.4f} XLM "
          f"(vs PAYGATE_TTL_RENT_BUDGET's default 100,000,000 stroops: {rent_day / 1e8:.1%})")
    full_read_tick = per_read_tick * READS_PER_TICK / max(1.0, keys_per_read_tick)
    print(f"    keeper time:   ~{time_day:.0f} s of ticks a day ({time_day / TICKS_PER_DAY * 1000:.0f} ms a tick "
          f"on average; a reading tick of {READS_PER_TICK} keys ~{full_read_tick * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
