"""Recovery on the money paths, against a real devnet: a funding or settlement process killed holding
its lease is taken over after the grace window through the queue's own routine (the lineage in
flight is resolved or resent with the same bytes, never replaced), and recovery racing live
workers on the same rows (real processes) still spends once. Recovery always runs here as it is
deployed: a real process holding no lane or fee seed (only the database, RPC and the journal keys),
and the engine it drives with refuses to allocate or sign."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.chain_env import (
    ChainEnv,
    admit_deposit,
    billing_balance,
    contract_events,
    recovery_environ,
    sign_deposit,
)
from tests.support.charges_support import admit_charge, charge_chain, check_invariants, fund, run_until_quiet
from tests.support.cli import run_cli, run_proc, spawn
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.drill_support import crash_tick

AMOUNT = 7_000_000
# Grace 11 s > rpc timeout 0.5 s + a relay_drainer tick (10 s), the longest of the recovered queues.
RECOVERY = {"PAYGATE_RPC_TIMEOUT": "0.5s", "PAYGATE_WEBHOOK_TIMEOUT": "1s", "PAYGATE_RECOVERY_GRACE": "11s"}
LAPSE_S = 1.0 + 11.0 + 0.5  # lease + grace + margin (DB time)


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=2)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    env = charge_chain(devnet, dsn, tmp_path / "keys")
    env.environ.update(RECOVERY)
    return env


def recover(chain: ChainEnv) -> dict:
    """One recovery tick as a real process, deployed least-privilege: no lane or fee seed."""
    result = run_proc("run-tick", "recovery", "--json", environ=recovery_environ(chain.environ))
    assert result.code == 0, result.err
    return json.loads(result.out)["run_tick"]["last_details"]


def kill_at(chain: ChainEnv, worker: str, point: str) -> None:
    crash_tick(chain.environ, worker, point)  # it really died there: exit -9 and the point's marker


def deposit(chain: ChainEnv, db: psycopg.Connection, user: int = 0) -> int:
    u = chain.genesis["users"][user]
    entry, nonce, expiration = sign_deposit(chain.devnet, u["secret"], AMOUNT, valid_ledgers=300)
    return admit_deposit(db, u["public"], AMOUNT, entry, nonce, expiration, f"dep-{user}-{nonce}")


def test_a_funding_worker_killed_after_anchoring_is_recovered_through_its_lineage(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    pending_id = deposit(chain, db)
    kill_at(chain, "funding", "funding.after_anchor")  # signed and journaled, never broadcast
    lineage = db.execute("SELECT id, state, inner_hash FROM paygate.lineages").fetchall()
    assert [(s) for _, s, _ in lineage] == ["signed"]
    assert recover(chain)["deposits"] == {}  # the lease is still within its grace: hands off
    time.sleep(LAPSE_S)
    details = recover(chain)
    assert details["deposits"] == {"deposit_sent": 1}  # resolve: not proven either way, same bytes resent
    assert db.execute("SELECT lease_token FROM paygate.deposits").fetchone()[0] is None  # released
    chain.devnet.close_ledger()
    time.sleep(LAPSE_S)  # recovery takes only rows whose owner died; make this one look abandoned again
    db.execute("UPDATE paygate.deposits SET lease_token = gen_random_uuid(), "
               "lease_expires_at = now() - interval '1 hour'")
    assert recover(chain)["deposits"] == {"deposit_applied": 1}
    # The same lineage landed: the journal still holds exactly one deposit transaction.
    assert db.execute("SELECT id, state, inner_hash FROM paygate.lineages").fetchall() == [
        (lineage[0][0], "applied", lineage[0][2])]
    # Recovery never starts new work: the credit is the worker's.
    for _ in range(6):
        assert chain.tick("funding").code == 0
        chain.devnet.close_ledger()
    user = chain.genesis["users"][0]["public"]
    assert db.execute("SELECT status FROM paygate.deposits WHERE id = %s", (pending_id,)).fetchone()[0] \
        == "settled"
    assert billing_balance(chain, user) == AMOUNT and len(contract_events(chain, "credit")) == 1


def test_recovery_racing_funding_workers_on_the_same_rows_spends_once(chain: ChainEnv,
                                                                      db: psycopg.Connection) -> None:
    ids = [deposit(chain, db, user) for user in (0, 1)]
    kill_at(chain, "funding", "funding.after_broadcast")  # both rows leased, their deposits sent
    time.sleep(LAPSE_S)
    procs = [spawn("run-tick", "recovery", "--every", "0.2s", "--for", "12s", environ=recovery_environ(chain.environ)),
             spawn("run-tick", "funding", "--every", "0.2s", "--for", "12s", environ=chain.environ),
             spawn("run-tick", "funding", "--every", "0.2s", "--for", "12s", environ=chain.environ)]
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        chain.devnet.close_ledger()
        time.sleep(0.7)
    for proc in procs:
        proc.wait(timeout=60)
        assert proc.returncode == 0, (proc.args, proc.returncode, proc.stderr.read()[-3000:])
    for _ in range(6):  # whatever is left, the worker finishes
        chain.tick("funding")
        chain.devnet.close_ledger()
    assert [r[0] for r in db.execute("SELECT status FROM paygate.deposits ORDER BY id")] == ["settled"] * 2
    per_entitlement = db.execute("SELECT entitlement, count(*) FILTER (WHERE state = 'applied'), count(*) "
                                 "FROM paygate.lineages GROUP BY entitlement ORDER BY entitlement").fetchall()
    assert all(applied == 1 for _, applied, _ in per_entitlement)
    # The deposits sent before the kill were never replaced by new bytes: one deposit lineage each.
    assert [n for e, _, n in per_entitlement if e.endswith(":deposit")] == [1, 1]
    assert len(contract_events(chain, "credit")) == 2
    for user in chain.genesis["users"]:
        cached = db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s",
                            (user["public"],)).fetchone()[0]
        assert cached == billing_balance(chain, user["public"]) == AMOUNT
    assert ids


def test_a_settlement_worker_killed_after_anchoring_is_recovered(chain: ChainEnv, db: psycopg.Connection) -> None:
    users = chain.genesis["users"]
    fund(chain, db, [(users[0], AMOUNT)])
    assert chain.tick("observer").code == 0
    admit_charge(db, users[0]["public"], 1_000, "c1")
    kill_at(chain, "settlement", "settlement.after_anchor")
    assert db.execute("SELECT state FROM paygate.lineages WHERE purpose = 'charge_batch'").fetchone()[0] == "signed"
    time.sleep(LAPSE_S)
    details = recover(chain)
    assert details["charge_batches"] == {"in_flight": 1}  # resent the journaled bytes, lease released
    assert db.execute("SELECT state FROM paygate.lineages WHERE purpose = 'charge_batch'").fetchone()[0] == "sent"
    run_until_quiet(chain, db)
    check_invariants(chain, db, [users[0]["public"]])
    assert db.execute("SELECT count(*) FROM paygate.lineages WHERE purpose = 'charge_batch'").fetchone()[0] == 1
    assert chain.tick("reconciler", "--once").code == 0  # the report vouches only for checked accounts
    assert run_cli("reconcile-report", "--format", "json", environ=chain.environ).code == 0


def test_the_takeover_engine_holds_no_key_and_refuses_to_allocate_or_sign(chain: ChainEnv,
                                                                          db: psycopg.Connection) -> None:
    import logging

    from paygate_cli.context import TickContext
    from paygate_cli.db.connect import connect
    from paygate_cli.errors import ConfigError
    from paygate_cli.journal import lineage as lineages
    from paygate_cli.journal.engine import Allocation, Engine, SigningRefused
    from paygate_cli.settings import load_settings

    lanes = sorted(pair["public"] for pair in chain.genesis["lanes"])
    lineages.sync_lanes(db, lanes)  # what the signing workers' Engine.for_tick registers
    db.execute("UPDATE paygate.lanes SET status = 'retired', drained_at = now(), drained_by = 'test' "
               "WHERE address = %s", (lanes[0],))
    with db.transaction():  # a lineage some signing worker allocated: a take-over must never sign it
        lineage_id, lane = lineages.allocate(db, purpose="deposit", entitlement="deposit:1:deposit",
                                             lanes=lanes[1:])
    settings = load_settings(recovery_environ(chain.environ))
    with connect(settings, "test-takeover") as conn:
        ctx = TickContext(conn=conn, settings=settings, worker="recovery", instance_id="test", slot=0, batch=50,
                          log=logging.getLogger("recovery"))
        with pytest.raises(ConfigError, match="lane keys are not configured"):
            Engine.for_tick(ctx)  # the signing engine: recovery is not given what it needs
        engine = Engine.for_takeover(ctx)
        try:
            assert engine.lanes == lanes[1:]  # the registered lanes, not the retired one
            # Signing is prepare + send_prepared: each refuses, for one unit as for none.
            with pytest.raises(SigningRefused, match="prepare on a take-over engine"):
                engine.prepare(None, Allocation(lineage_id, lane, None))
            with pytest.raises(SigningRefused, match="send_prepared on a take-over engine"):
                engine.send_prepared([])
            # Allocating is allocate_many: for one row as for a tick's, and for none.
            with pytest.raises(SigningRefused, match="allocate_many on a take-over engine"):
                engine.allocate_many([None], ["deposit:2:deposit"])
            with pytest.raises(SigningRefused, match="allocate_many"):
                engine.allocate_many([], [])
            with pytest.raises(SigningRefused, match="the signer"):
                _ = engine.signer  # whatever else reaches for a key refuses too
            # It still drives: the allocated lineage was never anchored, so it is abandoned (no key needed).
            assert engine.drive(None, engine.load(lineage_id)) == "abandoned"
        finally:
            engine.chain.close()
    assert db.execute("SELECT entitlement, state, envelope IS NULL FROM paygate.lineages").fetchall() == [
        ("deposit:1:deposit", "abandoned", True)]
