"""Observer: the billing contract's events -> promotions (docs/architecture.md §5). Single writer of the cursor.

Per tick: read getEvents pages from the stored cursor (filtered to the billing contract); each page
is applied in one transaction together with the cursor the RPC returned (even for an empty page):

- `charge`        -> the charge settled (CAS from authorized) + `charge.settled`;
- `charge_failed` -> the charge failed and its amount back on the cached balance, in the same
                     statement + `charge.failed`;
- `credit`        -> funding's settle CAS (by='observer'): whichever of funding and the observer
                     wins pending -> settled applies the increment, once.

Every event is inserted into chain_events first (event id unique): a page read twice applies
nothing twice. An event that cannot be applied (undecodable, unknown charge id or deposit, account
or amount differing from the row, a charge already terminal) is stored quarantined with the reason
and alarmed (error log, exit 3); the cursor moves on regardless (an Anchor Platform lesson: one
poison event must never stall the stream). Two reasons can stop being true after a restore: a
`credit` for a deposit the database does not know yet (the observer can read the chain's credit
before funding has re-learned the deposit's hash), and a charge event for an unknown charge id (a
subscription period's id is derived from the period, so a restored database admits a lost period
again under the id the chain already debited). Each tick first re-examines a bounded batch of those
whose deposit or charge is known now, through the same apply code as a fresh event: applied, the
quarantine is lifted (and audited, with the reason it had); still wrong, it keeps a quarantine with
the new reason. A deposit is known by its recorded `deposit_tx`, or by the applied deposit lineage
the row points at (the hash funding would record with its credit): the credit event names that
hash, the chain's own evidence. Every other reason is final: an undecodable event, an account or
amount that differs from the row, a second event for one charge id (those name the row they
concern: only an event naming none is re-examined). A cursor older than the RPC's retention window
stops the observer with exit 3: events in between may be lost and a human must reconcile. A read
node behind the cursor is not that: the next read endpoint is tried, and when none has caught up the tick ends
without moving the cursor and says so (details `waiting`, log `observer.readers_behind`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from paygate_cli.context import TickContext, TickResult
from paygate_cli.crashpoints import crashpoint
from paygate_cli.errors import ConfigError, NeedsHuman
from paygate_cli.queues import charges, deposits

if TYPE_CHECKING:
    import logging
    from collections.abc import Callable

    import psycopg

    from paygate_cli.chain.charges import BillingEvent, EventsPage

T = TypeVar("T")

LOAD_CURSOR_SQL = "SELECT cursor, ledger FROM paygate.observer_cursor"
INSERT_CURSOR_SQL = """
INSERT INTO paygate.observer_cursor (cursor, ledger, latest_ledger, pages, events)
VALUES (%(cursor)s, %(ledger)s, %(latest)s, 1, %(events)s)
ON CONFLICT (singleton) DO NOTHING
"""
# CAS on the cursor this tick read: a second writer (which the advisory lock should make
# impossible) changes nothing and is told so.
ADVANCE_CURSOR_SQL = """
UPDATE paygate.observer_cursor
SET cursor = %(cursor)s, ledger = %(ledger)s, latest_ledger = %(latest)s, pages = pages + 1,
    events = events + %(events)s, updated_at = now()
WHERE singleton AND cursor = %(old)s
"""

# A page travels to Postgres as one JSON document per statement (json_to_recordset), not as ten
# parallel arrays: psycopg adapts a 10,000-element text[] in Python, element by element, which cost
# more than the statements themselves; json.dumps is C and the server parses JSON as fast.

# Which of a page's events were applied before (a page read twice: a crash after commit, a node
# that served an older cursor)? Only the others are applied; the UNIQUE event id is the backstop.
SEEN_EVENTS_SQL = """
SELECT event_id FROM paygate.chain_events
WHERE event_id = ANY(ARRAY(SELECT json_array_elements_text(%s::json)))
"""
# Every new event of the page is written once, with what it did (or why it was quarantined).
INSERT_EVENTS_SQL = """
INSERT INTO paygate.chain_events (event_id, ledger, tx_hash, contract_id, kind, payload, applied_to, effect,
                                  quarantined, quarantine_reason)
