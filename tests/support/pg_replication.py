"""A primary and an asynchronous streaming standby from the system's PostgreSQL binaries, for the
tests of "no writer", multi-host DSNs and the failover drill.

Both clusters follow the suite's private cluster (tests/support/pg.py, sandbox/pg_cluster.py): run as
the postgres OS user when we are root, Unix sockets only (never TCP), fsync off. Each has its own data
directory and its own socket directory (the data directory itself, short under /tmp), both on the
socket port pg_cluster.SOCKET_PORT: a multi-host DSN lists the two socket directories.

The standby is `pg_basebackup -R` of the primary (wal_level replica and hot_standby are the defaults)
through a physical replication slot, so the primary keeps the WAL a cut-off standby has not received.

    with ReplicatedPair() as pair:             # primary + standby up, database "paygate" migrated
        pair.primary_dsn("paygate")            # libpq keyword DSN of the primary's database
        pair.standby_dsn("paygate")            # the standby's (hot standby: read-only)
        pair.multihost_dsn("paygate")          # host=P,S port=N,N target_session_attrs=read-write
        pair.create_database("other")          # another migrated database, replicated (waits for it)
        pair.wait_caught_up()                  # the standby has replayed everything the primary wrote
        pair.pause_replay(); pair.resume_replay()   # pg_wal_replay_pause()/resume() on the standby
        pair.cut_off()                         # the standby stops receiving WAL (primary_conninfo = ''):
                                               # commits on the primary after this never reach it
        pair.kill_primary()                    # SIGKILL the primary's postmaster (postmaster.pid)
        pair.promote()                         # pg_promote(wait => true): the standby becomes a writer
    # close(): both stopped (a killed primary's leftover processes too), directories removed

multihost_dsn(db, target_session_attrs=..., connect_timeout=...) takes the libpq values to put in it.
primary_socket / standby_socket are the socket directories (what connection_target reports as host)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import psycopg
from psycopg.conninfo import make_conninfo

from paygate_cli.db.migrate import migrate
from paygate_cli.sandbox.pg_cluster import SOCKET_PORT, Cluster, find_bindir

DEFAULT_DATABASE = "paygate"
SLOT = "paygate_standby"


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _owned_dir(path: Path) -> None:
    """An empty 0700 directory the postgres OS user owns (pg_basebackup writes into it)."""
    path.mkdir(mode=0o700)
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")


class ReplicatedPair:
    def __init__(self, *, database: str | None = DEFAULT_DATABASE) -> None:
        self.tmp = tempfile.mkdtemp(prefix="pgr-", dir="/tmp")  # short: the socket path limit
        if os.geteuid() == 0:
            os.chmod(self.tmp, 0o755)  # the postgres user must traverse it
        self.primary = Cluster.at(Path(self.tmp) / "p")
        self.standby = Cluster.at(Path(self.tmp) / "s")
        self.primary_killed = False
        try:
            self.primary.init(fast=True)
            self.primary.start(fast=True)
            if database:
                self._create_on_primary(database)
            self._base_backup()
            self.standby.start(fast=True)
            self.wait_caught_up()
        except BaseException:
            self.close()
            raise

    # -- DSNs ---------------------------------------------------------------------------------------
    @property
    def primary_socket(self) -> str:
        return str(self.primary.socket_dir)

    @property
    def standby_socket(self) -> str:
        return str(self.standby.socket_dir)

    def primary_dsn(self, db: str = DEFAULT_DATABASE) -> str:
        return make_conninfo(host=self.primary_socket, port=SOCKET_PORT, dbname=db, user="postgres")

    def standby_dsn(self, db: str = DEFAULT_DATABASE) -> str:
        return make_conninfo(host=self.standby_socket, port=SOCKET_PORT, dbname=db, user="postgres")

    def multihost_dsn(self, db: str = DEFAULT_DATABASE, *, target_session_attrs: str | None = "read-write",
                      connect_timeout: int | None = 2) -> str:
        params: dict[str, object] = {"host": f"{self.primary_socket},{self.standby_socket}",
                                     "port": f"{SOCKET_PORT},{SOCKET_PORT}", "dbname": db, "user": "postgres"}
        if target_session_attrs:
            params["target_session_attrs"] = target_session_attrs
        if connect_timeout:
            params["connect_timeout"] = connect_timeout
        return make_conninfo(**params)

    # -- setup --------------------------------------------------------------------------------------
    def _create_on_primary(self, db: str) -> None:
        with psycopg.connect(self.primary_dsn("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {db}")
        with psycopg.connect(self.primary_dsn(db), autocommit=True) as conn:
            migrate(conn)

    def create_database(self, db: str) -> str:
        """A migrated database on the primary, replayed on the standby before this returns."""
        self._create_on_primary(db)
        self.wait_caught_up()
        return db

    def _base_backup(self) -> None:
        _owned_dir(self.standby.datadir)
        cmd = [str(find_bindir() / "pg_basebackup"), "-D", str(self.standby.datadir), "-h", self.primary_socket,
               "-p", str(SOCKET_PORT), "-U", "postgres", "-R", "-X", "stream", "-C", "-S", SLOT,
               "--no-sync", "-c", "fast"]
        result = subprocess.run(_as_postgres(cmd), capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed: {result.stderr.strip() or result.stdout.strip()}")
        # The primary's socket directory is its data directory: its socket lock and log came along.
        for copied in (f".s.PGSQL.{SOCKET_PORT}.lock", "server.log"):
            (self.standby.datadir / copied).unlink(missing_ok=True)

    # -- replication control ------------------------------------------------------------------------
    def _standby_sql(self, sql: str) -> object:
        with psycopg.connect(self.standby_dsn("postgres"), autocommit=True) as conn:
            row = conn.execute(sql).fetchone()
            return row[0] if row else None

    def wait_caught_up(self, timeout: float = 30.0) -> None:
        """Until the standby has replayed the primary's WAL up to its current insert position."""
        with psycopg.connect(self.primary_dsn("postgres"), autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        target = row[0]
        deadline = time.monotonic() + timeout
        while True:
            caught_up = self._standby_sql(
                f"SELECT coalesce(pg_last_wal_replay_lsn() >= '{target}'::pg_lsn, false)")
            if caught_up:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the standby did not replay up to {target} within {timeout} s")
            time.sleep(0.05)

    def pause_replay(self) -> None:
        self._standby_sql("SELECT pg_wal_replay_pause()")

    def resume_replay(self) -> None:
        self._standby_sql("SELECT pg_wal_replay_resume()")

    def cut_off(self, timeout: float = 10.0) -> None:
        """The standby stops receiving WAL: no primary_conninfo, so no walreceiver. What the primary
        commits afterwards is lost to it (no restore_command either)."""
        with psycopg.connect(self.standby_dsn("postgres"), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + timeout
            while conn.execute("SELECT count(*) FROM pg_stat_wal_receiver").fetchone() != (0,):
                if time.monotonic() > deadline:
                    raise TimeoutError("the standby's walreceiver did not stop")
                time.sleep(0.05)

    def postmaster_pid(self, cluster: Cluster) -> int:
        return int((cluster.datadir / "postmaster.pid").read_text(encoding="utf-8").splitlines()[0])

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster; waits until its socket refuses connections."""
        pid = self.postmaster_pid(self.primary)
        os.kill(pid, signal.SIGKILL)
        self.primary_killed = True
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                psycopg.connect(self.primary_dsn("postgres"), connect_timeout=1).close()
            except psycopg.OperationalError:
                return
            time.sleep(0.05)
        raise TimeoutError("the killed primary still accepts connections")

    def promote(self) -> None:
        ok = self._standby_sql("SELECT pg_promote(wait => true, wait_seconds => 30)")
        if ok is not True:
            raise RuntimeError("pg_promote() did not finish within 30 s")

    # -- teardown -----------------------------------------------------------------------------------
    def close(self) -> None:
        for cluster in (self.standby, self.primary):
            try:
                # A SIGKILLed postmaster's children exit on their own when they see it gone.
                if not (cluster is self.primary and self.primary_killed):
                    cluster.stop()
            except Exception:  # teardown goes on to remove the directories
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> ReplicatedPair:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
