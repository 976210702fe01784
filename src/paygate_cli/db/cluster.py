"""A private PostgreSQL cluster from the system's binaries, for `paygate dev db` and the tests.

Unix socket only (no TCP port, so it never collides with a system server on 5432), trust auth for
the local user, run as the `postgres` OS user when we are root (initdb refuses root)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from paygate_cli.errors import ConfigError, Unavailable

SOCKET_PORT = 55432  # only names the socket file; nothing listens on TCP
_MAX_SOCKET_DIR = 90  # sun_path is ~107 bytes including ".s.PGSQL.55432"


def find_bindir() -> Path:
    """The newest /usr/lib/postgresql/*/bin with initdb, else initdb on PATH."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    if candidates:
        return candidates[-1].parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise ConfigError("no PostgreSQL server binaries found (install Debian's `postgresql` package, "
                      "or set PAYGATE_DATABASE_URL to an existing server)")


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@dataclass
class Cluster:
    datadir: Path
    socket_dir: Path

    @classmethod
    def at(cls, datadir: Path) -> Cluster:
        datadir = datadir.resolve()
        socket_dir = datadir if len(str(datadir)) <= _MAX_SOCKET_DIR else Path(
            f"/tmp/pgw-{abs(hash(str(datadir))) % 10**8}")
        return cls(datadir, socket_dir)

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
        self.datadir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.datadir, "postgres", "postgres")
            shutil.chown(self.socket_dir, "postgres", "postgres")
            probe = subprocess.run(_as_postgres(["test", "-w", str(self.datadir)]), check=False)
            if probe.returncode != 0:
                raise ConfigError(f"the postgres OS user cannot reach {self.datadir} (a parent directory is "
                                  "private); set XDG_DATA_HOME or --data-dir to a directory it can traverse")
        os.chmod(self.datadir, 0o700)
        cmd = [str(find_bindir() / "initdb"), "-D", str(self.datadir), "-U", "postgres", "-A", "trust",
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
