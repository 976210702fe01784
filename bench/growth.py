"""Cost as history grows.

One private database, the same small set of live work throughout (claimable charges, pending
deposits, due webhooks, queued relays and bot jobs, due subscriptions), measured twice: with 10 k
terminal rows of history per big table, then after growing the history to `--rows` (default 5 M;
charges, chain events and delivered webhooks each get that many, plus the lineages, batches,
deposits, relays, bot jobs and subscriptions that go with them), all with INSERT … SELECT
generate_series. Each figure is the statement(s) a hot path runs, inside a transaction that is rolled
back (so every repetition sees the same work):

- settlement claim: candidates (FOR UPDATE SKIP LOCKED) + lane allocation + recording the lineage on
  the rows and opening the batch (`workers/settlement.py`, `journal/lineage.py`);
- funding claim (`queues/deposits.py` CLAIM_SQL), and the other claims: subscriptions, relay,
  relay_drainer, webhooks (claim and take-over), open charge batches, recovery's stuck scan;
- observer page: seen-events lookup, event insert, settle of a page of 48 charges, cursor advance,
  the unexplained-charges check (`workers/observer.py`);
- state metrics: the queue depths every ticking worker writes every 30 s (`state.py`).

Figures: shared buffers touched (hit + read, from EXPLAIN ANALYZE BUFFERS: robust under load) and the
median execution time (wall clock, under load on a shared machine). The ratio is 5 M / 10 k; the target
is <= 1.2. When an operation misses it on buffers, the plan of each of its statements at the large size
is printed. Then every plan is checked for sequential scans of a big table and the size of each index
the claims use is printed at both sizes (a partial index on claimable rows does not grow).

    .venv/bin/python bench/growth.py [--rows 5000000] [--base 10000] [--runs 15]

Uses a private cluster from the system binaries (PAYGATE_BENCH_DSN if set: a scratch database, its
paygate schema is dropped and rebuilt)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from paygate_cli.db.migrate import migrate
from paygate_cli.queues import bot_jobs, charges, deposits, relays, subscriptions, webhooks
from paygate_cli.sandbox.pg_cluster import Cluster
from paygate_cli.state import QUEUE_SQL
from paygate_cli.workers import observer, recovery, retention, settlement

ACCOUNTS = 1000
LANE_COUNT = 8
PER_BATCH = 48
HISTORY_LINEAGE_BASE = 1_000_000_000  # explicit ids for history lineages, far from the live ones
OLD = "now() - interval '40 days'"
BIG_TABLES = ("charges", "chain_events", "webhook_outbox", "lineages", "charge_batches", "deposits",
              "relays", "bot_jobs", "subscriptions")


def address(expr: str, offset: int = 0) -> str:
    """A syntactically valid account address for number `expr` (digits spelt as letters A-J)."""
    return f"'G' || translate(lpad(({expr} + {offset})::text, 55, '0'), '0123456789', 'ABCDEFGHIJ')"


LANES = [f"G{str(900_000 + i).rjust(55, '0').translate(str.maketrans('0123456789', 'ABCDEFGHIJ'))}"
         for i in range(1, LANE_COUNT + 1)]
CONTRACT = "C" + "A" * 55

# History: rows numbered first..last, terminal (settled/delivered/applied) 40 days ago.
HISTORY_SQL = [
    # one charge_batch lineage + its closed batch per 48 charges
    f"""INSERT INTO paygate.lineages (id, purpose, entitlement, lane, state, source_seq, key_id, envelope, inner_hash,
                                     outer_hash, max_time, signed_at_ledger, ledger, fee_charged, resolution,
                                     created_at, signed_at, sent_at, resolved_at)
        OVERRIDING SYSTEM VALUE
        SELECT {HISTORY_LINEAGE_BASE} + b, 'charge_batch', 'charge_batch:h' || b,
               (%(lanes)s::text[])[1 + mod(b, {LANE_COUNT})],
               'applied', 1000 + b, 'k1', '\\x00', sha256(('i' || b)::bytea), sha256(('o' || b)::bytea), 1, 1,
               1000 + b / 100, 100, 'receipt', {OLD}, {OLD}, {OLD}, {OLD}
        FROM generate_series(%(first)s::bigint / {PER_BATCH}, %(last)s::bigint / {PER_BATCH}) b
        ON CONFLICT DO NOTHING""",
    f"""INSERT INTO paygate.charge_batches (lineage_id, entries, outcome, created_at, closed_at)
        SELECT {HISTORY_LINEAGE_BASE} + b, {PER_BATCH}, 'applied', {OLD}, {OLD}
        FROM generate_series(%(first)s::bigint / {PER_BATCH}, %(last)s::bigint / {PER_BATCH}) b
        ON CONFLICT DO NOTHING""",
    f"""INSERT INTO paygate.charges (charge_id, account, amount, idempotency_key, status, claimed_at, lineage_id,
                                    event_id, settled_ledger, settled_at, created_at, updated_at)
        SELECT sha256(('c' || g)::bytea), {address(f'1 + mod(g, {ACCOUNTS})')}, 7, 'h' || g, 'settled', {OLD},
               {HISTORY_LINEAGE_BASE} + g / {PER_BATCH}, 'h' || g, 1000 + g / 100, {OLD}, {OLD}, {OLD}
        FROM generate_series(%(first)s::bigint, %(last)s::bigint) g""",
    f"""INSERT INTO paygate.chain_events (event_id, ledger, tx_hash, contract_id, kind, payload, applied_to, effect,
                                         observed_at)
        SELECT 'h' || g, 1000 + g / 100, 'tx', '{CONTRACT}', 'charge',
               jsonb_build_object('amount', '7', 'charge_id', g), 'charge:' || g, 'settled', {OLD}
        FROM generate_series(%(first)s::bigint, %(last)s::bigint) g""",
    f"""INSERT INTO paygate.webhook_outbox (event_type, payload, status, attempts, delivered_at, created_at, updated_at)
        SELECT 'charge.settled', jsonb_build_object('charge_row_id', g), 'delivered', 1, {OLD}, {OLD}, {OLD}
        FROM generate_series(%(first)s::bigint, %(last)s::bigint) g""",
    f"""INSERT INTO paygate.deposits (account, amount, auth_entry, auth_nonce, auth_expiration_ledger,
                                            idempotency_key, status, settled_by, settled_at, deposit_tx, created_at,
                                            updated_at)
        SELECT {address(f'1 + mod(g, {ACCOUNTS})')}, 70, 'AAAA', g, 1, 'h' || g, 'settled', 'observer', {OLD},
               sha256(('d' || g)::bytea), {OLD}, {OLD}
        FROM generate_series(%(first)s::bigint / 10, %(last)s::bigint / 10) g
        ON CONFLICT DO NOTHING""",
    f"""INSERT INTO paygate.relays (account, contract, function, args_xdr, auth_entries, auth_nonces,
                                   auth_expiration_ledger, max_fee, idempotency_key, status, fee_charged, tx_hash,
                                   finished_at, created_at, updated_at)
        SELECT {address(f'1 + mod(g, {ACCOUNTS})')}, '{CONTRACT}', 'f', 'AAAA', '{{AAAA}}', ARRAY[g], 1, 100,
               'h' || g, 'applied', 50, sha256(('r' || g)::bytea), {OLD}, {OLD}, {OLD}
        FROM generate_series(%(first)s::bigint / 100, %(last)s::bigint / 100) g
        ON CONFLICT DO NOTHING""",
    f"""INSERT INTO paygate.bot_jobs (job_key, request_hash, contract, function, args_xdr, status, finished_at,
                                     created_at, updated_at)
        SELECT 'h' || g, '\\x00', '{CONTRACT}', 'f', 'AAAA', 'applied', {OLD}, {OLD}, {OLD}
        FROM generate_series(%(first)s::bigint / 100, %(last)s::bigint / 100) g
        ON CONFLICT DO NOTHING""",
    f"""INSERT INTO paygate.subscriptions (account, amount, period, anchor, next_period_start, idempotency_key,
                                          status, cancelled_at, created_at, updated_at)
        SELECT {address(f'1 + mod(g, {ACCOUNTS})')}, 7, '1 day', {OLD}, {OLD}, 'h' || g, 'cancelled', {OLD},
               {OLD}, {OLD}
        FROM generate_series(%(first)s::bigint / 100, %(last)s::bigint / 100) g
        ON CONFLICT DO NOTHING""",
]

# The live work, the same in both measurements (every measurement rolls back).
LIVE_SQL = [
    f"INSERT INTO paygate.accounts (address, cached_balance) SELECT {address('g')}, 1000000 "
    f"FROM generate_series(1, {ACCOUNTS}) g",
    "INSERT INTO paygate.lanes (address) SELECT unnest(%(lanes)s::text[])",
    "INSERT INTO paygate.observer_cursor (cursor, ledger) VALUES ('0000004294967296000-0000000000', 999999)",
    "INSERT INTO paygate.webhook_endpoints (url, secret)"
    " VALUES ('https://example.invalid/hook', 'bench-secret-0123456789')",
    f"""INSERT INTO paygate.charges (charge_id, account, amount, idempotency_key)
        SELECT sha256(('live' || g)::bytea), {address(f'1 + mod(g, {ACCOUNTS})')}, 7, 'live' || g
        FROM generate_series(1, 200) g""",
    f"""INSERT INTO paygate.deposits (account, amount, auth_entry, auth_nonce, auth_expiration_ledger,
                                            idempotency_key)
        SELECT {address(f'1 + mod(g, {ACCOUNTS})')}, 70, 'AAAA', -g, 1, 'live' || g FROM generate_series(1, 32) g""",
    """INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload)
       SELECT (SELECT min(id) FROM paygate.webhook_endpoints), 'charge.settled', '{}' FROM generate_series(1, 64)""",
    f"""INSERT INTO paygate.relays (account, contract, function, args_xdr, auth_entries, auth_nonces,
                                   auth_expiration_ledger, max_fee, idempotency_key)
        SELECT {address('g')}, '{CONTRACT}', 'f', 'AAAA', '{{AAAA}}', ARRAY[-g], 100, 100, 'live' || g
        FROM generate_series(1, 16) g""",
    f"""INSERT INTO paygate.bot_jobs (job_key, request_hash, contract, function, args_xdr)
        SELECT 'live' || g, '\\x00', '{CONTRACT}', 'f', 'AAAA' FROM generate_series(1, 16) g""",
    f"""INSERT INTO paygate.subscriptions (account, amount, period, anchor, next_period_start, idempotency_key)
        SELECT {address('g')}, 7, '1 day', now() - interval '1 hour', now() - interval '1 hour', 'live' || g
        FROM generate_series(1, 10) g""",
]

# The 48 live charges the observer settles in its page (their events), and the page's event ids.
PAGE_SQL = """
SELECT encode(charge_id, 'hex'), account, amount FROM paygate.charges WHERE status = 'authorized' ORDER BY id LIMIT 48
"""


def observer_page(conn: psycopg.Connection) -> list[tuple[str, dict[str, Any]]]:
    rows = conn.execute(PAGE_SQL).fetchall()
    ids = [f"0000004294967297{i:03d}-0000000000" for i in range(len(rows))]
    n = len(rows)
    events = [{"event_id": event_id, "ledger": 999999, "tx_hash": "tx", "contract_id": CONTRACT, "kind": "charge",
               "account": r[1], "amount": str(r[2]), "ref": r[0], "applied_to": None, "effect": None,
               "quarantine_reason": None} for event_id, r in zip(ids, rows, strict=True)]
    settles = [{"event_id": event_id, "charge_id": r[0], "account": r[1], "amount": str(r[2]), "ledger": 999999}
               for event_id, r in zip(ids, rows, strict=True)]
    # The statements apply_page sends: each takes the page as one JSON document.
    return [
        ("cursor", (observer.LOAD_CURSOR_SQL, {})),
        ("seen", (observer.SEEN_EVENTS_SQL, (json.dumps(ids),))),
        ("settle", (charges.SETTLE_CHARGES_SQL, (json.dumps(settles),))),
        ("insert events", (observer.INSERT_EVENTS_SQL, (json.dumps(events),))),
        ("advance cursor", (observer.ADVANCE_CURSOR_SQL, {
            "cursor": "0000004294967298000-0000000000", "ledger": 1000000, "latest": 1000000, "events": n,
            "old": "0000004294967296000-0000000000"})),
        ("unexplained", (observer.UNEXPLAINED_SQL, (999999,))),
    ]


def operations(conn: psycopg.Connection) -> dict[str, list[tuple[str, tuple[str, Any]]]]:
    claim = {"lapsed_only": False, "grace": 180, "draining": False, "lease": 30, "owner": "bench"}
    return {
        "settlement claim": [
            ("has work", (charges.HAS_WORK_SQL, {})),
            # One statement: candidates under SKIP LOCKED, lane, lineage, rows marked, batch opened.
            ("claim", (settlement.claim_sql(48), {
                "lanes": LANES, "owner": "bench", "token": "00000000-0000-0000-0000-000000000001",
                "lease": 30, "entitlement": "bench"})),
        ],
        "funding claim": [("claim", (deposits.CLAIM_SQL, {**claim, "batch": 16}))],
        "observer page (48 settles)": observer_page(conn),
        "subscriptions claim": [("due", (subscriptions.CLAIM_DUE_SQL, ([0],)))],
        "relay claim": [("claim", (relays.CLAIM_SQL, {**claim, "batch": 16}))],
        "relay_drainer claim": [("claim", (bot_jobs.CLAIM_SQL, {**claim, "batch": 25}))],
        "webhooks claim": [
            ("take over", (webhooks.TAKE_OVER_SQL, {"grace": 60, "batch": 32, "max_attempts": 8, "by": "bench"})),
            ("claim", (webhooks.CLAIM_SQL, {"batch": 32, "lease": 60, "instance": "bench"}))],
        "open charge batches": [("claim", (charges.CLAIM_OPEN_BATCHES_SQL, {**claim, "limit": 4}))],
        "recovery stuck scan": [("stuck", (recovery.STUCK_SQL, {"age": 3600, "limit": 100}))],
        "state metrics (queue depths)": [(name, (sql, {})) for name, sql in QUEUE_SQL.items()],
        # Retention's own batch (5000 rows of each table with no backlog ahead of it; every history row
        # is 40 days old, so both sizes move full batches and charge_batches / lineages are deferred, as
        # the worker defers them while charges have a backlog). Not a hot path: a batch costs what it moves.
        "retention batch (5000 each)": [
            (table.name, (retention.move_statement(conn, table).as_string(conn), {"window": 30 * 86400, "batch": 5000}))
            for table in retention.TABLES if not table.after and table.name != "worker_runs"],
    }


def _buffers(plan: dict[str, Any]) -> int:
    top = plan["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))


def measure_once(conn: psycopg.Connection, steps: list[tuple[str, tuple[str, Any]]]) -> tuple[list[int], list[float]]:
    buffers, times = [], []
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL jit = off")
        conn.execute(retention.ARCHIVING_SQL)  # lets the retention step delete terminal lineages
        for _, (sql, params) in steps:
            explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql
            plan = conn.execute(explain, params).fetchone()[0][0]
            buffers.append(_buffers(plan))
            times.append(float(plan["Execution Time"]))
    return buffers, times


def measure(conn: psycopg.Connection, runs: int) -> dict[str, dict[str, Any]]:
    figures = {}
    for name, steps in operations(conn).items():
        measure_once(conn, steps)  # warm the cache once
        samples = [measure_once(conn, steps) for _ in range(runs)]
        figures[name] = {
            "buffers": [statistics.median(s[0][i] for s in samples) for i in range(len(steps))],
            "ms": [statistics.median(s[1][i] for s in samples) for i in range(len(steps))],
        }
    return figures


def plans(conn: psycopg.Connection, steps: list[tuple[str, tuple[str, Any]]]) -> list[tuple[str, Any]]:
    """Each step's plan, executed in order (a step may read what the one before it wrote), rolled back."""
    out = []
    with conn.transaction(force_rollback=True):
        conn.execute(retention.ARCHIVING_SQL)
        for label, (sql, params) in steps:
            plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()[0][0]
            out.append((label, plan))
    return out


def walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from walk(child)


def indexes_and_seq_scans(plan: dict[str, Any]) -> tuple[set[str], set[str]]:
    indexes, seq = set(), set()
    for node in walk(plan["Plan"]):
        if "Index Name" in node:
            indexes.add(node["Index Name"])
        if node["Node Type"] == "Seq Scan" and node.get("Relation Name") in BIG_TABLES:
            seq.add(node["Relation Name"])
    return indexes, seq


def text_plans(conn: psycopg.Connection, steps: list[tuple[str, tuple[str, Any]]]) -> list[tuple[str, str]]:
    out = []
    with conn.transaction(force_rollback=True):
        conn.execute(retention.ARCHIVING_SQL)
        for label, (sql, params) in steps:
            rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
            out.append((label, "\n".join(r[0] for r in rows)))
    return out


def grow(conn: psycopg.Connection, first: int, last: int) -> float:
    started = time.perf_counter()
    step = 1_000_000  # one transaction per million rows: bounded WAL and memory per statement
    for lo in range(first, last + 1, step):
        hi = min(last, lo + step - 1)
        with conn.transaction():
            for sql in HISTORY_SQL:
                conn.execute(sql, {"first": lo, "last": hi, "lanes": LANES})
    conn.execute("VACUUM (ANALYZE)")
    return time.perf_counter() - started


