"""`replay QUEUE`: dead rows back to pending, keeping their idempotency key and history, attempt
budget reset, with an audit entry (and an outbox event where the product should hear of it).

Each queue is one `QueueSpec`: how to find its rows, why a row may not be replayed, and the
compare-and-set that puts it back. Relays and bot jobs are one entry each; a replayed relay
reserves its fee again through admission's own budget rule (paygate.take_relay_fee_budget).

Refused, per row and with the reason: a row that is not dead; a row whose lineage is not terminal
(it could still land); a row whose effect is already on chain (re-verified by a majority of read
endpoints, and refused if any endpoint sees it: a deposit's or a relay's authorisation nonce); a
deposit or relay whose authorisation has expired; a relay the fee budget cannot cover; a deposit
whose authorisation fails funding's own validation today (the same call would fail again)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from paygate_cli.errors import Unavailable, UsageError
from paygate_cli.ops.audit import record
from paygate_cli.queues import bot_jobs, deposits, relays, webhooks

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.rpc import ChainClient

# -- webhook deliveries ----------------------------------------------------------------------------

def _webhook_refusal(conn: psycopg.Connection, chain: ChainClient | None, row: dict[str, Any]) -> str | None:
    if row["status"] != "dead":
        return f"not dead (status {row['status']})"
    if row["endpoint_id"] is None:
        return "its endpoint was deleted: a replay would die again"
    if not row["enabled"]:
        return "its endpoint is disabled: enable it first"
    return None


# -- deposits --------------------------------------------------------------------------------------

def _require_majority_answered(answers: dict[str, Any], nonce: int) -> None:
    """Fewer than a majority of read endpoints answered: the chain's view is unknown. That is an
    outage (69, retry later), not something to refuse the row over."""
    answered = sum(1 for v in answers.values() if isinstance(v, bool))
    if answered < len(answers) // 2 + 1:
        errors = "; ".join(f"{host}: {v}" for host, v in answers.items() if not isinstance(v, bool))
        raise Unavailable(f"cannot re-verify authorisation nonce {nonce} on chain: {answered} of {len(answers)} "
                          f"read endpoint(s) answered ({errors})"[:500], msgid="rpc.unavailable")


# Dead deposits (workers/funding.py): `failed` (a bad authorisation quarantined, a transfer that
# failed on chain, a rejection at send), `expired` (its authorisation ran out), `needs_human`.
DEPOSIT_DEAD = ("failed", "expired", "needs_human")


def _deposit_validation(settings: Any, row: dict[str, Any]) -> str | None:
    """Funding's own check of the user's authorisation (signature, amount, USDC contract, the billing
    contract as destination, nonce and expiry as admitted), run again with today's configuration: a
    deposit it refuses would be quarantined again on its first claim. Passing it (a configuration
    since put right) makes the row replayable. Only for dead rows with nothing live or applied: those
    refusals come first."""
    if row["status"] not in DEPOSIT_DEAD or row["live"] or row["deposit_tx"] is not None or row["applied"]:
        return None
    from paygate_cli.chain.contracts import BadAuthorization, check_deposit_auth
    from paygate_cli.errors import ConfigError

    missing = [name for name, value in (("PAYGATE_USDC_CONTRACT", settings.usdc_contract),
                                        ("PAYGATE_BILLING_CONTRACT", settings.billing_contract)) if not value]
    if missing:
        raise ConfigError(f"replay deposits checks each authorisation as funding does: set {' and '.join(missing)}")
    try:
        auth = check_deposit_auth(row["auth_entry"], account=row["account"], amount=int(row["amount"]),
                                  usdc=settings.usdc_contract or "", billing=settings.billing_contract or "",
                                  passphrase=settings.network_passphrase)
    except BadAuthorization as exc:
        return f"failed validation (bad authorisation: {exc}): the same call would fail again"
    if auth.nonce != int(row["auth_nonce"]) or auth.expiration_ledger != int(row["auth_expiration_ledger"]):
        return ("failed validation (bad authorisation: nonce/expiration differ from the admitted row): "
                "the same call would fail again")
    return None


def _deposit_refusal(conn: psycopg.Connection, chain: ChainClient | None, row: dict[str, Any]) -> str | None:
    if row["status"] not in DEPOSIT_DEAD:
        return f"not dead (status {row['status']})"
    if row["live"]:
        return f"lineage {', '.join(row['live'])} is not terminal: it could still land"
    if row["deposit_tx"] is not None or row["applied"]:
        return "effect already on chain: its deposit transaction applied"
    assert chain is not None
    from paygate_cli.chain.balances import nonce_consumed_by_quorum

    consumed, latest, answers = nonce_consumed_by_quorum(chain, row["account"], int(row["auth_nonce"]))
    _require_majority_answered(answers, int(row["auth_nonce"]))
    if consumed or any(v is True for v in answers.values()):
        return (f"effect already on chain: authorisation nonce {row['auth_nonce']} is consumed "
                f"(read endpoints: {answers})")
    if consumed is None:
        return f"cannot re-verify on chain: no majority of read endpoints answered alike ({answers})"
    if latest is not None and latest > int(row["auth_expiration_ledger"]):
        return f"authorisation expired at ledger {row['auth_expiration_ledger']} (latest {latest})"
    return None


# -- relays ----------------------------------------------------------------------------------------

# Dead: ended without a lineage of ours included on chain (workers/relay.py): `expired` (its
# authorisation ran out), `rejected` (quarantined), `needs_human` (its nonce was consumed elsewhere).
# A `failed` relay was included and its call trapped on chain (its fee burned and settled): replaying
# the same call would burn another fee for the same trap, so it is refused (the user re-submits).
RELAY_DEAD = ("expired", "rejected", "needs_human")
def _relay_refusal(conn: psycopg.Connection, chain: ChainClient | None, row: dict[str, Any]) -> str | None:
    if row["status"] == "failed":
        return ("not dead (status failed): its call was included and trapped on chain, its fee burned; "
                "the same call would fail again")
    if row["status"] not in RELAY_DEAD:
        return f"not dead (status {row['status']})"
    if row["live"]:
        return f"lineage {', '.join(row['live'])} is not terminal: it could still land"
    if row["applied"]:
        return f"effect already on chain: lineage {row['applied'][0]} applied"
    if not row["allowed"]:
        return f"{row['contract']}.{row['function']} is not on the relay allow-list: it would be rejected again"
    halts, reserved, budget = conn.execute(relays.REPLAY_ADMISSION_SQL).fetchone()
    if halts:
        return f"admission is halted ({halts}): a replay spends fees like an admission"
    if not row["reservation_open"] and int(reserved) + int(row["max_fee"]) > int(budget):
        return (f"fee budget cannot cover it: {reserved} of {budget} stroops reserved, "
                f"this relay needs {row['max_fee']}")
    assert chain is not None
    from paygate_cli.chain.balances import nonce_consumed_by_quorum

    latest: int | None = None
    for nonce in row["auth_nonces"]:
        consumed, seen, answers = nonce_consumed_by_quorum(chain, row["account"], int(nonce))
        _require_majority_answered(answers, int(nonce))
        if consumed or any(v is True for v in answers.values()):
            return (f"effect already on chain: authorisation nonce {nonce} is consumed "
                    f"(read endpoints: {answers})")
        if consumed is None:
            return f"cannot re-verify on chain: no majority of read endpoints answered alike ({answers})"
        latest = max(latest or 0, seen or 0)
    # The relay worker's own rule: a transaction built now lands at latest + 1 at the earliest.
    if latest is not None and latest >= int(row["auth_expiration_ledger"]):
        return f"authorisation expired at ledger {row['auth_expiration_ledger']} (latest {latest})"
    return None


def _relay_reserve(conn: psycopg.Connection, row: dict[str, Any]) -> str | None:
    """In the replay's transaction, after its CAS: reserve the fee again unless a reservation is
    still open. -> a refusal reason (the caller rolls the replay back) or None."""
    if conn.execute(relays.RESERVATION_OPEN_SQL, row).fetchone() is not None:
        return None
    if conn.execute(relays.TAKE_FEE_BUDGET_SQL, row).fetchone()[0] is None:
        return f"fee budget cannot cover it: this relay needs {row['max_fee']} stroops"
    conn.execute(relays.RESERVE_FEE_SQL, row)
    return None


# -- bot jobs --------------------------------------------------------------------------------------

# Dead: `dead` (max_attempts lineages proven dead, workers/relay_drainer.py) and `needs_human`. A
# `failed` job's call trapped on chain or could not work when simulated: the product queues a new job.
BOT_JOB_DEAD = ("dead", "needs_human")
def _bot_job_refusal(conn: psycopg.Connection, chain: ChainClient | None, row: dict[str, Any]) -> str | None:
    if row["status"] == "failed":
        return "not dead (status failed): its call cannot work as queued; queue a new job"
    if row["status"] not in BOT_JOB_DEAD:
        return f"not dead (status {row['status']})"
    if row["live"]:
        return f"lineage {', '.join(row['live'])} is not terminal: it could still land"
    if row["applied"]:
        return f"effect already on chain: lineage {row['applied'][0]} applied"
    if not row["allowed"]:
        return f"{row['contract']}.{row['function']} is not on the bot-job allow-list: it would fail again"
    return None


@dataclass(frozen=True)
class QueueSpec:
    name: str
    rows_sql: str  # params: ids (bigint[] or NULL = every dead row), since
    refusal: Callable[[psycopg.Connection, ChainClient | None, dict[str, Any]], str | None]
    replay_sql: str  # CAS on the status and updated_at read; params: the row
    needs_chain: bool  # refusals re-verify on chain
    event_sql: str | None = None  # an outbox event in the same transaction
    # More writes in the replay's transaction after its CAS won; a reason rolls the replay back.
    after: Callable[[psycopg.Connection, dict[str, Any]], str | None] | None = None
    dead: tuple[str, ...] = ()  # the statuses --all-dead selects (rows_sql's %(dead)s)
    # A refusal from configuration and the row alone, checked before `refusal`'s chain reads (None:
    # no opinion); it needs the settings, which `refusal` does not get.
    validate: Callable[[Any, dict[str, Any]], str | None] | None = None
    aliases: tuple[str, ...] = field(default_factory=tuple)


QUEUES: dict[str, QueueSpec] = {spec.name: spec for spec in (
    QueueSpec("webhooks", webhooks.REPLAY_ROWS_SQL, _webhook_refusal, webhooks.REPLAY_SQL, needs_chain=False,
              dead=("dead",), aliases=("webhook", "webhook_deliveries", "webhook_outbox")),
    QueueSpec("deposits", deposits.REPLAY_ROWS_SQL, _deposit_refusal, deposits.REPLAY_SQL, needs_chain=True,
              event_sql=deposits.REPLAY_EVENT_SQL, dead=DEPOSIT_DEAD, validate=_deposit_validation,
              aliases=("deposit", "deposits", "funding")),
    QueueSpec("relays", relays.REPLAY_ROWS_SQL, _relay_refusal, relays.REPLAY_SQL, needs_chain=True,
              event_sql=relays.REPLAY_EVENT_SQL, after=_relay_reserve, dead=RELAY_DEAD, aliases=("relay",)),
    QueueSpec("bot_jobs", bot_jobs.REPLAY_ROWS_SQL, _bot_job_refusal, bot_jobs.REPLAY_SQL, needs_chain=False,
              event_sql=bot_jobs.REPLAY_EVENT_SQL, dead=BOT_JOB_DEAD, aliases=("bot_job", "bot-jobs", "jobs")),
)}


def queue_spec(name: str) -> QueueSpec:
    wanted = name.replace("-", "_").lower()
    for spec in QUEUES.values():
        if wanted == spec.name or wanted in spec.aliases:
            return spec
    raise UsageError(f"unknown queue {name!r}; replayable queues: {', '.join(QUEUES)}", msgid="usage.unknown_queue")


def _public(row: dict[str, Any]) -> dict[str, Any]:
    keep = ("status", "attempts", "reason", "dead_reason", "event_type", "account", "amount", "idempotency_key",
            "contract", "function", "max_fee", "job_key")
    return {k: (str(v) if k == "amount" else v) for k, v in row.items() if k in keep and v is not None}


def plan(conn: psycopg.Connection, chain: ChainClient | None, spec: QueueSpec, *, ids: list[int] | None,
         since: Any, settings: Any = None) -> list[dict[str, Any]]:
    """Every selected row with its refusal reason (None: replayable). Reads only."""
    cursor = conn.execute(spec.rows_sql, {"ids": ids, "since": since, "dead": list(spec.dead)})
    names = [c.name for c in cursor.description or []]
    rows = [dict(zip(names, r, strict=True)) for r in cursor]
    if ids:
        missing = sorted(set(ids) - {r["id"] for r in rows})
        rows += [{"id": i, "missing": True} for i in missing]
    for row in rows:
        if row.get("missing"):
            row["refusal"] = "no such row"
            continue
        invalid = spec.validate(settings, row) if spec.validate is not None and settings is not None else None
        row["refusal"] = invalid or spec.refusal(conn, chain, row)
    return rows


# This transaction is a replay: queue_status_guard (sql/functions) lets a dead row's status go back
# to its start status only then (SET LOCAL: it ends with the transaction).
REPLAYING_SQL = "SELECT set_config('paygate.replaying', 'on', true)"


class _RolledBack(Exception):
    """Leaves a replay's transaction so it rolls back (the reason is kept by the caller)."""


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
            refused = None
            try:
                with conn.transaction():
                    conn.execute(REPLAYING_SQL)
                    won = conn.execute(spec.replay_sql, row).fetchone()
                    refused = None if won else "changed while replaying (re-run)"
                    if won and spec.after is not None:
                        refused = spec.after(conn, row)
                        if refused:
                            raise _RolledBack
                    if won:
                        record(conn, actor, f"replay.{spec.name}", f"{spec.name}:{row['id']}", {"was": _public(row)})
                        if spec.event_sql:
                            conn.execute(spec.event_sql, row)
            except _RolledBack:
                pass
            outcomes.append({"id": row["id"], "outcome": "refused", "reason": refused} if refused else
                            {"id": row["id"], "outcome": "replayed", "was": _public(row)})
        if progress is not None:
            progress(n, len(rows))
    return outcomes


