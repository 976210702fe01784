"""The engine's group commit (send_prepared): a tick's envelopes are anchored in ONE statement, and
each unit's fate stays its own — a lost lease or a row part that does not follow anchors nothing of
that unit and takes nothing from the others. Only the anchoring half is exercised here (no
broadcast): the chain is not involved until every anchor has committed."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from stellar_sdk import Keypair

from paygate_cli.context import TickContext
from paygate_cli.journal.engine import Engine, LeaseLost, Prepared

# A stand-in row table for the job's lease: the engine sees only SQL and parameters (its Job).
ROWS_DDL = ("CREATE TABLE IF NOT EXISTS public.rows "
            "(id int PRIMARY KEY, token uuid, lineage_id bigint, tx bytea, follow bool DEFAULT true)")
HOLD_SQL = "SELECT 1 FROM public.rows WHERE id = %(row_id)s AND token = %(row_token)s FOR UPDATE"
HOLD_MANY_SQL = """
SELECT r.id AS row_id FROM public.rows r JOIN req ON r.id = req.row_id WHERE r.token = req.row_token FOR UPDATE OF r
"""
# The row records the anchored envelope's hash (as the relay's install does); `follow` false makes it
# match nothing although the lease held: a row part that does not follow its lineage's.
INSTALL_SQL = """
UPDATE public.rows r SET tx = %(x_inner_hash)s FROM anchored
WHERE r.id = %(row_id)s AND r.lineage_id = anchored.id AND r.follow RETURNING 1
"""
INSTALL_MANY_SQL = """
UPDATE public.rows r SET tx = anchored.inner_hash FROM anchored JOIN req ON req.lineage_id = anchored.id
WHERE r.id = req.row_id AND r.lineage_id = anchored.id AND r.follow RETURNING 1
"""
MINE = uuid.UUID(int=1)


@dataclass
class RowJob:
    row_id: int
    token: uuid.UUID
    crash = "test"
    purpose = "deposit"
    max_ledger = None
    hold_sql = HOLD_SQL
    attach_sql = "SELECT 1"  # never allocated through the engine here
    install_sql = INSTALL_SQL
    hold_many_sql = HOLD_MANY_SQL
    attach_many_sql = "SELECT 1"
    install_many_sql = INSTALL_MANY_SQL

    def params(self) -> dict[str, Any]:
        return {"row_id": self.row_id, "row_token": self.token}

    def row_key(self) -> tuple[int, Any]:
        return self.row_id, self.token


@dataclass
class Signed:
    """The fields of a SignedTransaction the anchor writes."""

    inner_hash: bytes
    outer_hash: bytes
    max_time: int = 100
    max_ledger: int | None = None
    bid_rate: int = 200
    fee_ops: int = 2
    resource_fee: int = 0


def _units(db: psycopg.Connection, n: int) -> list[Prepared]:
    db.execute(ROWS_DDL)
    units = []
    for i in range(1, n + 1):
        lane = Keypair.random().public_key
        db.execute("INSERT INTO paygate.lanes (address) VALUES (%s)", (lane,))
        lineage_id = int(db.execute("INSERT INTO paygate.lineages (purpose, entitlement, lane) "
                                    "VALUES ('deposit', %s, %s) RETURNING id", (f"e:{i}", lane)).fetchone()[0])
        db.execute("INSERT INTO public.rows (id, token, lineage_id) VALUES (%s, %s, %s)", (i, MINE, lineage_id))
        units.append(Prepared(RowJob(i, MINE), lineage_id, lane, Signed(bytes([i]) * 32, bytes([i + 100]) * 32),  # type: ignore[arg-type]
                              seq=10 + i, key_id="k1", ciphertext=b"sealed", signed_at_ledger=3, cap_rate=100_000))
    return units


def _engine(db: psycopg.Connection) -> Engine:
    ctx = TickContext(conn=db, settings=None, worker="test", instance_id="t", slot=0, batch=8,  # type: ignore[arg-type]
                      log=logging.getLogger("test"))
    return Engine(ctx, chain=None, signer=None, keyring=None)  # type: ignore[arg-type]


def _states(db: psycopg.Connection) -> list[tuple[str, bytes | None, int | None]]:
    return [(state, tx if tx is None else bytes(tx), xmin) for state, tx, xmin in db.execute(
        "SELECT x.state, r.tx, CASE WHEN x.state = 'signed' THEN x.xmin::text::bigint END "
        "FROM public.rows r JOIN paygate.lineages x ON x.id = r.lineage_id ORDER BY r.id")]


def test_a_ticks_envelopes_are_anchored_in_one_transaction(db: psycopg.Connection) -> None:
    units = _units(db, 3)
    assert _engine(db)._anchor_batch(units) == [None, None, None]
    states = _states(db)
    assert [(s, tx) for s, tx, _ in states] == [("signed", bytes([i]) * 32) for i in (1, 2, 3)]
    assert len({xmin for _, _, xmin in states}) == 1  # one statement wrote all three: one commit
    assert db.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_lost_lease_in_the_batch_anchors_nothing_of_that_unit_and_keeps_the_others(db: psycopg.Connection) -> None:
    units = _units(db, 3)
    db.execute("UPDATE public.rows SET token = gen_random_uuid() WHERE id = 2")  # another worker took row 2
    verdicts = _engine(db)._anchor_batch(units)
    assert verdicts[0] is None and verdicts[2] is None
    assert isinstance(verdicts[1], LeaseLost)
    states = _states(db)
    assert [(s, tx) for s, tx, _ in states] == [("signed", b"\1" * 32), ("allocated", None), ("signed", b"\3" * 32)]
    assert states[0][2] == states[2][2]  # still one statement for the two that held


def test_a_row_part_that_does_not_follow_falls_back_to_one_transaction_per_unit(db: psycopg.Connection) -> None:
    units = _units(db, 3)
    db.execute("UPDATE public.rows SET follow = false WHERE id = 2")  # require() fails for unit 2 alone
    verdicts = _engine(db)._anchor_batch(units)
    assert verdicts[0] is None and verdicts[2] is None
    assert isinstance(verdicts[1], LeaseLost) and "did not take its envelope" in str(verdicts[1])
    states = _states(db)
    # Unit 2: nothing of its envelope written; the others anchored, each in its own transaction now
    # (the shared one rolled back whole before anything was committed).
    assert [(s, tx) for s, tx, _ in states] == [("signed", b"\1" * 32), ("allocated", None), ("signed", b"\3" * 32)]
    assert states[0][2] != states[2][2]
    assert db.execute("SELECT envelope FROM paygate.lineages WHERE id = %s", (units[1].lineage_id,)).fetchone() == (
        None,)
