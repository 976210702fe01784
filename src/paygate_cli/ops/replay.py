"""`replay QUEUE`: dead rows back to pending, keeping their idempotency key and history, attempt
budget reset, with an audit entry (and an outbox event where the product should hear of it).

Each queue is one `QueueSpec`: how to find its rows, why a row may not be replayed, and the
compare-and-set that puts it back. Relays and bot jobs are added with one entry each.

Refused, per row and with the reason: a row that is not dead; a row whose lineage is not terminal
(it could still land); a row whose effect is already on chain (re-verified by a majority of read
endpoints, and refused if any endpoint sees it); a deposit whose authorisation has expired."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from paygate_cli.errors import UsageError
from paygate_cli.ops.audit import record

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.rpc import ChainClient

# -- webhook deliveries ----------------------------------------------------------------------------

WEBHOOK_ROWS_SQL = """
SELECT o.id, o.status, o.attempts, o.event_id, o.event_type, o.dead_reason, o.dead_at, o.updated_at,
       o.endpoint_id, e.enabled
FROM paygate.webhook_outbox o LEFT JOIN paygate.webhook_endpoints e ON e.id = o.endpoint_id
WHERE CASE WHEN %(ids)s::bigint[] IS NULL
           THEN o.status = 'dead' AND (%(since)s::timestamptz IS NULL OR o.dead_at >= %(since)s)
           ELSE o.id = ANY(%(ids)s) END
ORDER BY o.id
"""
# Same row, same event id (the receiver's idempotency key), its last error kept as history.
WEBHOOK_REPLAY_SQL = """
UPDATE paygate.webhook_outbox
SET status = 'pending', attempts = 0, next_attempt_at = now(), dead_at = NULL, dead_reason = NULL, updated_at = now()
WHERE id = %(id)s AND status = 'dead' AND updated_at = %(updated_at)s
RETURNING id
"""


def _webhook_refusal(conn: psycopg.Connection, chain: ChainClient | None, row: dict[str, Any]) -> str | None:
    if row["status"] != "dead":
        return f"not dead (status {row['status']})"
    if row["endpoint_id"] is None:
        return "its endpoint was deleted: a replay would die again"
    if not row["enabled"]:
        return "its endpoint is disabled: enable it first"
    return None


# -- deposits --------------------------------------------------------------------------------------

DEPOSIT_ROWS_SQL = """
SELECT p.id, p.status, p.account, p.amount, p.auth_nonce, p.auth_expiration_ledger, p.reason, p.attempts,
       p.deposit_tx, p.deposit_lineage_id, p.credit_lineage_id, p.idempotency_key, p.updated_at,
       (SELECT array_agg(l.id || ':' || l.state ORDER BY l.id) FROM paygate.lineages l
        WHERE l.entitlement IN ('pending_credit:' || p.id || ':deposit', 'pending_credit:' || p.id || ':credit')
          AND l.state IN ('allocated', 'signed', 'sent')) AS live,
       (SELECT array_agg(l.id ORDER BY l.id) FROM paygate.lineages l
        WHERE l.entitlement = 'pending_credit:' || p.id || ':deposit' AND l.state = 'applied') AS applied
FROM paygate.pending_credits p
WHERE CASE WHEN %(ids)s::bigint[] IS NULL
           THEN p.status IN ('failed', 'expired', 'needs_human')
                AND (%(since)s::timestamptz IS NULL OR p.updated_at >= %(since)s)
           ELSE p.id = ANY(%(ids)s) END
ORDER BY p.id
"""
# Back to pending: the funding worker starts it afresh (its old lineages are all terminal and stay
# in the journal under the same entitlement; the row no longer points at them).
DEPOSIT_REPLAY_SQL = """
UPDATE paygate.pending_credits
SET status = 'pending', reason = NULL, pending_failure = NULL, attempts = 0, lease_token = NULL,
    lease_expires_at = NULL, claimed_by = NULL, deposit_lineage_id = NULL, credit_lineage_id = NULL, updated_at = now()
WHERE id = %(id)s AND status = %(status)s AND updated_at = %(updated_at)s AND deposit_tx IS NULL
RETURNING id
"""
DEPOSIT_EVENT_SQL = """
SELECT paygate.emit_event('credit.replayed', jsonb_build_object('pending_credit_id', %(id)s::bigint,
                          'account', %(account)s::text, 'amount', %(amount)s::text,
                          'previous_status', %(status)s::text))
