"""Wire shapes and validation branches checked against stellar-rpc's own source (each test names the
file): getLedgers' header and metadata XDR, getLedgerEntries' extXdr, and the JSON-RPC error code of
every validation branch of getEvents, getLedgers, getTransactions and getLedgerEntries."""

from __future__ import annotations

import hashlib

from stellar_sdk import Asset, Keypair, SorobanServer, TransactionBuilder, xdr

from tests.devnet.helpers import addr, call, fee_bump, invoke_tx, kp
from tests.support.devnet_support import DevnetHandle


def _payment(server: SorobanServer, devnet: DevnetHandle, src: Keypair, dest: str, amount: str = "3"):
    tx = (TransactionBuilder(server.load_account(src.public_key), devnet.passphrase, base_fee=100)
          .append_payment_op(dest, Asset.native(), amount).set_timeout(300).build())
    tx.sign(src)
    return tx


# stellar-rpc cmd/stellar-rpc/internal/methods/get_ledgers.go (parseLedgerInfo): headerXdr is the
# stored LedgerHeaderHistoryEntry (hash + header + ext), metadataXdr the LedgerCloseMeta core emitted
# (v2 from protocol 23); get_latest_ledger.go sends the bare LedgerHeader instead.
def test_get_ledgers_header_is_a_history_entry_and_metadata_a_close_meta(
        server: SorobanServer, devnet: DevnetHandle) -> None:
    g = devnet.genesis
    lane, user = kp(g["lanes"][0]), g["users"][0]["public"]
    soroban = fee_bump(devnet, invoke_tx(server, devnet, lane, g["contracts"]["billing"], "balance", [addr(user)]))
    classic = _payment(server, devnet, kp(g["lanes"][1]), user)
    assert server.send_transaction(soroban).status.value == "PENDING"
    assert server.send_transaction(classic).status.value == "PENDING"
    seq = devnet.close_ledger()["latestLedger"]
    page = call(devnet.url, "getLedgers", {"startLedger": seq, "pagination": {"limit": 1}})["result"]
    [led] = page["ledgers"]
    entry = xdr.LedgerHeaderHistoryEntry.from_xdr(led["headerXdr"])
    assert entry.hash.hash.hex() == led["hash"] and entry.header.ledger_seq.uint32 == seq
    assert hashlib.sha256(entry.header.to_xdr_bytes()).hexdigest() == led["hash"]
    assert entry.header.scp_value.close_time.time_point.uint64 == int(led["ledgerCloseTime"])
    meta = xdr.LedgerCloseMeta.from_xdr(led["metadataXdr"])
    assert meta.v == 2 and meta.v2.ledger_header.to_xdr() == led["headerXdr"]
    hashes = [p.result.transaction_hash.hash.hex() for p in meta.v2.tx_processing]
    assert sorted(hashes) == sorted([soroban.hash_hex(), classic.hash_hex()])
    for proc in meta.v2.tx_processing:
        got = server.get_transaction(proc.result.transaction_hash.hash.hex())
        assert proc.result.result.to_xdr() == got.result_xdr
        assert proc.tx_apply_processing.to_xdr() == got.result_meta_xdr
    classic_phase, soroban_phase = meta.v2.tx_set.v1_tx_set.phases
    assert [e.to_xdr() for e in classic_phase.v0_components[0].txs_maybe_discounted_fee.txs] == [classic.to_xdr()]
    [stage] = soroban_phase.parallel_txs_component.execution_stages
    assert [e.to_xdr() for e in stage.parallel_tx_execution_stage[0].dependent_tx_cluster] == [soroban.to_xdr()]
    # SDK round trip of the same page.
    sdk_page = server.get_ledgers(start_ledger=seq, limit=1)
    assert sdk_page.ledgers[0].header_xdr == led["headerXdr"]


