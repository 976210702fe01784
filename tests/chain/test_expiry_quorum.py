"""Terminal decisions are taken from a majority of the read hosts, never from one node.

One read host here lies (a real loopback server on its own host address, standing in for a forked,
wrong-network or compromised provider: it claims a far-future latest ledger, and that no account
exists; everything else it passes through to the devnet); the other is a real devnet.
- A relay's authorisation expires when the latest ledger is past its signatureExpirationLedger: on
  the liar's word alone the relay must NOT expire; once the honest host has passed it too, it does.
- The gas halt: the liar's "the fee account does not exist" must not halt admission."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.cli import Result
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.relay_support import admit_relay, allow_market
from tests.support.rpc_proxy import RpcProxy

FAR_FUTURE = 10_000_000


class Liar(RpcProxy):
    """A read host on 127.0.0.2: getLatestLedger claims FAR_FUTURE, getLedgerEntries finds nothing
    (or, `hide_entries=False`, finds what the devnet has but in ledger FAR_FUTURE), every other call
    is the devnet's own answer."""

    def __init__(self, upstream: str, *, hide_entries: bool = True) -> None:
        self.hide_entries = hide_entries
        super().__init__(upstream, host="127.0.0.2")

    def rewrite(self, request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        if request.get("method") == "getLatestLedger":
            return {"jsonrpc": "2.0", "id": request.get("id", 1), "result": {
                "id": "f" * 64, "protocolVersion": 22, "sequence": FAR_FUTURE, "closeTime": "4000000000",
                "headerXdr": "", "metadataXdr": ""}}
        if request.get("method") == "getLedgerEntries" and "result" in answer:
            if self.hide_entries:
                answer["result"]["entries"] = []
            else:  # the entries as they are, read "in" a far-future ledger
                answer["result"]["latestLedger"] = FAR_FUTURE
        return answer


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=1)
    yield handle
    handle.stop()


@pytest.fixture
def liar(devnet: DevnetHandle) -> Iterator[Liar]:
    server = Liar(devnet.url)
    yield server
    server.close()


@pytest.fixture
def chain(devnet: DevnetHandle, liar: Liar, dsn: str, tmp_path: Path) -> ChainEnv:
    environ = chain_environ(devnet, dsn, tmp_path / "keys")
    environ["PAYGATE_RPC_READ_URLS"] = f"{liar.url},{devnet.url}"  # the liar first: the one asked first
    return ChainEnv(devnet, dsn, environ)


def details(result: Result) -> dict:
    return json.loads(result.out)["run_tick"]["last_details"]


def test_a_relay_is_not_expired_on_one_nodes_word(chain: ChainEnv, db: psycopg.Connection) -> None:
    allow_market(db, chain.genesis["contracts"]["market"])
    relay_id = admit_relay(db, chain.devnet, chain.genesis["users"][0], "r-liar", valid_ledgers=3)
    expiration = db.execute("SELECT auth_expiration_ledger FROM paygate.relays WHERE id = %s",
                            (relay_id,)).fetchone()[0]
    assert expiration < FAR_FUTURE

    result = chain.tick("relay_expiry")
    assert result.code == 0, result.err
    assert details(result)["expired"] == 0 and details(result)["highest_claimed"] == FAR_FUTURE
    assert db.execute("SELECT status FROM paygate.relays WHERE id = %s", (relay_id,)).fetchone()[0] == "queued"

    chain.devnet.close_ledger(n=expiration - chain.devnet.latest_ledger() + 1)  # the honest host passes it too
    result = chain.tick("relay_expiry")
    assert result.code == 0, result.err
    assert details(result)["expired"] == 1
    assert db.execute("SELECT status FROM paygate.relays WHERE id = %s", (relay_id,)).fetchone()[0] == "expired"


def test_one_node_saying_the_fee_account_is_gone_does_not_halt_admission(chain: ChainEnv,
                                                                        db: psycopg.Connection) -> None:
    result = chain.tick("gas")
    assert result.code == 0, result.err
    assert details(result)["level"] == "ok" and details(result)["halted"] is False
    assert db.execute("SELECT count(*) FROM paygate.halts WHERE kind = 'gas'").fetchone()[0] == 0


def test_the_relay_worker_and_the_engine_never_expire_a_relay_on_one_nodes_word(
        devnet: DevnetHandle, dsn: str, tmp_path: Path, db: psycopg.Connection) -> None:
    """The relay's own phase 1 (its nonce read's latest ledger) and the engine's check before it
    builds (the first healthy node's latest ledger) both read the liar first: neither may end a
    relay that the honest majority says can still land. It lands."""
    liar = Liar(devnet.url, hide_entries=False)
    try:
        environ = chain_environ(devnet, dsn, tmp_path / "keys")
        environ["PAYGATE_RPC_READ_URLS"] = f"{liar.url},{devnet.url}"
        chain = ChainEnv(devnet, dsn, environ)
        allow_market(db, devnet.genesis["contracts"]["market"])
        relay_id = admit_relay(db, devnet, devnet.genesis["users"][0], "r-liar-worker", valid_ledgers=20)
        result = chain.tick("relay")
        assert result.code == 0, result.err
        assert db.execute("SELECT status FROM paygate.relays WHERE id = %s", (relay_id,)).fetchone()[0] == "queued"
        assert db.execute("SELECT lineage_id IS NOT NULL FROM paygate.relays WHERE id = %s",
                          (relay_id,)).fetchone()[0], "built and sent, not ended"
        devnet.close_ledger()
        result = chain.tick("relay")
        assert result.code == 0, result.err
        assert db.execute("SELECT status FROM paygate.relays WHERE id = %s", (relay_id,)).fetchone()[0] == "applied"
    finally:
        liar.close()
