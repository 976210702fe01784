"""Operator commands at scale (a benchmark, not a test: it prints figures and asserts nothing).

Builds one database with 1 M charges, 1 M lineages, 100 k accounts and 1 M webhook rows (plus the
reconciler's checks, findings, deposits, quarantined events), all with generate_series, then times:

- `status`                           (target <= 1 s): readiness() in-process, and the CLI process;
- `reconcile-report --format json`   (target <= 5 s): report() in-process, and the CLI process;
- one reconciler tick against a devnet (its lanes and contracts; the bench accounts are unknown to
  the chain, so every check is "unexplained": the tick does its full work).

For a target that is missed, every query of that command is timed and the plan of each slow one is
printed (EXPLAIN ANALYZE, BUFFERS). The baseline printed beside each figure is `SELECT count(*)` over
the largest table it reads, measured in the same run.

    .venv/bin/python bench/ops_scale.py [--scale 1.0]      (0.1 = a tenth of every table)

Uses PAYGATE_BENCH_DSN if set (the database is dropped and rebuilt: use a scratch one), else a
private cluster from the system binaries."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from paygate_cli.db.migrate import migrate
from paygate_cli.sandbox.pg_cluster import Cluster

PAYGATE = str(Path(sys.executable).with_name("paygate"))

# The address of bench account number {n} (1-based), from the table of real StrKeys loaded first.
ADDRESS = "(SELECT b.address FROM bench_addresses b WHERE b.num = {n})"


def load_addresses(conn: psycopg.Connection, count: int) -> None:
    """Real account addresses (checksummed StrKeys: the chain client parses them), made in Python
    because a StrKey's CRC16 is not worth writing in SQL; every table then takes them by number."""
    from stellar_sdk import StrKey

    conn.execute("DROP TABLE IF EXISTS bench_addresses")
    conn.execute("CREATE TABLE bench_addresses (num integer PRIMARY KEY, address text NOT NULL)")
    with conn.cursor().copy("COPY bench_addresses (num, address) FROM STDIN") as copy:
        for n in range(1, count + 1):
            copy.write_row((n, StrKey.encode_ed25519_public_key(os.urandom(32))))
    conn.execute("ANALYZE bench_addresses")


