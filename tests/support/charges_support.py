"""Shared steps for the charge-side tests (settlement, observer, drills) and the bench: fund accounts
through the real funding path, admit charges through the SQL function, drive ticks until quiet,
and check the invariants of the drill invariants (docs/architecture.md §1) against the chain."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg

from tests.support.chain_env import (
    ChainEnv,
    admit_deposit,
    billing_balance,
    chain_environ,
    contract_events,
    sign_deposit,
)
from tests.support.cli import Result
from tests.support.devnet_support import DevnetHandle


def charge_chain(devnet: DevnetHandle, dsn: str, keys_dir: Any) -> ChainEnv:
    """paygate wired to `devnet` for the charge side: the observer starts at ledger 1 and a dead
    settlement worker's batch lease lapses after a second."""
    environ = chain_environ(devnet, dsn, keys_dir)
    environ.update(PAYGATE_OBSERVER_START_LEDGER="1", PAYGATE_SETTLEMENT_LEASE="1s")
    return ChainEnv(devnet, dsn, environ)


def admit_charge(db: psycopg.Connection, account: str, amount: int, key: str, **kw: Any) -> tuple[int, bytes]:
    row = db.execute("SELECT charge_row_id, charge_id FROM paygate.admit_charge(%s, %s, %s, %s)",
                     (account, amount, key, kw.get("description"))).fetchone()
    return int(row[0]), bytes(row[1])


def fund(chain: ChainEnv, db: psycopg.Connection, deposits: list[tuple[dict[str, str], int]], *,
         rounds: int = 20) -> None:
    """Deposit through funding (deposit + credit lineages) until every deposit is settled."""
    for n, (user, amount) in enumerate(deposits):
        entry, nonce, expiration = sign_deposit(chain.devnet, user["secret"], amount, valid_ledgers=500)
        admit_deposit(db, user["public"], amount, entry, nonce, expiration, f"fund-{user['public'][:8]}-{n}")
    for _ in range(rounds):
        result = chain.tick("funding")
        assert result.code in (0, 1), result.err
        if not db.execute("SELECT count(*) FROM paygate.deposits WHERE status = 'pending'").fetchone()[0]:
            return
        chain.devnet.close_ledger()
    raise AssertionError("funding did not settle the deposits")


def open_work(db: psycopg.Connection) -> int:
    return int(db.execute("""
        SELECT (SELECT count(*) FROM paygate.charges WHERE status = 'authorized')
             + (SELECT count(*) FROM paygate.charge_batches WHERE closed_at IS NULL)
             + (SELECT count(*) FROM paygate.deposits WHERE status = 'pending')
             + (SELECT count(*) FROM paygate.lineages WHERE state IN ('allocated', 'signed', 'sent'))
    """).fetchone()[0])


def run_until_quiet(chain: ChainEnv, db: psycopg.Connection, *, rounds: int = 40,
                    runner: Any = None) -> list[Result]:
    """settlement, observer, close a ledger; repeat until nothing is open and the observer has seen
    the last ledger. `runner(worker)` may replace the in-process tick (e.g. real processes)."""
    tick = runner or (lambda worker: chain.tick(worker))
    results = []
    for _ in range(rounds):
        for worker in ("settlement", "observer"):
            result = tick(worker)
            results.append(result)
            assert result.code in (0, 1, 3), f"{worker} exited {result.code}: {result.err}"
        if not open_work(db):
            chain.devnet.close_ledger()
            final = tick("observer")
            assert final.code in (0, 3), final.err
            return results
        chain.devnet.close_ledger()
    raise AssertionError(f"charges did not go quiet: {open_work(db)} open items")


def check_invariants(chain: ChainEnv, db: psycopg.Connection, accounts: list[str]) -> dict[str, Any]:
    """The drill invariants (docs/architecture.md §1) after quiescence: one debit per charge id on
    chain, every charge terminal and agreeing with the chain, cached balances = chain balances, each
    event applied once."""
    charges = contract_events(chain, "charge")
    failed = contract_events(chain, "charge_failed")
    ids = Counter(bytes(e["value"][1]) for e in charges + failed)
    assert all(n == 1 for n in ids.values()), "a charge id was consumed twice on chain"
    rows = {bytes(r[0]): (r[1], r[2]) for r in db.execute("SELECT charge_id, status, failed_by FROM paygate.charges")}
    assert all(status in ("settled", "failed") for status, _ in rows.values()), "a charge is not terminal"
    for e in charges:
        assert rows[bytes(e["value"][1])][0] == "settled", "debited on chain but not settled"
    for e in failed:
        assert rows[bytes(e["value"][1])] == ("failed", "observer")
    for charge_id, (status, _) in rows.items():
        if status == "settled":
            assert charge_id in ids
    for account in accounts:
        cached = db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s", (account,)).fetchone()[0]
        assert int(cached) == billing_balance(chain, account), f"cached balance of {account} differs from chain"
    credits = contract_events(chain, "credit")
    stored = db.execute("SELECT event_id, effect, quarantined FROM paygate.chain_events").fetchall()
    assert len(stored) == len(charges) + len(failed) + len(credits), "events stored != events on chain"
    assert not [s for s in stored if s[2]], "unexpected quarantined events"
    outbox_settled = db.execute("SELECT count(*) FROM paygate.webhook_outbox WHERE event_type = 'charge.settled'"
                                ).fetchone()[0]
    endpoints = db.execute("SELECT count(*) FROM paygate.webhook_endpoints WHERE enabled").fetchone()[0]
    assert outbox_settled == len(charges) * endpoints, "one charge.settled outbox event per settled charge"
    return {"charged": len(charges), "failed": len(failed), "credits": len(credits)}


def add_endpoint(db: psycopg.Connection) -> None:
    db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES ('http://127.0.0.1:9/hook', "
               "'0123456789abcdef0123')")
