"""Funding: a user's signed SAC transfer authorisation -> USDC into the billing contract -> credit.

Phases (docs/architecture.md §5): claim (tx) -> nonce check and prepare (no tx) -> anchor (tx) -> broadcast
(no tx) -> resolve -> credit as its own lineage -> settle (tx). Every step is re-entrant: a tick
looks at what the journal and the chain prove and does the next thing, so a process killed at
any point is picked up by the next tick once its lease lapses.

The safety-critical sequence (allocate, sign, anchor under the lease, broadcast, resolve) is the
shared engine's (journal/engine.py); this module says what each outcome means for a deposit. The
credit phase has its own crash points (funding.credit.*). Live funding lineages no pending row
holds any more (the observer won the credit race) are swept to a terminal state every tick."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from paygate_cli.context import TickContext, TickResult
from paygate_cli.crashpoints import crashpoint
from paygate_cli.errors import NeedsHuman, Unavailable
from paygate_cli.journal import lineage as lineages
from paygate_cli.journal.engine import LeaseLost
from paygate_cli.queues import deposits

if TYPE_CHECKING:
    from collections.abc import Callable

    import psycopg

    from paygate_cli.chain.authority import Policy
    from paygate_cli.chain.keys import Signer
    from paygate_cli.chain.rpc import ChainClient
    from paygate_cli.journal.engine import Allocation, Driven, Engine, Job, Prepared
    from paygate_cli.journal.keyring import Keyring

# Every statement that moves a deposit's row (claim, renew, attach, release, finish, settle) is the
# queue's, with its why: queues/deposits.py. This module holds the flow of the phases.
EMIT_SQL = "SELECT paygate.emit_event(%s, %s)"


@dataclass
class Deposit:
    id: int
    account: str
    amount: int
    auth_entry: str
    auth_nonce: int
    auth_expiration_ledger: int
    token: Any
    deposit_lineage_id: int | None
    credit_lineage_id: int | None
    deposit_tx: bytes | None
    pending_failure: str | None
    # The lineage the row pointed at when claimed (credit's, else deposit's), read with the claim.
    lineage: lineages.Lineage | None = None

    def lineage_for(self, conn: psycopg.Connection, lineage_id: int) -> lineages.Lineage:
        """The row's lineage as read with the claim (the lease stops anyone else from anchoring or
        abandoning it since; resolvers' transitions are CAS), else from the journal."""
        if self.lineage is not None and self.lineage.id == lineage_id:
            return self.lineage
        return lineages.load(conn, lineage_id)

    @property
    def entitlement_deposit(self) -> str:
        return f"deposit:{self.id}:deposit"

    @property
    def entitlement_credit(self) -> str:
        return f"deposit:{self.id}:credit"


@dataclass
class Deps:
    ctx: TickContext
    chain: ChainClient
    signer: Signer | None  # None in a take-over (drive_taken_over), which signs nothing
    keyring: Keyring
    engine: Engine
    free_lanes: int = 0  # lanes with nothing in flight: a row needing a new transaction waits for one
    lane_failures: int = 0
    # The tick's fresh deposits' authorisation nonces, read in one getLedgerEntries:
    # deposit id -> (consumed on chain?, latest ledger of that read).
    nonces: dict[int, tuple[bool, int]] = field(default_factory=dict)
    # Deposit and credit transactions built and signed this tick, anchored together (one
    # synchronous commit) and broadcast once every row has been advanced (tick).
    prepared: list[Prepared] = field(default_factory=list)
    ready: list[Ready] = field(default_factory=list)  # phases that may start a new lineage this tick
    settling: list[Deposit] = field(default_factory=list)  # deposits whose credit applied this tick
    # The states _drive_in_flight left the tick's lineages in (lineage id -> state, or what stopped
    # that row), read by advance().
    driven: dict[int, Driven] = field(default_factory=dict)

    @property
    def conn(self) -> psycopg.Connection:
        return self.ctx.conn


# Recovery (workers/recovery.py) takes over through take_over() below: this queue's one take-over
# routine, the worker's own claim (lapsed rows only) and the engine's drive of what is in flight.
HONOURS_DRAIN = True  # a drained instance drives what is in flight and claims no fresh row


