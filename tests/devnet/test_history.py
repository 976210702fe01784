"""getTransactions and getEvents: paging, cursors, filters, ids, and the retention window
(a devnet with --retention 20 of its own)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from stellar_sdk import SorobanServer, scval, xdr
from stellar_sdk.client.requests_client import RequestsClient
from stellar_sdk.soroban_rpc import EventFilter, EventFilterType, GetTransactionStatus, SendTransactionStatus

from tests.devnet.helpers import addr, b64_scval, call, fee_bump, invoke_tx, kp
from tests.support.devnet_support import DevnetHandle, start_devnet

RETENTION = 20


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path_factory.mktemp("devnet-history"), retention=RETENTION, lanes=2, users=3)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def server(devnet: DevnetHandle) -> Iterator[SorobanServer]:
    with SorobanServer(devnet.url, client=RequestsClient(num_retries=0)) as s:
        yield s


@pytest.fixture(scope="module")
def history(server: SorobanServer, devnet: DevnetHandle) -> dict:
    """Ledger L: two transfers (the second fee-bumped); ledger L+1: nothing; ledger L+2: one more."""
    g = devnet.genesis
    usdc = g["contracts"]["usdc"]
    u = [kp(x) for x in g["users"]]

    def transfer(src, dst, amount):
        return invoke_tx(server, devnet, src, usdc, "transfer",
                         [addr(src.public_key), addr(dst.public_key), scval.to_int128(amount)])

    t1 = transfer(u[0], u[1], 11)
    t2 = fee_bump(devnet, transfer(u[1], u[2], 22))
    for env in (t1, t2):
        assert server.send_transaction(env).status == SendTransactionStatus.PENDING
    first = devnet.close_ledger()["latestLedger"]
    devnet.close_ledger()
    t3 = transfer(u[2], u[0], 33)
    assert server.send_transaction(t3).status == SendTransactionStatus.PENDING
    devnet.close_ledger()
    return {"ledger": first, "hashes": [t1.hash_hex(), t2.hash_hex(), t3.hash_hex()],
            "inner2": t2.transaction.inner_transaction_envelope.hash_hex(), "users": [x.public_key for x in u]}


def test_get_events_shape_ids_and_outer_hash(server: SorobanServer, devnet: DevnetHandle, history: dict) -> None:
    # CAP-67 fee events of the native SAC share the ledgers (stellar-rpc db/event.go): look at USDC's.
    usdc = [{"contractIds": [devnet.genesis["contracts"]["usdc"]]}]
    r = call(devnet.url, "getEvents", {"startLedger": history["ledger"], "filters": usdc})["result"]
    evs = r["events"]
    assert [e["txHash"] for e in evs] == history["hashes"]  # fee bump: the outer hash
    assert [e["transactionIndex"] for e in evs] == [1, 2, 1] and all(e["operationIndex"] == 0 for e in evs)
    assert all(re.fullmatch(r"\d{19}-\d{10}", e["id"]) for e in evs)
    first = evs[0]
    assert int(first["id"][:19]) == (history["ledger"] << 32) | (1 << 12) and first["id"].endswith("-0000000000")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", first["ledgerClosedAt"])
    assert first["type"] == "contract" and first["contractId"] == devnet.genesis["contracts"]["usdc"]
    assert scval.to_native(first["value"]) == 11 and scval.to_native(first["topic"][0]) == "transfer"
    assert isinstance(r["latestLedgerCloseTime"], str) and isinstance(r["oldestLedgerCloseTime"], str)
    sdk = server.get_events(start_ledger=history["ledger"],
                            filters=[EventFilter(contract_ids=[devnet.genesis["contracts"]["usdc"]])])
    assert [e.transaction_hash for e in sdk.events] == history["hashes"]


def test_get_events_filters(server: SorobanServer, devnet: DevnetHandle, history: dict) -> None:
    g, users, start = devnet.genesis, history["users"], history["ledger"]
    transfer, u1 = b64_scval(scval.to_symbol("transfer")), b64_scval(addr(users[1]))

    def values(filters: list[EventFilter]) -> list[int]:
        return [scval.to_native(e.value) for e in server.get_events(start_ledger=start, filters=filters).events]

    c = EventFilterType.CONTRACT
    assert values([EventFilter(event_type=c, contract_ids=[g["contracts"]["billing"]])]) == []
    assert values([EventFilter(contract_ids=[g["contracts"]["usdc"]])]) == [11, 22, 33]
    assert values([EventFilter(topics=[[transfer, u1, "*", "*"]])]) == [22]  # from users[1]
    assert values([EventFilter(topics=[[transfer, "*", u1, "*"]])]) == [11]  # to users[1]
    assert values([EventFilter(topics=[[transfer, "**"]])]) == [11, 22, 33]
    assert values([EventFilter(topics=[[transfer, "*"]])]) == []  # segment count must match without **
    assert values([EventFilter(topics=[[transfer, u1, "*", "*"]]),
                   EventFilter(topics=[[transfer, "*", u1, "*"]])]) == [11, 22]  # filters are OR'ed
    assert values([EventFilter(event_type=EventFilterType.SYSTEM)]) == []
    bad = [{"topics": [["**", "*"]]}, {"contractIds": ["nope"]}, {"type": "diagnostic"},
           {"topics": [["*"] * 5]}, {"contractIds": [g["contracts"]["usdc"]] * 6}]
    for f in bad:
        assert call(devnet.url, "getEvents", {"startLedger": start, "filters": [f]})["error"]["code"] == -32602
    assert call(devnet.url, "getEvents", {"startLedger": start, "filters": [{}] * 6})["error"]["code"] == -32602


def test_get_events_cursor_semantics(server: SorobanServer, devnet: DevnetHandle, history: dict) -> None:
    start = history["ledger"]
    usdc = [EventFilter(contract_ids=[devnet.genesis["contracts"]["usdc"]])]  # not the CAP-67 fee events
    page = server.get_events(start_ledger=start, limit=2, filters=usdc)
    assert [scval.to_native(e.value) for e in page.events] == [11, 22]
    assert page.cursor == page.events[-1].id  # limit reached: the last event's id
    page = server.get_events(cursor=page.cursor, limit=2, filters=usdc)
    assert [scval.to_native(e.value) for e in page.events] == [33]
    latest = page.latest_ledger
    # fewer than limit: the cursor is the end of the scanned window, even when the page is empty
    assert int(page.cursor[:19]) >> 32 == latest
    empty = server.get_events(cursor=page.cursor, limit=2, filters=usdc)
    assert empty.events == [] and empty.cursor == page.cursor
    devnet.close_ledger()
    moved = server.get_events(cursor=empty.cursor, limit=2, filters=usdc)
    assert moved.events == [] and int(moved.cursor[:19]) >> 32 == latest + 1
    bounded = server.get_events(start_ledger=start, end_ledger=start + 1, limit=10, filters=usdc)
    assert len(bounded.events) == 2 and int(bounded.cursor[:19]) >> 32 == start
    err = call(devnet.url, "getEvents", {"startLedger": start, "pagination": {"cursor": page.cursor}})["error"]
    assert err["code"] == -32602
    err = call(devnet.url, "getEvents", {"startLedger": latest + 5})["error"]
    assert err["code"] == -32600 and "ledger range" in err["message"]
    assert call(devnet.url, "getEvents", {"pagination": {"cursor": "garbage"}})["error"]["code"] == -32602
    assert call(devnet.url, "getEvents", {})["error"]["code"] == -32602


def test_get_transactions_paging_and_number_fields(server: SorobanServer, devnet: DevnetHandle,
                                                   history: dict) -> None:
    r = call(devnet.url, "getTransactions", {"startLedger": history["ledger"], "pagination": {"limit": 2}})["result"]
    assert [t["txHash"] for t in r["transactions"]] == history["hashes"][:2]
    t = r["transactions"][1]
    assert t["feeBump"] is True and t["applicationOrder"] == 2 and isinstance(t["createdAt"], int)
    assert isinstance(r["latestLedgerCloseTimestamp"], int) and isinstance(r["oldestLedgerCloseTimestamp"], int)
    nxt = server.get_transactions(cursor=r["cursor"], limit=2)
    assert [x.transaction_hash for x in nxt.transactions] == history["hashes"][2:]
    tail = server.get_transactions(cursor=nxt.cursor, limit=2)
    assert tail.transactions == []
    assert call(devnet.url, "getTransactions", {"startLedger": 10**6})["error"]["code"] == -32600
    # go-stellar-sdk protocols/rpc/get_transactions.go IsValid -> InvalidRequest in get_transactions.go.
    assert call(devnet.url, "getTransactions", {"startLedger": 1, "pagination": {"limit": 201}}
                )["error"]["code"] == -32600


def test_get_transaction_fields(server: SorobanServer, devnet: DevnetHandle, history: dict) -> None:
    r = call(devnet.url, "getTransaction", {"hash": history["inner2"]})["result"]
    assert r["status"] == "SUCCESS" and r["txHash"] == history["inner2"] and r["feeBump"] is True
    assert isinstance(r["createdAt"], str) and isinstance(r["latestLedgerCloseTime"], str)
    assert len(r["events"]["contractEventsXdr"][0]) == 1
    # CAP-67: the fee charged up front (beforeAllTxs) and the unused resource fee refunded (afterAllTxs).
    stages = [xdr.TransactionEvent.from_xdr(e).stage for e in r["events"]["transactionEventsXdr"]]
    assert stages == [xdr.TransactionEventStage.TRANSACTION_EVENT_STAGE_BEFORE_ALL_TXS,
                      xdr.TransactionEventStage.TRANSACTION_EVENT_STAGE_AFTER_ALL_TXS]
    missing = call(devnet.url, "getTransaction", {"hash": "00" * 32})["result"]
    assert missing["status"] == "NOT_FOUND" and set(missing) == {
        "status", "txHash", "latestLedger", "latestLedgerCloseTime", "oldestLedger", "oldestLedgerCloseTime"}


def test_retention_window_forgets_old_transactions_and_events(server: SorobanServer, devnet: DevnetHandle,
                                                              history: dict) -> None:
    # runs last in this module: it moves the chain past the window
    assert server.get_transaction(history["hashes"][0]).status == GetTransactionStatus.SUCCESS
    latest = devnet.close_ledger(n=RETENTION)["latestLedger"]
    health = server.get_health()
    assert health.oldest_ledger == latest - RETENTION + 1 and health.ledger_retention_window == RETENTION
    for h in (*history["hashes"], history["inner2"]):
        assert server.get_transaction(h).status == GetTransactionStatus.NOT_FOUND
    err = call(devnet.url, "getEvents", {"startLedger": history["ledger"]})["error"]
    assert err["code"] == -32600
    assert call(devnet.url, "getTransactions", {"startLedger": history["ledger"]})["error"]["code"] == -32600
    assert server.get_events(start_ledger=health.oldest_ledger).events == []
