"""The soak's invariant checks can fail: violations planted in a quiet world are each reported, with
the rows involved, and the same world without them is clean."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.chaos.invariants import check_all
from tests.support.chain_env import ChainEnv
from tests.support.charges_support import charge_chain
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.webhook_receiver import Receiver


@pytest.fixture
def chain(dsn: str, tmp_path: Path) -> Iterator[ChainEnv]:
    devnet: DevnetHandle = start_devnet(tmp_path / "devnet", lanes=1, users=2)
    try:
        yield charge_chain(devnet, dsn, tmp_path / "keys")
    finally:
        devnet.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver().start()
    yield server
    server.stop()


def test_planted_violations_are_each_reported(chain: ChainEnv, db: psycopg.Connection, receiver: Receiver) -> None:
    clean = check_all(chain, chain.dsn, receiver)
    assert clean.violations == [], clean.violations

    user = chain.genesis["users"][0]["public"]
    # A cached balance the chain does not have, and a webhook event never delivered.
    db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 5000)", (user,))
    endpoint = db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES ('http://127.0.0.1:9/x', "
                          "'0123456789abcdef0123') RETURNING id").fetchone()[0]
    db.execute("INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload) VALUES (%s, 'x', %s)",
               (endpoint, Jsonb({})))
    found = {v.invariant: v.detail for v in check_all(chain, chain.dsn, receiver).violations}
    assert "cached balances equal chain balances" in found
    assert user in found["cached balances equal chain balances"]
    assert "every webhook_outbox row terminal" in found
    assert "every webhook event delivered" in found
