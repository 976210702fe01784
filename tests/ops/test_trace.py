"""`paygate trace` against a real devnet and a real Postgres: a deposit, a charge and a relay that
went all the way through, traced by id and by hash; a deposit in flight; an account with a drift made
by hand; the chain unreachable; a charge retention archived; the read-only role; never an envelope
or a secret. One world per module (one devnet, one database): the read-only tests run first, the
ones that change the world after them."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from paygate_cli.db.privileges import READONLY_ROLE
from paygate_cli.errors import ExitCode
from tests.support.chain_env import ChainEnv, admit_deposit, sign_deposit
from tests.support.charges_support import add_endpoint, admit_charge, charge_chain, fund
from tests.support.charges_support import run_until_quiet as charges_until_quiet
from tests.support.cli import run_cli
from tests.support.devnet_support import start_devnet
from tests.support.pg import PgServer, hand_edit
from tests.support.relay_support import admit_relay, allow_market
from tests.support.relay_support import run_until_quiet as relays_until_quiet
from tests.support.roles import as_role

DEPOSIT = 10_000_000
CHARGE = 1_234


@dataclass
class World:
    chain: ChainEnv
    db: psycopg.Connection
    keys: Path
    deposit: int
    charge: int
    relay: int


@pytest.fixture(scope="module")
def world(pg_server: PgServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("trace")
    devnet = start_devnet(tmp / "devnet", lanes=2, users=3)
    dsn = pg_server.create_database()
    try:
        chain = charge_chain(devnet, dsn, tmp / "keys")
        with psycopg.connect(dsn, autocommit=True) as db:
            assert run_cli("migrate", "--roles", dsn=dsn).code == 0
            add_endpoint(db)
            users = chain.genesis["users"]
            fund(chain, db, [(users[0], DEPOSIT)])
            [(deposit,)] = db.execute("SELECT id FROM paygate.deposits").fetchall()
            charge, _ = admit_charge(db, users[0]["public"], CHARGE, "trace-charge")
            charges_until_quiet(chain, db)
            allow_market(db, chain.genesis["contracts"]["market"])
            relay = admit_relay(db, devnet, users[1], "trace-relay")
            relays_until_quiet(chain, db)
            yield World(chain, db, tmp / "keys", deposit, charge, relay)
    finally:
        devnet.stop()
        pg_server.drop_database(dsn)


def trace(world: World, *args: str, environ: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    result = run_cli("trace", *args, "--json", environ=environ or world.chain.environ)
    return result.code, json.loads(result.out) if result.out else {}, result.err


def kinds(document: dict[str, Any], source: str | None = None) -> list[str]:
    return [e["kind"] for e in document["timeline"] if source is None or e["source"] == source]


def test_a_settled_deposit_agrees_with_the_chain(world: World) -> None:
    code, doc, err = trace(world, "deposit", str(world.deposit))
    assert code == ExitCode.OK, (doc.get("verdict"), err)
    assert doc["schema_version"] and doc["unit"] == {"kind": "deposit", "id": world.deposit}
    assert doc["verdict"]["agree"] is True and doc["verdict"]["regime"] == "match", doc["verdict"]
    assert "credited to" in doc["verdict"]["where"]
    db_kinds, chain_kinds = kinds(doc, "db"), kinds(doc, "chain")
    assert db_kinds[0] == "admitted" and "deposit.settled" in db_kinds and "webhook" in db_kinds
    assert {"receipt", "nonce", "event.credit", "balance"} <= set(chain_kinds)
    assert [(lin["purpose"], lin["state"], lin["chain"]["decision"]) for lin in doc["lineages"]] == [
        ("deposit", "applied", "applied"), ("credit", "applied", "applied")]
    signed = [e for e in doc["timeline"] if e["kind"] == "lineage.signed"]
    assert len(signed) == 2 and all(len(e["details"]["inner_hash"]) == 64 and len(e["details"]["outer_hash"]) == 64
                                    for e in signed)
    [hook] = [e for e in doc["timeline"] if e["kind"] == "webhook"]
    assert hook["details"]["event"] == "deposit.settled" and hook["details"]["status"] == "pending"
    assert doc["authorisation"]["consumed_on_chain"] is True
    assert doc["balance"]["chain"] == int(doc["balance"]["cached"]) == DEPOSIT - CHARGE


def test_a_charge_debited_on_chain_agrees(world: World) -> None:
    code, doc, err = trace(world, "charge", str(world.charge))
    assert code == ExitCode.OK, (doc.get("verdict"), err)
    assert doc["verdict"]["regime"] == "match" and doc["charge"]["status"] == "settled"
    [event] = [e for e in doc["timeline"] if e["kind"] == "event.charge"]
    assert event["source"] == "chain" and int(event["details"]["amount"]) == CHARGE
    assert [(lin["purpose"], lin["state"]) for lin in doc["lineages"]] == [("charge_batch", "applied")]
    assert "batch" in kinds(doc, "db") and "charge.settled" in kinds(doc, "db")
    assert any(e["kind"] == "webhook" and e["details"]["event"] == "charge.settled" for e in doc["timeline"])


def test_a_relay_agrees_and_its_fee_is_the_chains(world: World) -> None:
    code, doc, err = trace(world, "relay", str(world.relay))
    assert code == ExitCode.OK, (doc.get("verdict"), err)
    assert doc["relay"]["status"] == "applied" and doc["verdict"]["regime"] == "match"
    [lineage] = doc["lineages"]
    landed = [e for e in lineage["chain"]["endpoints"] if e["tx_status"] == "SUCCESS"]
    assert landed and landed[0]["fee_charged"] == doc["relay"]["fee_charged"]
    assert [r["status"] for r in doc["fee_reservations"]] == ["settled"]
    assert {"fee.reserved", "fee.settled"} <= set(kinds(doc, "db"))


def test_a_transaction_is_traced_by_its_inner_and_its_outer_hash(world: World) -> None:
    inner, outer = world.db.execute(
        "SELECT encode(inner_hash, 'hex'), encode(outer_hash, 'hex') FROM paygate.lineages WHERE entitlement = %s",
        (f"deposit:{world.deposit}:credit",)).fetchone()
    for tx_hash, matched in ((inner, "inner"), (outer.upper(), "outer")):
        code, doc, err = trace(world, "tx", tx_hash)
        assert code == ExitCode.OK, err
        assert doc["unit"] == {"kind": "deposit", "id": world.deposit}
        assert doc["tx"]["matched"] == matched and doc["tx"]["entitlement"] == f"deposit:{world.deposit}:credit"
    # A replacement fee bump's record (what the engine journals when it re-bumps: the outer envelope it
    # replaced, and its bid): the replaced outer hash names the same lineage.
    lineage_id = world.db.execute("SELECT id FROM paygate.lineages WHERE entitlement = %s",
                                  (f"deposit:{world.deposit}:credit",)).fetchone()[0]
    replaced = "cd" * 32
    world.db.execute("INSERT INTO paygate.lineage_envelopes (lineage_id, replaced_by, outer_hash, bid_rate, bid_ledger)"
                     " VALUES (%s, 1, decode(%s, 'hex'), 101, 3)", (lineage_id, replaced))
    code, doc, err = trace(world, "tx", replaced)
    assert code == ExitCode.OK, err
    assert doc["tx"]["matched"] == "replaced outer" and doc["unit"] == {"kind": "deposit", "id": world.deposit}
    [credit] = [lin for lin in doc["lineages"] if lin["purpose"] == "credit"]
    assert credit["outer_hashes"] == [replaced, outer]
    [rebump] = [e for e in doc["timeline"] if e["kind"] == "lineage.rebumped"]
    assert rebump["details"]["replaced_outer_hash"] == replaced and rebump["details"]["outer_hash"] == outer
    charge_inner = world.db.execute("SELECT encode(inner_hash, 'hex') FROM paygate.lineages "
                                    "WHERE purpose = 'charge_batch'").fetchone()[0]
    code, doc, _ = trace(world, "tx", charge_inner)
    assert code == ExitCode.OK and doc["unit"] == {"kind": "charge", "id": world.charge}


def test_an_unknown_unit_is_a_usage_error(world: World) -> None:
    for args, said in ((("deposit", "999999"), "no deposit 999999"), (("relay", "424242"), "no relay 424242"),
                       (("tx", "ab" * 32), "no transaction"),
                       (("account", world.chain.genesis["users"][2]["public"]), "no account")):
        result = run_cli("trace", *args, environ=world.chain.environ)
        assert result.code == ExitCode.USAGE and said in result.err, (args, result.err)


def test_the_read_only_role_traces_and_nothing_secret_is_printed(world: World) -> None:
    """As the read-only role from a shell without the lane, fee and journal key files; every output
    is grepped for the envelopes' ciphertext, the auth entries and each secret."""
    environ = {k: v for k, v in world.chain.environ.items()
               if k not in ("PAYGATE_LANE_SECRETS_FILE", "PAYGATE_FEE_SECRET_FILE", "PAYGATE_JOURNAL_KEYS_FILE")}
    environ["PAYGATE_DATABASE_URL"] = as_role(world.chain.dsn, READONLY_ROLE)
    account = world.chain.genesis["users"][0]["public"]
    secrets = [p["secret"] for p in world.chain.genesis["lanes"]] + [world.chain.genesis["fee_account"]["secret"]]
    secrets += list(json.loads((world.keys / "journal-keys").read_text()).values())
    secrets += [s for (s,) in world.db.execute("SELECT secret FROM paygate.webhook_endpoints")]
    blobs = [bytes(e) for (e,) in world.db.execute("SELECT envelope FROM paygate.lineages WHERE envelope IS NOT NULL")]
    entries = [e for (e,) in world.db.execute("SELECT auth_entry FROM paygate.deposits")]
    entries += [e for (es,) in world.db.execute("SELECT auth_entries FROM paygate.relays") for e in es]
    assert blobs and entries
    for args in (("deposit", str(world.deposit)), ("charge", str(world.charge)), ("relay", str(world.relay)),
                 ("account", account)):
        for fmt in ("--json", "--plain", None):
            result = run_cli("trace", *args, *([fmt] if fmt else []), environ=environ)
            assert result.code == ExitCode.OK, (args, fmt, result.err)
            text = result.out + result.err
            for secret in secrets:
                assert secret not in text, (args, fmt)
            for blob in blobs:
                assert blob.hex() not in text and base64.b64encode(blob).decode()[:24] not in text
            for entry in entries:
                assert entry[:40] not in text
            if fmt == "--json":
                assert "envelope" not in _keys(json.loads(result.out)), args


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def test_an_account_agrees_then_a_drift_made_by_hand_is_unexplained(world: World) -> None:
    account = world.chain.genesis["users"][0]["public"]
    code, doc, err = trace(world, "account", account)
    assert code == ExitCode.OK, (doc.get("verdict"), err)
    assert doc["verdict"]["regime"] == "match"
    assert doc["sums"]["deposits_minus_charges"] == doc["account"]["cached_balance"] == doc["chain"]["balance"]
    hand_edit(world.db, "UPDATE paygate.accounts SET cached_balance = cached_balance + 5 WHERE address = %s",
              (account,))
    try:
        code, doc, _ = trace(world, "account", account)
        assert code == ExitCode.NEEDS_HUMAN, doc["verdict"]
        assert doc["verdict"]["regime"] == "unexplained" and doc["verdict"]["agree"] is False
        assert "-5 unexplained" in doc["verdict"]["explanation"], doc["verdict"]
        assert "is not deposits" in doc["verdict"]["explanation"]
    finally:
        hand_edit(world.db, "UPDATE paygate.accounts SET cached_balance = cached_balance - 5 WHERE address = %s",
                  (account,))


