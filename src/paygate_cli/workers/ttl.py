"""The TTL keeper (docs/architecture.md §6 "TTL keeper"): keeps alive the ledger entries paygate's
money lives in (the billing contract's instance and code, its USDC balance in the SAC, and the
balance entry of every account with money on it), so none of them is ever archived under a
customer, and restores what was archived anyway.

Each tick, in order:

1. drives the lineages of its jobs and records what they proved: an applied job's fee is the day's
   rent (ttl_rent); a restore that applied makes its entries live again; an extend that failed on
   chain fails (its entries get a new job once due); a restore that failed on chain, or cannot be
   built at all, asks a human (its entries too, each with its key): exit 3;
2. sends the pending jobs through the engine (journal first, like every money path): restores first
   (a money path may be waiting on one; never held back by the budget, their rent still counts),
   then extends by urgency while the day's rent budget (PAYGATE_TTL_RENT_BUDGET) covers what each
   may cost (its simulation's fee); the first that does not fit stops the extends of the day, most
   urgent first, the rest left (ttl_rent.left_unextended, exit 1);
3. syncs ttl_entries: the contract's own entries always, a balance entry for every account with money
   on it;
4. reads up to PAYGATE_TTL_READS_PER_TICK entries (never read, due for an extension, then the least
   recently read, each about hourly) and records their liveUntilLedgerSeq;
5. decides: an entry that expires within PAYGATE_TTL_THRESHOLD gets an extend job (up to
   PAYGATE_TTL_KEYS_PER_TX keys each, most urgent first) to PAYGATE_TTL_EXTEND_TO ahead; an entry read
   archived gets one restore (paygate.request_restore: the same function a money path calls when
   its simulation answers with a restorePreamble); one archived again after its restore asks a human.

A job's lineage proven dead is one attempt (a starved one none) and the job is prepared again; after
MAX_ATTEMPTS an extend fails (a new one follows once due) and a restore asks a human.

Recovery does not take TTL jobs over: the keeper is a single writer, and its own next tick takes a
job whose lease lapsed (a keeper killed mid-tick) and drives its lineage. A minute-cadence queue among
recovery's would force recovery's grace above a minute plus an RPC timeout for every queue."""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from paygate_cli.context import TickContext, TickResult
from paygate_cli.crashpoints import crashpoint
from paygate_cli.db.connect import relaxed_transaction
from paygate_cli.errors import NeedsHuman, PaygateError, Unavailable
from paygate_cli.journal import lineage as lineages
from paygate_cli.queues import ttl as queue

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.authority import Policy
    from paygate_cli.chain.contracts import FootprintCall, SignedTransaction
    from paygate_cli.chain.rpc import SendOutcome
    from paygate_cli.journal.engine import Engine

HONOURS_DRAIN = True  # a drained instance drives what is in flight and sends nothing new
READ_EVERY = 3600.0  # seconds: each kept entry is read again about hourly (due ones sooner)
SYNC_ACCOUNTS_PER_TICK = 1000  # new accounts' balance entries registered per tick
MAX_ATTEMPTS = 5  # lineages of one job proven dead (starved ones not counted) before it stops


@dataclass
class TtlJob:
    id: int
    kind: str  # 'extend' | 'restore'
    keys_xdr: list[str]
    key_hashes: list[bytes]
    extend_to: int | None
    requested_by: str
    token: Any
    lineage_id: int | None
    attempts: int
    rent_estimate: int | None
    urgency: int | None  # the soonest live_until among its keys, as last read

    @property
    def entitlement(self) -> str:
        return f"ttl_job:{self.id}"

    @property
    def order(self) -> tuple[bool, bool, int, int]:
        """Restores first, then the most urgent extends (an entry never read first)."""
        return (self.kind != "restore", self.urgency is not None, self.urgency or 0, self.id)


class LeaseLost(PaygateError):
    msgid = "ttl.lease_lost"


class OverBudget(PaygateError):
    """What an extension may cost does not fit the day's rent budget: nothing is signed."""

    msgid = "ttl.over_budget"


@dataclass
class Budget:
    """The day's rent budget as this tick sees it: spent (receipts), what the jobs in flight may
    still cost, and the limit."""

    spent: int
    in_flight: int
    limit: int
    refused: int | None = None  # the cost of the first extension that did not fit this tick

    def fits(self, cost: int) -> bool:
        return self.spent + self.in_flight + cost <= self.limit


