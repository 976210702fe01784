"""Retention: terminal history leaves the hot tables.

Rows terminal for longer than `retention_window` (PAYGATE_RETENTION_WINDOW, DB time) are moved to
`paygate_archive.<table>` (same columns + archived_at) and deleted from `paygate.<table>` by ONE
statement per bounded batch (`WITH picked AS (… ORDER BY … LIMIT n FOR UPDATE SKIP LOCKED), moved
AS (DELETE … RETURNING *) INSERT INTO archive …`), committed on its own. A crash anywhere leaves every
row in the hot table or in the archive, never both (archive primary keys) and never neither (one
statement, one transaction). Each pick walks its own partial index in the order rows became
terminal (sql/0001_baseline.sql), so a batch costs the rows it moves, not a scan of the history.

What each table may lose, and why that is safe (everything else stays, however old):

- charges: settled/failed, terminal for longer than the window; not while the lineage it points at
  is live or its batch is open (settlement and recovery find a batch's rows by lineage), not while
  an unresolved finding names its account, the row (`charge:<id>`) or the contract total
  (`contract`), and never the latest charge of a subscription that is not cancelled (its last
  charged period; the subscriptions worker derives periods from next_period_index, so the
  UNIQUE (subscription_id, period_start) backstop is given up only for periods older than the window).
  Rows kept however old are bounded by live state (open findings, live subscriptions, lanes), so the
  head of each pick's index never fills with history. The
  reconciler's contract-wide check counts settled amounts as USDC the contract holds: the archived
  amount is added to `paygate.retention_totals` in the same statement, and the reconciler reads both.
- charge_batches: closed for longer than the window, no hot charge pointing at its lineage, no open
  `charge_batch:<lineage>` finding.
- lineages: only `charge_batch` lineages (deposit, credit and relay lineages are named by rows that
  stay hot — deposits, relays, bot_jobs, fee_reservations — and `replay` reads them by
  entitlement, so they stay until those tables have retention of their own). Terminal and resolved
  longer ago than the window; no batch row or charge pointing at it; never a lane's highest consumed
  (applied/failed) sequence, which allocation (`next_sequence`), the reconciler's lane check and
  `key-retire-check --lane` read; not while an open finding names it (`lineage:<id>`) or its lane
  (`lane_gap`). key-retire-check: the window must be at least `key_retention`, so an archived lineage
  was resolved before the key's retention period and cannot change its "retention since last use"
  verdict; it was terminal (nothing left to resend under the key), and being older than any RPC
  node's retention it could only have passed the chain check as "past retention, terminal state
  recorded". The journal's delete guard (sql/functions/lineage_delete_guard.sql) lets only this
  statement delete, only terminal rows.
- chain_events: applied (not quarantined: quarantined events have no resolution and are what
  `reconcile-report` and `status` list), observed longer ago than the window, in a ledger the
  observer's cursor has passed (a re-read page could only be older than the RPC's retention, and a
  re-applied event is a no-op anyway: every promotion is a CAS from a non-terminal state).
- webhook_outbox: delivered, longer ago than the window. Dead rows stay (`replay` needs them), as do
  rows named by an open `webhook:<id>` finding.
- worker_runs: heartbeats started longer ago than the window, except each worker's latest run and its
  latest successful one (`status`, `workers` and the metrics' last success read them). The tick
  runner also prunes a worker's own heartbeats after 7 days; this covers workers that stopped running.
- idempotency_keys: already swept by idempotency_sweep.

Per tick at most MAX_BATCHES_PER_TABLE batches per table (`backlog` in the details when more wait);
charge_batches and lineages are `deferred` to the next tick while a table pointing at them still has a
backlog, so catching up on a large history never walks every old batch for the few it may move.

Exit codes: 0 done (also nothing to move); 1 a table's batch failed (statement timeout, a lock, a
foreign key a row still holds) — the other tables still ran and the next tick retries; 78 the window is
shorter than `key_retention` or an archive table lacks a column of its hot table (a migration added
it to one and not the other: moving would lose data, so nothing moves)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from paygate_cli.context import TickContext, TickResult
from paygate_cli.crashpoints import crashpoint
from paygate_cli.errors import ConfigError
from paygate_cli.journal.lineage import last_consumed_seq_sql

if TYPE_CHECKING:
    from paygate_cli.settings import Settings

HONOURS_DRAIN = True  # a drained instance takes no new work: archiving included
MAX_BATCHES_PER_TABLE = 10  # bounds one tick; the next tick continues where this one stopped
ARCHIVE_SCHEMA = "paygate_archive"

TERMINAL_LINEAGE = "('applied', 'failed', 'expired', 'superseded', 'abandoned')"

# The picks. Each walks its partial index in the order rows became terminal and returns the key of at
# most %(batch)s rows, locked (SKIP LOCKED: a row a worker is touching right now is taken next time).
# Every "is it still needed" check is a scalar subquery, `(SELECT NOT EXISTS (…))`: Postgres evaluates
# it per candidate with an index probe, where a plain NOT EXISTS may become an anti-join that hashes the
# whole referencing table (its cost would then grow with the history retention is meant to remove).
PICK_CHARGES_SQL = """
SELECT c.id FROM paygate.charges c
WHERE c.status IN ('settled', 'failed')
  AND coalesce(c.settled_at, c.failed_at) < now() - make_interval(secs => %(window)s)
  AND (SELECT NOT EXISTS (SELECT 1 FROM paygate.lineages l
                          WHERE l.id = c.lineage_id AND l.state IN ('allocated', 'signed', 'sent')))
  AND (SELECT NOT EXISTS (SELECT 1 FROM paygate.charge_batches b
                          WHERE b.lineage_id = c.lineage_id AND b.closed_at IS NULL))
  AND (SELECT NOT EXISTS (SELECT 1 FROM paygate.findings f
                          WHERE f.resolved_at IS NULL AND f.subject IN (c.account, 'contract', 'charge:' || c.id)))
  -- a live subscription's latest charge stays (kept rows are bounded by live subscriptions, not history)
  AND (c.subscription_id IS NULL
       OR (SELECT s.status = 'cancelled' FROM paygate.subscriptions s WHERE s.id = c.subscription_id)
       OR (SELECT EXISTS (SELECT 1 FROM paygate.charges n
                          WHERE n.subscription_id = c.subscription_id AND n.period_start > c.period_start)))
