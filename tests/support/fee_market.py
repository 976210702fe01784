"""The fee market in the tests (docs/architecture.md §4 "Fees and the fee market"): steer the devnet's
competing demand and capacity, and read back, from the chain only, what landed under an inner hash
(which outer envelope, for which fee, how many times) to check the re-bump drills and the surge
tests against."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from stellar_sdk import FeeBumpTransactionEnvelope, TransactionEnvelope, xdr
from stellar_sdk.soroban_rpc import GetTransactionStatus

from paygate_cli.journal.keyring import Keyring
from tests.support.chain_env import ChainEnv
from tests.support.cli import Result, run_cli
from tests.support.devnet_support import DevnetHandle

# Ledgers close between ticks far faster than the production cache (5 s), so each tick reads the
# market afresh: what a tick bids follows the ledger just closed, and a test can say which.
FRESH_FEE_STATS = {"PAYGATE_FEE_STATS_CACHE": "0s"}
BASE_FEE = 100  # the network's minimum inclusion fee per operation (charged when no ledger is full)
FLOOR_RATE = 200  # fee_bump_base_fee: the lowest outer bid rate
FEE_OPS = 2  # a fee bump of a one-operation transaction pays for two


def capacity_args(txs: int) -> list[str]:
    """`paygate devnet start` arguments: at most `txs` Soroban transactions per ledger."""
    return ["--ledger-max-soroban-txs", str(txs)]


def set_capacity(devnet: DevnetHandle, txs: int) -> Any:
    return devnet.rpc("devnet_setLimits", {"ledgerMaxSorobanTxs": txs})


def surge(devnet: DevnetHandle, rate: int, txs: int, ledgers: int) -> Any:
    """Competing demand: `txs` transactions bidding `rate` per operation arrive in each of the next
    `ledgers` ledgers, before anything sent during that ledger."""
    return devnet.set_fault("surge", rate=rate, txs=txs, ledgers=ledgers)


def end_surge(devnet: DevnetHandle) -> Any:
    return devnet.rpc("devnet_clearFaults", {"kind": "surge"})


def market_price(devnet: DevnetHandle, percentile: str = "p90") -> int:
    """What getFeeStats says the market charges per operation (sorobanInclusionFee)."""
    return int(devnet.rpc("getFeeStats")["sorobanInclusionFee"][percentile])


def ours_queued(devnet: DevnetHandle, lane: str) -> list[str]:
    """Outer hashes of the lane's transactions in the devnet's queue (the surge's phantoms are not ours)."""
    return [q["hash"] for q in devnet.state()["queue"] if q["source"] == lane]


# -- the journal ---------------------------------------------------------------------------------

def lineage_rows(db: psycopg.Connection, entitlement: str) -> list[dict[str, Any]]:
    cursor = db.execute("SELECT * FROM paygate.lineages WHERE entitlement = %s ORDER BY id", (entitlement,))
    names = [c.name for c in cursor.description]
    return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


def lineage_row(db: psycopg.Connection, lineage_id: int) -> dict[str, Any]:
    cursor = db.execute("SELECT * FROM paygate.lineages WHERE id = %s", (lineage_id,))
    return dict(zip([c.name for c in cursor.description], cursor.fetchone(), strict=True))


def replaced_envelopes(db: psycopg.Connection, lineage_id: int) -> list[dict[str, Any]]:
    """The outer envelopes a lineage's replacements replaced, oldest first."""
    cursor = db.execute("SELECT * FROM paygate.lineage_envelopes WHERE lineage_id = %s ORDER BY replaced_by",
                        (lineage_id,))
    names = [c.name for c in cursor.description]
    return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


def fee_market_row(db: psycopg.Connection) -> dict[str, Any] | None:
    cursor = db.execute("SELECT * FROM paygate.fee_market")
    row = cursor.fetchone()
    return None if row is None else dict(zip([c.name for c in cursor.description], row, strict=True))


def fee_capped(db: psycopg.Connection) -> list[dict[str, Any]]:
    """Live lineages parked as fee-capped."""
    cursor = db.execute("SELECT id, purpose, entitlement, bid_rate, cap_rate, fee_capped_at, fee_required "
                        "FROM paygate.lineages WHERE fee_capped_at IS NOT NULL "
                        "AND state IN ('allocated', 'signed', 'sent') ORDER BY id")
    names = [c.name for c in cursor.description]
    return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


def journaled_envelope(chain: ChainEnv, row: dict[str, Any]) -> str:
    """The newest committed outer envelope of a lineage (what a resend sends), decrypted with the
    journal keys the workers were given."""
    keys = {k: bytes.fromhex(v) for k, v in
            json.loads(Path(chain.environ["PAYGATE_JOURNAL_KEYS_FILE"]).read_text()).items()}
    return Keyring(keys, row["key_id"]).decrypt(bytes(row["envelope"]), key_id=row["key_id"], lineage_id=row["id"],
                                                source=row["lane"], seq=row["source_seq"]).decode()


def status_json(chain: ChainEnv) -> dict[str, Any]:
    result = run_cli("status", "--json", environ=chain.environ)
    assert result.code in (0, 1), (result.code, result.err)
    return dict(json.loads(result.out)["status"])


# -- the chain -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Landing:
    """What the chain says landed under an inner hash."""

    status: str  # SUCCESS | FAILED | NOT_FOUND
    ledger: int | None
    outer_hash: bytes | None
    fee_charged: int | None
    outer_rate: int | None  # the landed fee bump's inclusion bid per operation


def landing(chain: ChainEnv, inner_hash: bytes) -> Landing:
    with chain.server() as server:
        tx = server.get_transaction(inner_hash.hex())
    if tx.status == GetTransactionStatus.NOT_FOUND:
        return Landing("NOT_FOUND", None, None, None, None)
    envelope = FeeBumpTransactionEnvelope.from_xdr(tx.envelope_xdr, chain.genesis["passphrase"])
    inner = envelope.transaction.inner_transaction_envelope.transaction
    resource_fee = int(inner.soroban_data.resource_fee.int64) if inner.soroban_data is not None else 0
    ops = len(inner.operations) + 1  # the fee bump pays for one operation more (CAP-15)
    rate = (int(envelope.transaction.fee) - resource_fee) // ops
    return Landing(tx.status.value, tx.ledger, envelope.hash(),
                   int(xdr.TransactionResult.from_xdr(tx.result_xdr).fee_charged.int64), rate)


def outer_status(chain: ChainEnv, outer_hash: bytes) -> str:
    """getTransaction by an outer hash: an outer envelope that never landed is NOT_FOUND even when
    another outer around the same inner transaction did."""
    with chain.server() as server:
        return str(server.get_transaction(outer_hash.hex()).status.value)


def landings(chain: ChainEnv, inner_hash: bytes) -> int:
    """How many transactions on chain (every ledger) carry this inner transaction: one per inner
    transaction, whichever outer envelope wrapped it."""
    found = 0
    passphrase = chain.genesis["passphrase"]
    with chain.server() as server:
        cursor: str | None = None
        while True:
            page = (server.get_transactions(cursor=cursor, limit=200) if cursor
                    else server.get_transactions(start_ledger=1, limit=200))
            for tx in page.transactions:
                env = xdr.TransactionEnvelope.from_xdr(tx.envelope_xdr)
                if env.fee_bump is not None:
                    inner = FeeBumpTransactionEnvelope.from_xdr(tx.envelope_xdr, passphrase
                                                                ).transaction.inner_transaction_envelope.hash()
                else:
                    inner = TransactionEnvelope.from_xdr(tx.envelope_xdr, passphrase).hash()
                found += inner == inner_hash
            if not page.transactions or page.cursor in (None, "0", cursor):
                return found
            cursor = page.cursor


def lane_sequence(chain: ChainEnv, lane: str) -> int:
    with chain.server() as server:
        return int(server.load_account(lane).sequence)


def send_raw(chain: ChainEnv, envelope_xdr: str) -> tuple[str, str | None]:
    """Send bytes as a late copy of an earlier broadcast would arrive: (status, result code or None)."""
    from paygate_cli.chain.rpc import result_code_of

    with chain.server() as server:
        answer = server.send_transaction(envelope_xdr)
    return answer.status.value, result_code_of(answer.error_result_xdr) if answer.error_result_xdr else None


def tick_until(chain: ChainEnv, worker: str, done: Any, *, rounds: int = 30, codes: tuple[int, ...] = (0, 1),
               close: bool = True) -> list[Result]:
    """In-process ticks of `worker`, each followed by a ledger close, until `done()`."""
    results: list[Result] = []
    for _ in range(rounds):
        result = chain.tick(worker, "--once")
        results.append(result)
        assert result.code in codes, (worker, result.code, result.err[-3000:])
        if done():
            return results
        if close:
            chain.devnet.close_ledger()
    raise AssertionError(f"{worker}: not done after {rounds} ticks; last: {results[-1].err[-2000:]}")
