"""Crash drills for the TTL keeper's extend lineage (workers/ttl.py, docs/architecture.md §6 "TTL
keeper"): a real `paygate run-tick ttl` process killed at each phase the engine names with the
keeper's extend prefix "ttl" (after_claim, after_allocate, after_sign, after_anchor, after_broadcast,
before_resolve, after_resolve), then clean ticks converge: the ExtendFootprintTTL lands once (one
signed lineage for the job), the job is applied once, its rent counted once, and the entries'
liveUntilLedgerSeq on chain moved to where the job asked."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.cli import Result
from tests.support.devnet_support import DevnetHandle, start_devnet, ttl_args
from tests.support.drill_support import crash_tick

LEDGER_SECONDS = 5  # chain/ttl.py's ledger time: the settings' durations are seconds
MIN_TTL = 3_000  # ledgers a new persistent entry lives
THRESHOLD = 500  # ledgers: the keeper extends an entry expiring sooner
EXTEND_TO = 4_000  # ledgers ahead an extension reaches
LEASE = 2.0  # seconds: a killed keeper's claim lapses quickly (PAYGATE_FUNDING_LEASE is the keeper's)

# Killed before the anchor too: the clean tick abandons the unsigned lineage (no attempt) and extends.
POINTS = ["ttl.after_claim", "ttl.after_allocate", "ttl.after_sign", "ttl.after_anchor", "ttl.after_broadcast",
          "ttl.before_resolve", "ttl.after_resolve"]


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=1,
                          extra_args=ttl_args(MIN_TTL, 30_000))
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    environ = chain_environ(devnet, dsn, tmp_path / "keys")
    environ.update(PAYGATE_TTL_THRESHOLD=f"{THRESHOLD * LEDGER_SECONDS}s",
                   PAYGATE_TTL_EXTEND_TO=f"{EXTEND_TO * LEDGER_SECONDS}s", PAYGATE_FEE_STATS_CACHE="0s",
                   PAYGATE_OBSERVER_START_LEDGER="1", PAYGATE_FUNDING_LEASE=f"{LEASE}s")
    return ChainEnv(devnet, dsn, environ)


def wait_for_leases(db: psycopg.Connection) -> None:
    """Sleep until no pending ttl job holds a lease (DB time): the killed keeper's claim has lapsed."""
    left = db.execute("SELECT coalesce(extract(epoch FROM max(lease_expires_at) - now()), 0)::float8"
                      " FROM paygate.ttl_jobs WHERE status = 'pending' AND lease_expires_at > now()").fetchone()[0]
    if left > 0:
        time.sleep(left + 0.05)


def keeper(chain: ChainEnv, db: psycopg.Connection, *, codes: tuple[int, ...] = (0,)) -> Result:
    wait_for_leases(db)
    result = chain.tick("ttl", "--once")
    assert result.code in codes, (result.code, result.out, result.err[-3000:])
    return result


def on_chain(devnet: DevnetHandle, key_xdr: str) -> int:
    [found] = devnet.rpc("getLedgerEntries", {"keys": [key_xdr]})["entries"]
    return int(found["liveUntilLedgerSeq"])


@pytest.mark.parametrize("point", POINTS)
def test_a_keeper_killed_in_an_extend_phase_lands_it_once(chain: ChainEnv, db: psycopg.Connection,
                                                          point: str) -> None:
    devnet = chain.devnet
    keeper(chain, db)  # registers and reads the contract's entries: live, nothing due
    (expiry,) = db.execute("SELECT min(live_until) FROM paygate.ttl_entries WHERE state = 'live'").fetchone()
    devnet.rpc("devnet_advance", {"ledgers": expiry - THRESHOLD + 50 - devnet.latest_ledger()})
    db.execute("UPDATE paygate.ttl_entries SET read_at = now() - interval '2 hours'")  # read again this tick
    keeper(chain, db)  # read inside the threshold: one extend job
    [(job_id, kind, keys)] = db.execute("SELECT id, kind, keys_xdr FROM paygate.ttl_jobs").fetchall()
    assert kind == "extend"
    if point.endswith("resolve"):
        keeper(chain, db)  # sent; the next tick resolves it (after the ledger that includes it)
        devnet.close_ledger()
    crash_tick(chain.environ, "ttl", point)
    recovery = keeper(chain, db, codes=(0, 1)).code  # the first clean tick: asserted last
    for _ in range(6):
        if db.execute("SELECT status FROM paygate.ttl_jobs WHERE id = %s", (job_id,)).fetchone()[0] != "pending":
            break
        devnet.close_ledger()
        keeper(chain, db)
        if db.execute("SELECT status FROM paygate.ttl_jobs WHERE id = %s", (job_id,)).fetchone()[0] != "pending":
            break
        devnet.close_ledger()
    status, lineage_id, fee = db.execute("SELECT status, lineage_id, fee_charged FROM paygate.ttl_jobs"
                                         " WHERE id = %s", (job_id,)).fetchone()
    assert status == "applied" and fee > 0
    # One ExtendFootprintTTL signed for the job, whatever died where: a lineage killed before its
    # anchor was abandoned unsigned, an anchored one resent as journaled.
    signed = db.execute("SELECT id, state, ledger, fee_charged FROM paygate.lineages"
                        " WHERE purpose = 'ttl_extend' AND envelope IS NOT NULL").fetchall()
    assert [(i, s) for i, s, _, _ in signed] == [(lineage_id, "applied")]
    ledger, charged = signed[0][2], signed[0][3]
    assert charged == fee
    assert db.execute("SELECT count(*) FROM paygate.ttl_jobs").fetchone()[0] == 1  # not due again
    assert db.execute("SELECT spent, transactions FROM paygate.ttl_rent").fetchall() == [(fee, 1)]  # once
    # The devnet saw one extension: both entries moved to the job's ledger + extend_to, nowhere else.
    for key in keys:
        assert on_chain(devnet, key) == ledger + EXTEND_TO
    rows = db.execute("SELECT state, live_until FROM paygate.ttl_entries WHERE key_xdr = ANY(%s)", (keys,)).fetchall()
    assert rows == [("live", ledger + EXTEND_TO)] * len(keys)
    assert recovery == 0  # the tick after the kill recovered cleanly: nothing failed, nothing stalled
