"""Relay: a user's signed contract call, fees paid by the gateway (docs/architecture.md §5 "Relay").

Phases, each re-entrant (a process killed anywhere is picked up by the next tick once its lease
lapses):
- Phase 1 (tx): claim under a lease token; commit before any RPC. Then, without a transaction: the
  lineage the row points at is driven first (converge from its receipt, or resend the same bytes);
  with none live: the deep checks of the authorisation (quarantine -> `rejected`), the nonces on
  chain (consumed with no lineage of ours applied -> needs a human, exit 3), the expiration by the
  chain's ledger (-> `expired`).
- Phase 2a (no tx) and 2b (one tx): the journal engine allocates a lane (the row's pointer commits
  with the allocation, under the lease), simulates in enforce mode with the user's entries, signs,
  fee-bumps, and installs the encrypted envelope under the live lease token (its `hold`): a lost
  lease installs nothing and sends nothing.
- Phase 3 (no tx): broadcast (engine); on a later tick the lineage's receipt decides the
  disposition: applied or failed on chain -> settle the actual feeCharged; proven dead -> a new
  lineage (the authorisation may still be good) or, at a terminal, the reservation is released.
  The disposition is one transaction (a tick's relays share one statement): the status flip (a CAS
  on status + lease token + lineage) and the settlement of the reservation and the accumulator;
  only the flip's winner settles, and a settle that finds nothing to settle rolls the flip back, so
  the row re-ticks."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from paygate_cli.context import TickContext, TickResult
from paygate_cli.crashpoints import crashpoint
from paygate_cli.errors import NeedsHuman, PaygateError, Unavailable
from paygate_cli.journal import lineage as lineages
from paygate_cli.queues import relays

if TYPE_CHECKING:
    from collections.abc import Callable

    import psycopg

    from paygate_cli.chain.authority import Policy
    from paygate_cli.chain.contracts import Invocation, SignedTransaction
    from paygate_cli.chain.rpc import SendOutcome
    from paygate_cli.journal.engine import Allocation, Driven, Engine, Prepared
    from paygate_cli.journal.engine import LeaseLost as EngineLeaseLost

# The statements that move the queue's rows are queues/relays.py's; this module holds the flow.
EMIT_SQL = "SELECT paygate.emit_event(%s, %s)"


@dataclass
class Relay:
    id: int
    account: str
    contract: str
    function: str
    args_xdr: str
    auth_entries: list[str]
    auth_nonces: list[int]
    auth_expiration_ledger: int
    max_fee: int
    token: Any
    lineage_id: int | None
    pending_failure: str | None
    allowed: bool  # still on the allow-list at claim time (read with the claim: no extra round trip)
    # The lineage the row pointed at when claimed, read with the claim (the lease stops anyone else
    # from anchoring or abandoning it since; resolvers' transitions are CAS).
    lineage: lineages.Lineage | None = None

    @property
    def entitlement(self) -> str:
        return f"relay:{self.id}"


class LeaseLost(PaygateError):
    msgid = "relay.lease_lost"


@dataclass(frozen=True)
class Inclusion:
    """A relay's transaction included on chain, as its disposition settles it: from its lineage's
    receipt, or (`lineage_id` None) from the chain alone, when a restore lost the lineage that sent
    it (chain/relay.py landed_relay)."""
    lineage_id: int | None
    applied: bool
    fee: int
    tx: bytes | None
    ledger: int | None
    result_code: str | None = None

    @classmethod
    def of_lineage(cls, lineage: lineages.Lineage) -> Inclusion:
        return cls(lineage.id, lineage.state == "applied", int(lineage.fee_charged or 0), lineage.inner_hash,
                   lineage.ledger, lineage.result_code)


class RelayJob:
    """What the journal engine needs from the relay path (journal.engine.Job)."""

    crash = "relay"
    purpose = "relay"

    def __init__(self, row: Relay, invocation: Invocation | None) -> None:
        self.row = row
        self.invocation = invocation
        # The authorisation's last ledger bounds the transaction: it can never apply after it.
        self.max_ledger: int | None = row.auth_expiration_ledger
        # The reservation bounds the whole fee: the engine's bid (and every replacement) fits in it.
        self.max_fee: int | None = row.max_fee

    @property
    def authority(self) -> Policy:
        from paygate_cli.chain.authority import relay

        return relay(self.row.account)  # the user's own entries only, never one of our accounts

    def call(self, lane: str) -> Invocation:
        assert self.invocation is not None
        return self.invocation

    def hold(self, conn: psycopg.Connection) -> bool:
        return conn.execute(relays.HOLD_SQL, {"id": self.row.id, "token": self.row.token}).fetchone() is not None

    # The engine's one-statement phases: the same guards as SQL,
    hold_sql = relays.HOLD_ROW_SQL
    attach_sql = relays.ATTACH_SQL
    install_sql = relays.INSTALL_ANCHORED_SQL
    # and the same for a tick's rows: engine.allocate_many and the anchor of send_prepared
    hold_many_sql = relays.HOLD_MANY_SQL
    attach_many_sql = relays.ATTACH_MANY_SQL
    install_many_sql = relays.INSTALL_ANCHORED_MANY_SQL

    def params(self) -> dict[str, Any]:
        return {"row_id": self.row.id, "row_token": self.row.token}

    def row_key(self) -> tuple[int, Any]:
        return self.row.id, self.row.token

    def on_abandon(self, conn: psycopg.Connection, lineage_id: int, why: str) -> None:
        conn.execute(relays.DROP_LINEAGE_SQL, {"id": self.row.id, "token": self.row.token, "lineage": lineage_id})
        if self.row.lineage_id == lineage_id:
            self.row.lineage_id = None

    def on_sent(self, conn: psycopg.Connection, lineage_id: int, send: SendOutcome, terminal: bool) -> None:
        if terminal:
            reason = f"relay transaction rejected by the network: {send.code}"
            conn.execute(relays.SET_PENDING_FAILURE_SQL, {"reason": reason, "id": self.row.id, "token": self.row.token})
            self.row.pending_failure = reason

    def on_build_failure(self, conn: psycopg.Connection, lineage_id: int, exc: Exception) -> bool:
        return False  # the user's call cannot work as signed: the relay is quarantined

    def check(self, signed: SignedTransaction) -> None:
        from paygate_cli.chain.relay import BadRelay, envelope_fee

        fee = envelope_fee(signed)
        if fee > self.row.max_fee:
            # Never spend more than the reservation holds: the budget is the promise admission made.
            # The bid is bounded by it (max_fee), so only the resource fee and the network's lowest
            # inclusion fee can get here: they alone are above what was reserved.
            raise BadRelay(f"the transaction needs a fee of {fee} stroops (its resource fee "
                           f"{signed.resource_fee} and the lowest bid), above the {self.row.max_fee} reserved")


@dataclass
class Deps:
    ctx: TickContext
    engine: Engine
    own_accounts: set[str]
    # Phase-1 nonce reads for the tick's fresh relays, done in one getLedgerEntries:
    # relay id -> (nonces consumed on chain, latest ledger of the read).
    nonces: dict[int, tuple[list[int], int]] = field(default_factory=dict)
    # Relays built and signed this tick, anchored together (one synchronous commit) and broadcast
    # once every row has been advanced (_advance_all).
    prepared: list[Prepared] = field(default_factory=list)
    # The states drive_all() left the tick's lineages in (relay id -> state, or what stopped that
    # row), and the relays whose lineage was included on chain, disposed of together.
    driven: dict[int, Driven] = field(default_factory=dict)
    included: list[tuple[Relay, Inclusion]] = field(default_factory=list)
    ready: list[RelayJob] = field(default_factory=list)  # relays that may take a new lineage this tick
    rows: list[Relay] = field(default_factory=list)  # what the tick claimed (their leases are renewed)
    renewed_at: float = 0.0  # time.monotonic() of the last renewal (only to skip a needless one)

    @property
    def conn(self) -> psycopg.Connection:
        return self.ctx.conn


HONOURS_DRAIN = True  # a drained instance drives what is in flight and claims nothing new


def claim(ctx: TickContext, *, grace: float = 0.0, lapsed_only: bool = False) -> list[Relay]:
    """Claim up to `batch` rows under a new lease: free rows (unless `lapsed_only`) and rows whose
    lease lapsed more than `grace` seconds ago. The FOR UPDATE SKIP LOCKED claim is the CAS: the
    old lease token is replaced, so a late write of the old owner matches nothing."""
    rows = lineages.one_statement(ctx.conn, relays.CLAIM_SQL, {  # relaxed: a claim is re-derivable (its lease lapses)
        "batch": ctx.batch, "lease": ctx.settings.funding_lease, "owner": f"{ctx.instance_id}:{ctx.slot}",
        "draining": ctx.draining, "grace": grace, "lapsed_only": lapsed_only}).fetchall()
    width = len(lineages.LINEAGE_COLUMNS)
    return [Relay(*r[:13], lineage=lineages.Lineage(*r[13:13 + width]) if r[13] is not None else None)
            for r in rows]


def _deps(ctx: TickContext, *, takeover: bool = False) -> tuple[Deps, Any]:
    # Heavy imports only now that there is chain work (an idle tick never loads stellar_sdk).
    from paygate_cli.journal.engine import Engine

    if takeover:
        # Drives the lineage in flight only (advance(new_work=False) never builds a call), so it holds
        # no lane or fee key, and there is no user authorisation to check against our own accounts.
        engine = Engine.for_takeover(ctx)
        return Deps(ctx, engine, set()), engine.chain
    engine = Engine.for_tick(ctx)
    # Ours (chain/authority.py): the lanes, the fee account and the billing contract.
    return Deps(ctx, engine, set(engine.ours.accounts)), engine.chain


def take_over(ctx: TickContext, grace: float) -> dict[str, int]:
    """Recovery's entry: relays whose lease lapsed more than `grace` seconds ago are claimed through
    the worker's own claim and driven by the worker's own step, limited to the lineage in flight
    (resolve it, resend its same bytes, dispose of it: settle or release the reservation once);
    never a new lineage, so no lane or fee key. The rows are then handed back to the worker."""
    claimed_at = time.monotonic()
    rows = claim(ctx, grace=grace, lapsed_only=True)
    if not rows:
        return {}
    deps, chain = _deps(ctx, takeover=True)
    deps.rows, deps.renewed_at = rows, claimed_at
    result = TickResult()
    try:
        outcomes = _advance_all(deps, rows, result, new_work=False)
    finally:
        chain.close()
        _release_all(deps, rows)
    if deps.engine.needs_human:
        outcomes["lane_fenced"] = deps.engine.needs_human
    return outcomes


def _idle(ctx: TickContext) -> TickResult:
    """Nothing to claim: still drive the lineages no queued row holds any more (journal.engine)."""
    from paygate_cli.journal.engine import sweep_when_idle

    swept = sweep_when_idle(ctx, relays.ORPHANS_SQL)
    if swept is None:
        return TickResult()
    driven, alarms = swept
    return TickResult(needs_human=alarms, details={"orphans_driven": driven})


def tick(ctx: TickContext) -> TickResult:
    claimed_at = time.monotonic()
    rows = claim(ctx)
    if not rows:
        return _idle(ctx)
    crashpoint("relay.after_claim")
    deps, chain = _deps(ctx)
    deps.rows, deps.renewed_at = rows, claimed_at  # the claim's lease is the first renewal
    result = TickResult()
    try:
        _read_nonces(deps, [r for r in rows if r.lineage_id is None and not r.pending_failure])
        outcomes = _advance_all(deps, rows, result, new_work=True)
        deps.engine.sweep(relays.ORPHANS_SQL)
    except Unavailable:
        _release_all(deps, rows)  # the chain is gone: hand the rows back now, not after the lease
        raise
    finally:
        chain.close()
    _release_all(deps, rows)
    result.needs_human += deps.engine.needs_human
    if outcomes.get("no_free_lane") or deps.engine.fee_capped:  # no lane, or units over their fee cap
        result.stalled = deps.engine.stall_reason()
    result.details = outcomes
    return result


def _advance_all(deps: Deps, rows: list[Relay], result: TickResult, *, new_work: bool) -> dict[str, int]:
    """advance() each claimed row, mapping what it raised to an outcome (counted into `result`)."""
    from paygate_cli.journal.engine import LeaseLost as EngineLeaseLost

    ctx = deps.ctx
    outcomes: dict[str, int] = {}

    def count(outcome: str) -> None:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        result.processed += 1
        if outcome == "needs_human":
            result.needs_human += 1
        elif outcome in ("lease_lost", "settle_failed"):
            result.failed += 1

    def step(row: Relay, advance_row: Callable[..., str], *args: Any) -> None:
        try:
            outcome = advance_row(deps, *args)
        except (LeaseLost, EngineLeaseLost):
            outcome = "lease_lost"
        except NeedsHuman as exc:
            outcome = "needs_human"
            try:
                _finish(deps, row, "needs_human", str(exc), release=False)
            except LeaseLost:
                outcome = "lease_lost"
            ctx.log.error("relay %s needs a human: %s", row.id, exc,
                          extra={"msgid": exc.msgid, "relay_id": row.id})
        if outcome not in ("prepared", "included", "ready"):
            count(outcome)

    # The lineages in flight first, all at once: their receipts are recorded in one statement.
    driving = [row for row in rows if row.lineage_id is not None]
    renew(deps)
    states = deps.engine.drive_all([(RelayJob(row, None), _lineage_of(deps, row)) for row in driving])
    deps.driven = {row.id: state for row, state in zip(driving, states, strict=True)}
    for row in rows:
        renew(deps)  # a row whose lineage just died reads its nonces afresh
        step(row, advance, row, new_work)
    renew(deps)
    for outcome in _dispose_all(deps):
        count(outcome)
    # The relays ready for a new lineage: their lanes in one statement, then each built and signed.
    ready, deps.ready = deps.ready, []
    if ready:
        allocations = deps.engine.allocate_many(list(ready), [job.row.entitlement for job in ready])
        for job, allocation in zip(ready, allocations, strict=True):
            renew(deps)  # each build waits on the simulation: the rows prepared before it keep their lease
            step(job.row, _prepare, job, allocation)
    prepared, deps.prepared = deps.prepared, []
    if prepared:  # (a take-over prepares nothing, and its engine refuses to send)
        renew(deps)
        for sent in deps.engine.send_prepared(prepared):
            count("lease_lost" if isinstance(sent, EngineLeaseLost) else "sent")
    return outcomes


def renew(deps: Deps) -> None:
    """Renew the lease of every row the tick claimed (one statement) before a phase that may wait on
    the RPC, as funding and settlement do (their lease checks renew): a slow RPC never lets recovery
    take a row from a live worker. Skipped while the last renewal is fresh (under a third of the
    lease ago: the host clock only decides whether to ask, the lease itself is database time)."""
    lease = float(deps.ctx.settings.funding_lease)
    now = time.monotonic()
    if not deps.rows or now - deps.renewed_at < lease / 3:
        return
    lineages.one_statement(deps.conn, relays.RENEW_SQL, {"lease": lease, "ids": [r.id for r in deps.rows],
                                                  "tokens": [r.token for r in deps.rows]})
    deps.renewed_at = now


def _read_nonces(deps: Deps, fresh: list[Relay]) -> None:
    from paygate_cli.chain.relay import nonces_consumed_many

    if not fresh:
        return
    consumed, latest = nonces_consumed_many(deps.engine.chain, [(r.account, list(r.auth_nonces)) for r in fresh])
    deps.nonces = {r.id: (spent, latest) for r, spent in zip(fresh, consumed, strict=True)}


def _release_all(deps: Deps, rows: list[Relay]) -> None:
    # The tick's 'sent' marks, then the rows handed back, in one statement. Relaxed: a lease left in
    # place only lapses (the rows wait a lease, no more).
    deps.engine.flush_sent((relays.RELEASE_SQL + relays.RELEASE_RELAXED,
                            {"ids": [r.id for r in rows], "tokens": [r.token for r in rows]}))


def _lineage_of(deps: Deps, row: Relay) -> lineages.Lineage:
    """The lineage the row points at: as the claim read it, unless the row moved on since."""
    assert row.lineage_id is not None
    if row.lineage is not None and row.lineage.id == row.lineage_id:
        return row.lineage
    return deps.engine.load(row.lineage_id)


def advance(deps: Deps, row: Relay, new_work: bool = True) -> str:
    """Everything the journal and the chain allow for one relay now; returns what happened.
    `new_work=False` (recovery) stops before a new lineage: only the one in flight is driven."""

    engine = deps.engine
    if row.lineage_id is not None:
        lineage = _lineage_of(deps, row)
        state = deps.driven.pop(row.id, None) or engine.drive(RelayJob(row, None), lineage)
        if isinstance(state, Exception):
            raise state  # that row's alone (its lease lost, a finding for a human)
        if state in ("applied", "failed"):
            # Disposed of with the tick's others (_dispose_all), once every row has been advanced.
            finished = engine.finished.get(lineage.id) or engine.load(lineage.id)
            deps.included.append((row, Inclusion.of_lineage(finished)))
            return "included"
        if state in lineages.LIVE_STATES:
            return "waiting"  # in flight: the same bytes were resent; a ledger decides
        # Proven dead (expired / superseded / abandoned): nothing of it can land. Forget it (an
        # abandon already did, through the job's on_abandon).
        if row.lineage_id is not None:
            with deps.conn.transaction():
                _write(deps, relays.DROP_LINEAGE_SQL, {"id": row.id, "token": row.token, "lineage": lineage.id})
            row.lineage_id = None
    if row.pending_failure:  # the network refused its bytes for good, and that lineage is now dead
        return _finish(deps, row, "rejected", row.pending_failure)
    if not new_work:
        return "released"  # nothing in flight: the worker prepares its next lineage
    return _ready(deps, row)


def _ready(deps: Deps, row: Relay) -> str:
    """Phase 1's checks of a relay with no lineage in flight; "ready" when it may take a new lineage
    (queued in deps.ready, allocated for with the tick's others), else its terminal outcome."""
    from paygate_cli.chain.keys import fee_account_address
    from paygate_cli.chain.relay import BadRelay, landed_relay, nonces_consumed, relay_invocation

    settings = deps.ctx.settings
    if not row.allowed:
        return _finish(deps, row, "rejected", f"{row.contract}.{row.function} is no longer on the relay allow-list")
    try:
        invocation = relay_invocation(
            account=row.account, contract=row.contract, function=row.function, args_xdr=row.args_xdr,
            auth_entries=list(row.auth_entries), nonces=list(row.auth_nonces),
            expiration_ledger=row.auth_expiration_ledger, passphrase=settings.network_passphrase,
            own_accounts=deps.own_accounts)
    except BadRelay as exc:
        return _finish(deps, row, "rejected", f"bad authorisation: {exc}")
    # Read this tick (batched) unless the row only now lost its lineage: then read it fresh.
    known = deps.nonces.pop(row.id, None)
    consumed, latest = known or nonces_consumed(deps.engine.chain, row.account, list(row.auth_nonces))
    if consumed:
        # Every lineage this database holds is dead and none applied (else we would have converged).
        # A lineage it does not hold may have: a restore loses what was journaled after the backup.
        # The chain alone must show it (our fee account's, carrying this authorisation, by quorum):
        # then the relay is settled from that receipt. Never guessed (docs/architecture.md §1 rule 10).
        landed = landed_relay(deps.engine.chain, account=row.account, nonce=consumed[0],
                              fee_account=fee_account_address(settings))
        if landed is not None:
            deps.ctx.log.warning("relay %s: its authorisation was consumed by transaction %s of ours in ledger %s, "
                                 "which no lineage of this database sent (a restore?): settled from its receipt",
                                 row.id, landed.inner_hash.hex(), landed.ledger,
                                 extra={"msgid": "relay.landed_without_lineage", "relay_id": row.id})
            deps.included.append((row, Inclusion(None, True, landed.fee_charged, landed.inner_hash, landed.ledger)))
            return "included"
        raise NeedsHuman(f"relay {row.id}: authorisation nonce(s) {consumed} of {row.account} are consumed on "
                         "chain but no journaled lineage of ours applied them", msgid="relay.nonce_consumed_elsewhere")
    if latest >= row.auth_expiration_ledger:
        # Terminal for the user's relay: from a majority of the read hosts, not the one node that
        # answered the nonce read (it may claim a future ledger).
        latest = deps.engine.chain.latest_ledger_quorum().sequence
    if latest >= row.auth_expiration_ledger:
        # The earliest ledger a new transaction could apply in is latest + 1: past the authorisation.
        if _admitted_before_restore(deps, row):
            raise NeedsHuman(f"relay {row.id}: its authorisation expired at ledger {row.auth_expiration_ledger} "
                             "after this database went back in time (a restore): a lost transaction of ours may "
                             "have used it, and the chain no longer shows its nonce either way",
                             msgid="relay.expired_across_restore")
        return _finish(deps, row, "expired", f"authorisation expired at ledger {row.auth_expiration_ledger} "
                       f"(latest {latest}) before it could be used")
    deps.ready.append(RelayJob(row, invocation))
    return "ready"


def _admitted_before_restore(deps: Deps, row: Relay) -> bool:
    """Asked only at an expiry (rare): one read, sql/functions/admitted_before_restore.sql."""
    return bool(deps.conn.execute(relays.ADMITTED_BEFORE_RESTORE_SQL, {"id": row.id}).fetchone()[0])


def _prepare(deps: Deps, job: RelayJob, allocation: Allocation | EngineLeaseLost | None) -> str:
    """Phase 2a for a relay allocate_many() gave a lane (one statement for the tick's rows: the
    lease, the lane, the row's pointer; relaxed, the anchor's synchronous commit flushes it before
    any send): simulate, sign, fee-bump, encrypt. The anchor and the broadcast follow with the
    tick's others (_advance_all)."""
    from paygate_cli.journal.engine import BuildFailed, Expired, LaneFailed, Prepared, RestorePending

    row = job.row
    if allocation is None:
        return "no_free_lane"
    if isinstance(allocation, Exception):
        raise allocation  # the row is someone else's now
    row.lineage_id = allocation.lineage_id
    outcome = deps.engine.prepare(job, allocation)
    if isinstance(outcome, Prepared):
        deps.prepared.append(outcome)
        return "prepared"
    if isinstance(outcome, LaneFailed):
        return "lane_failed"  # the lane is fenced; the next tick allocates another
    if isinstance(outcome, Expired):
        return _finish(deps, row, "expired", outcome.reason)
    if isinstance(outcome, RestorePending):
        return "restore_pending"  # handed back, its reservation kept: built again once the restore lands
    assert isinstance(outcome, BuildFailed)
    return _finish(deps, row, "rejected", f"the call cannot work as signed: {outcome.reason}")


def _dispose_all(deps: Deps) -> list[str]:
    """The disposition CAS of every relay whose lineage was included on chain this tick (fees were
    burned whether the call succeeded or failed, so the actual feeCharged is settled either way), in
    one statement; one outcome per relay. A refusal or a deadlock rolled the whole statement back:
    each relay is then disposed of alone."""
    import psycopg

    included, deps.included = deps.included, []
    if not included:
        return []
    crashpoint("relay.in_disposition")  # killed here: nothing of the disposition is written
    dispositions = [_disposition(row, inclusion) for row, inclusion in included]
    try:
        won = _dispose(deps, dispositions)
    except psycopg.Error as exc:
        if exc.sqlstate not in (lineages.REQUIRE_FAILED, "40P01", "40001"):
            raise
        return [_dispose_alone(deps, d) for d in dispositions]
    return [_disposed(deps, d, d["id"] in won) for d in dispositions]


def _disposition(row: Relay, inclusion: Inclusion) -> dict[str, Any]:
    status = "applied" if inclusion.applied else "failed"
    fee, tx, ledger = inclusion.fee, inclusion.tx, inclusion.ledger
    reason = None if status == "applied" else f"relayed call failed on chain ({inclusion.result_code})"
    return {"id": row.id, "token": row.token, "lineage": inclusion.lineage_id, "status": status, "fee": fee,
            "tx": tx, "reason": reason, "ledger": ledger, "reserved": row.max_fee, "payload": Jsonb({
                "relay_id": row.id, "account": row.account, "contract": row.contract, "function": row.function,
                "tx_hash": tx.hex() if tx else None, "ledger": ledger, "fee_charged": fee,
                "reserved_fee": row.max_fee, "reason": reason})}


def _dispose(deps: Deps, dispositions: list[dict[str, Any]]) -> set[int]:
    """relays.DISPOSE_INCLUDED_SQL for these dispositions; the relay ids whose flip this statement won."""
    columns = {"ids": "id", "tokens": "token", "lineages": "lineage", "statuses": "status", "fees": "fee",
               "txs": "tx", "reasons": "reason", "payloads": "payload"}
    params = {array: [d[key] for d in dispositions] for array, key in columns.items()}
    return {int(r[0]) for r in lineages.one_statement(deps.conn, relays.DISPOSE_INCLUDED_SQL, params).fetchall()}


def _dispose_alone(deps: Deps, disposition: dict[str, Any]) -> str:
    import psycopg

    try:
        won = _dispose(deps, [disposition])
    except psycopg.Error as exc:
        if exc.sqlstate != lineages.REQUIRE_FAILED:
            raise
        # Nothing to settle: the reservation was closed by someone else. The flip rolled back with
        # the statement: the row re-ticks rather than record a relay whose fee is unaccounted.
        deps.ctx.log.error("relay %s: reservation not open at settlement", disposition["id"],
                           extra={"msgid": "relay.settle_failed", "relay_id": disposition["id"]})
        return "settle_failed"
    return _disposed(deps, disposition, disposition["id"] in won)


def _disposed(deps: Deps, d: dict[str, Any], won: bool) -> str:
    if not won:
        return "settled_elsewhere"
    deps.ctx.log.info("relay %s %s on chain in ledger %s; fee %s of %s reserved settled", d["id"], d["status"],
                      d["ledger"], d["fee"], d["reserved"],
                      extra={"msgid": f"relay.{d['status']}", "relay_id": d["id"]})
    return str(d["status"])


def _finish(deps: Deps, row: Relay, status: str, reason: str, *, release: bool = True) -> str:
    """A terminal with no fee burned by a lineage of ours: the reservation is released with it
    (needs_human keeps it open: a human decides what the consumed nonce cost)."""
    with deps.conn.transaction():
        done = deps.conn.execute(relays.FINISH_SQL, {"status": status, "reason": reason[:1000], "id": row.id,
                                              "token": row.token}).fetchone()
        if done is None:
            raise LeaseLost(f"relay {row.id}: lease lost")
        if release:
            deps.conn.execute(relays.RELEASE_FEE_SQL, (row.id, f"{status}: {reason}"[:1000]))
        deps.conn.execute(EMIT_SQL, (f"relay.{status}", Jsonb({
            "relay_id": row.id, "account": row.account, "contract": row.contract, "function": row.function,
            "reason": reason[:1000], "released_fee": row.max_fee if release else 0})))
    deps.ctx.log.warning("relay %s %s: %s", row.id, status, reason, extra={"msgid": f"relay.{status}",
                                                                         "relay_id": row.id})
    return status


def _write(deps: Deps, sql: str, params: dict[str, Any]) -> None:
    """A lease-guarded write; zero rows means another worker owns the row now."""
    if deps.conn.execute(sql, params).rowcount == 0:
        raise LeaseLost(f"relay {params.get('id')}: lease lost")
