"""The relay worker renews its rows' leases before each phase (workers/recovery.py's grace rule): on a
slow RPC, where the tick's phases together last far longer than the lease plus recovery's grace,
recovery running at the same time (a real process) takes nothing from the live worker, and the
worker's tick exits 0 with its relays sent, then landed. Real devnet (its `slow` fault), real
Postgres, real processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.chain_env import ChainEnv, chain_environ, recovery_environ
from tests.support.cli import spawn
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.relay_support import admit_relay, allow_market, relay_rows, run_until_quiet

# Lease 1 s (chain_environ); grace 13.5 s > rpc timeout 3 s + a relay_drainer tick (10 s), the longest
# of the recovered queues. Each relay's build waits ~3 s on slow reads and its simulation, five of them
# one after another: ~16 s from the claim to the anchor, past lease + grace.
RECOVERY = {"PAYGATE_WEBHOOK_TIMEOUT": "1s", "PAYGATE_RECOVERY_GRACE": "13.5s"}
RELAYS = 5


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=RELAYS, users=1)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    env = ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))
    env.environ.update(RECOVERY)
    return env


def test_a_slow_rpc_never_lets_recovery_take_rows_from_a_live_relay_worker(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    allow_market(db, chain.genesis["contracts"]["market"])
    user = chain.genesis["users"][0]
    ids = [admit_relay(db, chain.devnet, user, f"r-slow-{n}", item=f"item{n}") for n in range(RELAYS)]
    chain.devnet.set_fault("slow", ms=1500, methods=["getLedgerEntries", "simulateTransaction"])
    relay = spawn("run-tick", "relay", "--once", "--json", environ=chain.environ)
    recovery = spawn("run-tick", "recovery", "--every", "0.2s", "--for", "25s", "--json",
                     environ=recovery_environ(chain.environ))
    out, err = relay.communicate(timeout=90)
    assert relay.returncode == 0, err[-3000:]
    assert json.loads(out)["run_tick"]["last_details"].get("sent") == RELAYS, out
    recovery.wait(timeout=60)
    assert recovery.returncode == 0, recovery.stderr.read()[-3000:]
    taken = db.execute("SELECT count(*) FROM paygate.worker_runs WHERE worker = 'recovery' AND processed > 0"
                       ).fetchone()[0]
    assert taken == 0  # recovery never took a row from the live worker
    chain.devnet.clear_faults()
    chain.devnet.close_ledger()
    run_until_quiet(chain, db)
    assert [relay_rows(db)[i]["status"] for i in ids] == ["applied"] * RELAYS
    # One lineage each: nothing was abandoned under the worker and built again.
    assert db.execute("SELECT count(*) FROM paygate.lineages").fetchone()[0] == RELAYS


def test_a_slow_rpc_never_lets_recovery_take_bot_jobs_from_a_live_drainer(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    """The same for the bot-job drainer: its jobs are built one after another, each waiting on the
    slow reads and simulation, the whole tick far past lease + grace."""
    from paygate_cli.sandbox.devnet.contracts.market import ORDER_TTL_LEDGERS
    from tests.support.relay_support import admit_close

    allow_market(db, chain.genesis["contracts"]["market"])  # relay's buy, the bot jobs' close_expired
    user = chain.genesis["users"][0]
    for n in range(RELAYS):
        admit_relay(db, chain.devnet, user, f"order-{n}", item=f"item{n}")
    run_until_quiet(chain, db)
    chain.devnet.close_ledger(ORDER_TTL_LEDGERS + 1)
    jobs = [admit_close(db, chain.devnet, user["public"], key=f"close-{n}") for n in range(RELAYS)]
    chain.devnet.set_fault("slow", ms=1500, methods=["getLedgerEntries", "simulateTransaction"])
    drainer = spawn("run-tick", "relay_drainer", "--once", "--json", environ=chain.environ)
    recovery = spawn("run-tick", "recovery", "--every", "0.2s", "--for", "25s", "--json",
                     environ=recovery_environ(chain.environ))
    _out, err = drainer.communicate(timeout=120)
    assert drainer.returncode == 0, err[-3000:]
    recovery.wait(timeout=60)
    assert recovery.returncode == 0, recovery.stderr.read()[-3000:]
    taken = db.execute("SELECT count(*) FROM paygate.worker_runs WHERE worker = 'recovery' AND processed > 0"
                       ).fetchone()[0]
    assert taken == 0  # recovery never took a job from the live drainer
    # Every job got exactly one lineage from the live drainer (the first closes the user's orders,
    # the others find nothing left to close): nothing was taken over and rebuilt.
    assert db.execute("SELECT count(*) FROM paygate.lineages WHERE entitlement = ANY(%s)",
                      ([f"bot_job:{j}" for j in jobs],)).fetchone()[0] == RELAYS
