"""Accounts the chain credited after the point a database was restored to: one the restored
database has no row for at all, one whose row is behind. The reconciler reports each per account
(a finding naming it, its chain balance, unexplained), not only in the contract-wide total, and
`paygate reconcile-report` lists them per account, with the exit codes of any unexplained drift.

The restore is real: pg_dump and pg_restore into a new database (tests/support/pg_backup.py restored_copy)
taken while paygate runs, paygate carrying on in the original until the chain has the new credits."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.chain_env import ChainEnv, billing_balance
from tests.support.charges_support import charge_chain, fund
from tests.support.cli import run_cli
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.pg import PgServer
from tests.support.pg_backup import restored_copy

DEPOSIT = 10_000_000
LATER = 3_000_000


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=2)
    yield handle
    handle.stop()


def findings(db: psycopg.Connection) -> dict[str, dict]:
    """Open balance_drift findings: subject -> details (with the summary)."""
    return {subject: {**details, "summary": summary} for subject, summary, details in db.execute(
        "SELECT subject, summary, details FROM paygate.findings WHERE kind = 'balance_drift' AND resolved_at IS NULL")}


def test_accounts_credited_after_the_restore_point_are_reported_per_account(
        devnet: DevnetHandle, dsn: str, pg_server: PgServer, tmp_path: Path) -> None:
    chain = charge_chain(devnet, dsn, tmp_path / "keys")
    known, first_seen = chain.genesis["users"][0], chain.genesis["users"][1]
    with psycopg.connect(dsn, autocommit=True) as db:
        fund(chain, db, [(known, DEPOSIT)])
    assert chain.tick("observer").code == 0
    assert chain.tick("reconciler").code == 0
    backup = restored_copy(pg_server, dsn, tmp_path)  # last night's backup
    try:
        # After the backup: a second deposit for the known account, a first one for a new account.
        with psycopg.connect(dsn, autocommit=True) as db:
            fund(chain, db, [(first_seen, DEPOSIT), (known, LATER)])  # idempotency keys by position
        assert billing_balance(chain, known["public"]) == DEPOSIT + LATER
        assert billing_balance(chain, first_seen["public"]) == DEPOSIT
        _restored(ChainEnv(devnet, backup, {**chain.environ, "PAYGATE_DATABASE_URL": backup}),
                  known["public"], first_seen["public"])
    finally:
        pg_server.drop_database(backup)


def _restored(after: ChainEnv, known: str, first_seen: str) -> None:
    with psycopg.connect(after.dsn, autocommit=True) as db:
        assert db.execute("SELECT count(*) FROM paygate.accounts WHERE address = %s", (first_seen,)
                          ).fetchone()[0] == 0
        # The observer re-reads the credits from its restored cursor: neither deposit is known.
        assert after.tick("observer").code == 3
        result = after.tick("reconciler")
        assert result.code == 3, result.err  # new findings: alerted
        details = json.loads(result.out)["run_tick"]["last_details"]
        assert details["unknown_accounts"] == 1 and details["unexplained"] == 2, details
        found = findings(db)
        assert set(found) == {known, first_seen}
        unknown = found[first_seen]
        assert unknown["known_to_paygate"] is False and unknown["chain_balance"] == str(DEPOSIT)
        assert unknown["regime"] == "unexplained" and unknown["events"]
        assert f"holds {DEPOSIT} on chain" in unknown["summary"] and "not in paygate.accounts" in unknown["summary"]
        behind = found[known]  # the row is behind the chain by the deposit the restore lost
        assert (behind["drift"], behind["cached_balance"], behind["chain_balance"]) == (
            str(LATER), str(DEPOSIT), str(DEPOSIT + LATER))
        # The total is reported as well, as before.
        assert db.execute("SELECT count(*) FROM paygate.findings WHERE kind = 'total_drift' AND resolved_at IS NULL"
                          ).fetchone()[0] == 1

        # A second tick sees the same findings again: not alerted twice.
        again = after.tick("reconciler")
        assert again.code == 0, again.err
        assert db.execute("SELECT seen_count FROM paygate.findings WHERE subject = %s AND resolved_at IS NULL",
                          (first_seen,)).fetchone()[0] == 2

    report = run_cli("reconcile-report", "--format", "json", environ=after.environ)
    assert report.code == 3, report.err
    document = json.loads(report.out)["reconcile_report"]
    rows = {row["address"]: row for row in document["drift"]}
    assert rows[first_seen]["known_to_paygate"] is False and rows[first_seen]["cached_balance"] is None
    assert int(rows[first_seen]["chain_balance"]) == DEPOSIT == int(rows[first_seen]["unexplained"])
    assert rows[known]["known_to_paygate"] is True and int(rows[known]["unexplained"]) == LATER
    assert document["unexplained"] == 3  # the two accounts and the contract's total
    one = run_cli("reconcile-report", "--format", "json", "--account", first_seen, environ=after.environ)
    assert one.code == 3, one.err
    assert [row["address"] for row in json.loads(one.out)["reconcile_report"]["drift"]] == [first_seen]
    table = run_cli("reconcile-report", environ=after.environ)
    assert table.code == 3 and first_seen in table.out
