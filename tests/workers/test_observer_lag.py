"""a getEvents reader behind the observer's cursor is lagging, not proof of lost
events. The observer tries the next read endpoint, or waits (cursor unmoved, said in the tick's
details and log) — never exit 3. Only a reader whose oldest ledger is past the cursor proves a gap."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from paygate_cli.chain.charges import cursor_ledger
from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.cli import Result
from tests.support.devnet_support import DevnetHandle, start_devnet


def cursor_at(db: psycopg.Connection) -> int | None:
    row = db.execute("SELECT cursor FROM paygate.observer_cursor").fetchone()
    return cursor_ledger(row[0]) if row else None


def details(result: Result) -> dict:
    return json.loads(result.out)["run_tick"]["last_details"]


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=1)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    environ = chain_environ(devnet, dsn, tmp_path / "keys")
    environ["PAYGATE_OBSERVER_START_LEDGER"] = "1"
    return ChainEnv(devnet, dsn, environ)


def test_a_reader_behind_the_cursor_means_wait_not_lost_events(chain: ChainEnv, db: psycopg.Connection) -> None:
    chain.devnet.close_ledger(n=3)
    assert chain.tick("observer").code == 0
    at = cursor_at(db)
    assert at == chain.devnet.latest_ledger()
    chain.devnet.close_ledger(n=2)
    chain.devnet.set_fault("node_lag", ledgers=4)  # the node now says its latest is 2 ledgers before the cursor
    for _ in range(2):
        result = chain.tick("observer")
        assert result.code == 0, result.err  # not 3: nothing was lost
        assert "behind the observer's position" in details(result)["waiting"]
        assert "observer.readers_behind" in result.err or "observer waiting" in result.err
        assert cursor_at(db) == at
    chain.devnet.clear_faults()
    result = chain.tick("observer")
    assert result.code == 0 and "waiting" not in details(result)
    assert cursor_at(db) == chain.devnet.latest_ledger() == at + 2


# -- real devnets: one seed, separate nodes on separate hosts, ledgers closed in step -------------

@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[DevnetHandle]]:
    handles: list[DevnetHandle] = []
    try:
        handles.append(start_devnet(tmp_path / "a", seed="lag", lanes=2, users=1, host="127.0.0.1"))
        handles.append(start_devnet(tmp_path / "b", seed="lag", lanes=2, users=1, host="127.0.0.2"))
        handles.append(start_devnet(tmp_path / "c", seed="lag", lanes=2, users=1, host="127.0.0.3", retention=8))
        yield handles
    finally:
        for handle in handles:
            handle.stop()


def test_the_observer_reads_from_a_node_that_caught_up_and_only_a_retention_gap_is_exit_3(
        nodes: list[DevnetHandle], dsn: str, db: psycopg.Connection, tmp_path: Path) -> None:
    a, b, c = nodes
    environ = chain_environ(a, dsn, tmp_path / "keys")
    environ.update(PAYGATE_OBSERVER_START_LEDGER="1", PAYGATE_RPC_READ_URLS=f"{a.url},{b.url}")
    chain = ChainEnv(a, dsn, environ)

    def close(n: int) -> None:
        for node in nodes:
            node.close_ledger(n=n)

    close(2)
    assert chain.tick("observer").code == 0
    assert cursor_at(db) == 3
    close(3)
    a.set_fault("node_lag", ledgers=5)  # node a (first listed) is behind the cursor; node b is not
    result = chain.tick("observer")
    assert result.code == 0 and "waiting" not in details(result), result.err
    assert cursor_at(db) == b.latest_ledger() == 6  # read from node b

    close(1)
    b.set_fault("node_lag", ledgers=3)  # now both are behind: wait, say so, keep the cursor
    result = chain.tick("observer")
    assert result.code == 0, result.err
    assert "127.0.0.1" in details(result)["waiting"] and "127.0.0.2" in details(result)["waiting"]
    assert cursor_at(db) == 6

    close(20)  # node c keeps 8 ledgers: the cursor's ledger is gone there — a real gap
    a.set_fault("node_lag", ledgers=25)  # and node a is still behind the cursor (ledger 2)
    result = chain.tick("observer", PAYGATE_RPC_READ_URLS=f"{a.url},{c.url}")
    assert result.code == 3, result.err
    assert "events may have been lost" in result.err and cursor_at(db) == 6