"""


def _deposit_refusal(conn: psycopg.Connection, chain: ChainClient | None, row: dict[str, Any]) -> str | None:
    if row["status"] not in ("failed", "expired", "needs_human"):
        return f"not dead (status {row['status']})"
    if row["live"]:
        return f"lineage {', '.join(row['live'])} is not terminal: it could still land"
    if row["deposit_tx"] is not None or row["applied"]:
        return "effect already on chain: its deposit transaction applied"
    assert chain is not None
    from paygate_cli.chain.balances import nonce_consumed_by_quorum

    consumed, latest, answers = nonce_consumed_by_quorum(chain, row["account"], int(row["auth_nonce"]))
    if consumed or any(v is True for v in answers.values()):
        return (f"effect already on chain: authorisation nonce {row['auth_nonce']} is consumed "
                f"(read endpoints: {answers})")
    if consumed is None:
        return f"cannot re-verify on chain: no majority of read endpoints answered alike ({answers})"
    if latest is not None and latest > int(row["auth_expiration_ledger"]):
        return f"authorisation expired at ledger {row['auth_expiration_ledger']} (latest {latest})"
    return None


@dataclass(frozen=True)
class QueueSpec:
    name: str
    rows_sql: str  # params: ids (bigint[] or NULL = every dead row), since
    refusal: Callable[[psycopg.Connection, ChainClient | None, dict[str, Any]], str | None]
    replay_sql: str  # CAS on the status and updated_at read; params: the row
    needs_chain: bool  # refusals re-verify on chain
    event_sql: str | None = None  # an outbox event in the same transaction
    aliases: tuple[str, ...] = field(default_factory=tuple)


QUEUES: dict[str, QueueSpec] = {spec.name: spec for spec in (
    QueueSpec("webhooks", WEBHOOK_ROWS_SQL, _webhook_refusal, WEBHOOK_REPLAY_SQL, needs_chain=False,
              aliases=("webhook", "webhook_deliveries", "webhook_outbox")),
    QueueSpec("deposits", DEPOSIT_ROWS_SQL, _deposit_refusal, DEPOSIT_REPLAY_SQL, needs_chain=True,
              event_sql=DEPOSIT_EVENT_SQL, aliases=("deposit", "pending_credits", "funding")),
)}


def queue_spec(name: str) -> QueueSpec:
    wanted = name.replace("-", "_").lower()
    for spec in QUEUES.values():
        if wanted == spec.name or wanted in spec.aliases:
            return spec
    raise UsageError(f"unknown queue {name!r}; replayable queues: {', '.join(QUEUES)}", msgid="usage.unknown_queue")


def _public(row: dict[str, Any]) -> dict[str, Any]:
    keep = ("status", "attempts", "reason", "dead_reason", "event_type", "account", "amount", "idempotency_key")
    return {k: (str(v) if k == "amount" else v) for k, v in row.items() if k in keep and v is not None}


def plan(conn: psycopg.Connection, chain: ChainClient | None, spec: QueueSpec, *, ids: list[int] | None,
         since: Any) -> list[dict[str, Any]]:
    """Every selected row with its refusal reason (None: replayable). Reads only."""
    cursor = conn.execute(spec.rows_sql, {"ids": ids, "since": since})
    names = [c.name for c in cursor.description or []]
    rows = [dict(zip(names, r, strict=True)) for r in cursor]
    if ids:
        missing = sorted(set(ids) - {r["id"] for r in rows})
        rows += [{"id": i, "missing": True} for i in missing]
    for row in rows:
        row["refusal"] = "no such row" if row.get("missing") else spec.refusal(conn, chain, row)
    return rows


def apply(conn: psycopg.Connection, spec: QueueSpec, rows: list[dict[str, Any]], *, actor: str, dry_run: bool,
          progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """Replay the planned rows. Each is its own transaction: the CAS on the status and updated_at
    the plan read (a row that changed since is refused, never overwritten), the audit entry, the
    outbox event."""
    outcomes = []
    for n, row in enumerate(rows, start=1):
        if row["refusal"]:
            outcomes.append({"id": row["id"], "outcome": "refused", "reason": row["refusal"]})
        elif dry_run:
            outcomes.append({"id": row["id"], "outcome": "would_replay", "was": _public(row)})
        else:
            with conn.transaction():
                won = conn.execute(spec.replay_sql, row).fetchone()
                if won is not None:
                    record(conn, actor, f"replay.{spec.name}", f"{spec.name}:{row['id']}", {"was": _public(row)})
                    if spec.event_sql:
                        conn.execute(spec.event_sql, row)
            outcomes.append({"id": row["id"], "outcome": "replayed", "was": _public(row)} if won else
                            {"id": row["id"], "outcome": "refused", "reason": "changed while replaying (re-run)"})
        if progress is not None:
            progress(n, len(rows))
    return outcomes


def run(settings: Any, queue: str, *, ids: list[int] | None, all_dead: bool, since: Any, actor: str, dry_run: bool,
        confirm: Callable[[int], None], progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """The whole command: plan, confirm (a count of replayable rows), replay."""
    from paygate_cli.db.connect import connect

    spec = queue_spec(queue)
    if bool(ids) == all_dead:
        raise UsageError("give row IDS or --all-dead (one of them)", msgid="usage.replay_rows")
    if ids and since is not None:
        raise UsageError("--since goes with --all-dead, not with IDS")
    with connect(settings, "replay") as conn:
        chain = None
        if spec.needs_chain:
            from paygate_cli.chain.rpc import ChainClient

            chain = ChainClient(settings, guard_conn=conn)
        try:
            rows = plan(conn, chain, spec, ids=ids or None, since=since)
            replayable = sum(1 for r in rows if not r["refusal"])
            if replayable and not dry_run:
                confirm(replayable)
            outcomes = apply(conn, spec, rows, actor=actor, dry_run=dry_run, progress=progress)
        finally:
            if chain is not None:
                chain.close()
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o["outcome"]] = counts.get(o["outcome"], 0) + 1
    return {"queue": spec.name, "dry_run": dry_run, "counts": counts, "rows": outcomes}
