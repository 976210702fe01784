"""Each method's wire shape (field names, string vs number int64s), parameter handling and bad
input, through SorobanServer and raw HTTP (docs/devnet.md, RPC methods)."""

from __future__ import annotations

import socket

from stellar_sdk import Keypair, SorobanServer, xdr
from stellar_sdk.exceptions import SorobanRpcErrorResponse

from tests.devnet.helpers import call, raw
from tests.support.devnet_support import DevnetHandle


def test_get_health_numbers_not_strings(devnet: DevnetHandle, server: SorobanServer) -> None:
    r = call(devnet.url, "getHealth")["result"]
    assert r["status"] == "healthy"
    assert isinstance(r["latestLedgerCloseTime"], int) and isinstance(r["oldestLedgerCloseTime"], int)
    assert r["ledgerRetentionWindow"] == 120_960 and r["oldestLedger"] == 1
    assert server.get_health().latest_ledger == r["latestLedger"]


def test_get_network_and_version_info(devnet: DevnetHandle, server: SorobanServer) -> None:
    net = server.get_network()
    assert net.passphrase == "Standalone Network ; February 2017" and net.protocol_version >= 27
    info = call(devnet.url, "getVersionInfo")["result"]
    assert set(info) == {"version", "commitHash", "buildTimestamp", "captiveCoreVersion", "protocolVersion"}
    assert server.get_version_info().protocol_version == net.protocol_version


def test_get_latest_ledger_has_a_real_header(devnet: DevnetHandle, server: SorobanServer) -> None:
    r = call(devnet.url, "getLatestLedger", {})["result"]
    assert isinstance(r["closeTime"], str)
    header = xdr.LedgerHeader.from_xdr(r["headerXdr"])
    assert header.base_fee.uint32 == 100 and header.base_reserve.uint32 == 5_000_000
    assert header.ledger_seq.uint32 == r["sequence"]
    assert header.scp_value.close_time.time_point.uint64 == int(r["closeTime"])
    meta = xdr.LedgerCloseMeta.from_xdr(r["metadataXdr"])
    assert meta.v == 2 and meta.v2.ledger_header.hash.hash.hex() == r["id"]
    before = server.get_latest_ledger()
    devnet.close_ledger(advance_seconds=7)
    after = server.get_latest_ledger()
    assert after.sequence == before.sequence + 1 and after.close_time == before.close_time + 7
    prev = xdr.LedgerHeader.from_xdr(after.header_xdr).previous_ledger_hash.hash.hex()
    assert prev == before.id


def test_get_fee_stats_strings(devnet: DevnetHandle, server: SorobanServer) -> None:
    r = call(devnet.url, "getFeeStats")["result"]
    for dist in (r["sorobanInclusionFee"], r["inclusionFee"]):
        assert all(isinstance(dist[k], str) for k in ("max", "min", "mode", "p10", "p50", "p99", "transactionCount"))
        assert isinstance(dist["ledgerCount"], int)
    # The SDK parses it; a window without classic transactions is all zeros, as stellar-rpc answers.
    classic = server.get_fee_stats().inclusion_fee
    assert classic.p50 >= 100 if classic.transaction_count else (classic.p50, classic.max) == (0, 0)


def test_get_ledger_entries_account_missing_and_limits(devnet: DevnetHandle, server: SorobanServer) -> None:
    lane = devnet.genesis["lanes"][0]["public"]
    acct = server.load_account(lane)
    assert acct.sequence == 1 << 32
    key = xdr.LedgerKey(type=xdr.LedgerEntryType.ACCOUNT, account=xdr.LedgerKeyAccount(
        account_id=Keypair.from_public_key(lane).xdr_account_id()))
    ghost = xdr.LedgerKey(type=xdr.LedgerEntryType.ACCOUNT, account=xdr.LedgerKeyAccount(
        account_id=Keypair.random().xdr_account_id()))
    r = call(devnet.url, "getLedgerEntries", {"keys": [ghost.to_xdr(), key.to_xdr()]})["result"]
    [entry] = r["entries"]  # the missing key is simply omitted
    data = xdr.LedgerEntryData.from_xdr(entry["xdr"])
    assert data.type == xdr.LedgerEntryType.ACCOUNT and data.account.balance.int64 > 0
    assert "liveUntilLedgerSeq" not in entry and entry["key"] == key.to_xdr()
    ttl = xdr.LedgerKey(type=xdr.LedgerEntryType.TTL, ttl=xdr.LedgerKeyTtl(key_hash=xdr.Hash(bytes(32))))
    err = call(devnet.url, "getLedgerEntries", {"keys": [ttl.to_xdr()]})["error"]
    assert err["code"] == -32602 and "ttl" in err["message"]
    err = call(devnet.url, "getLedgerEntries", {"keys": [key.to_xdr()] * 201})["error"]
    assert err["code"] == -32602
    err = call(devnet.url, "getLedgerEntries", {"keys": ["not base64!"]})["error"]
    assert err == {"code": -32602, "message": "cannot unmarshal key value not base64! at index 0"}


