"""Least privilege: `paygate migrate --roles` grants the runtime and read-only roles exactly
what the table of decisions (db/privileges.py) says, table by table; every table in the database is
classified; the read-only commands work as the read-only role and any write as it exits 77."""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from paygate_cli.db.privileges import BY_TABLE, GRANTS, READONLY_ROLE, RUNTIME_ROLE, USER_TABLES_SQL, TableGrant
from paygate_cli.errors import ExitCode
from tests.support.cli import run_cli
from tests.support.pg import PgServer
from tests.support.roles import as_role

INSUFFICIENT_PRIVILEGE = "42501"


@pytest.fixture(scope="module")
def roles_dsn(pg_server: PgServer) -> Iterator[str]:
    """One migrated database with both roles granted, shared by the per-table checks (read-only use:
    every probe rolls back)."""
    database = pg_server.create_database()
    result = run_cli("migrate", "--roles", "--json", dsn=database)
    assert result.code == 0, result.err
    assert json.loads(result.out)["migrate"]["roles"]["unclassified_tables"] == []
    yield database
    pg_server.drop_database(database)


def probes(grant: TableGrant, columns: list[str]) -> dict[str, sql.Composed]:
    """One statement per privilege that needs exactly that privilege and changes nothing (WHERE false,
    or an insert that fails on a constraint after the privilege check, rolled back anyway)."""
    table = sql.Identifier(grant.schema, grant.name)
    first = sql.Identifier(columns[0])  # an ordinary column (an identity column refuses any SET)
    return {
        "SELECT": sql.SQL("SELECT * FROM {} LIMIT 0").format(table),
        "INSERT": sql.SQL("INSERT INTO {} DEFAULT VALUES").format(table),
        "UPDATE": sql.SQL("UPDATE {} SET {} = {} WHERE false").format(table, first, first),
        "DELETE": sql.SQL("DELETE FROM {} WHERE false").format(table),
        "TRUNCATE": sql.SQL("TRUNCATE {}").format(table),
    }


def attempt(conn: psycopg.Connection, statement: sql.Composed) -> str | None:
    """Run `statement` in a transaction that is always rolled back. -> None when it ran, else its
    SQLSTATE (42501 is a privilege refusal; a constraint violation means the privilege was there)."""
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(statement)
    except psycopg.Error as exc:
        return exc.sqlstate or "?"
    return None


def check_table(dsn: str, role: str, grant: TableGrant, allowed: set[str]) -> list[str]:
    wrong = []
    with psycopg.connect(as_role(dsn, role), autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone()[0] == role
        columns = [r[0] for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
            "AND attidentity = '' AND attgenerated = '' ORDER BY attnum", (grant.table,))]
        for privilege, statement in probes(grant, columns).items():
            state = attempt(conn, statement)
            if privilege in allowed and state == INSUFFICIENT_PRIVILEGE:
                wrong.append(f"{privilege} refused but the table of decisions grants it")
            elif privilege in allowed and state is not None and not state.startswith("23"):
                wrong.append(f"{privilege} failed with {state}, not a constraint violation")
            elif privilege not in allowed and state != INSUFFICIENT_PRIVILEGE:
                wrong.append(f"{privilege} was not refused (got {state or 'success'})")
    return wrong


def test_every_table_in_the_database_is_classified(dsn: str) -> None:
    """A table added by any migration, in schema paygate or any other (paygate_archive, ...), fails
    here until db/privileges.py says what each role may do with it; a stale entry fails too."""
    with psycopg.connect(dsn) as conn:
        present = [r[0] for r in conn.execute(USER_TABLES_SQL)]
    assert present, "the migrated database has no tables?"
    unclassified = [t for t in present if t not in BY_TABLE]
    assert not unclassified, f"classify these tables in src/paygate_cli/db/privileges.py: {unclassified}"
    stale = [t for t in BY_TABLE if t not in present]
    assert not stale, f"db/privileges.py lists tables no migration creates: {stale}"