def claim(ctx: TickContext, *, grace: float = 0.0, lapsed_only: bool = False) -> list[Deposit]:
    """Claim up to `batch` rows under a new lease: free rows (unless `lapsed_only`) and rows whose
    lease lapsed more than `grace` seconds ago. The FOR UPDATE SKIP LOCKED claim is the CAS: the
    old lease token is replaced, so its late writes match nothing."""
    rows = lineages.one_statement(ctx.conn, deposits.CLAIM_SQL + deposits.RELAXED, {
        "batch": ctx.batch, "lease": ctx.settings.funding_lease, "owner": f"{ctx.instance_id}:{ctx.slot}",
        "draining": ctx.draining, "grace": grace, "lapsed_only": lapsed_only}).fetchall()
    width = len(lineages.LINEAGE_COLUMNS)
    return [Deposit(r[0], r[1], int(r[2]), *r[3:11],
                    lineage=lineages.Lineage(*r[11:11 + width]) if r[11] is not None else None)
            for r in rows]


def take_over(ctx: TickContext, grace: float) -> dict[str, int]:
    """Recovery's entry: rows whose lease lapsed more than `grace` seconds ago are claimed with the
    worker's own claim and their lineage in flight driven (drive_taken_over). -> outcome counts."""
    rows = claim(ctx, grace=grace, lapsed_only=True)
    return drive_taken_over(ctx, rows) if rows else {}


def drive_taken_over(ctx: TickContext, rows: list[Deposit]) -> dict[str, int]:
    """Recovery's step for rows taken over from a dead owner: drive the lineage in flight through
    the engine (resolve: record what the chain proves, or resend the same bytes), then release the
    rows to the worker. Never starts a new transaction for an entitlement, so it holds no lane or
    fee key (Engine.for_takeover: the journal keyring decrypts the bytes it resends)."""
    from paygate_cli.journal.engine import Engine

    engine = Engine.for_takeover(ctx)
    deps = Deps(ctx, engine.chain, None, engine.keyring, engine)
    outcomes: dict[str, int] = {}
    try:
        for row in rows:
            purpose = "credit" if row.credit_lineage_id is not None else "deposit"
            lineage_id = row.credit_lineage_id or row.deposit_lineage_id
            outcome = "released"
            if lineage_id is not None:
                # Through _step: a finding (an envelope that does not decrypt) makes the row needs_human.
                outcome = _step(deps, row, _drive_in_flight_one, row, purpose, lineage_id)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    finally:
        deps.chain.close()
        _release_all(deps, rows)
    if deps.engine.needs_human:
        outcomes["lane_fenced"] = deps.engine.needs_human
    return outcomes


def _drive_in_flight_one(deps: Deps, row: Deposit, purpose: str, lineage_id: int) -> str:
    return f"{purpose}_{_drive(deps, row, lineages.load(deps.conn, lineage_id), purpose)}"


