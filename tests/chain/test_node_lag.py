"""The devnet's whole-node lag fault (`node_lag`) and resolve() against a lagging node end to
end: a node `ledgers` behind answers as of its lagged latest ledger everywhere (getHealth,
getLatestLedger, getTransaction, getEvents, getLedgerEntries), and a transaction that landed in the
lagged window is "not seen yet" — the lineage waits, it is never declared dead."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import Asset, Keypair, SorobanServer, TransactionBuilder
from stellar_sdk.client.requests_client import RequestsClient
from stellar_sdk.soroban_rpc import GetTransactionStatus

from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.devnet_support import DevnetError, DevnetHandle, start_devnet
from tests.support.funding import admit, crash_tick, lineages_of, row_of, run_until_quiet, wait_for_leases

VALIDITY = 60


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=2)
    yield handle
    handle.stop()


def test_a_lagging_node_answers_as_of_its_lagged_latest_ledger(devnet: DevnetHandle) -> None:
    server = SorobanServer(devnet.url, client=RequestsClient(num_retries=0))
    src = Keypair.from_secret(devnet.rpc("devnet_createAccount", {})["secret"])
    devnet.close_ledger()
    seq0 = server.load_account(src.public_key).sequence
    tx = (TransactionBuilder(server.load_account(src.public_key), devnet.passphrase, base_fee=100)
          .append_payment_op(devnet.genesis["issuer"]["public"], Asset.native(), "1").set_timeout(600).build())
    tx.sign(src)
    server.send_transaction(tx)
    landed = devnet.close_ledger()["latestLedger"]
    assert server.get_transaction(tx.hash_hex()).status == GetTransactionStatus.SUCCESS
    devnet.close_ledger(3)
    latest = devnet.latest_ledger()
    assert latest == landed + 3

    devnet.set_fault("node_lag", ledgers=4)  # one ledger before the payment landed
    behind = landed - 1
    assert devnet.latest_ledger() == behind
    assert int(server.get_health().latest_ledger) == behind
    answer = server.get_transaction(tx.hash_hex())
    assert answer.status == GetTransactionStatus.NOT_FOUND and answer.latest_ledger == behind
    assert server.load_account(src.public_key).sequence == seq0  # the sequence as of then
    entries = devnet.rpc("getLedgerEntries", {"keys": []})
    assert entries["latestLedger"] == behind
    events = devnet.rpc("getEvents", {"startLedger": behind, "filters": []})
    assert events["latestLedger"] == behind and all(e["ledger"] <= behind for e in events["events"])
    with pytest.raises(DevnetError, match="ledger range"):  # nothing past its latest
        devnet.rpc("getEvents", {"startLedger": landed, "filters": []})

    devnet.set_fault("node_lag", ledgers=1)  # catching up: the payment shows
    assert server.get_transaction(tx.hash_hex()).status == GetTransactionStatus.SUCCESS
    assert server.load_account(src.public_key).sequence == seq0 + 1
    devnet.clear_faults()
    assert devnet.latest_ledger() == latest
    with pytest.raises(DevnetError, match="ledgers > 0"):
        devnet.set_fault("node_lag")


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    environ = chain_environ(devnet, dsn, tmp_path / "keys")
    environ["PAYGATE_TX_VALIDITY"] = f"{VALIDITY}s"
    return ChainEnv(devnet, dsn, environ)


def test_resolve_against_a_lagging_node_waits_and_never_declares_dead(chain: ChainEnv, db: psycopg.Connection) -> None:
    """The deposit landed; then the chain moved on far past its maxTime. The only read node lags to
    before the landing: its NOT_FOUND covers nothing, so the lineage stays live (the same bytes are
    resent, nothing re-prepared); once the node catches up the receipt is recorded."""
    pending_id = admit(chain, db)
    crash_tick(chain, "funding.after_broadcast")
    landed = chain.devnet.close_ledger()["latestLedger"]
    chain.devnet.close_ledger(3, advance_seconds=VALIDITY + 100)  # every later ledger is past maxTime
    chain.devnet.set_fault("node_lag", ledgers=4)
    assert chain.devnet.latest_ledger() == landed - 1
    for _ in range(2):
        wait_for_leases(db)
        result = chain.tick("funding", "--once")
        assert result.code in (0, 1), result.err
        [deposit] = lineages_of(db)  # one lineage: never expired/superseded, never re-prepared
        assert deposit["state"] in ("signed", "sent"), deposit
        assert row_of(db, pending_id)["status"] == "pending" and row_of(db, pending_id)["deposit_tx"] is None
    chain.devnet.clear_faults()
    run_until_quiet(chain, db)
    deposit = next(x for x in lineages_of(db) if x["purpose"] == "deposit")
    assert deposit["state"] == "applied" and deposit["ledger"] == landed
    assert row_of(db, pending_id)["status"] == "settled"


# -- a lagging node that cannot see a brand-new lane is not a configuration error ------------

def _only_lane(chain: ChainEnv, secret: str) -> None:
    lanes = Path(chain.environ["PAYGATE_LANE_SECRETS_FILE"])
    lanes.write_text(secret + "\n")


def _pending_unclaimed(db: psycopg.Connection, pending_id: int) -> None:
    row = row_of(db, pending_id)
    assert row["status"] == "pending" and row["deposit_tx"] is None
    assert row["lease_expires_at"] is None or db.execute(
        "SELECT %s <= now()", (row["lease_expires_at"],)).fetchone()[0]  # handed back


def test_a_new_lane_hidden_by_a_lagging_node_is_retried_not_78(chain: ChainEnv, db: psycopg.Connection) -> None:
    pending_id = admit(chain, db)  # signed before the node lags (the wallet reads the latest ledger)
    chain.devnet.close_ledger(n=2)
    new = chain.devnet.rpc("devnet_createAccount", {})  # in the latest ledger
    _only_lane(chain, new["secret"])
    chain.devnet.set_fault("node_lag", ledgers=1)  # the node has not seen the ledger that created it
    result = chain.tick("funding", "--once")
    assert result.code == 69, result.err  # unknown, retry later — never 78 for a lagging read
    assert "rpc.lane_not_visible" in result.err or "not visible on chain yet" in result.err, result.err
    _pending_unclaimed(db, pending_id)
    chain.devnet.clear_faults()
    result = chain.tick("funding", "--once")
    assert result.code != 78 and "not visible" not in result.err, result.err


def test_two_nodes_a_lagging_reader_waits_and_only_caught_up_nodes_prove_a_lane_missing(
        dsn: str, db: psycopg.Connection, tmp_path: Path) -> None:
    a = start_devnet(tmp_path / "a", seed="lanes", lanes=2, users=2, host="127.0.0.1")
    b = start_devnet(tmp_path / "b", seed="lanes", lanes=2, users=2, host="127.0.0.2")
    try:
        environ = chain_environ(a, dsn, tmp_path / "keys")
        environ["PAYGATE_RPC_READ_URLS"] = b.url  # writes to a, reads from b
        chain = ChainEnv(a, dsn, environ)
        pending_id = admit(chain, db)
        for node in (a, b):
            node.close_ledger(n=2)
        new = a.rpc("devnet_createAccount", {})  # the same account on both nodes, in the same ledger
        b.rpc("devnet_createAccount", {"account": new["account"]})
        for node in (a, b):
            node.close_ledger(n=2)
        _only_lane(chain, new["secret"])
        b.set_fault("node_lag", ledgers=3)  # the reader is behind the ledger that created the lane
        result = chain.tick("funding", "--once")
        assert result.code == 69 and "127.0.0.2" in result.err and "behind ledger" in result.err, result.err
        _pending_unclaimed(db, pending_id)
        # A lane that really does not exist, said by a reader caught up with the write node: the lane
        # (not the run) is broken, so it is fenced with the evidence and a human is asked (exit 3).
        b.clear_faults()
        ghost = Keypair.random()
        _only_lane(chain, ghost.secret)
        wait_for_leases(db)
        result = chain.tick("funding", "--once")
        assert result.code == 3 and "does not exist on chain" in result.err, result.err
        assert "journal.lane_fenced" in result.err and ghost.secret not in result.err
        assert db.execute("SELECT status FROM paygate.lanes WHERE address = %s",
                          (ghost.public_key,)).fetchone() == ("drained",)
    finally:
        a.stop()
        b.stop()
