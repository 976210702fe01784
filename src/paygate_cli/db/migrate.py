"""`paygate migrate`: apply sql/NNNN_*.sql in order and (re-)apply sql/functions/<name>.sql whenever
its checksum changed, under an advisory lock, in one transaction. Records each migration's version
and checksum and each function file's checksum; refuses to run when an applied migration changed.
Safe to run from two hosts at once: the second waits for the lock, then finds nothing left to do.

A fresh database, in order: the paygate schema; the function files the schema's DDL uses (marked
`-- before the schema:` on their first line: trigger functions, helpers an index names); the
migrations (0001_baseline.sql holds every table); every other function file. Function files are
applied after the migrations so a changed function may use what a new migration adds.

A function file holds one `CREATE OR REPLACE FUNCTION paygate.<name>` named as the file. A change
of its arguments or result type needs a `DROP FUNCTION IF EXISTS` of the old signature at the top of
the file (CREATE OR REPLACE would add an overload or fail): `migrate` refuses to finish when a
function has two signatures. A function whose file is deleted stays until a migration drops it;
its record is forgotten, so ticks do not wait for it."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from paygate_cli.db.locks import LOCK_NAMESPACE, MIGRATE_KEY
from paygate_cli.db.privileges import BY_TABLE, GRANTS, READONLY_ROLE, RUNTIME_ROLE, SCHEMAS, USER_TABLES_SQL
from paygate_cli.errors import ConfigError, NeedsHuman, SchemaBehind

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.settings import Settings

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
FUNCTIONS_DIR_NAME = "functions"
_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_FUNCTION_FILE_NAME = re.compile(r"^([a-z0-9_]+)\.sql$")
# The first line of a function file the schema's DDL uses (a trigger's function, an index's helper).
BEFORE_SCHEMA_MARK = "-- before the schema:"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path
    checksum: str


@dataclass(frozen=True)
class FunctionFile:
    name: str  # the file's stem: the function it defines, paygate.<name>
    path: Path
    checksum: str
    before_schema: bool


def _require_dir(sql_dir: Path) -> None:
    if not sql_dir.is_dir():
        raise ConfigError(f"migrations directory {sql_dir} is missing (broken install?)")


def available_migrations(sql_dir: Path = SQL_DIR) -> list[Migration]:
    _require_dir(sql_dir)
    found: list[Migration] = []
    for path in sorted(sql_dir.iterdir()):
        match = _MIGRATION_NAME.match(path.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), path,
                                   hashlib.sha256(path.read_bytes()).hexdigest()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ConfigError(f"two migrations share a version number in {sql_dir}")
    return found


def available_functions(sql_dir: Path = SQL_DIR) -> list[FunctionFile]:
    """sql/functions/<name>.sql, by name."""
    functions_dir = sql_dir / FUNCTIONS_DIR_NAME
    if not functions_dir.is_dir():
        raise ConfigError(f"functions directory {functions_dir} is missing (broken install?)")
    found: list[FunctionFile] = []
    for path in sorted(functions_dir.iterdir()):
        match = _FUNCTION_FILE_NAME.match(path.name)
        if match:
            data = path.read_bytes()
            found.append(FunctionFile(match.group(1), path, hashlib.sha256(data).hexdigest(),
                                      data.startswith(BEFORE_SCHEMA_MARK.encode())))
    return found


def functions_digest(checksums: dict[str, str]) -> str:
    """One digest of every function file's checksum: a tick compares this build's with the
    database's in the query that reads the schema version (FUNCTIONS_DIGEST_SQL computes the same)."""
    return hashlib.sha256("".join(f"{name}:{checksums[name]}\n" for name in sorted(checksums)).encode()).hexdigest()


def shipped_version(sql_dir: Path = SQL_DIR) -> int:
    """The highest migration this build ships, from file names alone (no hashing: every cold tick
    asks)."""
    _require_dir(sql_dir)
    return max((int(m.group(1)) for m in map(_MIGRATION_NAME.match, (p.name for p in sql_dir.iterdir())) if m),
               default=0)


# COLLATE "C": the order Python's sorted() gives the same names (file stems, [a-z0-9_]).
FUNCTIONS_DIGEST_SQL = """
SELECT encode(sha256(convert_to(coalesce(string_agg(name || ':' || checksum || chr(10), '' ORDER BY name COLLATE "C"),
                                         ''), 'UTF8')), 'hex')
FROM paygate.schema_functions
"""
SCHEMA_POSITION_SQL = f"""
SELECT (SELECT coalesce(max(version), 0) FROM paygate.schema_migrations), ({FUNCTIONS_DIGEST_SQL})
"""