def tick(ctx: TickContext) -> TickResult:
    rows = claim(ctx)
    if not rows and ctx.conn.execute(deposits.ORPHANS_SQL, {"limit": 1}).fetchone() is None:
        return TickResult()
    if rows:
        crashpoint("funding.after_claim")
    # Heavy imports only now that there is chain work (an idle tick never loads stellar_sdk).
    from paygate_cli.journal.engine import Engine

    engine = Engine.for_tick(ctx)
    deps = Deps(ctx, engine.chain, engine.signer, engine.keyring, engine)
    free, orphans = ctx.conn.execute(deposits.FREE_LANES_AND_ORPHANS_SQL, {"lanes": sorted(deps.engine.lanes),
                                                                 "limit": 1}).fetchone()
    deps.free_lanes = int(free)
    # Rows with a transaction in flight first: resolving them frees lanes for the new ones.
    rows.sort(key=lambda r: (r.deposit_lineage_id is None and r.credit_lineage_id is None, r.id))
    result = TickResult()
    outcomes: dict[str, int] = {}

    def count(outcome: str) -> None:
        if outcome in ("prepared", "ready", "settling"):
            return  # counted when sent (or when its allocation says otherwise)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        result.processed += 1
        if outcome == "needs_human":
            result.needs_human += 1

    try:
        _read_nonces(deps, rows)
        if orphans:
            outcomes["orphans_driven"] = deps.engine.sweep(deposits.ORPHANS_SQL, limit=max(8, len(deps.engine.lanes)))
            deps.free_lanes = lineages.free_lane_count(ctx.conn, list(deps.engine.lanes))
        _drive_in_flight(deps, rows)
        for row in rows:
            count(_step(deps, row, advance, row))
        for outcome in _settle_all(deps):
            count(outcome)
        # The phases ready for a new lineage: their lanes in one statement (credits first: finishing a
        # deposit before starting another), then each built and signed.
        ready = sorted(deps.ready, key=lambda r: r.job.purpose != "credit")
        deps.ready = []
        if ready:
            allocations = deps.engine.allocate_many([r.job for r in ready], [r.entitlement for r in ready])
            for item, allocation in zip(ready, allocations, strict=True):
                count(_step(deps, item.job.row, _prepare_and_send, item, allocation))
        prepared, deps.prepared = deps.prepared, []
        for unit, sent in zip(prepared, deps.engine.send_prepared(prepared), strict=True):
            count("lease_lost" if isinstance(sent, LeaseLost) else f"{unit.job.purpose}_sent")
    except Unavailable:
        _release_all(deps, rows)  # the chain is gone: hand the rows back now, not after the lease
        raise
    finally:
        deps.chain.close()
    _release_all(deps, rows)
    result.needs_human += deps.engine.needs_human
    if deps.engine.needs_human:
        outcomes["lane_fenced"] = deps.engine.needs_human
    if deps.lane_failures:
        outcomes["lane_failures"] = deps.lane_failures
    if outcomes.get("no_free_lane") or deps.engine.fee_capped:  # no lane, or units over their fee cap
        result.stalled = deps.engine.stall_reason()
    result.details = outcomes
    return result


def _step(deps: Deps, row: Deposit, advance_row: Callable[..., str], *args: Any) -> str:
    """One step of one row, mapping what it raised to an outcome."""
    try:
        return advance_row(deps, *args)
    except LeaseLost:
        return "lease_lost"  # someone else has the row (our lease lapsed): not an error, not an alarm
    except NeedsHuman as exc:
        if not _finish(deps, row, "needs_human", str(exc), event="deposit.needs_human"):
            return "lease_lost"  # the row is someone else's now: their call, no false alarm
        deps.ctx.log.error("deposit %s needs a human: %s", row.id, exc,
                           extra={"msgid": exc.msgid, "deposit_id": row.id})
        return "needs_human"


def _read_nonces(deps: Deps, rows: list[Deposit]) -> None:
    """The authorisation nonces of the deposits that may start a transaction this tick (no lineage
    yet, as many as there are lanes), in one getLedgerEntries instead of one read per deposit."""
    from paygate_cli.chain.contracts import nonce_key
    from paygate_cli.chain.relay import nonces_consumed_many

    def readable(row: Deposit) -> bool:
        try:  # a malformed row is quarantined by its own check, never breaks the others' read
            nonce_key(row.account, row.auth_nonce)
            return True
        except (ValueError, TypeError, OverflowError):
            return False

    fresh = [r for r in rows if r.deposit_lineage_id is None and r.deposit_tx is None and not r.pending_failure]
    fresh = [r for r in fresh[:max(deps.free_lanes, 0) + len(deps.engine.lanes)] if readable(r)]
    if not fresh:
        return
    consumed, latest = nonces_consumed_many(deps.chain, [(r.account, [r.auth_nonce]) for r in fresh])
    deps.nonces = {r.id: (bool(spent), latest) for r, spent in zip(fresh, consumed, strict=True)}


def _release_all(deps: Deps, rows: list[Deposit]) -> None:
    # The tick's 'sent' marks, then the rows handed back, in one statement. Relaxed: a lease left in
    # place only lapses (the rows wait a lease, no more).
    deps.engine.flush_sent((deposits.RELEASE_SQL + deposits.RELEASE_RELAXED,
                            {"ids": [r.id for r in rows], "tokens": [r.token for r in rows]}))