def populate(conn: psycopg.Connection, scale: float, lanes: list[str]) -> dict[str, int]:
    n_accounts, n_lineages = int(100_000 * scale), int(1_000_000 * scale)
    n_charges, n_webhooks, n_deposits = int(1_000_000 * scale), int(1_000_000 * scale), int(100_000 * scale)
    load_addresses(conn, n_accounts)
    steps = [
        ("accounts", f"""
            INSERT INTO paygate.accounts (address, cached_balance)
            SELECT {ADDRESS.format(n='n')}, (n * 7919) % 1000000 FROM generate_series(1, {n_accounts}) n"""),
        ("lanes", "INSERT INTO paygate.lanes (address) SELECT unnest(%(lanes)s::text[])"),
        # Terminal lineages spread over the lanes; one live lineage on every other lane.
        ("lineages", f"""
            INSERT INTO paygate.lineages (purpose, entitlement, lane, state, source_seq, key_id, envelope, inner_hash,
                                          outer_hash, max_time, signed_at_ledger, ledger, fee_charged, resolution,
                                          created_at, signed_at, sent_at, resolved_at)
            SELECT CASE WHEN n % 10 = 0 THEN 'deposit' WHEN n % 10 = 1 THEN 'credit' ELSE 'charge_batch' END,
                   'bench:' || n, (%(lanes)s::text[])[1 + n % %(nlanes)s],
                   CASE WHEN n % 50 = 0 THEN 'expired' ELSE 'applied' END,
                   n, 'k1', '\\x00'::bytea, sha256(n::text::bytea), sha256(('o' || n)::text::bytea), 1700000000 + n,
                   n / 10 + 1, n / 10 + 2, 100, 'bench', now() - make_interval(secs => {n_lineages} - n),
                   now() - make_interval(secs => {n_lineages} - n), now() - make_interval(secs => {n_lineages} - n),
                   now() - make_interval(secs => {n_lineages} - n)
            FROM generate_series(1, {n_lineages}) n"""),
        ("live lineages", f"""
            INSERT INTO paygate.lineages (purpose, entitlement, lane, state, source_seq, key_id, envelope, inner_hash,
                                          outer_hash, max_time, signed_at_ledger, created_at)
            SELECT 'charge_batch', 'bench-live:' || i, l, 'sent', {n_lineages} + i, 'k1', '\\x00'::bytea,
                   sha256(('live' || i)::text::bytea), sha256(('livo' || i)::text::bytea), 1800000000, 1,
                   now() - interval '1 hour'
            FROM unnest(%(lanes)s::text[]) WITH ORDINALITY AS t(l, i) WHERE i % 2 = 0"""),
        # Charges: 98 % settled (with their batch lineage), 1 % authorized, 1 % failed.
        ("charges", f"""
            INSERT INTO paygate.charges (charge_id, account, amount, idempotency_key, status, claimed_at, lineage_id,
                                         settled_at, failed_at, failed_by, reason, created_at)
            SELECT sha256(('c' || n)::text::bytea), {ADDRESS.format(n=f'1 + n % {n_accounts}')}, 1 + n % 1000,
                   'ck' || n,
                   CASE WHEN n % 100 = 0 THEN 'authorized' WHEN n % 100 = 1 THEN 'failed' ELSE 'settled' END,
                   CASE WHEN n % 100 > 1 THEN now() END,
                   CASE WHEN n % 100 > 1 THEN 1 + n % {n_lineages} END,
                   CASE WHEN n % 100 > 1 THEN now() END,
                   CASE WHEN n % 100 = 1 THEN now() END, CASE WHEN n % 100 = 1 THEN 'observer' END,
                   CASE WHEN n % 100 = 1 THEN 'insufficient_balance' END,
                   now() - make_interval(secs => {n_charges} - n)
            FROM generate_series(1, {n_charges}) n"""),
        ("webhook endpoint", "INSERT INTO paygate.webhook_endpoints (url, secret) VALUES "
                             "('https://example.com/h', '0123456789abcdef0123')"),
        ("webhooks", f"""
            INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload, status, attempts, delivered_at,
                                                dead_at, dead_reason, next_attempt_at, created_at)
            SELECT 1, 'charge.settled', jsonb_build_object('n', n),
                   CASE WHEN n % 1000 = 0 THEN 'dead' WHEN n % 1000 < 5 THEN 'pending' ELSE 'delivered' END,
                   1, CASE WHEN n % 1000 >= 5 THEN now() END, CASE WHEN n % 1000 = 0 THEN now() END,
                   CASE WHEN n % 1000 = 0 THEN 'no success in 8 attempts' END, now(),
                   now() - make_interval(secs => {n_webhooks} - n)
            FROM generate_series(1, {n_webhooks}) n"""),
        ("deposits", f"""
            INSERT INTO paygate.deposits (account, amount, auth_entry, auth_nonce, auth_expiration_ledger,
                                                 idempotency_key, status, settled_at, settled_by, reason, created_at)
            SELECT {ADDRESS.format(n=f'1 + n % {n_accounts}')}, 1000, 'AAAA', n, 100, 'dk' || n,
                   CASE WHEN n % 500 = 0 THEN 'pending' WHEN n % 500 = 1 THEN 'failed' ELSE 'settled' END,
                   CASE WHEN n % 500 > 1 THEN now() END, CASE WHEN n % 500 > 1 THEN 'funding' END,
                   CASE WHEN n % 500 = 1 THEN 'bench' END, now() - make_interval(secs => n)
            FROM generate_series(1, {n_deposits}) n"""),
        ("account checks", """
            INSERT INTO paygate.account_checks (address, checked_at, chain_balance, cached_balance, in_flight, lagging,
                                                regime, drift)
            SELECT address, now() - make_interval(secs => (row_number() OVER ())::int % 86400), cached_balance,
                   cached_balance, 0, 0,
                   CASE WHEN (row_number() OVER ()) % 100 = 0 THEN 'unexplained'
                        WHEN (row_number() OVER ()) % 100 = 1 THEN 'in_flight' ELSE 'match' END, 0
            FROM paygate.accounts"""),
        ("findings", """
            INSERT INTO paygate.findings (kind, subject, summary, resolved_at, resolved_by)
            SELECT 'balance_drift', 'bench-' || n, 'bench finding',
                   CASE WHEN n % 10 <> 0 THEN now() END, CASE WHEN n % 10 <> 0 THEN 'reconciler' END
            FROM generate_series(1, 10000) n"""),
        ("chain events", """
            INSERT INTO paygate.chain_events (event_id, ledger, kind, payload, quarantined, quarantine_reason)
            SELECT 'ev' || n, n, 'charge', '{}'::jsonb, n % 1000 = 0, CASE WHEN n % 1000 = 0 THEN 'bench' END
            FROM generate_series(1, 100000) n"""),
    ]
    counts = {}
    for name, sql in steps:
        started = time.perf_counter()
        with conn.transaction():
            # Every step gets the same parameters, so a modulo is written %% for the driver.
            conn.execute(sql.replace(" % ", " %% "), {"lanes": lanes, "nlanes": len(lanes)})
        print(f"  built {name:<16} in {time.perf_counter() - started:6.1f} s", flush=True)
    conn.execute("VACUUM ANALYZE")
    for table in ("charges", "lineages", "accounts", "webhook_outbox"):
        counts[table] = int(conn.execute(f"SELECT count(*) FROM paygate.{table}").fetchone()[0])
    return counts


