"""Charge admission (`paygate.admit_charge`): debit, charge, idempotency record and outbox event in
one transaction; replays; refusals with a clear reason and nothing recorded."""

from __future__ import annotations

import threading

import psycopg
import pytest

ACCOUNT = "GCQ2DINBUGQ2DINBUGQ2DINBUGQ2DINBUGQ2DINBUGQ2DINBUGQ2DJX7"  # valid StrKeys (admission checks them)
OTHER = "GCZLFMVSWKZLFMVSWKZLFMVSWKZLFMVSWKZLFMVSWKZLFMVSWKZLFF6T"


@pytest.fixture
def funded(db: psycopg.Connection) -> psycopg.Connection:
    db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 1000), (%s, 50)", (ACCOUNT, OTHER))
    db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES ('http://127.0.0.1:9/h', "
               "'0123456789abcdef0123')")
    return db


def admit(db: psycopg.Connection, account: str, amount: int, key: str, description: str | None = None) -> tuple:
    return db.execute("SELECT charge_row_id, charge_id, balance, replayed FROM paygate.admit_charge(%s, %s, %s, %s)",
                      (account, amount, key, description)).fetchone()


def balance(db: psycopg.Connection, account: str = ACCOUNT) -> int:
    return int(db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s", (account,)).fetchone()[0])


def test_admission_debits_inserts_and_records_in_one_go(funded: psycopg.Connection) -> None:
    row_id, charge_id, new_balance, replayed = admit(funded, ACCOUNT, 300, "k1", "api call")
    assert not replayed and new_balance == 700 and balance(funded) == 700
    assert isinstance(charge_id, bytes) and len(charge_id) == 32
    charge = funded.execute("SELECT status, amount, account, lineage_id, claimed_at, attempts FROM paygate.charges "
                            "WHERE id = %s", (row_id,)).fetchone()
    assert charge == ("authorized", 300, ACCOUNT, None, None, 0)
    key = funded.execute("SELECT response FROM paygate.idempotency_keys WHERE scope = 'charge' AND key = 'k1'"
                         ).fetchone()[0]
    assert key["charge_row_id"] == row_id and key["charge_id"] == bytes(charge_id).hex()
    events = funded.execute("SELECT event_type, payload FROM paygate.webhook_outbox").fetchall()
    assert [e[0] for e in events] == ["charge.authorized"] and events[0][1]["amount"] == "300"


def test_charge_ids_are_fresh_and_distinct(funded: psycopg.Connection) -> None:
    ids = {bytes(admit(funded, ACCOUNT, 1, f"k{i}")[1]) for i in range(50)}
    assert len(ids) == 50 and balance(funded) == 950


def test_same_key_same_request_returns_the_first_result(funded: psycopg.Connection) -> None:
    first = admit(funded, ACCOUNT, 300, "k1")
    second = admit(funded, ACCOUNT, 300, "k1")
    assert second[:2] == first[:2] and second[3] is True and second[2] == first[2]
    assert balance(funded) == 700  # debited once
    assert funded.execute("SELECT count(*) FROM paygate.charges").fetchone()[0] == 1


def test_same_key_different_request_is_refused(funded: psycopg.Connection) -> None:
    admit(funded, ACCOUNT, 300, "k1")
    with pytest.raises(psycopg.errors.UniqueViolation, match="used for a different request"):
        admit(funded, ACCOUNT, 301, "k1")
    with pytest.raises(psycopg.errors.UniqueViolation):
        admit(funded, OTHER, 300, "k1")
    assert balance(funded) == 700 and funded.execute("SELECT count(*) FROM paygate.charges").fetchone()[0] == 1


def test_insufficient_balance_is_refused_and_records_nothing(funded: psycopg.Connection) -> None:
    with pytest.raises(psycopg.Error, match=r"insufficient balance: account .* has 50, the charge needs 51") as info:
        admit(funded, OTHER, 51, "k-poor")
    assert info.value.sqlstate == "PG402"
    assert balance(funded, OTHER) == 50
    assert funded.execute("SELECT count(*) FROM paygate.charges").fetchone()[0] == 0
    assert funded.execute("SELECT count(*) FROM paygate.idempotency_keys").fetchone()[0] == 0
    assert funded.execute("SELECT count(*) FROM paygate.webhook_outbox").fetchone()[0] == 0
    # Unknown account: the same refusal (no balance at all), not a crash.
    with pytest.raises(psycopg.Error, match="has 0"):
        admit(funded, "GDB4HQ6DYPB4HQ6DYPB4HQ6DYPB4HQ6DYPB4HQ6DYPB4HQ6DYPB4H6AC", 1, "k-unknown")
    # After a top-up the same key goes through (the refusal recorded nothing).
    funded.execute("UPDATE paygate.accounts SET cached_balance = 100 WHERE address = %s", (OTHER,))
    assert admit(funded, OTHER, 51, "k-poor")[3] is False and balance(funded, OTHER) == 49


@pytest.mark.parametrize("kind", ["operator", "gas"])
def test_halts_refuse_admission_with_the_reason(funded: psycopg.Connection, kind: str) -> None:
    first = admit(funded, ACCOUNT, 10, "before-halt")
    funded.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES (%s, 'incident 42', 'test')", (kind,))
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=f"halted \\({kind}: incident 42\\)"):
        admit(funded, ACCOUNT, 10, "during-halt")
    assert balance(funded) == 990
    # A replay of a charge admitted before the halt still answers with its first result.
    assert admit(funded, ACCOUNT, 10, "before-halt")[:2] == first[:2]
    funded.execute("DELETE FROM paygate.halts")
    assert admit(funded, ACCOUNT, 10, "during-halt")[3] is False


@pytest.mark.parametrize("args, message", [
    (("not-an-address", 1, "k"), "not a Stellar address"),
    ((ACCOUNT, 0, "k"), "positive integer"),
    ((ACCOUNT, -5, "k"), "positive integer"),
    ((ACCOUNT, 1.5, "k"), "positive integer"),
    ((ACCOUNT, 1, ""), "idempotency key"),
])
def test_bad_arguments_are_refused(funded: psycopg.Connection, args: tuple, message: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        funded.execute("SELECT * FROM paygate.admit_charge(%s, %s::numeric, %s)", args)


def test_concurrent_admissions_with_one_key_make_one_charge(funded: psycopg.Connection, dsn: str) -> None:
    results: list[tuple] = []
    barrier = threading.Barrier(6)

    def worker() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            barrier.wait()
            results.append(admit(conn, ACCOUNT, 100, "same-key"))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 6 and len({bytes(r[1]) for r in results}) == 1
    assert sum(1 for r in results if not r[3]) == 1
    assert balance(funded) == 900


def test_concurrent_admissions_never_overdraw(funded: psycopg.Connection, dsn: str) -> None:
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            barrier.wait()
            try:
                admit(conn, OTHER, 10, f"race-{i}")
                outcomes.append("ok")
            except psycopg.Error as exc:
                outcomes.append(exc.sqlstate or "")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("ok") == 5 and outcomes.count("PG402") == 3
    assert balance(funded, OTHER) == 0


def test_subscription_fields_go_together(funded: psycopg.Connection) -> None:
    sql = "SELECT * FROM paygate.admit_charge(%s, %s, %s, NULL, %s, %s::timestamptz)"
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="go together"):
        funded.execute(sql, (ACCOUNT, 5, "sub-2", 7, None))
    assert balance(funded) == 1000
