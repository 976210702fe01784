"""Outbox -> customer HTTP endpoints.

Claim due rows under a lease (SKIP LOCKED, attempt counted at claim so a row that kills its worker
still runs out of attempts), POST with no transaction open, then settle each row by CAS on its lease
token. Deliveries run in parallel, each bounded by a hard deadline, so a hung endpoint never holds up
another endpoint's events. Delivery is at-least-once: receivers dedupe on `Paygate-Event-Id`.
The statements that move the outbox's rows are queues/webhooks.py's."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import ipaddress
import json
import random
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from paygate_cli.context import TickContext, TickResult
from paygate_cli.crashpoints import crashpoint
from paygate_cli.db.connect import assert_not_in_transaction
from paygate_cli.queues import webhooks as outbox

USER_AGENT = "paygate-webhooks/1"
MAX_RESPONSE_BYTES = 64 * 1024


@dataclass
class Claimed:
    id: int
    event_id: str
    endpoint_id: int | None
    event_type: str
    payload: Any
    attempts: int
    max_attempts: int | None
    lease_token: Any
    created_at: Any
    url: str | None
    secret: str | None
    enabled: bool | None


@dataclass
class Delivery:
    """What happened to one claimed row; becomes the parameters of the settle (queues/webhooks.py)."""

    row: Claimed
    status: str  # delivered | pending | dead
    code: int | None = None
    error: str | None = None
    dead_reason: str | None = None
    delay: float = 0.0


class TargetRefused(Exception):
    """The URL can never be delivered to as configured (malformed, or a forbidden address)."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """Paygate-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def _allowed(host: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address, allow: list[str]) -> bool:
    for entry in allow:
        if entry.lower() == host.lower():
            return True
        try:
            if ip in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