ORDER BY coalesce(c.settled_at, c.failed_at)
LIMIT %(batch)s
FOR UPDATE OF c SKIP LOCKED
"""
PICK_CHARGE_BATCHES_SQL = """
SELECT b.lineage_id FROM paygate.charge_batches b
WHERE b.closed_at IS NOT NULL AND b.closed_at < now() - make_interval(secs => %(window)s)
  AND (SELECT NOT EXISTS (SELECT 1 FROM paygate.charges c WHERE c.lineage_id = b.lineage_id))
  AND (SELECT NOT EXISTS (SELECT 1 FROM paygate.findings f
                          WHERE f.resolved_at IS NULL AND f.subject = 'charge_batch:' || b.lineage_id))
ORDER BY b.closed_at
LIMIT %(batch)s
FOR UPDATE OF b SKIP LOCKED
"""
PICK_LINEAGES_SQL = f"""
SELECT l.id FROM paygate.lineages l
WHERE l.purpose = 'charge_batch' AND l.state IN {TERMINAL_LINEAGE}
  AND l.resolved_at < now() - make_interval(secs => %(window)s)
  AND (SELECT NOT EXISTS (SELECT 1 FROM paygate.charge_batches b WHERE b.lineage_id = l.id))
  AND (SELECT NOT EXISTS (SELECT 1 FROM paygate.charges c WHERE c.lineage_id = l.id))
  -- the lane's last consumed sequence (what the next allocation on the lane reads) stays
  AND (l.state NOT IN ('applied', 'failed') OR l.source_seq < {last_consumed_seq_sql("l.lane")})
  AND (SELECT NOT EXISTS (SELECT 1 FROM paygate.findings f
                          WHERE f.resolved_at IS NULL AND f.subject IN ('lineage:' || l.id, l.lane)))
ORDER BY l.resolved_at
LIMIT %(batch)s
FOR UPDATE OF l SKIP LOCKED
"""
# No row lock here: a chain event never changes after the observer inserts it and only retention (a
# single writer) deletes it, so there is nothing to skip or wait for (and the runtime role needs no
# UPDATE on the table).
PICK_CHAIN_EVENTS_SQL = """
SELECT e.id FROM paygate.chain_events e
WHERE NOT e.quarantined AND e.observed_at < now() - make_interval(secs => %(window)s)
  AND e.ledger < (SELECT o.ledger FROM paygate.observer_cursor o)
