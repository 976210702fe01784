"""status readiness, halt/resume with audit entries, workers listing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from paygate_cli.catalogue import WORKERS
from paygate_cli.db.locks import LOCK_NAMESPACE
from paygate_cli.errors import ExitCode
from tests.support.chain_env import chain_environ
from tests.support.cli import run_cli
from tests.support.devnet_support import DevnetHandle, start_devnet


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path_factory.mktemp("devnet"), lanes=1, users=1)
    yield handle
    handle.stop()


@pytest.fixture
def configured(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> dict[str, str]:
    """Everything the money movers need: RPC, contracts, lane, fee and journal keys."""
    return chain_environ(devnet, dsn, tmp_path / "keys")


def status(dsn: str, environ: dict[str, str] | None = None) -> tuple[int, dict]:
    result = run_cli("status", "--json", dsn=dsn, environ=environ)
    return result.code, json.loads(result.out)["status"] if result.out else {}


def test_status_ready_on_a_migrated_and_configured_deployment(dsn: str, configured: dict[str, str]) -> None:
    code, report = status(dsn, configured)
    assert code == 0 and report["ready"] is True, report["problems"]
    assert report["cannot_work"] == []
    assert report["schema"]["schema_version"] == report["schema"]["expected_version"] >= 1
    assert {q["queue"] for q in report["queues"]} >= {"webhooks.pending", "webhooks.dead", "idempotency.expired"}


def test_status_not_ready_when_schema_is_behind(empty_dsn: str) -> None:
    code, report = status(empty_dsn)
    assert code == ExitCode.FAILED and report["ready"] is False
    assert "schema behind" in report["problems"][0]


def test_halt_shows_in_status_and_resume_clears_it_with_audit(dsn: str, db: psycopg.Connection,
                                                              configured: dict[str, str]) -> None:
    assert run_cli("halt", "--reason", "incident 42", "--yes", dsn=dsn, PAYGATE_OPERATOR="alice").code == 0
    code, report = status(dsn, configured)
    assert code == ExitCode.FAILED and report["halts"][0]["reason"] == "incident 42"
    assert report["halts"][0]["set_by"] == "alice"
    assert run_cli("resume", "--yes", dsn=dsn, PAYGATE_OPERATOR="bob").code == 0
    assert status(dsn, configured)[0] == 0
    audit = db.execute("SELECT actor, action, details->>'reason' FROM paygate.audit_log ORDER BY id").fetchall()
    assert audit == [("alice", "halt", "incident 42"), ("bob", "resume", None)]


def test_resume_never_clears_the_gas_halt(dsn: str, db: psycopg.Connection) -> None:
    db.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('gas', 'fee account low', 'gas')")
    result = run_cli("resume", "--yes", "--json", dsn=dsn)
    assert result.code == 0
    assert json.loads(result.out)["resume"]["remaining_halts"][0]["kind"] == "gas"
    assert db.execute("SELECT count(*) FROM paygate.halts WHERE kind = 'gas'").fetchone()[0] == 1


def test_halt_dry_run_writes_nothing(dsn: str, db: psycopg.Connection) -> None:
    result = run_cli("halt", "--reason", "x", "--dry-run", dsn=dsn)
    assert result.code == 0
    assert db.execute("SELECT count(*) FROM paygate.halts").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM paygate.audit_log").fetchone()[0] == 0


def test_status_lists_lock_holders_and_last_success(dsn: str) -> None:
    assert run_cli("run-tick", "webhooks", dsn=dsn).code == 0
    _, report = status(dsn)
    webhooks = next(w for w in report["workers"] if w["worker"] == "webhooks")
    assert webhooks["last_outcome"] == "ok" and webhooks["last_success"] is not None


def test_workers_lists_lock_ids_cadence_and_last_runs(dsn: str) -> None:
    run_cli("run-tick", "idempotency_sweep", dsn=dsn)
    document = json.loads(run_cli("workers", "--json", dsn=dsn).out)
    sweep = next(w for w in document["workers"] if w["worker"] == "idempotency_sweep")
    assert sweep["cadence_s"] == 3600 and sweep["batch"] == 1000 and sweep["last_outcome"] == "ok"
    assert sweep["lock"] == f"({document['lock_namespace']}, 1100)"


def test_status_human_output_says_ready(dsn: str, configured: dict[str, str]) -> None:
    result = run_cli("status", environ=configured)
    assert result.code == 0 and result.out.startswith("READY")


def test_status_not_ready_when_the_money_movers_cannot_start(dsn: str, configured: dict[str, str]) -> None:
    """Judged by the workers' heartbeats, not by the settings of the shell running `status`: a
    shell with nothing configured sees a fleet that has not failed as ready."""
    code, report = status(dsn)  # a migrated database, nothing else configured, no worker ran
    assert code == 0 and report["ready"] is True and report["cannot_work"] == [], report["problems"]
    without_keys = {k: v for k, v in configured.items() if k != "PAYGATE_LANE_SECRETS_FILE"}
    signers = sorted(name for name, spec in WORKERS.items() if "lane_keys" in spec.requires)
    assert {"funding", "settlement"} <= set(signers)
    for name in signers:  # each exits 78 and leaves its "cannot start" heartbeat
        assert run_cli("run-tick", name, environ=without_keys).code == ExitCode.CONFIG
    code, report = status(dsn)
    assert code == ExitCode.FAILED
    assert [w["worker"] for w in report["cannot_work"]] == signers
    assert sorted(p for p in report["problems"] if "cannot start" in p) == [
        f"{name} last run error: cannot start: {name} cannot work: missing lane keys (PAYGATE_LANE_SECRETS_FILE)"
        for name in signers]
    human = run_cli("status", dsn=dsn)
    assert human.out.startswith("NOT READY: funding last run error: cannot start: funding cannot work: "
                                "missing lane keys (PAYGATE_LANE_SECRETS_FILE)"), human.out


def test_status_not_ready_when_a_worker_last_stalled(dsn: str, db: psycopg.Connection,
                                                    configured: dict[str, str]) -> None:
    db.execute("INSERT INTO paygate.worker_runs (worker, instance_id, slot, pid, started_at, finished_at, outcome,"
               " error) VALUES ('settlement', 'h1', 0, 1, now() - interval '3 s', now() - interval '2 s', 'ok', NULL),"
               " ('settlement', 'h1', 1, 2, now() - interval '2 s', now(), 'stalled', 'no free lane for 30s')")
    code, report = status(dsn, configured)
    assert code == ExitCode.FAILED
    assert report["problems"] == ["settlement stalled: no free lane for 30s"]
    settlement = next(w for w in report["workers"] if w["worker"] == "settlement")
    assert settlement["stalled_reason"] == "no free lane for 30s"
    db.execute("INSERT INTO paygate.worker_runs (worker, instance_id, slot, pid, finished_at, outcome)"
               " VALUES ('settlement', 'h1', 0, 3, now() + interval '1 s', 'ok')")
    assert status(dsn, configured)[0] == 0  # the next finished run moved work again


def test_status_lists_only_this_databases_lock_holders(dsn: str, empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as elsewhere, psycopg.connect(dsn, autocommit=True) as here:
        elsewhere.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_NAMESPACE, 1200))  # webhooks slot 0, other db
        _, report = status(dsn)
        assert report["locks"] == []
        here.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_NAMESPACE, 1100))  # idempotency_sweep, this db
        _, report = status(dsn)
        assert [(lock["lock"], lock["slot"]) for lock in report["locks"]] == [("idempotency_sweep", 0)]


def test_status_not_ready_when_no_lane_or_no_instance_can_take_new_work(dsn: str, configured: dict[str, str],
                                                                         db: psycopg.Connection) -> None:
    """One drained lane or host is deliberate (shown, ready); none left to take new work is not."""
    lanes = ["G" + c * 55 for c in "AB"]
    db.execute("INSERT INTO paygate.lanes (address) SELECT unnest(%s::text[])", (lanes,))
    db.execute("INSERT INTO paygate.instances (instance_id) VALUES ('host-a'), ('host-b')")
    db.execute("INSERT INTO paygate.instances (instance_id, last_seen, drained_at, drained_by)"
               " VALUES ('host-gone', now() - interval '2 days', now(), 'op')")  # out of service: not capacity
    drain_lane = "UPDATE paygate.lanes SET status = 'drained', drained_at = now(), drained_by = 'op' WHERE address = %s"
    drain_host = "UPDATE paygate.instances SET drained_at = now(), drained_by = 'op' WHERE instance_id = %s"
    db.execute(drain_lane, (lanes[0],))
    db.execute(drain_host, ("host-a",))
    code, report = status(dsn, configured)
    assert code == 0 and report["ready"] is True, report["problems"]
    assert len(report["drains"]) == 3

    db.execute(drain_lane, (lanes[1],))
    code, report = status(dsn, configured)
    assert code == ExitCode.FAILED
    assert report["problems"] == ["no lane can be allocated: all 2 registered lane(s) are drained or fenced "
                                  "(see `paygate nonce-inspect`)"]
    db.execute("UPDATE paygate.lanes SET status = 'active', drained_at = NULL, drained_by = NULL")
    db.execute(drain_host, ("host-b",))
    code, report = status(dsn, configured)
    assert code == ExitCode.FAILED
    assert report["problems"] == ["every instance is drained: none of the 2 host(s) that ticked in the last "
                                  "hour takes new work (`paygate undrain --instance ID`)"]