# stellar-rpc cmd/stellar-rpc/internal/methods/get_ledger_entries.go (ledgerKeyEntryToResult) sends
# every entry's LedgerEntry.ext as extXdr, next to key/xdr/lastModifiedLedgerSeq (and
# liveUntilLedgerSeq only for entries with a TTL: contract data and code).
def test_get_ledger_entries_sends_ext_xdr_for_each_entry(server: SorobanServer, devnet: DevnetHandle) -> None:
    g = devnet.genesis
    user = g["users"][1]["public"]
    acct_key = xdr.LedgerKey(type=xdr.LedgerEntryType.ACCOUNT, account=xdr.LedgerKeyAccount(
        account_id=Keypair.from_public_key(user).xdr_account_id()))
    trust_key = xdr.LedgerKey(type=xdr.LedgerEntryType.TRUSTLINE, trust_line=xdr.LedgerKeyTrustLine(
        account_id=Keypair.from_public_key(user).xdr_account_id(),
        asset=Asset("USDC", g["issuer"]["public"]).to_trust_line_asset_xdr_object()))
    instance_key = xdr.LedgerKey(type=xdr.LedgerEntryType.CONTRACT_DATA, contract_data=xdr.LedgerKeyContractData(
        contract=addr(g["contracts"]["billing"]).address, key=xdr.SCVal(xdr.SCValType.SCV_LEDGER_KEY_CONTRACT_INSTANCE),
        durability=xdr.ContractDataDurability.PERSISTENT))
    res = call(devnet.url, "getLedgerEntries",
               {"keys": [acct_key.to_xdr(), trust_key.to_xdr(), instance_key.to_xdr()]})["result"]
    assert [e["key"] for e in res["entries"]] == [acct_key.to_xdr(), trust_key.to_xdr(), instance_key.to_xdr()]
    for e in res["entries"]:
        assert xdr.LedgerEntryExt.from_xdr(e["extXdr"]).v == 0
    assert ["liveUntilLedgerSeq" in e for e in res["entries"]] == [False, False, True]
    # The SDK's own parser sees the same: a LedgerEntry can be rebuilt from data + ext.
    xdr.LedgerEntry(last_modified_ledger_seq=xdr.Uint32(res["entries"][0]["lastModifiedLedgerSeq"]),
                    data=xdr.LedgerEntryData.from_xdr(res["entries"][0]["xdr"]),
                    ext=xdr.LedgerEntryExt.from_xdr(res["entries"][0]["extXdr"]))


def _err(devnet: DevnetHandle, method: str, params: dict) -> tuple[int, str]:
    body = call(devnet.url, method, params)
    assert "error" in body, body
    return body["error"]["code"], body["error"]["message"]


def _latest(devnet: DevnetHandle) -> int:
    return call(devnet.url, "getLatestLedger", {})["result"]["sequence"]


