"""Ticks at ledger close (docs/workers.md): a `--every` loop whose tick left a transaction in flight
ticks again as soon as the next ledger closes, not at its next slot, so the lane that transaction
held carries new work a ledger later. Real devnet (manual: a ledger closes only when the test says),
real Postgres, real `run-tick` processes."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from paygate_cli.env import Env
from paygate_cli.settings import load_settings
from paygate_cli.ticks.next_ledger import NextLedgerWaiter
from paygate_cli.ticks.runner import _chain_client
from tests.support.chain_env import ChainEnv
from tests.support.charges_support import admit_charge, charge_chain, fund
from tests.support.cli import paygate_cmd
from tests.support.devnet_support import DevnetHandle, start_devnet

DEPOSIT = 50_000_000


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=2)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return charge_chain(devnet, dsn, tmp_path / "keys")


def _waiter(chain: ChainEnv) -> NextLedgerWaiter:
    settings = load_settings(chain.environ)
    return NextLedgerWaiter(lambda: _chain_client(settings), Env().monotonic)


def test_the_waiter_returns_at_the_close_and_not_before(chain: ChainEnv) -> None:
    waiter = _waiter(chain)
    stop = threading.Event()
    latest = chain.devnet.latest_ledger()
    try:
        started = time.monotonic()
        assert waiter.wait_past(latest, time.monotonic() + 0.6, stop) is False  # nothing closed
        assert time.monotonic() - started >= 0.6
        closer = threading.Timer(0.5, chain.devnet.close_ledger)
        closer.start()
        started = time.monotonic()
        assert waiter.wait_past(latest, time.monotonic() + 20, stop) is True
        assert 0.4 <= time.monotonic() - started < 3  # at the close, not at the deadline
        closer.join()
        assert waiter.wait_past(latest, time.monotonic() + 20, stop) is True  # already past: at once
    finally:
        waiter.close()


def test_an_unreachable_rpc_leaves_the_loop_on_its_cadence(chain: ChainEnv) -> None:
    settings = load_settings({**chain.environ, "PAYGATE_RPC_URL": "http://127.0.0.1:9",
                              "PAYGATE_RPC_TIMEOUT": "1s"})
    waiter = NextLedgerWaiter(lambda: _chain_client(settings), Env().monotonic)
    try:
        assert waiter.wait_past(1, time.monotonic() + 30, threading.Event()) is False
    finally:
        waiter.close()


def test_a_loop_with_a_batch_in_flight_ticks_again_at_the_close(chain: ChainEnv, db: psycopg.Connection) -> None:
    import subprocess

    users = chain.genesis["users"][:2]
    fund(chain, db, [(u, DEPOSIT) for u in users])
    admit_charge(db, users[0]["public"], 1000, "c-wake")
    # A 60 s cadence: a second tick within seconds can only be the ledger-close wake.
    proc = subprocess.Popen(paygate_cmd("run-tick", "settlement", "--every", "60s", "--for", "120s"),
                            env=chain.environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not db.execute(
                "SELECT 1 FROM paygate.lineages WHERE purpose = 'charge_batch' AND state = 'sent'").fetchone():
            time.sleep(0.1)
        assert db.execute("SELECT count(*) FROM paygate.worker_runs WHERE worker = 'settlement'"
                          ).fetchone()[0] == 1
        time.sleep(1.0)  # the loop is waiting: no ledger closed, no second tick
        assert db.execute("SELECT count(*) FROM paygate.worker_runs WHERE worker = 'settlement'"
                          ).fetchone()[0] == 1
        closed_at = time.monotonic()
        chain.devnet.close_ledger()
        applied = None
        while time.monotonic() < closed_at + 10 and applied is None:
            applied = db.execute("SELECT resolved_at FROM paygate.lineages WHERE purpose = 'charge_batch' "
                                 "AND state = 'applied'").fetchone()
            time.sleep(0.1)
        assert applied is not None, "the batch was not resolved within 10 s of its ledger's close"
        assert time.monotonic() - closed_at < 10  # far before the 60 s slot
        assert db.execute("SELECT count(*) FROM paygate.worker_runs WHERE worker = 'settlement'"
                          ).fetchone()[0] == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def test_on_a_timed_chain_the_waiter_sees_every_close_and_sleeps_between_them(tmp_path: Path, dsn: str) -> None:
    """A devnet closing a ledger every second: the waiter returns once per close, none skipped, and
    once it has timed two closes it sleeps until the next is due instead of polling all ledger long."""
    devnet = start_devnet(tmp_path / "timed", lanes=1, users=1, ledger_interval="1s")
    try:
        settings = load_settings(charge_chain(devnet, dsn, tmp_path / "keys").environ)
        polls = 0

        class Counting:
            def __init__(self) -> None:
                self.inner = _chain_client(settings)

            def latest_ledger(self) -> object:
                nonlocal polls
                polls += 1
                return self.inner.latest_ledger()

            def close(self) -> None:
                self.inner.close()

        waiter = NextLedgerWaiter(Counting, Env().monotonic)  # type: ignore[arg-type]
        stop = threading.Event()
        try:
            ledger = devnet.latest_ledger()
            for _ in range(3):  # learn the interval
                assert waiter.wait_past(ledger, time.monotonic() + 5, stop)
                ledger = devnet.latest_ledger()
            polls, seen = 0, []
            for _ in range(5):
                assert waiter.wait_past(ledger, time.monotonic() + 5, stop)
                ledger = devnet.latest_ledger()
                seen.append(ledger)
        finally:
            waiter.close()
        assert seen == list(range(seen[0], seen[0] + 5))  # every close, one at a time
        # Polling every 0.1 s all ledger long would be about 50 calls for five ledgers.
        assert polls <= 30, polls
    finally:
        devnet.stop()
