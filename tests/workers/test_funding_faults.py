"""Funding under RPC faults: quorum reads that cannot reach a majority wait instead of deciding, an
RPC outage hands the rows back, transport errors are retried, and two tick processes at once never
double-spend."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from paygate_cli.errors import ExitCode
from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.cli import spawn
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.funding import (
    admit,
    assert_invariants,
    crash_tick,
    lineages_of,
    row_of,
    run_until_quiet,
    wait_for_leases,
)

DEAD_URL = "http://127.0.0.2:9"  # nothing listens: connection refused (another host than the devnet's)


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=4)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))


def test_no_majority_of_read_endpoints_waits_and_never_decides(chain: ChainEnv, db: psycopg.Connection) -> None:
    """The deposit landed, but only one of two read endpoints answers: one is not a majority, so the
    lineage is not recorded applied (and nothing is re-prepared); with a majority back it is."""
    pending_id = admit(chain, db)
    crash_tick(chain, "funding.after_broadcast")
    chain.devnet.close_ledger()
    wait_for_leases(db)
    split = {"PAYGATE_RPC_READ_URLS": f"{chain.devnet.url},{DEAD_URL}"}
    for _ in range(2):
        result = chain.tick("funding", "--once", **split)
        assert result.code in (0, 1), result.err
        # waiting, and saying why: the endpoint named by its host only (URLs may carry API keys)
        assert "journal.no_quorum" in result.err and "127.0.0.2:9" in result.err and DEAD_URL not in result.err
        chain.devnet.close_ledger()
        wait_for_leases(db)
    [deposit] = lineages_of(db)
    assert deposit["state"] in ("signed", "sent")  # still live: not decided either way
    assert row_of(db, pending_id)["deposit_tx"] is None and row_of(db, pending_id)["status"] == "pending"
    run_until_quiet(chain, db)
    assert [x["state"] for x in lineages_of(db) if x["purpose"] == "deposit"] == ["applied"]
    assert_invariants(chain, db, [pending_id])


# "2 of 3 read endpoints decide" counted one devnet twice (url, url/); it lives in tests/chain/test_quorum.py
# now, with three real devnets on three hosts.


@pytest.mark.parametrize("with_fresh_row", [False, True], ids=["in-flight-only", "in-flight+fresh"])
def test_rpc_down_hands_the_rows_back_and_decides_nothing(chain: ChainEnv, db: psycopg.Connection,
                                                          with_fresh_row: bool) -> None:
    """The only row in flight needs resolving and no endpoint answers: that is an outage (the tick
    says so), not a quiet wait; the rows go back at once and nothing is decided or signed."""
    first = admit(chain, db, user=0)
    crash_tick(chain, "funding.after_anchor")
    rows = [first, admit(chain, db, user=1)] if with_fresh_row else [first]
    chain.devnet.set_fault("down")
    wait_for_leases(db)
    result = chain.tick("funding", "--once")
    assert result.code == ExitCode.UNAVAILABLE, result.err  # an outage is not a clean tick
    assert "unavailable" in result.err.lower()
    for pending_id in rows:
        row = row_of(db, pending_id)
        assert row["status"] == "pending" and row["lease_token"] is None  # handed back now, not after the lease
    assert [x["state"] for x in lineages_of(db)] == ["signed"]  # nothing decided, nothing new signed
    chain.devnet.clear_faults()
    run_until_quiet(chain, db)
    assert_invariants(chain, db, rows)


def test_transport_errors_are_retried_within_a_tick(chain: ChainEnv, db: psycopg.Connection) -> None:
    pending_id = admit(chain, db)
    chain.devnet.set_fault("http_503", count=2)
    chain.devnet.set_fault("http_504", count=1, methods=["sendTransaction"])
    run_until_quiet(chain, db)
    assert_invariants(chain, db, [pending_id])
    assert len(lineages_of(db)) == 2  # one deposit, one credit: no attempt was wasted


def test_two_tick_processes_at_once_never_double_spend(db: psycopg.Connection, dsn: str, tmp_path: Path) -> None:
    """Two real processes tick the same queue at once (batch 2, so both get work), racing for rows
    and for lanes; ledgers close between rounds. Nothing is claimed, signed or credited twice."""
    devnet = start_devnet(tmp_path / "devnet4", lanes=4, users=4)
    try:
        chain = ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))
        ids = [admit(chain, db, user=u) for u in range(4)]
        for _ in range(6):
            procs = [spawn("run-tick", "funding", "--once", "--batch", "2", "--json", environ=chain.environ)
                     for _ in range(2)]
            for proc in procs:
                _, err = proc.communicate(timeout=60)
                assert proc.returncode in (0, 1, 75), err
            devnet.close_ledger()
            if all(row_of(db, i)["status"] == "settled" for i in ids):
                break
        run_until_quiet(chain, db)
        _check_concurrent_run(chain, db, ids)
    finally:
        devnet.stop()


def _check_concurrent_run(chain: ChainEnv, db: psycopg.Connection, ids: list[int]) -> None:
    assert_invariants(chain, db, ids)
    # every deposit was signed exactly once per attempt: no entitlement ever had two lineages
    entitlements = [x["entitlement"] for x in lineages_of(db)]
    assert len(entitlements) == len(set(entitlements)) == 2 * len(ids)


def test_a_worker_whose_lease_lapsed_mid_flight_never_sends(chain: ChainEnv, db: psycopg.Connection) -> None:
    """Process A claims the deposit, allocates, then stalls in a slow simulation past its 1 s lease.
    B takes the row over (abandoning A's unanchored lineage) and sends its own. When A wakes up its
    anchor finds its lineage abandoned: A commits nothing and broadcasts nothing."""
    pending_id = admit(chain, db)
    chain.devnet.set_fault("slow", ms=2500, count=1, methods=["simulateTransaction"])
    slow = spawn("run-tick", "funding", "--once", "--json", environ=chain.environ)
    try:
        deadline = time.monotonic() + 30
        while not lineages_of(db):  # A has allocated; its simulation is about to stall
            assert time.monotonic() < deadline and slow.poll() is None, slow.communicate()
            time.sleep(0.02)
        wait_for_leases(db)
        result = chain.tick("funding", "--once")  # B
        assert result.code == 0, result.err
        out, err = slow.communicate(timeout=60)
    finally:
        if slow.poll() is None:
            slow.kill()
    # A lost its lease: someone else has the row, which is neither a failure nor an alarm
    assert slow.returncode == 0, err
    assert '"lease_lost": 1' in out
    first, second = lineages_of(db)
    assert first["state"] == "abandoned" and first["envelope"] is None
    assert second["state"] == "sent" and row_of(db, pending_id)["deposit_lineage_id"] == second["id"]
    assert [q["innerHash"] for q in chain.devnet.state()["queue"]] == [bytes(second["inner_hash"]).hex()]
    run_until_quiet(chain, db)
    assert_invariants(chain, db, [pending_id])
