"""One readable schema: sql/0001_baseline.sql plus sql/functions/*.sql produce what the migration
chain it replaced produced (catalog compared object by object; every difference is listed in EXPECTED
with its reason), and function files are a repeatable migration: applied when new or changed, never
otherwise."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

from paygate_cli.db.migrate import SQL_DIR, available_functions, migrate
from paygate_cli.errors import ExitCode, NeedsHuman
from tests.support.cli import run_cli
from tests.support.pg import PgServer

ROOT = Path(__file__).resolve().parents[2]
# The last commit holding the chain 0001_foundation.sql … 0022_repeated_rejection.sql.
OLD_CHAIN_COMMIT = "fb1e568348ce1026a0dd7ec4a9f67f4acb7da346"
OLD_CHAIN_DIR = "src/paygate_cli/sql"
SCHEMAS = ["paygate", "paygate_archive"]

# Catalog queries: every object of the paygate schemas with what defines it. Each row starts with
# its identity (IDENTITY gives the length) and then what it is.
CATALOG: dict[str, tuple[int, str]] = {
    "schemas": (1, "SELECT nspname FROM pg_namespace WHERE nspname = ANY(%(s)s)"),
    "relations": (2, """
        SELECT n.nspname, c.relname, c.relkind, c.relpersistence, coalesce(c.reloptions::text, '')
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ANY(%(s)s)"""),
    "columns": (3, """
        SELECT n.nspname, c.relname, a.attname, a.attnum, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               coalesce(pg_get_expr(d.adbin, d.adrelid), ''), a.attidentity, a.attgenerated,
               coalesce(a.attcollation::regcollation::text, '')
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = ANY(%(s)s) AND c.relkind IN ('r', 'v', 'm', 'p') AND a.attnum > 0
          AND NOT a.attisdropped"""),
    "constraints": (3, """
        SELECT n.nspname, c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid), k.condeferrable,
               k.convalidated
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY(%(s)s)"""),
    "indexes": (3, "SELECT schemaname, tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = ANY(%(s)s)"),
    "triggers": (3, """
        SELECT n.nspname, c.relname, t.tgname, pg_get_triggerdef(t.oid), t.tgenabled
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY(%(s)s) AND NOT t.tgisinternal"""),
    "functions": (3, """
        SELECT n.nspname, p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid),
               coalesce(p.proacl::text, '')
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ANY(%(s)s)"""),
    "views": (2, "SELECT schemaname, viewname, definition FROM pg_views WHERE schemaname = ANY(%(s)s)"),
    "sequences": (2, """
        SELECT schemaname, sequencename, data_type::text, start_value, min_value, max_value, increment_by, cycle
        FROM pg_sequences WHERE schemaname = ANY(%(s)s)"""),
    "comments": (3, """
        SELECT n.nspname, c.relname, d.objsubid, d.description FROM pg_description d
        JOIN pg_class c ON c.oid = d.objoid AND d.classoid = 'pg_class'::regclass
        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ANY(%(s)s)"""),
    "types": (2, """
        SELECT n.nspname, t.typname, t.typtype FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = ANY(%(s)s)"""),
    "seeded_rows": (1, """
        SELECT t, (SELECT jsonb_agg(to_jsonb(r) - 'updated_at') FROM paygate.relay_config r)::text
        FROM (VALUES ('relay_config')) v(t)
        UNION ALL SELECT 'relay_fee_totals', (SELECT jsonb_agg(to_jsonb(r) - 'updated_at')
                                              FROM paygate.relay_fee_totals r)::text
        UNION ALL SELECT 'retention_totals', (SELECT jsonb_agg(to_jsonb(r) - 'updated_at')
                                              FROM paygate.retention_totals r)::text"""),
}

Key = tuple[str, ...]


def describe(conn: psycopg.Connection) -> dict[str, dict[Key, tuple[object, ...]]]:
    """category -> identity -> the whole row."""
    described: dict[str, dict[Key, tuple[object, ...]]] = {}
    for category, (identity, query) in CATALOG.items():
        rows = conn.execute(query, {"s": SCHEMAS}).fetchall()
        described[category] = {tuple(str(v) for v in row[:identity]): tuple(row) for row in rows}
    return described


def differences(old: dict[str, dict[Key, tuple[object, ...]]],
                new: dict[str, dict[Key, tuple[object, ...]]]) -> dict[tuple[str, str, Key], str]:
    """(category, 'old only' | 'new only' | 'changed', identity) for every object that differs."""
    found: dict[tuple[str, str, Key], str] = {}
    for category in CATALOG:
        before, after = old[category], new[category]
        for key in before.keys() - after.keys():
            found[(category, "old only", key)] = repr(before[key])
        for key in after.keys() - before.keys():
            found[(category, "new only", key)] = repr(after[key])
        for key in before.keys() & after.keys():
            if before[key] != after[key]:
                found[(category, "changed", key)] = f"{before[key]!r} -> {after[key]!r}"
    return found


def _archive_column(name: str) -> tuple[str, str, Key]:
    return ("columns", "changed", ("paygate_archive", "lineages", name))


# Every way the baseline differs from the chain it replaced, and why.
EXPECTED: dict[tuple[str, str, Key], str] = {
    # The function files' checksums: new bookkeeping of `migrate` (db/migrate.py).
    **{("relations", "new only", ("paygate", name)): "schema_functions"
       for name in ("schema_functions", "schema_functions_pkey")},
    **{("columns", "new only", ("paygate", "schema_functions", name)): "schema_functions"
       for name in ("name", "checksum", "applied_at", "applied_by")},
    **{("constraints", "new only", ("paygate", "schema_functions", name)): "schema_functions"
       for name in ("schema_functions_pkey", "schema_functions_name_check", "schema_functions_checksum_check")},
    ("indexes", "new only", ("paygate", "schema_functions", "schema_functions_pkey")): "schema_functions",
    ("types", "new only", ("paygate", "schema_functions")): "schema_functions",
    ("types", "new only", ("paygate", "_schema_functions")): "schema_functions",
    # paygate_archive.lineages is LIKE the whole hot table now, so archived_at comes last (the chain
    # added it before the columns of 0020 and 0022) and rejected_count keeps the hot column's NOT
    # NULL (retention copies it from a NOT NULL column; it never was NULL). Retention names columns.
    **{_archive_column(name): "archive column order"
       for name in ("parked_at", "parked_reason", "rejected_code", "first_rejected_at", "archived_at")},
    _archive_column("rejected_count"): "archive column order and NOT NULL",
    # The same six kinds, written as a list instead of the array 0022 computed from the catalog.
    ("constraints", "changed", ("paygate", "findings", "findings_kind_check")): "same kinds",
    # Added with the baseline. The live lineage states in one function, which the one-live indexes
    # name (inlined by the planner: the same predicate).
    ("functions", "new only", ("paygate", "lineage_is_live", "state text")): "lineage_is_live",
    **{("indexes", "changed", ("paygate", "lineages", name)): "lineage_is_live(state)"
       for name in ("lineages_one_live_per_lane", "lineages_one_live_per_entitlement")},
    # A terminal deposit, relay or bot job changes status only by replay (tests/db/test_status_guards.py).
    ("functions", "new only", ("paygate", "queue_status_guard", "")): "status guard",
    **{("triggers", "new only", ("paygate", table, f"{row}_status_guard")): "status guard"
       for table, row in (("deposits", "deposit"), ("relays", "relay"), ("bot_jobs", "bot_job"))},
    # Dead since 0011 replaced the trigger that used it by lineage_delete_guard.
    ("functions", "old only", ("paygate", "refuse_delete", "")): "unused",
}


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout


def _old_chain() -> list[str]:
    try:
        names = _git("ls-tree", "--name-only", f"{OLD_CHAIN_COMMIT}:{OLD_CHAIN_DIR}").split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the replaced migration chain is read from git history, which this checkout lacks")
    return [_git("show", f"{OLD_CHAIN_COMMIT}:{OLD_CHAIN_DIR}/{name}")
            for name in sorted(names) if name[:4].isdigit() and name.endswith(".sql")]


def _kinds(constraint: str) -> set[str]:
    if "{" in constraint:  # the chain's ANY ('{a,b}'::text[])
        return set(constraint[constraint.index("{") + 1:constraint.index("}")].split(","))
    return set(re.findall(r"'([a-z_]+)'::text", constraint))  # the baseline's IN ('a', 'b')


def test_baseline_equals_what_the_old_chain_produced(pg_server: PgServer, empty_dsn: str) -> None:
    chain = _old_chain()
    assert len(chain) == 19
    old_dsn = pg_server.create_database(migrated=False)
    try:
        with psycopg.connect(old_dsn, autocommit=True) as conn:
            for text in chain:
                conn.execute(text)
            old = describe(conn)
    finally:
        pg_server.drop_database(old_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrate(conn)
        new = describe(conn)
    found = differences(old, new)
    assert {k: found[k] for k in found.keys() - EXPECTED.keys()} == {}
    assert sorted(EXPECTED.keys() - found.keys()) == []
    kind_check = ("paygate", "findings", "findings_kind_check")
    assert _kinds(str(old["constraints"][kind_check][4])) == _kinds(str(new["constraints"][kind_check][4])) == {
        "balance_drift", "total_drift", "lane_gap", "stuck", "lane_fence", "repeated_rejection"}
    archive = [(row[2], row[4]) for key, row in sorted(new["columns"].items(), key=lambda kv: kv[1][3])
               if key[:2] == ("paygate_archive", "lineages")]
    hot = [(row[2], row[4]) for key, row in sorted(new["columns"].items(), key=lambda kv: kv[1][3])
           if key[:2] == ("paygate", "lineages")]
    assert archive == [*hot, ("archived_at", "timestamp with time zone")]


# -- the repeatable migration of sql/functions --------------------------------------------------

def _recorded(conn: psycopg.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT name, checksum FROM paygate.schema_functions").fetchall())


def test_a_fresh_migrate_applies_the_baseline_and_every_function(empty_dsn: str) -> None:
    first = run_cli("migrate", "--json", dsn=empty_dsn)
    assert first.code == 0, first.err
    result = json.loads(first.out)["migrate"]
    shipped = {f.name: f.checksum for f in available_functions()}
    assert result["applied"] == ["0001_baseline"]
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
    db.execute("INSERT INTO paygate.schema_migrations (version, name, checksum) VALUES (2, 'newer', repeat('a', 64))")
    db.execute("UPDATE paygate.schema_functions SET checksum = repeat('0', 64) WHERE name = 'emit_event'")
    result = migrate(db)
    assert result["newer_than_this_build"] == [2] and result["functions_applied"] == []
    assert _recorded(db)["emit_event"] == "0" * 64
    assert run_cli("run-tick", "idempotency_sweep", dsn=dsn).code == 0  # a newer schema is accepted, as before


def test_the_record_of_a_function_file_no_longer_shipped_is_forgotten(db: psycopg.Connection) -> None:
    db.execute("INSERT INTO paygate.schema_functions (name, checksum) VALUES ('gone', repeat('0', 64))")
    assert migrate(db, dry_run=True)["functions_forgotten"] == ["gone"]
    result = migrate(db)
    assert result["functions_forgotten"] == ["gone"] and result["functions_applied"] == []
    assert "gone" not in _recorded(db)