def check_request(settings: Any, queue: str, *, ids: list[int] | None, all_dead: bool, since: Any) -> QueueSpec:
    """What is refused before the database is asked anything: an unknown queue, not exactly one of
    IDS and --all-dead, --since with IDS (2); for a queue re-verified on chain, fewer read hosts
    than the quorum rule asks for (78). -> the queue's spec."""
    spec = queue_spec(queue)
    if bool(ids) == all_dead:
        raise UsageError("give row IDS or --all-dead (one of them)", msgid="usage.replay_rows")
    if ids and since is not None:
        raise UsageError("--since goes with --all-dead, not with IDS")
    if spec.needs_chain:
        from paygate_cli.settings import require_read_quorum

        require_read_quorum(settings, f"replay {spec.name} refuses to decide",
                            "a row is replayed only when a majority of them re-verifies its effect is not on chain")
    return spec


def run(conn: psycopg.Connection, settings: Any, queue: str, *, ids: list[int] | None, all_dead: bool, since: Any,
        actor: str, dry_run: bool, confirm: Callable[[int], None],
        progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """The whole command over the caller's connection (the command runs check_request before opening
    it): plan, confirm (a count of replayable rows), replay."""
    spec = check_request(settings, queue, ids=ids, all_dead=all_dead, since=since)  # again: for every caller
    chain = None
    if spec.needs_chain:
        from paygate_cli.chain.rpc import ChainClient

        chain = ChainClient(settings, guard_conn=conn)
    try:
        rows = plan(conn, chain, spec, ids=ids or None, since=since, settings=settings)
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
    return {"queue": spec.name, "dry_run": dry_run, "all_dead_statuses": list(spec.dead) if all_dead else None,
            "counts": counts, "rows": outcomes}
