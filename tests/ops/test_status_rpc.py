"""`paygate status` reads RPC health: an unreachable endpoint makes the gateway not ready."""

from __future__ import annotations

import json
from pathlib import Path

from paygate_cli.errors import ExitCode
from tests.support.chain_env import chain_environ
from tests.support.cli import run_cli
from tests.support.devnet_support import start_devnet


def test_status_reports_rpc_health_and_lag(tmp_path: Path, dsn: str) -> None:
    devnet = start_devnet(tmp_path / "devnet", lanes=1, users=1)
    try:
        environ = chain_environ(devnet, dsn, tmp_path / "keys")
        healthy = run_cli("status", "--json", environ=environ)
        assert healthy.code == 0, healthy.err
        [endpoint_w, endpoint_r] = json.loads(healthy.out)["status"]["rpc"]["endpoints"]
        assert endpoint_w["status"] == endpoint_r["status"] == "healthy" and endpoint_r["lag_ledgers"] == 0
        devnet.set_fault("down")
        down = run_cli("status", "--json", environ=environ)
        assert down.code == ExitCode.FAILED
        assert any("unreachable" in p for p in json.loads(down.out)["status"]["problems"])
    finally:
        devnet.stop()
