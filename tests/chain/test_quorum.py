"""The read quorum: read endpoints are normalised and counted
once per distinct host; the money movers refuse to start on fewer than three distinct hosts unless
the development override is set; and with three real devnets on three hosts, a minority of nodes
can never declare a lineage dead while a majority can."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from paygate_cli.errors import ConfigError, ExitCode
from paygate_cli.settings import MONEY_MOVERS, check_read_quorum, distinct_read_urls, load_settings, normalise_rpc_url
from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.cli import base_environ, run_cli
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.funding import admit, lineages_of, row_of

SECRET_IN_URL = "k3y-in-the-query"


def test_endpoints_are_normalised_and_counted_once_per_host() -> None:
    assert normalise_rpc_url("HTTP://RPC.Example.COM:80/soroban/") == "http://rpc.example.com/soroban"
    assert normalise_rpc_url("https://rpc.example.com:443") == "https://rpc.example.com"
    assert normalise_rpc_url("https://rpc.example.com:8443/") == "https://rpc.example.com:8443"
    urls = distinct_read_urls(["http://a.example:8000", "http://A.example:8000/", "http://a.example:9000/x",
                               "https://b.example/", "http://[::1]:8000/", "http://[::1]:8001"], None)
    assert urls == ["http://a.example:8000", "https://b.example", "http://[::1]:8000"]
    assert distinct_read_urls([], "http://W.example/") == ["http://w.example"]


@pytest.mark.parametrize("bad", ["rpc.example.com", "ftp://rpc.example.com", "http://", f"http://h:99999/?{SECRET_IN_URL}"])
def test_a_malformed_endpoint_is_a_config_error_that_never_echoes_it(bad: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"PAYGATE_RPC_READ_URLS": f"http://ok.example,{bad}"})
    assert "PAYGATE_RPC_READ_URLS" in str(caught.value) and SECRET_IN_URL not in str(caught.value)


def _settings(**env: str) -> object:
    return load_settings({"PAYGATE_RPC_URL": "http://w.example", **env})


@pytest.mark.parametrize("worker", sorted(MONEY_MOVERS))
def test_money_movers_need_three_distinct_hosts(worker: str) -> None:
    # `url` and `url/` (and the host in capitals) are one host: two votes of one node are one vote.
    one_node = "http://r1.example:8000,http://r1.example:8000/,HTTP://R1.EXAMPLE:8000"
    for reads in ("", one_node, "http://r1.example,http://r2.example,http://r2.example:81/"):
        with pytest.raises(ConfigError) as caught:
            check_read_quorum(_settings(PAYGATE_RPC_READ_URLS=reads), worker)  # type: ignore[arg-type]
        assert "PAYGATE_RPC_READ_URLS" in str(caught.value) and "PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT" in str(caught.value)
    check_read_quorum(_settings(PAYGATE_RPC_READ_URLS="http://r1.example,http://r2.example,http://r3.example"),  # type: ignore[arg-type]
                      worker)
    check_read_quorum(_settings(PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT="1"), worker)  # type: ignore[arg-type]


def test_readers_that_move_no_money_may_run_on_one_endpoint() -> None:
    for worker in ("observer", "subscriptions", "webhooks", "reconciler", "gas"):
        check_read_quorum(_settings(), worker)  # type: ignore[arg-type]


def test_funding_refuses_to_start_on_one_host_with_78_and_one_line(dsn: str, tmp_path: Path) -> None:
    # Everything else a money mover needs is configured: the one-host "quorum" is the only problem.
    for name in ("lanes", "fee", "journal-keys"):
        (tmp_path / name).write_text("unused: the run must stop before reading it\n")
        (tmp_path / name).chmod(0o600)
    environ = base_environ(dsn, PAYGATE_RPC_URL="http://127.0.0.1:9",
                           PAYGATE_RPC_READ_URLS="http://127.0.0.1:9,http://127.0.0.1:9/",
                           PAYGATE_BILLING_CONTRACT="C" + "A" * 55, PAYGATE_USDC_CONTRACT="C" + "B" * 55,
                           PAYGATE_LANE_SECRETS_FILE=str(tmp_path / "lanes"),
                           PAYGATE_FEE_SECRET_FILE=str(tmp_path / "fee"),
                           PAYGATE_JOURNAL_KEYS_FILE=str(tmp_path / "journal-keys"),
                           PAYGATE_JOURNAL_ACTIVE_KEY_ID="k1")
    result = run_cli("run-tick", "funding", "--once", environ=environ)
    assert result.code == ExitCode.CONFIG, result.err
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "PAYGATE_RPC_READ_URLS" in lines[0] and "3 distinct hosts" in lines[0], result.err
    # No tick ran: the one heartbeat row says why the worker cannot start (slot -1: it holds none).
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT slot, outcome, error LIKE 'cannot start: %%' FROM paygate.worker_runs"
                            " WHERE worker = 'funding'").fetchall() == [(-1, "error", True)]
    shown = run_cli("config", "show", "--json", environ={**environ, "PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT": "1"})
    assert shown.code == 0 and "rpc_allow_single_endpoint" in shown.out


# -- three real devnets: one chain seed, three nodes on three hosts ---------------------------------

HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
VALIDITY = 60  # PAYGATE_TX_VALIDITY: maxTime = latest close time + this


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[DevnetHandle]]:
    """Three devnets from one seed (same keys, contracts, lanes): separate nodes whose answers really
    differ. The first is the write endpoint; only it ever receives our transactions."""
    handles: list[DevnetHandle] = []
    try:
        for i, host in enumerate(HOSTS):
            handles.append(start_devnet(tmp_path / f"node{i}", seed="quorum", lanes=2, users=2, host=host))
        yield handles
    finally:
        for handle in handles:
            handle.stop()


@pytest.fixture
def three(nodes: list[DevnetHandle], dsn: str, tmp_path: Path) -> ChainEnv:
    environ = chain_environ(nodes[0], dsn, tmp_path / "keys")
    del environ["PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT"]  # three hosts: the production rule holds
    environ.update(PAYGATE_RPC_READ_URLS=",".join(n.url for n in nodes), PAYGATE_TX_VALIDITY=f"{VALIDITY}s")
    return ChainEnv(nodes[0], dsn, environ)


def _held_deposit(three: ChainEnv, db: psycopg.Connection, nodes: list[DevnetHandle]) -> int:
    """A deposit whose transaction the write node accepted but holds in its queue (not landed)."""
    nodes[0].set_fault("hold_next", ledgers=1000)
    pending_id = admit(three, db)
    result = three.tick("funding", "--once")
    assert result.code == 0, result.err
    [lineage] = lineages_of(db)
    assert lineage["state"] == "sent", lineage
    return pending_id


def _assert_alive(db: psycopg.Connection, pending_id: int) -> None:
    [lineage] = lineages_of(db)  # no second lineage: nothing re-prepared, nothing paid twice
    assert lineage["state"] in ("signed", "sent"), lineage
    assert row_of(db, pending_id)["status"] == "pending"


def test_one_node_past_max_time_is_a_minority_even_named_twice(three: ChainEnv, db: psycopg.Connection,
                                                               nodes: list[DevnetHandle]) -> None:
    """Node 2 never saw the transaction and its clock is past maxTime: by itself it says 'expired'.
    Listed twice (`url`, `url/`), the old rule counted that as 2 of 3 and declared the lineage dead
    while the write node still held it: it must stay one vote."""
    pending_id = _held_deposit(three, db, nodes)
    nodes[1].close_ledger(advance_seconds=VALIDITY + 100)
    reads = f"{nodes[1].url},{nodes[1].url}/,{nodes[0].url}"
    for _ in range(2):
        result = three.tick("funding", "--once", PAYGATE_RPC_READ_URLS=reads, PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT="1")
        assert result.code in (0, 1), result.err
        _assert_alive(db, pending_id)


def test_a_minority_never_declares_a_lineage_dead_and_a_majority_does(three: ChainEnv, db: psycopg.Connection,
                                                                      nodes: list[DevnetHandle]) -> None:
    """Write node 0 holds the deposit (accepted, not landed). Node 1 sees the lane's sequence consumed
    and its clock past maxTime (it alone would say dead); node 2 lags by design (`node_lag`). One vote
    for dead of three is no decision: the lineage stays live through several ticks. When node 0 too
    is past maxTime without the transaction, two of three say dead and the lineage is expired."""
    for node in nodes:
        node.close_ledger(n=5)
    pending_id = _held_deposit(three, db, nodes)
    [lineage] = lineages_of(db)
    nodes[1].rpc("devnet_consumeSequence", {"account": lineage["lane"]})
    nodes[1].close_ledger()
    nodes[2].close_ledger(n=3)
    nodes[2].set_fault("node_lag", ledgers=4)
    for advance in (None, VALIDITY + 100):
        if advance:
            nodes[1].close_ledger(advance_seconds=advance)
        result = three.tick("funding", "--once")
        assert result.code in (0, 1), result.err
        _assert_alive(db, pending_id)
    nodes[0].close_ledger(advance_seconds=VALIDITY + 100)  # node 0 past maxTime; the held tx cannot land
    result = three.tick("funding", "--once")
    assert result.code in (0, 1), result.err
    first = lineages_of(db)[0]
    assert first["id"] == lineage["id"] and first["state"] == "expired", first
