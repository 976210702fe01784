"""Shared helpers of the funding tests (the crash drills, bad input, faults, liveness, the journal and
chain tests that run deposits): admit a signed deposit, read its row and the lineages, run ticks until
the queue is quiet, and check the drill invariants (docs/architecture.md §1) against the chain."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from stellar_sdk import Keypair, TransactionBuilder, scval, xdr

from tests.support.chain_env import (
    ChainEnv,
    admit_deposit,
    billing_balance,
    contract_events,
    landed_auth_types,
    sign_deposit,
)
from tests.support.cli import Result
from tests.support.drill_support import crash_tick as drill_crash_tick

AMOUNT = 25_000_000


def admit(chain: ChainEnv, db: psycopg.Connection, user: int = 0, amount: int = AMOUNT, key: str | None = None,
          **sign: Any) -> int:
    u = chain.genesis["users"][user]
    entry, nonce, expiration = sign_deposit(chain.devnet, u["secret"], amount, **sign)
    return admit_deposit(db, u["public"], amount, entry, nonce, expiration, key or f"dep-{user}-{nonce}")


def row_of(db: psycopg.Connection, pending_id: int) -> dict[str, Any]:
    cursor = db.execute("SELECT * FROM paygate.deposits WHERE id = %s", (pending_id,))
    return dict(zip([c.name for c in cursor.description], cursor.fetchone(), strict=True))


def lineages_of(db: psycopg.Connection) -> list[dict[str, Any]]:
    cursor = db.execute("SELECT * FROM paygate.lineages ORDER BY id")
    names = [c.name for c in cursor.description]
    return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


def crash_tick(chain: ChainEnv, point: str) -> Result:
    """One real tick process with the crash point armed; it must die by SIGKILL there (marker checked)."""
    return drill_crash_tick(chain.environ, "funding", point)


def is_quiet(db: psycopg.Connection) -> bool:
    open_rows = db.execute("SELECT count(*) FROM paygate.deposits WHERE status = 'pending'").fetchone()[0]
    live = db.execute("SELECT count(*) FROM paygate.lineages WHERE state IN ('allocated','signed','sent')"
                      ).fetchone()[0]
    return not open_rows and not live


def wait_for_leases(db: psycopg.Connection) -> None:
    """Sleep until no pending row holds a lease (DB time): a dead process's claim has lapsed."""
    left = db.execute("SELECT coalesce(extract(epoch FROM max(lease_expires_at) - now()), 0)::float8 "
                      "FROM paygate.deposits WHERE status = 'pending' AND lease_expires_at > now()"
                      ).fetchone()[0]
    if left > 0:
        time.sleep(left + 0.05)


def run_until_quiet(chain: ChainEnv, db: psycopg.Connection, rounds: int = 30,
                    allowed: tuple[int, ...] = (0, 1)) -> list[Result]:
    """Tick (in-process), close a ledger, repeat until no row is pending and no lineage is live."""
    results = []
    for _ in range(rounds):
        wait_for_leases(db)
        result = chain.tick("funding", "--once")
        results.append(result)
        assert result.code in allowed, (result.code, result.err)
        if is_quiet(db):
            return results
        chain.devnet.close_ledger()
    rows = db.execute("SELECT id, status FROM paygate.deposits").fetchall()
    raise AssertionError(f"funding did not go quiet; rows: {rows} "
                         f"lineages: {[(x['id'], x['purpose'], x['state']) for x in lineages_of(db)]}")


def addr(topic: Any) -> str:
    """An event topic that is an address, as its strkey."""
    return str(getattr(topic, "address", topic))