def test_a_new_unclassified_table_gets_nothing_and_is_named(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as owner:
        owner.execute("CREATE SCHEMA IF NOT EXISTS paygate_archive")  # the baseline creates it
        owner.execute("CREATE TABLE paygate_archive.charges_old (id int)")
        owner.execute("CREATE TABLE paygate.newcomer (id int)")
    result = run_cli("migrate", "--roles", "--json", dsn=dsn)
    assert result.code == 0, result.err
    assert json.loads(result.out)["migrate"]["roles"]["unclassified_tables"] == [
        "paygate.newcomer", "paygate_archive.charges_old"]
    assert "paygate.newcomer, paygate_archive.charges_old" in result.err  # warned, not silent
    for role in (RUNTIME_ROLE, READONLY_ROLE):
        with psycopg.connect(as_role(dsn, role), autocommit=True) as conn:
            for table in ("paygate.newcomer", "paygate_archive.charges_old"):
                assert attempt(conn, sql.SQL("SELECT * FROM {}").format(
                    sql.Identifier(*table.split(".")))) == INSUFFICIENT_PRIVILEGE


def test_the_table_of_decisions_is_well_formed() -> None:
    assert len(BY_TABLE) == len(GRANTS), "a table is listed twice"
    for grant in GRANTS:
        assert grant.why.strip(), f"{grant.table}: say why"
        assert "." in grant.table
    # docs/architecture.md §2: audit_log is INSERT/SELECT only; schema_migrations is read-only for both roles.
    assert BY_TABLE["paygate.audit_log"].runtime == ("SELECT", "INSERT")
    assert BY_TABLE["paygate.schema_migrations"].runtime == ("SELECT",)
    assert not BY_TABLE["paygate.webhook_endpoints"].readonly  # customers' HMAC secrets


@pytest.mark.parametrize("grant", GRANTS, ids=[g.table for g in GRANTS])
def test_runtime_role_gets_exactly_its_grants(roles_dsn: str, grant: TableGrant) -> None:
    assert check_table(roles_dsn, RUNTIME_ROLE, grant, set(grant.runtime)) == []


@pytest.mark.parametrize("grant", GRANTS, ids=[g.table for g in GRANTS])
def test_readonly_role_may_only_read(roles_dsn: str, grant: TableGrant) -> None:
    assert check_table(roles_dsn, READONLY_ROLE, grant, {"SELECT"} if grant.readonly else set()) == []


@pytest.mark.parametrize("role", [RUNTIME_ROLE, READONLY_ROLE])
@pytest.mark.parametrize("statement", [
    "CREATE TABLE paygate.sneaky (id int)",
    "CREATE SCHEMA sneaky",
    "DROP TABLE paygate.halts",
    "ALTER TABLE paygate.halts ADD COLUMN x int",
    "CREATE INDEX ON paygate.halts (reason)",
    "CREATE FUNCTION paygate.sneaky() RETURNS int LANGUAGE sql AS 'SELECT 1'",
])
def test_no_ddl_for_either_role(roles_dsn: str, role: str, statement: str) -> None:
    with psycopg.connect(as_role(roles_dsn, role), autocommit=True) as conn:
        assert attempt(conn, sql.SQL(statement)) == INSUFFICIENT_PRIVILEGE  # type: ignore[arg-type]


def test_readonly_cannot_write_through_the_admission_functions(roles_dsn: str) -> None:
    """EXECUTE is open, but the functions run with the caller's rights: the table grants still hold."""
    with psycopg.connect(as_role(roles_dsn, READONLY_ROLE), autocommit=True) as conn:
        assert attempt(conn, sql.SQL("SELECT paygate.emit_event('probe', '{}'::jsonb)")) == INSUFFICIENT_PRIVILEGE


def test_roles_refresh_is_idempotent_and_revokes_extra_grants(dsn: str) -> None:
    assert run_cli("migrate", "--roles", dsn=dsn).code == 0
    with psycopg.connect(dsn, autocommit=True) as owner:  # someone granted by hand
        owner.execute(f"GRANT DELETE, TRUNCATE ON paygate.lineages TO {RUNTIME_ROLE}")
        owner.execute(f"GRANT INSERT ON paygate.halts TO {READONLY_ROLE}")
    assert run_cli("migrate", "--roles", dsn=dsn).code == 0
    assert check_table(dsn, RUNTIME_ROLE, BY_TABLE["paygate.lineages"], set(BY_TABLE["paygate.lineages"].runtime)) == []
    assert check_table(dsn, READONLY_ROLE, BY_TABLE["paygate.halts"], {"SELECT"}) == []


def test_role_names_are_flags_and_must_differ(dsn: str) -> None:
    result = run_cli("migrate", "--roles", "--role-name", "rt_custom", "--readonly-role-name", "ro_custom",
                     "--json", dsn=dsn)
    assert result.code == 0, result.err
    roles = json.loads(result.out)["migrate"]["roles"]
    assert (roles["runtime_role"], roles["readonly_role"]) == ("rt_custom", "ro_custom")
    assert check_table(dsn, "ro_custom", BY_TABLE["paygate.charges"], {"SELECT"}) == []
    reserved = run_cli("migrate", "--roles", "--role-name", "pg_runtime", dsn=dsn)
    assert reserved.code == ExitCode.CONFIG and "reserved" in reserved.err
    same = run_cli("migrate", "--roles", "--role-name", "x_same", "--readonly-role-name", "x_same", dsn=dsn)
    assert same.code == ExitCode.CONFIG


def test_operator_write_commands_work_as_the_runtime_role(dsn: str, db: psycopg.Connection) -> None:
    """drain/undrain, halt/resume, replay and recover-check are the operator's writes: the runtime role covers them
    (each audited), while the read-only role is refused (tests/db/test_roles_workers.py)."""
    from tests.support.webhooks import dead_webhook

    assert run_cli("migrate", "--roles", dsn=dsn).code == 0
    outbox_id = dead_webhook(db, "http://127.0.0.1:9/h")
    runtime = as_role(dsn, RUNTIME_ROLE)
    for args in [("halt", "--reason", "probe", "--yes"), ("resume", "--yes"),
                 ("drain", "--instance", "host-a", "--force", "--reason", "probe", "--yes"),
                 ("undrain", "--instance", "host-a", "--yes"),
                 ("replay", "webhooks", str(outbox_id), "--yes"), ("recover-check", "--yes")]:
        if args[0] == "recover-check":  # a clean pass lifts the restore halt and records the identity
            db.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('restore', 'probe', 'test')")
        result = run_cli(*args, dsn=runtime)
        assert result.code == 0, (args, result.err)
    status = db.execute("SELECT status FROM paygate.webhook_outbox WHERE id = %s", (outbox_id,)).fetchone()[0]
    assert status == "pending"
    assert db.execute("SELECT count(*) FROM paygate.halts WHERE kind = 'restore'").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM paygate.audit_log").fetchone()[0] >= 5