def advance(deps: Deps, row: Deposit) -> str:
    """Do everything the journal and the chain allow for one deposit; return what happened."""
    if row.deposit_tx is None:
        step = _deposit_phase(deps, row)
        if step != "deposit_applied":
            return step
        crashpoint("funding.after_deposit_applied")
    return _credit_phase(deps, row)


# -- the deposit: the user's USDC moves into the billing contract ----------------------------------

def _deposit_phase(deps: Deps, row: Deposit) -> str:
    from paygate_cli.chain.contracts import BadAuthorization, check_deposit_auth, nonce_consumed

    settings = deps.ctx.settings
    if row.deposit_lineage_id is not None:
        lineage = row.lineage_for(deps.conn, row.deposit_lineage_id)
        state = _drive(deps, row, lineage, "deposit")
        if state == "applied":
            assert lineage.inner_hash is not None
            # Recorded on the row with the credit's allocation (one statement, deposits.ATTACH_CREDIT_SQL):
            # until then the applied lineage the row points at says it, so nothing is lost.
            row.deposit_tx = lineage.inner_hash
            row.pending_failure = None  # the same bytes landed after all: the refusal is moot
            return "deposit_applied"
        if state == "failed":
            code = _finished(deps, lineage.id).result_code
            _finish(deps, row, "failed", f"deposit transaction failed on chain ({code})", event="deposit.failed")
            return "failed"
        if state not in ("expired", "superseded", "abandoned"):
            return "waiting"  # still in flight: resent, wait for a ledger
    if row.pending_failure:  # rejected at send; its lineage is now proven dead
        _finish(deps, row, "failed", row.pending_failure, event="deposit.failed")
        return "failed"
    try:
        auth = check_deposit_auth(row.auth_entry, account=row.account, amount=row.amount,
                                  usdc=_required(settings.usdc_contract, "PAYGATE_USDC_CONTRACT"),
                                  billing=_required(settings.billing_contract, "PAYGATE_BILLING_CONTRACT"),
                                  passphrase=settings.network_passphrase)
    except BadAuthorization as exc:
        _finish(deps, row, "failed", f"bad authorisation: {exc}", event="deposit.failed")
        return "quarantined"
    if auth.nonce != row.auth_nonce or auth.expiration_ledger != row.auth_expiration_ledger:
        _finish(deps, row, "failed", "bad authorisation: nonce/expiration differ from the admitted row",
                event="deposit.failed")
        return "quarantined"
    if deps.free_lanes <= 0:
        return "no_free_lane"  # checked before any RPC (a bad authorisation is quarantined first, lane or not)
    # Read this tick (batched) unless the row only now lost its lineage: then read it fresh. Reading
    # needs no lease; every write that follows is guarded by it (the allocation checks it first).
    known = deps.nonces.pop(row.id, None)
    consumed, latest = known or nonce_consumed(deps.chain, row.account, row.auth_nonce)
    if consumed:
        if row.deposit_lineage_id is None and _landed_and_credited(deps, row):
            return "credited_on_chain"
        # All our deposit lineages are terminal and none applied (else we would not be here):
        # something that is not this gateway spent the authorisation. Never invent a deposit hash.
        raise NeedsHuman(f"deposit {row.id}: authorisation nonce {row.auth_nonce} of {row.account} is consumed on "
                         "chain but no journaled lineage of ours applied it", msgid="funding.nonce_consumed_elsewhere")
    if latest >= row.auth_expiration_ledger:
        # Terminal for the user's deposit: the latest ledger from a majority of the read hosts, not
        # the one node that answered the nonce read (it may lie about a future ledger).
        latest = deps.chain.latest_ledger_quorum().sequence
    if latest >= row.auth_expiration_ledger:
        # A transaction applies at the earliest in the next ledger: once the latest ledger reached
        # the expiration ledger, no future ledger can accept the authorisation.
        if deps.conn.execute(deposits.ADMITTED_BEFORE_RESTORE_SQL, {"id": row.id}).fetchone()[0]:
            # A lost transfer of ours may have used it; once expired, its nonce entry no longer says.
            if _landed_and_credited(deps, row):
                return "credited_on_chain"  # the chain's credit names it: settled from that
            raise NeedsHuman(f"deposit {row.id}: its authorisation expired at ledger {row.auth_expiration_ledger} "
                             "after this database went back in time (a restore): a lost transfer of ours may have "
                             "used it, and the chain no longer shows its nonce either way",
                             msgid="funding.expired_across_restore")
        _finish(deps, row, "expired", f"authorisation expired at ledger {row.auth_expiration_ledger} "
                f"(latest {latest}) before it could be used", event="deposit.expired")
        return "expired"
    from paygate_cli.chain.contracts import sac_transfer

    call = sac_transfer(settings.usdc_contract, row.account, settings.billing_contract, row.amount, auth.entry)
    return _ready(deps, _job(deps, row, "deposit", call, row.auth_expiration_ledger), row.entitlement_deposit)