def test_get_ledger_entries_contract_instance_has_live_until(devnet: DevnetHandle, server: SorobanServer) -> None:
    from stellar_sdk import Address

    billing = devnet.genesis["contracts"]["billing"]
    key = xdr.LedgerKey(type=xdr.LedgerEntryType.CONTRACT_DATA, contract_data=xdr.LedgerKeyContractData(
        contract=Address(billing).to_xdr_sc_address(),
        key=xdr.SCVal(type=xdr.SCValType.SCV_LEDGER_KEY_CONTRACT_INSTANCE),
        durability=xdr.ContractDataDurability.PERSISTENT))
    [entry] = server.get_ledger_entries([key]).entries
    assert entry.live_until_ledger and entry.live_until_ledger > server.get_latest_ledger().sequence
    assert xdr.LedgerEntryData.from_xdr(entry.xdr).type == xdr.LedgerEntryType.CONTRACT_DATA


def test_params_null_empty_and_explicit_nulls(devnet: DevnetHandle) -> None:
    for params in (None, {}):
        assert "result" in call(devnet.url, "getLatestLedger", params)
    body = call(devnet.url, "getEvents", {"startLedger": 1, "endLedger": None, "filters": None,
                                          "pagination": {"cursor": None, "limit": None}, "xdrFormat": None})
    assert "result" in body, body
    body = call(devnet.url, "getTransactions", {"startLedger": 1, "pagination": None})
    assert "result" in body, body


def test_json_rpc_errors(devnet: DevnetHandle) -> None:
    assert call(devnet.url, "noSuchMethod")["error"]["code"] == -32601
    status, body = raw(devnet.url, b"{not json")
    assert status == 200 and body["error"]["code"] == -32700
    status, body = raw(devnet.url, b"[1, 2]")
    assert [b["error"]["code"] for b in body] == [-32600, -32600]
    status, body = raw(devnet.url, {"jsonrpc": "1.0", "id": 1, "method": "getHealth"})
    assert body["error"]["code"] == -32600
    status, body = raw(devnet.url, {"jsonrpc": "2.0", "id": 1, "method": "getHealth", "params": [1]})
    assert body["error"]["code"] == -32602
    assert call(devnet.url, "getTransaction", {"hash": 5})["error"]["code"] == -32602
    assert call(devnet.url, "getTransaction", {"hash": "ab"})["error"]["code"] == -32602
    assert call(devnet.url, "getTransaction", {"hash": "zz" * 32})["error"]["code"] == -32602
    assert call(devnet.url, "getEvents", {"startLedger": "1"})["error"]["code"] == -32602
    err = call(devnet.url, "sendTransaction", {"transaction": "AAAA"})["error"]
    assert (err["code"], err["message"]) == (-32602, "invalid_xdr")
    for junk in ("not-base64!!", "", 12, None):
        err = call(devnet.url, "sendTransaction", {"transaction": junk})["error"]
        assert err["code"] == -32602
    # stellar-rpc answers an undecodable simulation envelope in-band (simulate_transaction.go).
    res = call(devnet.url, "simulateTransaction", {"transaction": "AAAAAgAAAAA="})["result"]
    assert res == {"error": "Could not unmarshal transaction", "latestLedger": 0}


def test_batch_requests_are_answered_in_order(devnet: DevnetHandle) -> None:
    _status, body = raw(devnet.url, [{"jsonrpc": "2.0", "id": 1, "method": "getHealth"},
                                    {"jsonrpc": "2.0", "id": 2, "method": "nope"}])
    assert [b["id"] for b in body] == [1, 2] and "result" in body[0] and body[1]["error"]["code"] == -32601


