"""Each queue claim, and the lease release that undoes it, is a HOT update.

A HOT ("heap only tuple") update writes the row's new version on its own page and no index entry at
all, so its cost does not grow with the indexes, which grow with history. PostgreSQL makes an update
HOT only when no column it changes is named by any index of the table (keys, expressions, partial
index predicates) and the page has room for the new version (the old one stays until the claim
commits). So each test inserts queued rows of real size (pages filled by inserts up to the table's
fillfactor), then runs the worker's real statements (the SQL constants imported from the worker
modules) on the oldest: a full batch of freshly admitted rows, and every row of a first page that
later admissions filled. Before the hot-update layout every one of those updates was non-HOT.

How the HOT count is read (PostgreSQL 15): pg_stat_user_tables.n_tup_hot_upd only moves after the
backend flushes its pending statistics, which happens when it is idle, at most once a second (or at
the next idle moment after pg_stat_force_next_flush()), so reading it right after a statement is racy.
pg_stat_get_xact_tuples_hot_updated(relid) and pg_stat_get_xact_tuples_updated(relid) instead read
this backend's own pending counts, which include the current transaction and are not flushed while a
transaction is open; the difference of two readings inside one transaction is exactly what the
statements between them did. A claim that is not HOT (an indexed column changed, or no room on the
page) shows updated = n and hot_updated < n.

Settlement's and webhooks' claims are not here: they cannot be HOT. Settlement's records the batch's
lineage_id and claimed_at on each charge, which take the row out of the claim-order index and into the
lineage index (both needed); the webhooks claim moves status from pending to delivering, and every
partial index of webhook_outbox (due, leased, delivered, dead) names status in its predicate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from paygate_cli.queues import bot_jobs, deposits, relays

CONTRACT = "C" + "A" * 55
AUTH_ENTRY = "A" * 470  # the size of a real base64 authorisation entry (address credentials, one call)
OWNER = "test:hot"


def claim_params(batch: int) -> dict[str, Any]:
    return {"lapsed_only": False, "grace": 180, "draining": False, "lease": 30, "owner": OWNER, "batch": batch}


def address(n: int) -> str:
    return "G" + str(n).rjust(55, "0").translate(str.maketrans("0123456789", "ABCDEFGHIJ"))


@dataclass(frozen=True)
class Queue:
    table: str
    claim_sql: str
    release_sql: str
    fill_sql: str  # inserts %(n)s queued rows


QUEUES = {
    "funding": Queue("deposits", deposits.CLAIM_SQL, deposits.RELEASE_SQL, """
        INSERT INTO paygate.deposits (account, amount, auth_entry, auth_nonce, auth_expiration_ledger,
                                            idempotency_key)
        SELECT %(account)s, 70, %(auth)s, g, 1000, 'hot' || g FROM generate_series(1, %(n)s) g"""),
    "relay": Queue("relays", relays.CLAIM_SQL, relays.RELEASE_SQL, """
        INSERT INTO paygate.relays (account, contract, function, args_xdr, auth_entries, auth_nonces,
                                   auth_expiration_ledger, max_fee, idempotency_key)
        SELECT %(account)s, %(contract)s, 'f', 'AAAA', ARRAY[%(auth)s], ARRAY[g], 1000, 100, 'hot' || g
        FROM generate_series(1, %(n)s) g"""),
    "relay_drainer": Queue("bot_jobs", bot_jobs.CLAIM_SQL, bot_jobs.RELEASE_SQL, """
        INSERT INTO paygate.bot_jobs (job_key, request_hash, contract, function, args_xdr)
        SELECT 'hot' || g, '\\x00', %(contract)s, 'f', %(auth)s FROM generate_series(1, %(n)s) g"""),
}


def fill(db: psycopg.Connection, queue: Queue, n: int) -> None:
    db.execute("INSERT INTO paygate.accounts (address) VALUES (%s) ON CONFLICT DO NOTHING", (address(1),))
    db.execute(queue.fill_sql, {"account": address(1), "contract": CONTRACT, "auth": AUTH_ENTRY, "n": n})


def first_page_ids(db: psycopg.Connection, table: str) -> list[int]:
    return [r[0] for r in db.execute(f"SELECT id FROM paygate.{table} WHERE (ctid::text::point)[0] = 0 ORDER BY id")]


def update_counts(db: psycopg.Connection, table: str) -> tuple[int, int]:
    """(updated, hot_updated) of this backend's pending statistics for the table, current transaction
    included: read twice inside one transaction, the difference is what ran in between."""
    return db.execute("SELECT pg_stat_get_xact_tuples_updated(%(t)s::regclass),"
                      "       pg_stat_get_xact_tuples_hot_updated(%(t)s::regclass)",
                      {"t": f"paygate.{table}"}).fetchone()


def run_counted(db: psycopg.Connection, table: str, sql: str, params: dict[str, Any]) -> tuple[int, int, int]:
    """Runs one statement in its own committed transaction: (rows it returned or changed, updated, hot)."""
    with db.transaction():
        updated_before, hot_before = update_counts(db, table)
        rows = db.execute(sql, params).rowcount
        updated_after, hot_after = update_counts(db, table)
    return rows, updated_after - updated_before, hot_after - hot_before


def claim_and_release(db: psycopg.Connection, worker: str, batch: int) -> list[int]:
    """The worker's claim of `batch` rows, then the release of all of them (what a tick does with rows
    it did not finish); asserts every update of both was HOT. Returns the claimed ids."""
    queue = QUEUES[worker]
    claimed, updated, hot = run_counted(db, queue.table, queue.claim_sql, claim_params(batch))
    assert claimed == batch
    assert (updated, hot) == (batch, batch), f"{worker}'s claim: {hot} of {updated} updates were HOT"
    leases = db.execute(f"SELECT id, lease_token FROM paygate.{queue.table} WHERE claimed_by = %s "
                        "AND lease_token IS NOT NULL ORDER BY id", (OWNER,)).fetchall()
    assert len(leases) == batch
    released, updated, hot = run_counted(db, queue.table, queue.release_sql,
                                         {"ids": [r[0] for r in leases], "tokens": [r[1] for r in leases]})
    assert released == batch
    assert (updated, hot) == (batch, batch), f"{worker}'s release: {hot} of {updated} updates were HOT"
    return [r[0] for r in leases]


# The workers' own batch sizes (catalogue.py: funding and relay 16, relay_drainer 25).
BATCH = {"funding": 16, "relay": 16, "relay_drainer": 25}


@pytest.mark.parametrize("worker", sorted(QUEUES))
def test_a_claim_of_newly_admitted_rows_is_hot(db: psycopg.Connection, worker: str) -> None:
    """A tick claims what was admitted since the last one: a full batch of rows of real size spans a
    page or two, each filled by inserts up to the fillfactor. No index may name a column the claim or
    the release writes, and each page must keep room for its rows' new versions."""
    fill(db, QUEUES[worker], BATCH[worker])
    claimed = claim_and_release(db, worker, BATCH[worker])
    assert len(claimed) == BATCH[worker]