# -- the credit: the billing contract records the deposit for the account ------------------------

def _credit_phase(deps: Deps, row: Deposit) -> str:
    from paygate_cli.chain.contracts import billing_credit

    assert row.deposit_tx is not None
    if row.credit_lineage_id is not None:
        lineage = row.lineage_for(deps.conn, row.credit_lineage_id)
        state = _drive(deps, row, lineage, "credit")
        if state == "applied":
            deps.settling.append(row)  # settled with the tick's others (_settle_all)
            return "settling"
        if state == "failed":
            code = _finished(deps, lineage.id).result_code
            # The contract dedups on the deposit hash; a credit of ours failing is not explained.
            raise NeedsHuman(f"deposit {row.id}: credit transaction failed on chain ({code}) although the deposit "
                             f"{row.deposit_tx.hex()} applied", msgid="funding.credit_failed")
        if state not in ("expired", "superseded", "abandoned"):
            return "waiting"
        if state == "abandoned" and _credited_on_chain(deps, row):
            return "credited_on_chain"  # its earlier credit could not be built: the chain has one already
    if row.pending_failure:
        raise NeedsHuman(f"deposit {row.id}: credit rejected ({row.pending_failure}) after the deposit applied",
                         msgid="funding.credit_rejected")
    if deps.free_lanes <= 0:
        return "no_free_lane"
    settings = deps.ctx.settings

    def call_for(lane: str) -> Any:
        return billing_credit(settings.billing_contract, lane, row.account, row.amount, row.deposit_tx)

    return _ready(deps, _job(deps, row, "credit", call_for), row.entitlement_credit)


def _credited_on_chain(deps: Deps, row: Deposit) -> bool:
    """Has the billing contract credited this deposit already? After a restore the database can
    have lost the credit lineage that did it (journaled after the backup). The row stays pending:
    the observer settles it from the chain's credit event, which names the deposit hash
    (workers/observer.py), so it is never settled here on a read nor handed to a human for it."""
    from paygate_cli.chain.balances import billing_credited
    from paygate_cli.chain.contracts import SimulationFailed
    from paygate_cli.chain.keys import fee_account_address

    assert row.deposit_tx is not None
    settings = deps.ctx.settings
    try:
        credited = billing_credited(deps.chain, billing=settings.billing_contract, deposit_tx=row.deposit_tx,
                                    source=fee_account_address(settings))
    except SimulationFailed:
        return False  # the read says nothing: the credit's own failure stands
    if credited:
        deps.ctx.log.warning("deposit %s: the billing contract already credited its deposit %s (a credit this "
                             "database has no lineage for): left pending for the observer to settle from the "
                             "credit event", row.id, row.deposit_tx.hex(),
                             extra={"msgid": "funding.credit_already_on_chain", "deposit_id": row.id})
    return credited


