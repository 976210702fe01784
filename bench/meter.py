"""Shared by the benchmarks: wall time spent inside wrapped callables (RPC calls, SQL round trips),
and the private Postgres + devnet a chain benchmark runs against."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Meter:
    """Wraps `owner.name` (a class method or function attribute) and, while `enabled`, adds up the
    calls and the seconds spent inside them."""

    def __init__(self, enabled: bool = False) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.enabled = enabled

    def wrap(self, owner: Any, name: str) -> None:
        original: Callable[..., Any] = getattr(owner, name)
        meter = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not meter.enabled:
                return original(*args, **kwargs)
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                meter.seconds += time.perf_counter() - started
                meter.calls += 1

        setattr(owner, name, timed)


@contextmanager
def chain_world(prefix: str, lanes: int) -> Iterator[tuple[Any, Any]]:
    """A private Postgres (migrated) and a devnet in manual mode: yields (devnet, (ChainEnv, autocommit
    connection)), and removes both afterwards."""
    import psycopg

    from paygate_cli.db.cluster import Cluster
    from paygate_cli.db.migrate import migrate
    from tests.chain_env import ChainEnv, chain_environ
    from tests.devnet_support import start_devnet

    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    tmp.chmod(0o755)
    cluster = Cluster.at(tmp / "pg")
    cluster.init(fast=True)
    cluster.start()
    devnet = start_devnet(tmp / "devnet", lanes=lanes, users=8)
    try:
        dsn = cluster.dsn()
        with psycopg.connect(dsn, autocommit=True) as db:
            migrate(db)
            yield devnet, (ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp / "keys")), db)
    finally:
        devnet.stop()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