def timed(fn: Any, runs: int = 3) -> float:
    fn()  # warm
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def explain_slow(conn: psycopg.Connection, queries: dict[str, tuple[str, Any]], threshold: float = 0.05) -> None:
    for name, (sql, params) in queries.items():
        started = time.perf_counter()
        conn.execute(sql, params).fetchall()
        took = time.perf_counter() - started
        print(f"    {took * 1000:8.1f} ms  {name}")
        if took >= threshold:
            plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params).fetchall()
            print("\n".join("        " + row[0] for row in plan))


def status_queries() -> dict[str, tuple[str, Any]]:
    from paygate_cli import state
    from paygate_cli.catalogue import WORKERS
    from paygate_cli.db.locks import LOCK_NAMESPACE
    from paygate_cli.ops import drain, status

    queries = {f"queue {name}": (sql, None) for name, sql in state.QUEUE_SQL.items()}
    queries.update({"lock holders": (status.LOCK_HOLDERS_SQL, (LOCK_NAMESPACE,)),
                    "last runs": (status.LAST_RUNS_SQL, (sorted(WORKERS),)),
                    "drains": (drain.DRAINED_SQL, None),
                    "findings": (state.OPEN_FINDINGS_SUMMARY_SQL, None)})
    return queries


def report_queries() -> dict[str, tuple[str, Any]]:
    from paygate_cli.ops import reconcile

    params = {"since": None, "account": None, "limit": reconcile.ROW_LIMIT, "older": 600.0}
    return {name: (getattr(reconcile, name), params) for name in (
        "TOTALS_SQL", "DRIFT_SQL", "FINDINGS_SQL", "STUCK_SQL", "UNRESOLVED_SQL", "QUARANTINED_SQL", "UNCHECKED_SQL")}


