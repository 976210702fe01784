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
from types import SimpleNamespace

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


def test_on_a_timed_chain_the_waiter_sees_every_close_one_at_a_time(tmp_path: Path, dsn: str) -> None:
    """A devnet closing a ledger every second: the waiter returns once per close, none skipped."""
    devnet = start_devnet(tmp_path / "timed", lanes=1, users=1, ledger_interval="1s")
    try:
        waiter = _waiter(charge_chain(devnet, dsn, tmp_path / "keys"))
        stop = threading.Event()
        try:
            ledger, seen = devnet.latest_ledger(), []
            for _ in range(5):
                assert waiter.wait_past(ledger, time.monotonic() + 5, stop)
                ledger = devnet.latest_ledger()
                seen.append(ledger)
        finally:
            waiter.close()
        assert seen == list(range(seen[0], seen[0] + 5))
    finally:
        devnet.stop()


class _ScriptedChain:
    """The chain as the waiter sees it, on a clock the test drives: a ledger closes every `interval`
    seconds. The timing logic is what is tested here, so time must not depend on the machine's load;
    the real devnet tests above cover the RPC itself."""

    def __init__(self, clock: list[float], interval: float) -> None:
        self.clock, self.interval, self.polls = clock, interval, 0

    def latest_ledger(self) -> SimpleNamespace:
        self.polls += 1
        return SimpleNamespace(sequence=100 + int(self.clock[0] // self.interval))

    def close(self) -> None:
        pass


class _ScriptedStop:
    """threading.Event's is_set/wait, where waiting advances the test's clock."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def is_set(self) -> bool:
        return False

    def wait(self, seconds: float) -> bool:
        self.clock[0] += seconds
        return False


def test_once_it_has_timed_closes_the_waiter_sleeps_until_the_next_is_due() -> None:
    clock = [0.05]
    chain = _ScriptedChain(clock, interval=5.0)  # mainnet's pace
    waiter = NextLedgerWaiter(lambda: chain, lambda: clock[0])  # type: ignore[arg-type,return-value]
    stop = _ScriptedStop(clock)
    for ledger in range(100, 103):  # learn the interval from two timed closes
        assert waiter.wait_past(ledger, clock[0] + 60, stop)  # type: ignore[arg-type]
    chain.polls = 0
    for ledger in range(103, 108):
        assert waiter.wait_past(ledger, clock[0] + 60, stop)  # type: ignore[arg-type]
        assert clock[0] - (ledger + 1 - 100) * 5.0 <= 0.1 + 1e-9  # within a poll of the close
        clock[0] += 0.3  # a tick
    # Polling every 0.1 s would be about 50 calls a ledger; predicting, a handful.
    assert chain.polls <= 5 * 4, chain.polls


def test_a_ledger_first_seen_after_a_long_tick_is_not_taken_as_its_close_time() -> None:
    """The first sight of a ledger after a tick says nothing of when it closed: predicting from it
    would sleep past the next close. Here each tick runs 1.6 s of 1 s ledgers, and its work awaits
    the ledger after the last one it read."""
    clock = [0.05]
    chain = _ScriptedChain(clock, interval=1.0)
    waiter = NextLedgerWaiter(lambda: chain, lambda: clock[0])  # type: ignore[arg-type,return-value]
    stop = _ScriptedStop(clock)
    for ledger in range(100, 103):  # timed closes: the interval is known
        assert waiter.wait_past(ledger, clock[0] + 60, stop)  # type: ignore[arg-type]
    for _ in range(5):
        clock[0] += 1.6  # the tick; a ledger closed during it
        awaited = 100 + int(clock[0])  # the latest ledger the tick read
        assert waiter.wait_past(awaited, clock[0] + 60, stop)  # type: ignore[arg-type]
        assert clock[0] % 1.0 <= 0.1 + 1e-9, clock[0]  # within a poll of the close (whole seconds)
