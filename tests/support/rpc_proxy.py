"""A loopback stand-in for an RPC provider in front of a real devnet.

The provider is outside paygate, so a test may make it misbehave: each JSON-RPC request is forwarded
to `upstream` over real HTTP, and `rewrite(request, answer)` (a subclass's) decides what paygate
gets back. `host` lets one proxy stand for another provider than the devnet's own host (quorum
reads count distinct hosts)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests


class RpcProxy:
    def __init__(self, upstream: str, *, host: str = "127.0.0.1") -> None:
        session = requests.Session()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = json.loads(body or b"{}")
                answer = session.post(upstream, data=body, headers={"Content-Type": "application/json"},
                                      timeout=30).json()
                out = json.dumps(proxy.rewrite(request, answer)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.host = host
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def rewrite(self, request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        """The answer paygate receives for `request` (the devnet's own, unless a subclass says otherwise)."""
        return answer

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
