"""Start the devnet process (`paygate devnet start`) and talk to a running one (admin client).

Kept apart from the CLI module so `commands/devnet.py` only parses and renders.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TextIO

from paygate_cli.errors import ConfigError, Unavailable, UsageError

log = logging.getLogger("paygate.devnet")

_INTERVAL = re.compile(r"^(\d+(?:\.\d+)?)(ms|s)?$")


def parse_interval(text: str) -> float | None:
    """'manual' → None; '5s', '5', '500ms' → seconds."""
    t = text.strip().lower()
    if t == "manual":
        return None
    m = _INTERVAL.match(t)
    if not m:
        raise UsageError(f"--ledger-interval must be 'manual' or a duration like 5s or 500ms, not {text!r}")
    value = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
    if value <= 0:
        raise UsageError("--ledger-interval must be positive")
    return value


def start(*, host: str, port: int, ledger_interval: str, state: Path | None, retention: int, seed: str,
          lanes: int, users: int, ledger_max_soroban_txs: int = 100, ledger_max_classic_ops: int = 1000,
          fee_stats_window_soroban: int = 50, fee_stats_window_classic: int = 10,
          min_persistent_ttl: int = 2_073_600, min_temporary_ttl: int = 17_280, max_entry_ttl: int = 3_110_400,
          out: TextIO = sys.stdout) -> None:
    """Build or load the ledger, print the genesis line, serve until SIGTERM/SIGINT, save state."""
    from paygate_cli.sandbox.devnet import genesis, persist
    from paygate_cli.sandbox.devnet.server import Config, DevnetServer, _interval_str
    from paygate_cli.sandbox.devnet.storage import TtlConfig

    # Handlers first: once a client has read the genesis line, SIGTERM/SIGINT must stop us cleanly.
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    interval = parse_interval(ledger_interval)
    if retention < 1:
        raise UsageError("--retention must be >= 1")
    if lanes < 0 or users < 0:
        raise UsageError("--lanes and --users must be >= 0")
    if ledger_max_soroban_txs < 1 or ledger_max_classic_ops < 1:
        raise UsageError("--ledger-max-soroban-txs and --ledger-max-classic-ops must be >= 1")
    if fee_stats_window_soroban < 1 or fee_stats_window_classic < 1:
        raise UsageError("--fee-stats-window-soroban and --fee-stats-window-classic must be >= 1")
    if min(min_persistent_ttl, min_temporary_ttl) < 1 or max(min_persistent_ttl, min_temporary_ttl) > max_entry_ttl:
        raise UsageError("--min-persistent-ttl and --min-temporary-ttl must be >= 1 and <= --max-entry-ttl")
    ttl = TtlConfig(min_persistent=min_persistent_ttl, min_temporary=min_temporary_ttl, max_entry=max_entry_ttl)
    if state is not None and state.exists():
        try:
            dev = persist.load(state)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot load devnet state {state}: {exc}") from exc
        dev.retention = retention
        log.info("loaded state from %s at ledger %d", state, dev.latest)
    else:
        # Genesis close time is the wall clock at first start, so SDK `set_timeout` envelopes (which
        # use the local clock) are valid; after genesis, close time advances only by ledger closes.
        dev = genesis.build(seed, lanes, users, retention, int(time.time()), ttl=ttl)
    dev.host.ttl = ttl  # state archival settings come from the flags, also over a loaded state
    # The fee market's settings come from the flags, also over a loaded state (like --retention).
    dev.ledger_max_soroban_txs, dev.ledger_max_classic_ops = ledger_max_soroban_txs, ledger_max_classic_ops
    dev.fee_window_soroban, dev.fee_window_classic = fee_stats_window_soroban, fee_stats_window_classic
    try:
        srv = DevnetServer(dev, Config(host=host, port=port, interval=interval, state=state))
    except OSError as exc:
        raise Unavailable(f"cannot listen on {host}:{port}: {exc}") from exc
    srv.save()
    out.write(json.dumps(genesis.genesis_line(dev, srv.url, _interval_str(interval))) + "\n")
    out.flush()
    log.info("devnet serving on %s (ledger %d, interval %s)", srv.url, dev.latest, _interval_str(interval))

    t = threading.Thread(target=srv.serve_forever, name="devnet-http", daemon=True)
    t.start()
    while not stop.wait(0.5):
        if not t.is_alive():
            break
    log.info("devnet shutting down")
    srv.shutdown()


def call(url: str, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
    """One JSON-RPC call to a running devnet; Unavailable if it cannot be reached."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise Unavailable(f"devnet at {url} is unreachable: {exc}") from exc
    if not isinstance(data, dict) or not ("error" in data or "result" in data):
        raise Unavailable(f"devnet at {url} answered {method} with something that is not JSON-RPC")
    if "error" in data:
        err = data["error"] if isinstance(data["error"], dict) else {"message": data["error"]}
        raise UsageError(f"{method}: {err.get('message')} (code {err.get('code')})")
    return data["result"]
