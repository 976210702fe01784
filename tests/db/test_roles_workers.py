"""Least privilege, end to end: every worker does its real work connected as the runtime
role on the devnet (deposits, a recovery take-over after a real kill, charges, subscriptions, the
observer, relays, bot jobs, webhooks, the reconciler, gas, the sweep), and the on-call commands
(status, reconcile-report, nonce-inspect) work as the read-only role, write nothing, and any write
attempted as it exits 77.

Admission (admit_deposit, admit_charge, admit_relay, ...) and endpoint set-up run as the owner:
they are the API service's, not the runtime role's."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from paygate_cli.db.privileges import READONLY_ROLE, RUNTIME_ROLE
from paygate_cli.errors import ExitCode
from tests.support.chain_env import ChainEnv, admit_deposit, chain_environ, sign_deposit
from tests.support.charges_support import admit_charge, fund, run_until_quiet
from tests.support.cli import Result, run_cli, spawn
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.drill_support import crash_tick
from tests.support.relay_support import admit_close, admit_relay, allow_market
from tests.support.roles import as_role
from tests.support.webhook_receiver import Receiver

pytestmark = pytest.mark.slow

DEPOSIT = 30_000_000
FUNDING_LEASE_S = 1.0
RECOVERY_GRACE_S = 11.0  # must exceed every recovered queue's receipt timeout plus a tick (RECOVERY)
RECOVERY = {"PAYGATE_RPC_TIMEOUT": "0.5s", "PAYGATE_WEBHOOK_TIMEOUT": "1s",
            "PAYGATE_RECOVERY_GRACE": f"{RECOVERY_GRACE_S}s"}
# Counts of what the read-only commands must not change.
WRITES_SQL = """
SELECT (SELECT count(*) FROM paygate.audit_log), (SELECT count(*) FROM paygate.worker_runs),
       (SELECT count(*) FROM paygate.halts), (SELECT count(*) FROM paygate.instances),
       (SELECT max(xmin::text::bigint) FROM paygate.lanes)
