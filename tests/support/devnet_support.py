"""Start a real devnet subprocess for tests (`start_devnet`) and steer it (`DevnetHandle`).

A plain module (no pytest imports) so money-path tests and benches can reuse it. The devnet runs as
`python -m paygate_cli devnet start --port 0 …`, prints its genesis line, and is driven over HTTP.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STARTUP_TIMEOUT = 30.0


class DevnetError(RuntimeError):
    """An admin call failed, or the devnet did not start."""


@dataclass
class DevnetHandle:
    proc: subprocess.Popen
    genesis: dict[str, Any]
    log_path: Path
    _ids: int = field(default=0, repr=False)

    @property
    def url(self) -> str:
        return str(self.genesis["url"])

    @property
    def passphrase(self) -> str:
        return str(self.genesis["passphrase"])

    def rpc(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        """One JSON-RPC call; returns `result`, raises DevnetError on a JSON-RPC error."""
        self._ids += 1
        body = json.dumps({"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params}).encode()
        req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.loads(resp.read())
        if "error" in data:
            raise DevnetError(f"{method}: {data['error']}")
        return data["result"]

    def close_ledger(self, n: int = 1, advance_seconds: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"n": n}
        if advance_seconds is not None:
            params["advanceSeconds"] = advance_seconds
        return self.rpc("devnet_closeLedger", params)

    def set_fault(self, kind: str, **params: Any) -> dict[str, Any]:
        return self.rpc("devnet_setFault", {"kind": kind, **params})

    def clear_faults(self) -> dict[str, Any]:
        return self.rpc("devnet_clearFaults", {})

    def fund(self, account: str, *, xlm: int = 0, usdc: int = 0) -> dict[str, Any]:
        return self.rpc("devnet_fund", {"account": account, "xlm": xlm, "usdc": usdc})

    def state(self) -> dict[str, Any]:
        return self.rpc("devnet_state", {})

    def latest_ledger(self) -> int:
        return int(self.rpc("getLatestLedger")["sequence"])

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait (state is saved on the way out); returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)

    def kill(self) -> None:
        """SIGKILL: a crash, no chance to save."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _command() -> list[str]:
    return [sys.executable, "-m", "paygate_cli"]


def start_devnet(tmpdir: Path | str, *, seed: str = "test", lanes: int = 8, users: int = 4,
                 retention: int | None = None, ledger_interval: str = "manual", state: Path | str | None = None,
                 extra_args: list[str] | None = None, host: str = "127.0.0.1") -> DevnetHandle:
    """`host`: another loopback address (127.0.0.2, …) makes a node a distinct host for read quorums."""
    tmp = Path(tmpdir)
    tmp.mkdir(parents=True, exist_ok=True)
    args = [*_command(), "devnet", "start", "--host", host, "--port", "0",
            "--ledger-interval", ledger_interval, "--seed", seed, "--lanes", str(lanes), "--users", str(users)]
    if retention is not None:
        args += ["--retention", str(retention)]
    if state is not None:
        args += ["--state", str(state)]
    args += extra_args or []
    log_path = tmp / f"devnet-{int(time.time() * 1000)}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAYGATE_")}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + STARTUP_TIMEOUT
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not sel.select(left):
            proc.kill()
            raise DevnetError(f"devnet did not print its genesis in time; log:\n{log_path.read_text()}")
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            proc.wait()
            raise DevnetError(f"devnet exited ({proc.returncode}) before genesis; log:\n{log_path.read_text()}")
        line += chunk
    sel.close()
    return DevnetHandle(proc=proc, genesis=json.loads(line.decode()), log_path=log_path)


def ttl_args(min_persistent: int, max_entry: int, min_temporary: int | None = None) -> list[str]:
    """`devnet start` options for short TTLs (entries expire within a test's `devnet advance`)."""
    args = ["--min-persistent-ttl", str(min_persistent), "--max-entry-ttl", str(max_entry)]
    return args if min_temporary is None else [*args, "--min-temporary-ttl", str(min_temporary)]


# The short TTLs the state-archival tests share: a new (or restored) persistent entry lives SHORT_TTL
# ledgers, nothing lives longer than MAX_SHORT_TTL (the SAC's own extensions are clamped to it).
SHORT_TTL = 1_000
MAX_SHORT_TTL = 4_000


def start_short_ttl_devnet(tmpdir: Path | str, *, lanes: int = 4, users: int = 3) -> DevnetHandle:
    """A manual devnet whose entries archive within a test's `devnet advance`."""
    return start_devnet(tmpdir, lanes=lanes, users=users,
                        extra_args=ttl_args(SHORT_TTL, MAX_SHORT_TTL, min_temporary=100))
