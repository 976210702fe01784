"""Relay and bot-job admission (`paygate.admit_relay`, `paygate.admit_bot_job`): shape checks SQL
can make on the XDR, the allow-list as configuration, idempotency, the fee reservation against the
budget in the same transaction, and refusal while a halt is set."""

from __future__ import annotations

import threading

import psycopg
import pytest
from stellar_sdk import Keypair, xdr

from tests.support.relay_admission import (
    MARKET,
    OTHER_CONTRACT,
    admit,
    args_xdr,
    auth_entry,
    source_account_entry,
)
from tests.support.relay_admission import allowed as allowed


def totals(db: psycopg.Connection) -> tuple[int, int, int]:
    return db.execute("SELECT reserved, settled, released FROM paygate.relay_fee_totals").fetchone()


def test_admission_records_relay_reservation_totals_and_event(allowed: psycopg.Connection) -> None:
    entry = auth_entry(expiration=777, nonce=42)
    relay_id, reserved, replayed = admit(allowed, "r1", entries=[entry], max_fee=2_000_000)
    assert (reserved, replayed) == (2_000_000, False)
    row = allowed.execute("SELECT status, auth_nonces, auth_expiration_ledger, max_fee FROM paygate.relays "
                          "WHERE id = %s", (relay_id,)).fetchone()
    assert row == ("queued", [42], 777, 2_000_000)
    assert allowed.execute("SELECT status, amount FROM paygate.fee_reservations WHERE relay_id = %s",
                           (relay_id,)).fetchone() == ("reserved", 2_000_000)
    assert totals(allowed) == (2_000_000, 0, 0)
    events = allowed.execute("SELECT event_type, payload FROM paygate.webhook_outbox").fetchall()
    assert [e[0] for e in events] == ["relay.queued"] and events[0][1]["relay_id"] == relay_id


# stellar-rpc records legacy ADDRESS (v1) credentials unless asked for ADDRESS_V2 (`useUpgradedAuth`,
# cmd/stellar-rpc/internal/methods/simulate_transaction.go), so wallets hand in both. The two arms
# share one SorobanAddressCredentials layout; the SQL must read nonce and expiration from either.
@pytest.mark.parametrize("upgraded", [False, True], ids=["ADDRESS", "ADDRESS_V2"])
def test_either_credential_version_is_admitted_with_its_nonce_and_expiration(
        allowed: psycopg.Connection, upgraded: bool) -> None:
    entries = [auth_entry(expiration=901, nonce=-(2**63), upgraded=upgraded),
               auth_entry(expiration=2**32 - 1, nonce=2**63 - 1, upgraded=upgraded)]
    ctype = xdr.SorobanCredentialsType
    assert {xdr.SorobanAuthorizationEntry.from_xdr(e).credentials.type for e in entries} == {
        ctype.SOROBAN_CREDENTIALS_ADDRESS_V2 if upgraded else ctype.SOROBAN_CREDENTIALS_ADDRESS}
    assert [allowed.execute("SELECT nonce, expiration_ledger FROM paygate.relay_auth_shape(%s)", (e,)).fetchone()
            for e in entries] == [(-(2**63), 901), (2**63 - 1, 2**32 - 1)]
    relay_id, _, replayed = admit(allowed, "r1", entries=entries)
    assert not replayed
    assert allowed.execute("SELECT auth_entries, auth_nonces, auth_expiration_ledger FROM paygate.relays "
                           "WHERE id = %s", (relay_id,)).fetchone() == (entries, [-(2**63), 2**63 - 1], 901)


def test_expiration_is_the_earliest_of_the_entries(allowed: psycopg.Connection) -> None:
    relay_id, _, _ = admit(allowed, "r1", entries=[auth_entry(900, 1), auth_entry(300, 2)])
    assert allowed.execute("SELECT auth_nonces, auth_expiration_ledger FROM paygate.relays WHERE id = %s",
                           (relay_id,)).fetchone() == ([1, 2], 300)


def test_same_key_same_request_replays_and_reserves_once(allowed: psycopg.Connection) -> None:
    entry = auth_entry()
    first = admit(allowed, "r1", entries=[entry])
    second = admit(allowed, "r1", entries=[entry])
    assert second[:2] == first[:2] and second[2] is True
    assert totals(allowed) == (1_000_000, 0, 0)
    assert allowed.execute("SELECT count(*) FROM paygate.fee_reservations").fetchone()[0] == 1


def test_same_key_different_request_is_refused(allowed: psycopg.Connection) -> None:
    admit(allowed, "r1")
    with pytest.raises(psycopg.errors.UniqueViolation, match="different request"):
        admit(allowed, "r1", max_fee=5)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"entries": ["not base64!"]}, "not base64 XDR"),
    ({"entries": ["AAAA"]}, "too short"),
    ({"entries": [source_account_entry()]}, "SOURCE_ACCOUNT"),
    ({"args": xdr.SCVal(xdr.SCValType.SCV_U32, u32=xdr.Uint32(1)).to_xdr()}, "SCVal vector"),
    ({"max_fee": 0}, "max_fee"),
    ({"max_fee": 10**12}, "above the cap"),
    ({"contract": "G" + "A" * 55}, "not a contract address"),
])
def test_malformed_requests_are_refused_with_the_reason_and_nothing_recorded(
        allowed: psycopg.Connection, kwargs: dict, message: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        admit(allowed, "bad", **kwargs)
    assert allowed.execute("SELECT count(*) FROM paygate.relays").fetchone()[0] == 0
    assert totals(allowed) == (0, 0, 0)


def test_function_not_on_the_allow_list_is_refused(allowed: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="allow-list"):
        admit(allowed, "r1", function="withdraw_all")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="allow-list"):
        admit(allowed, "r2", contract=OTHER_CONTRACT)
    allowed.execute("UPDATE paygate.relay_allowlist SET enabled = false WHERE function = 'buy'")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        admit(allowed, "r3")
    assert totals(allowed) == (0, 0, 0)