"""


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=3, users=3)
    yield handle
    handle.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture
def owner_environ(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> dict[str, str]:
    environ = chain_environ(devnet, dsn, tmp_path / "keys")
    environ.update(PAYGATE_OBSERVER_START_LEDGER="1", PAYGATE_SETTLEMENT_LEASE="1s",
                   PAYGATE_FUNDING_LEASE=f"{FUNDING_LEASE_S}s",
                   PAYGATE_WEBHOOK_ALLOW_HOSTS="127.0.0.1", PAYGATE_WEBHOOK_TIMEOUT="2s")
    return environ


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, owner_environ: dict[str, str]) -> ChainEnv:
    """paygate wired to the devnet, every connection as the runtime role."""
    assert run_cli("migrate", "--roles", dsn=dsn).code == 0
    runtime_dsn = as_role(dsn, RUNTIME_ROLE)
    return ChainEnv(devnet, runtime_dsn, {**owner_environ, "PAYGATE_DATABASE_URL": runtime_dsn})


def refused(result: Result) -> bool:
    return result.code == ExitCode.NOPERM or "permission denied" in result.err


def tick_ok(chain: ChainEnv, worker: str, *, codes: tuple[int, ...] = (0,), **extra: str) -> dict:
    result = chain.tick(worker, "--once", **extra)
    assert not refused(result), f"{worker} as {RUNTIME_ROLE}: {result.err}"
    assert result.code in codes, f"{worker} exited {result.code}: {result.err}"
    return json.loads(result.out)["run_tick"]["last_details"]


def test_every_worker_does_its_work_as_the_runtime_role(chain: ChainEnv, db: psycopg.Connection,
                                                          receiver: Receiver) -> None:
    g = chain.genesis
    users = g["users"]
    db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES (%s, '0123456789abcdef0123')",
               (f"{receiver.base}/ok",))
    allow_market(db, g["contracts"]["market"])

    # recovery: a funding worker killed after anchoring, taken over once its lease and grace lapse
    entry, nonce, expiration = sign_deposit(chain.devnet, users[2]["secret"], DEPOSIT, valid_ledgers=500)
    admit_deposit(db, users[2]["public"], DEPOSIT, entry, nonce, expiration, "killed-deposit")
    crash_tick(chain.environ, "funding", "funding.after_anchor")
    time.sleep(FUNDING_LEASE_S + RECOVERY_GRACE_S + 0.5)
    assert tick_ok(chain, "recovery", **RECOVERY)["deposits"] == {"deposit_sent": 1}

    # funding (lanes registered, deposit and credit lineages), the killed one included
    fund(chain, db, [(users[0], DEPOSIT), (users[1], DEPOSIT)], rounds=30)
    assert db.execute("SELECT count(*) FROM paygate.deposits WHERE status = 'settled'").fetchone()[0] == 3

    # settlement + observer, and a subscription whose charge the worker admits through admit_charge
    for n in range(3):
        admit_charge(db, users[n % 2]["public"], 100_000 + n, f"charge-{n}")
    db.execute("SELECT paygate.create_subscription(%s, 50000, interval '1 hour', now() - interval '30 minutes', "
               "'sub-0')", (users[0]["public"],))
    tick_ok(chain, "subscriptions")
    assert db.execute("SELECT count(*) FROM paygate.charges WHERE subscription_id IS NOT NULL").fetchone()[0] == 1
    run_until_quiet(chain, db)
    statuses = dict(db.execute("SELECT status, count(*) FROM paygate.charges GROUP BY status").fetchall())
    assert statuses == {"settled": 4}, statuses

    # relay, then a bot job (refused at simulation: the order has not expired; that is still its work)
    relay_id = admit_relay(db, chain.devnet, users[0], "relay-0")
    for _ in range(15):
        tick_ok(chain, "relay", codes=(0, 1))
        if db.execute("SELECT status FROM paygate.relays WHERE id = %s", (relay_id,)).fetchone()[0] != "queued":
            break
        chain.devnet.close_ledger()
    assert db.execute("SELECT status FROM paygate.relays WHERE id = %s", (relay_id,)).fetchone()[0] == "applied"
    job = admit_close(db, chain.devnet, users[0]["public"])
    tick_ok(chain, "relay_drainer", codes=(0, 1))
    assert db.execute("SELECT status FROM paygate.bot_jobs WHERE id = %s", (job,)).fetchone()[0] != "queued"

    # the safety nets and housekeeping
    tick_ok(chain, "relay_expiry")
    tick_ok(chain, "gas")
    assert db.execute("SELECT count(*) FROM paygate.gas_state").fetchone()[0] == 1
    tick_ok(chain, "reconciler")
    assert db.execute("SELECT count(*) FROM paygate.account_checks").fetchone()[0] >= 1
    db.execute("INSERT INTO paygate.idempotency_keys (scope, key, request_hash, expires_at) "
               "VALUES ('probe', 'expired', '\\x00', now() - interval '1 day')")
    tick_ok(chain, "idempotency_sweep")
    assert db.execute("SELECT count(*) FROM paygate.idempotency_keys WHERE scope = 'probe'").fetchone()[0] == 0
    delivered = tick_ok(chain, "webhooks")["delivered"]
    assert delivered > 0 and len(receiver.paths()) == delivered

    # retention, with that history aged past its window (a live subscription's latest charge stays)
    db.execute("UPDATE paygate.charges SET settled_at = settled_at - interval '40 days'")
    db.execute("UPDATE paygate.charge_batches SET closed_at = closed_at - interval '40 days'"
               " WHERE closed_at IS NOT NULL")
    db.execute("UPDATE paygate.webhook_outbox SET delivered_at = delivered_at - interval '40 days'"
               " WHERE status = 'delivered'")
    moved = tick_ok(chain, "retention")["moved"]
    assert moved["charges"] == 3 and moved["webhook_outbox"] >= delivered, moved

    # every tick above ran as the runtime role and none was refused anything
    assert db.execute("SELECT count(*) FROM paygate.worker_runs WHERE error ILIKE '%%permission denied%%'"
                      ).fetchone()[0] == 0
    ran = {r[0] for r in db.execute("SELECT DISTINCT worker FROM paygate.worker_runs")}
    assert ran >= {"funding", "settlement", "observer", "subscriptions", "recovery", "relay", "relay_drainer",
                   "relay_expiry", "gas", "reconciler", "idempotency_sweep", "webhooks", "retention"}


def test_on_call_commands_work_read_only_and_writes_exit_77(chain: ChainEnv, db: psycopg.Connection,
                                                            owner_environ: dict[str, str], dsn: str) -> None:
    users = chain.genesis["users"]
    fund(chain, db, [(users[0], DEPOSIT)])
    credit_id = db.execute("SELECT id FROM paygate.deposits").fetchone()[0]
    allow_market(db, chain.genesis["contracts"]["market"])
    relay_id = admit_relay(db, chain.devnet, users[0], "relay-ro")
    readonly = {**owner_environ, "PAYGATE_DATABASE_URL": as_role(dsn, READONLY_ROLE)}
    before = db.execute(WRITES_SQL).fetchone()
    commands = [("status", "--json"), ("reconcile-report", "--format", "json"), ("nonce-inspect", "--json"),
                ("nonce-inspect", "--deposit", str(credit_id), "--json"),
                ("nonce-inspect", "--relay", str(relay_id), "--json")]
    for args in commands:
        as_owner = run_cli(*args, environ=owner_environ)
        as_readonly = run_cli(*args, environ=readonly)
        assert not refused(as_readonly), f"{args} as {READONLY_ROLE}: {as_readonly.err}"
        # the same answer as the owner gets (status may be "not ready": same code either way)
        assert as_readonly.code == as_owner.code, (args, as_readonly.err, as_owner.err)
        assert as_readonly.code != ExitCode.SOFTWARE, as_readonly.err
        assert set(json.loads(as_readonly.out)) == set(json.loads(as_owner.out))
    assert db.execute(WRITES_SQL).fetchone() == before, "a read-only command wrote something"

    for args in [("halt", "--reason", "probe", "--yes"), ("drain", "--instance", "probe", "--force", "--yes"),
                 ("run-tick", "webhooks", "--once")]:
        result = run_cli(*args, environ=readonly)
        assert result.code == ExitCode.NOPERM, (args, result.code, result.err)
        assert "permission denied" in result.err
    assert db.execute(WRITES_SQL).fetchone() == before

    # a worker holding its lock as the runtime role: the read-only status still names the holder
    holder = spawn("run-tick", "webhooks", "--every", "0.5s", "--for", "20s", environ=chain.environ)
    try:
        for _ in range(100):
            locks = json.loads(run_cli("status", "--json", environ=readonly).out)["status"]["locks"]
            if locks:
                break
            time.sleep(0.1)
        assert [lock["lock"] for lock in locks] == ["webhooks"] and locks[0]["pid"]
    finally:
        holder.terminate()
        holder.communicate(timeout=60)