def assert_invariants(chain: ChainEnv, db: psycopg.Connection, settled: list[int],
                      credentials: xdr.SorobanCredentialsType | None = None) -> None:
    """The drill invariants (docs/architecture.md §1) for the given deposits, which must all have
    settled; with `credentials`, each deposit that landed carries exactly one auth entry of that version."""
    g = chain.genesis
    billing = g["contracts"]["billing"]
    credits = contract_events(chain, "credit")
    transfers = [t for t in contract_events(chain, "transfer") if addr(t["topics"][2]) == billing]
    for pending_id in settled:
        row = row_of(db, pending_id)
        assert row["status"] == "settled", row
        deposit_tx = bytes(row["deposit_tx"])
        mine = [c for c in credits if c["value"][1] == deposit_tx]
        assert len(mine) == 1, f"deposit {pending_id}: {len(mine)} credit events"
        assert addr(mine[0]["topics"][1]) == row["account"] and mine[0]["value"][0] == int(row["amount"])
        applied = db.execute("SELECT inner_hash FROM paygate.lineages WHERE entitlement = %s AND state = 'applied'",
                             (f"deposit:{pending_id}:deposit",)).fetchall()
        assert [bytes(a[0]) for a in applied] == [deposit_tx]
        if credentials is not None:
            assert landed_auth_types(chain, deposit_tx) == [credentials], pending_id
    # exactly one SAC transfer into the billing contract per authorisation we settled
    by_account: dict[str, int] = {}
    for pending_id in settled:
        by_account[row_of(db, pending_id)["account"]] = by_account.get(row_of(db, pending_id)["account"], 0) + 1
    for account, count in by_account.items():
        assert len([t for t in transfers if addr(t["topics"][1]) == account]) == count, account
    assert len(credits) == len(settled) and len(transfers) == len(settled)
    # cached balance = on-chain billing balance, for every account we know
    for address, cached in db.execute("SELECT address, cached_balance FROM paygate.accounts").fetchall():
        assert int(cached) == billing_balance(chain, address), address
    # the journal is quiet: nothing live, no lane busy, at most one applied lineage per entitlement
    assert db.execute("SELECT count(*) FROM paygate.lineages WHERE state IN ('allocated','signed','sent')"
                      ).fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM paygate.lanes l WHERE EXISTS (SELECT 1 FROM paygate.lineages x "
                      "WHERE x.lane = l.address AND x.state IN ('allocated','signed','sent'))").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM (SELECT entitlement FROM paygate.lineages WHERE state = 'applied' "
                      "GROUP BY entitlement HAVING count(*) > 1) t").fetchone()[0] == 0
    # nothing left pending with a lease
    assert db.execute("SELECT count(*) FROM paygate.deposits WHERE lease_token IS NOT NULL").fetchone()[0] == 0


def flip_signature_byte(entry_b64: str) -> str:
    entry = xdr.SorobanAuthorizationEntry.from_xdr(entry_b64)
    creds = entry.credentials.address_v2 or entry.credentials.address
    sig_map = creds.signature.vec.sc_vec[0].map.sc_map
    for item in sig_map:
        if scval.to_native(item.key) == "signature":
            raw = bytearray(item.val.bytes.sc_bytes)
            raw[0] ^= 0x01
            item.val.bytes.sc_bytes = bytes(raw)
    return entry.to_xdr()


def submit_directly(chain: ChainEnv, entry: str, account: str, amount: int) -> None:
    """Someone else (the billing admin's key) relays the user's own authorisation."""
    g = chain.genesis
    relayer = Keypair.from_secret(g["admin"]["secret"])
    with chain.server() as server:
        source = server.load_account(relayer.public_key)
        tx = (TransactionBuilder(source, g["passphrase"], base_fee=100)
              .append_invoke_contract_function_op(
                  g["contracts"]["usdc"], "transfer",
                  [scval.to_address(account), scval.to_address(g["contracts"]["billing"]), scval.to_int128(amount)],
                  auth=[xdr.SorobanAuthorizationEntry.from_xdr(entry)])
              .set_timeout(300).build())
        tx = server.prepare_transaction(tx)
        tx.sign(relayer)
        assert server.send_transaction(tx).status.value == "PENDING"
        chain.devnet.close_ledger()
        assert server.get_transaction(tx.hash_hex()).status.value == "SUCCESS"