class KeeperJob:
    """What the journal engine needs from a TTL job (journal.engine.Job). An ExtendFootprintTTL or a
    RestoreFootprint carries no authorisation at all (chain/authority.py TTL)."""

    max_ledger: int | None = None  # no user authorisation: maxTime bounds it
    max_fee: int | None = None  # no fee reservation: max_inclusion_fee caps its bid
    hold_sql = queue.HOLD_SQL
    attach_sql = queue.ATTACH_SQL
    install_sql = lineages.NO_INSTALL
    hold_many_sql = queue.HOLD_MANY_SQL
    attach_many_sql = queue.ATTACH_MANY_SQL
    install_many_sql = lineages.NO_INSTALL

    def __init__(self, row: TtlJob, budget: Budget | None = None) -> None:
        self.row = row
        self.budget = budget  # extends only: checked on the signed bytes, before anything is anchored
        self.over_budget = False

    @property
    def purpose(self) -> str:
        return "restore" if self.row.kind == "restore" else "ttl_extend"

    @property
    def crash(self) -> str:
        return "ttl.restore" if self.row.kind == "restore" else "ttl"

    def params(self) -> dict[str, Any]:
        return {"id": self.row.id, "token": self.row.token}

    def row_key(self) -> tuple[int, Any]:
        return self.row.id, self.row.token

    def call(self, lane: str) -> FootprintCall:
        from paygate_cli.chain import ttl as chain_ttl

        if self.row.kind == "restore":
            return chain_ttl.restore_call(self.row.keys_xdr)
        assert self.row.extend_to is not None
        return chain_ttl.extend_call(self.row.keys_xdr, self.row.extend_to)

    def hold(self, conn: psycopg.Connection) -> bool:
        return conn.execute(queue.HOLD_SQL, self.params()).fetchone() is not None

    def on_abandon(self, conn: psycopg.Connection, lineage_id: int, why: str) -> None:
        conn.execute(queue.UNHOOK_SQL, {"id": self.row.id, "lineage": lineage_id})
        if self.row.lineage_id == lineage_id:
            self.row.lineage_id = None

    def on_sent(self, conn: psycopg.Connection, lineage_id: int, send: SendOutcome, terminal: bool) -> None:
        return None  # refused bytes are proven dead by resolve like any others: one attempt, then again

    def on_build_failure(self, conn: psycopg.Connection, lineage_id: int, exc: Exception) -> bool:
        if isinstance(exc, OverBudget) and self.row.rent_estimate is not None:
            conn.execute(queue.SET_ESTIMATE_SQL, {"id": self.row.id, "estimate": self.row.rent_estimate})
        return False

    @property
    def authority(self) -> Policy:
        from paygate_cli.chain.authority import TTL

        return TTL

    def check(self, signed: SignedTransaction) -> None:
        if self.budget is None or signed.fee is None:
            return
        self.row.rent_estimate = signed.resource_fee
        if not self.budget.fits(signed.fee):
            self.over_budget = True
            self.budget.refused = signed.fee
            raise OverBudget(f"extending {len(self.row.keys_xdr)} entries may cost {signed.fee} stroops: today's "
                             f"rent {self.budget.spent} + {self.budget.in_flight} in flight would pass the budget "
                             f"{self.budget.limit}")


@dataclass
class Deps:
    ctx: TickContext
    engine: Engine
    rows: list[TtlJob] = field(default_factory=list)  # what the tick claimed (their leases are renewed)
    renewed_at: float = 0.0
    fresh: list[bytes] = field(default_factory=list)  # keys whose TTL a job just changed: read this tick
    budget: Budget | None = None
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def conn(self) -> psycopg.Connection:
        return self.ctx.conn

    def count(self, outcome: str) -> str:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        return outcome


# -- claim, renew, release ---------------------------------------------------------------------------

def claim(ctx: TickContext) -> list[TtlJob]:
    """Claim up to `batch` pending jobs under a new lease (in flight first, then restores, then the
    most urgent extends), those whose lease lapsed included: a keeper killed mid-tick left them. The
    FOR UPDATE SKIP LOCKED claim is the CAS: a late write of an old owner matches nothing."""
    with relaxed_transaction(ctx.conn):
        rows = [TtlJob(*r) for r in ctx.conn.execute(queue.CLAIM_SQL, {
            "batch": ctx.batch, "lease": ctx.settings.funding_lease, "draining": ctx.draining})]
    return sorted(rows, key=lambda r: (r.lineage_id is None, *r.order))