SELECT e.event_id, e.ledger, e.tx_hash, e.contract_id, e.kind,
       -- a decoded event's payload is built here from flat fields (cheaper to send and parse than
       -- 10,000 nested objects); an undecodable one keeps its raw topic and value
       coalesce(e.raw, jsonb_strip_nulls(jsonb_build_object('account', e.account, 'amount', e.amount,
                                                            'ref', e.ref, 'reason', e.reason))),
       e.applied_to, e.effect, e.quarantine_reason IS NOT NULL, e.quarantine_reason
FROM json_to_recordset(%s::json) AS e(event_id text, ledger integer, tx_hash text, contract_id text, kind text,
                                      account text, amount text, ref text, reason text, raw jsonb,
                                      applied_to text, effect text, quarantine_reason text)
ON CONFLICT (event_id) DO NOTHING
"""

# The statements that move a charge's row from its event (settle, fail with the balance restored)
# and a deposit's (funding's settle) are the queues': queues/charges.py, queues/deposits.py.

CHARGE_ROW_SQL = "SELECT id, account, amount, status FROM paygate.charges WHERE charge_id = %s"
# A credit's deposit: by the hash recorded on the row, else by the applied deposit lineage the row
# points at whose inner hash the event names (funding's own rule for its credit's deposit hash,
# queues/deposits.py ATTACH_MANY_SQL; the row records it with its credit's allocation, which a
# restore can have lost). The second branch runs only when the first finds nothing. The last column:
# the hash is still to be recorded on the row.
DEPOSIT_ROW_SQL = """
(SELECT id, account, amount, status, false FROM paygate.deposits WHERE deposit_tx = %(ref)s LIMIT 1)
UNION ALL
(SELECT p.id, p.account, p.amount, p.status, true
 FROM paygate.lineages d JOIN paygate.deposits p ON p.deposit_lineage_id = d.id
 WHERE d.inner_hash = %(ref)s AND d.purpose = 'deposit' AND d.state = 'applied' AND p.deposit_tx IS NULL)
LIMIT 1
"""
# The same hash journaled for a deposit whose lineage is not resolved yet: said in the reason, which
# the re-examination lifts once funding records the receipt.
UNRESOLVED_DEPOSIT_SQL = """
SELECT p.id, d.state FROM paygate.lineages d JOIN paygate.deposits p ON p.deposit_lineage_id = d.id
WHERE d.inner_hash = %s AND d.purpose = 'deposit'
"""

# Quarantined credits whose deposit was unknown (no row named: applied_to is NULL) and is known now,
# oldest first; only those are re-examined, so events that stay unknown cost one index probe each
# and never crowd out the ones that became applicable. The quarantined set is small (each one alarms).
REEXAMINE_BATCH = 100
REEXAMINE_SQL = """
SELECT e.event_id, e.payload->>'account', e.payload->>'amount', e.payload->>'ref', e.quarantine_reason
FROM paygate.chain_events e
WHERE e.quarantined AND e.kind = 'credit' AND e.applied_to IS NULL
  AND (EXISTS (SELECT 1 FROM paygate.deposits p WHERE p.deposit_tx = decode(e.payload->>'ref', 'hex'))
       OR EXISTS (SELECT 1 FROM paygate.lineages d JOIN paygate.deposits p ON p.deposit_lineage_id = d.id
                  WHERE d.inner_hash = decode(e.payload->>'ref', 'hex') AND d.purpose = 'deposit'
                    AND d.state = 'applied'))
ORDER BY e.ledger, e.event_id
LIMIT %s
"""
# The same for charge events whose charge id was unknown: a subscription period's id is derived from
# the period (sql/functions/admit_charge.sql), so after a restore the period is admitted again under the
# id the chain already debited, possibly after the observer read that debit.
REEXAMINE_CHARGES_SQL = """
SELECT e.event_id, e.kind, e.payload->>'account', e.payload->>'amount', e.payload->>'ref',
       coalesce(e.payload->>'reason', ''), e.ledger, e.quarantine_reason
FROM paygate.chain_events e
WHERE e.quarantined AND e.kind IN ('charge', 'charge_failed') AND e.applied_to IS NULL
  AND EXISTS (SELECT 1 FROM paygate.charges c WHERE c.charge_id = decode(e.payload->>'ref', 'hex'))
