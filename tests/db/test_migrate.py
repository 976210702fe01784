"""Migrations: idempotent, safe when two hosts run them at once, checksum drift refused; the
runtime role's denials."""

from __future__ import annotations

import json
import subprocess

import psycopg
import pytest

from paygate_cli.db.migrate import available_migrations
from paygate_cli.errors import ExitCode
from tests.support.cli import base_environ, paygate_cmd, run_cli


def applied(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT version, checksum FROM paygate.schema_migrations ORDER BY version").fetchall()


def test_migrate_applies_everything_then_nothing(empty_dsn: str) -> None:
    first = run_cli("migrate", "--json", dsn=empty_dsn)
    assert first.code == 0
    expected = [f"{m.version:04d}_{m.name}" for m in available_migrations()]
    assert json.loads(first.out)["migrate"]["applied"] == expected
    second = run_cli("migrate", "--json", dsn=empty_dsn)
    assert second.code == 0 and json.loads(second.out)["migrate"]["applied"] == []
    assert [v for v, _ in applied(empty_dsn)] == [m.version for m in available_migrations()]


def test_dry_run_changes_nothing(empty_dsn: str) -> None:
    result = run_cli("migrate", "--dry-run", "--json", dsn=empty_dsn)
    assert result.code == 0 and json.loads(result.out)["migrate"]["pending"]
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT to_regclass('paygate.schema_migrations')").fetchone()[0] is None


def test_concurrent_migrations_from_two_processes(empty_dsn: str) -> None:
    procs = [subprocess.Popen(paygate_cmd("migrate", "--json"), env=base_environ(empty_dsn),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    applied_lists = [json.loads(out)["migrate"]["applied"] for out, _ in outputs]
    assert sorted(len(a) for a in applied_lists) == [0, 0, len(available_migrations())]
    assert len(applied(empty_dsn)) == len(available_migrations())


def test_changed_applied_migration_is_refused(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE paygate.schema_migrations SET checksum = repeat('0', 64) WHERE version = 1")
    result = run_cli("migrate", dsn=dsn)
    assert result.code == ExitCode.NEEDS_HUMAN
    assert "0001_baseline was changed after it was applied" in result.err


@pytest.fixture
def runtime(dsn: str) -> psycopg.Connection:
    assert run_cli("migrate", "--roles", dsn=dsn).code == 0
    with psycopg.connect(psycopg.conninfo.make_conninfo(dsn, options="-c role=paygate_runtime"),
                         autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone()[0] == "paygate_runtime"
        yield conn


def test_runtime_role_may_insert_and_read_audit_log(runtime: psycopg.Connection) -> None:
    runtime.execute("INSERT INTO paygate.audit_log (actor, action) VALUES ('t', 'probe')")
    assert runtime.execute("SELECT count(*) FROM paygate.audit_log").fetchone()[0] == 1


@pytest.mark.parametrize("statement", [
    "UPDATE paygate.audit_log SET actor = 'x'",
    "DELETE FROM paygate.audit_log",
    "TRUNCATE paygate.audit_log",
    "CREATE TABLE paygate.sneaky (id int)",
    "DROP TABLE paygate.halts",
    "ALTER TABLE paygate.halts ADD COLUMN x int",
    "INSERT INTO paygate.schema_migrations (version, name, checksum) VALUES (999, 'x', repeat('a', 64))",
])
def test_runtime_role_denials(runtime: psycopg.Connection, statement: str) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        runtime.execute(statement)


def test_runtime_role_has_dml_on_operational_tables(runtime: psycopg.Connection) -> None:
    runtime.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('operator', 'r', 't')")
    runtime.execute("UPDATE paygate.halts SET reason = 'r2'")
    runtime.execute("DELETE FROM paygate.halts")


def test_audit_log_is_append_only_even_for_the_owner(db: psycopg.Connection) -> None:
    db.execute("INSERT INTO paygate.audit_log (actor, action) VALUES ('t', 'probe')")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        db.execute("DELETE FROM paygate.audit_log")
