"""A simulateTransaction answer is validated before its parts are spliced into a transaction.

The RPC provider is outside paygate: here a loopback proxy stands in front of a real devnet, passes
every call through, and forges only the simulation's answer (a real HTTP server we control, like
tests/hostile/rpc_server.py). An answer with no result, two results or transactionData that does not
decode is "unknown, retry later": nothing is signed or journaled, the deposit stays pending, the tick
exits 69 — never a signed, rejected envelope (a terminal state for the user's deposit), never 70. A
minimum resource fee that pushes the inner transaction's rate above the fee bump's rate gives a
valid fee bump (its rate raised to cover the inner one), which the devnet accepts."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from stellar_sdk import xdr

from tests.support.chain_env import ChainEnv, admit_deposit, chain_environ, sign_deposit
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.rpc_proxy import RpcProxy

AMOUNT = 25_000_000


class SimulationForger(RpcProxy):
    """Forwards every JSON-RPC call to the devnet; `forge` rewrites simulateTransaction's result."""

    def __init__(self, upstream: str) -> None:
        self.forge: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self.sent: list[tuple[str, dict[str, Any]]] = []  # (envelope, the devnet's answer)
        super().__init__(upstream)

    def rewrite(self, request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        if request.get("method") == "simulateTransaction" and self.forge and "result" in answer:
            answer["result"] = self.forge(answer["result"])
        if request.get("method") == "sendTransaction":
            self.sent.append((request["params"]["transaction"], answer.get("result", {})))
        return answer


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=1)
    yield handle
    handle.stop()


@pytest.fixture
def forger(devnet: DevnetHandle) -> Iterator[SimulationForger]:
    proxy = SimulationForger(devnet.url)
    yield proxy
    proxy.close()


@pytest.fixture
def chain(devnet: DevnetHandle, forger: SimulationForger, dsn: str, tmp_path: Path) -> ChainEnv:
    environ = chain_environ(devnet, dsn, tmp_path / "keys")
    environ["PAYGATE_RPC_URL"] = forger.url
    return ChainEnv(devnet, dsn, environ)


def deposit(chain: ChainEnv, db: psycopg.Connection) -> int:
    user = chain.genesis["users"][0]
    entry, nonce, expiration = sign_deposit(chain.devnet, user["secret"], AMOUNT)
    return admit_deposit(db, user["public"], AMOUNT, entry, nonce, expiration, "dep-forged")


def no_results(result: dict[str, Any]) -> dict[str, Any]:
    return {**result, "results": []}


def two_results(result: dict[str, Any]) -> dict[str, Any]:
    return {**result, "results": [result["results"][0], result["results"][0]]}


def garbage_data(result: dict[str, Any]) -> dict[str, Any]:
    return {**result, "transactionData": base64.b64encode(b"\x00\x00\x00\x07not soroban data").decode()}


def truncated_data(result: dict[str, Any]) -> dict[str, Any]:
    return {**result, "transactionData": base64.b64encode(base64.b64decode(result["transactionData"])[:-3]).decode()}


@pytest.mark.parametrize("forge", [no_results, two_results, garbage_data, truncated_data])
def test_a_malformed_simulation_is_retried_later_and_nothing_is_journaled(
        chain: ChainEnv, forger: SimulationForger, db: psycopg.Connection,
        forge: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    pending_id = deposit(chain, db)
    forger.forge = forge
    result = chain.tick()
    assert result.code == 69, result.err
    assert "simulateTransaction" in result.err and "rpc.malformed" in result.err
    assert forger.sent == []  # nothing broadcast
    assert db.execute("SELECT count(*) FROM paygate.lineages WHERE envelope IS NOT NULL").fetchone()[0] == 0
    assert db.execute("SELECT status FROM paygate.deposits WHERE id = %s", (pending_id,)).fetchone()[0] \
        == "pending"
    forger.forge = None  # an honest answer again: the same deposit goes on
    assert chain.tick().code == 0
    assert len(forger.sent) == 1


def test_a_minimum_resource_fee_above_the_bump_rate_raises_the_bump(chain: ChainEnv, forger: SimulationForger,
                                                                     db: psycopg.Connection) -> None:
    deposit(chain, db)
    forger.forge = lambda result: {**result, "minResourceFee": str(int(result["minResourceFee"]) + 10**9)}
    result = chain.tick()
    assert result.code == 0, result.err
    [(envelope, answer)] = forger.sent
    assert answer["status"] == "PENDING", answer  # the network's rule held: the devnet accepted it
    bump = xdr.TransactionEnvelope.from_xdr(envelope).fee_bump.tx
    inner = bump.inner_tx.v1.tx
    resource_fee = inner.ext.soroban_data.resource_fee.int64
    inner_rate = inner.fee.uint32 - resource_fee  # one operation
    assert inner_rate > 10**9
    assert bump.fee.int64 >= inner_rate * 2 + resource_fee


@pytest.mark.parametrize("forge", [no_results, two_results])
def test_a_malformed_balance_read_is_unavailable_not_a_crash(
        chain: ChainEnv, forger: SimulationForger, db: psycopg.Connection,
        forge: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """The reconciler reads balances by simulation: an answer without exactly one result is the RPC's
    fault (exit 69, retried on the next tick), never an IndexError out of the tick (70)."""
    deposit(chain, db)
    forger.forge = forge
    environ = {"PAYGATE_RPC_READ_URLS": forger.url}
    result = chain.tick("reconciler", **environ)
    assert result.code == 69, (result.code, result.err[-2000:])
    assert "results for one call" in result.err
    forger.forge = None
    result = chain.tick("reconciler", **environ)
    assert result.code == 0, result.err[-2000:]
