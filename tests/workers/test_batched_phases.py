"""A tick's rows share one statement per phase: the lanes for every row ready for a new lineage
(Engine.allocate_many) and the receipts of every lineage it resolved (record_receipts, through
Engine.drive_all). Each row's fate stays its own: a lost lease, no lane left or a lost CAS touches
that row alone, and a row part that does not follow its lineage's falls back to one statement per
row. Real Postgres; the job's rows are a stand-in table (the engine sees only SQL and parameters),
and no chain is involved (allocation and recording are database-only)."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import psycopg
from stellar_sdk import Keypair

from paygate_cli.context import TickContext
from paygate_cli.journal.engine import Allocation, Engine, LeaseLost
from paygate_cli.journal.lineage import load
from paygate_cli.journal.resolve import Receipt, record_receipts
from paygate_cli.settings import load_settings

ROWS_DDL = ("CREATE TABLE public.alloc_rows "
            "(id int PRIMARY KEY, token uuid, lineage_id bigint, follow bool DEFAULT true)")
HOLD_MANY_SQL = """
SELECT r.id AS row_id FROM public.alloc_rows r JOIN req ON r.id = req.row_id
WHERE r.token = req.row_token FOR UPDATE OF r
"""
# `follow` false: the row matches nothing although its lease held (a row part that does not follow).
ATTACH_MANY_SQL = """
UPDATE public.alloc_rows r SET lineage_id = lineage.id FROM lineage JOIN req USING (entitlement)
WHERE r.id = req.row_id AND r.token = req.row_token AND r.follow RETURNING 1
"""
HOLD_SQL = "SELECT 1 FROM public.alloc_rows WHERE id = %(row_id)s AND token = %(row_token)s FOR UPDATE"
ATTACH_SQL = """
UPDATE public.alloc_rows r SET lineage_id = lineage.id FROM lineage
WHERE r.id = %(row_id)s AND r.token = %(row_token)s AND r.follow RETURNING 1
"""


@dataclass
class RowJob:
    row_id: int
    token: uuid.UUID = field(default_factory=uuid.uuid4)
    crash = "test"
    purpose = "deposit"
    max_ledger = None
    hold_sql = HOLD_SQL
    attach_sql = ATTACH_SQL
    install_sql = "SELECT 1 FROM anchored"
    hold_many_sql = HOLD_MANY_SQL
    attach_many_sql = ATTACH_MANY_SQL

    def params(self) -> dict[str, Any]:
        return {"row_id": self.row_id, "row_token": self.token}

    def row_key(self) -> tuple[int, Any]:
        return self.row_id, self.token


def _world(db: psycopg.Connection, rows: int, lanes: int) -> tuple[Engine, list[RowJob]]:
    db.execute(ROWS_DDL)
    addresses = [Keypair.random().public_key for _ in range(lanes)]
    for address in addresses:
        db.execute("INSERT INTO paygate.lanes (address) VALUES (%s)", (address,))
    jobs = [RowJob(i) for i in range(1, rows + 1)]
    for job in jobs:
        db.execute("INSERT INTO public.alloc_rows (id, token) VALUES (%s, %s)", (job.row_id, job.token))
    ctx = TickContext(conn=db, settings=load_settings({}), worker="test", instance_id="t", slot=0, batch=8,
                      log=logging.getLogger("test"))
    # The engine's lanes are those it holds keys for; no key is used here (nothing is signed).
    signer = SimpleNamespace(lanes=dict.fromkeys(addresses))
    return Engine(ctx, chain=None, signer=signer, keyring=None), jobs  # type: ignore[arg-type]


def _pointers(db: psycopg.Connection) -> dict[int, tuple[str, str, str] | None]:
    """Each row's lineage, as (state, entitlement, lane), or None."""
    return {row_id: None if state is None else (state, entitlement, lane) for row_id, state, entitlement, lane in
            db.execute("SELECT r.id, x.state, x.entitlement, x.lane FROM public.alloc_rows r "
                       "LEFT JOIN paygate.lineages x ON x.id = r.lineage_id ORDER BY r.id")}


def test_a_ticks_rows_take_their_lanes_in_one_statement_each_rows_fate_its_own(db: psycopg.Connection) -> None:
    engine, jobs = _world(db, rows=4, lanes=2)
    db.execute("UPDATE public.alloc_rows SET token = gen_random_uuid() WHERE id = 2")  # another worker took row 2
    got = engine.allocate_many(jobs, [f"e:{job.row_id}" for job in jobs])
    assert isinstance(got[0], Allocation) and isinstance(got[2], Allocation)
    assert isinstance(got[1], LeaseLost)
    assert got[3] is None  # two lanes for three held rows: the last one waits for a lane
    pointers = _pointers(db)
    assert pointers[1] == ("allocated", "e:1", got[0].lane) and pointers[3] == ("allocated", "e:3", got[2].lane)
    assert got[0].lane != got[2].lane
    assert pointers[2] is None and pointers[4] is None
    assert db.execute("SELECT count(*) FROM paygate.lineages").fetchone()[0] == 2
    xmins = {x for (x,) in db.execute("SELECT xmin::text FROM paygate.lineages")}
    assert len(xmins) == 1  # one statement, one transaction