def _landed_and_credited(deps: Deps, row: Deposit) -> bool:
    """A nonce consumed while the row has no lineage at all: after a restore, the transfer and its
    credit can both have been journaled after the backup. The chain's credit events the observer
    could not match (quarantined) name candidate hashes for this account and amount; one that a
    majority of read hosts show landed carrying this row's authorisation (its nonce) is this
    deposit's transfer, read from the chain, never guessed: the row records it, and the observer
    settles the row from that credit event. -> whether one was found."""
    from paygate_cli.chain.contracts import landed_with_authorisation

    candidates = [bytes(h) for (h,) in deps.conn.execute(deposits.UNMATCHED_CREDITS_SQL, {
        "account": row.account, "amount": str(row.amount)})]
    for deposit_tx in candidates:
        if landed_with_authorisation(deps.chain, deposit_tx, account=row.account, nonce=row.auth_nonce) is not None:
            _write(deps, deposits.RECORD_LANDED_TX_SQL, {"deposit_tx": deposit_tx, "id": row.id, "token": row.token})
            row.deposit_tx = deposit_tx
            deps.ctx.log.warning("deposit %s: its authorisation was consumed by transaction %s, which the billing "
                                 "contract credited (no lineage of this database sent it: a restore?): recorded; "
                                 "the observer settles it from the credit event", row.id, deposit_tx.hex(),
                                 extra={"msgid": "funding.landed_without_lineage", "deposit_id": row.id})
            return True
    return False


def _finished(deps: Deps, lineage_id: int) -> lineages.Lineage:
    return deps.engine.finished.get(lineage_id) or lineages.load(deps.conn, lineage_id)


def _settle_all(deps: Deps) -> list[str]:
    """Settle every deposit whose credit applied this tick, in one statement (its own transaction,
    relaxed: deposits.SETTLE_RELAXED_SQL): the flips, the increments, the events. One outcome per deposit."""
    import psycopg

    settling, deps.settling = deps.settling, []
    if not settling:
        return []
    crashpoint("funding.before_settle")
    deferred: set[int] = set()
    try:
        won = _settle(deps, settling)
    except psycopg.Error as exc:
        # The statement locks each deposit, then its account; the observer's page locks an account
        # (a charge_failed restore) before a deposit (a credit event), so the two can deadlock. The
        # statement committed nothing: settle each deposit alone. One that deadlocks again stays
        # pending on its applied credit, and the next tick (or the observer's event) settles it.
        if exc.sqlstate not in ("40P01", "40001"):
            raise
        deps.ctx.log.warning("funding: the settle of %d deposit(s) met a concurrent writer (%s); settling "
                             "each alone", len(settling), exc.sqlstate, extra={"msgid": "funding.settle_retry"})
        won = set()
        for row in settling:
            try:
                won |= _settle(deps, [row])
            except psycopg.Error as again:
                if again.sqlstate not in ("40P01", "40001"):
                    raise
                deferred.add(row.id)
        if deferred:
            deps.ctx.log.warning("funding: deposit(s) %s left pending on their applied credit after a deadlock; "
                                 "the next tick settles them", sorted(deferred),
                                 extra={"msgid": "funding.settle_deferred"})
    outcomes = []
    for row in settling:
        if row.id in deferred:
            outcomes.append("settle_deferred")
            continue
        if row.id not in won:
            outcomes.append("settled_elsewhere")  # the observer won the flip and applied the increment
            continue
        deps.ctx.log.info("deposit %s settled: %s credited %s", row.id, row.account, row.amount,
                          extra={"msgid": "funding.settled", "deposit_id": row.id})
        outcomes.append("settled")
    return outcomes


def _settle(deps: Deps, rows: list[Deposit]) -> set[int]:
    """deposits.SETTLE_RELAXED_SQL for these deposits, its own transaction; the ids whose flip it won."""
    return {int(r[0]) for r in lineages.one_statement(deps.conn, deposits.SETTLE_RELAXED_SQL, {
        "ids": [row.id for row in rows], "by": "funding", "deposit_txs": [row.deposit_tx for row in rows]}).fetchall()}


# -- shared steps: the engine does the safety-critical sequence; funding says what it means ---------