@pytest.mark.parametrize("worker", sorted(QUEUES))
def test_a_claim_on_a_page_that_inserts_filled_is_hot(db: psycopg.Connection, worker: str) -> None:
    """A backlog: the oldest rows sit on a page that later admissions filled as far as the table's
    fillfactor lets them, and the claim takes every row on it at once. The space the fillfactor keeps
    free must hold a new version of each (the old ones stay until the claim commits)."""
    queue = QUEUES[worker]
    fill(db, queue, 200)
    pages = db.execute(f"SELECT pg_relation_size('paygate.{queue.table}') / current_setting('block_size')::int"
                       ).fetchone()[0]
    first_page = first_page_ids(db, queue.table)
    assert pages >= 3 and len(first_page) > 2  # the first page is followed by others: inserts filled it
    assert claim_and_release(db, worker, len(first_page)) == first_page


def test_the_counts_see_an_update_that_is_not_hot(db: psycopg.Connection) -> None:
    """The measurement can fail: an update of an indexed column (status, named by the claimable
    index's predicate) is counted as updated and not as HOT."""
    fill(db, QUEUES["relay_drainer"], 8)
    changed, updated, hot = run_counted(
        db, "bot_jobs", "UPDATE paygate.bot_jobs SET status = 'dead', finished_at = now(), reason = 'test' "
                        "WHERE id = ANY(%(ids)s)", {"ids": first_page_ids(db, "bot_jobs")[:4]})
    assert (changed, updated, hot) == (4, 4, 0)