def test_a_row_that_does_not_take_its_lineage_falls_back_to_one_statement_per_row(db: psycopg.Connection) -> None:
    engine, jobs = _world(db, rows=3, lanes=3)
    db.execute("UPDATE public.alloc_rows SET follow = false WHERE id = 2")  # require() fails for row 2 alone
    got = engine.allocate_many(jobs, [f"e:{job.row_id}" for job in jobs])
    assert isinstance(got[0], Allocation) and isinstance(got[2], Allocation)
    assert isinstance(got[1], LeaseLost) and "did not take its lineage" in str(got[1])
    pointers = _pointers(db)
    assert pointers[1] is not None and pointers[3] is not None and pointers[2] is None
    # Nothing of row 2's allocation survived; the others were allocated one statement each.
    assert [e for (e,) in db.execute("SELECT entitlement FROM paygate.lineages ORDER BY id")] == ["e:1", "e:3"]
    assert len({x for (x,) in db.execute("SELECT xmin::text FROM paygate.lineages")}) == 2


def _sent_lineage(db: psycopg.Connection, n: int) -> int:
    lane = Keypair.random().public_key
    db.execute("INSERT INTO paygate.lanes (address) VALUES (%s)", (lane,))
    lineage_id = int(db.execute("INSERT INTO paygate.lineages (purpose, entitlement, lane) VALUES ('deposit', %s, %s) "
                                "RETURNING id", (f"r:{n}", lane)).fetchone()[0])
    db.execute("UPDATE paygate.lineages SET state = 'signed', source_seq = 5, key_id = 'k', envelope = 'x', "
               "inner_hash = %s, outer_hash = %s, max_time = 1, signed_at_ledger = 1 WHERE id = %s",
               (bytes([n]) * 32, bytes([n + 50]) * 32, lineage_id))
    db.execute("UPDATE paygate.lineages SET state = 'sent' WHERE id = %s", (lineage_id,))
    return lineage_id


def test_a_ticks_receipts_are_recorded_together_and_a_lost_cas_is_left_alone(db: psycopg.Connection) -> None:
    ids = [_sent_lineage(db, n) for n in (1, 2, 3)]
    before = [load(db, i) for i in ids]
    # Someone else (another resolver) recorded lineage 2's receipt first.
    db.execute("UPDATE paygate.lineages SET state = 'applied', ledger = 9, fee_charged = 77, resolution = 'theirs' "
               "WHERE id = %s", (ids[1],))
    receipts = [Receipt(before[0], "applied", 10, 100, "txSUCCESS", "receipt SUCCESS in ledger 10"),
                Receipt(before[1], "applied", 10, 100, "txSUCCESS", "receipt SUCCESS in ledger 10"),
                Receipt(before[2], "failed", 11, 250, "txFAILED", "receipt FAILED in ledger 11")]
    written = record_receipts(db, receipts)
    assert [w.id for w in written] == [ids[0], ids[2]]
    assert [(w.state, w.ledger, w.fee_charged) for w in written] == [("applied", 10, 100), ("failed", 11, 250)]
    rows = db.execute("SELECT state, ledger, fee_charged, resolution, xmin::text FROM paygate.lineages "
                      "WHERE id = ANY(%s) ORDER BY id", (ids,)).fetchall()
    assert [r[:4] for r in rows] == [("applied", 10, 100, "receipt SUCCESS in ledger 10"),
                                     ("applied", 9, 77, "theirs"),
                                     ("failed", 11, 250, "receipt FAILED in ledger 11")]
    assert rows[0][4] == rows[2][4]  # one statement wrote both


def test_a_ticks_deposits_settle_together_with_each_events_own_running_balance(db: psycopg.Connection) -> None:
    """Funding settles a tick's deposits in one statement: one increment per account, each deposit's
    event carrying the balance right after its own credit, and a deposit whose hash does not match
    left pending."""
    from paygate_cli.queues.deposits import SETTLE_SQL

    db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES ('http://127.0.0.1:9/h', "
               "'0123456789abcdef0123')")
    a, b = Keypair.random().public_key, Keypair.random().public_key
    db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 5), (%s, 0)", (a, b))
    ids = []
    for n, (account, amount) in enumerate([(a, 100), (b, 40), (a, 250), (a, 7)], start=1):
        ids.append(db.execute(
            "INSERT INTO paygate.deposits (account, amount, auth_entry, auth_nonce, auth_expiration_ledger, "
            "idempotency_key, deposit_tx) VALUES (%s, %s, 'e', %s, 99, %s, %s) RETURNING id",
            (account, amount, n, f"k{n}", bytes([n]) * 32)).fetchone()[0])
    txs = [bytes([1]) * 32, bytes([2]) * 32, bytes([3]) * 32, bytes([9]) * 32]  # the last names another hash
    won = db.execute(SETTLE_SQL, {"ids": ids, "by": "funding", "deposit_txs": txs}).fetchall()
    assert sorted(r[0] for r in won) == ids[:3]
    assert dict(db.execute("SELECT address, cached_balance FROM paygate.accounts")) == {a: 355, b: 40}
    events = {int(p["deposit_id"]): p["balance"] for (p,) in db.execute(
        "SELECT payload FROM paygate.webhook_outbox WHERE event_type = 'deposit.settled'")}
    assert events == {ids[0]: "105", ids[1]: "40", ids[2]: "355"}
    assert db.execute("SELECT status FROM paygate.deposits WHERE id = %s", (ids[3],)).fetchone() == ("pending",)