# getEvents: cmd/stellar-rpc/internal/methods/get_events.go maps GetEventsRequest.Valid
# (go-stellar-sdk protocols/rpc/get_events.go) to InvalidParams, an out-of-range start to
# InvalidRequest; endLedger is only a bound of the scan window, so endLedger <= startLedger scans
# nothing and answers an empty page whose cursor is the window's end (endLedger - 1).
def test_get_events_validation_branches(devnet: DevnetHandle) -> None:
    devnet.close_ledger(n=3)
    latest = _latest(devnet)
    contract = devnet.genesis["contracts"]["billing"]
    assert _err(devnet, "getEvents", {}) == (-32602, "startLedger must be positive")
    assert _err(devnet, "getEvents", {"startLedger": 1, "pagination": {"cursor": "0000000004294967296-0000000000"}}
                ) == (-32602, "ledger ranges and cursor cannot both be set")
    assert _err(devnet, "getEvents", {"endLedger": 3, "pagination": {"cursor": "0000000004294967296-0000000000"}}
                ) == (-32602, "ledger ranges and cursor cannot both be set")
    assert _err(devnet, "getEvents", {"startLedger": 1, "pagination": {"limit": 10_001}}
                ) == (-32602, "limit must not exceed 10000")
    assert _err(devnet, "getEvents", {"startLedger": 1, "xdrFormat": "xml"}
                ) == (-32602, "got 'xml': expected base64, json for optional 'xdrFormat'")
    assert _err(devnet, "getEvents", {"pagination": {"cursor": "abc"}})[0] == -32602  # cursor does not decode
    assert _err(devnet, "getEvents", {"startLedger": latest + 5}) == (
        -32600, f"startLedger must be within the ledger range: 1 - {latest}")
    assert _err(devnet, "getEvents", {"startLedger": 1, "filters": [{}] * 6}) == (
        -32602, "maximum 5 filters per request")
    assert _err(devnet, "getEvents", {"startLedger": 1, "filters": [{"type": "diagnostic"}]}) == (
        -32602, "filter 1 invalid: filter type invalid: if set, type must be either 'system' or 'contract'")
    assert _err(devnet, "getEvents", {"startLedger": 1, "filters": [{}, {"contractIds": [contract] * 6}]}) == (
        -32602, "filter 2 invalid: maximum 5 contract IDs per filter")
    assert _err(devnet, "getEvents", {"startLedger": 1, "filters": [{"contractIds": [contract, "CNOPE"]}]}) == (
        -32602, "filter 1 invalid: contract ID 2 invalid")
    assert _err(devnet, "getEvents", {"startLedger": 1, "filters": [{"topics": [["*"]] * 6}]}) == (
        -32602, "filter 1 invalid: maximum 5 topics per filter")
    assert _err(devnet, "getEvents", {"startLedger": 1, "filters": [{"topics": [[]]}]}) == (
        -32602, "filter 1 invalid: topic 1 invalid: topic must have at least 1 segment")
    assert _err(devnet, "getEvents", {"startLedger": 1, "filters": [{"topics": [["*"], ["**", "*"]]}]}) == (
        -32602, "filter 1 invalid: topic 2 invalid: segment 1 invalid: wildcard '**' is only allowed as the last "
        "segment")
    assert _err(devnet, "getEvents", {"startLedger": 1, "filters": [{"topics": [["*"] * 5]}]}) == (
        -32602, "filter 1 invalid: topic 1 invalid: topic cannot have more than 4 segments")
    assert _err(devnet, "getEvents", {"startLedger": 1, "filters": [{"topics": [["not-an-scval"]]}]})[0] == -32602
    # Four segments plus a trailing "**" is valid (the wildcard is not counted).
    ok = call(devnet.url, "getEvents", {"startLedger": 1, "filters": [{"topics": [["*"] * 4 + ["**"]]}]})
    assert "result" in ok, ok
    # endLedger <= startLedger: accepted, empty page, cursor at the (empty) window's end.
    page = call(devnet.url, "getEvents", {"startLedger": 3, "endLedger": 3})["result"]
    assert page["events"] == [] and int(page["cursor"].split("-")[0]) >> 32 == 2
    page = call(devnet.url, "getEvents", {"startLedger": 3, "endLedger": 2})["result"]
    assert page["events"] == [] and int(page["cursor"].split("-")[0]) >> 32 == 1


# getLedgers: cmd/stellar-rpc/internal/methods/get_ledgers.go maps GetLedgersRequest.Validate
# (go-stellar-sdk protocols/rpc/get_ledgers.go ValidatePagination, IsValidFormat) to InvalidRequest and
# a cursor that fails strconv.ParseUint(…, 10, 32) or points outside the range to InvalidParams.
def test_get_ledgers_validation_branches(devnet: DevnetHandle) -> None:
    devnet.close_ledger(n=2)
    latest = _latest(devnet)
    assert _err(devnet, "getLedgers", {}) == (
        -32600, f"start ledger (0) must be between the oldest ledger: 1 and the latest ledger: {latest} for this rpc "
        "instance")
    assert _err(devnet, "getLedgers", {"startLedger": latest + 1})[0] == -32600
    assert _err(devnet, "getLedgers", {"startLedger": 1, "pagination": {"cursor": "1"}}) == (
        -32600, "startLedger (1) and cursor (1) cannot both be set")
    assert _err(devnet, "getLedgers", {"startLedger": 1, "pagination": {"limit": 201}}) == (
        -32600, "limit must not exceed 200")
    assert _err(devnet, "getLedgers", {"startLedger": 1, "xdrFormat": "xml"}) == (
        -32600, "got 'xml': expected base64, json for optional 'xdrFormat'")
    assert _err(devnet, "getLedgers", {"pagination": {"cursor": "abc"}}) == (
        -32602, 'strconv.ParseUint: parsing "abc": invalid syntax')
    assert _err(devnet, "getLedgers", {"pagination": {"cursor": str(1 << 32)}})[0] == -32602  # not a uint32
    assert _err(devnet, "getLedgers", {"pagination": {"cursor": str(latest)}}) == (
        -32602, f"cursor ('{latest}') must be between the oldest ledger: 1 and the latest ledger: {latest} "
        "for this rpc instance")
    page = call(devnet.url, "getLedgers", {"pagination": {"cursor": "1", "limit": 1}})["result"]
    assert [x["sequence"] for x in page["ledgers"]] == [2] and page["cursor"] == "2"


