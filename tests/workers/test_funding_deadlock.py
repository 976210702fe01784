"""Funding's set-based settle against the observer taking the same locks in the other order.

The observer's page can lock an account first (a `charge_failed` restore) and then a deposit (the
`credit` event's settle), while funding's settle statement locks the deposit, then its account. The
interleaving is forced here with two real connections: the "observer" holds the account's row lock,
funding's statement flips the deposit and blocks on the account, then the observer settles the same
deposit; Postgres' deadlock detector picks funding's statement (the observer's session waits far
longer before it checks). Funding's tick must survive it: the deposit is settled once, exit 0."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from paygate_cli.queues.deposits import SETTLE_SQL
from tests.support.chain_env import ChainEnv, admit_deposit, chain_environ, sign_deposit
from tests.support.devnet_support import DevnetHandle, start_devnet

AMOUNT = 25_000_000


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=1)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))


def credit_in_flight(chain: ChainEnv, db: psycopg.Connection, pending_id: int) -> bytes:
    """Tick funding until the deposit's credit is broadcast (not yet resolved); its deposit hash."""
    for _ in range(10):
        assert chain.tick().code == 0
        row = db.execute("SELECT p.deposit_tx, x.state FROM paygate.deposits p "
                         "LEFT JOIN paygate.lineages x ON x.id = p.credit_lineage_id WHERE p.id = %s",
                         (pending_id,)).fetchone()
        if row[1] in ("signed", "sent"):
            return bytes(row[0])
        chain.devnet.close_ledger()
    raise AssertionError("the credit was never sent")


def test_a_deadlock_with_the_observer_leaves_funding_settling_once(chain: ChainEnv, db: psycopg.Connection,
                                                                   dsn: str) -> None:
    user = chain.genesis["users"][0]
    entry, nonce, expiration = sign_deposit(chain.devnet, user["secret"], AMOUNT)
    pending_id = admit_deposit(db, user["public"], AMOUNT, entry, nonce, expiration, "dep-deadlock")
    deposit_tx = credit_in_flight(chain, db, pending_id)
    chain.devnet.close_ledger()  # the credit lands: the next funding tick resolves it and settles

    observer = psycopg.connect(dsn)
    observer.execute("SET deadlock_timeout = '60s'")  # funding's session (1 s) detects the cycle first
    observer.execute("SELECT 1 FROM paygate.accounts WHERE address = %s FOR UPDATE", (user["public"],))
    observer_pid = observer.info.backend_pid
    failure: list[BaseException] = []

    def observe() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as watch:
                deadline = time.monotonic() + 30
                # Wait until funding's settle is blocked on the account lock the observer holds.
                while not watch.execute("SELECT count(*) FROM pg_locks WHERE NOT granted AND pid <> %s",
                                        (observer_pid,)).fetchone()[0]:
                    assert time.monotonic() < deadline, "funding never blocked on the account"
                    time.sleep(0.01)
            # The observer's credit event: the same statement, for the deposit funding has locked.
            observer.execute(SETTLE_SQL, {"ids": [pending_id], "by": "observer", "deposit_txs": [deposit_tx]})
            observer.commit()
        except BaseException as exc:  # reported by the test thread
            failure.append(exc)
            observer.rollback()

    thread = threading.Thread(target=observe)
    thread.start()
    try:
        result = chain.tick()
    finally:
        thread.join(60)
        observer.close()
    assert not failure, failure
    assert result.code == 0, result.err
    assert "funding.settle_retry" in result.err
    row = db.execute("SELECT status, settled_by FROM paygate.deposits WHERE id = %s", (pending_id,)).fetchone()
    assert row == ("settled", "observer")
    balance = db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s",
                         (user["public"],)).fetchone()[0]
    assert balance == AMOUNT  # incremented once, by the statement that won the flip