def renew(deps: Deps) -> None:
    """Renew the claimed jobs' leases (one statement) unless the last renewal is fresh, so a slow RPC
    never lets recovery take a job from a live keeper."""
    lease = float(deps.ctx.settings.funding_lease)
    now = time.monotonic()
    if not deps.rows or now - deps.renewed_at < lease / 3:
        return
    with relaxed_transaction(deps.conn):
        deps.conn.execute(queue.RENEW_SQL, {"lease": lease, "ids": [r.id for r in deps.rows],
                                           "tokens": [r.token for r in deps.rows]})
    deps.renewed_at = now


def _release_all(deps: Deps) -> None:
    if not deps.rows:
        return
    with relaxed_transaction(deps.conn):
        deps.conn.execute(queue.RELEASE_SQL, {"ids": [r.id for r in deps.rows], "tokens": [r.token for r in deps.rows]})


# -- 1. drive the jobs in flight ---------------------------------------------------------------------

def drive(deps: Deps, rows: list[TtlJob], result: TickResult) -> list[TtlJob]:
    """Drive the lineages of `rows` and act on what each proved; returns the rows ready for a new
    lineage (theirs proven dead)."""
    from paygate_cli.journal.engine import LeaseLost as EngineLeaseLost

    if not rows:
        return []
    engine = deps.engine
    items = [(KeeperJob(row), engine.load(row.lineage_id)) for row in rows if row.lineage_id is not None]
    states = engine.drive_all(items)  # type: ignore[arg-type]
    again: list[TtlJob] = []
    for (job, lineage), state in zip(items, states, strict=True):
        row = job.row
        if isinstance(state, EngineLeaseLost):
            deps.count("lease_lost")
            result.failed += 1
            continue
        try:
            if isinstance(state, NeedsHuman):
                # The lineage itself needs a human (its envelope does not decrypt: resolve parked it and
                # fenced its lane). The job keeps pointing at it as the evidence.
                _finish(deps, row, "needs_human", f"its lineage {lineage.id} needs a human: {state}", lineage=lineage)
                result.needs_human += 1
                continue
            if state in ("applied", "failed"):
                done = engine.finished.get(lineage.id) or engine.load(lineage.id)
                result.needs_human += _landed(deps, row, done)
                result.processed += 1
                continue
            if state in lineages.LIVE_STATES:
                deps.count("waiting")
                continue
            if state == "abandoned":
                # Allocated, never anchored (its process died before the commit): the engine abandoned
                # it and on_abandon already unhooked it from the job. Nothing was signed, so no attempt.
                row.lineage_id = None
                again.append(row)
                continue
            with deps.conn.transaction():
                got = deps.conn.execute(queue.DEAD_LINEAGE_SQL, {"id": row.id, "token": row.token,
                                                                 "lineage": lineage.id}).fetchone()
                if got is None:
                    raise LeaseLost(f"ttl job {row.id}: lease lost")
            row.lineage_id, row.attempts = None, int(got[0])
            if row.attempts >= MAX_ATTEMPTS:
                why = f"{row.attempts} lineages proven dead (the last {lineage.state}: {lineage.resolution})"
                result.needs_human += _gave_up(deps, row, why)
                continue
            again.append(row)
        except LeaseLost:
            deps.count("lease_lost")
            result.failed += 1
    return again


def _landed(deps: Deps, row: TtlJob, lineage: lineages.Lineage) -> int:
    """A job's transaction was included: applied, or failed on chain (its fee paid either way).
    Returns the alarms raised (a restore that failed: 1)."""
    if lineage.state == "applied":
        _finish(deps, row, "applied", None, lineage=lineage,
                entries=(queue.RESTORED_SQL, {"hashes": row.key_hashes}) if row.kind == "restore" else None)
        deps.fresh += row.key_hashes  # their new liveUntil is read this tick
        return 0
    code = lineage.result_code or "failed"
    if row.kind == "extend":
        _finish(deps, row, "failed", f"ExtendFootprintTTL failed on chain ({code}); a new job follows once due",
                lineage=lineage)
        return 0
    reason = f"RestoreFootprint (ttl job {row.id}, lineage {lineage.id}) failed on chain ({code})"
    _finish(deps, row, "needs_human", reason, lineage=lineage,
            entries=(queue.RESTORE_FAILED_SQL, {"hashes": row.key_hashes, "reason": reason}))
    return 1


