"""`paygate status` with slow RPC endpoints: each distinct URL asked once per method, all of them at
the same time; a timeout said in the operator's words ("timed out after 3s") naming the host and
port only; a spinner on stderr only for a person at a terminal, never with --json or --plain.

The endpoints are tiny loopback HTTP servers standing in for an RPC provider (outside paygate):
they sleep before answering and record what was asked, and how many requests were in flight."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from paygate_cli.__main__ import main
from paygate_cli.env import Env
from paygate_cli.errors import ExitCode
from tests.support.cli import base_environ, run_proc

PASSPHRASE = "Slow Test Network ; December 2026"


class Meter:
    """Requests in flight across the servers sharing it, and the most there ever were at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = 0


class SlowRpc:
    """Answers getHealth and getNetwork after `delay` seconds. `calls` holds (path, method) of
    every request; `meter` counts the requests being served at once."""

    def __init__(self, host: str, delay: float, meter: Meter | None = None) -> None:
        self.delay = delay
        self.calls: list[tuple[str, str]] = []
        self.meter = meter or Meter()
        self.stopping = threading.Event()
        rpc, meter = self, self.meter

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                method = str(request.get("method"))
                with meter.lock:
                    rpc.calls.append((self.path, method))
                    meter.in_flight += 1
                    meter.max_in_flight = max(meter.max_in_flight, meter.in_flight)
                try:
                    rpc.stopping.wait(rpc.delay)
                    result = ({"status": "healthy", "latestLedger": 500, "oldestLedger": 1}
                              if method == "getHealth" else {"passphrase": PASSPHRASE, "protocolVersion": 23})
                    body = json.dumps({"jsonrpc": "2.0", "id": request.get("id", 1), "result": result}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up (its timeout): nothing to answer
                    pass
                finally:
                    with meter.lock:
                        meter.in_flight -= 1

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.host_port = f"{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, tail: str = "") -> str:
        return f"http://{self.host_port}{tail}"

    def methods(self) -> list[str]:
        return sorted(method for _, method in self.calls)

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def slow_pair() -> Iterator[tuple[SlowRpc, SlowRpc]]:
    # Two hosts (127.0.0.1 and 127.0.0.2 are both loopback): read endpoints vote by distinct host.
    meter = Meter()
    first, second = SlowRpc("127.0.0.1", 2.0, meter), SlowRpc("127.0.0.2", 2.0, meter)
    yield first, second
    first.stop()
    second.stop()


def rpc_environ(dsn: str, write: str, reads: list[str]) -> dict[str, str]:
    return base_environ(dsn, PAYGATE_RPC_URL=write, PAYGATE_RPC_READ_URLS=",".join(reads),
                        PAYGATE_NETWORK_PASSPHRASE=PASSPHRASE, PAYGATE_RPC_TIMEOUT="3s")


def test_status_asks_each_distinct_endpoint_once_and_all_at_once(dsn: str, slow_pair: tuple[SlowRpc, SlowRpc]) -> None:
    first, second = slow_pair
    # The write endpoint is also the first read endpoint: one URL, asked once per method.
    result = run_proc("status", "--json", environ=rpc_environ(dsn, first.url(), [first.url(), second.url()]))
    assert result.code == ExitCode.OK, result.err
    endpoints = json.loads(result.out)["status"]["rpc"]["endpoints"]
    assert [(e["role"], e["url"], e["status"]) for e in endpoints] == [
        ("write", first.host_port, "healthy"), ("read", first.host_port, "healthy"),
        ("read", second.host_port, "healthy")]
    assert first.methods() == second.methods() == ["getHealth", "getNetwork"]
    # The slow endpoints were asked at the same time (one after the other, never two in flight).
    assert first.meter.max_in_flight >= 2
    assert "\x1b[" not in result.err and "asking" not in result.err  # no spinner off a terminal


def test_a_timeout_names_the_host_and_the_bound_never_the_path(dsn: str) -> None:
    stuck = SlowRpc("127.0.0.1", 5.0)  # sleeps past PAYGATE_RPC_TIMEOUT=3s
    try:
        keyed = stuck.url("/v1/PROVIDERKEY0123456789?apikey=QUERYKEY0123456789")
        result = run_proc("status", "--json", environ=rpc_environ(dsn, keyed, []))
    finally:
        stuck.stop()
    assert result.code == ExitCode.FAILED, result.err
    report = json.loads(result.out)["status"]
    [write, read] = report["rpc"]["endpoints"]
    assert write["status"] == read["status"] == "unreachable"
    assert write["error"] == "getHealth timed out after 3s"
    assert stuck.methods() == ["getHealth", "getNetwork"]  # one URL: asked once, though both write and read
    problems = [p for p in report["problems"] if p.startswith("RPC ")]
    assert problems == [f"RPC write endpoint {stuck.host_port} is unreachable: getHealth timed out after 3s",
                        f"RPC read endpoint {stuck.host_port} is unreachable: getHealth timed out after 3s"]
    assert "PROVIDERKEY" not in result.out + result.err and "QUERYKEY" not in result.out + result.err


class _FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("flags", [[], ["--json"], ["--plain"]])
def test_status_shows_progress_only_to_a_person_at_a_terminal(dsn: str, flags: list[str]) -> None:
    quick = SlowRpc("127.0.0.1", 0.0)
    try:
        stdout, stderr = io.StringIO(), _FakeTTY()
        env = Env(stdin=io.StringIO(), stdout=stdout, stderr=stderr,
                  environ=rpc_environ(dsn, quick.url(), []))
        code = main(["status", *flags], env=env)
    finally:
        quick.stop()
    assert code == ExitCode.OK, stderr.getvalue()
    shown = "asking 1 RPC endpoint" in stderr.getvalue()
    assert shown is (not flags), stderr.getvalue()
    assert "asking" not in stdout.getvalue()
