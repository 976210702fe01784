"""One settlement tick fills every lane: a lane carries one transaction per ledger, so a tick that
starts fewer batches than it has lanes leaves lanes idle for a ledger (docs/performance.md,
"throughput at the chain's ceiling"). Real devnet, real Postgres."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.chain_env import ChainEnv
from tests.support.charges_support import admit_charge, charge_chain, fund
from tests.support.devnet_support import DevnetHandle, start_devnet

LANES = 8
DEPOSIT = 50_000_000


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=LANES, users=2)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return charge_chain(devnet, dsn, tmp_path / "keys")


def _backlog(chain: ChainEnv, db: psycopg.Connection) -> None:
    """Two funded users and more charges than one tick's worth at --batch 2: lanes are the bound."""
    users = chain.genesis["users"][:2]
    fund(chain, db, [(u, DEPOSIT) for u in users])
    for i in range(3 * LANES):
        admit_charge(db, users[i % 2]["public"], 1000 + i, f"c{i}")


def test_one_tick_starts_a_batch_on_every_lane_by_default(chain: ChainEnv, db: psycopg.Connection) -> None:
    _backlog(chain, db)
    result = chain.tick("settlement", "--batch", "2")
    assert result.code == 0, result.err
    lanes = db.execute("SELECT DISTINCT lane FROM paygate.lineages WHERE purpose = 'charge_batch' "
                       "AND state = 'sent'").fetchall()
    assert len(lanes) == LANES
    assert db.execute("SELECT count(*) FROM paygate.charge_batches").fetchone()[0] == LANES


def test_a_configured_bound_still_holds(chain: ChainEnv, db: psycopg.Connection) -> None:
    _backlog(chain, db)
    result = chain.tick("settlement", "--batch", "2", PAYGATE_SETTLEMENT_BATCHES_PER_TICK="3")
    assert result.code == 0, result.err
    assert db.execute("SELECT count(*) FROM paygate.charge_batches").fetchone()[0] == 3


def test_a_lane_share_keeps_settlement_to_its_own_lanes_and_the_unreserved(chain: ChainEnv,
                                                                          db: psycopg.Connection) -> None:
    """docs/workers.md "Lane shares": funding=3,relay=2 reserve the first five lanes in address order
    (funding's three, then relay's two); settlement, named with 1, takes the sixth and the two left."""
    _backlog(chain, db)
    result = chain.tick("settlement", "--batch", "2", PAYGATE_LANE_SHARES="funding=3,relay=2,settlement=1")
    assert result.code == 0, result.err
    ordered = sorted(p["public"] for p in chain.genesis["lanes"])
    used = {lane for (lane,) in db.execute("SELECT DISTINCT lane FROM paygate.lineages "
                                           "WHERE purpose = 'charge_batch'")}
    assert used == set(ordered[5:]) == {ordered[5], ordered[6], ordered[7]}


def test_shares_reserving_more_lanes_than_configured_stop_the_worker_at_start(chain: ChainEnv) -> None:
    result = chain.tick("settlement", PAYGATE_LANE_SHARES="funding=5,relay=4")
    assert result.code == 78, result.err
    assert "lane_shares reserve 9 lanes" in result.err and "holds 8 lane seeds" in result.err
