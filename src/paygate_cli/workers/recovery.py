"""Recovery (docs/architecture.md §6): claimed rows whose owner left no result past a grace window are taken over
through their queue's own take-over routine (the one its worker uses: never a second copy of the
rules), and items in flight beyond an alarm age become findings.

The grace window must exceed the longest a live owner may legitimately hold a row without a result
(its receipt timeout) plus one of its ticks; a shorter one could take a row from a worker that is
still about to write, so such a configuration is refused (78).

Queues are data, catalogue.RECOVERABLE: webhook deliveries, deposits, charge batches, relays and
bot jobs. Each entry names the worker owning the queue, whose `take_over(ctx, grace)` recovery
calls (resolved by the catalogue: recovery imports no other worker); for the money paths that
drives the lineage in flight through the phase engine (journal/engine.py: resolve, or resend the
same bytes) and never starts a new transaction. So recovery holds no lane or
fee seed (least privilege): each routine builds its engine with Engine.for_takeover, which needs
only the journal keys (to decrypt the bytes it resends) and RPC, and refuses to allocate or sign.
A deployment gives recovery the database URL, the RPC endpoints and the journal keys, no more.

The restore gate (journal/restore_gate.py) runs at the end of the tick: its recovery pass while the
restore halt is set, else one batched read of the lanes that sets the halt when two or more are
ahead of the journal at once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paygate_cli.catalogue import RECOVERABLE, recovery_grace
from paygate_cli.context import TickContext, TickResult
from paygate_cli.queues.findings import Finding, clear_findings, record_findings

if TYPE_CHECKING:
    from paygate_cli.chain.rpc import ChainClient

HONOURS_DRAIN = True  # a drained instance takes nothing over

# Items in flight longer than the alarm age, per queue (at most `limit` each): each a finding.
STUCK_SQL = """
(SELECT 'deposit:' || id, 'deposit ' || id || ' pending since ' || created_at
 FROM paygate.deposits WHERE status = 'pending' AND created_at < now() - make_interval(secs => %(age)s)
 ORDER BY created_at LIMIT %(limit)s)
UNION ALL
(SELECT 'charge_batch:' || lineage_id, 'charge batch (lineage ' || lineage_id || ') open since ' || created_at
 FROM paygate.charge_batches WHERE closed_at IS NULL AND created_at < now() - make_interval(secs => %(age)s)
 ORDER BY created_at LIMIT %(limit)s)
UNION ALL
(SELECT 'lineage:' || id, 'lineage ' || id || ' (' || purpose || ', ' || entitlement || ') ' || state
        || ' since ' || created_at
 FROM paygate.lineages WHERE paygate.lineage_is_live(state)
   AND created_at < now() - make_interval(secs => %(age)s)
 ORDER BY created_at LIMIT %(limit)s)
UNION ALL
(SELECT 'relay:' || id, 'relay ' || id || ' queued since ' || created_at
 FROM paygate.relays WHERE status = 'queued' AND created_at < now() - make_interval(secs => %(age)s)
 ORDER BY created_at LIMIT %(limit)s)
UNION ALL
(SELECT 'bot_job:' || id, 'bot job ' || id || ' queued since ' || created_at
 FROM paygate.bot_jobs WHERE status = 'queued' AND created_at < now() - make_interval(secs => %(age)s)
 ORDER BY created_at LIMIT %(limit)s)
UNION ALL
(SELECT 'webhook:' || id, 'webhook delivery ' || id || ' delivering since ' || updated_at
 FROM paygate.webhook_outbox WHERE status = 'delivering' AND updated_at < now() - make_interval(secs => %(age)s)
 ORDER BY updated_at LIMIT %(limit)s)