def cli(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([PAYGATE, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    from paygate_cli.ops.reconcile import report
    from paygate_cli.ops.status import readiness
    from tests.support.devnet_support import start_devnet

    tmp = tempfile.mkdtemp(prefix="pgb-", dir="/tmp")
    os.chmod(tmp, 0o755)
    dsn = os.environ.get("PAYGATE_BENCH_DSN")
    cluster = None
    devnet = start_devnet(Path(tmp) / "devnet", lanes=8, users=1)
    try:
        if not dsn:
            cluster = Cluster.at(Path(tmp) / "d")
            cluster.init(fast=True)
            cluster.start()
            dsn = cluster.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP SCHEMA IF EXISTS paygate CASCADE")
            migrate(conn)
            lanes = [lane["public"] for lane in devnet.genesis["lanes"]]
            print(f"building (scale {args.scale:g}) ...", flush=True)
            counts = populate(conn, args.scale, lanes)
            print("rows: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
            base_charges = timed(lambda: conn.execute("SELECT count(*) FROM paygate.charges").fetchone())
            base_outbox = timed(lambda: conn.execute("SELECT count(*) FROM paygate.webhook_outbox").fetchone())

            status_s = timed(lambda: readiness(conn))
            print(f"\nstatus (readiness, in-process): {status_s:.3f} s  (target <= 1 s; baseline "
                  f"count(*) webhook_outbox {base_outbox:.3f} s, ratio {status_s / base_outbox:.2f})")
            if status_s > 1.0:
                explain_slow(conn, status_queries())
            report_s = timed(lambda: report(conn))
            print(f"reconcile-report (report(), in-process): {report_s:.3f} s  (target <= 5 s; baseline "
                  f"count(*) charges {base_charges:.3f} s, ratio {report_s / base_charges:.2f})")
            if report_s > 5.0:
                explain_slow(conn, report_queries())

        env = {**os.environ, "PAYGATE_DATABASE_URL": dsn, "PAYGATE_LOG_LEVEL": "warning"}
        env = {k: v for k, v in env.items() if not k.startswith("PAYGATE_") or k in (
            "PAYGATE_DATABASE_URL", "PAYGATE_LOG_LEVEL")}
        print(f"paygate status --json (process):                         {cli(['status', '--json'], env):.3f} s")
        print(f"paygate reconcile-report --format json (process):       "
              f"{cli(['reconcile-report', '--format', 'json'], env):.3f} s")

        from tests.support.chain_env import chain_environ

        chain_env = chain_environ(devnet, dsn, Path(tmp) / "keys")
        chain_env["PAYGATE_LOG_LEVEL"] = "warning"
        started = time.perf_counter()
        proc = subprocess.run([PAYGATE, "run-tick", "reconciler", "--json"], env=chain_env, capture_output=True,
                              text=True, check=False)
        tick_s = time.perf_counter() - started
        details = json.loads(proc.stdout)["run_tick"]["last_details"] if proc.stdout else {}
        if proc.returncode not in (0, 3):
            print(proc.stderr[-2000:])
        print(f"one reconciler tick (process, exit {proc.returncode}): {tick_s:.3f} s; "
              f"{details.get('accounts')} accounts read, total {details.get('total', {}).get('regime')}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            from paygate_cli.workers import reconciler

            with conn.transaction():
                conn.execute(reconciler.NO_JIT_SQL)
                total_s = timed(lambda: conn.execute(reconciler.SETTLED_CHARGES_SQL).fetchone(), runs=1)
                moving_s = timed(lambda: conn.execute(reconciler.TOTAL_MOVING_SQL).fetchone(), runs=1)
            print(f"  of which the contract total's SQL: settled charges {total_s:.3f} s (once per tick), "
                  f"the rest {moving_s:.3f} s (twice)")
            if tick_s > 5.0:
                explain_slow(conn, {"settled charges": (reconciler.SETTLED_CHARGES_SQL, None),
                                    "total (moving parts)": (reconciler.TOTAL_MOVING_SQL, None),
                                    "pick": (reconciler.PICK_ACCOUNTS_SQL, {"n": 50}),
                                    "lanes": (reconciler.LANES_SQL, ([],))})
    finally:
        devnet.stop()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
