"""Webhook hardening: redirects are never followed, DNS rebinding cannot reach a private
address (the host is resolved once, checked, and the connection goes to the checked address), and
a response body is read only up to a cap. Real HTTP servers on loopback addresses, a real Postgres,
the real worker; the only stand-in is DNS, through a resolver the test controls."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
import pytest

from paygate_cli.workers import webhooks
from paygate_cli.workers.webhooks import MAX_RESPONSE_BYTES, TargetRefused, post, resolve_target
from tests.support.cli import run_cli
from tests.support.webhooks import endpoint, event, row

PUBLIC_STAND_IN = "127.0.0.2"  # allow-listed: plays the public address DNS answers at check time
PRIVATE = "127.0.0.1"  # not allow-listed: the internal service a rebinding attack aims at
HOST = "hooks.customer.example"
HUGE_BODY = 48 * 1024 * 1024


@dataclass
class Server:
    """An HTTP server on one loopback address: /ok answers 200, /redirect 302 to `redirect_to`,
    /huge 200 with a body far larger than the cap. Records every request (path, Host header)."""

    address: str
    port: int = 0
    redirect_to: str = ""
    requests: list[tuple[str, str]] = field(default_factory=list)
    huge_ends: list[str] = field(default_factory=list)  # "hung up" or "all read", per /huge request
    httpd: ThreadingHTTPServer | None = None

    def start(self) -> Server:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                server.requests.append((self.path, self.headers.get("Host", "")))
                if self.path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", server.redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif self.path == "/huge":
                    self.send_response(200)
                    self.send_header("Connection", "close")  # body until close
                    self.end_headers()
                    # HUGE_BODY is far more than the socket buffers hold, so a client that stops
                    # reading at the cap makes these writes fail; bounded, so a client that does
                    # read everything (the bug this catches) cannot exhaust the test machine's memory.
                    chunk = b"x" * 65536
                    try:
                        for _ in range(HUGE_BODY // len(chunk)):
                            self.wfile.write(chunk)
                        self.wfile.flush()
                        server.huge_ends.append("all read")
                    except OSError:
                        server.huge_ends.append("hung up")
                else:
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        self.httpd = ThreadingHTTPServer((self.address, self.port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.httpd:
            self.httpd.shutdown()
            self.httpd.server_close()


@pytest.fixture
def servers() -> Iterator[tuple[Server, Server]]:
    """A 'public' server and a 'private' one on the same port, so only the address decides which
    one a connection reaches."""
    for _ in range(20):
        public = Server(PUBLIC_STAND_IN).start()
        try:
            private = Server(PRIVATE, public.port).start()
        except OSError:  # that port is taken on 127.0.0.1: try another
            public.stop()
            continue
        yield public, private
        public.stop()
        private.stop()
        return
    pytest.fail("no port free on both loopback addresses")


class Rebinding:
    """DNS under the attacker's control: the allowed address on the first question, the private one
    on every later question (what a connect-time lookup would get)."""

    def __init__(self, first: str, later: str) -> None:
        self.first, self.later, self.questions = first, later, 0

    def __call__(self, host: str, port: int) -> list[str]:
        self.questions += 1
        return [self.first if self.questions == 1 else self.later]


ALLOW = [f"{PUBLIC_STAND_IN}/32"]


def test_rebinding_dns_cannot_reach_the_private_address(servers: tuple[Server, Server]) -> None:
    public, private = servers
    dns = Rebinding(PUBLIC_STAND_IN, PRIVATE)
    status = post(f"http://{HOST}:{public.port}/ok", b"{}", {}, timeout=5, allow=ALLOW, resolve=dns)
    assert status == 200
    assert dns.questions == 1  # resolved once: the check's answer is the one connected to
    assert public.requests == [("/ok", f"{HOST}:{public.port}")]  # Host names the customer's host
    assert private.requests == []


def test_the_same_resolver_answering_private_first_is_refused_before_connecting(
        servers: tuple[Server, Server]) -> None:
    public, private = servers
    with pytest.raises(TargetRefused, match=re.escape(f"non-public address {PRIVATE}")):
        post(f"http://{HOST}:{public.port}/ok", b"{}", {}, timeout=5, allow=ALLOW,
             resolve=Rebinding(PRIVATE, PUBLIC_STAND_IN))
    assert public.requests == [] and private.requests == []


def test_one_private_address_among_public_ones_refuses_the_host() -> None:
    def mixed(host: str, port: int) -> list[str]:
        return [PUBLIC_STAND_IN, "10.0.0.7"]

    with pytest.raises(TargetRefused, match=re.escape("non-public address 10.0.0.7")):
        resolve_target(f"http://{HOST}/hook", ALLOW, mixed)


def test_the_worker_pins_the_checked_address_under_rebinding(dsn: str, db: psycopg.Connection,
                                                              servers: tuple[Server, Server],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole tick (claim, deliver from worker threads, settle) with the worker's resolver
    replaced by the rebinding one."""
    public, private = servers
    dns = Rebinding(PUBLIC_STAND_IN, PRIVATE)
    monkeypatch.setattr(webhooks, "resolver", dns)
    outbox_id = event(db, endpoint(db, f"http://{HOST}:{public.port}/ok"))
    result = run_cli("run-tick", "webhooks", "--json", dsn=dsn, PAYGATE_WEBHOOK_ALLOW_HOSTS=ALLOW[0])
    assert result.code == 0, result.err
    assert row(db, outbox_id)["status"] == "delivered"
    assert dns.questions == 1 and len(public.requests) == 1 and private.requests == []


