"""A relay whose lineage a restore lost: its transaction landed after the backup, so the restored
database knows the relay (queued) but not the lineage that sent it. The relay worker finds the
authorisation nonce consumed and proves from the chain alone which transaction consumed it (ours: our
fee account paid it, it carries the relay's authorisation, a majority of read hosts show it landed):
the relay is settled from that receipt, its fee included, exactly once. A nonce the user spent through
a transaction that is not ours stays a human's question, its reservation open.

The restore is real: pg_dump and pg_restore into a new database (tests/support/pg_backup.py
restored_copy); the gate's pass (`recover-check`) reopens submissions as the runbook does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import Keypair, TransactionBuilder, xdr

from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.cli import Result, run_cli
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.pg import PgServer
from tests.support.pg_backup import restored_copy
from tests.support.relay_support import admit_relay, allow_market, chain_fee, relay_rows, run_until_quiet


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=3, users=2)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    # paygate signs with lanes 0-1; lane 2 is an account outside paygate.
    return ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys", lanes=2))


@pytest.fixture
def restored(pg_server: PgServer) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for copy in made:
        pg_server.drop_database(copy)


def details(result: Result) -> dict:
    return json.loads(result.out)["run_tick"]["last_details"]


def submit_elsewhere(chain: ChainEnv, db: psycopg.Connection, relay_id: int) -> None:
    """The user's signed call sent by an account outside paygate (lane 2 pays its own fee, no fee
    bump of ours), then a ledger closed: the authorisation's nonce is spent, not by us."""
    g = chain.genesis
    args_xdr, entries = db.execute("SELECT args_xdr, auth_entries FROM paygate.relays WHERE id = %s",
                                   (relay_id,)).fetchone()
    source = Keypair.from_secret(g["lanes"][2]["secret"])
    args = list(xdr.SCVal.from_xdr(args_xdr).vec.sc_vec)
    auth = [xdr.SorobanAuthorizationEntry.from_xdr(e) for e in entries]
    with chain.server() as server:
        tx = (TransactionBuilder(server.load_account(source.public_key), g["passphrase"], base_fee=100)
              .append_invoke_contract_function_op(g["contracts"]["market"], "buy", args, auth=auth)
              .set_timeout(300).build())
        tx = server.prepare_transaction(tx)
        tx.sign(source)
        assert server.send_transaction(tx).status.value == "PENDING"
    applied = chain.devnet.close_ledger()["applied"]
    assert applied and applied[0]["status"] == "SUCCESS", applied


def test_a_relay_whose_lineage_the_restore_lost_settles_from_its_receipt(
        chain: ChainEnv, pg_server: PgServer, restored: list[str], tmp_path: Path) -> None:
    users = chain.genesis["users"]
    assert chain.tick("relay").code == 0  # a first tick records the database's identity
    with psycopg.connect(chain.dsn, autocommit=True) as db:
        allow_market(db, chain.genesis["contracts"]["market"])
        db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES ('http://127.0.0.1:9/h', "
                   "'0123456789abcdef0123')")
        ours = admit_relay(db, chain.devnet, users[0], "r-lost-lineage", "book", 7)
        theirs = admit_relay(db, chain.devnet, users[1], "r-spent-elsewhere", "pen", 3)
        # A short authorisation: it has expired by the time the restored database runs.
        late = admit_relay(db, chain.devnet, users[0], "r-expired-meanwhile", "pen", 2, valid_ledgers=12)
    backup = restored_copy(pg_server, chain.dsn, tmp_path)  # both queued, no lineage yet
    restored.append(backup)
    with psycopg.connect(chain.dsn, autocommit=True) as db:
        submit_elsewhere(chain, db, theirs)
        db.execute("UPDATE paygate.relays SET status = 'rejected', reason = 'test: sent elsewhere', "
                   "finished_at = now() WHERE id = %s", (theirs,))  # the original leaves it alone
        run_until_quiet(chain, db)
        landed, late_row = relay_rows(db)[ours], relay_rows(db)[late]
    assert landed["status"] == "applied" and late_row["status"] == "applied"
    tx, fee = bytes(landed["tx_hash"]), int(landed["fee_charged"])
    assert chain_fee(chain, tx) == ("SUCCESS", fee)
    chain.devnet.close_ledger(14)  # past the short authorisation

    after = ChainEnv(chain.devnet, backup, {**chain.environ, "PAYGATE_DATABASE_URL": backup})
    with psycopg.connect(after.dsn, autocommit=True) as db:
        assert db.execute("SELECT count(*) FROM paygate.lineages").fetchone()[0] == 0
        # Expired by ledger, but admitted before the restore: a lost transaction of ours may have used it
        # (it did), and its nonce entry is gone with its expiry. Relay expiry leaves it to the relay
        # worker: an expiry would release a fee the chain charged and tell the product it never ran.
        expiry = after.tick("relay_expiry")
        assert expiry.code == 0, expiry.err
        assert details(expiry)["expired"] == 0, details(expiry)
        assert {r["status"] for r in relay_rows(db).values()} == {"queued"}
        # The recreated database closes submissions (the restore halt); reading the chain and settling
        # from its receipts is no submission, so the relay worker does that while the halt is set.
        result = after.tick("relay")
        assert db.execute("SELECT count(*) FROM paygate.halts WHERE kind = 'restore'").fetchone()[0] == 1
        assert result.code == 3, result.err  # the nonce spent elsewhere is a human's
        assert "relay.landed_without_lineage" in result.err
        assert "relay.nonce_consumed_elsewhere" in result.err
        assert "relay.expired_across_restore" in result.err
        rows = relay_rows(db)
        assert (rows[ours]["status"], bytes(rows[ours]["tx_hash"]), rows[ours]["fee_charged"]) == ("applied", tx, fee)
        assert rows[ours]["lineage_id"] is None  # settled from the chain's receipt, no lineage invented
        assert rows[theirs]["status"] == "needs_human"
        assert rows[late]["status"] == "needs_human" and "a restore" in rows[late]["reason"]
        reservations = dict(((r, (s, f, bytes(h) if h else None)) for r, s, f, h in db.execute(
            "SELECT relay_id, status, fee_charged, tx_hash FROM paygate.fee_reservations").fetchall()))
        assert reservations[ours] == ("settled", fee, tx)
        assert reservations[theirs] == reservations[late] == ("reserved", None, None)  # a human decides
        assert db.execute("SELECT settled FROM paygate.relay_fee_totals").fetchone()[0] == fee
        assert db.execute("SELECT count(*) FROM paygate.webhook_outbox WHERE event_type = 'relay.applied' "
                          "AND payload->>'relay_id' = %s", (str(ours),)).fetchone()[0] == 1
        cleared = run_cli("recover-check", "--yes", "--json", environ=after.environ)
        # Clean: the lane the lost lineage used has no sequence in the backup's journal to be ahead
        # of (it was first used after the backup), and nothing is live.
        assert cleared.code == 0, cleared.err
        assert db.execute("SELECT count(*) FROM paygate.halts WHERE kind = 'restore'").fetchone()[0] == 0
        again = after.tick("relay")  # nothing left to do: settled once
        assert again.code == 0, again.err
        assert db.execute("SELECT settled FROM paygate.relay_fee_totals").fetchone()[0] == fee