def schema_position(conn: psycopg.Connection) -> tuple[int, str | None]:
    """The database's schema version (0 when nothing was ever migrated) and the digest of its
    function files' checksums (None then). One round trip on an autocommit connection (a missing
    table is the answer, not an error)."""
    import psycopg

    if not conn.autocommit:
        if not conn.execute(HAS_TABLE_SQL).fetchone()[0]:
            return 0, None
        version, digest = conn.execute(SCHEMA_POSITION_SQL).fetchone()
        return int(version), digest
    try:
        version, digest = conn.execute(SCHEMA_POSITION_SQL).fetchone()
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        return 0, None
    return int(version), digest


def current_version(conn: psycopg.Connection) -> int:
    """The database's schema version; 0 when nothing was ever migrated."""
    return schema_position(conn)[0]


def schema_behind_message(current: int, needed: int, conn: psycopg.Connection | None = None) -> str:
    if current == 0:
        # No paygate schema at all: as likely a DSN that reached another database (an empty
        # `postgres://` takes libpq's defaults) as a first deploy. Say so before "run migrate".
        from paygate_cli.db.connect import connection_target, describe_target

        where = describe_target(connection_target(conn)) if conn is not None else "this database"
        return (f"wrong database? {where} has no paygate schema (schema is at version 0, this paygate needs "
                f"{needed}); if it is the right one, run `paygate migrate`")
    return f"schema is at version {current}, this paygate needs {needed}: run `paygate migrate`"


FUNCTIONS_BEHIND_MESSAGE = ("the database's SQL functions are not this build's (sql/functions changed since the "
                            "last `paygate migrate`): run `paygate migrate`")


def require_schema(conn: psycopg.Connection) -> None:
    """Code deployed before `migrate`: say so (78) before anything touches a table that is not
    there yet, instead of failing later as a bug (70) on UndefinedTable. Also 78 while the
    database's functions differ from this build's sql/functions (one digest, read with the
    version): a tick never runs a new build's SQL against an old build's functions. A database
    already migrated past this build (a newer build runs elsewhere) is accepted as before, its
    functions included."""
    needed = shipped_version()
    current, digest = schema_position(conn)
    if current < needed:
        raise SchemaBehind(schema_behind_message(current, needed, conn))
    if current == needed and digest != functions_digest({f.name: f.checksum for f in available_functions()}):
        raise SchemaBehind(FUNCTIONS_BEHIND_MESSAGE)


def explain_missing_object(settings: Settings) -> SchemaBehind | None:
    """After an UndefinedTable/Column/Function: a SchemaBehind when the schema is behind this build
    (then that is the cause), else None (the schema is current: a real bug)."""
    from paygate_cli.db.connect import connect

    try:
        with connect(settings, "schema-check", attempts=1) as conn:
            require_schema(conn)
    except SchemaBehind as exc:
        return exc
    except Exception:  # the original error is the one to report
        return None
    return None


APPLIED_SQL = """
SELECT version, name, checksum FROM paygate.schema_migrations ORDER BY version
"""
HAS_TABLE_SQL = "SELECT to_regclass('paygate.schema_migrations') IS NOT NULL"
RECORD_SQL = """
INSERT INTO paygate.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)
"""
HAS_FUNCTIONS_TABLE_SQL = "SELECT to_regclass('paygate.schema_functions') IS NOT NULL"
RECORDED_FUNCTIONS_SQL = "SELECT name, checksum FROM paygate.schema_functions"
RECORD_FUNCTION_SQL = """
INSERT INTO paygate.schema_functions (name, checksum) VALUES (%s, %s)
ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now(), applied_by = current_user
"""
FORGET_FUNCTIONS_SQL = "DELETE FROM paygate.schema_functions WHERE name = ANY(%s)"
# After the files ran: each file defined its function, and no function has two signatures (a file
# that changed a signature without dropping the old one).
FUNCTION_SIGNATURES_SQL = """
SELECT p.proname, count(*) FROM pg_proc p WHERE p.pronamespace = 'paygate'::regnamespace GROUP BY p.proname
"""
# Session lock on the migrate key: a second `migrate` waits here until the first one finishes.
LOCK_SQL = "SELECT pg_advisory_lock(%s, %s)"
UNLOCK_SQL = "SELECT pg_advisory_unlock(%s, %s)"


def applied_migrations(conn: psycopg.Connection) -> dict[int, tuple[str, str]]:
    if not conn.execute(HAS_TABLE_SQL).fetchone()[0]:
        return {}
    return {row[0]: (row[1], row[2]) for row in conn.execute(APPLIED_SQL)}


