"""A real Patroni pair: one etcd and two Patroni-managed PostgreSQL nodes from the system's binaries
(Debian's `patroni` and `etcd-server`; .ci/run installs them), for the automatic-failover drill.

Everything lives in one private temp directory under /tmp (short: the socket path limit): etcd's
data, each node's data directory, Unix socket directory, Patroni config and logs. Patroni and its
PostgreSQL run as the postgres OS user when we are root (initdb refuses root), as
sandbox/pg_cluster.py does. etcd, Patroni's REST API and PostgreSQL listen on free TCP ports of
127.0.0.1 only (Patroni's members reach each other and replicate over TCP); paygate connects to
each node's own Unix socket directory, so a multi-host DSN names each node by a path of its own.

Timings are small (ttl 10 s, loop_wait 1 s, retry_timeout 4 s) and `primary_start_timeout: 0`: a
leader whose postmaster died is not restarted in place but failed over to a healthy replica (the
production choice when a replica is there to take over), so a failover takes seconds.
Replication is asynchronous (Patroni's default), with `use_pg_rewind`, so the old leader rejoins
as a replica of the new one by itself.

    with PatroniPair() as pair:             # etcd, a leader, a replica streaming; "paygate" migrated
        pair.leader()                       # the node whose Patroni REST API answers /primary (or None)
        pair.multihost_dsn("paygate")       # host=S0,S1 port=P0,P1 target_session_attrs=read-write
        pair.node_dsn(node, "paygate")      # one node's database
        pair.wait_streaming()               # a replica streams from the leader
        pair.kill_postmaster(node)          # SIGKILL that node's postmaster (postmaster.pid)
        pair.wait_leader()                  # until exactly one node is primary -> it
    # close(): Patroni killed, each PostgreSQL stopped (immediate), etcd killed, the directory removed

No test may assume the binaries exist: `patroni_binaries()` skips with the reason outside CI and
fails in CI (where .ci/run installs them)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from paygate_cli.db.migrate import migrate
from paygate_cli.sandbox.pg_cluster import find_bindir

DEFAULT_DATABASE = "paygate"
SCOPE = "paygate"
TTL, LOOP_WAIT, RETRY_TIMEOUT = 10, 1, 4  # Patroni wants ttl >= loop_wait + 2 * retry_timeout
STARTUP_TIMEOUT = 60.0


@dataclass(frozen=True)
class Binaries:
    patroni: str
    etcd: str


def patroni_binaries() -> Binaries:
    """Debian's patroni and etcd; in CI their absence is a failure (.ci/run installs them), elsewhere a skip."""
    patroni, etcd = shutil.which("patroni"), shutil.which("etcd")
    if patroni and etcd:
        return Binaries(patroni, etcd)
    missing = " and ".join(name for name, path in (("patroni", patroni), ("etcd", etcd)) if not path)
    if os.environ.get("CI"):
        pytest.fail(f"{missing} not installed: .ci/run installs them (apt-get install patroni etcd-server)")
    pytest.skip(f"{missing} not installed here (apt-get install patroni etcd-server); CI runs this test")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _http_get(url: str, timeout: float = 2.0) -> tuple[int, Any]:
    """(status, JSON body or None); (0, None) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    except (OSError, ValueError):
        return 0, None
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


def _as_postgres() -> dict[str, Any]:
    """Popen keywords running the child as the postgres OS user when we are root (no runuser in
    between, so the pid we hold is Patroni's own)."""
    if os.geteuid() != 0:
        return {}
    return {"user": "postgres", "group": "postgres", "extra_groups": []}


def _owned_by_postgres(path: Path, mode: int = 0o700) -> Path:
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    path.chmod(mode)
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")
    return path


@dataclass
class Node:
    name: str
    home: Path  # its Patroni config, log and socket directory
    pg_port: int
    api_port: int
    proc: subprocess.Popen | None = None

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def socket_dir(self) -> str:
        return str(self.home)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def log(self) -> Path:
        return self.home / "patroni.log"

    def is_primary(self) -> bool:
        return _http_get(f"{self.api}/primary")[0] == 200

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text(encoding="utf-8").splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None


class PatroniPair:
    def __init__(self, *, database: str | None = DEFAULT_DATABASE) -> None:
        self.binaries = patroni_binaries()
        self.bindir = find_bindir()
        self.tmp = Path(tempfile.mkdtemp(prefix="ptn-", dir="/tmp"))  # short: the socket path limit
        if os.geteuid() == 0:
            os.chmod(self.tmp, 0o755)  # the postgres user must traverse it
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.nodes = [Node(f"node{i}", self.tmp / f"n{i}", free_port(), free_port()) for i in range(2)]
        self.etcd: subprocess.Popen | None = None
        try:
            self._start_etcd()
            # Both at once: one wins the initialize key and bootstraps, the other waits for a leader
            # and clones it (pg_basebackup); which one leads is Patroni's choice.
            for node in self.nodes:
                self._start_patroni(node)
            self.wait_leader()
            if database:
                self.create_database(database)
            self.wait_streaming()
        except BaseException:
            self.close()
            raise

    # -- DSNs ---------------------------------------------------------------------------------------
    def node_dsn(self, node: Node, db: str = DEFAULT_DATABASE) -> str:
        return make_conninfo(host=node.socket_dir, port=node.pg_port, dbname=db, user="postgres")

    def multihost_dsn(self, db: str = DEFAULT_DATABASE, *, connect_timeout: int = 2) -> str:
        return make_conninfo(host=",".join(n.socket_dir for n in self.nodes),
                             port=",".join(str(n.pg_port) for n in self.nodes), dbname=db, user="postgres",
                             target_session_attrs="read-write", connect_timeout=connect_timeout)

    # -- setup --------------------------------------------------------------------------------------
    def _start_etcd(self) -> None:
        data = self.tmp / "etcd"
        data.mkdir(mode=0o700)
        client, peer = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{self.etcd_peer_port}"
        with (self.tmp / "etcd.log").open("ab") as log:
            self.etcd = subprocess.Popen(
                [self.binaries.etcd, "--name", "etcd0", "--data-dir", str(data),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"etcd0={peer}", "--initial-cluster-state", "new",
                 "--logger", "zap", "--log-level", "warn"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        self._wait(lambda: _http_get(f"{client}/health")[0] == 200, "etcd to answer /health", self.tmp / "etcd.log")

    def _config(self, node: Node) -> dict[str, Any]:
        listen = f"127.0.0.1:{node.pg_port}"
        return {
            "scope": SCOPE,
            "name": node.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{node.api_port}", "connect_address": f"127.0.0.1:{node.api_port}"},
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL, "loop_wait": LOOP_WAIT, "retry_timeout": RETRY_TIMEOUT,
                    "maximum_lag_on_failover": 1048576,
                    # A crashed leader fails over to a healthy replica instead of crash-recovering in place.
                    "primary_start_timeout": 0,
                    "postgresql": {"use_pg_rewind": True, "use_slots": True},
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, "no-sync"],
            },
            "postgresql": {
                "listen": listen,
                "connect_address": listen,
                "data_dir": str(node.data_dir),
                "bin_dir": str(self.bindir),
                "pgpass": str(node.home / "pgpass"),
                "use_unix_socket": True,
                "authentication": {"superuser": {"username": "postgres"},
                                   "replication": {"username": "postgres"},
                                   "rewind": {"username": "postgres"}},
                "pg_hba": ["local all all trust", "local replication all trust",
                           "host all all 127.0.0.1/32 trust", "host replication all 127.0.0.1/32 trust"],
                "basebackup": [{"checkpoint": "fast"}],
                "parameters": {
                    "unix_socket_directories": node.socket_dir,
                    # A throwaway cluster: no fsync. Commits still wait for their WAL write
                    # (synchronous_commit stays on), so what a commit acknowledged is streamable,
                    # and full_page_writes stays on for pg_rewind.
                    "fsync": "off",
                    "logging_collector": "on",
                    "log_directory": str(node.home / "pglog"),
                },
            },
        }

    def _start_patroni(self, node: Node) -> None:
        _owned_by_postgres(node.home, 0o755)
        config = node.home / "patroni.yml"
        # JSON is YAML: no YAML writer needed.
        config.write_text(json.dumps(self._config(node), indent=1), encoding="utf-8")
        if os.geteuid() == 0:
            shutil.chown(config, "postgres", "postgres")
        # Patroni is Debian's Python program: the system interpreter, none of this venv's variables.
        environ = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(node.home), "LANG": "C.UTF-8"}
        with node.log.open("ab") as log:
            node.proc = subprocess.Popen([self.binaries.patroni, str(config)], env=environ, cwd=node.home,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                         **_as_postgres())

    def create_database(self, db: str) -> None:
        leader = self.leader()
        assert leader is not None, "no leader to create the database on"
        with psycopg.connect(self.node_dsn(leader, "postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {db}")
        with psycopg.connect(self.node_dsn(leader, db), autocommit=True) as conn:
            migrate(conn)

    # -- what Patroni says ----------------------------------------------------------------------------
    def leader(self) -> Node | None:
        """The node whose REST API answers 200 on /primary (Patroni's leader, running as primary)."""
        leaders = [n for n in self.nodes if n.is_primary()]
        return leaders[0] if len(leaders) == 1 else None

    def other(self, node: Node) -> Node:
        [other] = [n for n in self.nodes if n is not node]
        return other

    def _wait(self, ready: Any, what: str, log: Path, timeout: float = STARTUP_TIMEOUT) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            found = ready()
            if found:
                return found
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is not None:
                    raise RuntimeError(f"patroni {node.name} exited {node.proc.returncode}:\n{self.log_tail(node)}")
            if time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                raise TimeoutError(f"waited {timeout:.0f} s for {what}:\n{tail}")
            time.sleep(0.1)

    def wait_leader(self, timeout: float = STARTUP_TIMEOUT) -> Node:
        """Until exactly one node is primary -> it."""
        return self._wait(self.leader, "a leader", self.nodes[0].log, timeout)

    def wait_streaming(self, timeout: float = STARTUP_TIMEOUT) -> Node:
        """Until the leader has a replica streaming from it -> the replica."""
        def streaming() -> Node | None:
            leader = self.leader()
            if leader is None:
                return None
            replica = self.other(leader)
            try:
                with psycopg.connect(self.node_dsn(leader, "postgres"), autocommit=True, connect_timeout=2) as conn:
                    row = conn.execute("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' "
                                       "AND application_name = %s", (replica.name,)).fetchone()
            except psycopg.OperationalError:
                return None
            return replica if row and row[0] == 1 else None
        return self._wait(streaming, "a replica streaming from the leader", self.nodes[1].log, timeout)

    def log_tail(self, node: Node, chars: int = 3000) -> str:
        return node.log.read_text(errors="replace")[-chars:] if node.log.exists() else ""

    # -- the disaster ---------------------------------------------------------------------------------
    def kill_postmaster(self, node: Node) -> int:
        """SIGKILL `node`'s postmaster (Patroni keeps running on it) -> the pid killed."""
        pid = node.postmaster_pid()
        assert pid is not None, f"{node.name} has no postmaster.pid"
        os.kill(pid, signal.SIGKILL)
        return pid

    # -- teardown -----------------------------------------------------------------------------------
    def close(self) -> None:
        """A throwaway pair: Patroni SIGKILLed first (so it neither restarts nor promotes anything),
        then each PostgreSQL stopped `-m immediate` (a clean shutdown's checkpoint is wasted on a
        directory removed next), etcd killed, the directory removed."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait()
        stops = [subprocess.Popen([*(["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []),
                                   str(self.bindir / "pg_ctl"), "-D", str(node.data_dir), "-m", "immediate",
                                   "-w", "stop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for node in self.nodes if node.postmaster_pid() is not None]
        for stop in stops:
            stop.wait()
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.kill()
            self.etcd.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> PatroniPair:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