@dataclass
class FundingJob:
    """One phase of one deposit, as the engine sees it (journal/engine.py's Job)."""

    deps: Deps
    row: Deposit
    purpose: str  # "deposit" | "credit"
    column: str  # the row's pointer to its lineage
    invocation: Any  # an Invocation, or a function of the lane building one
    max_ledger: int | None = None
    max_fee: int | None = None  # no fee bound of its own: max_inclusion_fee caps its bid

    @property
    def crash(self) -> str:
        # The credit phase has its own crash points (a shared name would always fire at the deposit's).
        return "funding" if self.purpose == "deposit" else "funding.credit"

    @property
    def authority(self) -> Policy:
        from paygate_cli.chain import authority

        # The deposit: the depositor's own transfer authorisation only; the credit: the lane's
        # operator authority over billing.credit only.
        return authority.deposit(self.row.account) if self.purpose == "deposit" else authority.CREDIT

    def call(self, lane: str) -> Any:
        return self.invocation(lane) if callable(self.invocation) else self.invocation

    def hold(self, conn: psycopg.Connection) -> bool:
        return conn.execute(deposits.RENEW_SQL, {"id": self.row.id, "token": self.row.token,
                                        "lease": self.deps.ctx.settings.funding_lease}).fetchone() is not None

    # The engine's one-statement phases (journal/engine.py Job): the same lease guard as SQL,
    hold_sql = deposits.HOLD_ROW_SQL
    install_sql = deposits.RENEW_AT_ANCHOR_SQL

    @property
    def attach_sql(self) -> str:
        return deposits.ATTACH_DEPOSIT_SQL if self.purpose == "deposit" else deposits.ATTACH_CREDIT_SQL

    # and the same for a tick's rows: engine.allocate_many and the anchor of send_prepared
    hold_many_sql = deposits.HOLD_MANY_SQL
    attach_many_sql = deposits.ATTACH_MANY_SQL
    install_many_sql = deposits.RENEW_AT_ANCHOR_MANY_SQL

    def row_key(self) -> tuple[int, Any]:
        return self.row.id, self.row.token

    def params(self) -> dict[str, Any]:
        return {"row_id": self.row.id, "row_token": self.row.token, "row_lease": self.deps.ctx.settings.funding_lease,
                "row_deposit_tx": self.row.deposit_tx}

    def on_abandon(self, conn: psycopg.Connection, lineage_id: int, why: str) -> None:
        pass  # the row keeps pointing at the dead lineage until a new one replaces it

    def on_sent(self, conn: psycopg.Connection, lineage_id: int, send: Any, terminal: bool) -> None:
        if terminal:
            # Rejected for good; the row ends failed once the lineage is proven dead (maxTime). If
            # the same bytes land after all, the mark is cleared with the receipt (never stale).
            _write(self.deps, deposits.SET_PENDING_FAILURE_SQL, {
                "reason": f"{self.purpose} rejected by the network: {send.code}", "id": self.row.id,
                "token": self.row.token})

    def on_build_failure(self, conn: psycopg.Connection, lineage_id: int, exc: Exception) -> bool:
        return False

    def check(self, signed: Any) -> None:
        pass


def _drive_in_flight(deps: Deps, rows: list[Deposit]) -> None:
    """Drive the lineage each row has in flight (its deposit's, else its credit's), all at once: their
    receipts are recorded in one statement, and the lanes they free are free before any row
    allocates. advance() then reads each state from deps.driven."""
    items: list[tuple[Job | None, lineages.Lineage]] = []
    for row in rows:
        purpose = "deposit" if row.deposit_tx is None else "credit"
        lineage_id = row.deposit_lineage_id if purpose == "deposit" else row.credit_lineage_id
        if lineage_id is not None:
            items.append((_job(deps, row, purpose), row.lineage_for(deps.conn, lineage_id)))
    states = deps.engine.drive_all(items)
    deps.driven = {lineage.id: state for (_, lineage), state in zip(items, states, strict=True)}


def _drive(deps: Deps, row: Deposit, lineage: lineages.Lineage, purpose: str) -> str:
    """Move a lineage towards a terminal state (or take the state _drive_in_flight left it in);
    return its state afterwards."""
    state = deps.driven.pop(lineage.id, None) or deps.engine.drive(_job(deps, row, purpose), lineage)
    if isinstance(state, Exception):
        raise state  # that row's alone (its lease lost, a finding for a human)
    if state not in lineages.LIVE_STATES and lineage.live:
        deps.free_lanes += 1
    return state


