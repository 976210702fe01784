"""Settlement: authorized charges -> one `charge_batch` per claim (docs/architecture.md §5).

A tick first drives the open batches whose lease has lapsed (resolve the lineage; a proven-dead one
hands its charges back for a new lineage, or fails them after `settlement_max_attempts`), then claims
new batches while lanes are free:

    claim + allocate (one statement) -> simulate, sign (no tx) -> anchor (tx) -> broadcast (no tx) -> mark sent (tx)

(everything after the claim is the shared engine's, journal/engine.py; BatchJob says what it means
for the batch's rows.)

The claim takes rows `WHERE status = 'authorized' AND claimed_at IS NULL AND lineage_id IS NULL`
and records the lineage on every row in the same statement (queues/charges.py CLAIM_SQL), so a row
with a lineage is never claimed again while that lineage could land. The worker never marks a charge
settled: the observer does, from the contract's events.

Batch sizing (why the default --batch is 48, not the contract's 100): each entry writes its
charge-id entry and each distinct account its balance entry, and Soroban allows 50 read-write
footprint keys (100 in all) and 16 KB of events per transaction. The claim trims its rows so
entries + distinct accounts <= 50 (25 charges of 25 different accounts, 49 of one account); if the
prepared footprint or the simulation still reports a resource limit, the batch is halved (the
dropped rows are handed back in the same lease) until it fits."""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from paygate_cli.context import TickContext, TickResult
from paygate_cli.crashpoints import crashpoint
from paygate_cli.errors import NeedsHuman, Unavailable
from paygate_cli.journal import lineage as lineages
from paygate_cli.journal.engine import Allocation, LeaseLost
from paygate_cli.queues import charges

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.authority import Policy
    from paygate_cli.chain.contracts import Invocation, SignedTransaction
    from paygate_cli.chain.keys import Signer
    from paygate_cli.chain.rpc import ChainClient, SendOutcome
    from paygate_cli.journal.engine import Engine, Prepared
    from paygate_cli.journal.keyring import Keyring

# Every statement that moves a charge's or a batch's row (claim, take over, hold, release, close,
# fail, needs_human) is the queue's, with its why: queues/charges.py. This module holds the flow.


@dataclass
class Entry:
    id: int
    account: str
    amount: int
    charge_id: bytes


@dataclass
class Deps:
    ctx: TickContext
    chain: ChainClient
    signer: Signer | None  # None in a take-over (take_over), which signs nothing
    keyring: Keyring
    engine: Engine
    outcomes: dict[str, int] = field(default_factory=dict)
    # Batches broadcast this tick whose lease on_sent did not release (the engine deferred the mark).
    unreleased: dict[int, uuid.UUID] = field(default_factory=dict)
    # Batches built and signed this tick, anchored together (one synchronous commit) and broadcast
    # once the tick has claimed all it will (_send_prepared).
    prepared: list[Prepared] = field(default_factory=list)

    @property
    def conn(self) -> psycopg.Connection:
        return self.ctx.conn

    @property
    def owner(self) -> str:
        return f"{self.ctx.instance_id}:{self.ctx.slot}"

    def count(self, outcome: str, n: int = 1) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n


@dataclass(frozen=True)
class Claim:
    wanted: int  # rows that would have fitted a batch (0: nothing to claim)
    lineage_id: int | None  # None: no free lane (or nothing to claim)
    lane: str | None
    rows: list[Entry]
    journal_seq: int | None = None  # the lane's highest sequence our journal knows consumed


def claim_sql(batch: int) -> str:
    """charges.CLAIM_SQL with the batch size and the footprint limits written in. They are constants of the
    process, and as parameters they cost a plan per claim: Postgres cannot cost a generic plan for
    LIMIT $n, so it planned this statement anew on every execution (~0.8 ms of a ~3 ms claim, a
    quarter of settlement's database time). Written in, the statement psycopg prepares is planned
    once per connection."""
    from paygate_cli.chain.charges import claim_estimate

    return _claim_sql(int(batch), tuple(sorted((name, int(v)) for name, v in claim_estimate().items())))


