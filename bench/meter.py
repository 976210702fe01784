"""Shared by the benchmarks: wall time spent inside wrapped callables (RPC calls, SQL round trips),
a short cProfile summary of paygate's own code, and the private Postgres + devnet a chain benchmark
runs against."""

from __future__ import annotations

import cProfile
import io
import math
import os
import pstats
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Meter:
    """Wraps `owner.name` (a class method or function attribute) and, while `enabled`, adds up the
    calls and the seconds spent inside them. Calls nested inside another wrapped call of the same
    meter (ChainClient.account_sequence -> ledger_entries) count once: the outermost one."""

    def __init__(self, enabled: bool = False) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.enabled = enabled
        self._depth = 0

    def wrap(self, owner: Any, name: str) -> None:
        original: Callable[..., Any] = getattr(owner, name)
        meter = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not meter.enabled or meter._depth:
                return original(*args, **kwargs)
            started = time.perf_counter()
            meter._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                meter._depth -= 1
                meter.seconds += time.perf_counter() - started
                meter.calls += 1

        setattr(owner, name, timed)


def sql_meters() -> tuple[Meter, Meter]:
    """(statements: Connection.execute, transaction control: the BEGIN/SAVEPOINT and COMMIT/RELEASE
    round trips of `with conn.transaction()`, timed too: a synchronous COMMIT's WAL flush is there)."""
    import psycopg

    statements, control = Meter(enabled=True), Meter(enabled=True)
    statements.wrap(psycopg.Connection, "execute")
    control.wrap(psycopg.Transaction, "__enter__")
    control.wrap(psycopg.Transaction, "__exit__")
    return statements, control


class Profile:
    """cProfile around the measured ticks; `summary()` lists the top entries by cumulative time,
    limited to paygate's own code (plus the SDK's XDR/signing entry points it calls)."""

    def __init__(self) -> None:
        self.profiler = cProfile.Profile()

    @contextmanager
    def running(self) -> Iterator[None]:
        self.profiler.enable()
        try:
            yield
        finally:
            self.profiler.disable()

    def summary(self, units: int, top: int = 14, own: tuple[str, ...] = ("paygate_cli",)) -> str:
        stream = io.StringIO()
        stats = pstats.Stats(self.profiler, stream=stream)
        rows = []
        for (filename, line, name), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
            if not any(part in filename for part in own):
                continue
            where = filename.split("paygate_cli/")[-1] if "paygate_cli/" in filename else Path(filename).name
            rows.append((cumtime, tottime, calls, f"{where}:{line}({name})"))
        rows.sort(reverse=True)
        lines = [f"    {'cum ms/unit':>11} {'own ms/unit':>11} {'calls/unit':>10}  function"]
        for cumtime, tottime, calls, label in rows[:top]:
            per = (cumtime * 1000 / units, tottime * 1000 / units, calls / units)
            lines.append(f"    {per[0]:11.2f} {per[1]:11.2f} {per[2]:10.2f}  {label}")
        return "\n".join(lines)

    def hottest(self, units: int, top: int = 8) -> str:
        """Top entries by own (tottime) time, any module: where the CPU actually goes."""
        stats = pstats.Stats(self.profiler)
        rows = []
        for (filename, line, name), (_cc, calls, tottime, _cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
            rows.append((tottime, calls, f"{'/'.join(Path(filename).parts[-2:])}:{line}({name})"))
        rows.sort(reverse=True)
        return "\n".join(f"    {t * 1000 / units:11.2f} {c / units:10.2f}  {label}" for t, c, label in rows[:top])


def baseline_lanes(genesis: dict[str, Any], lanes: int) -> list[dict[str, str]]:
    """The lanes of chain_world's devnet that paygate is not given: the baseline loop's own."""
    return genesis["lanes"][lanes:2 * lanes]


@contextmanager
def chain_world(prefix: str, lanes: int, users: int = 8) -> Iterator[tuple[Any, Any]]:
    """A private Postgres (migrated) and a devnet in manual mode: yields (devnet, (ChainEnv, autocommit
    connection)), and removes both afterwards. The devnet has twice `lanes` lanes: paygate is given
    the first half, a bare baseline loop takes the second (`baseline_lanes`). A baseline sharing
    paygate's lanes would use their sequences outside the journal, and paygate rightly fences such
    a lane (chain ahead of the journal) instead of building on it."""
    import psycopg

    from paygate_cli.db.migrate import migrate
    from paygate_cli.sandbox.pg_cluster import Cluster
    from tests.support.chain_env import ChainEnv, chain_environ
    from tests.support.devnet_support import start_devnet

    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    tmp.chmod(0o755)
    cluster = Cluster.at(tmp / "pg")
    cluster.init(fast=True)
    cluster.start()
    devnet = start_devnet(tmp / "devnet", lanes=2 * lanes, users=users)
    try:
        dsn = cluster.dsn()
        with psycopg.connect(dsn, autocommit=True) as db:
            migrate(db)
            yield devnet, (ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp / "keys", lanes=lanes)), db)
    finally:
        devnet.stop()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int, *, with_reaped_children: bool = False) -> float:
    """CPU seconds (user + sys) of a process from /proc; with its reaped children's when asked (a
    postmaster: the backends that exited, e.g. the observer's own connection). NaN once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if with_reaped_children else 0)
    return ticks / _TICKS


def postgres_cpu(postmaster: int) -> float:
    """Every Postgres process of the private cluster: the postmaster with its reaped backends, and
    the live children (checkpointer, WAL writer, backends)."""
    total = process_cpu(postmaster, with_reaped_children=True)
    for child in Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split():
        cpu = process_cpu(int(child))
        if not math.isnan(cpu):  # NaN: exited in between, so reaped and counted in the postmaster's
            total += cpu
    return total


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, every core (/proc/stat): the
    share of the machine in use between two readings, whoever used it."""
    # user nice system idle iowait irq softirq steal (guest time is inside user already)
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = values[3] + values[4]  # idle + iowait; steal counts as busy: the core was not ours
    return (sum(values) - idle) / _TICKS, sum(values) / _TICKS