# getTransactions: cmd/stellar-rpc/internal/methods/get_transactions.go maps
# GetTransactionsRequest.IsValid (go-stellar-sdk protocols/rpc/get_transactions.go) to InvalidRequest,
# an unparsable cursor (strconv.ParseInt) and a cursor ledger without metadata to InvalidParams.
def test_get_transactions_validation_branches(devnet: DevnetHandle) -> None:
    devnet.close_ledger(n=2)
    latest = _latest(devnet)
    in_range = (f"start ledger must be between the oldest ledger: 1 and the latest ledger: {latest} "
                "for this rpc instance")
    assert _err(devnet, "getTransactions", {}) == (-32600, in_range)
    assert _err(devnet, "getTransactions", {"startLedger": latest + 1}) == (-32600, in_range)
    assert _err(devnet, "getTransactions", {"startLedger": 1, "pagination": {"cursor": "5"}}) == (
        -32600, "startLedger and cursor cannot both be set")
    assert _err(devnet, "getTransactions", {"startLedger": 1, "pagination": {"limit": 201}}) == (
        -32600, "limit must not exceed 200")
    assert _err(devnet, "getTransactions", {"startLedger": 1, "xdrFormat": "xml"}) == (
        -32600, "got 'xml': expected base64, json for optional 'xdrFormat'")
    assert _err(devnet, "getTransactions", {"pagination": {"cursor": "abc"}}) == (
        -32602, 'strconv.ParseInt: parsing "abc": invalid syntax')
    assert _err(devnet, "getTransactions", {"pagination": {"cursor": "5"}}) == (  # ledger 0 of the TOID
        -32602, "database does not contain metadata for ledger: 0")
    assert _err(devnet, "getTransactions", {"pagination": {"cursor": "-8589934592"}}) == (
        -32602, "cursor ledger sequence cannot be negative")
    assert _err(devnet, "getTransactions", {"startLedger": "1"})[0] == -32602  # wrong JSON type
    beyond = call(devnet.url, "getTransactions", {"pagination": {"cursor": str((latest + 3) << 32)}})["result"]
    assert beyond["transactions"] == [] and beyond["cursor"] == "0"


# getLedgerEntries: cmd/stellar-rpc/internal/methods/get_ledger_entries.go, every branch InvalidParams.
def test_get_ledger_entries_validation_branches(devnet: DevnetHandle) -> None:
    key = xdr.LedgerKey(type=xdr.LedgerEntryType.ACCOUNT, account=xdr.LedgerKeyAccount(
        account_id=Keypair.random().xdr_account_id())).to_xdr()
    assert _err(devnet, "getLedgerEntries", {"keys": [key], "xdrFormat": "xml"}) == (
        -32602, "got 'xml': expected base64, json for optional 'xdrFormat'")
    assert _err(devnet, "getLedgerEntries", {"keys": [key] * 201}) == (
        -32602, "key count (201) exceeds maximum supported (200)")
    assert _err(devnet, "getLedgerEntries", {"keys": [key, "zz"]}) == (
        -32602, "cannot unmarshal key value zz at index 1")
    ttl = xdr.LedgerKey(type=xdr.LedgerEntryType.TTL, ttl=xdr.LedgerKeyTtl(key_hash=xdr.Hash(bytes(32)))).to_xdr()
    assert _err(devnet, "getLedgerEntries", {"keys": [ttl]}) == (
        -32602, "ledger ttl entries cannot be queried directly")
    assert _err(devnet, "getLedgerEntries", {"keys": "nope"})[0] == -32602  # wrong JSON type
    assert call(devnet.url, "getLedgerEntries", {"keys": [key]})["result"]["entries"] == []
