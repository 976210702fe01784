"""A misbehaving Stellar RPC provider for tests: a tiny loopback JSON-RPC server we control.

It stands outside paygate (as any RPC provider does) and answers each method with whatever the test
put in `answers`: a JSON-RPC result (wrapped in a well-formed envelope), a whole response document,
raw bytes (non-JSON, HTML), or a truncated body (a Content-Length longer than what is sent)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Raw:
    """Send exactly these bytes as the body (status 200 unless said otherwise)."""

    body: bytes
    status: int = 200
    truncate: bool = False  # announce a longer body than is sent, then close the connection


@dataclass
class Document:
    """Send this whole JSON document (not wrapped in a JSON-RPC envelope)."""

    value: Any


class HostileRpc:
    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}
        self.calls: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet: pytest captures stderr anyway
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    request = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    request = {}
                method = str(request.get("method", ""))
                server.calls.append(method)
                answer = server.answers.get(method, Raw(b'{"jsonrpc": "2.0", "id": 1, "error": '
                                                        b'{"code": -32601, "message": "method not found"}}'))
                if isinstance(answer, Raw):
                    body, status, truncate = answer.body, answer.status, answer.truncate
                elif isinstance(answer, Document):
                    body, status, truncate = json.dumps(answer.value).encode(), 200, False
                else:
                    body = json.dumps({"jsonrpc": "2.0", "id": request.get("id", 1), "result": answer}).encode()
                    status, truncate = 200, False
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body) + (100 if truncate else 0)))
                self.end_headers()
                self.wfile.write(body)
                if truncate:
                    self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