def recorded_functions(conn: psycopg.Connection) -> dict[str, str]:
    """Function file name -> checksum as last applied; empty before the first migrate."""
    if not conn.execute(HAS_FUNCTIONS_TABLE_SQL).fetchone()[0]:
        return {}
    return {row[0]: row[1] for row in conn.execute(RECORDED_FUNCTIONS_SQL)}


def check_drift(available: list[Migration], applied: dict[int, tuple[str, str]]) -> None:
    by_version = {m.version: m for m in available}
    for version, (name, checksum) in sorted(applied.items()):
        migration = by_version.get(version)
        if migration is None:
            continue  # applied by newer code; fine as long as nothing here is older and unapplied
        if migration.checksum != checksum:
            raise NeedsHuman(
                f"migration {version:04d}_{name} was changed after it was applied "
                f"(recorded sha256 {checksum[:12]}…, file {migration.checksum[:12]}…); refusing to migrate",
                msgid="migrate.checksum_mismatch",
            )


def _check_function_signatures(conn: psycopg.Connection, functions: list[FunctionFile]) -> None:
    signatures = {row[0]: row[1] for row in conn.execute(FUNCTION_SIGNATURES_SQL)}
    undefined = [f.path.name for f in functions if f.name not in signatures]
    if undefined:
        raise NeedsHuman(f"sql/functions/{', '.join(undefined)} do(es) not define the function named as the file "
                         "(paygate.<file name>); nothing was migrated", msgid="migrate.function_misnamed")
    overloaded = sorted(name for name, count in signatures.items() if count > 1)
    if overloaded:
        raise NeedsHuman(f"function(s) {', '.join(overloaded)} have more than one signature: a function file "
                         "changed its arguments without a DROP FUNCTION IF EXISTS of the old signature; nothing "
                         "was migrated", msgid="migrate.function_overloaded")


def _pending_functions(functions: list[FunctionFile], recorded: dict[str, str]) -> list[FunctionFile]:
    return [f for f in functions if recorded.get(f.name) != f.checksum]


def migrate(conn: psycopg.Connection, *, dry_run: bool = False, sql_dir: Path = SQL_DIR,
            progress: Callable[[int, int, str], None] | None = None) -> dict[str, object]:
    """Apply pending migrations and changed function files, all in one transaction. `progress(done,
    total, name)` is told before each file is run (a long migration shows which one it is in)."""
    available = available_migrations(sql_dir)
    functions = available_functions(sql_dir)
    conn.execute(LOCK_SQL, (LOCK_NAMESPACE, MIGRATE_KEY))
    try:
        applied = applied_migrations(conn)
        check_drift(available, applied)
        pending = [m for m in available if m.version not in applied]
        newest_known = max((m.version for m in available), default=0)
        unknown = sorted(v for v in applied if v > newest_known)
        recorded = recorded_functions(conn)
        # A database a newer build migrated holds that build's functions: an older build never
        # puts its own back (its ticks accept the newer schema, as they accept its tables).
        changed = [] if unknown else _pending_functions(functions, recorded)
        forgotten = [] if unknown else sorted(set(recorded) - {f.name for f in functions})
        if not dry_run and (pending or changed or forgotten):
            steps = [f.path for f in changed if f.before_schema] + [m.path for m in pending] \
                + [f.path for f in changed if not f.before_schema]

            def running(path: Path) -> None:
                if progress is not None:
                    progress(steps.index(path), len(steps), path.name)

            with conn.transaction():
                conn.execute("CREATE SCHEMA IF NOT EXISTS paygate")
                for function in (f for f in changed if f.before_schema):
                    running(function.path)
                    conn.execute(function.path.read_text(encoding="utf-8"))
                for migration in pending:
                    running(migration.path)
                    conn.execute(migration.path.read_text(encoding="utf-8"))
                    conn.execute(RECORD_SQL, (migration.version, migration.name, migration.checksum))
                for function in (f for f in changed if not f.before_schema):
                    running(function.path)
                    conn.execute(function.path.read_text(encoding="utf-8"))
                _check_function_signatures(conn, functions)
                for function in changed:
                    conn.execute(RECORD_FUNCTION_SQL, (function.name, function.checksum))
                if forgotten:
                    conn.execute(FORGET_FUNCTIONS_SQL, (forgotten,))
        names = [f"{m.version:04d}_{m.name}" for m in pending]
        return {
            "applied": [] if dry_run else names,
            "pending": names if dry_run else [],
            "functions_applied": [] if dry_run else [f.name for f in changed],
            "functions_pending": [f.name for f in changed] if dry_run else [],
            "functions_forgotten": forgotten,
            "already_applied": len(applied),
            "schema_version": max([*applied, *(m.version for m in pending if not dry_run)], default=0),
            "newer_than_this_build": unknown,
        }
    finally:
        conn.execute(UNLOCK_SQL, (LOCK_NAMESPACE, MIGRATE_KEY))


