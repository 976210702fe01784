"""A private PostgreSQL cluster from the system's binaries, for `paygate dev db` and the tests.

Unix socket only (no TCP port, so it never collides with a system server on 5432), trust auth for
the local user, run as the `postgres` OS user when we are root (initdb refuses root).

As root, the postgres user must be able to reach the data directory. When a parent of the requested
directory is private (a clone in /root, in a `mktemp -d` directory), the cluster lives instead in a
fresh private directory under /var/tmp owned by postgres, and the requested directory only holds a
pointer file naming it, so `down` and `url` find it again. A user's home is never chmod-ed."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from paygate_cli.errors import ConfigError, Unavailable

SOCKET_PORT = 55432  # only names the socket file; nothing listens on TCP
_MAX_SOCKET_DIR = 90  # sun_path is ~107 bytes including ".s.PGSQL.55432"
POINTER_FILE = "paygate-datadir"  # in a requested directory the postgres user cannot reach
RELOCATED_PARENT = Path("/var/tmp")  # survives reboots (unlike /tmp on many systems)
INSTALL_HINT = ("install Debian's server as root (`apt-get install postgresql`; `make demo` does it when run as "
                "root on a machine with apt-get), or set PAYGATE_PG_BINDIR to a directory holding initdb and "
                "pg_ctl, or point PAYGATE_DATABASE_URL at an existing server")


def _search() -> Path | None:
    explicit = os.environ.get("PAYGATE_PG_BINDIR")
    if explicit:
        return Path(explicit) if (Path(explicit) / "initdb").is_file() else None
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    if candidates:
        return candidates[-1].parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def find_bindir(*, install: bool = False) -> Path:
    """PAYGATE_PG_BINDIR, else the newest /usr/lib/postgresql/*/bin with initdb, else initdb on PATH.
    With `install`, a root user on a machine with apt-get gets Debian's server installed first."""
    found = _search()
    if found:
        return found
    if install and os.geteuid() == 0 and shutil.which("apt-get") and not os.environ.get("PAYGATE_PG_BINDIR"):
        _apt_install_server()
        found = _search()
        if found:
            return found
    where = f" in PAYGATE_PG_BINDIR={os.environ['PAYGATE_PG_BINDIR']}" if os.environ.get("PAYGATE_PG_BINDIR") else ""
    raise ConfigError(f"no PostgreSQL server binaries found{where}: {INSTALL_HINT}", msgid="devdb.no_server")


def _apt_install_server() -> None:
    """Debian's `postgresql` package (the server binaries and the postgres OS user). Its own cluster
    on port 5432, which Debian sets up, is never used: ours listens on a Unix socket of its own."""
    sys.stderr.write("paygate: no PostgreSQL server found; installing Debian's `postgresql` with apt-get\n")
    sys.stderr.flush()
    environ = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql"]):
        result = subprocess.run(cmd, env=environ, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise ConfigError(f"`{' '.join(cmd)}` failed ({detail[-1] if detail else result.returncode}): "
                              f"{INSTALL_HINT}", msgid="devdb.install_failed")


def _socket_dir_for(datadir: Path) -> Path:
    if len(str(datadir)) <= _MAX_SOCKET_DIR:
        return datadir
    # Stable across processes (`up` and a later `url` must agree), unlike hash().
    return Path(f"/tmp/pgw-{hashlib.sha256(str(datadir).encode()).hexdigest()[:12]}")


def postgres_can_reach(path: Path) -> bool:
    """Whether the postgres OS user can traverse every directory down to `path` (as root only)."""
    probe = subprocess.run(["runuser", "-u", "postgres", "--", "test", "-x", str(path)],
                           capture_output=True, check=False)
    return probe.returncode == 0


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@dataclass
class Cluster:
    datadir: Path
    socket_dir: Path

    requested: Path | None = None  # the directory asked for, when the cluster was relocated from it

    @classmethod
    def at(cls, datadir: Path) -> Cluster:
        datadir = datadir.resolve()
        pointer = datadir / POINTER_FILE
        if pointer.is_file():
            real = Path(pointer.read_text(encoding="utf-8").strip())
            return cls(real, _socket_dir_for(real), requested=datadir)
        return cls(datadir, _socket_dir_for(datadir))

    def _relocate(self) -> None:
        """Root, and the postgres user cannot reach the requested directory: keep the cluster in a
        private directory it owns, and leave a pointer where it was asked for."""
        real = Path(tempfile.mkdtemp(prefix="paygate-pg-", dir=RELOCATED_PARENT))  # 0700, unguessable
        shutil.chown(real, "postgres", "postgres")
        (self.datadir / POINTER_FILE).write_text(f"{real}\n", encoding="utf-8")
        self.requested, self.datadir, self.socket_dir = self.datadir, real, _socket_dir_for(real)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql:///{dbname}?host={self.socket_dir}&port={SOCKET_PORT}&user=postgres"

    def _run(self, cmd: list[str], what: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(_as_postgres(cmd), capture_output=True, text=True, check=False)
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise Unavailable(f"{what} failed: {detail[-1] if detail else f'exit {result.returncode}'}",
                              msgid="devdb.failed")
        return result

    def is_initialised(self) -> bool:
        return (self.datadir / "PG_VERSION").is_file()

    def is_running(self) -> bool:
        if not self.is_initialised():
            return False
        cmd = _as_postgres([str(find_bindir() / "pg_ctl"), "-D", str(self.datadir), "status"])
        return subprocess.run(cmd, capture_output=True, check=False).returncode == 0

    def init(self, *, fast: bool = False) -> None:
        bindir = find_bindir(install=True)
        self.datadir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            if not postgres_can_reach(self.datadir):
                self._relocate()
            self.socket_dir.mkdir(parents=True, exist_ok=True)
            shutil.chown(self.datadir, "postgres", "postgres")
            shutil.chown(self.socket_dir, "postgres", "postgres")
            probe = subprocess.run(_as_postgres(["test", "-w", str(self.datadir)]), check=False)
            if probe.returncode != 0:
                raise ConfigError(f"the postgres OS user cannot write {self.datadir}; set XDG_DATA_HOME or "
                                  "--data-dir to a directory it can reach")
        else:
            self.socket_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.datadir, 0o700)
        cmd = [str(bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres", "-A", "trust",
               "-E", "UTF8", "--locale=C"]
        if fast:
            cmd.append("--no-sync")
        self._run(cmd, "initdb")

    def start(self, *, fast: bool = False) -> None:
        options = f"-k {self.socket_dir} -p {SOCKET_PORT} -c listen_addresses=''"
        if fast:  # tests only: durability is irrelevant for a throwaway cluster
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._run([str(find_bindir() / "pg_ctl"), "-D", str(self.datadir), "-l",
                   str(self.datadir / "server.log"), "-o", options, "-w", "-t", "30", "start"], "pg_ctl start")

    def stop(self) -> None:
        if self.is_running():
            self._run([str(find_bindir() / "pg_ctl"), "-D", str(self.datadir), "-m", "fast", "-w", "stop"],
                      "pg_ctl stop")

    def up(self, *, fast: bool = False) -> bool:
        """Init if needed, start if not running. Returns True when it started something."""
        if not self.is_initialised():
            self.init(fast=fast)
        if self.is_running():
            return False
        self.start(fast=fast)
        return True


def default_datadir(environ: dict[str, str] | os._Environ[str]) -> Path:
    base = environ.get("XDG_DATA_HOME") or str(Path(environ.get("HOME", "/root")) / ".local" / "share")
    return Path(base) / "paygate" / "pg"
