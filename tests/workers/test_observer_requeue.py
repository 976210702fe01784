"""A `credit` event read before the database knew its deposit (after a restore) is re-examined each
observer tick and applied once the deposit is known: the deposit settles from the chain's credit event,
the cached balance equals the chain, the quarantine is lifted (audited), never needs_human for the
ordering. Funding, finding its credit already on chain, leaves the row to the observer. An event that is
truly bad (a credit for a hash no deposit of ours has) stays quarantined with its reason.

The restore is real: pg_dump and pg_restore into a new database (tests/support/pg_backup.py restored_copy)
while the deposit's transfer is in flight; paygate carries on in the original until the chain has
the credit, then runs against the restored copy."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import Keypair, TransactionBuilder, scval

from tests.support.chain_env import ChainEnv, billing_balance, chain_environ
from tests.support.cli import Result, run_cli
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.funding import admit, row_of
from tests.support.pg import PgServer
from tests.support.pg_backup import restored_copy

AMOUNT = 30_000_000


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=3, users=2)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    # paygate signs with lanes 0-1; lane 2 is an operator of the billing contract paygate does not control.
    environ = chain_environ(devnet, dsn, tmp_path / "keys", lanes=2)
    environ["PAYGATE_OBSERVER_START_LEDGER"] = "1"
    return ChainEnv(devnet, dsn, environ)


@pytest.fixture
def restored(pg_server: PgServer) -> Iterator[list[str]]:
    """Where restored copies of the test database go (dropped afterwards)."""
    made: list[str] = []
    yield made
    for copy in made:
        pg_server.drop_database(copy)


def rogue_credit(chain: ChainEnv, account: str, amount: int, deposit_tx: bytes) -> None:
    """credit() sent by an operator key outside paygate (lane 2), then a ledger closed."""
    g = chain.genesis
    lane = Keypair.from_secret(g["lanes"][2]["secret"])
    with chain.server() as server:
        tx = (TransactionBuilder(server.load_account(lane.public_key), g["passphrase"], base_fee=100)
              .append_invoke_contract_function_op(g["contracts"]["billing"], "credit", [
                  scval.to_address(lane.public_key), scval.to_address(account), scval.to_int128(amount),
                  scval.to_bytes(deposit_tx)])
              .set_timeout(300).build())
        tx = server.prepare_transaction(tx)
        tx.sign(lane)
        assert server.send_transaction(tx).status.value == "PENDING"
    applied = chain.devnet.close_ledger()["applied"]
    assert applied and applied[0]["status"] == "SUCCESS", applied


def details(result: Result) -> dict:
    return json.loads(result.out)["run_tick"]["last_details"]


def quarantined(conn: psycopg.Connection) -> dict[str, str]:
    """payload ref -> quarantine reason, of every quarantined event."""
    return dict(conn.execute("SELECT payload->>'ref', quarantine_reason FROM paygate.chain_events WHERE quarantined"
                             ).fetchall())


def restore_after_the_credit_landed(chain: ChainEnv, pg_server: PgServer, made: list[str], directory: Path
                                    ) -> tuple[ChainEnv, int, bytes]:
    """A deposit whose transfer is sent when the backup is taken; paygate then settles it on chain
    (transfer and credit) in the original database; the copy is what the restore brings back.
    -> (paygate on the restored database, the deposit's id, its transfer's hash)."""
    user = chain.genesis["users"][0]["public"]
    with psycopg.connect(chain.dsn, autocommit=True) as db:
        pending_id = admit(chain, db, user=0, amount=AMOUNT)
    assert chain.tick("observer").code == 0
    assert chain.tick("funding").code == 0
    with psycopg.connect(chain.dsn, autocommit=True) as db:
        assert db.execute("SELECT state FROM paygate.lineages WHERE purpose = 'deposit'").fetchone()[0] == "sent"
    backup = restored_copy(pg_server, chain.dsn, directory)
    made.append(backup)
    for _ in range(6):  # transfer applied, credit sent, credit applied, settled
        chain.devnet.close_ledger()
        assert chain.tick("funding").code == 0
        with psycopg.connect(chain.dsn, autocommit=True) as db:
            row = row_of(db, pending_id)
        if row["status"] == "settled":
            break
    assert row["status"] == "settled", row
    assert billing_balance(chain, user) == AMOUNT
    return ChainEnv(chain.devnet, backup, {**chain.environ, "PAYGATE_DATABASE_URL": backup}), pending_id, \
        bytes(row["deposit_tx"])


def test_a_credit_read_before_its_deposit_was_known_applies_once_it_is(
        chain: ChainEnv, pg_server: PgServer, restored: list[str], tmp_path: Path) -> None:
    after, pending_id, deposit_tx = restore_after_the_credit_landed(chain, pg_server, restored, tmp_path)
    user = chain.genesis["users"][0]["public"]
    stranger = os.urandom(32)  # a credit for a hash no deposit of ours ever had: bad for good
    rogue_credit(chain, chain.genesis["users"][1]["public"], 1_000, stranger)
    with psycopg.connect(after.dsn, autocommit=True) as db:
        # What the restore gate sets on a restored database (ticks/runner.py): submissions closed, so
        # funding drives the in-flight transfer but sends no credit.
        db.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('restore', 'restored from a copy', "
                   "'test') ON CONFLICT (kind) DO NOTHING")
        assert row_of(db, pending_id)["deposit_tx"] is None

        # The observer reads the credit before funding has re-learned the deposit: quarantined, alarmed.
        first = after.tick("observer")
        assert first.code == 3, first.err
        reasons = quarantined(db)
        assert "re-examined every tick" in reasons[deposit_tx.hex()]
        assert "its lineage is sent" in reasons[deposit_tx.hex()]
        assert "no deposit with deposit_tx" in reasons[stranger.hex()]

        # Funding records the transfer's receipt (applied); the halt keeps it from sending a credit.
        stalled = after.tick("funding")
        assert stalled.code == 1, stalled.err
        assert db.execute("SELECT state FROM paygate.lineages WHERE purpose = 'deposit'").fetchone()[0] == "applied"
        assert row_of(db, pending_id)["status"] == "pending"

        # The next observer tick re-examines it: the deposit settles from the credit event.
        second = after.tick("observer")
        assert second.code == 0, second.err
        assert details(second)["quarantine_lifted"] == 1
        row = row_of(db, pending_id)
        assert (row["status"], row["settled_by"], bytes(row["deposit_tx"])) == ("settled", "observer", deposit_tx)
        cached = db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s", (user,)).fetchone()[0]
        assert cached == AMOUNT == billing_balance(chain, user)
        event = db.execute("SELECT quarantined, quarantine_reason, applied_to, effect FROM paygate.chain_events "
                           "WHERE payload->>'ref' = %s", (deposit_tx.hex(),)).fetchone()
        assert event == (False, None, f"deposit:{pending_id}", "credited")
        was = db.execute("SELECT details->>'was' FROM paygate.audit_log WHERE action = 'quarantine_lifted'"
                         ).fetchone()[0]
        assert "no deposit with deposit_tx" in was
        # The truly bad one stays quarantined with its reason, alarmed once, not again.
        assert quarantined(db) == {stranger.hex(): reasons[stranger.hex()]}
        third = after.tick("observer")
        assert third.code == 0 and "quarantine_lifted" not in details(third), third.err
        assert quarantined(db) == {stranger.hex(): reasons[stranger.hex()]}
        # Nothing applied twice: the balance is still the chain's.
        cached = db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s", (user,)).fetchone()[0]
        assert cached == AMOUNT


def test_funding_finding_its_credit_on_chain_leaves_it_to_the_observer(
        chain: ChainEnv, pg_server: PgServer, restored: list[str], tmp_path: Path) -> None:
    after, pending_id, deposit_tx = restore_after_the_credit_landed(chain, pg_server, restored, tmp_path)
    user = chain.genesis["users"][0]["public"]
    with psycopg.connect(after.dsn, autocommit=True) as db:
        # A clean recovery pass has run (no restore halt; the copy's identity recorded): funding
        # may send again, and the credit it builds finds the one already on chain.
        db.execute("DELETE FROM paygate.halts WHERE kind = 'restore'")
        db.execute("DELETE FROM paygate.db_identity")
        db.execute("SELECT paygate.check_db_identity('test')")
        assert after.tick("observer").code == 3  # quarantined: the deposit is not known yet
        outcomes = {}
        for _ in range(3):
            result = after.tick("funding")
            assert result.code == 0, result.err  # never needs_human (3) for the ordering
            outcomes.update(details(result))
            if "credited_on_chain" in outcomes:
                break
            after.devnet.close_ledger()
        assert outcomes.get("credited_on_chain") == 1, outcomes
        assert "already credited its deposit" in result.err
        row = row_of(db, pending_id)
        assert (row["status"], bytes(row["deposit_tx"])) == ("pending", deposit_tx)
        second = after.tick("observer")
        assert second.code == 0, second.err
        assert details(second)["quarantine_lifted"] == 1
        assert row_of(db, pending_id)["status"] == "settled"
        cached = db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s", (user,)).fetchone()[0]
        assert cached == AMOUNT == billing_balance(chain, user)
        assert not quarantined(db)
        # Funding's next tick finds nothing left to do for it.
        assert after.tick("funding").code == 0
        assert db.execute("SELECT count(*) FROM paygate.deposits WHERE status <> 'settled'").fetchone()[0] == 0


def test_a_deposit_whose_whole_journal_the_restore_lost_settles_from_the_chain(
        chain: ChainEnv, pg_server: PgServer, restored: list[str], tmp_path: Path) -> None:
    """The backup holds the admitted deposit and nothing more: its transfer and credit were journaled
    (and landed) after it. Funding finds the nonce consumed with no lineage of its own; the hash comes
    from the chain (the credit the observer could not match, whose transaction carries this row's
    authorisation), never from a guess: a credit of the same account and amount under a hash that is
    no transaction of that authorisation is not taken."""
    user = chain.genesis["users"][0]["public"]
    with psycopg.connect(chain.dsn, autocommit=True) as db:
        pending_id = admit(chain, db, user=0, amount=AMOUNT)
    assert chain.tick("observer").code == 0
    backup = restored_copy(pg_server, chain.dsn, tmp_path)
    restored.append(backup)
    for _ in range(6):
        assert chain.tick("funding").code == 0
        chain.devnet.close_ledger()
        with psycopg.connect(chain.dsn, autocommit=True) as db:
            row = row_of(db, pending_id)
        if row["status"] == "settled":
            break
    assert row["status"] == "settled", row
    deposit_tx = bytes(row["deposit_tx"])
    decoy = os.urandom(32)
    rogue_credit(chain, user, AMOUNT, decoy)  # same account and amount, no transfer behind it
    after = ChainEnv(chain.devnet, backup, {**chain.environ, "PAYGATE_DATABASE_URL": backup})
    with psycopg.connect(backup, autocommit=True) as db:
        db.execute("DELETE FROM paygate.halts WHERE kind = 'restore'")  # as a clean recovery pass leaves it
        db.execute("DELETE FROM paygate.db_identity")
        db.execute("SELECT paygate.check_db_identity('test')")
        assert db.execute("SELECT count(*) FROM paygate.lineages").fetchone()[0] == 0
        assert after.tick("observer").code == 3
        assert set(quarantined(db)) == {deposit_tx.hex(), decoy.hex()}
        result = after.tick("funding")
        assert result.code == 0, result.err  # not needs_human: the chain shows whose transfer it was
        assert details(result).get("credited_on_chain") == 1, details(result)
        assert "funding.landed_without_lineage" in result.err
        row = row_of(db, pending_id)
        assert (row["status"], bytes(row["deposit_tx"])) == ("pending", deposit_tx)
        assert after.tick("observer").code == 0
        row = row_of(db, pending_id)
        assert (row["status"], row["settled_by"]) == ("settled", "observer")
        cached = db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s", (user,)).fetchone()[0]
        assert cached == AMOUNT and billing_balance(chain, user) == 2 * AMOUNT  # the decoy is not ours
        assert set(quarantined(db)) == {decoy.hex()}


SUBSCRIPTION = 5_000_000


def test_a_subscription_period_the_restore_lost_is_charged_again_under_its_own_id_and_debited_once(
        chain: ChainEnv, pg_server: PgServer, restored: list[str], tmp_path: Path) -> None:
    """The period was charged on chain after the backup; the restored database admits it again. Its
    charge id is derived from the period (sql/functions/admit_charge.sql), so the chain's debit, read by
    the observer before the period was admitted again (quarantined: unknown charge id), settles the
    re-admitted row, and the contract would refuse a second debit of that id anyway."""
    from tests.support.charges_support import run_until_quiet as settle_charges
    from tests.support.funding import run_until_quiet

    user = chain.genesis["users"][0]["public"]
    with psycopg.connect(chain.dsn, autocommit=True) as db:
        admit(chain, db, user=0, amount=AMOUNT)
        run_until_quiet(chain, db)
        db.execute("SELECT paygate.create_subscription(%s, %s, interval '1 hour', now() - interval '10 minutes', "
                   "'sub-restore')", (user, SUBSCRIPTION))
    backup = restored_copy(pg_server, chain.dsn, tmp_path)  # before the period was charged
    restored.append(backup)
    assert chain.tick("subscriptions").code == 0
    with psycopg.connect(chain.dsn, autocommit=True) as db:
        settle_charges(chain, db)
        charge_id, status = db.execute("SELECT charge_id, status FROM paygate.charges").fetchone()
    assert status == "settled" and billing_balance(chain, user) == AMOUNT - SUBSCRIPTION

    after = ChainEnv(chain.devnet, backup, {**chain.environ, "PAYGATE_DATABASE_URL": backup})
    with psycopg.connect(after.dsn, autocommit=True) as db:
        assert db.execute("SELECT count(*) FROM paygate.charges").fetchone()[0] == 0
        first = after.tick("observer")  # the debit, for an id the restored database does not know yet
        assert first.code == 3, first.err
        assert "unknown charge id" in quarantined(db)[bytes(charge_id).hex()]
        # The tick saw the recreated database and closed submissions; the pass reopens them (the lane
        # the lost batch used is fenced: exit 3, not a blocker).
        cleared = run_cli("recover-check", "--yes", "--json", environ=after.environ)
        assert cleared.code == 3, cleared.err
        assert db.execute("SELECT count(*) FROM paygate.halts WHERE kind = 'restore'").fetchone()[0] == 0
        assert after.tick("subscriptions").code == 0
        again, status = db.execute("SELECT charge_id, status FROM paygate.charges").fetchone()
        assert bytes(again) == bytes(charge_id) and status == "authorized"
        second = after.tick("observer")
        assert second.code == 0, second.err
        assert details(second)["quarantine_lifted"] == 1
        assert db.execute("SELECT status FROM paygate.charges").fetchone()[0] == "settled"
        assert quarantined(db) == {}
        assert after.tick("settlement").code == 0  # nothing left to batch
        cached = db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s", (user,)).fetchone()[0]
    assert billing_balance(chain, user) == AMOUNT - SUBSCRIPTION == cached  # debited once
