"""The devnet's HTTP JSON-RPC server: stdlib ThreadingHTTPServer, one lock around the ledger state.

JSON-RPC 2.0 over POST on any path, like stellar-rpc. Admin methods (`devnet_*`) steer the devnet:
close ledgers, fund accounts, inject faults. They are never subject to faults themselves.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets as pysecrets
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from stellar_sdk import Keypair, StrKey, xdr

from paygate_cli.sandbox.devnet import fees, friendbot, persist
from paygate_cli.sandbox.devnet.faults import FaultError, Faults
from paygate_cli.sandbox.devnet.ledger import Devnet
from paygate_cli.sandbox.devnet.rpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    Methods,
    RpcError,
    opt_int,
    opt_str,
)

log = logging.getLogger("paygate.devnet")

MAX_BODY = 1024 * 1024  # request bodies above this get an error, never a hang
MAX_DRAIN = 8 * 1024 * 1024  # read-and-discard up to this much so the client sees the answer
READ_TIMEOUT = 30.0  # seconds a connection may stall mid-request
PARSE_ERROR = -32700
DEFAULT_MANUAL_ADVANCE = 5  # seconds of close time per manually closed ledger
FRIENDBOT_TIMEOUT = 30.0  # seconds a friendbot request waits for its transaction to be applied
MAX_ADVANCE = 6_220_800  # ledgers one devnet_advance closes at most: two maximum TTLs (about a year)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the stdlib default of 5 refuses bursts of concurrent clients


@dataclass
class Config:
    host: str = "127.0.0.1"
    port: int = 0
    interval: float | None = None  # seconds between automatic closes; None = manual
    state: Path | None = None


class DevnetServer:
    def __init__(self, dev: Devnet, config: Config) -> None:
        self.dev = dev
        self.config = config
        self.faults = Faults()
        dev.surge_demand = self.faults.surge_demand  # the surge fault's phantoms compete in each close
        self.methods = Methods(dev, self.faults)
        self.admin = {
            "devnet_closeLedger": self.close_ledger,
            "devnet_advance": self.advance,
            "devnet_fund": self.fund,
            "devnet_createAccount": self.create_account,
            "devnet_setFault": self.set_fault,
            "devnet_clearFaults": self.clear_faults,
            "devnet_consumeSequence": self.consume_sequence,
            "devnet_setLimits": self.set_limits,
            "devnet_state": self.state,
            "devnet_genesis": self.genesis,
        }
        self._stop = threading.Event()
        self._closer: threading.Thread | None = None
        self.httpd = _HTTPServer((config.host, config.port), _handler_class(self))
        # stellar-rpc's getNetwork advertises the network's friendbot (get_network.go FriendbotURL).
        self.methods.friendbot_url = f"{self.url}/friendbot"

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    # ----- lifecycle ------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        if self.config.interval is not None:
            self._closer = threading.Thread(target=self._auto_close, name="devnet-closer", daemon=True)
            self._closer.start()
        self.httpd.serve_forever(poll_interval=0.2)

    def shutdown(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        with self.dev.lock:
            self.save()

    def save(self) -> None:
        if self.config.state is not None:
            persist.save(self.dev, self.config.state)

    def _auto_close(self) -> None:
        assert self.config.interval is not None
        step = max(1, round(self.config.interval))
        next_at = time.monotonic() + self.config.interval
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.config.interval
            try:
                with self.dev.lock:
                    self._close(1, step)
            except Exception:  # e.g. the state file became unwritable: keep closing, say so
                log.exception("automatic ledger close failed")

    def _close(self, n: int, advance: int) -> list[dict]:
        applied = []
        for _ in range(n):
            for r in self.dev.close_ledger(advance):
                applied.append({"hash": r.full_hash, "innerHash": r.inner_hash, "status": r.status,
                                "ledger": r.ledger, "applicationOrder": r.application_order})
            self.faults.ledger_closed()
        log.info("closed ledger %d (close time %d, %d tx)", self.dev.latest, self.dev.latest_info.close_time,
                 len(applied))
        self.save()
        return applied

    # ----- dispatch -------------------------------------------------------------------------------

    def dispatch(self, req: Any) -> tuple[dict | None, str | None]:
        """One JSON-RPC request → (response, after). `after` is "lose" when the answer must be lost."""
        if not isinstance(req, dict):
            return _error(None, INVALID_REQUEST, "invalid request: expected a JSON object"), None
        rid = req.get("id")
        if req.get("jsonrpc") != "2.0" or not isinstance(req.get("method"), str):
            return _error(rid, INVALID_REQUEST, "invalid request: need jsonrpc \"2.0\" and a method"), None
        method = req["method"]
        params = req.get("params")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return _error(rid, INVALID_PARAMS, "invalid parameters: params must be an object (by name)"), None
        try:
            if method in self.admin:
                with self.dev.lock:
                    return _result(rid, self.admin[method](params)), None
            handler = self.methods.table.get(method)
            if handler is None:
                return _error(rid, METHOD_NOT_FOUND, f"method {method!r} not found"), None
            if method == "sendTransaction":
                return self._send(rid, params)
            with self.dev.lock:
                return _result(rid, handler(params)), None
        except RpcError as exc:
            return _error(rid, exc.code, exc.message, exc.data), None
        except Exception as exc:  # a bug must answer -32603, never kill the connection thread
            log.exception("internal error in %s", method)
            return _error(rid, INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}"), None

    def _send(self, rid: Any, params: dict) -> tuple[dict, str | None]:
        with self.dev.lock:
            p = self.methods.parse_tx_param(params)
            forced = "TRY_AGAIN_LATER" if self.faults.take("try_again_later", "sendTransaction") else None
            reject = self.faults.take("reject_send", "sendTransaction", p.source) if forced is None else None
            result, queued_p = self.methods.send_transaction(
                params, p, forced_status=forced, forced_error=getattr(xdr.TransactionResultCode, reject.code)
                if reject is not None else None)
            if queued_p is not None:
                q = next(q for q in self.dev.queue if q.p is queued_p)
                hold = self.faults.take("hold_next", "sendTransaction")
                if hold is not None:
                    q.hold_until = self.dev.latest + 1 + hold.ledgers
                if self.faults.take("drop_next", "sendTransaction") is not None:
                    q.never = True
            log.debug("sendTransaction %s → %s", result["hash"], result["status"])
        lose = self.faults.take("lose_send_answer", "sendTransaction")
        return _result(rid, result), "lose" if lose else None

    # ----- friendbot -----------------------------------------------------------------------------

    def friendbot(self, raw_query: str) -> friendbot.Answer:
        """Fund `addr` like Stellar's friendbot and answer once the transaction is applied."""
        addr, bad = friendbot.parse_addr(raw_query)
        if bad is not None or addr is None:
            assert bad is not None
            return bad
        deadline = time.monotonic() + FRIENDBOT_TIMEOUT
        while True:
            with self.dev.lock:
                funded = friendbot.already_funded(self.dev, addr)
                if funded is not None:
                    return funded
                status, tx_hash = friendbot.submit(self.dev, friendbot.build_funding(self.dev, addr))
                if status == "PENDING" and self.config.interval is None:
                    self._close(1, DEFAULT_MANUAL_ADVANCE)  # horizon's submit waits for the ledger
            if status == "PENDING":
                break
            # TRY_AGAIN_LATER: the bot's previous funding is still queued (interval mode); wait for it.
            if status != "TRY_AGAIN_LATER" or time.monotonic() > deadline:
                return friendbot.problem(500, "server_error", "Internal Server Error",
                                         f"friendbot transaction not accepted: {status}")
            time.sleep(0.05)
        while True:
            with self.dev.lock:
                rec = self.dev.txs.get(tx_hash)
                if rec is not None:
                    return friendbot.success(self.dev, rec, self.url)
            if time.monotonic() > deadline:
                return friendbot.problem(504, "timeout", "Timeout",
                                         "Your request timed out before completing.")
            time.sleep(0.05)

    # ----- admin methods --------------------------------------------------------------------------

    def close_ledger(self, params: dict) -> dict:
        n = opt_int(params, "n", minimum=1) or 1
        if n > 100_000:
            raise RpcError(INVALID_PARAMS, "n must be <= 100000")
        advance = opt_int(params, "advanceSeconds")
        if advance is None:
            advance = round(self.config.interval) if self.config.interval else DEFAULT_MANUAL_ADVANCE
        applied = self._close(n, advance)
        return {"latestLedger": self.dev.latest, "closeTime": self.dev.latest_info.close_time, "applied": applied}

    def advance(self, params: dict) -> dict:
        """Close `ledgers` ledgers at once, `advanceSeconds` apart (state archival tests: months in
        seconds). While transactions are queued, ledgers close normally; the rest hold nothing and are
        closed in bulk (Devnet.close_empty), expiry applied as of the last one."""
        n = opt_int(params, "ledgers", minimum=1)
        if n is None:
            raise RpcError(INVALID_PARAMS, "ledgers: required, >= 1")
        if n > MAX_ADVANCE:
            raise RpcError(INVALID_PARAMS, f"ledgers must be <= {MAX_ADVANCE}")
        advance = opt_int(params, "advanceSeconds")
        if advance is None:
            advance = round(self.config.interval) if self.config.interval else DEFAULT_MANUAL_ADVANCE
        applied: list[dict] = []
        done = 0
        while done < n and (self.dev.queue or self.dev.pending_consume):
            applied += self._close(1, advance)
            done += 1
        deleted = archived = 0
        if done < n:
            deleted, archived = self.dev.close_empty(n - done, advance)
            surge = max((f["ledgers"] for f in self.faults.describe() if f["kind"] == "surge"), default=0)
            for _ in range(min(n - done, surge)):  # a surge lasting `ledgers` closes counts these down too
                self.faults.ledger_closed()
            self.save()
        log.info("advanced to ledger %d (close time %d)", self.dev.latest, self.dev.latest_info.close_time)
        return {"latestLedger": self.dev.latest, "closeTime": self.dev.latest_info.close_time, "applied": applied,
                "expired": {"deleted": deleted, "archived": archived},
                "archivedEntries": self.dev.host.archived_count()}

    def _account_param(self, params: dict, name: str = "account") -> str:
        g = opt_str(params, name)
        if g is None or not StrKey.is_valid_ed25519_public_key(g):
            raise RpcError(INVALID_PARAMS, f"{name}: expected a G… account id")
        return g

    def fund(self, params: dict) -> dict:
        g = opt_str(params, "account")
        if g is None or not (StrKey.is_valid_ed25519_public_key(g) or StrKey.is_valid_contract(g)):
            raise RpcError(INVALID_PARAMS, "account: expected a G… or C… address")
        xlm = opt_int(params, "xlm") or 0
        usdc = opt_int(params, "usdc") or 0
        sac = self.dev.genesis.get("contracts", {}).get("usdc")
        if g.startswith("G") and (xlm or g not in self.dev.accounts):
            self.dev.fund_xlm(g, xlm)
        if usdc:
            if sac is None:
                raise RpcError(INVALID_PARAMS, "no USDC contract deployed")
            self.dev.host.mint(sac, g, usdc)
        out: dict[str, Any] = {"account": g}
        if g in self.dev.accounts:
            out["xlm"] = self.dev.accounts[g].balance
        if sac is not None:
            out["usdc"] = self.dev.host.token_balance(sac, g)
        return out

    def create_account(self, params: dict) -> dict:
        g = opt_str(params, "account")
        secret = None
        if g is None:
            kp = Keypair.from_raw_ed25519_seed(pysecrets.token_bytes(32))
            g, secret = kp.public_key, kp.secret
            self.dev.secrets[g] = secret
        elif not StrKey.is_valid_ed25519_public_key(g):
            raise RpcError(INVALID_PARAMS, "account: expected a G… account id")
        if g in self.dev.accounts:
            raise RpcError(INVALID_PARAMS, f"account {g} already exists")
        xlm = opt_int(params, "xlm")
        self.dev.create_account(g, 100 * 10_000_000 if xlm is None else xlm)
        out = {"account": g, "xlm": self.dev.accounts[g].balance, "seq": str(self.dev.accounts[g].seq)}
        if secret:
            out["secret"] = secret
        return out

    def set_fault(self, params: dict) -> dict:
        try:
            self.faults.set(params.get("kind"), params.get("count"), params.get("ms", 0),
                            params.get("ledgers", 0), params.get("methods"), params.get("account"),
                            params.get("code"), params.get("rate"), params.get("txs"))
        except FaultError as exc:
            raise RpcError(INVALID_PARAMS, str(exc)) from exc
        log.warning("fault set: %s", params)
        return {"faults": self.faults.describe()}

    def clear_faults(self, params: dict) -> dict:
        self.faults.clear(opt_str(params, "kind"))
        return {"faults": self.faults.describe()}

    def consume_sequence(self, params: dict) -> dict:
        g = self._account_param(params)
        if g not in self.dev.accounts:
            raise RpcError(INVALID_PARAMS, f"account {g} does not exist")
        self.dev.pending_consume.append(g)
        return {"account": g, "atLedger": self.dev.latest + 1}

    def set_limits(self, params: dict) -> dict:
        """Change the ledger capacity of a running devnet (from the next close on)."""
        soroban = opt_int(params, "ledgerMaxSorobanTxs", minimum=1)
        classic = opt_int(params, "ledgerMaxClassicOps", minimum=1)
        if soroban is not None:
            self.dev.ledger_max_soroban_txs = soroban
        if classic is not None:
            self.dev.ledger_max_classic_ops = classic
        log.warning("limits set: %s", self.limits())
        return self.limits()

    def limits(self) -> dict:
        d = self.dev
        return {"ledgerMaxSorobanTxs": d.ledger_max_soroban_txs, "ledgerMaxClassicOps": d.ledger_max_classic_ops,
                "sorobanQueueLimit": fees.QUEUE_MULTIPLIER * d.ledger_max_soroban_txs,
                "feeStatsWindowSoroban": d.fee_window_soroban, "feeStatsWindowClassic": d.fee_window_classic}

    def state(self, params: dict) -> dict:
        d = self.dev
        return {
            "latestLedger": d.latest, "closeTime": d.latest_info.close_time, "oldestLedger": d.oldest_available(),
            "retention": d.retention, "accounts": len(d.accounts),
            "queue": [{"hash": q.p.full_hash.hex(), "innerHash": q.p.inner_hash.hex(), "source": q.p.source,
                       "seq": str(q.p.seq), "feeSource": q.p.fee_source, "fee": q.p.fee, "addedLedger": q.added_ledger,
                       "holdUntil": q.hold_until, "never": q.never,
                       "rate": q.p.inclusion_fee // max(1, q.p.fee_ops)} for q in d.queue],
            "bans": {h.hex(): until for h, until in d.bans.items()},
            "transactions": sum(len(v) for v in d.txs_by_ledger.values()),
            "events": sum(len(v) for v in d.events_by_ledger.values()),
            "faults": self.faults.describe(),
            "pendingConsume": list(d.pending_consume),
            "ledgerInterval": self.config.interval,
            "limits": self.limits(),
        }

    def genesis(self, params: dict) -> dict:
        from paygate_cli.sandbox.devnet.genesis import genesis_line

        return genesis_line(self.dev, self.url, _interval_str(self.config.interval))


def _interval_str(interval: float | None) -> str:
    return "manual" if interval is None else f"{interval:g}s"


def _result(rid: Any, result: Any) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def _error(rid: Any, code: int, message: str, data: Any = None) -> dict:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": rid, "error": err}


def _handler_class(server: DevnetServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the SDK reuses one session
        timeout = READ_TIMEOUT
        server_version = "paygate-devnet"
        sys_version = ""

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in separate writes; without TCP_NODELAY, Nagle plus the
            # client's delayed ACK stalls every keep-alive answer by ~40 ms.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.client_address[0], *args)

        def _send_json(self, status: int, body: Any) -> None:
            data = json.dumps(body, separators=(",", ":")).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _send_plain(self, status: int, text: str) -> None:
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _drop(self) -> None:
            """Close the connection without a byte of answer: the client sees a dropped connection."""
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(2)

        def _friendbot_query(self) -> str | None:
            """The query string when this request is for /friendbot, else None."""
            parts = urllib.parse.urlsplit(self.path)
            return parts.query if parts.path.rstrip("/") == "/friendbot" else None

        def _answer_friendbot(self, query: str) -> None:
            ans = server.friendbot(query)
            data = json.dumps(ans.body, separators=(",", ":")).encode()
            self.send_response(ans.status)
            self.send_header("Content-Type", ans.content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            query = self._friendbot_query()
            if query is not None:
                self._answer_friendbot(query)
                return
            self._send_json(405, _error(None, INVALID_REQUEST, "use POST with a JSON-RPC body"))

        def do_POST(self) -> None:
            query = self._friendbot_query()
            if query is not None:  # friendbot also takes POST with a form body (main.go initRouter)
                length_f = self.headers.get("Content-Length", "0").strip()
                size = int(length_f) if length_f.isdigit() and int(length_f) <= MAX_BODY else 0
                form = self.rfile.read(size).decode(errors="replace") if size else ""
                self._answer_friendbot("&".join(x for x in (query, form) if x))
                return
            length_h = self.headers.get("Content-Length")
            if length_h is None or not length_h.strip().isdigit():
                self.close_connection = True
                self._send_json(200, _error(None, INVALID_REQUEST, "a Content-Length header is required"))
                return
            length = int(length_h)
            if length > MAX_BODY:
                self.close_connection = True
                if length <= MAX_DRAIN:
                    self._discard(length)
                self._send_json(200, _error(None, INVALID_REQUEST,
                                            f"request body too large ({length} > {MAX_BODY} bytes)"))
                return
            try:
                raw = self.rfile.read(length)
            except OSError:
                self.close_connection = True
                return
            try:
                req = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                self._send_json(200, _error(None, PARSE_ERROR, "parse error: body is not JSON"))
                return
            methods = _method_names(req)
            public = [m for m in methods if m not in server.admin]
            if public or not methods:
                if server.faults.peek("down"):
                    self._drop()
                    return
                name = public[0] if public else ""
                if server.faults.take("http_503", name):
                    self._send_plain(503, "service unavailable: backlog full")
                    return
                if server.faults.take("http_504", name):
                    self._send_plain(504, "request exceeded processing time")
                    return
                slow = server.faults.take("slow", name)
                if slow is not None:
                    time.sleep(slow.ms / 1000)
            lose = False
            if isinstance(req, list):
                if not req:
                    self._send_json(200, _error(None, INVALID_REQUEST, "empty batch"))
                    return
                out = []
                for item in req:
                    resp, after = server.dispatch(item)
                    lose |= after == "lose"
                    out.append(resp)
                body: Any = out
            else:
                body, after = server.dispatch(req)
                lose = after == "lose"
            if lose:
                self._drop()
                return
            self._send_json(200, body)

        def _discard(self, length: int) -> None:
            left = length
            try:
                while left > 0:
                    chunk = self.rfile.read(min(left, 65536))
                    if not chunk:
                        break
                    left -= len(chunk)
            except OSError:
                pass

    return Handler


def _method_names(req: Any) -> list[str]:
    items = req if isinstance(req, list) else [req]
    return [i["method"] for i in items if isinstance(i, dict) and isinstance(i.get("method"), str)]