@functools.cache
def _claim_sql(batch: int, limits: tuple[tuple[str, int], ...]) -> str:
    sql = charges.CLAIM_SQL.replace("%(batch)s", str(batch))
    sql = sql.replace("%(period_share)s", str(max(1, batch // charges.PERIOD_SHARE)))
    for name, value in limits:
        sql = sql.replace(f"%({name})s", str(value))
    return sql


def claim(conn: psycopg.Connection, *, lanes: list[str], owner: str, token: uuid.UUID, batch: int,
          lease: float) -> Claim:
    """Claim up to `batch` rows with a new lineage on a free lane and open their batch, in one
    statement (claim_sql), outside any transaction of the caller's. A claim that lost a lane race
    wrote nothing and runs again (lineage.retry_lost_lane_race)."""
    params = {"lanes": sorted(lanes), "owner": owner, "token": token, "lease": lease,
              "entitlement": f"charge_batch:{token}"}
    result = lineages.retry_lost_lane_race(lambda: conn.execute(claim_sql(batch), params).fetchall(), None)
    if result is None:
        return Claim(1, None, None, [])  # other allocators took the lanes first, every attempt
    wanted, lineage_id, lane = int(result[0][0]), result[0][1], result[0][2]
    if lineage_id is None:
        return Claim(wanted, None, None, [])
    rows = [Entry(int(r[3]), r[4], int(r[5]), bytes(r[6])) for r in result]
    assert len(rows) == wanted, "rows locked FOR UPDATE changed under the claim"
    journal_seq = result[0][7]
    return Claim(wanted, int(lineage_id), str(lane), rows, None if journal_seq is None else int(journal_seq))


HONOURS_DRAIN = True  # a drained instance drives open batches and starts no new one

def take_over(ctx: TickContext, grace: float) -> dict[str, int]:
    """Recovery's entry: open batches whose lease lapsed more than `grace` seconds ago are driven
    through the same routine the worker uses (resolve the lineage; a proven-dead one hands its rows
    back), under a new lease."""
    if not ctx.conn.execute(charges.LAPSED_BATCHES_SQL, {"grace": grace}).fetchone()[0]:
        return {}
    from paygate_cli.journal.engine import Engine

    engine = Engine.for_takeover(ctx)  # drives and resends only: no lane or fee key
    deps = Deps(ctx, engine.chain, None, engine.keyring, engine)
    try:
        _drive_open_batches(deps, TickResult(), grace=grace, lapsed_only=True, limit=ctx.batch)
    finally:
        deps.chain.close()
    if deps.engine.needs_human:
        deps.count("lane_fenced", deps.engine.needs_human)
    return deps.outcomes


def tick(ctx: TickContext) -> TickResult:
    claimable, drivable, orphans = ctx.conn.execute(charges.HAS_WORK_SQL).fetchone()
    if ctx.draining:
        claimable = False  # a drained instance drives what is in flight and takes nothing new
    if not claimable and not drivable and not orphans:
        # Idle: no stellar_sdk import, one query. Orphans count as work: a live lineage no batch
        # holds any more (e.g. one parked for a human) is resolved by nobody else, and pins its lane.
        return TickResult()
    if not ctx.settings.billing_contract:
        from paygate_cli.errors import ConfigError

        raise ConfigError("PAYGATE_BILLING_CONTRACT is not set")  # before any claim: nothing to strand
    from paygate_cli.journal.engine import Engine

    engine = Engine.for_tick(ctx)
    deps = Deps(ctx, engine.chain, engine.signer, engine.keyring, engine)
    result = TickResult()
    try:
        if drivable:
            _drive_open_batches(deps, result)
        if orphans:
            deps.count("orphans_driven", deps.engine.sweep(charges.ORPHANS_SQL, limit=max(8, len(deps.engine.lanes))))
        started = 0
        # A batch whose lane failed for a lane reason is handed back and claimed again at once on
        # another lane (the failing lane is fenced); bounded by the number of lanes.
        retries = len(deps.engine.lanes)
        # Driving may have handed rows back (a dead lineage): claim them in this tick too.
        # One lane carries one transaction per ledger: a tick that may start fewer batches than there are
        # lanes leaves lanes idle for a ledger (0, the default, bounds it by the lanes alone).
        per_tick = int(ctx.settings.settlement_batches_per_tick) or len(deps.engine.lanes)
        while not ctx.draining and started < max(1, per_tick):
            step = _start_batch(deps, result)
            if step == "lane_failed" and retries > 0:
                retries -= 1
                continue
            if step != "prepared":
                break
            started += 1
        _send_prepared(deps)
        _release_sent(deps)
    finally:
        deps.chain.close()
    result.needs_human += deps.engine.needs_human
    if deps.engine.needs_human:
        deps.count("lane_fenced", deps.engine.needs_human)
    if deps.outcomes.get("no_free_lane") or deps.engine.fee_capped:  # no lane, or units over their fee cap
        result.stalled = deps.engine.stall_reason()
    result.details = deps.outcomes
    return result


# -- new batches -------------------------------------------------------------------------------------

class _Rollback(Exception):
    pass


@dataclass
class BatchJob:
    """One charge batch as the engine sees it (journal/engine.py's Job)."""

    deps: Deps
    lineage_id: int
    token: uuid.UUID
    rows: list[Entry]
    crash: str = "settlement"
    purpose: str = "charge_batch"
    max_ledger: int | None = None
    max_fee: int | None = None  # no fee bound of its own: max_inclusion_fee caps its bid
    built: Invocation | None = None  # the last call built (check() reads the footprint knowing it)
    released: bool = False  # on_sent released the lease (else the tick does, after the engine's flush)

    @property
    def authority(self) -> Policy:
        from paygate_cli.chain.authority import CHARGE_BATCH

        return CHARGE_BATCH  # the lane's operator authority over billing.charge_batch, nothing else

    def call(self, lane: str) -> Invocation:
        from paygate_cli.chain.charges import charge_batch

        rows = self.rows
        self.built = charge_batch(self.deps.ctx.settings.billing_contract, lane, [r.account for r in rows],
                                  [r.amount for r in rows], [r.charge_id for r in rows])
        return self.built

    def hold(self, conn: psycopg.Connection) -> bool:
        return conn.execute(charges.HOLD_BATCH_SQL, {"lineage": self.lineage_id, "token": self.token,
                                             "lease": self.deps.ctx.settings.settlement_lease}).fetchone() is not None

    # The engine's one-statement phases (journal/engine.py Job); hold() as SQL, and the set-based form the engine
    # anchors a tick's batches with in one statement. No attach SQL: the claim
    # allocates (charges.CLAIM_SQL), so the engine's allocate_many never sees a batch.
    hold_sql = charges.HOLD_BATCH_ROW_SQL
    install_sql = charges.RENEW_BATCH_AT_ANCHOR_SQL
    hold_many_sql = charges.HOLD_BATCHES_SQL
    install_many_sql = charges.RENEW_BATCHES_AT_ANCHOR_SQL

    def params(self) -> dict[str, object]:
        return {"batch_lineage": self.lineage_id, "batch_token": self.token,
                "batch_lease": self.deps.ctx.settings.settlement_lease}

    def row_key(self) -> tuple[int, uuid.UUID]:
        return self.lineage_id, self.token

    def on_abandon(self, conn: psycopg.Connection, lineage_id: int, why: str) -> None:
        # Never signed (or never anchored): its rows go back without counting an attempt.
        conn.execute(charges.UNCLAIM_SQL, {"lineage": lineage_id, "ids": None})
        _close(self.deps, lineage_id, self.token, "abandoned")

    def on_sent(self, conn: psycopg.Connection, lineage_id: int, send: SendOutcome, terminal: bool) -> None:
        conn.execute(charges.RELEASE_BATCH_LEASE_SQL, {"lineage": lineage_id, "token": self.token})
        self.released = True
        if send.status == "ERROR":
            # Not proof of anything by itself: the lineage is resolved (and, once proven dead, its
            # charges retried) on a later tick.
            self.deps.ctx.log.warning("charge_batch lineage %s: send answered %s", lineage_id, send.label,
                                      extra={"msgid": "settlement.send_error", "lineage_id": lineage_id})

    def on_build_failure(self, conn: psycopg.Connection, lineage_id: int, exc: Exception) -> bool:
        from paygate_cli.chain.charges import BatchTooLarge, is_resource_failure
        from paygate_cli.chain.contracts import RestoreRequired

        rows = self.rows
        # RestoreRequired: the archived entries do not fit this batch's transaction with it; a smaller
        # batch restores them on the way (ext v1), so the other accounts are not held back by a restore.
        resource = isinstance(exc, (BatchTooLarge, RestoreRequired)) or is_resource_failure(str(exc))
        if resource and len(rows) > 1:
            keep, drop = rows[: len(rows) // 2], rows[len(rows) // 2:]
            conn.execute(charges.UNCLAIM_SQL, {"lineage": lineage_id, "ids": [r.id for r in drop]})
            conn.execute(charges.SHRINK_BATCH_SQL, {"entries": len(keep), "lineage": lineage_id, "token": self.token})
            self.deps.ctx.log.warning("charge batch of %d exceeds a resource limit (%s); split to %d", len(rows),
                                      exc, len(keep), extra={"msgid": "settlement.batch_split",
                                                             "lineage_id": lineage_id})
            self.rows = keep
            crashpoint("settlement.after_split")
            return True
        return False

    def check(self, signed: SignedTransaction) -> None:
        from paygate_cli.chain.charges import check_resources

        check_resources(signed, self.built)  # the call just built: its footprint is read without a full decode


def _start_batch(deps: Deps, result: TickResult) -> str:
    """Claim one batch and take it as far as signed (the tick anchors and broadcasts its batches
    together: _send_prepared): prepared | lane_failed | no_free_lane | simulation_failed |
    lease_lost | empty."""
    from paygate_cli.journal.engine import BuildFailed, LaneFailed, Prepared, RestorePending

    ctx = deps.ctx
    batch = max(1, min(int(ctx.batch), 100))
    token = uuid.uuid4()
    # Relaxed: a claim lost in a database crash only frees its rows; the anchor's synchronous commit
    # flushes it before anything can be broadcast.
    claimed = claim(deps.conn, lanes=deps.engine.lanes, owner=deps.owner, token=token, batch=batch,
                    lease=ctx.settings.settlement_lease)
    if not claimed.wanted:
        return "empty"
    if claimed.lineage_id is None or claimed.lane is None:
        deps.count("no_free_lane")  # nothing was written: no lane, no claim
        return "no_free_lane"
    lineage_id, lane, rows = claimed.lineage_id, claimed.lane, claimed.rows
    crashpoint("settlement.after_claim")
    result.processed += len(rows)
    job = BatchJob(deps, lineage_id, token, rows)
    # Allocated just now: the claim statement opened the batch's lease and read the lane's journal
    # sequence, so the engine need not check the one or read the other again.
    allocation = Allocation(lineage_id, lane, claimed.journal_seq)
    try:
        outcome = deps.engine.prepare(job, allocation)
    except Unavailable:
        _give_back(deps, lineage_id, token, "the RPC was unavailable before anything was signed and journaled")
        _give_back_prepared(deps)
        raise
    except LeaseLost:
        deps.count("lease_lost")  # someone else has the batch: not a failure, not an alarm
        return "lease_lost"
    if isinstance(outcome, Prepared):
        deps.prepared.append(outcome)
        return "prepared"
    if isinstance(outcome, LaneFailed):
        deps.count("lane_failed")
        return "lane_failed"
    if isinstance(outcome, RestorePending):
        # One charge whose entries must be restored first: handed back (on_abandon), no attempt
        # counted; claimed again once the TTL keeper's restore lands.
        deps.count("restore_pending")
        return "restore_pending"
    if isinstance(outcome, BuildFailed):
        deps.ctx.log.error("charge_batch simulation failed, %d charges handed back: %s", len(job.rows),
                           outcome.reason, extra={"msgid": "settlement.simulation_failed", "lineage_id": lineage_id})
        deps.count("simulation_failed")
        result.failed += 1
        return "simulation_failed"
    raise AssertionError(f"unexpected outcome {outcome!r}")


def _send_prepared(deps: Deps) -> None:
    """Anchor the tick's signed batches in one transaction (one synchronous commit), then broadcast
    each. A batch whose lease was lost is anchored and sent by no one (someone else has it)."""
    if not deps.prepared:
        return
    try:
        results = deps.engine.send_prepared(deps.prepared)
    except Unavailable:
        _give_back_prepared(deps)
        raise
    prepared, deps.prepared = deps.prepared, []
    for unit, sent in zip(prepared, results, strict=True):
        job = cast(BatchJob, unit.job)
        if isinstance(sent, LeaseLost):
            deps.count("lease_lost")  # someone else has the batch: not a failure, not an alarm
            continue
        if not job.released:
            deps.unreleased[unit.lineage_id] = job.token
        deps.count("sent")


def _give_back_prepared(deps: Deps) -> None:
    """The RPC went away: hand back now the tick's signed batches that were never anchored (one
    that was anchored stays journaled and is resolved on a later tick: _give_back leaves it)."""
    prepared, deps.prepared = deps.prepared, []
    for unit in prepared:
        _give_back(deps, unit.lineage_id, cast(BatchJob, unit.job).token,
                   "the RPC was unavailable before it was anchored and broadcast")


def _release_sent(deps: Deps) -> None:
    """The engine's deferred 'sent' marks, then the leases of the tick's broadcast batches, released
    together (relaxed, one statement each). Skipped, a lease only lapses: the batch waits a lease."""
    deps.engine.flush_sent()
    if deps.unreleased:
        deps.conn.execute(charges.RELEASE_SENT_LEASES_SQL, {"lineages": list(deps.unreleased),
                                                    "tokens": list(deps.unreleased.values())})
        deps.unreleased.clear()


def _close(deps: Deps, lineage_id: int, token: uuid.UUID, outcome: str) -> None:
    """Close the batch under this process's lease (the CAS is the guard for what follows in the
    same transaction)."""
    closed = deps.conn.execute(charges.CLOSE_BATCH_SQL, {"outcome": outcome, "lineage": lineage_id, "token": token})
    if closed.rowcount != 1:
        raise LeaseLost(f"charge batch {lineage_id}: lease lost")


def _give_back(deps: Deps, lineage_id: int, token: uuid.UUID, why: str) -> None:
    """Hand a claimed batch back now (not after its lease) when its lineage was never anchored."""
    try:
        with deps.conn.transaction():
            if deps.conn.execute(charges.CLOSE_BATCH_SQL, {"outcome": "abandoned", "lineage": lineage_id,
                                                   "token": token}).rowcount != 1:
                return
            if not lineages.abandon(deps.conn, lineage_id, why):
                raise _Rollback  # anchored after all: roll back; a later tick resolves it
            deps.conn.execute(charges.UNCLAIM_SQL, {"lineage": lineage_id, "ids": None})
    except _Rollback:
        pass


# -- open batches ------------------------------------------------------------------------------------

def _drive_open_batches(deps: Deps, result: TickResult, *, grace: float = 0.0, lapsed_only: bool = False,
                        limit: int | None = None) -> None:
    """This queue's one take-over routine: the worker drives every open batch nobody holds; recovery
    (`lapsed_only`, past its grace) only those whose owner died holding the lease."""
    # One statement, relaxed: a lease taken and lost in a database crash just lapses again.
    batches = deps.conn.execute(charges.CLAIM_OPEN_BATCHES_SQL, {
        "limit": limit or max(8, len(deps.engine.lanes)), "lease": deps.ctx.settings.settlement_lease,
        "owner": deps.owner, "grace": grace, "lapsed_only": lapsed_only}).fetchall()
    applied: dict[int, uuid.UUID] = {}  # closed together after the loop
    in_flight: dict[int, uuid.UUID] = {}  # leases released together after the loop
    try:
        taken = [(row[0], lineages.Lineage(*row[1:])) for row in batches]
        # Driving never builds a transaction, so the batch's rows are not needed here (the engine only
        # resolves or abandons the lineage; on_abandon and the dead path act on the rows by lineage).
        # All at once: the receipts are recorded in one statement.
        states = deps.engine.drive_all([(BatchJob(deps, lineage.id, token, []), lineage) for token, lineage in taken])
        for (token, lineage), state in zip(taken, states, strict=True):
            if isinstance(state, LeaseLost):
                outcome = "lease_lost"  # someone else has the batch: not a failure, not an alarm
            elif isinstance(state, NeedsHuman):
                outcome = _needs_human(deps, lineage, token, state)  # that batch's alone (exit 3, once)
                if outcome == "needs_human":
                    result.needs_human += 1
            elif isinstance(state, Exception):
                raise state
            else:
                outcome = _driven(deps, lineage, token, state)
            if outcome == "applied":
                applied[lineage.id] = token
            elif outcome == "in_flight":
                in_flight[lineage.id] = token
            deps.count(outcome)
    finally:
        # Relaxed, one statement each; if they never run, the leases lapse and the next take-over
        # closes (or releases) them: a terminal lineage is not resolved again.
        if in_flight:
            deps.conn.execute(charges.RELEASE_SENT_LEASES_SQL, {"lineages": list(in_flight),
                                                        "tokens": list(in_flight.values())})
        if applied:
            closed = deps.conn.execute(charges.CLOSE_APPLIED_MANY_SQL, {"lineages": list(applied),
                                                                "tokens": list(applied.values())}).fetchall()
            lost = len(applied) - len(closed)
            if lost:  # someone else took the batch meanwhile: theirs to close
                deps.count("applied", -lost)
                deps.count("lease_lost", lost)


def _driven(deps: Deps, lineage: lineages.Lineage, token: uuid.UUID, state: str) -> str:
    """What the state the engine left a batch's lineage in means for the batch."""
    lineage_id = lineage.id
    if lineage.state == "allocated":
        # Never anchored: the engine abandoned it and job.on_abandon handed the rows back (no attempt used).
        return state
    if state in lineages.LIVE_STATES:
        return "in_flight"  # its lease is released with the others' (_drive_open_batches)
    if state == "applied":
        return "applied"  # landed: the observer promotes each charge from its event; closed with the others
    if state == "abandoned":
        with deps.conn.transaction():
            _close(deps, lineage_id, token, "abandoned")
            deps.conn.execute(charges.UNCLAIM_SQL, {"lineage": lineage_id, "ids": None})
        return "abandoned"
    # failed / expired / superseded: proven dead.
    why = f"lineage {lineage_id} {state}"
    with deps.conn.transaction():
        _close(deps, lineage_id, token, "dead")
        crashpoint("settlement.before_release_dead")
        released = deps.conn.execute(charges.RELEASE_DEAD_SQL, {"lineage": lineage_id, "max": _max_attempts(deps),
                                                        "why": why}).fetchall()
    failed = sum(1 for r in released if r[1] == "failed")
    if failed:
        deps.ctx.log.warning("%d charges failed after %d dead charge_batch attempts (balances restored)", failed,
                             _max_attempts(deps), extra={"msgid": "settlement.charges_failed",
                                                         "lineage_id": lineage_id})
    deps.count("charges_retried", len(released) - failed)
    deps.count("charges_failed", failed)
    return "dead"


def _needs_human(deps: Deps, lineage: lineages.Lineage, token: uuid.UUID, exc: NeedsHuman) -> str:
    """A finding about the batch's lineage itself (its envelope does not decrypt: resolve parked it
    and fenced its lane): the batch closes as handed to a human and its charges wait for one, still
    debited and never claimable again (their lineage may still land; the sweep drives it to what the
    chain proves). Guarded by the batch's lease."""
    reason = f"charge_batch lineage {lineage.id}: {exc}"[:1000]
    row = deps.conn.execute(charges.BATCH_NEEDS_HUMAN_SQL, {"lineage": lineage.id, "token": token, "reason": reason}
                            ).fetchone()
    if not row[0]:
        return "lease_lost"  # someone else has the batch now: theirs to report
    deps.ctx.log.error("charge batch (lineage %s) needs a human, %d charge(s) held: %s", lineage.id, row[1], exc,
                       extra={"msgid": exc.msgid, "lineage_id": lineage.id})
    return "needs_human"


def _max_attempts(deps: Deps) -> int:
    return max(1, int(deps.ctx.settings.settlement_max_attempts))
