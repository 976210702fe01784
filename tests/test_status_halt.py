"""status readiness, halt/resume with audit entries, workers listing."""

from __future__ import annotations

import json

import psycopg

from paygate_cli.errors import ExitCode
from tests.cli import run_cli


def status(dsn: str) -> tuple[int, dict]:
    result = run_cli("status", "--json", dsn=dsn)
    return result.code, json.loads(result.out)["status"] if result.out else {}


def test_status_ready_on_a_migrated_database(dsn: str) -> None:
    code, report = status(dsn)
    assert code == 0 and report["ready"] is True
    assert report["schema"]["schema_version"] == report["schema"]["expected_version"] >= 1
    assert {q["queue"] for q in report["queues"]} >= {"webhooks.pending", "webhooks.dead", "idempotency.expired"}


def test_status_not_ready_when_schema_is_behind(empty_dsn: str) -> None:
    code, report = status(empty_dsn)
    assert code == ExitCode.FAILED and report["ready"] is False
    assert "schema behind" in report["problems"][0]


def test_halt_shows_in_status_and_resume_clears_it_with_audit(dsn: str, db: psycopg.Connection) -> None:
    assert run_cli("halt", "--reason", "incident 42", "--yes", dsn=dsn, PAYGATE_OPERATOR="alice").code == 0
    code, report = status(dsn)
    assert code == ExitCode.FAILED and report["halts"][0]["reason"] == "incident 42"
    assert report["halts"][0]["set_by"] == "alice"
    assert run_cli("resume", "--yes", dsn=dsn, PAYGATE_OPERATOR="bob").code == 0
    assert status(dsn)[0] == 0
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


def test_status_human_output_says_ready(dsn: str) -> None:
    result = run_cli("status", dsn=dsn)
    assert result.code == 0 and result.out.startswith("READY")