def table_rows(conn: psycopg.Connection) -> dict[str, int]:
    return {t: int(conn.execute(f"SELECT reltuples::bigint FROM pg_class WHERE oid = 'paygate.{t}'::regclass")
                   .fetchone()[0]) for t in BIG_TABLES}


INDEX_SIZES_SQL = """
SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
WHERE s.nspname = 'paygate' AND c.relkind = 'i'
"""


def index_sizes(conn: psycopg.Connection) -> dict[str, int]:
    return {name: int(size) for name, size in conn.execute(INDEX_SIZES_SQL)}


@contextmanager
def database() -> Iterator[str]:
    dsn = os.environ.get("PAYGATE_BENCH_DSN")
    if dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP SCHEMA IF EXISTS paygate CASCADE")
            conn.execute("DROP SCHEMA IF EXISTS paygate_archive CASCADE")
        yield dsn
        return
    tmp = Path(tempfile.mkdtemp(prefix="pgg-", dir="/tmp"))
    tmp.chmod(0o755)
    cluster = Cluster.at(tmp / "d")
    cluster.init(fast=True)
    cluster.start()
    try:
        yield cluster.dsn()
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000, help="terminal history rows at the large size")
    parser.add_argument("--base", type=int, default=10_000, help="terminal history rows at the small size")
    parser.add_argument("--runs", type=int, default=15, help="repetitions per operation (median)")
    args = parser.parse_args()
    with database() as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        conn.execute("SET statement_timeout = 0")
        for sql in LIVE_SQL:
            conn.execute(sql, {"lanes": LANES})
        built_small = grow(conn, 1, args.base)
        small_rows = table_rows(conn)
        small = measure(conn, args.runs)
        small_plans = {name: plans(conn, steps) for name, steps in operations(conn).items()}
        used = {i for ps in small_plans.values() for _, p in ps for i in indexes_and_seq_scans(p)[0]}
        small_sizes = index_sizes(conn)
        built_large = grow(conn, args.base + 1, args.rows)
        large_rows = table_rows(conn)
        large = measure(conn, args.runs)
        large_plans = {name: plans(conn, steps) for name, steps in operations(conn).items()}
        used |= {i for ps in large_plans.values() for _, p in ps for i in indexes_and_seq_scans(p)[0]}
        large_sizes = index_sizes(conn)

        print(f"history build: {args.base:,} rows in {built_small:.1f} s, then to {args.rows:,} rows in "
              f"{built_large:.1f} s (wall, under load)")
        print("rows per table (10 k -> large):", {t: (small_rows[t], large_rows[t]) for t in BIG_TABLES})
        print()
        print(f"{'operation':32} {'buffers small':>13} {'large':>8} {'ratio':>6}   {'ms small':>9} {'large':>8} "
              f"{'ratio':>6}  (ms: wall, under load)")
        missed = []
        for name in small:
            b_small, b_large = sum(small[name]["buffers"]), sum(large[name]["buffers"])
            t_small, t_large = sum(small[name]["ms"]), sum(large[name]["ms"])
            b_ratio, t_ratio = b_large / max(b_small, 1), t_large / max(t_small, 1e-6)
            flag = "" if b_ratio <= 1.2 else "  <-- buffers ratio > 1.2"
            print(f"{name:32} {b_small:13.0f} {b_large:8.0f} {b_ratio:6.2f}   {t_small:9.3f} {t_large:8.3f} "
                  f"{t_ratio:6.2f}{flag}")
            if b_ratio > 1.2:
                missed.append(name)
        print()
        print("per statement (buffers small -> large):")
        ops = operations(conn)
        for name, steps in ops.items():
            parts = ", ".join(f"{label} {small[name]['buffers'][i]:.0f}->{large[name]['buffers'][i]:.0f}"
                              for i, (label, _) in enumerate(steps))
            print(f"  {name}: {parts}")
        print()
        seq = {f"{name}/{label}": sorted(indexes_and_seq_scans(p)[1])
               for name, ps in large_plans.items() for label, p in ps if indexes_and_seq_scans(p)[1]}
        print("sequential scans of a big table at the large size:", seq or "none")
        print("indexes the plans use, size in kB (10 k -> large):")
        for index in sorted(used):
            grew = large_sizes[index] / max(small_sizes[index], 8192)
            print(f"  {index:40} {small_sizes[index] // 1024:8} -> {large_sizes[index] // 1024:8}"
                  f"{'   (grows with history)' if grew > 1.5 else ''}")
        for name in missed:
            print(f"\n== {name}: ratio > 1.2; plans at the large size ==")
            for label, text in text_plans(conn, ops[name]):
                print(f"-- {label}\n{text}")


if __name__ == "__main__":
    main()