@pytest.mark.parametrize("kind", ["operator", "gas"])
def test_refused_while_halted_with_the_reason(allowed: psycopg.Connection, kind: str) -> None:
    allowed.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES (%s, 'fee account low', 'gas')", (kind,))
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=f"halted .*{kind}: fee account low"):
        admit(allowed, "r1")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="halted"):
        allowed.execute("SELECT * FROM paygate.admit_bot_job('j1', %s, 'close_expired', %s)", (MARKET, args_xdr()))
    assert totals(allowed) == (0, 0, 0)


def test_fee_budget_is_enforced_under_concurrency(allowed: psycopg.Connection, dsn: str) -> None:
    allowed.execute("UPDATE paygate.relay_config SET fee_budget = 10000000")  # room for exactly 10
    admitted: list[int] = []
    refused: list[str] = []

    def worker(n: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(4):
                try:
                    admitted.append(admit(conn, f"k{n}-{i}")[0])
                except psycopg.Error as exc:
                    assert exc.sqlstate == "PG402", exc
                    refused.append(str(exc))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 10 and len(refused) == 6 and "fee budget exhausted" in refused[0]
    assert totals(allowed) == (10_000_000, 0, 0)


def test_settle_and_release_close_a_reservation_exactly_once(allowed: psycopg.Connection) -> None:
    a, _, _ = admit(allowed, "r1", max_fee=1_000_000)
    b, _, _ = admit(allowed, "r2", max_fee=3_000_000)
    allowed.execute("INSERT INTO paygate.lanes (address) VALUES (%s)", (Keypair.random().public_key,))
    lane = allowed.execute("SELECT address FROM paygate.lanes").fetchone()[0]
    lineage = allowed.execute("INSERT INTO paygate.lineages (purpose, entitlement, lane) VALUES "
                              "('relay', 'relay:1', %s) RETURNING id", (lane,)).fetchone()[0]
    settle = "SELECT paygate.settle_relay_fee(%s, %s, %s, %s)"
    release = "SELECT paygate.release_relay_fee(%s, %s)"
    assert allowed.execute(settle, (a, lineage, 12_345, b"\x01" * 32)).fetchone()[0] is True
    assert allowed.execute(settle, (a, lineage, 12_345, b"\x01" * 32)).fetchone()[0] is False  # twice: no effect
    assert allowed.execute(release, (a, "late")).fetchone()[0] is False  # both: no effect
    assert allowed.execute(release, (b, "expired")).fetchone()[0] is True
    assert allowed.execute(release, (b, "expired")).fetchone()[0] is False
    assert totals(allowed) == (0, 12_345, 3_000_000)
    # Settled from the chain's receipt alone (a restore lost the lineage): the transaction names it.
    c, _, _ = admit(allowed, "r3", max_fee=2_000_000)
    assert allowed.execute(settle, (c, None, 7_000, b"\x02" * 32)).fetchone()[0] is True
    assert totals(allowed) == (0, 19_345, 3_000_000)
    # A settlement names its receipt one way or the other; neither is refused.
    d, _, _ = admit(allowed, "r4", max_fee=2_000_000)
    with pytest.raises(psycopg.errors.CheckViolation, match="settled_receipt"):
        allowed.execute(settle, (d, None, 7_000, None))
    with pytest.raises(psycopg.errors.CheckViolation, match="closed"):
        allowed.execute("UPDATE paygate.fee_reservations SET status = 'released', reason = 'x' WHERE relay_id = %s",
                        (a,))


def test_bot_jobs_dedup_per_job_key(allowed: psycopg.Connection) -> None:
    sql = "SELECT bot_job_id, replayed FROM paygate.admit_bot_job(%s, %s, %s, %s)"
    first = allowed.execute(sql, ("close:1", MARKET, "close_expired", args_xdr())).fetchone()
    assert first[1] is False
    assert allowed.execute(sql, ("close:1", MARKET, "close_expired", args_xdr())).fetchone() == (first[0], True)
    with pytest.raises(psycopg.errors.UniqueViolation, match="different call"):
        allowed.execute(sql, ("close:1", MARKET, "close_expired", args_xdr(price=6)))
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="allow-list"):
        allowed.execute(sql, ("close:2", MARKET, "drain", args_xdr()))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="SCVal vector"):
        allowed.execute(sql, ("close:3", MARKET, "close_expired", "AAAAAQ=="))
    assert allowed.execute("SELECT count(*) FROM paygate.bot_jobs").fetchone()[0] == 1


def test_bot_jobs_and_relays_each_have_their_own_allow_list(allowed: psycopg.Connection) -> None:
    # market.buy is relayed with a user's signature: that does not make it callable with none.
    sql = "SELECT bot_job_id FROM paygate.admit_bot_job(%s, %s, %s, %s)"
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="buy is not on the bot-job allow-list"):
        allowed.execute(sql, ("buy:lane", MARKET, "buy", args_xdr()))
    # ...and a permissionless function is not relayable for being on the bot-job list.
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="relay allow-list"):
        admit(allowed, "r1", function="close_expired")
    allowed.execute("UPDATE paygate.bot_job_allowlist SET enabled = false WHERE function = 'close_expired'")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="bot-job allow-list"):
        allowed.execute(sql, ("close:off", MARKET, "close_expired", args_xdr()))
    assert allowed.execute("SELECT count(*) FROM paygate.bot_jobs").fetchone()[0] == 0
    assert allowed.execute("SELECT count(*) FROM paygate.relays").fetchone()[0] == 0
