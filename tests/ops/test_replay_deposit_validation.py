"""`replay deposits` refuses, per row and with the reason, a deposit whose authorisation fails
funding's own validation (bad signature, amount, contract, destination): the same call would fail
again. The check runs with today's configuration, so a deposit quarantined under a wrong billing
contract id is replayable once the configuration is put right. `--all-dead` names what it takes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.chain_env import ChainEnv, admit_deposit, chain_environ, sign_deposit
from tests.support.cli import run_cli, run_proc
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.funding import flip_signature_byte

AMOUNT = 2_000_000


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=2)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))


def row(db: psycopg.Connection, pending_id: int) -> tuple[str, str]:
    return db.execute("SELECT status, reason FROM paygate.deposits WHERE id = %s", (pending_id,)).fetchone()


def test_replay_refuses_deposits_that_failed_validation_and_would_fail_again(chain: ChainEnv,
                                                                            db: psycopg.Connection) -> None:
    g = chain.genesis
    u0, u1 = g["users"][0], g["users"][1]
    entry, nonce, exp = sign_deposit(chain.devnet, u0["secret"], AMOUNT)
    wrong_amount = admit_deposit(db, u0["public"], AMOUNT * 2, entry, nonce, exp, "wrong-amount")
    entry, nonce, exp = sign_deposit(chain.devnet, u0["secret"], AMOUNT)
    tampered = admit_deposit(db, u0["public"], AMOUNT, flip_signature_byte(entry), nonce, exp, "tampered")
    entry, nonce, exp = sign_deposit(chain.devnet, u0["secret"], AMOUNT, contract=g["contracts"]["market"])
    wrong_contract = admit_deposit(db, u0["public"], AMOUNT, entry, nonce, exp, "wrong-contract")
    entry, nonce, exp = sign_deposit(chain.devnet, u0["secret"], AMOUNT, to=u1["public"])
    wrong_destination = admit_deposit(db, u0["public"], AMOUNT, entry, nonce, exp, "wrong-destination")
    assert chain.tick("funding", "--once").code == 0
    bad = {wrong_amount: "is for amount", tampered: "signature does not verify",
           wrong_contract: "not the USDC contract", wrong_destination: "not " + u0["public"]}
    for pending_id in bad:
        status, reason = row(db, pending_id)
        assert status == "failed" and reason.startswith("bad authorisation:"), (pending_id, reason)

    # A good authorisation quarantined because the operator had the wrong billing contract configured.
    entry, nonce, exp = sign_deposit(chain.devnet, u1["secret"], AMOUNT)
    misconfigured = admit_deposit(db, u1["public"], AMOUNT, entry, nonce, exp, "misconfigured")
    assert chain.tick("funding", "--once", PAYGATE_BILLING_CONTRACT=g["contracts"]["market"]).code == 0
    assert row(db, misconfigured)[0] == "failed"

    dry = run_cli("replay", "deposits", "--all-dead", "--dry-run", "--json", environ=chain.environ)
    assert dry.code == 1, dry.err
    document = json.loads(dry.out)["replay"]
    assert document["all_dead_statuses"] == ["failed", "expired", "needs_human"]
    outcomes = {r["id"]: r for r in document["rows"]}
    for pending_id, detail in bad.items():
        assert outcomes[pending_id]["outcome"] == "refused"
        reason = outcomes[pending_id]["reason"]
        assert reason.startswith("failed validation (bad authorisation: ") and detail in reason, reason
        assert reason.endswith("the same call would fail again")
    assert outcomes[misconfigured]["outcome"] == "would_replay"  # today's configuration accepts it

    human = run_proc("replay", "deposits", "--all-dead", "--yes", environ=chain.environ)
    assert human.code == 1, human.err
    assert "replay deposits --all-dead (failed, expired, needs_human rows): 4 refused, 1 replayed" in human.out
    assert [row(db, pending_id)[0] for pending_id in bad] == ["failed"] * 4
    assert row(db, misconfigured)[0] == "pending"
    audited = db.execute("SELECT target FROM paygate.audit_log WHERE action = 'replay.deposits'").fetchall()
    assert audited == [(f"deposits:{misconfigured}",)]