ORDER BY e.ledger, e.event_id
LIMIT %s
"""
LIFT_QUARANTINE_SQL = """
UPDATE paygate.chain_events
SET quarantined = false, quarantine_reason = NULL, applied_to = %(applied_to)s, effect = %(effect)s
WHERE event_id = %(event_id)s AND quarantined
"""
REQUARANTINE_SQL = """
UPDATE paygate.chain_events SET quarantine_reason = %(reason)s, applied_to = %(applied_to)s
WHERE event_id = %(event_id)s AND quarantined
"""
AUDIT_LIFTED_SQL = """
INSERT INTO paygate.audit_log (actor, action, target, details)
VALUES ('observer', 'quarantine_lifted', 'chain_event:' || %(event_id)s,
        jsonb_build_object('was', %(was)s::text, 'applied_to', %(applied_to)s::text, 'effect', %(effect)s::text))
"""


# Rule 10 (nothing is guessed): a charge whose batch applied in a ledger the observer has already
# read past, with no event for it, was skipped by the contract — its id was consumed by a
# transaction that is not ours. It is never settled or failed by guesswork: a human looks.
UNEXPLAINED_SQL = """
SELECT c.id, encode(c.charge_id, 'hex'), l.id, l.ledger
FROM paygate.charges c JOIN paygate.lineages l ON l.id = c.lineage_id
WHERE c.status = 'authorized' AND l.state = 'applied' AND l.ledger < %s
ORDER BY c.id
LIMIT 100
"""


@dataclass
class PageStats:
    events: int = 0
    new: int = 0
    settled: int = 0
    failed: int = 0
    credited: int = 0
    already: int = 0
    quarantined: list[tuple[str, str]] = field(default_factory=list)


# A page's transaction locks accounts and deposits in the chain's event order, which funding's settle
# (deposit, then account) can cross: the loser of a deadlock committed nothing, so the page is
# applied again (the winner has moved on by then; every event is idempotent).
PAGE_ATTEMPTS = 3


def _retrying(ctx: TickContext, apply: Callable[[], T]) -> T:
    """`apply` in one transaction, again after a deadlock (it committed nothing)."""
    import psycopg

    for attempt in range(1, PAGE_ATTEMPTS + 1):
        try:
            with ctx.conn.transaction():
                return apply()
        except psycopg.Error as exc:
            if exc.sqlstate not in ("40P01", "40001") or attempt == PAGE_ATTEMPTS:
                raise
            ctx.log.warning("observer: page met a concurrent writer (%s); applying it again", exc.sqlstate,
                            extra={"msgid": "observer.page_retry"})
    raise AssertionError("unreachable")


def tick(ctx: TickContext) -> TickResult:
    settings = ctx.settings
    row = ctx.conn.execute(LOAD_CURSOR_SQL).fetchone()
    cursor: str | None = row[0] if row else None
    start_ledger: int | None = None
    if cursor is None:
        start_ledger = settings.observer_start_ledger
        if not start_ledger:
            raise ConfigError("the observer has no stored cursor and PAYGATE_OBSERVER_START_LEDGER is not set; "
                              "refusing to read from genesis: set it to the first ledger to watch (the billing "
                              "contract's deployment ledger)", msgid="observer.no_start_ledger")
    if not settings.billing_contract:
        raise ConfigError("PAYGATE_BILLING_CONTRACT is not set")
    from paygate_cli.chain.charges import ReadersBehind, RetentionGap, cursor_ledger, get_events
    from paygate_cli.chain.rpc import ChainClient
    from paygate_cli.chain.threads import ReadAhead

    result = TickResult()
    totals: dict[str, Any] = {"pages": 0, "events": 0, "settled": 0, "failed": 0, "credited": 0, "quarantined": 0,
                              "read_ahead": 0}
    # Before the new events: quarantined ones that may apply now (no chain read needed).
    lifted, requarantined = _retrying(ctx, lambda: reexamine(ctx.conn, ctx.log))
    if lifted or requarantined:
        totals["quarantine_lifted"], totals["requarantined"] = lifted, requarantined
    result.processed += lifted
    result.needs_human += requarantined
    chain = ChainClient(settings, guard_conn=ctx.conn)
    # A full page is followed by another: it is read ahead, on a thread, while this one is applied
    # (chain/threads.py), so a catch-up waits on the RPC once, not once per page. That read holds no
    # transaction, though this thread holds one meanwhile: its client is not guarded by ctx.conn.
    reader = ChainClient(settings)
    limit = max(1, min(int(ctx.batch), 10000))
    pages = max(1, int(settings.observer_max_pages))
    ahead: ReadAhead[EventsPage] | None = None
    try:
        for number in range(pages):
            try:
                if ahead is not None:
                    page = ahead.answer()
                else:
                    page = get_events(chain, settings.billing_contract, cursor=cursor, start_ledger=start_ledger,
                                      limit=limit)
            except RetentionGap as exc:
                where = f"cursor {cursor} (ledger {cursor_ledger(cursor)})" if cursor else f"ledger {start_ledger}"
                raise NeedsHuman(f"observer stopped: its position {where} is older than the RPC's retention "
                                 f"window; billing events may have been lost and must be reconciled by a human "
                                 f"({exc})", msgid="observer.retention_gap") from None
            except ReadersBehind as exc:
                # Lagging nodes lose nothing: wait for them (the cursor stays where it is).
                ctx.log.warning("observer waiting: %s", exc, extra={"msgid": exc.msgid})
                totals["waiting"] = str(exc)
                break
            if cursor is not None and cursor_ledger(cursor) < page.oldest_ledger:
                raise NeedsHuman(f"observer stopped: cursor {cursor} (ledger {cursor_ledger(cursor)}) is older than "
                                 f"the RPC's oldest ledger {page.oldest_ledger}; billing events may have been lost",
                                 msgid="observer.retention_gap")
            ahead = None
            if len(page.events) == limit and number + 1 < pages:
                ahead = ReadAhead(lambda after=page.cursor: get_events(reader, settings.billing_contract,
                                                                       cursor=after, start_ledger=None, limit=limit),
                                  name="observer read-ahead")
                totals["read_ahead"] += 1
            crashpoint("observer.after_fetch")  # a read ahead may be in flight: a drill kills it too
            stats = _retrying(ctx, lambda page=page, cursor=cursor: apply_page(ctx.conn, page, cursor, ctx.log))
            crashpoint("observer.after_apply")
            cursor, start_ledger = page.cursor, None
            totals["pages"] += 1
            for key in ("events", "settled", "failed", "credited"):
                totals[key] += getattr(stats, key)
            totals["quarantined"] += len(stats.quarantined)
            result.processed += stats.new
            result.needs_human += len(stats.quarantined)
            if len(page.events) < limit:
                ctx.wake_after(page.latest_ledger)  # the next close has the next events
                break  # caught up with the RPC's latest ledger
    finally:
        chain.close()
        reader.close()  # a read ahead still in flight (this tick failed) fails with it, unread
    if cursor is not None:
        stuck = ctx.conn.execute(UNEXPLAINED_SQL, (cursor_ledger(cursor),)).fetchall()
        for charge_row_id, charge_id, lineage_id, ledger in stuck:
            ctx.log.error("charge %s (%s): its batch (lineage %s) applied in ledger %s but the contract emitted no "
                          "event for it: the charge id was consumed by a transaction that is not ours",
                          charge_row_id, charge_id, lineage_id, ledger,
                          extra={"msgid": "observer.charge_without_event", "charge_row_id": charge_row_id})
        result.needs_human += len(stuck)
        totals["charges_without_event"] = len(stuck)
    totals["cursor"] = cursor
    result.details = totals
    return result


def apply_page(conn: psycopg.Connection, page: EventsPage, old_cursor: str | None, log: logging.Logger) -> PageStats:
    """Apply one page and store its cursor; the caller holds the transaction."""
    from paygate_cli.chain.billing_events import decode_billing_events
    from paygate_cli.chain.charges import UndecodableEvent, cursor_ledger

    # The cursor CAS first: it locks the cursor row, so a second writer (which the advisory lock
    # should make impossible) stops here before applying anything.
    new_cursor = page.cursor
    params: dict[str, Any] = {"cursor": new_cursor, "ledger": cursor_ledger(new_cursor), "latest": page.latest_ledger,
                              "events": len(page.events), "old": old_cursor}
    if old_cursor is None:
        if conn.execute(INSERT_CURSOR_SQL, params).rowcount != 1:
            raise NeedsHuman("observer cursor appeared while this tick held none: a second observer is writing",
                             msgid="observer.second_writer")
    elif conn.execute(ADVANCE_CURSOR_SQL, params).rowcount != 1:
        raise NeedsHuman("observer cursor changed under this tick: a second observer is writing",
                         msgid="observer.second_writer")
    stats = PageStats(events=len(page.events))
    if not page.events:
        return stats
    seen = {r[0] for r in conn.execute(SEEN_EVENTS_SQL, (json.dumps([e.id for e in page.events]),))}
    fresh = [e for e in page.events if e.id not in seen]
    stats.new = len(fresh)
    decoded: dict[str, BillingEvent] = {}
    outcome: dict[str, tuple[str | None, str | None, str | None]] = {}  # id -> (applied_to, effect, quarantine)
    for event_id, result in decode_billing_events(fresh).items():
        if isinstance(result, UndecodableEvent):
            outcome[event_id] = (None, None, f"undecodable: {result}")
        else:
            decoded[event_id] = result
    passes = (("charge", charges.SETTLE_CHARGES_SQL, "settled"), ("charge_failed", charges.FAIL_CHARGES_SQL, "failed"))
    ledgers = {e.id: e.ledger for e in fresh}
    for kind, sql, effect in passes:
        group = [(eid, ev) for eid, ev in decoded.items() if ev.kind == kind]
        if not group:
            continue
        batch = [{"event_id": eid, "charge_id": ev.ref.hex(), "account": ev.account, "amount": ev.amount,
                  "ledger": ledgers[eid], "reason": ev.reason or ""} for eid, ev in group]
        applied = {r[0]: r[1] for r in conn.execute(sql, (json.dumps(batch),))}
        setattr(stats, effect, len(applied))
        for eid, ev in group:
            if eid in applied:
                outcome[eid] = (f"charge:{applied[eid]}", effect, None)
            else:
                target, reason = _diagnose_charge(conn, ev)
                outcome[eid] = (target, None, reason)
    for eid, ev in decoded.items():
        if ev.kind == "credit":
            outcome[eid] = _apply_credit(conn, stats, ev)
    rows: list[dict[str, Any]] = []
    for event in fresh:
        billing = decoded.get(event.id)
        applied_to, effect, reason = outcome[event.id]
        row: dict[str, Any] = {"event_id": event.id, "ledger": event.ledger, "tx_hash": event.tx_hash,
                               "contract_id": event.contract_id, "applied_to": applied_to, "effect": effect,
                               "quarantine_reason": reason}
        if billing is not None:  # payload {account, amount, ref[, reason]}, built by the statement
            row.update(kind=billing.kind, account=billing.account, amount=str(billing.amount),
                       ref=billing.ref.hex(), reason=billing.reason)
        else:
            row["raw"] = {"topic": event.topic, "value": event.value}
        rows.append(row)
        if reason is not None:
            stats.quarantined.append((event.id, reason))
    if conn.execute(INSERT_EVENTS_SQL, (json.dumps(rows),)).rowcount != len(fresh):
        raise NeedsHuman("billing events appeared in chain_events while this page was applied: a second observer "
                         "is writing", msgid="observer.second_writer")
    for event_id, reason in stats.quarantined:
        log.error("billing event %s quarantined: %s", event_id, reason,
                  extra={"msgid": "observer.quarantined", "event_id": event_id})
    return stats


def reexamine(conn: psycopg.Connection, log: logging.Logger, limit: int = REEXAMINE_BATCH) -> tuple[int, int]:
    """Quarantined credits whose deposit is known now, and charge events whose charge id is known
    now, applied as a fresh event is (_apply_credit, the page's charge statements); the caller holds
    the transaction. -> (quarantines lifted, events quarantined again for a reason that is final: the
    row differs from the event, or it is no longer open)."""
    from paygate_cli.chain.charges import BillingEvent

    lifted = requarantined = 0
    stats = PageStats()
    found: list[tuple[str, str, tuple[str | None, str | None, str | None]]] = []
    for event_id, account, amount, ref, was in conn.execute(REEXAMINE_SQL, (limit,)).fetchall():
        ev = BillingEvent("credit", account, int(amount), bytes.fromhex(ref))
        found.append((event_id, was, _apply_credit(conn, stats, ev)))
    statements = {"charge": (charges.SETTLE_CHARGES_SQL, "settled"),
                  "charge_failed": (charges.FAIL_CHARGES_SQL, "failed")}
    for event_id, kind, account, amount, ref, why, ledger, was in conn.execute(REEXAMINE_CHARGES_SQL,
                                                                               (limit,)).fetchall():
        sql, effect = statements[kind]
        batch = [{"event_id": event_id, "charge_id": ref, "account": account, "amount": int(amount),
                  "ledger": ledger, "reason": why}]
        applied = {r[0]: r[1] for r in conn.execute(sql, (json.dumps(batch),))}
        if event_id in applied:
            found.append((event_id, was, (f"charge:{applied[event_id]}", effect, None)))
        else:
            target, reason = _diagnose_charge(conn, BillingEvent(kind, account, int(amount), bytes.fromhex(ref),
                                                                 why or None))
            found.append((event_id, was, (target, None, reason)))
    for event_id, was, (applied_to, effect, reason) in found:
        if reason is None:
            # The observer is the one writer of chain_events (its advisory lock): a row that changed
            # meanwhile means a second one, and this transaction (the settle with it) rolls back.
            if conn.execute(LIFT_QUARANTINE_SQL, {"event_id": event_id, "applied_to": applied_to,
                                                  "effect": effect}).rowcount != 1:
                raise NeedsHuman(f"billing event {event_id} changed while it was re-examined: a second observer "
                                 "is writing", msgid="observer.second_writer")
            conn.execute(AUDIT_LIFTED_SQL, {"event_id": event_id, "was": was, "applied_to": applied_to,
                                            "effect": effect})
            lifted += 1
            log.info("billing event %s: quarantine lifted, %s %s (it was quarantined: %s)", event_id, applied_to,
                     effect, was, extra={"msgid": "observer.quarantine_lifted", "event_id": event_id})
        else:
            conn.execute(REQUARANTINE_SQL, {"event_id": event_id, "reason": reason, "applied_to": applied_to})
            requarantined += 1
            log.error("billing event %s quarantined: %s", event_id, reason,
                      extra={"msgid": "observer.quarantined", "event_id": event_id})
    return lifted, requarantined


def _diagnose_charge(conn: psycopg.Connection, ev: Any) -> tuple[str | None, str]:
    """Why a charge event did not apply -> (the row it names, or None for an unknown charge id: the
    one reason re-examined later; the reason)."""
    row = conn.execute(CHARGE_ROW_SQL, (ev.ref,)).fetchone()
    if row is None:
        return None, f"{ev.kind}: unknown charge id {ev.ref.hex()}"
    charge_row_id, account, amount, status = row
    if account != ev.account or int(amount) != ev.amount:
        return f"charge:{charge_row_id}", (f"{ev.kind}: charge {charge_row_id} is {amount} from {account}, the event "
                                           f"says {ev.amount} from {ev.account} (amount/account mismatch)")
    return f"charge:{charge_row_id}", (f"{ev.kind}: charge {charge_row_id} is already {status} (a second event "
                                       "for one charge id)")


def _apply_credit(conn: psycopg.Connection, stats: PageStats, ev: Any) -> tuple[str | None, str | None, str | None]:
    row = conn.execute(DEPOSIT_ROW_SQL, {"ref": ev.ref}).fetchone()
    if row is None:
        journaled = conn.execute(UNRESOLVED_DEPOSIT_SQL, (ev.ref,)).fetchone()
        if journaled is not None:
            return None, None, (f"credit: no deposit with deposit_tx {ev.ref.hex()} yet (deposit {journaled[0]}'s "
                                f"transfer has that hash, its lineage is {journaled[1]}): re-examined every tick")
        return None, None, f"credit: no deposit with deposit_tx {ev.ref.hex()}: re-examined every tick"
    pending_id, account, amount, status, unrecorded = row
    target = f"deposit:{pending_id}"
    if account != ev.account or int(amount) != ev.amount:
        return target, None, (f"credit: deposit {pending_id} is {amount} for {account}, the event says {ev.amount} "
                              f"for {ev.account} (amount/account mismatch)")
    if unrecorded and conn.execute(deposits.RECORD_DEPOSIT_TX_SQL, {"id": pending_id, "ref": ev.ref}).rowcount != 1:
        return target, None, f"credit: deposit {pending_id} is {status} locally but credited on chain"
    won = conn.execute(deposits.SETTLE_SQL, {"ids": [pending_id], "by": "observer", "deposit_txs": [ev.ref]}).fetchone()
    if won is not None:
        stats.credited += 1
        return target, "credited", None
    if status == "settled" or _status(conn, pending_id) == "settled":
        stats.already += 1  # funding won the flip and applied the increment
        return target, "already_settled", None
    return target, None, f"credit: deposit {pending_id} is {status} locally but credited on chain"


def _status(conn: psycopg.Connection, pending_id: int) -> str:
    return str(conn.execute("SELECT status FROM paygate.deposits WHERE id = %s", (pending_id,)).fetchone()[0])
