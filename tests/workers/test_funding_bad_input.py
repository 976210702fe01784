"""Bad deposits: rejected at admission when the shape is wrong, quarantined at tick time (failed with
the reason, never retried, never blocking the batch) when only the chain-facing checks can tell,
`expired` when the authorisation ran out, `needs_human` when someone else spent its nonce."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.chain_env import (
    ChainEnv,
    admit_deposit,
    billing_balance,
    chain_environ,
    contract_events,
    sign_deposit,
)
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.funding import (
    AMOUNT,
    addr,
    admit,
    assert_invariants,
    flip_signature_byte,
    lineages_of,
    row_of,
    run_until_quiet,
    submit_directly,
)


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=3)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))


GOOD_ENTRY = "AAAAAQ=="  # shape-valid base64 (admission does not decode XDR)
USER = "GDNMGTYTS7HUVIKRA6N5CV54E7K2BIDZWKLL6PGJANDNIYFWUVKIZYUB"


def add_webhook(db: psycopg.Connection) -> None:
    """An enabled endpoint, so every emitted event lands in the outbox where the test can read it."""
    db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES ('http://127.0.0.1:9/', %s)",
               ("s" * 32,))


def events(db: psycopg.Connection, event_type: str) -> list[dict[str, Any]]:
    return [r[0] for r in db.execute("SELECT payload FROM paygate.webhook_outbox WHERE event_type = %s ORDER BY id",
                                     (event_type,)).fetchall()]


# -- admission: the SQL function refuses what is malformed on its face ---------------------------

@pytest.mark.parametrize(("args", "message"), [
    ((USER, AMOUNT, "not base64!", 1, 100, "k"), "auth_entry is not base64"),
    ((USER, AMOUNT, "AAAAAQ", 1, 100, "k"), "auth_entry is not base64"),  # bad padding/length
    ((USER, AMOUNT, "", 1, 100, "k"), "auth_entry is not base64"),
    (("GNOTANADDRESS", AMOUNT, GOOD_ENTRY, 1, 100, "k"), "is not a Stellar account address"),
    (("C" + USER[1:], AMOUNT, GOOD_ENTRY, 1, 100, "k"), "is not a Stellar account address"),
    ((USER, 0, GOOD_ENTRY, 1, 100, "k"), "amount must be a positive integer"),
    ((USER, -5, GOOD_ENTRY, 1, 100, "k"), "amount must be a positive integer"),
    ((USER, "1.5", GOOD_ENTRY, 1, 100, "k"), "amount must be a positive integer"),
    ((USER, 2**127, GOOD_ENTRY, 1, 100, "k"), "amount must be a positive integer"),
    ((USER, AMOUNT, GOOD_ENTRY, 1, 0, "k"), "expiration ledger must be positive"),
    ((USER, AMOUNT, GOOD_ENTRY, 1, 100, ""), "idempotency key must be"),
], ids=["not-base64", "bad-padding", "empty-entry", "bad-account", "contract-account", "zero-amount",
        "negative-amount", "fractional-amount", "amount-overflow", "zero-expiration", "empty-key"])
def test_admission_rejects_malformed_deposits(db: psycopg.Connection, args: tuple, message: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        db.execute("SELECT * FROM paygate.admit_deposit(%s, %s::numeric, %s, %s, %s, %s)", args)
    assert db.execute("SELECT count(*) FROM paygate.deposits").fetchone()[0] == 0


def test_admission_is_idempotent_and_refuses_a_reused_key(db: psycopg.Connection) -> None:
    first = admit_deposit(db, USER, AMOUNT, GOOD_ENTRY, 7, 100, "same-key")
    assert admit_deposit(db, USER, AMOUNT, GOOD_ENTRY, 7, 100, "same-key") == first
    with pytest.raises(psycopg.errors.UniqueViolation, match="used for a different request"):
        admit_deposit(db, USER, AMOUNT + 1, GOOD_ENTRY, 7, 100, "same-key")
    assert db.execute("SELECT count(*) FROM paygate.deposits").fetchone()[0] == 1


def test_the_same_authorisation_cannot_be_admitted_twice(db: psycopg.Connection) -> None:
    """Two requests with different idempotency keys carrying one authorisation (same account and
    nonce) would be two deposits for one transfer: the second is refused at admission."""
    admit_deposit(db, USER, AMOUNT, GOOD_ENTRY, 7, 100, "first")
    with pytest.raises(psycopg.errors.UniqueViolation):
        admit_deposit(db, USER, AMOUNT, GOOD_ENTRY, 7, 100, "second")
    assert db.execute("SELECT count(*) FROM paygate.deposits").fetchone()[0] == 1


# -- tick time: quarantined with the reason, never retried, never blocking the batch ---------------

def test_bad_authorisations_are_quarantined_without_blocking_the_batch(chain: ChainEnv, db: psycopg.Connection
                                                                       ) -> None:
    add_webhook(db)
    g = chain.genesis
    _, u1, u2 = g["users"]
    bad: dict[str, tuple[int, str]] = {}

    def admit_bad(name: str, account: str, amount: int, entry: str, nonce: int, expiration: int, reason: str) -> None:
        bad[name] = (admit_deposit(db, account, amount, entry, nonce, expiration, f"bad-{name}"), reason)

    entry, nonce, exp = sign_deposit(chain.devnet, u1["secret"], AMOUNT, contract=g["contracts"]["market"])
    admit_bad("wrong-contract", u1["public"], AMOUNT, entry, nonce, exp, "not the USDC contract")
    entry, nonce, exp = sign_deposit(chain.devnet, u1["secret"], AMOUNT)
    admit_bad("wrong-amount", u1["public"], AMOUNT * 2, entry, nonce, exp, f"is for amount {AMOUNT}")
    entry, nonce, exp = sign_deposit(chain.devnet, u1["secret"], AMOUNT, to=u2["public"])
    admit_bad("wrong-destination", u1["public"], AMOUNT, entry, nonce, exp, "not " + u1["public"][:8])
    entry, nonce, exp = sign_deposit(chain.devnet, u1["secret"], AMOUNT, passphrase="Test SDF Network ; September 2015")
    admit_bad("wrong-passphrase", u1["public"], AMOUNT, entry, nonce, exp, "signature does not verify")
    entry, nonce, exp = sign_deposit(chain.devnet, u2["secret"], AMOUNT)
    admit_bad("signed-by-another", u1["public"], AMOUNT, entry, nonce, exp, "not the depositing account")
    entry, nonce, exp = sign_deposit(chain.devnet, u1["secret"], AMOUNT)
    admit_bad("tampered-signature", u1["public"], AMOUNT, flip_signature_byte(entry), nonce, exp,
              "signature does not verify")
    admit_bad("undecodable", u1["public"], AMOUNT, base64.b64encode(b"\x00\x01garbage!").decode(), 5, 10_000,
              "not a SorobanAuthorizationEntry")
    entry, nonce, exp = sign_deposit(chain.devnet, u1["secret"], AMOUNT)
    admit_bad("nonce-mismatch", u1["public"], AMOUNT, entry, nonce + 1, exp, "differ from the admitted row")
    good = admit(chain, db, user=0)  # admitted last: claimed after every bad row in the same batch

    result = chain.tick("funding", "--once")
    assert result.code == 0, result.err  # quarantined rows are not "failed, retry later"
    for name, (pending_id, reason) in bad.items():
        row = row_of(db, pending_id)
        assert row["status"] == "failed", (name, row)
        assert row["reason"].startswith("bad authorisation:") and reason in row["reason"], (name, row["reason"])
        assert row["attempts"] == 1 and row["lease_token"] is None and row["deposit_lineage_id"] is None, name
    # the good deposit in the same batch went ahead in that very tick
    assert row_of(db, good)["deposit_lineage_id"] is not None
    failed_events = {e["deposit_id"]: e["reason"] for e in events(db, "deposit.failed")}
    assert set(failed_events) == {pending_id for pending_id, _ in bad.values()}

    run_until_quiet(chain, db)
    assert_invariants(chain, db, [good])
    for name, (pending_id, _) in bad.items():
        row = row_of(db, pending_id)
        assert row["status"] == "failed" and row["attempts"] == 1, name  # never claimed again
    assert {x["entitlement"].split(":")[1] for x in lineages_of(db)} == {str(good)}
    assert billing_balance(chain, u1["public"]) == 0
    assert db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s",
                      (u1["public"],)).fetchone()[0] == 0
    assert all(addr(t["topics"][1]) != u1["public"] for t in contract_events(chain, "transfer"))


def test_expired_authorisation_ends_expired(chain: ChainEnv, db: psycopg.Connection) -> None:
    add_webhook(db)
    expired = admit(chain, db, user=0, valid_ledgers=2)
    chain.devnet.close_ledger(3)
    live = admit(chain, db, user=1)
    result = chain.tick("funding", "--once")
    assert result.code == 0, result.err
    row = row_of(db, expired)
    assert row["status"] == "expired" and "expired at ledger" in row["reason"]
    assert row["deposit_lineage_id"] is None  # nothing was ever signed for it
    assert [e["deposit_id"] for e in events(db, "deposit.expired")] == [expired]
    run_until_quiet(chain, db)
    assert row_of(db, expired)["status"] == "expired" and row_of(db, expired)["attempts"] == 1
    assert_invariants(chain, db, [live])


def test_nonce_spent_by_someone_else_needs_a_human(chain: ChainEnv, db: psycopg.Connection) -> None:
    """The user's authorisation is submitted straight to the network by someone who is not this
    gateway: its nonce is consumed and no lineage of ours holds a hash for it. We never invent a
    deposit hash: the row stops as needs_human with the evidence, the tick exits 3."""
    add_webhook(db)
    g = chain.genesis
    user = g["users"][0]
    entry, nonce, expiration = sign_deposit(chain.devnet, user["secret"], AMOUNT)
    submit_directly(chain, entry, user["public"], AMOUNT)
    spent = admit_deposit(db, user["public"], AMOUNT, entry, nonce, expiration, "spent-elsewhere")
    other = admit(chain, db, user=1)
    result = chain.tick("funding", "--once")
    assert result.code == 3, (result.code, result.err)
    row = row_of(db, spent)
    assert row["status"] == "needs_human"
    assert f"nonce {nonce}" in row["reason"] and user["public"] in row["reason"] and "consumed" in row["reason"]
    assert row["deposit_lineage_id"] is None and row["deposit_tx"] is None
    assert [e["deposit_id"] for e in events(db, "deposit.needs_human")] == [spent]
    assert "funding.nonce_consumed_elsewhere" in result.err
    # the other deposit of the batch is unaffected; the stopped row is never picked up again
    run_until_quiet(chain, db, allowed=(0, 1))
    assert row_of(db, spent)["status"] == "needs_human" and row_of(db, spent)["attempts"] == 1
    assert db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s",
                      (user["public"],)).fetchone()[0] == 0
    assert contract_events(chain, "credit") and all(addr(c["topics"][1]) != user["public"]
                                                   for c in contract_events(chain, "credit"))
    assert row_of(db, other)["status"] == "settled"


def test_a_deposit_the_chain_refuses_in_simulation_fails_once_and_frees_its_lane(chain: ChainEnv,
                                                                                 db: psycopg.Connection) -> None:
    """A well-formed authorisation for more USDC than the user holds: simulation traps, the row ends
    failed with the reason, its allocated lineage is abandoned (the lane is free again at once)."""
    add_webhook(db)
    too_much = admit(chain, db, user=1, amount=10**15)
    good = admit(chain, db, user=0)
    result = chain.tick("funding", "--once")
    assert result.code == 0, result.err
    row = row_of(db, too_much)
    assert row["status"] == "failed" and "simulation of transfer failed" in row["reason"], row
    assert lineages_of(db)[0]["state"] == "abandoned" and lineages_of(db)[0]["entitlement"].startswith(
        f"deposit:{too_much}:")
    assert [e["deposit_id"] for e in events(db, "deposit.failed")] == [too_much]
    run_until_quiet(chain, db)
    assert row_of(db, too_much)["attempts"] == 1
    assert_invariants(chain, db, [good])


def test_authorisation_expiring_while_its_lineage_is_in_flight_ends_expired_after_the_proof(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    """The deposit is accepted but never included (dropped), and the user's authorisation runs out
    meanwhile. The row must not end until the lineage is proven dead; the transaction carries the
    authorisation's expiration ledger as its ledger bound, so the proof comes as soon as a
    ledger past it closes, without waiting for maxTime. Then it ends `expired` and no second
    transaction is ever built."""
    chain.devnet.set_fault("drop_next")
    pending_id = admit(chain, db, user=0, valid_ledgers=3)
    seen_pending_after_expiry = False
    for _ in range(20):
        result = chain.tick("funding", "--once")
        assert result.code == 0, result.err
        row = row_of(db, pending_id)
        if row["status"] != "pending":
            break
        live = [x for x in lineages_of(db) if x["state"] in ("signed", "sent")]
        if chain.devnet.latest_ledger() >= row["auth_expiration_ledger"] and live:
            seen_pending_after_expiry = True  # expired authorisation, but its lineage not yet proven dead
        chain.devnet.close_ledger()
    row = row_of(db, pending_id)
    assert row["status"] == "expired" and "expired at ledger" in row["reason"], row
    assert seen_pending_after_expiry
    [lineage] = lineages_of(db)
    assert (lineage["purpose"], lineage["state"]) == ("deposit", "expired")
    assert lineage["max_ledger"] == row["auth_expiration_ledger"]
    assert "maxLedger" in lineage["resolution"]  # proven by ledger, long before its maxTime
    assert all(addr(t["topics"][1]) != chain.genesis["users"][0]["public"] for t in contract_events(chain, "transfer"))
