"""The funding worker against a real devnet and a real Postgres."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.chain_env import (
    ChainEnv,
    admit_deposit,
    billing_balance,
    chain_environ,
    contract_events,
    sign_deposit,
)
from tests.support.devnet_support import DevnetHandle, start_devnet

AMOUNT = 25_000_000


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=4, users=3)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))


def pending(db: psycopg.Connection, pending_id: int) -> dict:
    cursor = db.execute("SELECT * FROM paygate.deposits WHERE id = %s", (pending_id,))
    return dict(zip([c.name for c in cursor.description], cursor.fetchone(), strict=True))


def run_until_quiet(chain: ChainEnv, db: psycopg.Connection, rounds: int = 12) -> None:
    for _ in range(rounds):
        result = chain.tick()
        assert result.code in (0, 1, 3), result.err
        open_rows = db.execute("SELECT count(*) FROM paygate.deposits WHERE status = 'pending'").fetchone()[0]
        live = db.execute("SELECT count(*) FROM paygate.lineages WHERE state IN ('allocated','signed','sent')"
                          ).fetchone()[0]
        if not open_rows and not live:
            return
        chain.devnet.close_ledger()
    raise AssertionError("funding did not go quiet")


def test_deposit_goes_from_admitted_to_settled(chain: ChainEnv, db: psycopg.Connection) -> None:
    user = chain.genesis["users"][0]
    entry, nonce, expiration = sign_deposit(chain.devnet, user["secret"], AMOUNT)
    pending_id = admit_deposit(db, user["public"], AMOUNT, entry, nonce, expiration, "dep-1")
    run_until_quiet(chain, db)
    row = pending(db, pending_id)
    assert row["status"] == "settled" and row["settled_by"] == "funding"
    assert db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s",
                      (user["public"],)).fetchone()[0] == AMOUNT
    assert billing_balance(chain, user["public"]) == AMOUNT
    credits = contract_events(chain, "credit")
    assert len(credits) == 1 and credits[0]["value"][1] == bytes(row["deposit_tx"])
    states = db.execute("SELECT purpose, state FROM paygate.lineages ORDER BY id").fetchall()
    assert states == [("deposit", "applied"), ("credit", "applied")]
