"""Relay drainer: bot jobs, the permissionless contract calls the product queues (e.g. closing the
market's expired orders), each sent as one lineage at a time from a lane, carrying no
authorisation at all, through the journal engine (the same rules as every money path). Only
functions on the bot-job allow-list (paygate.bot_job_allowlist, not the relay's) are admitted and
sent.

- A job's lineage applied -> `applied`; included but failed on chain -> `failed` (the call ran and
  trapped: resending it would fail again), with the fee recorded.
- A lineage proven dead (expired / superseded / abandoned) counts one attempt; after
  max_attempts (relay_config.bot_job_max_attempts unless the job says otherwise) the job is
  `dead` (replayable), otherwise the next tick prepares a new lineage.
- Simulation refuses the call (e.g. the order is not expired yet, or already closed) -> `failed`
  with the reason: the call cannot work now; the product queues a new job if it wants to retry.
- The call needs anyone's authorisation (the simulation recorded an entry: a user's, or the
  lane's own SOURCE_ACCOUNT one) -> `failed`, nothing anchored or sent (chain/authority.py).
Dedup is per job key at admission (paygate.admit_bot_job)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from paygate_cli.context import TickContext, TickResult
from paygate_cli.crashpoints import crashpoint
from paygate_cli.db.connect import relaxed_transaction
from paygate_cli.errors import NeedsHuman, PaygateError, Unavailable
from paygate_cli.journal import lineage as lineages
from paygate_cli.queues import bot_jobs

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.authority import Policy
    from paygate_cli.chain.contracts import Invocation, SignedTransaction
    from paygate_cli.chain.rpc import SendOutcome
    from paygate_cli.journal.engine import Engine

# The statements that move the queue's rows are queues/bot_jobs.py's; this module holds the flow.
EMIT_SQL = "SELECT paygate.emit_event(%s, %s)"


@dataclass
class BotJob:
    id: int
    job_key: str
    contract: str
    function: str
    args_xdr: str
    token: Any
    lineage_id: int | None
    attempts: int
    max_attempts: int
    pending_failure: str | None
    allowed: bool  # still on the bot-job allow-list at claim time

    @property
    def entitlement(self) -> str:
        return f"bot_job:{self.id}"


class LeaseLost(PaygateError):
    msgid = "relay_drainer.lease_lost"


class DrainerJob:
    """What the journal engine needs from a bot job (journal.engine.Job)."""

    crash = "relay_drainer"
    purpose = "relay"
    max_ledger: int | None = None  # no user authorisation: maxTime bounds it
    max_fee: int | None = None  # no fee reservation: max_inclusion_fee caps its bid
    # The engine's one-statement phases: the lease check as hold() makes it, the job's pointer
    # recorded with the allocation; nothing of the job's commits with the envelope (it already
    # points at its lineage).
    hold_sql = bot_jobs.HOLD_SQL
    attach_sql = bot_jobs.ATTACH_SQL
    install_sql = lineages.NO_INSTALL
    hold_many_sql = bot_jobs.HOLD_MANY_SQL
    attach_many_sql = bot_jobs.ATTACH_MANY_SQL
    install_many_sql = lineages.NO_INSTALL

    def __init__(self, row: BotJob) -> None:
        self.row = row

    def params(self) -> dict[str, Any]:
        return {"id": self.row.id, "token": self.row.token}

    def row_key(self) -> tuple[int, Any]:
        return self.row.id, self.row.token

    def call(self, lane: str) -> Invocation:
        from paygate_cli.chain.relay import bot_job_invocation

        return bot_job_invocation(self.row.contract, self.row.function, self.row.args_xdr)

    def hold(self, conn: psycopg.Connection) -> bool:
        return conn.execute(bot_jobs.HOLD_SQL, {"id": self.row.id, "token": self.row.token}).fetchone() is not None

    def on_abandon(self, conn: psycopg.Connection, lineage_id: int, why: str) -> None:
        # Abandoned before anchoring: nothing was sent, so it is not a proven-dead attempt. Only
        # the pointer goes.
        conn.execute(bot_jobs.UNHOOK_SQL, {"id": self.row.id, "lineage": lineage_id})
        if self.row.lineage_id == lineage_id:
            self.row.lineage_id = None

    def on_sent(self, conn: psycopg.Connection, lineage_id: int, send: SendOutcome, terminal: bool) -> None:
        if terminal:
            reason = f"bot job transaction rejected by the network: {send.code}"
            conn.execute(bot_jobs.SET_PENDING_FAILURE_SQL,
                         {"reason": reason, "id": self.row.id, "token": self.row.token})
            self.row.pending_failure = reason

    def on_build_failure(self, conn: psycopg.Connection, lineage_id: int, exc: Exception) -> bool:
        return False

    @property
    def authority(self) -> Policy:
        from paygate_cli.chain.authority import BOT_JOB

        return BOT_JOB  # no authorisation at all: the engine refuses any entry, the lane's own included

    def check(self, signed: SignedTransaction) -> None:
        return None  # what authority the envelope carries is the engine's check (chain/authority.py)


@dataclass
class Deps:
    ctx: TickContext
    engine: Engine
    rows: list[BotJob] = field(default_factory=list)  # what the tick claimed (their leases are renewed)
    renewed_at: float = 0.0  # time.monotonic() of the last renewal (only to skip a needless one)

    @property
    def conn(self) -> psycopg.Connection:
        return self.ctx.conn


HONOURS_DRAIN = True  # a drained instance drives what is in flight and claims nothing new


def claim(ctx: TickContext, *, grace: float = 0.0, lapsed_only: bool = False) -> list[BotJob]:
    """Claim up to `batch` jobs under a new lease: free ones (unless `lapsed_only`) and those whose
    lease lapsed more than `grace` seconds ago. The FOR UPDATE SKIP LOCKED claim is the CAS: the
    old lease token is replaced, so a late write of the old owner matches nothing."""
    with relaxed_transaction(ctx.conn):
        return [BotJob(*r) for r in ctx.conn.execute(bot_jobs.CLAIM_SQL, {
            "batch": ctx.batch, "lease": ctx.settings.funding_lease, "owner": f"{ctx.instance_id}:{ctx.slot}",
            "draining": ctx.draining, "grace": grace, "lapsed_only": lapsed_only})]


def _deps(ctx: TickContext, *, takeover: bool = False) -> tuple[Deps, Any]:
    from paygate_cli.journal.engine import Engine

    # A take-over drives the lineage in flight only: no lane or fee key (Engine.for_takeover).
    engine = Engine.for_takeover(ctx) if takeover else Engine.for_tick(ctx)
    return Deps(ctx, engine), engine.chain


def _advance_all(deps: Deps, rows: list[BotJob], result: TickResult, *, new_work: bool) -> dict[str, int]:
    from paygate_cli.journal.engine import LeaseLost as EngineLeaseLost

    outcomes: dict[str, int] = {}
    for row in rows:
        renew(deps)  # each job waits on the RPC: the ones after it keep their lease meanwhile
        try:
            outcome = advance(deps, row, new_work=new_work)
        except (LeaseLost, EngineLeaseLost):
            outcome = "lease_lost"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        result.processed += 1
        if outcome == "lease_lost":
            result.failed += 1
        elif outcome == "needs_human":
            result.needs_human += 1
    return outcomes


def renew(deps: Deps) -> None:
    """Renew the lease of every job the tick claimed (one statement) unless the last renewal is
    fresh (under a third of the lease ago: the host clock only decides whether to ask, the lease
    itself is database time), so a slow RPC never lets recovery take a job from a live worker."""
    lease = float(deps.ctx.settings.funding_lease)
    now = time.monotonic()
    if not deps.rows or now - deps.renewed_at < lease / 3:
        return
    with relaxed_transaction(deps.conn):  # a renewal lost in a database crash only lets a lease lapse
        deps.conn.execute(bot_jobs.RENEW_SQL, {"lease": lease, "ids": [r.id for r in deps.rows],
                                      "tokens": [r.token for r in deps.rows]})
    deps.renewed_at = now


def take_over(ctx: TickContext, grace: float) -> dict[str, int]:
    """Recovery's entry: jobs whose lease lapsed more than `grace` seconds ago are claimed through
    the worker's own claim and driven by the worker's own step, limited to the lineage in flight
    (resolve it, resend its same bytes, record what it proved); never a new lineage, so no lane or
    fee key. The jobs are then handed back to the worker."""
    claimed_at = time.monotonic()
    rows = claim(ctx, grace=grace, lapsed_only=True)
    if not rows:
        return {}
    deps, chain = _deps(ctx, takeover=True)
    deps.rows, deps.renewed_at = rows, claimed_at
    try:
        outcomes = _advance_all(deps, rows, TickResult(), new_work=False)
    finally:
        chain.close()
        _release_all(deps, rows)
    if deps.engine.needs_human:
        outcomes["lane_fenced"] = deps.engine.needs_human
    return outcomes


def _idle(ctx: TickContext) -> TickResult:
    """Nothing to claim: still drive the lineages no queued row holds any more (journal.engine)."""
    from paygate_cli.journal.engine import sweep_when_idle

    swept = sweep_when_idle(ctx, bot_jobs.ORPHANS_SQL)
    if swept is None:
        return TickResult()
    driven, alarms = swept
    return TickResult(needs_human=alarms, details={"orphans_driven": driven})


def tick(ctx: TickContext) -> TickResult:
    claimed_at = time.monotonic()
    rows = claim(ctx)
    if not rows:
        return _idle(ctx)
    crashpoint("relay_drainer.after_claim")
    deps, chain = _deps(ctx)
    deps.rows, deps.renewed_at = rows, claimed_at  # the claim's lease is the first renewal
    result = TickResult()
    try:
        outcomes = _advance_all(deps, rows, result, new_work=True)
        deps.engine.sweep(bot_jobs.ORPHANS_SQL)
    except Unavailable:
        _release_all(deps, rows)
        raise
    finally:
        chain.close()
    _release_all(deps, rows)
    result.needs_human += deps.engine.needs_human
    if outcomes.get("no_free_lane") or deps.engine.fee_capped:  # no lane, or units over their fee cap
        result.stalled = deps.engine.stall_reason()
    result.details = outcomes
    return result


def _release_all(deps: Deps, rows: list[BotJob]) -> None:
    with relaxed_transaction(deps.conn):
        deps.conn.execute(bot_jobs.RELEASE_SQL, {"ids": [r.id for r in rows], "tokens": [r.token for r in rows]})


def advance(deps: Deps, row: BotJob, *, new_work: bool = True) -> str:
    """Everything the journal and the chain allow for one job now; returns what happened.
    `new_work=False` (recovery) stops before a new lineage: only the one in flight is driven."""
    from paygate_cli.journal.engine import BuildFailed, LaneFailed, Prepared, RestorePending
    from paygate_cli.journal.engine import LeaseLost as EngineLeaseLost

    engine = deps.engine
    job = DrainerJob(row)
    if row.lineage_id is not None:
        lineage = engine.load(row.lineage_id)
        try:
            state = engine.drive(job, lineage)
        except NeedsHuman as exc:
            # A finding about the lineage itself (its envelope does not decrypt: resolve parked it and
            # fenced its lane). The job keeps pointing at it as the evidence; the sweep drives it to
            # whatever the chain proves, and the job waits for a human.
            return _finish(deps, row, "needs_human", str(exc), lineage=lineage)
        if state in ("applied", "failed"):
            done = engine.load(lineage.id)
            reason = None if state == "applied" else f"bot job call failed on chain ({done.result_code})"
            return _finish(deps, row, state, reason, lineage=done)
        if state in lineages.LIVE_STATES:
            return "waiting"
        if row.lineage_id is not None:  # proven dead after it was sent: one attempt spent
            with deps.conn.transaction():
                got = deps.conn.execute(bot_jobs.DEAD_LINEAGE_SQL, {"id": row.id, "token": row.token,
                                                           "lineage": lineage.id}).fetchone()
                if got is None:
                    raise LeaseLost(f"bot job {row.id}: lease lost")
            row.lineage_id, row.attempts = None, int(got[0])
    if row.pending_failure:
        return _finish(deps, row, "failed", row.pending_failure)
    if row.attempts >= row.max_attempts:
        return _finish(deps, row, "dead", f"{row.attempts} lineages proven dead (max {row.max_attempts})")
    if not new_work:
        return "released"  # nothing in flight: the worker prepares the next lineage
    if not row.allowed:
        return _finish(deps, row, "failed", f"{row.contract}.{row.function} is not on the bot-job allow-list")
    # One job at a time through the set-based phases (a list of one): each job's lease is renewed
    # before its phase, and a crash point fires with the jobs after it untouched.
    allocation = engine.allocate_many([job], [row.entitlement])[0]
    if allocation is None:
        return "no_free_lane"
    if isinstance(allocation, EngineLeaseLost):
        raise allocation
    row.lineage_id = allocation.lineage_id
    outcome = engine.prepare(job, allocation)
    if isinstance(outcome, Prepared):
        sent = engine.send_prepared([outcome])[0]
        if isinstance(sent, EngineLeaseLost):
            raise sent
        engine.flush_sent()  # its 'sent' mark now, before the next job's phases
        return "sent"
    if isinstance(outcome, LaneFailed):
        return "lane_failed"
    if isinstance(outcome, RestorePending):
        return "restore_pending"  # handed back, no attempt: built again once the restore lands
    assert isinstance(outcome, BuildFailed)  # no max_ledger: never Expired
    if outcome.reason.startswith("authority refused"):
        # The call needs someone's authorisation (recorded by the simulation): not permissionless,
        # and never sent. Retrying cannot change that.
        return _finish(deps, row, "failed", f"not a permissionless call: {outcome.reason}")
    return _finish(deps, row, "failed", f"the call cannot work now: {outcome.reason}")


def _finish(deps: Deps, row: BotJob, status: str, reason: str | None, *,
            lineage: lineages.Lineage | None = None) -> str:
    with deps.conn.transaction():
        done = deps.conn.execute(bot_jobs.FINISH_SQL, {
            "status": status, "reason": reason[:1000] if reason else None,
            "fee": lineage.fee_charged if lineage else None, "tx": lineage.inner_hash if lineage else None,
            "id": row.id, "token": row.token, "lineage": lineage.id if lineage else None}).fetchone()
        if done is None:
            raise LeaseLost(f"bot job {row.id}: lease lost")
        deps.conn.execute(EMIT_SQL, (f"bot_job.{status}", Jsonb({
            "bot_job_id": row.id, "job_key": row.job_key, "contract": row.contract, "function": row.function,
            "reason": reason, "fee_charged": lineage.fee_charged if lineage else None})))
    level = 20 if status == "applied" else 40 if status == "needs_human" else 30
    deps.ctx.log.log(level, "bot job %s (%s) %s%s", row.id, row.job_key, status, f": {reason}" if reason else "",
                     extra={"msgid": f"relay_drainer.{status}", "bot_job_id": row.id})
    return status
