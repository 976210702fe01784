"""Every fault the devnet can inject (docs/devnet.md), each seen the way a client sees it."""

from __future__ import annotations

import http.client
import socket
import time
import urllib.error
from collections.abc import Iterator

import pytest
from stellar_sdk import Asset, Keypair, SorobanServer, TransactionBuilder
from stellar_sdk.exceptions import BadResponseError, ConnectionError
from stellar_sdk.soroban_rpc import GetTransactionStatus, SendTransactionStatus

from tests.devnet.helpers import call, fee_bump, kp, raw, result_code
from tests.support.devnet_support import DevnetHandle

S = SendTransactionStatus


@pytest.fixture(autouse=True)
def no_faults_left(devnet: DevnetHandle) -> Iterator[None]:
    yield
    devnet.clear_faults()


def fresh(devnet: DevnetHandle) -> Keypair:
    return Keypair.from_secret(devnet.rpc("devnet_createAccount", {})["secret"])


def payment(server: SorobanServer, devnet: DevnetHandle, src: Keypair, amount: str = "1"):
    tx = (TransactionBuilder(server.load_account(src.public_key), devnet.passphrase, base_fee=100)
          .append_payment_op(devnet.genesis["issuer"]["public"], Asset.native(), amount).set_timeout(600).build())
    tx.sign(src)
    return tx


def test_http_503_then_recovers_and_sdk_retries_hide_a_short_burst(server: SorobanServer,
                                                                     devnet: DevnetHandle) -> None:
    devnet.set_fault("http_503", count=1)
    status, body = raw(devnet.url, {"jsonrpc": "2.0", "id": 1, "method": "getHealth"})
    assert status == 503 and isinstance(body, str)
    assert "result" in call(devnet.url, "getHealth")
    devnet.set_fault("http_503", count=1)
    with pytest.raises(BadResponseError):
        server.get_health()  # num_retries=0: the 503 surfaces
    devnet.set_fault("http_503", count=2)
    with SorobanServer(devnet.url) as retrying:  # the SDK default retries POSTs on 503 (3 times)
        assert retrying.get_health().status == "healthy"


def test_http_504_only_for_the_named_method(server: SorobanServer, devnet: DevnetHandle) -> None:
    devnet.set_fault("http_504", count=1, methods=["getLatestLedger"])
    assert server.get_health().status == "healthy"
    with pytest.raises(BadResponseError) as exc:
        server.get_latest_ledger()
    assert exc.value.status == 504
    assert server.get_latest_ledger().sequence >= 1


def test_slow_answer(devnet: DevnetHandle) -> None:
    devnet.set_fault("slow", ms=400, count=1)
    t0 = time.monotonic()
    assert "result" in call(devnet.url, "getHealth")
    assert time.monotonic() - t0 >= 0.4
    devnet.set_fault("slow", ms=2_000, count=1)
    with pytest.raises((TimeoutError, socket.timeout, urllib.error.URLError)):
        raw(devnet.url, {"jsonrpc": "2.0", "id": 1, "method": "getHealth"}, timeout=0.3)


def test_send_answer_lost_but_the_transaction_lands(server: SorobanServer, devnet: DevnetHandle) -> None:
    src = fresh(devnet)
    tx = payment(server, devnet, src)
    devnet.set_fault("lose_send_answer", count=1)
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError, urllib.error.URLError)):
        raw(devnet.url, {"jsonrpc": "2.0", "id": 1, "method": "sendTransaction",
                         "params": {"transaction": tx.to_xdr()}})
    assert server.send_transaction(tx).status == S.DUPLICATE  # it was queued all the same
    devnet.close_ledger()
    assert server.get_transaction(tx.hash_hex()).status == GetTransactionStatus.SUCCESS


def test_send_answer_lost_through_the_sdk(server: SorobanServer, devnet: DevnetHandle) -> None:
    src = fresh(devnet)
    tx = payment(server, devnet, src)
    devnet.set_fault("lose_send_answer", count=1)
    with pytest.raises(ConnectionError):
        server.send_transaction(tx)
    devnet.close_ledger()
    assert server.get_transaction(tx.hash_hex()).status == GetTransactionStatus.SUCCESS


def test_try_again_later_for_the_next_n_sends(server: SorobanServer, devnet: DevnetHandle) -> None:
    src = fresh(devnet)
    tx = payment(server, devnet, src)
    devnet.set_fault("try_again_later", count=2)
    assert server.send_transaction(tx).status == S.TRY_AGAIN_LATER
    assert server.send_transaction(tx).status == S.TRY_AGAIN_LATER
    assert devnet.state()["queue"] == []  # nothing was queued
    assert server.send_transaction(tx).status == S.PENDING