def test_the_chain_unreachable_is_exit_1_and_said_in_the_verdict(world: World, tmp_path: Path) -> None:
    environ = world.chain.environ | {"PAYGATE_RPC_URL": "http://127.0.0.1:9/soroban", "PAYGATE_RPC_TIMEOUT": "1s"}
    code, doc, err = trace(world, "deposit", str(world.deposit), environ=environ)
    assert code == ExitCode.FAILED, (doc.get("verdict"), err)
    verdict = doc["verdict"]
    assert verdict["regime"] == "unreadable" and verdict["chain_readable"] is False and verdict["agree"] is False
    assert "could not be read" in verdict["explanation"] or "no read endpoint answered" in verdict["explanation"]
    # The database side is all there.
    assert kinds(doc, "db")[0] == "admitted" and kinds(doc, "chain") == []


def test_a_deposit_in_flight_then_landed_ahead_of_the_journal(world: World) -> None:
    user = world.chain.genesis["users"][2]
    entry, nonce, expiration = sign_deposit(world.chain.devnet, user["secret"], 3_000_000)
    pending = admit_deposit(world.db, user["public"], 3_000_000, entry, nonce, expiration, "trace-stuck")
    code, doc, _ = trace(world, "deposit", str(pending))
    assert code == ExitCode.OK and doc["verdict"]["regime"] == "in_flight", doc["verdict"]
    assert "not claimed" in doc["verdict"]["explanation"]
    assert world.chain.tick("funding", "--once").code in (0, 1)  # signed and sent; no ledger closes
    code, doc, _ = trace(world, "deposit", str(pending))
    assert code == ExitCode.OK and doc["verdict"]["regime"] == "in_flight", doc["verdict"]
    assert "with the user" in doc["verdict"]["where"]
    world.chain.devnet.close_ledger()  # it lands; the journal has not read the receipt yet
    code, doc, _ = trace(world, "deposit", str(pending))
    assert code == ExitCode.OK and doc["verdict"]["regime"] == "lagging", doc["verdict"]
    assert "the journal has not recorded it yet" in doc["verdict"]["explanation"]
    assert doc["verdict"]["where"].startswith("in the billing contract, not yet credited")