"""
# Stuck findings whose item is no longer stuck (moved on, or finished).
OPEN_STUCK_SQL = "SELECT subject FROM paygate.findings WHERE kind = 'stuck' AND resolved_at IS NULL"
STUCK_LIMIT = 100


def tick(ctx: TickContext) -> TickResult:
    if ctx.draining:
        return TickResult(details={"draining": True})
    grace = recovery_grace(ctx.settings)
    details: dict[str, Any] = {}
    processed = 0
    fenced = 0
    for entry in RECOVERABLE:
        outcomes = entry.load()(ctx, grace)
        fenced += outcomes.pop("lane_fenced", 0)
        fenced += outcomes.get("needs_human", 0)  # a taken-over unit handed to a human (e.g. a parked lineage)
        taken = sum(outcomes.values())
        if taken:
            ctx.log.warning("recovery took over %d %s row(s) whose owner left no result for %gs past its lease: %s",
                            taken, entry.queue, grace, outcomes,
                            extra={"msgid": "recovery.took_over", "queue": entry.queue})
        details[entry.queue] = outcomes
        processed += taken
    new = _stuck_findings(ctx, details)
    gate_fenced, stalled = _restore_gate(ctx, details)
    return TickResult(processed=processed, needs_human=new + fenced + gate_fenced, details=details, stalled=stalled)


def _restore_gate(ctx: TickContext, details: dict[str, Any]) -> tuple[int, str | None]:
    """The restore gate (docs/architecture.md §8), after this tick's take-overs drove what they could:
    while the restore halt is set, the recovery pass (lanes fenced, and the reason the halt stays:
    exit 1 until it clears); while none is set, only the cheap check that sets it when two or more
    lanes are ahead of the journal at once (one batched read)."""
    from paygate_cli.errors import Unavailable
    from paygate_cli.journal import restore_gate

    actor = f"recovery:{ctx.instance_id}"
    if restore_gate.restore_halt(ctx.conn) is None:
        try:
            ahead = restore_gate.lanes_ahead_halt(ctx.conn, ctx.settings, actor=actor, log=ctx.log)
        except Unavailable as exc:  # a check not made is no verdict; the money paths read lanes themselves
            ctx.log.debug("restore gate: lanes not compared: %s", exc, extra={"msgid": "restore.lanes_unread"})
            return 0, None
        if not ahead:
            return 0, None
    clients: list[ChainClient] = []

    def chain_of() -> ChainClient:
        if not clients:
            from paygate_cli.chain.rpc import ChainClient

            clients.append(ChainClient(ctx.settings, guard_conn=ctx.conn))
        return clients[0]

    try:
        result = restore_gate.run_pass(ctx.conn, ctx.settings, chain_of, actor=actor, dry_run=False, log=ctx.log)
    finally:
        for client in clients:
            client.close()
    blockers = result.blockers()
    details["restore_gate"] = {**result.summary(), "blockers": blockers[:20]}
    if result.cleared:
        return result.fenced_now, None
    why = result.kept_because or f"{len(blockers)} blocker(s): " + "; ".join(blockers[:5])
    return result.fenced_now, f"the restore halt stays: {why}"


def _stuck_findings(ctx: TickContext, details: dict[str, Any]) -> int:
    age = float(ctx.settings.recovery_alarm_age)
    rows = ctx.conn.execute(STUCK_SQL, {"age": age, "limit": STUCK_LIMIT}).fetchall()
    stuck = {subject: summary for subject, summary in rows}
    # A queue listed up to the limit may have more stuck items than were listed: keep its findings.
    per_queue: dict[str, int] = {}
    for subject in stuck:
        per_queue[subject.split(":")[0]] = per_queue.get(subject.split(":")[0], 0) + 1
    full = {queue for queue, n in per_queue.items() if n >= STUCK_LIMIT}
    findings = [Finding("stuck", subject, f"{summary}: in flight longer than {age:g}s", {"alarm_age_s": age})
                for subject, summary in stuck.items()]
    with ctx.conn.transaction():
        written = record_findings(ctx.conn, findings, ctx.log)
        gone = [s for (s,) in ctx.conn.execute(OPEN_STUCK_SQL) if s not in stuck and s.split(":")[0] not in full]
        cleared = clear_findings(ctx.conn, "stuck", gone, "recovery", ctx.log)
    new = sum(1 for row in written if row[4])
    details["stuck"] = {"open": len(stuck), "new": new, "cleared": cleared}
    return new
