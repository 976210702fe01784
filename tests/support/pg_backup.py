"""Real backups of a test database and real restores of them, with the server's own client tools
(`pg_dump -Fc`, `pg_restore`) from the same binaries as the private cluster (sandbox/pg_cluster.py):
what an operator's backup job and restore procedure do, for the disaster-recovery drills
(tests/chaos/dr.py) and the restore runbook's scenario (tests/test_runbooks.py)."""

from __future__ import annotations

import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from paygate_cli.sandbox.pg_cluster import find_bindir
from tests.support.pg import PgServer, with_dbname


@dataclass
class Dump:
    path: Path
    seconds: float  # how long pg_dump took (the database was under load meanwhile)
    size: int


def _tool(name: str, *args: str, timeout: float = 120) -> None:
    result = subprocess.run([str(find_bindir() / name), *args], capture_output=True, text=True, timeout=timeout,
                            stdin=subprocess.DEVNULL, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{name} exited {result.returncode}: {result.stderr.strip()[-2000:]}")


def take_dump(dsn: str, path: Path) -> Dump:
    """`pg_dump -Fc` of the database at `dsn`: one consistent snapshot (a REPEATABLE READ transaction),
    taken while other sessions keep committing, as a nightly backup is."""
    started = time.monotonic()
    _tool("pg_dump", "--format=custom", "--no-owner", f"--file={path}", f"--dbname={dsn}")
    return Dump(path, time.monotonic() - started, path.stat().st_size)


def database_oid(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return oid_of(conn)


def restore_over(dsn: str, dump: Path, *, keep_old_as: str | None = None) -> str:
    """Restore `dump` under the database name of `dsn`, as an operator restoring a lost database does
    (the service's configuration names the database, so the name stays): every session of the old
    database is ended, the old database is renamed `keep_old_as` (the drills read what it lost
    from it; nothing of paygate's is configured with that name) or, without one, dropped as the
    disaster would have it; a new database is created under the old name (a new OID) and the dump
    restored into it. -> `dsn` (the same string)."""
    name = conninfo_to_dict(dsn)["dbname"]
    admin = make_conninfo(dsn, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(sql.Identifier(name)))
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> "
                     "pg_backend_pid()", (name,))
        for _ in range(100):  # terminated sessions leave asynchronously
            if not conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)).fetchone()[0]:
                break
            time.sleep(0.1)
        if keep_old_as is None:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
        else:
            conn.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(name),
                                                                         sql.Identifier(keep_old_as)))
            conn.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(
                sql.Identifier(keep_old_as)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    _tool("pg_restore", "--exit-on-error", "--no-owner", f"--dbname={dsn}", str(dump))
    return dsn


def restored_copy(pg_server: PgServer, dsn: str, directory: Path) -> str:
    """`dsn`'s database dumped and restored into a new database of the same server, as an operator
    restoring last night's backup beside the live one: the same rows (the db_identity row included),
    a new database OID. -> the copy's DSN (the caller drops it: pg_server.drop_database)."""
    dump = take_dump(dsn, directory / f"backup-{uuid.uuid4().hex[:8]}.dump")
    name = f"r_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
    target = with_dbname(pg_server.admin_dsn, name)
    _tool("pg_restore", "--no-owner", "--exit-on-error", f"--dbname={target}", str(dump.path))
    return target


def oid_of(conn: psycopg.Connection) -> int:
    return int(conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0])