def test_a_charge_retention_archived_is_traced_from_the_archive(world: World) -> None:
    world.db.execute("UPDATE paygate.charges SET settled_at = settled_at - interval '40 days'")
    world.db.execute("UPDATE paygate.charge_batches SET closed_at = closed_at - interval '40 days'")
    moved = world.chain.tick("retention")
    assert moved.code == 0, moved.err
    assert world.db.execute("SELECT count(*) FROM paygate.charges").fetchone()[0] == 0
    code, doc, err = trace(world, "charge", str(world.charge))
    assert code == ExitCode.OK, (doc.get("verdict"), err)
    assert doc["charge"]["archived"] is True and "charge.archived" in kinds(doc, "db")
    assert doc["verdict"]["regime"] == "match" and "event.charge" in kinds(doc, "chain")
    account = world.chain.genesis["users"][0]["public"]
    code, doc, _ = trace(world, "account", account)
    assert code == ExitCode.OK, doc["verdict"]
    assert doc["sums"]["archived_settled_charges"] == CHARGE and doc["sums"]["settled_charges"] == CHARGE


def test_a_charge_batch_by_its_hash_and_an_account_behind_its_observer(world: World) -> None:
    """Two charges in one batch: in flight while the batch is unsent on chain, lagging once the chain
    debited them and the observer has not read those events yet, agreeing after it has."""
    account = world.chain.genesis["users"][0]["public"]
    first, _ = admit_charge(world.db, account, 11, "trace-batch-1")
    second, _ = admit_charge(world.db, account, 22, "trace-batch-2")
    assert world.chain.tick("settlement").code == 0
    code, doc, _ = trace(world, "account", account)
    assert code == ExitCode.OK and doc["verdict"]["regime"] == "in_flight", doc["verdict"]
    assert {(u["unit"], u["id"]) for u in doc["explaining_units"]} >= {("charge", first), ("charge", second)}
    world.chain.devnet.close_ledger()
    assert world.chain.tick("settlement").code == 0  # the batch's receipt; the observer has not run
    code, doc, _ = trace(world, "account", account)
    assert code == ExitCode.OK and doc["verdict"]["regime"] == "lagging", doc["verdict"]
    [inner] = {h for (h,) in world.db.execute("SELECT encode(x.inner_hash, 'hex') FROM paygate.charges c JOIN "
                                              "paygate.lineages x ON x.id = c.lineage_id WHERE c.id = ANY(%s)",
                                              ([first, second],))}
    code, doc, _ = trace(world, "tx", inner)
    assert code == ExitCode.OK, doc["verdict"]
    assert [(u["unit"]["id"], u["verdict"]["regime"]) for u in doc["units"]] == [(first, "lagging"),
                                                                                (second, "lagging")]
    assert "observer" in doc["verdict"]["explanation"]
    assert world.chain.tick("observer").code == 0
    assert world.db.execute("SELECT array_agg(status) FROM paygate.charges WHERE id = ANY(%s)",
                            ([first, second],)).fetchone()[0] == ["settled", "settled"]
    code, doc, _ = trace(world, "tx", inner)
    assert code == ExitCode.OK and doc["verdict"]["regime"] == "match" and doc["verdict"]["agree"] is True