ORDER BY e.observed_at
LIMIT %(batch)s
"""
PICK_WEBHOOK_OUTBOX_SQL = """
SELECT o.id FROM paygate.webhook_outbox o
WHERE o.status = 'delivered' AND o.delivered_at < now() - make_interval(secs => %(window)s)
  AND (SELECT NOT EXISTS (SELECT 1 FROM paygate.findings f
                          WHERE f.resolved_at IS NULL AND f.subject = 'webhook:' || o.id))
ORDER BY o.delivered_at
LIMIT %(batch)s
FOR UPDATE OF o SKIP LOCKED
"""
PICK_WORKER_RUNS_SQL = """
SELECT r.id FROM paygate.worker_runs r
WHERE r.started_at < now() - make_interval(secs => %(window)s)
  -- max() over the worker's own indexes (worker_runs_worker_started, worker_runs_last_success)
  AND r.started_at < (SELECT max(n.started_at) FROM paygate.worker_runs n WHERE n.worker = r.worker)
  AND (r.outcome <> 'ok'
       OR r.finished_at < (SELECT max(n.finished_at) FROM paygate.worker_runs n
                           WHERE n.worker = r.worker AND n.outcome = 'ok'))
ORDER BY r.started_at
LIMIT %(batch)s
FOR UPDATE OF r SKIP LOCKED
"""

# The settled amount archived, kept as a total in the same statement (the reconciler adds it).
CHARGES_TOTALS_CTE = """,
totals AS (
    UPDATE paygate.retention_totals t
    SET settled_charges_amount = t.settled_charges_amount + s.amount, settled_charges = t.settled_charges + s.n,
        updated_at = now()
    FROM (SELECT coalesce(sum(amount), 0) AS amount, count(*) AS n FROM moved WHERE status = 'settled') s
    WHERE t.singleton AND s.n > 0
)"""

# Pick, delete, archive: one statement. Data-modifying CTEs all run, exactly once, whether or not
# the final SELECT reads them; the archive receives exactly the rows the DELETE returned.
MOVE_SQL = """
WITH picked AS ({pick}),
moved AS (
    -- = ANY(ARRAY(…)): a primary-key probe per picked row, never a hash join over the whole table
    DELETE FROM paygate.{table} t WHERE t.{key} = ANY (ARRAY(SELECT picked.{key} FROM picked))
    RETURNING t.*
),
archived AS (
    INSERT INTO paygate_archive.{table} ({columns}, archived_at)
    SELECT {columns}, now() FROM moved
    RETURNING 1
){extra}
SELECT count(*) FROM archived
"""
# Only this transaction may delete journal rows, and only terminal ones (sql/functions/lineage_delete_guard.sql).
ARCHIVING_SQL = "SET LOCAL paygate.archiving = 'on'"

COLUMNS_SQL = """
SELECT table_schema, column_name FROM information_schema.columns
WHERE table_schema IN ('paygate', 'paygate_archive') AND table_name = %s
ORDER BY ordinal_position
"""
AUDIT_SQL = """
INSERT INTO paygate.audit_log (actor, action, target, details)
VALUES ('paygate:retention', 'retention.archive', %s, %s)
"""


@dataclass(frozen=True)
class RetainedTable:
    name: str
    key: str
    pick: str
    extra: str = ""
    journal: bool = False  # the lineages table: its delete guard wants the archiving flag
    # Tables whose rows point at this one: while one of them still has a backlog (or failed) this
    # tick, this table waits for the next tick. Its candidates would mostly still be pointed at, and
    # the pick would probe every one of them (catching up on a large history, every batch and
    # lineage old enough) only to move a few.
    after: tuple[str, ...] = ()


# Order matters for the foreign keys: charges and charge_batches point at lineages, so they go first
# (a lineage is picked only when nothing hot points at it any more).
TABLES: tuple[RetainedTable, ...] = (
    RetainedTable("charges", "id", PICK_CHARGES_SQL, extra=CHARGES_TOTALS_CTE),
    RetainedTable("charge_batches", "lineage_id", PICK_CHARGE_BATCHES_SQL, after=("charges",)),
    RetainedTable("lineages", "id", PICK_LINEAGES_SQL, journal=True, after=("charges", "charge_batches")),
    RetainedTable("chain_events", "id", PICK_CHAIN_EVENTS_SQL),
    RetainedTable("webhook_outbox", "id", PICK_WEBHOOK_OUTBOX_SQL),
    RetainedTable("worker_runs", "id", PICK_WORKER_RUNS_SQL),
)

# Failures of one table's batch that the next tick may get past: the tick goes on with the other
# tables and ends 1. Anything else is a bug (70) or the database gone (69), as for every worker.
RETRYABLE = (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable, psycopg.errors.ForeignKeyViolation,
             psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)


def check_window(settings: Settings) -> float:
    """The window, or ConfigError (78) when it is shorter than the journal keys' retention: an
    archived lineage must be older than anything key-retire-check still weighs."""
    window = float(settings.retention_window)
    if window < float(settings.key_retention):
        raise ConfigError(f"retention_window {window:g}s must be at least key_retention "
                          f"({float(settings.key_retention):g}s): key-retire-check weighs lineages that recent",
                          msgid="config.retention_window")
    return window


def move_statement(conn: psycopg.Connection, table: RetainedTable) -> sql.Composed:
    """The table's MOVE_SQL with its column list, read from the catalogue: every column of the hot
    table, which the archive must have too (else ConfigError and nothing moves)."""
    hot: list[str] = []
    archived: set[str] = set()
    for schema, column in conn.execute(COLUMNS_SQL, (table.name,)):
        if schema == "paygate":
            hot.append(column)
        else:
            archived.add(column)
    missing = [c for c in hot if c not in archived]
    if not hot or missing or "archived_at" not in archived:
        raise ConfigError(f"{ARCHIVE_SCHEMA}.{table.name} does not match paygate.{table.name} "
                          f"(missing: {', '.join(missing) or 'the table or archived_at'}); a migration must add "
                          "them to the archive before retention may move rows", msgid="config.retention_archive")
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in hot)
    return sql.SQL(MOVE_SQL).format(pick=sql.SQL(table.pick), table=sql.Identifier(table.name),
                                    key=sql.Identifier(table.key), columns=columns, extra=sql.SQL(table.extra))


def move_batch(conn: psycopg.Connection, table: RetainedTable, statement: sql.Composed, window: float,
               batch: int) -> int:
    with conn.transaction():
        if table.journal:
            conn.execute(ARCHIVING_SQL)
        moved = int(conn.execute(statement, {"window": window, "batch": batch}).fetchone()[0])
        crashpoint("retention.before_commit")  # a kill here rolls the whole batch back
    return moved


def tick(ctx: TickContext) -> TickResult:
    if ctx.draining:
        return TickResult(details={"draining": True})
    window = check_window(ctx.settings)
    statements = {table.name: move_statement(ctx.conn, table) for table in TABLES}
    moved: dict[str, int] = {}
    backlog: list[str] = []
    errors: dict[str, str] = {}
    deferred: list[str] = []
    for table in TABLES:
        moved[table.name] = 0
        if any(name in backlog or name in errors or name in deferred for name in table.after):
            deferred.append(table.name)
            continue
        try:
            for _ in range(MAX_BATCHES_PER_TABLE):
                count = move_batch(ctx.conn, table, statements[table.name], window, ctx.batch)
                moved[table.name] += count
                crashpoint("retention.after_batch")  # committed: these rows are in the archive only
                if count < ctx.batch:
                    break
            else:
                backlog.append(table.name)  # more may wait; the next tick continues
        except RETRYABLE as exc:
            errors[table.name] = f"{type(exc).__name__}: {str(exc).strip()}"[:300]
            ctx.log.error("retention could not move %s: %s", table.name, errors[table.name],
                          extra={"msgid": "retention.batch_failed", "table": table.name})
    total = sum(moved.values())
    if total:
        with ctx.conn.transaction():
            ctx.conn.execute(AUDIT_SQL, (",".join(t for t, n in moved.items() if n),
                                         Jsonb({"moved": moved, "window_s": window})))
    details: dict[str, Any] = {"moved": moved, "window_s": window}
    if backlog:
        details["backlog"] = backlog
    if deferred:
        details["deferred"] = deferred
    if errors:
        details["errors"] = errors
    return TickResult(processed=total, failed=len(errors), details=details)