def _gave_up(deps: Deps, row: TtlJob, why: str) -> int:
    """MAX_ATTEMPTS lineages proven dead: an extend fails (a new job follows once its entries are
    due), a restore asks a human (a money path may be waiting on it)."""
    if row.kind == "extend":
        _finish(deps, row, "failed", why)
        return 0
    reason = f"restore (ttl job {row.id}) not landed: {why}"
    _finish(deps, row, "needs_human", reason, entries=(queue.RESTORE_FAILED_SQL, {"hashes": row.key_hashes,
                                                                                 "reason": reason}))
    return 1


def _finish(deps: Deps, row: TtlJob, status: str, reason: str | None, *, lineage: lineages.Lineage | None = None,
            entries: tuple[str, dict[str, Any]] | None = None) -> str:
    """The job's CAS and, in the statement's transaction, what only the winner may do: the day's rent
    (the fee the receipt proves) and the entries' new state."""
    fee = lineage.fee_charged if lineage is not None and lineage.state in ("applied", "failed") else None
    with deps.conn.transaction():
        done = deps.conn.execute(queue.FINISH_SQL, {
            "status": status, "reason": reason[:1000] if reason else None, "fee": fee, "id": row.id,
            "token": row.token, "lineage": lineage.id if lineage is not None else None}).fetchone()
        if done is None:
            raise LeaseLost(f"ttl job {row.id}: lease lost")
        if fee is not None:
            deps.conn.execute(queue.ADD_RENT_SQL, {"fee": int(fee)})
        if entries is not None:
            deps.conn.execute(*entries)
    deps.rows = [r for r in deps.rows if r.id != row.id]
    level = 20 if status == "applied" else 40 if status == "needs_human" else 30
    deps.ctx.log.log(level, "ttl job %s (%s of %d entries, asked by %s) %s%s", row.id, row.kind, len(row.keys_xdr),
                     row.requested_by, status, f": {reason}" if reason else "",
                     extra={"msgid": f"ttl.{status}", "ttl_job_id": row.id, "fee_charged": fee})
    return deps.count(status)


# -- 2. send the pending jobs ------------------------------------------------------------------------

def send(deps: Deps, rows: list[TtlJob], result: TickResult) -> None:
    """Restores first, then extends by urgency while the budget covers them; one job at a time
    through the engine's phases (each job's lease renewed before them)."""
    from paygate_cli.journal.engine import BuildFailed, LaneFailed, Prepared, RestorePending
    from paygate_cli.journal.engine import LeaseLost as EngineLeaseLost

    engine = deps.engine
    budget = deps.budget
    assert budget is not None
    for row in sorted(rows, key=lambda r: r.order):
        if row.kind == "extend" and (budget.refused is not None or
                                     (row.rent_estimate is not None and not budget.fits(row.rent_estimate))):
            if budget.refused is None:
                budget.refused = row.rent_estimate  # known from its last simulation: not simulated again
            deps.count("over_budget")
            continue
        renew(deps)
        job = KeeperJob(row, budget if row.kind == "extend" else None)
        allocation = engine.allocate_many([job], [row.entitlement])[0]
        if allocation is None:
            deps.count("no_free_lane")
            break  # every lane is busy: the rest wait for the next tick
        if isinstance(allocation, EngineLeaseLost):
            deps.count("lease_lost")
            result.failed += 1
            continue
        row.lineage_id = allocation.lineage_id
        try:
            outcome = engine.prepare(job, allocation)
        except EngineLeaseLost:
            deps.count("lease_lost")
            result.failed += 1
            continue
        if isinstance(outcome, Prepared):
            sent = engine.send_prepared([outcome])[0]
            if isinstance(sent, EngineLeaseLost):
                deps.count("lease_lost")
                result.failed += 1
                continue
            engine.flush_sent()  # its 'sent' mark now, before the next job's phases
            budget.in_flight += int(outcome.signed.fee or 0)
            with relaxed_transaction(deps.conn):  # shown by status; re-derivable from the next simulation
                deps.conn.execute(queue.SET_ESTIMATE_SQL, {"id": row.id, "estimate": outcome.resource_fee})
            deps.count("sent")
            result.processed += 1
        elif isinstance(outcome, LaneFailed):
            deps.count("lane_failed")  # the lane is fenced or passed over; the job waits for the next tick
        elif isinstance(outcome, RestorePending):
            # An extend met an entry archived since it was read: the engine asked for its restore
            # (restores go first), and the extend is prepared again after it.
            deps.count("restore_pending")
        elif isinstance(outcome, BuildFailed):
            if job.over_budget:
                deps.count("over_budget")
            elif row.kind == "extend":
                _finish(deps, row, "failed", f"the extension cannot be built: {outcome.reason}")
                result.failed += 1
            else:
                reason = f"the restore (ttl job {row.id}) cannot be built: {outcome.reason}"
                _finish(deps, row, "needs_human", reason,
                        entries=(queue.RESTORE_FAILED_SQL, {"hashes": row.key_hashes, "reason": reason}))
                result.needs_human += 1
        else:  # Expired: no ledger bound on a TTL job, so never; said plainly if it ever is
            raise AssertionError(f"ttl job {row.id}: unexpected prepare outcome {outcome!r}")


