"""`status` reads RPC health: an unreachable endpoint makes the gateway not ready. It shows each
read endpoint's latest ledger and lag, and what the money movers' quorum read of
the latest ledger decides from them: with one read host lying (far ahead), lagging, or two of three
not answering, which host disagreed and what each said. The RPC providers are outside paygate, so
tests/support/rpc_proxy.py stands in for them (real loopback HTTP servers on their own host
addresses, in front of a real devnet)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from paygate_cli.chain.health import ledger_quorum, quorum_need
from paygate_cli.errors import ExitCode, Unavailable
from tests.support.chain_env import chain_environ
from tests.support.cli import run_cli
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.rpc_proxy import RpcProxy


class ShiftedHead(RpcProxy):
    """A read host whose getHealth and getLatestLedger claim `shift` ledgers more (or fewer) than the devnet."""

    def __init__(self, upstream: str, host: str, shift: int) -> None:
        self.shift = shift
        super().__init__(upstream, host=host)

    def rewrite(self, request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        result = answer.get("result")
        if request.get("method") == "getHealth" and isinstance(result, dict):
            result["latestLedger"] += self.shift
        if request.get("method") == "getLatestLedger" and isinstance(result, dict):
            result["sequence"] += self.shift
        return answer


class Refusing(RpcProxy):
    """A read host that answers every ledger question with a JSON-RPC error (its network reads still work)."""

    def rewrite(self, request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        if request.get("method") in ("getHealth", "getLatestLedger"):
            return {"jsonrpc": "2.0", "id": request.get("id", 1),
                    "error": {"code": -32603, "message": "node is catching up"}}
        return answer


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path_factory.mktemp("devnet"), lanes=1, users=1)
    yield handle
    handle.stop()


def status(devnet: DevnetHandle, dsn: str, tmp_path: Path, read_urls: list[str]) -> tuple[int, dict[str, Any]]:
    environ = chain_environ(devnet, dsn, tmp_path / "keys") | {"PAYGATE_RPC_READ_URLS": ",".join(read_urls)}
    result = run_cli("status", "--json", environ=environ)
    assert result.out, result.err
    return result.code, json.loads(result.out)["status"]


def test_status_reports_rpc_health_and_lag(devnet: DevnetHandle, tmp_path: Path, dsn: str) -> None:
    environ = chain_environ(devnet, dsn, tmp_path / "keys")
    healthy = run_cli("status", "--json", environ=environ)
    assert healthy.code == 0, healthy.err
    [endpoint_w, endpoint_r] = json.loads(healthy.out)["status"]["rpc"]["endpoints"]
    assert endpoint_w["status"] == endpoint_r["status"] == "healthy" and endpoint_r["lag_ledgers"] == 0
    try:
        devnet.set_fault("down")
        down = run_cli("status", "--json", environ=environ)
    finally:
        devnet.clear_faults()
    assert down.code == ExitCode.FAILED
    assert any("unreachable" in p for p in json.loads(down.out)["status"]["problems"])


def test_quorum_rule_is_a_strict_majority() -> None:
    assert [quorum_need(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert ledger_quorum([100, 9000, 101], 3).ledger == 101  # two hosts reached 101; 9000 is one claim
    assert ledger_quorum([100, 9000, 101], 3).highest == 9000
    assert ledger_quorum([100], 3).ledger is None


def test_a_lying_read_host_is_named_with_what_each_said(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> None:
    liar, honest = ShiftedHead(devnet.url, "127.0.0.2", 5000), ShiftedHead(devnet.url, "127.0.0.3", 0)
    try:
        code, report = status(devnet, dsn, tmp_path, [liar.url, honest.url, devnet.url])
    finally:
        liar.close()
        honest.close()
    quorum = report["rpc"]["quorum"]
    assert code == ExitCode.FAILED and report["ready"] is False
    assert (quorum["read_hosts"], quorum["need"], quorum["answered"], quorum["decided"]) == (3, 2, 3, True)
    assert quorum["highest"] - quorum["ledger"] >= 5000 - 2
    [disagreeing] = quorum["disagreeing"]
    assert (disagreeing["url"], disagreeing["side"]) == (liar.url.removeprefix("http://"), "ahead")
    assert [a["url"] for a in quorum["answers"]] == [u.removeprefix("http://") for u in
                                                     (liar.url, honest.url, devnet.url)]
    # Each endpoint's lag is against the highest seen: the honest ones "lag" the liar by ~5000.
    lags = {e["url"]: e["lag_ledgers"] for e in report["rpc"]["endpoints"] if e["role"] == "read"}
    assert lags[liar.url.removeprefix("http://")] == 0 and lags[honest.url.removeprefix("http://")] >= 4998
    [problem] = [p for p in report["problems"] if "RPC" in p]
    assert problem.startswith(f"RPC read endpoint {liar.url.removeprefix('http://')} says ledger")
    assert "ahead of ledger" in problem


def test_a_lagging_read_host_is_shown_not_a_problem(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> None:
    devnet.close_ledger(60)  # room below the head for a host 50 ledgers behind
    lagging, honest = ShiftedHead(devnet.url, "127.0.0.2", -50), ShiftedHead(devnet.url, "127.0.0.3", 0)
    try:
        code, report = status(devnet, dsn, tmp_path, [lagging.url, honest.url, devnet.url])
    finally:
        lagging.close()
        honest.close()
    quorum = report["rpc"]["quorum"]
    assert (code, report["problems"]) == (ExitCode.OK, [])
    [disagreeing] = quorum["disagreeing"]
    assert (disagreeing["url"], disagreeing["side"]) == (lagging.url.removeprefix("http://"), "behind")
    assert 48 <= disagreeing["by_ledgers"] <= 52
    lags = {e["url"]: e["lag_ledgers"] for e in report["rpc"]["endpoints"] if e["role"] == "read"}
    assert 48 <= lags[lagging.url.removeprefix("http://")] <= 52


def test_no_quorum_names_what_each_read_host_said(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> None:
    first, second = Refusing(devnet.url, host="127.0.0.2"), Refusing(devnet.url, host="127.0.0.3")
    try:
        code, report = status(devnet, dsn, tmp_path, [first.url, second.url, devnet.url])
        environ = chain_environ(devnet, dsn, tmp_path / "human") | {
            "PAYGATE_RPC_READ_URLS": f"{first.url},{second.url},{devnet.url}"}
        human = run_cli("status", "--plain", environ=environ)
        # The money movers' own quorum read keeps the same evidence in its error (and so in the
        # heartbeat `status` shows): the answering host's ledger and the others' errors.
        from paygate_cli.chain.rpc import ChainClient
        from paygate_cli.settings import load_settings

        client = ChainClient(load_settings(environ))
        try:
            with pytest.raises(Unavailable) as refused:
                client.latest_ledger_quorum()
        finally:
            client.close()
    finally:
        first.close()
        second.close()
    quorum = report["rpc"]["quorum"]
    assert code == ExitCode.FAILED
    assert (quorum["answered"], quorum["decided"], quorum["ledger"]) == (1, False, None)
    said = {a["url"]: a["said"] for a in quorum["answers"]}
    assert "node is catching up" in said[first.url.removeprefix("http://")]
    assert said[devnet.url.removeprefix("http://")].startswith("ledger ")
    assert any(p.startswith("RPC read quorum cannot decide the latest ledger: 1 of 3 read hosts answered, a "
                            "decision needs 2") for p in report["problems"]), report["problems"]
    [row] = [line for line in human.out.splitlines() if line.startswith("rpc:quorum\t")]
    assert "\tno decision\t" in row and "node is catching up" in row
    message = str(refused.value)
    assert "1 of 3 read hosts answered" in message
    assert f"{devnet.url.removeprefix('http://')}: ledger " in message and "127.0.0.2" in message
