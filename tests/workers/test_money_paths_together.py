"""funding (2 processes), settlement (2), subscriptions and the observer loop at
once on the devnet with several lanes, first with no faults, then with the network losing send
answers, refusing sends and holding transactions. Every deposit and charge ends terminal, no lineage
is left live, cached balances equal the chain's, and no run failed or crashed while work was stuck
(quiescence is reached, so nothing was)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.chain_env import ChainEnv, admit_deposit, billing_balance, sign_deposit
from tests.support.charges_support import charge_chain, check_invariants
from tests.support.cli import spawn
from tests.support.devnet_support import DevnetHandle, start_devnet

pytestmark = pytest.mark.slow

DEPOSIT = 40_000_000
WORKERS = ["funding", "funding", "settlement", "settlement", "subscriptions", "observer"]
OPEN_WORK_SQL = """
SELECT (SELECT count(*) FROM paygate.deposits WHERE status = 'pending'),
       (SELECT count(*) FROM paygate.charges WHERE status = 'authorized'),
       (SELECT count(*) FROM paygate.charge_batches WHERE closed_at IS NULL),
       (SELECT count(*) FROM paygate.lineages WHERE state IN ('allocated', 'signed', 'sent'))
"""


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=4, users=4)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return charge_chain(devnet, dsn, tmp_path / "keys")


def try_charge(db: psycopg.Connection, account: str, amount: int, key: str) -> bool:
    try:
        db.execute("SELECT paygate.admit_charge(%s, %s, %s)", (account, amount, key))
        return True
    except psycopg.Error as exc:
        if exc.sqlstate == "PG402":  # not enough cached balance yet: the deposit has not settled
            return False
        raise


def stop(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    done = []
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        done.append((proc.returncode, err))
    return done


@pytest.mark.parametrize("faults", [False, True], ids=["no_faults", "faults"])
def test_every_money_path_at_once_settles_everything(chain: ChainEnv, db: psycopg.Connection, faults: bool) -> None:
    users = chain.genesis["users"]
    for n, user in enumerate(users):
        entry, nonce, expiration = sign_deposit(chain.devnet, user["secret"], DEPOSIT, valid_ledgers=2000)
        admit_deposit(db, user["public"], DEPOSIT, entry, nonce, expiration, f"together-{n}")
    procs = [spawn("run-tick", worker, "--every", "0.4s", "--for", "80s", "--lock-wait", "0", "--json",
                   environ=chain.environ) for worker in WORKERS]
    wanted = [(users[i % len(users)]["public"], 100_000 + i, f"ch-{i}") for i in range(24)]
    admitted: set[str] = set()
    subscribed = False
    deadline = time.monotonic() + 75
    try:
        step = 0
        while time.monotonic() < deadline:
            step += 1
            if faults and step % 6 == 1:
                kind = ("lose_send_answer", "try_again_later", "hold_next")[(step // 6) % 3]
                chain.devnet.set_fault(kind, **({"ledgers": 2} if kind == "hold_next" else {"count": 2}))
            for account, amount, key in wanted:
                if key not in admitted and try_charge(db, account, amount, key):
                    admitted.add(key)
            if not subscribed and db.execute("SELECT count(*) FROM paygate.deposits WHERE status = 'settled'"
                                             ).fetchone()[0] == len(users):
                # three missed hourly periods each: caught up by the subscriptions worker
                for n, user in enumerate(users[:2]):
                    db.execute("SELECT paygate.create_subscription(%s, 50000, interval '1 hour', "
                               "now() - interval '150 minutes', %s)", (user["public"], f"sub-{n}"))
                subscribed = True
            chain.devnet.close_ledger()
            time.sleep(0.3)
            if len(admitted) == len(wanted) and subscribed and not any(db.execute(OPEN_WORK_SQL).fetchone()):
                charges = db.execute("SELECT count(*) FROM paygate.charges").fetchone()[0]
                if charges == len(wanted) + 6:
                    break
        chain.devnet.clear_faults()
        open_work = db.execute(OPEN_WORK_SQL).fetchone()
    finally:
        exits = stop(procs)
    for worker, (code, err) in zip(WORKERS, exits, strict=True):
        # 0 (or 143 when the SIGTERM landed mid-phase), 75 for the slot that found its lock taken;
        # never a crash (70) or a human (3) in a run without foreign interference.
        assert code in (0, 143, 75), f"{worker} exited {code}: {err[-3000:]}"
    assert len(admitted) == len(wanted) and subscribed
    assert not any(open_work), f"work left (pending, authorized, open batches, live lineages): {open_work}"
    # the observer catches up with the last ledger, then the invariants hold
    chain.devnet.close_ledger()
    assert chain.tick("observer", "--once").code == 0
    statuses = dict(db.execute("SELECT status, count(*) FROM paygate.charges GROUP BY status").fetchall())
    assert statuses == {"settled": len(wanted) + 6}, statuses
    assert db.execute("SELECT count(*) FROM paygate.deposits WHERE status <> 'settled'").fetchone()[0] == 0
    check_invariants(chain, db, [u["public"] for u in users])
    for user in users:
        cached = db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s",
                            (user["public"],)).fetchone()[0]
        assert int(cached) == billing_balance(chain, user["public"])
    # no tick reported success while it crashed; stalls would have been reported, not hidden
    assert db.execute("SELECT count(*) FROM paygate.worker_runs WHERE outcome IN ('error', 'needs_human')"
                      ).fetchone()[0] == 0
