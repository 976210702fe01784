"""A real PgBouncer (Debian's package) in front of the test cluster, on a Unix socket of its own (never
TCP), in session or transaction pooling mode. .ci/run installs the package; a run without it fails in
CI and is skipped, saying so, elsewhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

PORT = 6432  # names the socket file only
STARTUP_TIMEOUT = 10.0


def pgbouncer_binary() -> str:
    """The installed pgbouncer; in CI its absence is a failure (.ci/run installs it), elsewhere a skip."""
    found = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None)
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("pgbouncer is not installed: .ci/run installs it (apt-get install pgbouncer)")
    pytest.skip("pgbouncer is not installed here (apt-get install pgbouncer); CI runs this test")


@contextmanager
def pgbouncer(dsn: str, pool_mode: str) -> Iterator[str]:
    """PgBouncer pooling `dsn`'s server in `pool_mode`; yields the DSN of the same database through it."""
    binary = pgbouncer_binary()
    target = conninfo_to_dict(dsn)
    directory = Path(tempfile.mkdtemp(prefix="pgb-", dir="/tmp"))  # short: the socket path limit
    user = str(target.get("user") or "postgres")
    (directory / "users.txt").write_text(f'"{user}" ""\n')
    (directory / "pgbouncer.ini").write_text(f"""[databases]
* = host={target['host']} port={target['port']}

[pgbouncer]
listen_addr =
listen_port = {PORT}
unix_socket_dir = {directory}
auth_type = trust
auth_file = {directory}/users.txt
pool_mode = {pool_mode}
default_pool_size = 4
ignore_startup_parameters = options,extra_float_digits
logfile = {directory}/pgbouncer.log
pidfile = {directory}/pgbouncer.pid
""")
    command = [binary, str(directory / "pgbouncer.ini")]
    if os.geteuid() == 0:  # pgbouncer refuses to run as root
        shutil.chown(directory, "postgres")
        for name in ("users.txt", "pgbouncer.ini"):
            shutil.chown(directory / name, "postgres")
        command[1:1] = ["-u", "postgres"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not (directory / f".s.PGSQL.{PORT}").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (directory / "pgbouncer.log").read_text() if (directory / "pgbouncer.log").exists() else ""
                raise AssertionError(f"pgbouncer did not start ({proc.poll()}): {log[-2000:]}")
            time.sleep(0.05)
        yield make_conninfo(dsn, host=str(directory), port=str(PORT))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(directory, ignore_errors=True)
