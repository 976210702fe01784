"""A read node that lags is "wait", never a failure, in every worker that reads events, balances or
the latest ledger: the devnet's `node_lag` fault (the whole node answers as of an older ledger)
against each such worker, with a caught-up state behind it. Exit 0 and a warning; never exit 1 (or
3) for the lag alone, and nothing decided from the older answer. (The observer's wait
is tests/workers/test_observer_lag.py's; funding's reads wait in resolve and the lane read:
tests/chain/test_node_lag.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.chain_env import ChainEnv
from tests.support.charges_support import charge_chain, fund
from tests.support.cli import Result
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.relay_support import admit_relay, allow_market

DEPOSIT = 10_000_000


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=3, users=3)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return charge_chain(devnet, dsn, tmp_path / "keys")


def details(result: Result) -> dict:
    return json.loads(result.out)["run_tick"]["last_details"]


@pytest.fixture
def lagging(chain: ChainEnv, db: psycopg.Connection) -> ChainEnv:
    """Money moved and observed, the gas monitor has checked, then the only read node falls behind
    the observer's cursor (it answers as of a ledger before it)."""
    user = chain.genesis["users"][0]
    fund(chain, db, [(user, DEPOSIT)])
    assert chain.tick("observer").code == 0
    assert chain.tick("gas").code == 0
    chain.devnet.close_ledger(n=2)
    chain.devnet.set_fault("node_lag", ledgers=4)
    return chain


def waits(result: Result, said: str) -> dict:
    assert result.code == 0, result.err  # never 1 (or 3) for the lag alone
    assert f'"level": "warning", "msgid": "{said}"' in result.err, result.err
    return details(result)


def test_the_reconciler_waits_for_a_lagging_reader(lagging: ChainEnv, db: psycopg.Connection) -> None:
    found = waits(lagging.tick("reconciler"), "observer.readers_behind")
    assert "behind the observer's position" in found["waiting"] and found["findings_new"] == 0
    assert found["moving"] == 1  # concluded nothing about the account while the events are unknown
    assert db.execute("SELECT count(*) FROM paygate.findings").fetchone()[0] == 0


def test_the_gas_monitor_keeps_its_state_while_the_reader_lags(lagging: ChainEnv, db: psycopg.Connection) -> None:
    before = db.execute("SELECT level, ledger, checked_at FROM paygate.gas_state").fetchone()
    found = waits(lagging.tick("gas"), "gas.readers_behind")
    assert "behind ledger" in found["waiting"] and found["level"] == before[0]
    assert db.execute("SELECT level, ledger, checked_at FROM paygate.gas_state").fetchone() == before


def test_relay_expiry_waits_for_a_lagging_reader(lagging: ChainEnv, db: psycopg.Connection) -> None:
    allow_market(db, lagging.genesis["contracts"]["market"])
    relay_id = admit_relay(db, lagging.devnet, lagging.genesis["users"][1], "r-lag")
    found = waits(lagging.tick("relay_expiry"), "relay_expiry.readers_behind")
    assert "already observed" in found["waiting"] and found["expired"] == 0
    assert db.execute("SELECT status FROM paygate.relays WHERE id = %s", (relay_id,)).fetchone()[0] == "queued"