# host, port -> the addresses DNS answers. Injectable: a test proves with a resolver it controls
# (public at check time, private at connect time) that the connection goes to the checked address.
Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    return [str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


# The resolver deliveries use; replaced only by tests (DNS rebinding drills).
resolver: Resolver = system_resolver


def resolve_target(url: str, allow: list[str], resolve: Resolver | None = None) -> tuple[str, str, int, str, str]:
    """-> (scheme, host, port, path, pinned ip). Raises TargetRefused for URLs that can never work,
    OSError (transient) when DNS fails. The host is resolved once; every address in the answer is
    checked: private, loopback, link-local and other non-global addresses are refused unless the
    host or a CIDR covering the address is allow-listed. The connection is then made to the checked
    address (pinned), so DNS answering differently at connect time (rebinding) cannot reach it."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise TargetRefused(f"malformed URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise TargetRefused(f"malformed URL: scheme {parts.scheme or '(none)'!r} is not http or https")
    if not parts.hostname:
        raise TargetRefused("malformed URL: no host")
    if parts.username or parts.password:
        raise TargetRefused("malformed URL: credentials in the URL are not allowed")
    host = parts.hostname
    port = port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        addresses = [str(ipaddress.ip_address(host))]  # a literal address: nothing to resolve
    except ValueError:
        addresses = (resolve or resolver)(host, port)
    pinned: str | None = None
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])
        mapped = getattr(ip, "ipv4_mapped", None)
        effective = mapped or ip
        if (not effective.is_global or effective.is_multicast) and not _allowed(host, effective, allow):
            raise TargetRefused(f"refused: {host} resolves to non-public address {effective} "
                                "(add it to webhook_allow_hosts to allow)")
        pinned = pinned or address
    if pinned is None:
        raise OSError(f"{host}: no address")
    return parts.scheme, host, port, path, pinned


class _PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, pinned_ip: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._pinned_ip = pinned_ip

    def connect(self) -> None:
        self.sock = socket.create_connection((self._pinned_ip, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, pinned_ip: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._pinned_ip = pinned_ip

    def connect(self) -> None:
        sock = socket.create_connection((self._pinned_ip, self.port), self.timeout)
        # SNI and certificate checks use the hostname, not the pinned address.
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


class Redirected(Exception):
    """A 3xx answer: never followed (a redirect could point anywhere, private addresses included,
    after the target was checked); the attempt failed, with the reason."""

    def __init__(self, status: int, location: str | None) -> None:
        self.status = status
        where = f" to {location[:200]}" if location else ""
        super().__init__(f"HTTP {status}: redirect{where} not followed")


def post(url: str, body: bytes, headers: dict[str, str], *, timeout: float, allow: list[str],
         resolve: Resolver | None = None) -> int:
    """POST and return the status code (Redirected on a 3xx). A watchdog shuts the socket at the
    deadline, so a server that drips bytes cannot hold a delivery longer than `timeout`; at most
    MAX_RESPONSE_BYTES of the body are read, so a huge answer costs neither memory nor time."""
    scheme, host, port, path, ip = resolve_target(url, allow, resolve)
    cls = _PinnedHTTPSConnection if scheme == "https" else _PinnedHTTPConnection
    conn = cls(host, port, ip, timeout)
    fired = threading.Event()
    watchdog = threading.Timer(timeout, _shutdown, args=(conn, fired))
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response.read(MAX_RESPONSE_BYTES)  # the rest is never read: the connection is closed below
        if 300 <= response.status < 400:
            raise Redirected(response.status, response.getheader("Location"))
        return response.status
    except (OSError, http.client.HTTPException):
        if fired.is_set():
            raise TimeoutError(f"timed out: no complete answer within {timeout:g}s") from None
        raise
    finally:
        watchdog.cancel()
        conn.close()


def _shutdown(conn: http.client.HTTPConnection, fired: threading.Event) -> None:
    fired.set()
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def backoff_seconds(attempts: int, base: float, cap: float) -> float:
    """Exponential with equal jitter: half fixed, half random, so retries of many rows spread out."""
    delay = min(cap, base * (2 ** max(0, attempts - 1)))
    return delay / 2 + random.uniform(0, delay / 2)


def body_for(row: Claimed) -> bytes:
    created = row.created_at.isoformat() if hasattr(row.created_at, "isoformat") else str(row.created_at)
    document = {"id": str(row.event_id), "type": row.event_type, "created_at": created, "data": row.payload}
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def deliver(row: Claimed, ctx_settings: Any) -> Delivery:
    max_attempts = row.max_attempts or ctx_settings.webhook_max_attempts
    if row.endpoint_id is None or row.url is None:
        return Delivery(row, "dead", error="endpoint missing", dead_reason="endpoint missing (deleted?)")
    if not row.enabled:
        return Delivery(row, "dead", error="endpoint disabled", dead_reason="endpoint disabled")
    if row.attempts > max_attempts:  # its worker died mid-delivery on the last attempt
        return Delivery(row, "dead", error="attempts exhausted", dead_reason=f"no success in {max_attempts} attempts")
    body = body_for(row)
    timestamp = int(time.time())  # the receiver compares this with its own clock, so wall time it is
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Paygate-Event-Id": str(row.event_id),
        "Paygate-Event-Type": row.event_type,
        "Paygate-Delivery-Attempt": str(row.attempts),
        "Paygate-Signature": sign(row.secret or "", timestamp, body),
    }
    try:
        code = post(row.url, body, headers, timeout=ctx_settings.webhook_timeout,
                    allow=ctx_settings.webhook_allow_hosts)
    except TargetRefused as exc:
        return Delivery(row, "dead", error=str(exc), dead_reason=str(exc))
    except Redirected as exc:
        return _retry_or_dead(row, max_attempts, exc.status, str(exc), ctx_settings)
    except (OSError, http.client.HTTPException) as exc:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return _retry_or_dead(row, max_attempts, None, error[:500], ctx_settings)
    if 200 <= code < 300:
        return Delivery(row, "delivered", code=code)
    return _retry_or_dead(row, max_attempts, code, f"HTTP {code}", ctx_settings)


def _retry_or_dead(row: Claimed, max_attempts: int, code: int | None, error: str, settings: Any) -> Delivery:
    if row.attempts >= max_attempts:
        return Delivery(row, "dead", code=code, error=error,
                        dead_reason=f"no success in {max_attempts} attempts; last: {error}")
    delay = backoff_seconds(row.attempts, settings.webhook_backoff_base, settings.webhook_backoff_max)
    return Delivery(row, "pending", code=code, error=error, delay=delay)


def take_over_lapsed(conn: Any, settings: Any, *, grace: float, batch: int, by: str) -> list[tuple[int, str]]:
    """Rows whose delivery lease lapsed more than `grace` seconds ago -> pending (or dead when their
    attempts are spent). -> [(id, new status)]."""
    return conn.execute(outbox.TAKE_OVER_SQL, {"grace": grace, "batch": batch, "by": by,
                                               "max_attempts": settings.webhook_max_attempts}).fetchall()


def take_over(ctx: TickContext, grace: float) -> dict[str, int]:
    """Recovery's entry (the same routine the tick runs with grace 0): deliveries whose lease lapsed
    more than `grace` seconds ago, in one transaction. -> how many went to each status."""
    with ctx.conn.transaction():
        taken = take_over_lapsed(ctx.conn, ctx.settings, grace=grace, batch=ctx.batch, by="recovery")
    return {status: sum(1 for _, s in taken if s == status) for status in {s for _, s in taken}}


# A webhook tick holds nothing between ticks (its claims are settled in the same tick), so a
# drained instance's tick has nothing to finish and claims nothing new.
HONOURS_DRAIN = True


def tick(ctx: TickContext) -> TickResult:
    settings = ctx.settings
    if ctx.draining:
        return TickResult(details={"draining": True})
    with ctx.conn.transaction():
        # Lapsed rows first: back to pending (now due), so the claim below takes them in this transaction.
        take_over_lapsed(ctx.conn, settings, grace=0.0, batch=ctx.batch, by="webhooks")
        cursor = ctx.conn.execute(outbox.CLAIM_SQL, {"batch": ctx.batch, "lease": settings.webhook_lease,
                                              "instance": f"{ctx.instance_id}:{ctx.slot}"})
        rows = [Claimed(*record) for record in cursor.fetchall()]
    if not rows:
        return TickResult()
    crashpoint("webhooks.after_claim")
    assert_not_in_transaction(ctx.conn, "webhook delivery")
    with ThreadPoolExecutor(max_workers=min(16, len(rows)), thread_name_prefix="webhook") as pool:
        deliveries = list(pool.map(lambda row: deliver(row, settings), rows))
    crashpoint("webhooks.after_post")
    lost = 0
    with ctx.conn.transaction():
        for d in deliveries:
            params = {"status": d.status, "code": d.code, "error": d.error, "dead_reason": d.dead_reason,
                      "delay": d.delay, "id": d.row.id, "token": d.row.lease_token}
            if ctx.conn.execute(outbox.SETTLE_SQL, params).rowcount != 1:
                lost += 1  # lease lapsed and someone else owns the row now: their result stands
    counts = {status: sum(1 for d in deliveries if d.status == status) for status in ("delivered", "pending", "dead")}
    for d in deliveries:
        if d.status == "dead":
            ctx.log.warning("webhook %s dead: %s", d.row.event_id, d.dead_reason,
                            extra={"msgid": "webhooks.dead", "outbox_id": d.row.id})
    # A customer's failing endpoint is the customer's incident, not this worker's failure: it is
    # counted in the details and the queue depths; `failed` means our own side went wrong.
    return TickResult(processed=len(rows), failed=lost,
                      details={**counts, "retrying": counts["pending"], "lease_lost": lost})
