"""The soak's invariant checks can fail: violations planted in a quiet world are each reported, with
the rows involved, and the same world without them is clean."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb
from stellar_sdk import Keypair, TransactionBuilder, scval, xdr
from stellar_sdk.soroban_rpc import GetTransactionStatus, SendTransactionStatus

from tests.chaos.invariants import Findings, _persistent, check_all, check_ttl
from tests.support.chain_env import ChainEnv
from tests.support.charges_support import charge_chain
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.webhook_receiver import Receiver


@pytest.fixture
def chain(dsn: str, tmp_path: Path) -> Iterator[ChainEnv]:
    devnet: DevnetHandle = start_devnet(tmp_path / "devnet", lanes=1, users=2)
    try:
        yield charge_chain(devnet, dsn, tmp_path / "keys")
    finally:
        devnet.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver().start()
    yield server
    server.stop()


def test_planted_violations_are_each_reported(chain: ChainEnv, db: psycopg.Connection, receiver: Receiver) -> None:
    clean = check_all(chain, chain.dsn, receiver)
    assert clean.violations == [], clean.violations

    user = chain.genesis["users"][0]["public"]
    # A cached balance the chain does not have, and a webhook event never delivered.
    db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 5000)", (user,))
    endpoint = db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES ('http://127.0.0.1:9/x', "
                          "'0123456789abcdef0123') RETURNING id").fetchone()[0]
    db.execute("INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload) VALUES (%s, 'x', %s)",
               (endpoint, Jsonb({})))
    found = {v.invariant: v.detail for v in check_all(chain, chain.dsn, receiver).violations}
    assert "cached balances equal chain balances" in found
    assert user in found["cached balances equal chain balances"]
    assert "every webhook_outbox row terminal" in found
    assert "every webhook event delivered" in found


def test_planted_fee_market_violations_are_each_reported(chain: ChainEnv, db: psycopg.Connection,
                                                         receiver: Receiver) -> None:
    lane = chain.genesis["lanes"][0]["public"]
    db.execute("INSERT INTO paygate.lanes (address) VALUES (%s) ON CONFLICT DO NOTHING", (lane,))
    job = db.execute("INSERT INTO paygate.bot_jobs (job_key, request_hash, contract, function, args_xdr, status, "
                     "attempts, reason, finished_at) VALUES ('close:x', '\\x00', %s, 'close_expired', 'AAAA', 'dead', "
                     "1, '1 lineages proven dead (max 1)', now()) RETURNING id",
                     (chain.genesis["contracts"]["market"],)).fetchone()[0]

    def lineage(entitlement: str, state: str, seq: int, **columns: object) -> int:
        names = ["purpose", "entitlement", "lane", "state", "source_seq", "key_id", "envelope", "inner_hash",
                 "outer_hash", "max_time", "signed_at_ledger", "fee_ops", "resource_fee", *columns]
        values = ["relay", entitlement, lane, state, seq, "k", b"\x00", bytes([seq]) * 32, bytes([seq + 100]) * 32,
                  1, 1, 2, 1000, *columns.values()]
        return db.execute(f"INSERT INTO paygate.lineages ({', '.join(names)}) VALUES "
                          f"({', '.join(['%s'] * len(names))}) RETURNING id", values).fetchone()[0]

    # A bot job that died of a lineage that starved (expired after a replacement), counted as its
    # attempt; the replacement bid above the lineage's cap.
    starved = lineage(f"bot_job:{job}", "expired", 1, replacements=1, bid_rate=3000, cap_rate=2500)
    db.execute("UPDATE paygate.bot_jobs SET dead_lineages = ARRAY[%s]::bigint[] WHERE id = %s", (starved, job))
    db.execute("INSERT INTO paygate.lineage_envelopes (lineage_id, replaced_by, outer_hash, bid_rate) "
               "VALUES (%s, 1, %s, 300)", (starved, b"\x07" * 32))
    # An applied lineage the chain never included.
    lineage("relay:999", "applied", 2, ledger=1, fee_charged=4400, bid_rate=200, cap_rate=2500)
    # A fee bump the chain included, journaled as a lineage whose cap is below what it was charged
    # and whose outer envelope is not the one that landed.
    inner, ledger, charged = _fee_bumped_call(chain)
    db.execute("INSERT INTO paygate.lineages (purpose, entitlement, lane, state, source_seq, key_id, envelope, "
               "inner_hash, outer_hash, max_time, signed_at_ledger, fee_ops, resource_fee, bid_rate, cap_rate, ledger, "
               "fee_charged) VALUES ('relay', 'relay:998', %s, 'applied', 3, 'k', '\\x00', %s, %s, 1, 1, 2, 0, 100, "
               "100, %s, %s)", (lane, inner, b"\x09" * 32, ledger, charged))

    found = {v.invariant: v.detail for v in check_all(chain, chain.dsn, receiver).violations}
    assert f"bot_jobs {{'id': {job}" in found["no unit failed for its fee"]
    assert f"'dead_lineages': [{starved}]" in found["no unit failed for its fee (a starved lineage is no attempt)"]
    assert f"'id': {starved}" in found["fees charged <= cap (no envelope bids above its cap)"]
    assert "'entitlement': 'relay:999'" in found["an applied or failed lineage landed exactly once"]
    assert f"feeCharged {charged} > cap 200" in found["fees charged <= cap"]
    assert "'entitlement': 'relay:998'" in found["what landed is one of the lineage's own outer envelopes"]


def _fee_bumped_call(chain: ChainEnv) -> tuple[bytes, int, int]:
    """A lane's read-only billing call, fee-bumped by the fee account, sent and included:
    (inner hash, ledger, feeCharged)."""
    g = chain.genesis
    lane, fee = Keypair.from_secret(g["lanes"][0]["secret"]), Keypair.from_secret(g["fee_account"]["secret"])
    with chain.server() as server:
        tx = (TransactionBuilder(server.load_account(lane.public_key), g["passphrase"], base_fee=100)
              .append_invoke_contract_function_op(g["contracts"]["billing"], "balance",
                                                  [scval.to_address(g["users"][0]["public"])])
              .set_timeout(300).build())
        tx = server.prepare_transaction(tx)
        tx.sign(lane)
        bumped = TransactionBuilder.build_fee_bump_transaction(fee.public_key, 200, tx, g["passphrase"])
        bumped.sign(fee)
        assert server.send_transaction(bumped).status == SendTransactionStatus.PENDING
        chain.devnet.close_ledger()
        landed = server.get_transaction(bumped.hash_hex())
        assert landed.status == GetTransactionStatus.SUCCESS, landed
        result = xdr.TransactionResult.from_xdr(landed.result_xdr)
        return tx.hash(), int(landed.ledger), int(result.fee_charged.int64)


def test_planted_archived_kept_entries_are_reported(chain: ChainEnv, db: psycopg.Connection,
                                                     receiver: Receiver) -> None:
    assert "nothing paygate keeps alive is archived" not in {
        v.invariant for v in check_all(chain, chain.dsn, receiver).violations}
    user = chain.genesis["users"][0]["public"]
    # A kept entry the keeper saw archived, and (below) the chain past every genesis entry's TTL.
    key = _persistent(chain.genesis["contracts"]["billing"],
                      scval.to_vec([scval.to_symbol("Balance"), scval.to_address(user)])).to_xdr()
    db.execute("INSERT INTO paygate.ttl_entries (key_hash, key_xdr, kind, account, state, read_at) "
               "VALUES (sha256(decode(%s, 'base64')), %s, 'account_balance', %s, 'archived', now())", (key, key, user))
    found = {v.invariant: v.detail for v in check_all(chain, chain.dsn, receiver).violations}
    assert user in found["nothing paygate keeps alive is archived (ttl_entries)"]
    assert "nothing paygate keeps alive is archived" not in found
    chain.devnet.rpc("devnet_advance", {"ledgers": 2_073_600 + 10})  # the default persistent TTL, and past it
    out = Findings()  # this check alone: the others read events from ledger 1, now past retention
    check_ttl(chain, db, out)
    found = {v.invariant: v.detail for v in out.violations}
    assert "'instance', 0" in found["nothing paygate keeps alive is archived"]
    assert "'code', 0" in found["nothing paygate keeps alive is archived"]