# -- 3. sync what is kept ----------------------------------------------------------------------------

def _b64(key: Any) -> str:
    """A LedgerKey as base64 XDR (chain/ttl.py's builders may give either)."""
    return key if isinstance(key, str) else key.to_xdr()


def key_hash(key_xdr: str) -> bytes:
    """ttl_entries.key_hash: sha256 of the LedgerKey's XDR bytes."""
    return hashlib.sha256(base64.b64decode(key_xdr)).digest()


def sync(deps: Deps) -> list[bytes]:
    """Register the contract's own entries (whatever the contract is now) and the balance entries
    of new accounts with money on them; returns the key hashes of the contract's own entries."""
    from paygate_cli.chain import ttl as chain_ttl

    settings, chain = deps.ctx.settings, deps.engine.chain
    billing, usdc = settings.billing_contract, settings.usdc_contract
    own: list[tuple[str, str]] = [("instance", _b64(chain_ttl.instance_key(billing)))]
    own.append(("code", _b64(chain_ttl.code_key(chain, billing))))
    if usdc:
        own.append(("sac_balance", _b64(chain_ttl.sac_balance_key(usdc, billing))))
    accounts = [a for (a,) in deps.conn.execute(queue.MISSING_ACCOUNTS_SQL, {"limit": SYNC_ACCOUNTS_PER_TICK})]
    rows = [(kind, key, None) for kind, key in own]
    rows += [("account_balance", _b64(chain_ttl.account_balance_key(billing, account)), account)
             for account in accounts]
    with relaxed_transaction(deps.conn):  # re-derived by the next tick if lost
        deps.conn.execute(queue.UPSERT_ENTRIES_SQL, {
            "hashes": [key_hash(key) for _, key, _ in rows], "keys": [key for _, key, _ in rows],
            "kinds": [kind for kind, _, _ in rows], "accounts": [account for _, _, account in rows]})
    return [key_hash(key) for _, key in own]


# -- 4. read ---------------------------------------------------------------------------------------

def read(deps: Deps, fixed: list[bytes], latest: int, due_before: int) -> int:
    """Read this tick's entries (READ_BATCH_SQL's order) and record them; returns how many."""
    from paygate_cli.chain import ttl as chain_ttl

    rows = deps.conn.execute(queue.READ_BATCH_SQL, {
        "fixed": fixed, "fresh": deps.fresh, "every": READ_EVERY, "due_before": due_before,
        "limit": int(deps.ctx.settings.ttl_reads_per_tick)}).fetchall()
    if not rows:
        return 0
    ttls = chain_ttl.read_ttls(deps.engine.chain, [key for _, key, *_ in rows])
    hashes, live_untils, archived, absent = [], [], [], []
    for hashed, key, *_ in rows:
        found = ttls.get(key)
        hashes.append(hashed)
        live_untils.append(found.live_until if found is not None else None)
        archived.append(bool(found is not None and found.archived))
        absent.append(found is None or bool(found.absent))
    with relaxed_transaction(deps.conn):  # a lost reading is read again
        deps.conn.execute(queue.UPDATE_READS_SQL, {"hashes": hashes, "live_untils": live_untils,
                                                   "archived": archived, "absent": absent, "ledger": latest})
    return len(rows)


# -- 5. decide -------------------------------------------------------------------------------------

