"""The Postgres harness of the tests: PAYGATE_TEST_DSN if set, else one private cluster per test run
from the system binaries (as the postgres user when root, Unix socket in a short /tmp dir, never
TCP). One fresh database per test, cloned from a migrated template."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from paygate_cli.db.migrate import migrate
from paygate_cli.sandbox.pg_cluster import Cluster

TEMPLATE = "paygate_template"


def with_dbname(dsn: str, dbname: str) -> str:
    return make_conninfo(dsn, dbname=dbname)


class PgServer:
    def __init__(self) -> None:
        self.cluster: Cluster | None = None
        self.tmp: str | None = None
        external = os.environ.get("PAYGATE_TEST_DSN")
        if external:
            self.admin_dsn = external
        else:
            self.tmp = tempfile.mkdtemp(prefix="pgw-", dir="/tmp")  # short: the socket path limit
            if os.geteuid() == 0:
                os.chmod(self.tmp, 0o755)  # the postgres user must traverse it
            self.cluster = Cluster.at(Path(self.tmp) / "d")
            self.cluster.init(fast=True)
            self.cluster.start(fast=True)
            self.admin_dsn = self.cluster.dsn("postgres")
        self._make_template()

    def _make_template(self) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {TEMPLATE}")
        with psycopg.connect(with_dbname(self.admin_dsn, TEMPLATE), autocommit=True) as conn:
            migrate(conn)

    def create_database(self, *, migrated: bool = True) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE if migrated else 'template0'}")
        return with_dbname(self.admin_dsn, name)

    def drop_database(self, dsn: str) -> None:
        name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)


@contextmanager
def private_cluster() -> Iterator[Cluster]:
    """A second, throwaway cluster for tests that must stop Postgres under a running tick."""
    tmp = tempfile.mkdtemp(prefix="pgx-", dir="/tmp")
    if os.geteuid() == 0:
        os.chmod(tmp, 0o755)
    cluster = Cluster.at(Path(tmp) / "d")
    cluster.init(fast=True)
    cluster.start(fast=True)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def hand_edit(conn: psycopg.Connection, statement: str, params: tuple[object, ...] = ()) -> None:
    """A superuser's hand edit past every trigger (session_replication_role = replica), e.g. a
    terminal queue row's status that queue_status_guard refuses to a plain statement: how tests
    make the corrupt rows the commands must still refuse to act on."""
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(statement, params)
