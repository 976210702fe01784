"""A restore of a test database into a new database: `pg_dump -Fc` then `pg_restore` with the
cluster's own client tools, as an operator restoring last night's backup does. The same rows
(the db_identity row included), a new database OID: what the restore gate must notice."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import psycopg

from paygate_cli.sandbox.pg_cluster import find_bindir
from tests.support.pg import PgServer, with_dbname


def restored_copy(pg_server: PgServer, dsn: str, directory: Path) -> str:
    """`dsn`'s database dumped and restored into a new database of the same server; its DSN (the
    caller drops it: pg_server.drop_database)."""
    dump = directory / f"backup-{uuid.uuid4().hex[:8]}.dump"
    name = f"r_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE template0")
    target = with_dbname(pg_server.admin_dsn, name)
    for tool, args in (("pg_dump", ["--format=custom", "--no-owner", f"--file={dump}", f"--dbname={dsn}"]),
                       ("pg_restore", ["--no-owner", "--exit-on-error", f"--dbname={target}", str(dump)])):
        done = subprocess.run([str(find_bindir() / tool), *args], capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return target


def oid_of(conn: psycopg.Connection) -> int:
    return int(conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0])