def test_a_redirect_is_a_failed_attempt_with_the_reason_and_is_not_followed(
        dsn: str, db: psycopg.Connection, servers: tuple[Server, Server]) -> None:
    public, private = servers
    public.redirect_to = f"http://{PUBLIC_STAND_IN}:{public.port}/ok"  # even to an allowed address
    outbox_id = event(db, endpoint(db, f"http://{PUBLIC_STAND_IN}:{public.port}/redirect"), max_attempts=1)
    result = run_cli("run-tick", "webhooks", "--json", dsn=dsn, PAYGATE_WEBHOOK_ALLOW_HOSTS=ALLOW[0])
    assert result.code == 0, result.err
    dead = row(db, outbox_id)
    assert dead["status"] == "dead" and dead["last_status_code"] == 302
    assert f"redirect to {public.redirect_to} not followed" in dead["last_error"]
    assert [path for path, _ in public.requests] == ["/redirect"]  # /ok never asked for
    assert private.requests == []


def test_a_redirect_with_attempts_left_backs_off(dsn: str, db: psycopg.Connection,
                                                 servers: tuple[Server, Server]) -> None:
    public, _ = servers
    public.redirect_to = "http://169.254.169.254/latest/meta-data/"
    outbox_id = event(db, endpoint(db, f"http://{PUBLIC_STAND_IN}:{public.port}/redirect"))
    result = run_cli("run-tick", "webhooks", "--json", dsn=dsn, PAYGATE_WEBHOOK_ALLOW_HOSTS=ALLOW[0])
    assert result.code == 0, result.err
    assert json.loads(result.out)["run_tick"]["last_details"]["retrying"] == 1
    pending = row(db, outbox_id)
    assert pending["status"] == "pending" and "not followed" in pending["last_error"]


def test_a_huge_response_body_is_read_only_up_to_the_cap(dsn: str, db: psycopg.Connection,
                                                          servers: tuple[Server, Server]) -> None:
    """Capped, the delivery counts and the client hangs up long before the body ends."""
    public, _ = servers
    outbox_id = event(db, endpoint(db, f"http://{PUBLIC_STAND_IN}:{public.port}/huge"))
    result = run_cli("run-tick", "webhooks", "--json", dsn=dsn, PAYGATE_WEBHOOK_ALLOW_HOSTS=ALLOW[0],
                     PAYGATE_WEBHOOK_TIMEOUT="10s")
    assert result.code == 0, result.err
    assert row(db, outbox_id)["status"] == "delivered"
    for _ in range(200):  # the handler thread notices the hang-up on its next write
        if public.huge_ends:
            break
        threading.Event().wait(0.05)
    assert public.huge_ends == ["hung up"]  # the client closed the connection instead of reading on
    assert MAX_RESPONSE_BYTES == 64 * 1024