def decide(deps: Deps, fixed: list[bytes], due_before: int, extend_to: int) -> int:
    """Restores for entries read archived, a human for one archived again, extends for the due ones;
    returns the alarms raised."""
    settings, conn = deps.ctx.settings, deps.conn
    per_tx = max(1, int(settings.ttl_keys_per_tx))
    alarms = 0
    with conn.transaction():
        archived = conn.execute(queue.ARCHIVED_SQL, {"fixed": fixed}).fetchall()
        first = [key for _, key, restored_at in archived if restored_at is None]
        for chunk in _chunks(first, per_tx):
            job_id = conn.execute(queue.REQUEST_RESTORE_SQL, {"keys": chunk, "by": "ttl"}).fetchone()[0]
            deps.ctx.log.warning("%d kept entries read archived: restore job %s", len(chunk), job_id,
                                 extra={"msgid": "ttl.archived", "ttl_job_id": job_id})
        again = [hashed for hashed, _, restored_at in archived if restored_at is not None]
        if again:
            for kind, account, key in conn.execute(queue.ARCHIVED_AGAIN_SQL, {"hashes": again}).fetchall():
                alarms += 1
                deps.ctx.log.error("%s entry%s archived again after its restore: a human is asked (key %s)", kind,
                                   f" of {account}" if account else "", key,
                                   extra={"msgid": "ttl.archived_again", "kind": kind, "account": account})
        due = [key for _, key in conn.execute(queue.DUE_SQL, {"fixed": fixed, "due_before": due_before})]
        for chunk in _chunks(due, per_tx):
            conn.execute(queue.INSERT_EXTEND_SQL, {"hashes": [key_hash(k) for k in chunk], "keys": chunk,
                                                   "extend_to": extend_to})
    if due:
        deps.outcomes["extend_jobs"] = deps.outcomes.get("extend_jobs", 0) + len(_chunks(due, per_tx))
    if first:
        deps.outcomes["restore_jobs"] = deps.outcomes.get("restore_jobs", 0) + len(_chunks(first, per_tx))
    return alarms


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


# -- the tick --------------------------------------------------------------------------------------

def _deps(ctx: TickContext) -> Deps:
    from paygate_cli.journal.engine import Engine

    return Deps(ctx, Engine.for_tick(ctx))


def tick(ctx: TickContext) -> TickResult:
    from paygate_cli.settings import ledgers

    settings = ctx.settings
    claimed_at = time.monotonic()
    rows = claim(ctx)
    crashpoint("ttl.after_claim")
    deps = _deps(ctx)
    deps.rows, deps.renewed_at = rows, claimed_at
    result = TickResult()
    try:
        ready = drive(deps, [r for r in rows if r.lineage_id is not None], result)
        ready += [r for r in rows if r.lineage_id is None and r not in ready]
        spent, in_flight = deps.conn.execute(queue.BUDGET_SQL).fetchone()
        deps.budget = Budget(int(spent), int(in_flight), int(settings.ttl_rent_budget))
        send(deps, [r for r in ready if r in deps.rows], result)
        fixed = sync(deps)
        latest = deps.engine.chain.latest_ledger().sequence
        due_before = latest + ledgers(float(settings.ttl_threshold))
        read(deps, fixed, latest, due_before)
        result.needs_human += decide(deps, fixed, due_before, ledgers(float(settings.ttl_extend_to)))
        deps.engine.sweep(queue.ORPHANS_SQL)
    except Unavailable:
        _release_all(deps)
        raise
    finally:
        deps.engine.chain.close()
    _release_all(deps)
    result.needs_human += deps.engine.needs_human
    stalls = [_left_unextended(deps)]
    if deps.outcomes.get("no_free_lane") or deps.engine.fee_capped:
        stalls.append(deps.engine.stall_reason())
    reasons = [s for s in stalls if s]
    result.stalled = "; ".join(reasons) if reasons else None
    result.details = dict(deps.outcomes)
    return result


def _left_unextended(deps: Deps) -> str | None:
    """Record the day's due entries the budget left unextended (0 when it covered them all); the
    stall reason when any was left."""
    budget = deps.budget
    assert budget is not None
    left = int(deps.conn.execute(queue.WAITING_KEYS_SQL).fetchone()[0]) if budget.refused is not None else 0
    with relaxed_transaction(deps.conn):  # re-derived by every tick
        deps.conn.execute(queue.SET_LEFT_SQL, {"left": left})
    if not left:
        return None
    reason = (f"{left} kept entries left unextended: today's rent {budget.spent} + {budget.in_flight} in flight "
              f"+ the next extension's {budget.refused} would pass the budget {budget.limit} stroops "
              "(PAYGATE_TTL_RENT_BUDGET); the most urgent go first, the rest tomorrow")
    deps.ctx.log.warning("%s", reason, extra={"msgid": "ttl.over_budget", "left_unextended": left})
    return reason
