"""A customer's webhook endpoint on 127.0.0.1, scriptable per path: /ok, /fail (500), /hang (never
answers in time), /flaky (fails N times). Records every request with its headers and body."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Receiver:
    requests: list[dict[str, Any]] = field(default_factory=list)
    flaky_failures: int = 2
    hang_seconds: float = 30.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def base(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    receiver.requests.append({"path": self.path, "headers": dict(self.headers), "body": body,
                                              "at": time.monotonic()})
                    flaky = self.path == "/flaky" and receiver.flaky_failures > 0
                    if flaky:
                        receiver.flaky_failures -= 1
                if self.path == "/hang":
                    time.sleep(receiver.hang_seconds)
                status = 500 if self.path == "/fail" or flaky else 200
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass

            def log_message(self, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    def paths(self) -> list[str]:
        with self.lock:
            return [r["path"] for r in self.requests]