def test_huge_body_gets_an_error_not_a_hang(devnet: DevnetHandle) -> None:
    blob = b'{"jsonrpc":"2.0","id":1,"method":"getHealth","params":{"x":"' + b"a" * (2 * 1024 * 1024) + b'"}}'
    _status, body = raw(devnet.url, blob, timeout=10)
    assert body["error"]["code"] == -32600 and "too large" in body["error"]["message"]
    # A Content-Length far beyond what is sent is answered at once, without reading a byte.
    host, port = devnet.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 999999999\r\n\r\n{")
        answer = b""
        while chunk := s.recv(65536):  # the server closes the connection after answering
            answer += chunk
    assert b"200" in answer.split(b"\r\n")[0] and b"too large" in answer
    # and the server is still fine
    assert "result" in call(devnet.url, "getHealth")


def test_sdk_surfaces_json_rpc_errors(server: SorobanServer) -> None:
    try:
        server.get_transaction("ab")
    except SorobanRpcErrorResponse as exc:
        assert exc.code == -32602
    else:
        raise AssertionError("expected an error")


def test_get_ledgers_pages_headers(devnet: DevnetHandle, server: SorobanServer) -> None:
    devnet.close_ledger(n=2)
    page = server.get_ledgers(start_ledger=1, limit=2)
    assert [entry.sequence for entry in page.ledgers] == [1, 2]
    # get_ledgers.go: a LedgerHeaderHistoryEntry, not a bare LedgerHeader.
    assert xdr.LedgerHeaderHistoryEntry.from_xdr(page.ledgers[1].header_xdr).header.ledger_seq.uint32 == 2
    nxt = server.get_ledgers(cursor=page.cursor, limit=1)
    assert [entry.sequence for entry in nxt.ledgers] == [3]


def test_mangled_envelopes_never_crash_the_server(devnet: DevnetHandle, server: SorobanServer) -> None:
    """Truncated and bit-flipped copies of a real fee-bumped Soroban envelope: each gets a JSON-RPC
    answer that is a status or -32602, never an internal error or a dropped connection."""
    import base64
    import random

    from tests.devnet.helpers import fee_bump, invoke_tx, kp

    g = devnet.genesis
    lane = kp(g["lanes"][6])
    env = fee_bump(devnet, invoke_tx(server, devnet, lane, g["contracts"]["billing"], "balance",
                                     [scval_address(lane.public_key)]))
    good = base64.b64decode(env.to_xdr())
    rng = random.Random(7)
    for i in range(150):
        b = bytearray(good)
        if i % 3 == 0:
            b = b[: rng.randrange(len(b))]
        else:
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        for method in ("sendTransaction", "simulateTransaction"):
            body = call(devnet.url, method, {"transaction": base64.b64encode(bytes(b)).decode()})
            if "error" in body:
                assert body["error"]["code"] == -32602, (i, method, body)
            else:
                assert "status" in body["result"] or "latestLedger" in body["result"]
    assert call(devnet.url, "getHealth")["result"]["status"] == "healthy"


def scval_address(g: str) -> xdr.SCVal:
    from stellar_sdk import scval

    return scval.to_address(g)


def test_get_events_scans_at_most_10000_ledgers_per_call(devnet: DevnetHandle, server: SorobanServer) -> None:
    from stellar_sdk import scval

    from tests.devnet.helpers import invoke_tx, kp

    g = devnet.genesis
    start = server.get_latest_ledger().sequence
    devnet.close_ledger(n=10_005)
    user = kp(g["users"][0])
    tx = invoke_tx(server, devnet, user, g["contracts"]["usdc"], "transfer",
                   [scval.to_address(user.public_key), scval.to_address(g["users"][1]["public"]),
                    scval.to_int128(3)], timeout=10**7)  # 10k closes moved close time ~14 h ahead
    sent = server.send_transaction(tx)
    assert sent.status.value == "PENDING", sent
    landed = devnet.close_ledger()["latestLedger"]
    assert server.get_transaction(sent.hash).status.value == "SUCCESS"
    from stellar_sdk.soroban_rpc import EventFilter

    usdc = [EventFilter(contract_ids=[g["contracts"]["usdc"]])]  # not the CAP-67 fee events
    first = server.get_events(start_ledger=start, limit=10, filters=usdc)
    assert first.events == [] and int(first.cursor[:19]) >> 32 == start + 10_000 - 1
    second = server.get_events(cursor=first.cursor, limit=10, filters=usdc)
    assert [e.ledger for e in second.events] == [landed]


def test_trustline_and_sac_contract_balance_entries(devnet: DevnetHandle, server: SorobanServer) -> None:
    from stellar_sdk import Asset

    g = devnet.genesis
    user = g["users"][2]["public"]
    asset = Asset("USDC", g["issuer"]["public"])
    key = xdr.LedgerKey(type=xdr.LedgerEntryType.TRUSTLINE, trust_line=xdr.LedgerKeyTrustLine(
        account_id=Keypair.from_public_key(user).xdr_account_id(), asset=asset.to_trust_line_asset_xdr_object()))
    [entry] = server.get_ledger_entries([key]).entries
    assert xdr.LedgerEntryData.from_xdr(entry.xdr).trust_line.balance.int64 == 1_000 * 10_000_000
    assert entry.live_until_ledger is None  # classic entries carry no TTL
    devnet.fund(g["contracts"]["billing"], usdc=12)
    bal = server.get_sac_balance(g["contracts"]["billing"], asset, devnet.passphrase)
    assert bal.balance_entry is not None and int(bal.balance_entry.amount) >= 12
