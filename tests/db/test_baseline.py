"""One readable schema: sql/0001_baseline.sql plus sql/functions/*.sql, the function files a
repeatable migration: applied when new or changed, never otherwise."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import psycopg
import pytest

from paygate_cli.db.migrate import SQL_DIR, available_functions, available_migrations, migrate, shipped_version
from paygate_cli.errors import ExitCode, NeedsHuman
from tests.support.cli import run_cli

ROOT = Path(__file__).resolve().parents[2]

HOT_COLUMNS_SQL = """
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum
"""


def test_the_archived_journal_has_every_column_of_the_hot_one_and_when_it_moved(db: psycopg.Connection) -> None:
    # Retention copies lineages row by row into the archive: a column added to one table and not the
    # other would fail the copy (or lose evidence), so the baseline makes the archive LIKE the hot table
    # and every later migration that adds a column adds it to both (retention copies by name: order is free).
    hot = db.execute(HOT_COLUMNS_SQL, ("paygate.lineages",)).fetchall()
    archive = db.execute(HOT_COLUMNS_SQL, ("paygate_archive.lineages",)).fetchall()
    assert sorted(archive) == sorted([*hot, ("archived_at", "timestamp with time zone")])


# -- the repeatable migration of sql/functions --------------------------------------------------

def _recorded(conn: psycopg.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT name, checksum FROM paygate.schema_functions").fetchall())


def test_a_fresh_migrate_applies_the_baseline_and_every_function(empty_dsn: str) -> None:
    first = run_cli("migrate", "--json", dsn=empty_dsn)
    assert first.code == 0, first.err
    result = json.loads(first.out)["migrate"]
    shipped = {f.name: f.checksum for f in available_functions()}
    assert result["applied"] == [f"{m.version:04d}_{m.name}" for m in available_migrations()]
    assert result["applied"][0] == "0001_baseline"
    assert sorted(result["functions_applied"]) == sorted(shipped)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert _recorded(conn) == shipped
        defined = {row[0] for row in conn.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'paygate'::regnamespace")}
    assert defined == set(shipped)


def test_migrate_twice_is_a_no_op_and_dry_run_says_nothing_to_do(dsn: str) -> None:
    again = run_cli("migrate", "--json", dsn=dsn)
    assert again.code == 0, again.err
    result = json.loads(again.out)["migrate"]
    assert result["applied"] == [] and result["functions_applied"] == [] and result["functions_forgotten"] == []
    dry = run_cli("migrate", "--dry-run", dsn=dsn)
    assert dry.code == 0, dry.err
    assert "nothing to do" in dry.out + dry.err


def _sql_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "sql"
    shutil.copytree(SQL_DIR, copy)
    return copy


def test_a_changed_function_file_is_reapplied_and_an_unchanged_one_is_not(db: psycopg.Connection,
                                                                          tmp_path: Path) -> None:
    sql_dir = _sql_copy(tmp_path)
    path = sql_dir / "functions" / "idempotency_ttl_problem.sql"
    path.write_text(path.read_text().replace("at most 366 days", "at most 366 days (edited)"))
    before = dict(db.execute("SELECT name, applied_at FROM paygate.schema_functions").fetchall())
    planned = migrate(db, dry_run=True, sql_dir=sql_dir)
    assert planned["functions_pending"] == ["idempotency_ttl_problem"] and planned["pending"] == []
    result = migrate(db, sql_dir=sql_dir)
    assert result["functions_applied"] == ["idempotency_ttl_problem"] and result["applied"] == []
    assert db.execute("SELECT paygate.idempotency_ttl_problem(interval '0')").fetchone()[0].endswith("(edited)")
    recorded = _recorded(db)
    assert recorded["idempotency_ttl_problem"] == {f.name: f.checksum for f in available_functions(sql_dir)}[
        "idempotency_ttl_problem"]
    after = dict(db.execute("SELECT name, applied_at FROM paygate.schema_functions").fetchall())
    assert {name for name in after if after[name] != before[name]} == {"idempotency_ttl_problem"}
    assert migrate(db, sql_dir=sql_dir)["functions_applied"] == []


def test_a_tick_refuses_to_run_while_the_functions_are_not_this_builds(dsn: str, db: psycopg.Connection) -> None:
    db.execute("UPDATE paygate.schema_functions SET checksum = repeat('0', 64) WHERE name = 'emit_event'")
    result = run_cli("run-tick", "idempotency_sweep", dsn=dsn)
    assert result.code == ExitCode.CONFIG, result.err
    assert "SQL functions are not this build's" in result.err
    assert db.execute("SELECT count(*) FROM paygate.worker_runs").fetchone()[0] == 0
    assert run_cli("migrate", dsn=dsn).code == 0
    assert run_cli("run-tick", "idempotency_sweep", dsn=dsn).code == 0


def test_a_signature_changed_without_a_drop_is_refused(db: psycopg.Connection, tmp_path: Path) -> None:
    sql_dir = _sql_copy(tmp_path)
    path = sql_dir / "functions" / "idempotency_ttl_problem.sql"
    path.write_text(path.read_text().replace("(p_ttl interval)", "(p_ttl interval, p_extra integer DEFAULT 0)"))
    with pytest.raises(NeedsHuman, match="more than one signature"):
        migrate(db, sql_dir=sql_dir)
    assert db.execute("SELECT count(*) FROM pg_proc WHERE proname = 'idempotency_ttl_problem'").fetchone()[0] == 1


def test_a_changed_baseline_is_refused(db: psycopg.Connection, tmp_path: Path) -> None:
    sql_dir = _sql_copy(tmp_path)
    baseline = sql_dir / "0001_baseline.sql"
    baseline.write_text(baseline.read_text() + "\n-- an edit after it was applied\n")
    with pytest.raises(NeedsHuman, match="0001_baseline was changed after it was applied"):
        migrate(db, sql_dir=sql_dir)


def test_status_says_the_functions_are_behind(dsn: str, db: psycopg.Connection) -> None:
    db.execute("UPDATE paygate.schema_functions SET checksum = repeat('0', 64) WHERE name = 'emit_event'")
    report = json.loads(run_cli("status", "--json", dsn=dsn).out)["status"]
    assert report["schema"]["functions_pending"] == ["emit_event"]
    assert any("SQL functions are not this build's" in p for p in report["problems"]), report["problems"]


def test_a_database_a_newer_build_migrated_keeps_its_functions(dsn: str, db: psycopg.Connection) -> None:
    newer = shipped_version() + 1
    db.execute("INSERT INTO paygate.schema_migrations (version, name, checksum) VALUES (%s, 'newer', repeat('a', 64))",
               (newer,))
    db.execute("UPDATE paygate.schema_functions SET checksum = repeat('0', 64) WHERE name = 'emit_event'")
    result = migrate(db)
    assert result["newer_than_this_build"] == [newer] and result["functions_applied"] == []
    assert _recorded(db)["emit_event"] == "0" * 64
    assert run_cli("run-tick", "idempotency_sweep", dsn=dsn).code == 0  # a newer schema is accepted, as before


def test_the_record_of_a_function_file_no_longer_shipped_is_forgotten(db: psycopg.Connection) -> None:
    db.execute("INSERT INTO paygate.schema_functions (name, checksum) VALUES ('gone', repeat('0', 64))")
    assert migrate(db, dry_run=True)["functions_forgotten"] == ["gone"]
    result = migrate(db)
    assert result["functions_forgotten"] == ["gone"] and result["functions_applied"] == []
    assert "gone" not in _recorded(db)