def schema_state(conn: psycopg.Connection) -> dict[str, object]:
    """For `status`: current version vs what this build ships, and the function files that differ
    from the database's (when the database is not ahead of this build)."""
    available = available_migrations()
    applied = applied_migrations(conn)
    current, needed = max(applied, default=0), max((m.version for m in available), default=0)
    functions_pending = ([f.name for f in _pending_functions(available_functions(), recorded_functions(conn))]
                         if current == needed else [])
    message = schema_behind_message(current, needed, conn) if current < needed else None
    return {
        "schema_version": current,
        "expected_version": needed,
        "message": message or (FUNCTIONS_BEHIND_MESSAGE if functions_pending else None),
        "pending": [f"{m.version:04d}_{m.name}" for m in available if m.version not in applied],
        "functions_pending": functions_pending,
    }


ROLES_DIR = SQL_DIR / "roles"
_ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def _check_role_name(role: str) -> None:
    if not _ROLE_NAME.fullmatch(role):
        raise ConfigError(f"role name {role!r} must be a lowercase SQL identifier")
    if role.startswith("pg_"):
        raise ConfigError(f"role name {role!r} is reserved: Postgres keeps pg_* names for its own roles")


def _create_role(conn: psycopg.Connection, file_name: str, role: str) -> None:
    from psycopg import sql

    template = (ROLES_DIR / file_name).read_text(encoding="utf-8")
    # The file uses {role} placeholders; Identifier/Literal quoting makes injection impossible.
    conn.execute(sql.SQL(template).format(role=sql.Identifier(role), role_literal=sql.Literal(role)))


def create_roles(conn: psycopg.Connection, runtime: str = RUNTIME_ROLE,
                 readonly: str = READONLY_ROLE) -> dict[str, object]:
    """Create/refresh the runtime and read-only roles (run after each migrate), in one transaction.

    Everything both roles held on tables, sequences and schemas is revoked first, then exactly what
    the table of decisions (db/privileges.py) says is granted. A table present in the database that
    the table does not list gets nothing (fail closed) and is named in the result; a listed table
    the database does not have yet is skipped."""
    from psycopg import sql

    _check_role_name(runtime)
    _check_role_name(readonly)
    if runtime == readonly:
        raise ConfigError("the runtime and read-only roles must be different roles")
    runtime_id, readonly_id = sql.Identifier(runtime), sql.Identifier(readonly)
    with conn.transaction():
        _create_role(conn, "runtime_role.sql", runtime)
        _create_role(conn, "readonly_role.sql", readonly)
        present = [row[0] for row in conn.execute(USER_TABLES_SQL)]
        schemas = list(dict.fromkeys([*SCHEMAS, *(t.split(".", 1)[0] for t in present)]))
        existing = {row[0] for row in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)", (schemas,))}
        for schema in (s for s in schemas if s in existing):
            schema_id = sql.Identifier(schema)
            for role_id in (runtime_id, readonly_id):
                conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM {}").format(schema_id, role_id))
                conn.execute(sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA {} FROM {}").format(schema_id, role_id))
                conn.execute(sql.SQL("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {} FROM {}").format(schema_id, role_id))
            if schema in SCHEMAS:
                conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}, {}").format(schema_id, runtime_id, readonly_id))
        granted: list[str] = []
        for grant in GRANTS:
            if grant.table not in present:
                continue
            table_id = sql.Identifier(grant.schema, grant.name)
            if grant.runtime:
                conn.execute(sql.SQL("GRANT {} ON {} TO {}").format(
                    sql.SQL(", ").join(map(sql.SQL, grant.runtime)), table_id, runtime_id))
            if grant.readonly:
                conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(table_id, readonly_id))
            granted.append(grant.table)
        # Functions run with the caller's rights (none is SECURITY DEFINER): the table grants above
        # decide what a function may touch for either role. Only the runtime role calls them.
        for schema in (s for s in SCHEMAS if s in existing):
            conn.execute(sql.SQL("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {} TO {}").format(
                sql.Identifier(schema), runtime_id))
    return {
        "runtime_role": runtime,
        "readonly_role": readonly,
        "tables_granted": len(granted),
        "unclassified_tables": [t for t in present if t not in BY_TABLE],
    }