def _job(deps: Deps, row: Deposit, purpose: str, invocation: Any = None, max_ledger: int | None = None
         ) -> FundingJob:
    column = "deposit_lineage_id" if purpose == "deposit" else "credit_lineage_id"
    return FundingJob(deps, row, purpose, column, invocation, max_ledger)


@dataclass
class Ready:
    """A phase that may start a new lineage this tick (allocated for with the tick's others)."""

    job: FundingJob
    entitlement: str


def _ready(deps: Deps, job: FundingJob, entitlement: str) -> str:
    deps.free_lanes -= 1  # spoken for: no more rows queue than there are lanes to give them
    deps.ready.append(Ready(job, entitlement))
    return "ready"


def _prepare_and_send(deps: Deps, item: Ready, first: Allocation | LeaseLost | None) -> str:
    """Build, sign and encrypt on the lane allocate_many() gave (the lease, the lane and the row's
    pointer were one statement; relaxed: the anchor's synchronous commit flushes it before any
    send); the anchor and the broadcast follow with the tick's others (tick). A lane that fails for
    a lane reason is fenced and the work moves to another lane at once (allocate_many again)."""
    from paygate_cli.journal.engine import BuildFailed, Expired, LaneFailed, Prepared, RestorePending

    job, row = item.job, item.job.row
    allocation = first
    for attempt in range(len(deps.engine.lanes)):
        if attempt:
            allocation = deps.engine.allocate_many([job], [item.entitlement])[0]
            deps.free_lanes -= 1
        if isinstance(allocation, LeaseLost):
            raise allocation
        if allocation is None:
            deps.free_lanes = 0
            return "no_free_lane"
        setattr(row, job.column, allocation.lineage_id)
        if job.purpose == "credit":
            row.pending_failure = None
        outcome = deps.engine.prepare(job, allocation)
        if isinstance(outcome, Prepared):
            deps.prepared.append(outcome)  # anchored with the tick's others, then broadcast (tick)
            return "prepared"
        if isinstance(outcome, LaneFailed):
            deps.lane_failures += 1
            continue  # the lane is fenced; the work moves to another lane at once
        if isinstance(outcome, Expired):
            _finish(deps, row, "expired", outcome.reason + " before it could be used", event="deposit.expired")
            return "expired"
        if isinstance(outcome, RestorePending):
            return "restore_pending"  # handed back: built again once the TTL keeper's restore lands
        if isinstance(outcome, BuildFailed):
            if job.purpose == "deposit":
                _finish(deps, row, "failed", outcome.reason, event="deposit.failed")
                return "failed"
            if _credited_on_chain(deps, row):
                return "credited_on_chain"
            raise NeedsHuman(f"deposit {row.id}: {outcome.reason}", msgid="funding.credit_simulation_failed")
    return "no_free_lane"


def _write(deps: Deps, sql: str, params: dict[str, Any]) -> None:
    """A lease-guarded write; zero rows means another worker owns the row now."""
    cursor = deps.conn.execute(sql, params)
    if cursor.rowcount == 0:
        raise LeaseLost(f"deposit {params.get('id')}: lease lost")


def _finish(deps: Deps, row: Deposit, status: str, reason: str, *, event: str) -> bool:
    """Guarded by the lease: False when the row is someone else's now (nothing written)."""
    with deps.conn.transaction():
        done = deps.conn.execute(deposits.FINISH_ROW_SQL, {"status": status, "reason": reason[:1000], "id": row.id,
                                                  "token": row.token}).fetchone()
        if done is not None:
            deps.conn.execute(EMIT_SQL, (event, Jsonb({"deposit_id": row.id, "account": row.account,
                                                       "amount": str(row.amount), "reason": reason[:1000]})))
    return done is not None


def _required(value: str | None, variable: str) -> str:
    if not value:
        from paygate_cli.errors import ConfigError

        raise ConfigError(f"{variable} is not set")
    return value
