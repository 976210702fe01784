"""Idle tick cost (a benchmark, not a test: it prints figures and asserts nothing).

1. Cold process: `paygate run-tick webhooks --once` against an empty queue, versus the floor
   `python -c "import psycopg; psycopg.connect(DSN).close()"`, both measured here, in this run.
   Target: ratio <= 1.5.
2. Loop mode: the per-tick cost of an idle tick inside `--every` (target <= 5 ms).

Uses PAYGATE_BENCH_DSN if set, else a private cluster from the system binaries. The package's
bytecode is compiled first, as a wheel install does (with PYTHONDONTWRITEBYTECODE set every start
would recompile paygate's own modules from source, which the installed tool never does)."""

from __future__ import annotations

import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

import paygate_cli
from paygate_cli.db.migrate import migrate
from paygate_cli.sandbox.pg_cluster import Cluster

RUNS = int(os.environ.get("BENCH_RUNS", "15"))
PAYGATE = str(Path(sys.executable).with_name("paygate"))


def timed(cmd: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    compileall.compile_dir(str(Path(paygate_cli.__file__).parent), quiet=1)
    tmp = None
    dsn = os.environ.get("PAYGATE_BENCH_DSN")
    cluster = None
    if not dsn:
        tmp = tempfile.mkdtemp(prefix="pgb-", dir="/tmp")
        os.chmod(tmp, 0o755)
        cluster = Cluster.at(Path(tmp) / "d")
        cluster.init(fast=True)
        cluster.start()
        dsn = cluster.dsn()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
        env = {**os.environ, "PAYGATE_DATABASE_URL": dsn, "PAYGATE_LOG_LEVEL": "warning"}
        floor_cmd = [sys.executable, "-c", f"import psycopg; psycopg.connect({dsn!r}).close()"]
        tick_cmd = [PAYGATE, "run-tick", "webhooks", "--once"]
        timed(floor_cmd, env), timed(tick_cmd, env)  # warm the page cache once
        floor, tick = [], []
        for _ in range(RUNS):  # interleaved, so drift on the machine hits both alike
            floor.append(timed(floor_cmd, env))
            tick.append(timed(tick_cmd, env))
        floor_median, tick_median = statistics.median(floor), statistics.median(tick)

        seconds = 5.0
        out = subprocess.run([PAYGATE, "run-tick", "webhooks", "--every", "1ms", "--for", f"{seconds}s", "--json"],
                             env=env, check=True, capture_output=True, text=True).stdout
        ticks = json.loads(out)["run_tick"]["ticks"]
        with psycopg.connect(dsn) as conn:
            db_ms = conn.execute("SELECT avg(extract(epoch FROM finished_at - started_at)) * 1000"
                                 " FROM paygate.worker_runs WHERE worker = 'webhooks'").fetchone()[0]

        print(f"idle tick, cold process (median of {RUNS}):")
        print(f"  floor  python -c 'import psycopg; connect().close()' : {floor_median * 1000:7.1f} ms")
        print(f"  paygate run-tick webhooks --once                     : {tick_median * 1000:7.1f} ms")
        print(f"  ratio                                                : {tick_median / floor_median:7.2f}  "
              "(target <= 1.5)")
        print("idle tick, loop mode (--every 1ms for 5s):")
        print(f"  ticks                                                : {ticks}")
        print(f"  wall time per tick                                   : {seconds * 1000 / ticks:7.2f} ms  "
              "(target <= 5)")
        print(f"  heartbeat-to-heartbeat time in Postgres              : {float(db_ms):7.2f} ms")
    finally:
        if cluster:
            cluster.stop()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