def test_account_reads_lag_by_k_ledgers(server: SorobanServer, devnet: DevnetHandle) -> None:
    src = fresh(devnet)
    seq0 = server.load_account(src.public_key).sequence
    tx = payment(server, devnet, src)
    assert server.send_transaction(tx).status == S.PENDING
    devnet.close_ledger()
    devnet.set_fault("account_lag", ledgers=1)
    assert server.load_account(src.public_key).sequence == seq0  # the node has not caught up
    # a transaction built from the stale read gets txBAD_SEQ, the symptom of a lagging account read
    stale = payment(server, devnet, src, amount="2")  # a different envelope (the first one is banned)
    sent = server.send_transaction(stale)
    assert sent.status == S.ERROR and result_code(sent.error_result_xdr) == "txBAD_SEQ"
    devnet.close_ledger()
    assert server.load_account(src.public_key).sequence == seq0 + 1  # one ledger later it shows
    devnet.clear_faults()
    assert server.load_account(src.public_key).sequence == seq0 + 1


def test_transaction_held_in_the_queue_for_n_ledgers(server: SorobanServer, devnet: DevnetHandle) -> None:
    src = fresh(devnet)
    devnet.set_fault("hold_next", ledgers=5)
    tx = fee_bump(devnet, payment(server, devnet, src))
    assert server.send_transaction(tx).status == S.PENDING
    for _ in range(5):  # longer than the 4-ledger queue timeout: a held tx is exempt
        devnet.close_ledger()
        assert server.get_transaction(tx.hash_hex()).status == GetTransactionStatus.NOT_FOUND
        assert server.send_transaction(tx).status == S.DUPLICATE
    devnet.close_ledger()
    assert server.get_transaction(tx.hash_hex()).status == GetTransactionStatus.SUCCESS


def test_starved_transaction_is_dropped_after_4_ledgers_and_banned(server: SorobanServer,
                                                                     devnet: DevnetHandle) -> None:
    src = fresh(devnet)
    seq0 = server.load_account(src.public_key).sequence
    devnet.set_fault("drop_next")
    tx = payment(server, devnet, src)
    assert server.send_transaction(tx).status == S.PENDING
    devnet.close_ledger(n=3)
    assert server.send_transaction(tx).status == S.DUPLICATE
    devnet.close_ledger()
    assert devnet.state()["queue"] == []
    assert server.send_transaction(tx).status == S.TRY_AGAIN_LATER  # banned
    assert server.load_account(src.public_key).sequence == seq0
    devnet.close_ledger(n=10)
    assert server.send_transaction(tx).status == S.PENDING  # ban over, still valid
    devnet.close_ledger()
    assert server.get_transaction(tx.hash_hex()).status == GetTransactionStatus.SUCCESS


def test_competing_transaction_consumes_the_lane_sequence(server: SorobanServer, devnet: DevnetHandle) -> None:
    lane = kp(devnet.genesis["lanes"][5])
    ours = fee_bump(devnet, payment(server, devnet, lane))
    assert server.send_transaction(ours).status == S.PENDING
    devnet.rpc("devnet_consumeSequence", {"account": lane.public_key})
    applied = devnet.close_ledger()["applied"]
    assert len(applied) == 1 and applied[0]["hash"] != ours.hash_hex()
    assert server.get_transaction(applied[0]["hash"]).status == GetTransactionStatus.SUCCESS
    assert server.get_transaction(ours.hash_hex()).status == GetTransactionStatus.NOT_FOUND
    inner_seq = ours.transaction.inner_transaction_envelope.transaction.sequence
    assert server.load_account(lane.public_key).sequence == inner_seq  # taken by someone else
    devnet.close_ledger(n=10)
    sent = server.send_transaction(ours)
    assert sent.status == S.ERROR  # txFEE_BUMP_INNER_FAILED(txBAD_SEQ): this envelope is dead


def test_rpc_down_refuses_everything_but_admin(server: SorobanServer, devnet: DevnetHandle) -> None:
    devnet.set_fault("down")
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError, urllib.error.URLError)):
        raw(devnet.url, {"jsonrpc": "2.0", "id": 1, "method": "getHealth"})
    with pytest.raises(ConnectionError):
        server.get_latest_ledger()
    assert devnet.state()["faults"][0]["kind"] == "down"  # admin methods still answer
    devnet.close_ledger()
    devnet.clear_faults()
    assert server.get_health().status == "healthy"


def test_bad_fault_requests(devnet: DevnetHandle) -> None:
    for params in ({"kind": "nope"}, {"kind": "slow"}, {"kind": "http_503", "count": -1},
                   {"kind": "account_lag"}, {"kind": "http_503", "methods": "getHealth"}):
        assert call(devnet.url, "devnet_setFault", params)["error"]["code"] == -32602
