"""queue_status_guard: a deposit, relay or bot job in a terminal status never changes status by a
plain statement; a dead one goes back to its start status only in a transaction that declared it is
replaying (ops/replay.py), and a final one (its effect on chain) never."""

from __future__ import annotations

import psycopg
import pytest

G = "G" + "A" * 55
C = "C" + "A" * 55

INSERTS = {
    "deposits": ("INSERT INTO paygate.deposits (account, amount, auth_entry, auth_nonce, auth_expiration_ledger, "
                 "idempotency_key, status, reason, settled_at) VALUES (%(g)s, 1, 'AAAA', %(n)s, 10, %(key)s, "
                 "%(status)s, 'r', CASE WHEN %(status)s = 'settled' THEN now() END) RETURNING id"),
    "relays": ("INSERT INTO paygate.relays (account, contract, function, args_xdr, auth_entries, auth_nonces, "
               "auth_expiration_ledger, max_fee, idempotency_key, status, reason, finished_at, fee_charged, "
               "tx_hash) VALUES (%(g)s, %(c)s, 'f', 'AAAAEAAAAAE=', '{AAAA}', '{1}', 10, 100, %(key)s, "
               "%(status)s, 'r', now(), 1, decode(repeat('00', 32), 'hex')) RETURNING id"),
    "bot_jobs": ("INSERT INTO paygate.bot_jobs (job_key, request_hash, contract, function, args_xdr, status, reason, "
                 "finished_at) VALUES (%(key)s, '\\x00', %(c)s, 'f', 'AAAAEAAAAAE=', %(status)s, 'r', now()) "
                 "RETURNING id"),
}
START = {"deposits": "pending", "relays": "queued", "bot_jobs": "queued"}
DEAD = {"deposits": ("failed", "expired", "needs_human"), "relays": ("expired", "rejected", "needs_human"),
        "bot_jobs": ("dead", "needs_human")}
FINAL = {"deposits": ("settled",), "relays": ("applied", "failed"), "bot_jobs": ("applied", "failed")}
# What a replay statement resets besides the status (the table's CHECKs want it).
BACK = {"deposits": "status = %(to)s, reason = NULL", "relays": "status = %(to)s, reason = NULL, finished_at = NULL",
        "bot_jobs": "status = %(to)s, reason = NULL, finished_at = NULL"}


def _row(db: psycopg.Connection, table: str, status: str) -> int:
    if table == "deposits":
        db.execute("INSERT INTO paygate.accounts (address) VALUES (%s) ON CONFLICT DO NOTHING", (G,))
    count = db.execute(f"SELECT count(*) FROM paygate.{table}").fetchone()[0]
    return db.execute(INSERTS[table], {"g": G, "c": C, "n": count, "key": f"k{count}", "status": status}).fetchone()[0]


def _move(db: psycopg.Connection, table: str, row: int, to: str, *, replaying: bool) -> None:
    with db.transaction():
        if replaying:
            db.execute("SELECT set_config('paygate.replaying', 'on', true)")
        db.execute(f"UPDATE paygate.{table} SET {BACK[table]} WHERE id = %(id)s", {"to": to, "id": row})


def _status(db: psycopg.Connection, table: str, row: int) -> str:
    return db.execute(f"SELECT status FROM paygate.{table} WHERE id = %s", (row,)).fetchone()[0]


@pytest.mark.parametrize("table", sorted(START))
def test_a_dead_row_moves_back_only_by_replay(db: psycopg.Connection, table: str) -> None:
    for dead in DEAD[table]:
        row = _row(db, table, dead)
        with pytest.raises(psycopg.errors.CheckViolation, match=f"status {dead} is terminal; only replay"):
            _move(db, table, row, START[table], replaying=False)
        assert _status(db, table, row) == dead
        _move(db, table, row, START[table], replaying=True)
        assert _status(db, table, row) == START[table]
    # Not to another terminal status, even when replaying; and the setting ends with its transaction.
    other = _row(db, table, DEAD[table][0])
    with pytest.raises(psycopg.errors.CheckViolation, match="only replay moves it"):
        _move(db, table, other, FINAL[table][0], replaying=True)
    assert db.execute("SELECT coalesce(current_setting('paygate.replaying', true), '')").fetchone()[0] == ""


@pytest.mark.parametrize("table", sorted(START))
def test_a_final_row_never_changes_status(db: psycopg.Connection, table: str) -> None:
    for final in FINAL[table]:
        row = _row(db, table, final)
        for replaying in (False, True):
            with pytest.raises(psycopg.errors.CheckViolation, match=f"status {final} is final"):
                _move(db, table, row, START[table], replaying=replaying)
        assert _status(db, table, row) == final
        # Columns other than the status are not the guard's business.
        db.execute(f"UPDATE paygate.{table} SET updated_at = now() WHERE id = %s", (row,))


@pytest.mark.parametrize("table", sorted(START))
def test_rows_leave_the_start_status_freely(db: psycopg.Connection, table: str) -> None:
    row = _row(db, table, DEAD[table][0])
    _move(db, table, row, START[table], replaying=True)
    db.execute(f"UPDATE paygate.{table} SET status = %s, reason = 'r', "
               + ("finished_at = now() " if table != "deposits" else "updated_at = now() ") + "WHERE id = %s",
               (DEAD[table][-1], row))
    assert _status(db, table, row) == DEAD[table][-1]
