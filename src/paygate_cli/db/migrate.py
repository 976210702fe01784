"""`paygate migrate`: apply sql/NNNN_*.sql in order under an advisory lock, record version and
checksum, refuse to run when an applied file changed. Safe to run from two hosts at once: the
second waits for the lock, then finds nothing left to do."""

from __future__ import annotations

import hashlib
import re
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
_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path
    checksum: str


def available_migrations(sql_dir: Path = SQL_DIR) -> list[Migration]:
    if not sql_dir.is_dir():
        raise ConfigError(f"migrations directory {sql_dir} is missing (broken install?)")
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


def shipped_version(sql_dir: Path = SQL_DIR) -> int:
    """The highest migration this build ships, from file names alone (no hashing: every cold tick
    asks)."""
    if not sql_dir.is_dir():
        raise ConfigError(f"migrations directory {sql_dir} is missing (broken install?)")
    return max((int(m.group(1)) for m in map(_MIGRATION_NAME.match, (p.name for p in sql_dir.iterdir())) if m),
               default=0)


CURRENT_VERSION_SQL = "SELECT coalesce(max(version), 0) FROM paygate.schema_migrations"


def current_version(conn: psycopg.Connection) -> int:
    """The database's schema version; 0 when nothing was ever migrated. One round trip on an
    autocommit connection (a missing table is the answer, not an error)."""
    import psycopg

    if not conn.autocommit:
        if not conn.execute(HAS_TABLE_SQL).fetchone()[0]:
            return 0
        return int(conn.execute(CURRENT_VERSION_SQL).fetchone()[0])
    try:
        return int(conn.execute(CURRENT_VERSION_SQL).fetchone()[0])
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        return 0


def schema_behind_message(current: int, needed: int, conn: psycopg.Connection | None = None) -> str:
    if current == 0:
        # No paygate schema at all: as likely a DSN that reached another database (an empty
        # `postgres://` takes libpq's defaults) as a first deploy. Say so before "run migrate".
        from paygate_cli.db.connect import connection_target, describe_target

        where = describe_target(connection_target(conn)) if conn is not None else "this database"
        return (f"wrong database? {where} has no paygate schema (schema is at version 0, this paygate needs "
                f"{needed}); if it is the right one, run `paygate migrate`")
    return f"schema is at version {current}, this paygate needs {needed}: run `paygate migrate`"


def require_schema(conn: psycopg.Connection) -> None:
    """Code deployed before `migrate`: say so (78) before anything touches a table that is not
    there yet, instead of failing later as a bug (70) on UndefinedTable."""
    needed = shipped_version()
    current = current_version(conn)
    if current < needed:
        raise SchemaBehind(schema_behind_message(current, needed, conn))


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
# Session lock on the migrate key: a second `migrate` waits here until the first one finishes.
LOCK_SQL = "SELECT pg_advisory_lock(%s, %s)"
UNLOCK_SQL = "SELECT pg_advisory_unlock(%s, %s)"


def applied_migrations(conn: psycopg.Connection) -> dict[int, tuple[str, str]]:
    if not conn.execute(HAS_TABLE_SQL).fetchone()[0]:
        return {}
    return {row[0]: (row[1], row[2]) for row in conn.execute(APPLIED_SQL)}


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


def migrate(conn: psycopg.Connection, *, dry_run: bool = False) -> dict[str, object]:
    """Apply pending migrations; each file and its record commit in one transaction."""
    available = available_migrations()
    conn.execute(LOCK_SQL, (LOCK_NAMESPACE, MIGRATE_KEY))
    try:
        applied = applied_migrations(conn)
        check_drift(available, applied)
        pending = [m for m in available if m.version not in applied]
        newest_known = max((m.version for m in available), default=0)
        unknown = sorted(v for v in applied if v > newest_known)
        done: list[str] = []
        if not dry_run:
            for migration in pending:
                with conn.transaction():
                    conn.execute(migration.path.read_text(encoding="utf-8"))
                    conn.execute(RECORD_SQL, (migration.version, migration.name, migration.checksum))
                done.append(f"{migration.version:04d}_{migration.name}")
        return {
            "applied": done,
            "pending": [f"{m.version:04d}_{m.name}" for m in pending] if dry_run else [],
            "already_applied": len(applied),
            "schema_version": max([*applied, *(m.version for m in pending if not dry_run)], default=0),
            "newer_than_this_build": unknown,
        }
    finally:
        conn.execute(UNLOCK_SQL, (LOCK_NAMESPACE, MIGRATE_KEY))


def schema_state(conn: psycopg.Connection) -> dict[str, object]:
    """For `status`: current version vs what this build ships."""
    available = available_migrations()
    applied = applied_migrations(conn)
    current, needed = max(applied, default=0), max((m.version for m in available), default=0)
    return {
        "schema_version": current,
        "expected_version": needed,
        "message": schema_behind_message(current, needed, conn) if current < needed else None,
        "pending": [f"{m.version:04d}_{m.name}" for m in available if m.version not in applied],
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


def create_runtime_role(conn: psycopg.Connection, role: str = RUNTIME_ROLE) -> None:
    """Kept for callers of the old name: both roles, the runtime one named `role`."""
    create_roles(conn, runtime=role)
