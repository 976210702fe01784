"""Cold operator commands (a benchmark, not a test: it prints figures and asserts nothing).

Each command is started as a fresh process, the way an on-call engineer or a runbook script starts
it, against the floor measured in the same run: `python -c "import psycopg; psycopg.connect(DSN).close()"`
(the floor bench/idle_tick.py uses for `run-tick`). target: <= 1.5x the floor.

Chain-free path (no PAYGATE_RPC_URL; the target applies here):
  status, status --json, workers, workers --json, nonce-inspect --json (no lanes: nothing to ask the chain).
With the chain (a devnet on loopback, every setting a worker needs):
  status --json (getHealth of each endpoint), nonce-inspect --json (one lane: its sequence on chain).

Human output goes to a pipe here (as in `paygate status | grep`, cron mail, runbook scripts): off a
terminal. Reported per command: median wall time (under whatever load the machine has) and median
CPU time of the process (user + sys, robust to load), each with its ratio to the floor's.

The package's bytecode is compiled first (`compileall`), as a wheel install does: with
PYTHONDONTWRITEBYTECODE set (CI, some containers) every start would otherwise recompile paygate's own
modules from source, ~45 ms the installed tool never pays.

    .venv/bin/python bench/cold_commands.py          (BENCH_RUNS=15 repetitions by default)
"""

from __future__ import annotations

import compileall
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

import paygate_cli
from paygate_cli.db.migrate import migrate
from paygate_cli.sandbox.pg_cluster import Cluster

RUNS = int(os.environ.get("BENCH_RUNS", "15"))
PAYGATE = str(Path(sys.executable).with_name("paygate"))


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of the child, its exit code)."""
    import time

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # status exits 1 when not ready: an answer, not a failure; the table shows every exit code
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.returncode


def main() -> None:
    compileall.compile_dir(str(Path(paygate_cli.__file__).parent), quiet=1)
    tmp = Path(tempfile.mkdtemp(prefix="pgc-", dir="/tmp"))
    tmp.chmod(0o755)
    cluster = Cluster.at(tmp / "pg")
    cluster.init(fast=True)
    cluster.start()
    devnet = None
    try:
        dsn = cluster.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
            conn.execute("CREATE DATABASE chain")
        with psycopg.connect(cluster.dsn("chain"), autocommit=True) as conn:
            migrate(conn)
        from paygate_cli.journal import lineage as lineages
        from tests.support.chain_env import chain_environ
        from tests.support.devnet_support import start_devnet

        devnet = start_devnet(tmp / "devnet", lanes=2, users=1)
        lane = devnet.genesis["lanes"][0]["public"]
        with psycopg.connect(cluster.dsn("chain"), autocommit=True) as conn:
            lineages.sync_lanes(conn, [lane])

        base = {k: v for k, v in os.environ.items() if not k.startswith("PAYGATE_")}
        plain = {**base, "PAYGATE_DATABASE_URL": dsn, "PAYGATE_LOG_LEVEL": "warning"}
        chained = {**chain_environ(devnet, cluster.dsn("chain"), tmp / "keys"), "PAYGATE_LOG_LEVEL": "warning"}
        floor_cmd = [sys.executable, "-c", f"import psycopg; psycopg.connect({dsn!r}).close()"]
        cases: list[tuple[str, list[str], dict[str, str]]] = [
            ("floor: python -c 'import psycopg; connect().close()'", floor_cmd, plain),
            ("status", [PAYGATE, "status"], plain),
            ("status --json", [PAYGATE, "status", "--json"], plain),
            ("workers", [PAYGATE, "workers"], plain),
            ("workers --json", [PAYGATE, "workers", "--json"], plain),
            ("nonce-inspect --json (no lanes)", [PAYGATE, "nonce-inspect", "--json"], plain),
            ("status --json, RPC configured", [PAYGATE, "status", "--json"], chained),
            ("nonce-inspect --json --lane L (chain)", [PAYGATE, "nonce-inspect", "--json", "--lane", lane], chained),
        ]
        for _, cmd, env in cases:  # warm the page cache once
            timed(cmd, env)
        walls: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        cpus: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        codes: dict[str, int] = {}
        for _ in range(RUNS):  # interleaved, so drift on the machine hits every command alike
            for name, cmd, env in cases:
                wall, cpu, codes[name] = timed(cmd, env)
                walls[name].append(wall)
                cpus[name].append(cpu)
    finally:
        if devnet is not None:
            devnet.stop()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    floor_name = cases[0][0]
    floor_wall, floor_cpu = statistics.median(walls[floor_name]), statistics.median(cpus[floor_name])
    print(f"cold operator commands, median of {RUNS} interleaved runs (wall under load; CPU = the process's "
          "user+sys); target <= 1.5x the floor on the chain-free path")
    print(f"  {'command':42s} {'wall ms':>8s} {'ratio':>6s} {'CPU ms':>8s} {'ratio':>6s}  exit")
    for n, (name, _, _) in enumerate(cases):
        if n == 6:
            print("  with the chain (devnet on loopback):")
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        code = codes[name]
        print(f"  {name[:42]:42s} {wall * 1000:8.1f} {wall / floor_wall:6.2f} {cpu * 1000:8.1f} "
              f"{cpu / floor_cpu:6.2f}  {code}")


if __name__ == "__main__":
    main()
