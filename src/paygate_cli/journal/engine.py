"""The one phase engine every money path uses (docs/architecture.md §1 rule 2-4, §4, §5).

The safety-critical sequence lives here, once; funding, settlement, the relay and the bot-job
drainer supply only what differs. For a tick's units of work (deposit phases, charge batches,
relays, bot jobs), each phase for all of them at once:

    allocate_many (one statement) -> per unit: its lease checked, the least recently used free
                                     lane, a lineage, the row's pointer to it
    prepare (no tx held)          -> per unit: read sequence, build + simulate + sign + fee-bump,
                                     check its authority, encrypt
    send_prepared (one commit)    -> anchor every envelope under its row's lease, then broadcast each
    drive_all (a later tick)      -> abandon an unanchored lineage, or resolve() a signed/sent one;
                                     foreign sequence use fences the lane (resolve does it); a sent one
                                     the chain has not included is re-bid (the fee market, below)
    sweep                         -> drive the live lineages no row drives any more, so every lineage
                                     reaches a terminal state whoever settled its row
    stall_reason                  -> why queued work cannot move (the restore halt, no lanes, all fenced,
                                     a lane leak)

API (stable: every worker builds on it)
---------------------------------------

    from paygate_cli.journal.engine import (Engine, Job, Allocation, Prepared, Sent, LaneFailed, BuildFailed,
                                            Expired, RestorePending, LeaseLost)

    engine = Engine.for_tick(ctx)          # one per tick, once the tick has work (the heavy imports)
    engine = Engine.for_takeover(ctx)      # recovery, the idle sweep: drives and sweeps, holds no key,
                                           # refuses allocate_many / prepare / send_prepared

    # 1. Allocate, outside any transaction, ONE statement for the tick's rows (one path's Jobs):
    allocations = engine.allocate_many(jobs, entitlements)
    #   per job, in order: Allocation(lineage_id, lane, journal_seq), LeaseLost (returned, that row's
    #   alone), or None (no free lane left for it). A path whose claim allocates (settlement) builds
    #   the Allocation from its claim instead.

    # 2. Outside any transaction, per unit:
    outcome = engine.prepare(job, allocation)
    #   Prepared(...)                   built, signed, checked and encrypted; nothing written yet
    #   LaneFailed(lane, reason)        a lane reason (not an operator, no account): the lane is fenced,
    #                                   the lineage abandoned, job.on_abandon ran; allocate again at once
    #   BuildFailed(reason)             the call itself cannot work (simulation, the path's check, its
    #                                   authority); lineage abandoned, job.on_abandon ran; the path
    #                                   decides what it means for its rows
    #   Expired(reason)                 latest ledger >= job.max_ledger: the authorisation is dead
    #   RestorePending(job_id, keys)    the simulation answered a restorePreamble (archived entries that
    #                                   do not fit the call's transaction) and job.on_build_failure did not
    #                                   change the job: lineage abandoned, job.on_abandon ran, a restore
    #                                   requested (ttl_jobs) in the same transaction; the unit is handed
    #                                   back, never failed, no attempt: try again once the restore lands
    #   raises LeaseLost                the row's lease is gone (someone else has it): nothing more
    #                                   done; no alarm, release what you hold

    # 3. Anchor the tick's Prepared in ONE transaction (a tick's envelopes share one synchronous
    #    commit), then broadcast each — never anything before the commit that journals it:
    results = engine.send_prepared([prepared, ...])   # per unit, in order: Sent | LeaseLost (returned)
    #   Sent(lineage_id, send, terminal): anchored and broadcast (send.status may be anything:
    #   resolve decides)
    engine.flush_sent((release_sql, params))  # the 'sent' marks of the broadcasts (an ordinary
                                              # answer's mark waits for it), then the path's release
                                              # of its rows, in one statement; or flush_sent() alone

    # 4. On a later tick, for the lineages the rows point at (their receipts recorded in one statement):
    states = engine.drive_all([(job, lineage), ...])  # per item: a state, or the LeaseLost /
                                                      # NeedsHuman that stopped it (returned)
    state = engine.drive(job, lineage)                # the same for one lineage (raises those)
    engine.finished         # {lineage id: Lineage} whose receipt this engine's CAS wrote this tick

    # 5. Once per tick: engine.sweep(ORPHANS_SQL) where ORPHANS_SQL selects `id` of live lineages
    #    (of the path's purposes) that no row of the path holds any more; LIMIT %(limit)s.

    engine.needs_human   # lanes fenced for foreign sequence use / lane failures this tick (exit 3, once)

Funding, the relay and settlement take a tick's units through each phase together; the bot-job
drainer takes its jobs one at a time through the same phases (lists of one, its 'sent' mark flushed
after each broadcast), so each job's lease is renewed before its phases and a crash point stops the
tick with the jobs after it untouched.

A `Job` (the one Protocol below) is what one path supplies for one unit: its crash-point prefix, its
lineage purpose, its call built for a given lane, an optional ledger bound, the authority its
envelope may carry, its lease check and row updates as SQL (one row's and the set-based form over a
request of many rows), so that each phase is ONE statement; its lease guard `hold` for the few
transactions that run the path's Python (abandon, lane fence, build failure), and what those
outcomes mean for its rows (`on_abandon`, `on_sent` for a refusal for good, `on_build_failure`,
`check`).

Chain reads already in hand are not repeated within a tick: a lane's sequence comes from the
probe that just resolved the lane's previous lineage, the latest ledger from any answer of the last
few seconds (see _latest for why an older one is always the safe side).

The fee market (docs/architecture.md §4 "Fees and the fee market"; journal/fee_market.py decides):
prepare bids the market's price (read at most once a tick) within the unit's cap (max_inclusion_fee,
and a job's `max_fee`), and the anchor records the bid; after resolve leaves a lineage sent, a
signing engine (never the take-over one) journals a replacement fee bump around the same inner
bytes and then broadcasts it, or marks the lineage fee-capped (stall_reason reports it).

Crash points (PAYGATE_CRASH_AT), with `job.crash` as prefix: `.after_allocate`, `.after_sign`
(prepare), `.after_anchor`, `.after_broadcast` (send_prepared, per unit), `.before_resolve`,
`.after_rebump_journal`, `.after_rebump_broadcast` (a replacement, in drive_all), `.after_resolve`
(drive_all); a lineage no row holds (sweep) uses the prefix `journal.sweep`."""

from __future__ import annotations

import contextlib
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from paygate_cli.crashpoints import crashpoint
from paygate_cli.db.connect import assert_not_in_transaction, relaxed_transaction
from paygate_cli.errors import NeedsHuman, PaygateError, Unavailable
from paygate_cli.journal import lineage as lineages

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.authority import Ours, Policy
    from paygate_cli.chain.contracts import FootprintCall, Invocation, RestoreRequired, SignedTransaction
    from paygate_cli.chain.keys import Signer
    from paygate_cli.chain.rpc import ChainClient, LatestLedger, SendOutcome
    from paygate_cli.context import TickContext
    from paygate_cli.journal.fee_market import FeeMarket
    from paygate_cli.journal.keyring import Keyring
    from paygate_cli.journal.resolve import Resolution


class LeaseLost(PaygateError):
    """The row's lease is no longer ours: another worker has it. Not an error, not an alarm."""

    msgid = "journal.lease_lost"


class Job(Protocol):
    """One unit of a money path as the engine sees it. Its lease check and row updates come as SQL,
    so the engine writes each phase (allocate, anchor, mark sent) as ONE statement, no BEGIN/COMMIT:
    one row's form (a unit alone) and the set-based form over the request `req` (a tick's units of
    one path together: journal/lineage.py ALLOCATE_ATTACH_MANY_SQL, ANCHOR_HELD_MANY_SQL). Named
    parameters are the job's own (`params()`; in the set-based form only those that are the same for
    every row, read from the first job: a row's own come from `req`); the engine's are prefixed `x_`."""

    crash: str  # crash point prefix, e.g. "funding", "funding.credit", "settlement"
    purpose: str  # lineages.purpose
    max_ledger: int | None  # last ledger the transaction may apply in (user authorisation), or None
    # The most the whole fee may be (a relay's reserved max_fee), or None: bounds the unit's bid
    # (docs/architecture.md §4 "Fees and the fee market": cap_rate = min(max_inclusion_fee,
    # (max_fee - resource fee) // fee_ops)).
    max_fee: int | None
    # What authorisation its envelope may carry (chain/authority.py's policy for the path): checked
    # by prepare() on the signed bytes, before anything is anchored.
    authority: Policy

    # SELECT … FOR UPDATE returning a row iff the lease is still ours: locks the row like hold() does.
    hold_sql: str
    # UPDATE … FROM lineage WHERE <the row, under the lease> RETURNING 1: records the new lineage
    # (`lineage.id`). The attach forms serve allocate_many only: a path that allocates otherwise, as
    # settlement's claim does, has none.
    attach_sql: str
    # UPDATE … FROM anchored WHERE … RETURNING 1: what commits with the envelope (lineage.NO_INSTALL: nothing).
    install_sql: str
    # SELECT <row id> AS row_id … JOIN req … FOR UPDATE: the requested rows whose lease is still ours.
    hold_many_sql: str
    # UPDATE … FROM lineage JOIN req USING (entitlement) WHERE <the row, under the lease> RETURNING 1.
    attach_many_sql: str
    # UPDATE … FROM anchored JOIN req ON req.lineage_id = anchored.id WHERE … RETURNING 1: what
    # commits with each envelope.
    install_many_sql: str

    def params(self) -> dict[str, Any]: ...

    def row_key(self) -> tuple[int, Any]:
        """(row id, lease token) as `req` names them."""
        ...

    def call(self, lane: str) -> Invocation | FootprintCall: ...

    def hold(self, conn: psycopg.Connection) -> bool:
        """Inside the engine's transaction: lock the row(s) and check the lease is still ours."""
        ...

    def on_abandon(self, conn: psycopg.Connection, lineage_id: int, why: str) -> None:
        """Inside the transaction that abandoned the lineage (after hold): hand rows back if need be."""
        ...

    def on_sent(self, conn: psycopg.Connection, lineage_id: int, send: SendOutcome, terminal: bool) -> None:
        """Inside the transaction that marked the lineage sent, for an answer that refused these bytes
        for good (`terminal`; the lineage still has to be proven dead by resolve before anything
        replaces it). An ordinary answer has nothing of the path's to record: its mark joins the
        tick's others (flush_sent)."""
        ...

    def on_build_failure(self, conn: psycopg.Connection, lineage_id: int, exc: Exception) -> bool:
        """A non-lane build failure (simulation, resource check, RestoreRequired). Return True when the
        job changed itself (e.g. a batch split, its rows handed back under `hold`) and should be built
        again; False to abandon the lineage (after RestoreRequired: RestorePending)."""
        ...

    def check(self, signed: SignedTransaction) -> None:
        """After signing, before anchoring: raise to refuse the bytes (e.g. a resource limit)."""
        ...


@dataclass(frozen=True)
class Allocation:
    """A lane allocated by allocate_many() (or a path's own claim): the lease was checked and the row
    took the lineage in the same statement, and the lane's highest consumed sequence in our journal
    came back with it."""

    lineage_id: int
    lane: str
    journal_seq: int | None


@dataclass(frozen=True)
class Sent:
    lineage_id: int
    send: SendOutcome
    terminal: bool


@dataclass(frozen=True)
class LaneFailed:
    lane: str
    reason: str
    fenced: bool = True  # False: the lane was only passed over this time (a lagging sequence read)


@dataclass(frozen=True)
class BuildFailed:
    reason: str


@dataclass(frozen=True)
class Expired:
    reason: str


@dataclass(frozen=True)
class RestorePending:
    """The unit waits on a restore of archived ledger entries (docs/architecture.md §4 "State archival
    (TTL)"): `job_id`, the ttl_jobs row the TTL keeper sends (a new one, or an open one holding the
    keys); `keys`, the entries (base64 LedgerKey XDR)."""

    job_id: int
    keys: tuple[str, ...]


# What drive_all() left a lineage in: its state, or what stopped it alone (raise it for that row).
Driven = str | LeaseLost | NeedsHuman


@dataclass(frozen=True)
class Prepared:
    """A unit built, signed and encrypted by prepare(), not yet anchored (send_prepared does it)."""

    job: Job
    lineage_id: int
    lane: str
    signed: SignedTransaction
    seq: int
    key_id: str
    ciphertext: bytes
    signed_at_ledger: int  # also the bid's ledger (bid_ledger): rebumps count from it
    cap_rate: int  # the highest rate this lineage may ever bid (journal/fee_market.py cap_for)

    @property
    def bid_rate(self) -> int:
        assert self.signed.bid_rate is not None
        return self.signed.bid_rate

    @property
    def fee_ops(self) -> int:
        assert self.signed.fee_ops is not None
        return self.signed.fee_ops

    @property
    def resource_fee(self) -> int:
        assert self.signed.resource_fee is not None
        return self.signed.resource_fee


def _anchor_verdict(prepared: Prepared, held: int, anchored: int) -> LeaseLost | None:
    if not held:
        return LeaseLost(f"lineage {prepared.lineage_id}: lease lost before anchor")
    if not anchored:
        return LeaseLost(f"lineage {prepared.lineage_id} was no longer allocated at anchor")
    return None

# Answers that mean "these bytes will never be accepted". txBAD_SEQ, txTOO_LATE and friends are
# not in here: they are not proof by themselves (docs/architecture.md §4); resolve decides.
TERMINAL_SEND_CODES = {"txBAD_AUTH", "txBAD_AUTH_EXTRA", "txMALFORMED", "txSOROBAN_INVALID", "txNO_ACCOUNT",
                       "txNOT_SUPPORTED", "invalid_xdr"}

# Simulation failures that are the lane's fault, not the call's: the same call works from another
# lane. (The billing contract traps with this text when the source is not an allow-listed operator.)
LANE_FAILURE_MARKERS = ("not an allow-listed operator", "does not exist on chain", "source account")


# A restore asked for by a path whose simulation answered a restorePreamble (sql/functions/
# request_restore.sql: joins an open restore holding those keys, else a new ttl_jobs row). Who asks:
# the path's crash prefix and the lineage's entitlement (e.g. "settlement:charge_batch:<token>").
REQUEST_RESTORE_SQL = """
SELECT paygate.request_restore(%(keys)s::text[], %(path)s || ':' || l.entitlement)
FROM paygate.lineages l WHERE l.id = %(lineage)s
"""


# How long a latest-ledger answer already in hand is reused instead of read again (prepare).
# A freshness bound on a cached read (host monotonic clock), never an expiry decision: those are
# made from ledger close times by resolve.
LATEST_REUSE_SECONDS = 5.0


# Connection -> the lane set Engine.for_tick registered through it.
_SYNCED_LANES: weakref.WeakKeyDictionary[Any, frozenset[str]] = weakref.WeakKeyDictionary()


def _one_statement_batch(batch: list[Prepared]) -> bool:
    """Whether a batch can be anchored in one statement: every job of the same set-based SQL."""
    return len({(p.job.hold_many_sql, p.job.install_many_sql) for p in batch}) == 1


def is_lane_failure(message: str) -> bool:
    lowered = message.lower()
    return any(marker in lowered for marker in LANE_FAILURE_MARKERS)


# Lanes we hold keys for: active ones, free ones, and busy ones whose live lineage is young enough
# to still be in flight. A lineage lives at most tx_validity past its signing; one much older than
# that is leaked (nothing drives it), not busy. (A stall heuristic that never decides anything about
# a lineage, so DB time is fine here; dead-or-alive is only ever decided by resolve, by ledger.)
LANE_HEALTH_SQL = """
SELECT count(*) FILTER (WHERE l.status = 'active'),
       count(*) FILTER (WHERE l.status = 'active' AND x.id IS NULL),
       count(*) FILTER (WHERE l.status = 'active' AND x.id IS NOT NULL
                        AND x.created_at > now() - make_interval(secs => %(grace)s)),
       (SELECT h.reason FROM paygate.halts h WHERE h.kind = 'restore')
FROM paygate.lanes l
LEFT JOIN paygate.lineages x ON x.lane = l.address AND x.state IN ('allocated', 'signed', 'sent')
WHERE l.address = ANY(%(lanes)s)
"""


CHAIN_AHEAD_BY = "paygate:chain_ahead_of_journal"  # who fences a lane the chain used past the journal


@dataclass(frozen=True)
class LaneReading:
    """A lane's sequence as the distinct read hosts see it, against the journal's last consumed one.
    `verdict`: "ok" (a majority sees exactly the journal's), "ahead" (a majority sees more: `chain_seq`
    is the highest sequence a majority vouches for, `view` an answer showing it), "behind" (a
    majority sees less: a lagging read, or a chain behind the journal) or "unknown" (no majority)."""

    verdict: str
    chain_seq: int | None
    view: Any
    seen: list[dict[str, Any]]  # each host's answer (hosts only, never URLs)

    def views_text(self) -> str:
        return ", ".join(f"{r['host']}: {r.get('seq') if r.get('seq') is not None else r.get('error')}"
                         for r in self.seen)


def judge_lane_views(views: list[Any], journal_seq: int) -> LaneReading:
    """The one quorum rule for "is the lane where the journal left it" (the engine before it builds on
    a lane, the restore gate for every lane: journal/restore_gate.py)."""
    from paygate_cli.settings import rpc_host

    majority = len(views) // 2 + 1
    seqs = [v.seq for v in views if v.error is None and v.seq is not None]
    seen = [{"host": rpc_host(v.endpoint), "seq": v.seq, "latest_ledger": v.latest_ledger,
             **({"error": v.error[:200]} if v.error else {})} for v in views]
    ahead = sorted(s for s in seqs if s > journal_seq)
    if len(ahead) >= majority:
        chain_seq = ahead[-majority]  # each of a majority reads at least this much
        return LaneReading("ahead", chain_seq, next(v for v in views if v.seq == chain_seq), seen)
    if sum(1 for s in seqs if s == journal_seq) >= majority:
        return LaneReading("ok", journal_seq, None, seen)
    behind = sorted(s for s in seqs if s < journal_seq)
    if len(behind) >= majority:
        return LaneReading("behind", behind[-majority], None, seen)
    return LaneReading("unknown", None, None, seen)


def chain_ahead_evidence(chain: ChainClient, lane: str, journal_seq: int, reading: LaneReading
                         ) -> tuple[str, dict[str, Any]]:
    """Why a lane ahead of the journal is fenced, and the evidence: the range, where the account says
    its sequence last changed (seqLedger/seqTime when the entry carries AccountEntryExtensionV3, else
    its lastModifiedLedgerSeq as a bound), and the lane's transactions in that one ledger. Earlier
    transactions of a range longer than one sit in ledgers the account entry does not name; finding
    them means scanning every ledger since the journal's last use (getTransactions over an unbounded
    window), which a tick does not do: the runbook's `nonce-inspect` and the lane's account history
    do it for the human."""
    view, chain_seq = reading.view, reading.chain_seq
    assert reading.verdict == "ahead" and chain_seq is not None
    evidence: dict[str, Any] = {
        "journal_seq": journal_seq, "chain_seq": chain_seq, "range": [journal_seq + 1, chain_seq],
        "seq_ledger": view.seq_ledger, "seq_time": view.seq_time, "last_modified_ledger": view.last_modified,
        "read_endpoints": reading.seen}
    ledger = view.seq_ledger or view.last_modified
    if ledger:
        try:
            evidence["transactions"] = chain.source_transactions(lane, int(ledger), above=journal_seq,
                                                                 through=chain_seq)
            evidence["transactions_ledger"] = int(ledger)
        except Exception as exc:  # evidence is best effort; the fence is not
            evidence["transactions_error"] = f"{type(exc).__name__}: {exc}"[:300]
    why = (f"chain ahead of journal: lane sequence {chain_seq} on chain, the journal's last consumed is "
           f"{journal_seq}: sequences {journal_seq + 1}..{chain_seq} used by transactions this gateway never "
           "journaled")
    return why, evidence


class Engine:
    def __init__(self, ctx: TickContext, chain: ChainClient, signer: Signer, keyring: Keyring) -> None:
        self.ctx = ctx
        self.chain = chain
        self.signer = signer
        self.keyring = keyring
        self.needs_human = 0  # alarms raised this tick (lanes fenced), each once
        # Chain facts already in hand this tick, so prepare need not read them again:
        # each lane's sequence as the last probe of one of its lineages saw it (taken once: after a
        # send on the lane it is stale), and the latest ledger (sequence, close time, when seen).
        self._seen_seq: dict[str, int] = {}
        self._seen_latest: tuple[int, int, float] | None = None
        # Lineages whose terminal state this engine's own CAS wrote this tick, as written: a path
        # reads them from here instead of loading the row again.
        self.finished: dict[int, lineages.Lineage] = {}
        self._sent: list[tuple[int, str]] = []  # broadcasts whose 'sent' mark flush_sent() writes
        self.broadcasts = 0  # transactions this engine broadcast (first sends; resends are resolve's)
        self._ours: Ours | None = None
        self._market: FeeMarket | None = None
        # Fee-capped lineages this tick drove (id -> the rate each needs), and the paths (purpose,
        # entitlement kind) of every lineage it drove: stall_reason reports the paths' fee-capped units.
        self.fee_capped: dict[int, int] = {}
        self._paths: set[tuple[str, str]] = set()
        self.replaced = 0  # replacement envelopes this engine journaled and broadcast this tick
        self._lanes: list[str] | None = None  # this worker's share of the lanes (the lanes property)

    @classmethod
    def for_tick(cls, ctx: TickContext) -> Engine:
        """What a tick with chain work needs: its keys, its journal keyring and a chain client, with
        the configured lanes known to the database. The heavy imports (stellar_sdk) happen here,
        only once a tick has work."""
        from paygate_cli.chain.keys import Signer
        from paygate_cli.chain.rpc import ChainClient
        from paygate_cli.journal.keyring import Keyring

        signer, keyring = Signer.from_settings(ctx.settings), Keyring.from_settings(ctx.settings)
        # Once per connection (a `run-tick --every` loop keeps its own across ticks), not per tick:
        # lanes are never deleted, only drained or retired, so a registered lane stays registered.
        lanes = frozenset(signer.lanes)
        if _SYNCED_LANES.get(ctx.conn) != lanes:
            lineages.sync_lanes(ctx.conn, list(lanes))
            _SYNCED_LANES[ctx.conn] = lanes
        return cls(ctx, ChainClient(ctx.settings, guard_conn=ctx.conn), signer, keyring)

    @classmethod
    def for_takeover(cls, ctx: TickContext) -> TakeoverEngine:
        """What a take-over needs (recovery driving a dead owner's lineage: record what the chain
        proves, or resend the journaled bytes): the journal keyring to decrypt those bytes and a chain
        client, and no lane or fee key (least privilege). Its lanes are the ones the signing workers
        registered; anything that would allocate or sign refuses (SigningRefused)."""
        from paygate_cli.chain.rpc import ChainClient
        from paygate_cli.journal.keyring import Keyring

        keyring = Keyring.from_settings(ctx.settings)
        return TakeoverEngine(ctx, ChainClient(ctx.settings, guard_conn=ctx.conn), keyring)

    @property
    def conn(self) -> psycopg.Connection:
        return self.ctx.conn

    @property
    def lanes(self) -> list[str]:
        """The lanes this worker allocates on: its share of the lanes it holds keys for."""
        if self._lanes is None:
            self._lanes = lineages.lanes_for(self.ctx.worker, self.signer.lanes, self.ctx.settings.lane_shares)
        return self._lanes

    @property
    def ours(self) -> Ours:
        """The accounts no envelope may authorise as on a user's behalf (chain/authority.py), once."""
        if self._ours is None:
            from paygate_cli.chain.authority import ours_of

            self._ours = ours_of(self.signer, self.ctx.settings)
        return self._ours

    @property
    def market(self) -> FeeMarket:
        """This tick's view of the fee market (read at most once a tick: journal/fee_market.py)."""
        if self._market is None:
            from paygate_cli.journal.fee_market import FeeMarket

            self._market = FeeMarket(self.conn, self.chain, self.ctx.settings, self.ctx.log)
        return self._market

    # -- allocation ------------------------------------------------------------------------------

    def allocate_many(self, jobs: list[Job], entitlements: list[str]) -> list[Allocation | LeaseLost | None]:
        """The lease check, the allocation and each row's pointer for a tick's rows in ONE statement
        (outside any transaction; one path: the jobs share their SQL; each lineage takes its own
        job's purpose): per job, in order, its Allocation, LeaseLost (the row is no longer ours), or
        None when no free lane was left for it (every lane busy, drained or fenced, or another
        allocator won the race for the last one); lanes go to the jobs in order. A row that did not
        take its lineage aborts the statement (nothing allocated); the rows are then allocated for
        one by one, so the failure stays that row's."""
        import psycopg

        if not jobs:
            return []
        first = jobs[0]
        sql = lineages.ALLOCATE_ATTACH_MANY_SQL.format(hold=first.hold_many_sql, attach=first.attach_many_sql)
        keys = [job.row_key() for job in jobs]
        # The path's own parameters (e.g. a lease length) are the same for every row: the first job's.
        params = {**first.params(), "x_row_ids": [k[0] for k in keys], "x_row_tokens": [k[1] for k in keys],
                  "x_entitlements": entitlements, "x_purposes": [job.purpose for job in jobs],
                  "x_lanes": sorted(self.lanes)}
        try:
            # A lost lane race rolled the whole statement back: run again on a fresh snapshot.
            answers = lineages.retry_lost_lane_race(
                lambda: lineages.one_statement(self.conn, sql, params).fetchall(), None)
        except psycopg.Error as exc:
            if exc.sqlstate != lineages.REQUIRE_FAILED:
                raise
            return [self._allocate_alone(job, entitlement) for job, entitlement in zip(jobs, entitlements, strict=True)]
        if answers is None:
            return [None] * len(jobs)  # lost every attempt: "no free lane this time"
        results: list[Allocation | LeaseLost | None] = []
        for job, (_row, held, lineage_id, lane, journal_seq, _ok, _relaxed) in zip(jobs, answers, strict=True):
            if not held:
                results.append(LeaseLost(f"{job.crash}: lease lost"))
            elif lineage_id is None:
                results.append(None)
            else:
                seq = None if journal_seq is None else int(journal_seq)
                results.append(Allocation(int(lineage_id), str(lane), seq))
        return results

    def _allocate_alone(self, job: Job, entitlement: str) -> Allocation | LeaseLost | None:
        """One row's allocation as its own statement (the job's one-row SQL): allocate_many's
        answer for that row."""
        import psycopg

        sql = lineages.ALLOCATE_ATTACH_SQL.format(hold=job.hold_sql, attach=job.attach_sql)
        params = {**job.params(), "x_lanes": sorted(self.lanes), "x_purpose": job.purpose,
                  "x_entitlement": entitlement}
        try:
            answer = lineages.retry_lost_lane_race(lambda: lineages.one_statement(self.conn, sql, params).fetchone(),
                                                   None)
        except psycopg.Error as exc:
            if exc.sqlstate == lineages.REQUIRE_FAILED:
                return LeaseLost(f"{job.crash}: the row did not take its lineage (lease lost)")
            raise
        if answer is None:
            return None  # lost every attempt: "no free lane this time"
        held, lineage_id, lane, journal_seq, _ok, _relaxed = answer
        if not held:
            return LeaseLost(f"{job.crash}: lease lost")
        if lineage_id is None:
            return None
        return Allocation(int(lineage_id), str(lane), None if journal_seq is None else int(journal_seq))

    def load(self, lineage_id: int) -> lineages.Lineage:
        return lineages.load(self.conn, lineage_id)

    def _latest(self) -> LatestLedger:
        """The latest ledger, from an answer already in hand this tick when it is recent enough.
        Older than the live chain is always the safe side here: maxTime comes out earlier (a shorter
        validity), signed_at_ledger earlier (resolve's coverage check only gets stricter), and a
        transaction built past its ledger bound can never apply and is proven dead by ledger."""
        from paygate_cli.chain.rpc import LatestLedger

        seen = self._seen_latest
        if seen is not None and time.monotonic() - seen[2] < LATEST_REUSE_SECONDS:
            return LatestLedger(seen[0], seen[1])
        latest = self.chain.latest_ledger()
        self._seen_latest = (latest.sequence, latest.close_time, time.monotonic())
        return latest

    def _note(self, lane: str, probes: list[Any]) -> None:
        """Keep what resolve's probes read: the lane's sequence (the highest any endpoint reported:
        a sequence never goes back) and the latest ledger as the first endpoint that answered saw it
        (what latest_ledger() would have read: the first healthy read endpoint)."""
        seqs = [p.account_seq for p in probes if not p.error and p.account_seq is not None]
        if seqs:
            self._seen_seq[lane] = max(seqs)
        heads = [(p.latest_ledger, p.latest_close_time) for p in probes
                 if not p.error and p.latest_ledger is not None and p.latest_close_time is not None]
        if heads:
            sequence, close_time = heads[0]
            self._seen_latest = (int(sequence), int(close_time), time.monotonic())

    # -- prepare, anchor, broadcast --------------------------------------------------------------

    def prepare(self, job: Job, allocation: Allocation
                ) -> Prepared | LaneFailed | BuildFailed | Expired | RestorePending:
        """Read the lane's sequence, build + simulate + sign + fee-bump, check, encrypt: everything
        before the anchor, no transaction held, on the lane `allocation` gave (its statement checked
        the lease and read the lane's journal sequence, so neither is read again here). Nothing is
        written for a Prepared until send_prepared()."""
        from paygate_cli.chain.authority import check as check_authority
        from paygate_cli.chain.contracts import RestoreRequired, SimulationFailed, build_signed
        from paygate_cli.chain.rpc import LaneMissing

        settings = self.ctx.settings
        conn = self.conn
        lineage_id, lane = allocation.lineage_id, allocation.lane
        crashpoint(f"{job.crash}.after_allocate")
        assert_not_in_transaction(conn, "building a transaction")
        chain_seq = self._seen_seq.pop(lane, None)  # read by this tick's probe of the lane's last lineage
        if chain_seq is None:
            try:
                chain_seq = self.chain.account_sequence(lane)
            except LaneMissing as exc:  # proven absent by a quorum; a lagging read (LaneNotVisible) is 69
                return self._lane_failed(job, lineage_id, lane, str(exc))
        journal_seq = allocation.journal_seq
        if journal_seq is not None and chain_seq != journal_seq:
            # Rule 10: a new lineage only on a lane whose chain sequence is exactly the journal's
            # last consumed one (a lane the journal never used has nothing to compare: the chain's
            # is taken). Disagreement is a decision, so a majority of read hosts settles it. An
            # agreeing read is not re-asked of the others: were that one node stale exactly at the
            # journal's number, the transaction built on it is proven superseded by resolve's quorum
            # and the lane fenced there (foreign sequence use), so agreement costs one read.
            agreed = self._lane_sequence_agrees(job, lineage_id, lane, journal_seq)
            if isinstance(agreed, LaneFailed):
                return agreed
            chain_seq = journal_seq
        seq = max(chain_seq, journal_seq or 0) + 1
        latest = self._latest()
        if job.max_ledger is not None and latest.sequence >= job.max_ledger:
            # Terminal for the user's item, so not on one node's word (a lying or wrong-network node
            # can claim any future ledger): the highest ledger a majority of read hosts reached. If
            # they have not reached it, build on their (older: the safe side, see _latest) ledger.
            from paygate_cli.chain.rpc import LatestLedger

            quorum = self.chain.latest_ledger_quorum()
            latest = LatestLedger(quorum.sequence, quorum.close_time)
            self._seen_latest = (latest.sequence, latest.close_time, time.monotonic())
        if job.max_ledger is not None and latest.sequence >= job.max_ledger:
            # The transaction could apply at the earliest in ledger latest + 1, after the
            # authorisation's last ledger: no future ledger can accept it.
            why = f"authorisation expired at ledger {job.max_ledger} (latest {latest.sequence})"
            self._abandon(job, lineage_id, why)
            return Expired(why)
        # The market's bid under the global cap (one price a tick, no RPC per unit); a job's own fee
        # bound lowers it once the simulation tells the resource fee (build_signed).
        self.market.seen_ledger(latest.sequence)
        bid = self.market.bid(int(settings.max_inclusion_fee))
        while True:
            try:
                signed = build_signed(self.chain, lane=self.signer.lanes[lane], fee_account=self.signer.fee,
                                      seq=seq, call=job.call(lane),
                                      max_time=latest.close_time + int(settings.tx_validity),
                                      base_fee=settings.base_fee, bid_rate=bid, max_total_fee=job.max_fee,
                                      max_ledger=job.max_ledger)
                job.check(signed)
                # The one check of what authority the bytes carry, for every path (chain/authority.py).
                check_authority(signed.envelope_xdr, job.authority, lane=lane, ours=self.ours)
                break
            except SimulationFailed as exc:
                if is_lane_failure(str(exc)):
                    return self._lane_failed(job, lineage_id, lane, str(exc))
                failure: Exception = exc
            except Unavailable:
                raise  # not a verdict on the call: the caller hands its work back
            except PaygateError as exc:  # the path's own check refused the bytes
                failure = exc
            with conn.transaction():
                if not job.hold(conn):
                    raise LeaseLost(f"lineage {lineage_id}: lease lost")
                again = job.on_build_failure(conn, lineage_id, failure)
            if not again:
                if isinstance(failure, RestoreRequired):
                    return self._restore_pending(job, lineage_id, failure)
                self._abandon(job, lineage_id, str(failure)[:500])
                return BuildFailed(str(failure)[:500])
        crashpoint(f"{job.crash}.after_sign")
        key_id, ciphertext = self.keyring.encrypt(signed.envelope_xdr.encode(), lineage_id=lineage_id, source=lane,
                                                  seq=seq)
        from paygate_cli.journal.fee_market import cap_for

        assert signed.bid_rate is not None and signed.fee_ops is not None and signed.resource_fee is not None
        cap = cap_for(settings, max_fee=job.max_fee, resource_fee=signed.resource_fee, fee_ops=signed.fee_ops)
        # Never below what it bids now (the network's floor may have raised the bid over a tight cap).
        return Prepared(job, lineage_id, lane, signed, seq, key_id, ciphertext, latest.sequence,
                        max(cap, signed.bid_rate))

    def send_prepared(self, batch: list[Prepared]) -> list[Sent | LeaseLost]:
        """Anchor every prepared envelope under its row's lease, all with ONE synchronous commit (a
        tick's envelopes share the WAL flush), then broadcast each. Per unit, in order: Sent, or
        LeaseLost (nothing of that unit anchored, nothing sent; the others go on)."""
        if not batch:
            return []
        anchored = self._anchor_batch(batch)
        # The crash window is closed: the exact bytes are journaled before anything is broadcast.
        results: list[Sent | LeaseLost] = []
        for prepared, lost in zip(batch, anchored, strict=True):
            results.append(lost if lost is not None else self._broadcast(prepared))
        return results

    def _broadcast(self, prepared: Prepared) -> Sent:
        job, lineage_id = prepared.job, prepared.lineage_id
        crashpoint(f"{job.crash}.after_anchor")
        send = self.chain.send(prepared.signed.envelope_xdr)
        self.broadcasts += 1
        crashpoint(f"{job.crash}.after_broadcast")
        terminal = send.status == "ERROR" and send.code in TERMINAL_SEND_CODES
        if not terminal:
            self._awaiting_inclusion()
            # Nothing of the path's to record with an ordinary answer: the mark joins the tick's
            # others in one statement (flush_sent). Until then the lineage reads 'signed', which
            # resolve treats exactly as 'sent' (and a crash before the flush leaves what a crash
            # right after the broadcast always left).
            self._sent.append((lineage_id, send.label))
            if len(self._sent) >= 64:
                self.flush_sent()
        else:
            with relaxed_transaction(self.conn):  # re-derivable: a 'signed' lineage is resolved the same way
                lineages.mark_sent(self.conn, lineage_id, send.label)
                job.on_sent(self.conn, lineage_id, send, terminal)
        return Sent(lineage_id, send, terminal)

    def _awaiting_inclusion(self) -> None:
        """A transaction of this tick's is in flight: the next ledger may include it, and the tick
        that reads its receipt frees its lane, so the loop should tick again once it closes."""
        if self._seen_latest is not None:
            self.ctx.wake_after(self._seen_latest[0])

    def flush_sent(self, then: tuple[str, dict[str, Any]] | None = None) -> None:
        """Record the broadcasts send_prepared left pending (a path calls it once a tick, before it
        hands its rows back; the bot-job drainer after each job's broadcast). `then`: the path's own
        relaxed statement (its lease release), written in the same statement right after the marks."""
        pending, self._sent = self._sent, []
        lineages.mark_sent_many(self.conn, pending, then)

    def _anchor_batch(self, batch: list[Prepared]) -> list[LeaseLost | None]:
        """Anchor the batch with one synchronous commit; per unit None (anchored) or LeaseLost.
        A batch of one path's jobs is one statement (ANCHOR_HELD_MANY_SQL): a lost lease there
        is a unit that did not hold, not an error, so one unit's lost row leaves the others anchored.
        A unit whose own write did not follow its lineage's (paygate.require, PGR01) aborts the
        statement — nothing of the batch is committed — and the batch is anchored again unit by
        unit, so the refusal stays that unit's. Any other batch is anchored unit by unit."""
        import psycopg

        if len(batch) == 1 or not _one_statement_batch(batch):
            return [self._anchor_alone(p) for p in batch]
        try:
            # One statement, its own transaction: synchronous commit, durable before anything is broadcast.
            answers = lineages.one_statement(self.conn, *self._anchor_many_statement(batch)).fetchall()
        except psycopg.Error as exc:
            # A deadlock or serialization failure (the statement locks several rows, which another
            # set-based writer such as the observer may lock in another order) also committed
            # nothing: the same fallback.
            if exc.sqlstate not in (lineages.REQUIRE_FAILED, "40P01", "40001"):
                raise
            return [self._anchor_alone(p) for p in batch]
        return [_anchor_verdict(p, held, anchored) for p, (held, anchored, _ok) in zip(batch, answers, strict=True)]

    def _anchor_alone(self, prepared: Prepared) -> LeaseLost | None:
        """One unit's anchor as its own transaction (synchronous commit)."""
        import psycopg

        try:
            held, anchored, _ok = lineages.one_statement(self.conn, *self._anchor_statement(prepared)).fetchone()
        except psycopg.Error as exc:
            if exc.sqlstate == lineages.REQUIRE_FAILED:
                return LeaseLost(f"lineage {prepared.lineage_id}: the row did not take its envelope (lease lost)")
            raise
        return _anchor_verdict(prepared, held, anchored)

    @staticmethod
    def _anchor_statement(prepared: Prepared) -> tuple[str, dict[str, Any]]:
        """The anchor as one statement: the lease check, allocated -> signed with the envelope, and
        the path's own install, all or nothing."""
        job, signed = prepared.job, prepared.signed
        sql = lineages.ANCHOR_HELD_SQL.format(hold=job.hold_sql, install=job.install_sql)
        return sql, {**job.params(), "x_id": prepared.lineage_id, "x_seq": prepared.seq,
                     "x_key_id": prepared.key_id, "x_envelope": prepared.ciphertext,
                     "x_inner_hash": signed.inner_hash, "x_outer_hash": signed.outer_hash,
                     "x_max_time": signed.max_time, "x_signed_at_ledger": prepared.signed_at_ledger,
                     "x_max_ledger": signed.max_ledger, "x_bid_rate": prepared.bid_rate,
                     "x_fee_ops": prepared.fee_ops, "x_resource_fee": prepared.resource_fee,
                     "x_cap_rate": prepared.cap_rate}

    @staticmethod
    def _anchor_many_statement(batch: list[Prepared]) -> tuple[str, dict[str, Any]]:
        """The batch's anchors as one statement (ANCHOR_HELD_MANY_SQL)."""
        first = batch[0].job
        sql = lineages.ANCHOR_HELD_MANY_SQL.format(hold=first.hold_many_sql, install=first.install_many_sql)
        keys = [p.job.row_key() for p in batch]
        return sql, {**first.params(), "x_row_ids": [k[0] for k in keys], "x_row_tokens": [k[1] for k in keys],
                     "x_ids": [p.lineage_id for p in batch], "x_seqs": [p.seq for p in batch],
                     "x_key_ids": [p.key_id for p in batch], "x_envelopes": [p.ciphertext for p in batch],
                     "x_inner_hashes": [p.signed.inner_hash for p in batch],
                     "x_outer_hashes": [p.signed.outer_hash for p in batch],
                     "x_max_times": [p.signed.max_time for p in batch],
                     "x_signed_at_ledgers": [p.signed_at_ledger for p in batch],
                     "x_max_ledgers": [p.signed.max_ledger for p in batch],
                     "x_bid_rates": [p.bid_rate for p in batch], "x_fee_opss": [p.fee_ops for p in batch],
                     "x_resource_fees": [p.resource_fee for p in batch], "x_cap_rates": [p.cap_rate for p in batch]}

    def _abandon(self, job: Job, lineage_id: int, why: str) -> None:
        with self.conn.transaction():
            if not job.hold(self.conn):
                raise LeaseLost(f"lineage {lineage_id}: lease lost")
            lineages.abandon(self.conn, lineage_id, why)
            job.on_abandon(self.conn, lineage_id, why)

    def _restore_pending(self, job: Job, lineage_id: int, exc: RestoreRequired) -> RestorePending:
        """Archived entries the call needs must be restored first: the lineage is abandoned (never
        signed: no attempt), the rows handed back (job.on_abandon) and the restore requested in the
        same transaction, so a unit is never handed back with nobody asked to restore what it waits on."""
        why = str(exc)[:500]
        with self.conn.transaction():
            if not job.hold(self.conn):
                raise LeaseLost(f"lineage {lineage_id}: lease lost")
            lineages.abandon(self.conn, lineage_id, why)
            job.on_abandon(self.conn, lineage_id, why)
            job_id = int(self.conn.execute(REQUEST_RESTORE_SQL, {"keys": exc.keys_xdr, "path": job.crash,
                                                                "lineage": lineage_id}).fetchone()[0])
        self.ctx.log.warning("lineage %s (%s): %d archived ledger entries must be restored first; restore job %s "
                             "asked for, the unit handed back until it lands", lineage_id, job.crash,
                             len(exc.keys_xdr), job_id,
                             extra={"msgid": "journal.restore_pending", "lineage_id": lineage_id,
                                    "ttl_job_id": job_id})
        return RestorePending(job_id, tuple(exc.keys_xdr))

    def _lane_failed(self, job: Job, lineage_id: int, lane: str, why: str, *, by: str = "paygate:lane_failure",
                     evidence: dict[str, Any] | None = None, finding: bool = False) -> LaneFailed:
        """A lane reason: fence the lane (drained with why on the lane, audited, alarmed once),
        release the work. `finding`: also open the lane's `lane_fence` finding with `evidence`
        (a sequence consumed outside the journal: rule 10), open until an operator resolves it."""
        reason = f"lane {lane} failed for a lane reason: {why}"[:500]
        details = {"why": why[:500], "lineage_id": lineage_id, "path": job.crash, **(evidence or {})}
        with self.conn.transaction():
            if not job.hold(self.conn):
                raise LeaseLost(f"lineage {lineage_id}: lease lost")
            lineages.abandon(self.conn, lineage_id, reason)
            job.on_abandon(self.conn, lineage_id, reason)
            fenced = lineages.fence_lane(self.conn, lane, by=by, details=details, reason=why[:1000],
                                         finding=f"lane {lane}: {why}" if finding else None)
        if fenced:
            self.needs_human += 1
            self.ctx.log.error("lane %s fenced (drained): %s; its work moves to another lane", lane, why,
                               extra={"msgid": "journal.lane_fenced", "lane": lane, "lineage_id": lineage_id})
        return LaneFailed(lane, reason)

    def _lane_sequence_agrees(self, job: Job, lineage_id: int, lane: str, journal_seq: int) -> LaneFailed | None:
        """The lane's sequence on each distinct read host against the journal's last consumed one
        (judge_lane_views). None: a majority sees exactly the journal's. A majority ahead of it:
        sequences were used by transactions we never journaled (a key used elsewhere, a database
        restored or failed over behind the chain); the lane is fenced with the evidence and a finding,
        and the work moves on. Anything else (behind: a lagging read; no majority) proves nothing: the
        lane is passed over this time, never fenced for it, and no sequence below the journal's is
        ever built."""
        reading = judge_lane_views(self.chain.account_views(lane), journal_seq)
        if reading.verdict == "ahead":
            return self._lane_ahead(job, lineage_id, lane, journal_seq, reading)
        if reading.verdict == "ok":
            return None
        why = (f"lane {lane}: the read endpoints do not show the journal's last consumed sequence {journal_seq} "
               f"({reading.views_text()}): a lagging read proves nothing; passed over this time")[:500]
        self._abandon(job, lineage_id, why)
        self.ctx.log.warning("%s", why, extra={"msgid": "journal.lane_sequence_lagging", "lane": lane,
                                               "lineage_id": lineage_id, "journal_seq": journal_seq})
        return LaneFailed(lane, why, fenced=False)

    def _lane_ahead(self, job: Job, lineage_id: int, lane: str, journal_seq: int, reading: LaneReading
                    ) -> LaneFailed:
        """Fence a lane whose chain sequence is ahead of the journal, with chain_ahead_evidence."""
        why, evidence = chain_ahead_evidence(self.chain, lane, journal_seq, reading)
        return self._lane_failed(job, lineage_id, lane, why, by=CHAIN_AHEAD_BY, evidence=evidence, finding=True)

    # -- later ticks -----------------------------------------------------------------------------

    def drive(self, job: Job | None, lineage: lineages.Lineage) -> str:
        """Move a lineage towards a terminal state; return its state afterwards. `job` None: no row
        holds this lineage any more (sweep), so there is nothing to guard or hand back."""
        state = self.drive_all([(job, lineage)])[0]
        if isinstance(state, Exception):
            raise state
        return state

    def drive_all(self, items: list[tuple[Job | None, lineages.Lineage]]) -> list[Driven]:
        """drive() each lineage, in order; per lineage its state afterwards, or what stopped that
        lineage alone (its row's lease lost, or a finding for a human such as a tampered envelope),
        for the path to raise where it handles that row. The receipts the chain proved are recorded
        together, in one statement after the last probe and before anything is returned: a path
        acts on a receipt (settles, disposes, frees the lane for its next allocation) only once the
        journal holds it. What stops the whole tick (the RPC unavailable) is raised."""
        from paygate_cli.journal.resolve import record_receipts

        receipts: list[Any] = []
        resolved: list[str] = []  # crash-point prefixes of the lineages resolve() looked at
        states: list[Driven] = []
        for job, lineage in items:
            try:
                states.append(self._drive_one(job, lineage, receipts, resolved))
            except (LeaseLost, NeedsHuman) as exc:
                states.append(exc)
        for written in record_receipts(self.conn, receipts):
            self.finished[written.id] = written
        for prefix in resolved:
            crashpoint(f"{prefix}.after_resolve")
        return states

    def _drive_one(self, job: Job | None, lineage: lineages.Lineage, receipts: list[Any], resolved: list[str]) -> str:
        from paygate_cli.journal.resolve import resolve

        conn = self.conn
        if lineage.state == "allocated":
            # Allocated but never anchored: the signed bytes (if any) died with their process and
            # were never sent, so nothing can land. Release the lane.
            why = "never anchored (its process stopped before the commit)"
            if job is None:
                with relaxed_transaction(conn):
                    lineages.abandon(conn, lineage.id, why)
            else:
                self._abandon(job, lineage.id, why)
            return "abandoned"
        if not lineage.live:
            return lineage.state
        prefix = job.crash if job is not None else "journal.sweep"
        crashpoint(f"{prefix}.before_resolve")
        resolution = resolve(conn, self.chain, self.keyring, lineage, receipts=receipts,
                             rejection_threshold=self.ctx.settings.repeated_rejection_threshold)
        self._note(lineage.lane, resolution.probes)
        if resolution.state in ("applied", "failed") and lineage.source_seq is not None:
            # A receipt proves the lane's sequence reached this one (the journal will say so too).
            self._seen_seq[lineage.lane] = max(self._seen_seq.get(lineage.lane, 0), lineage.source_seq)
        resolved.append(prefix)
        self._report(lineage, resolution)
        self._paths.add((lineage.purpose, lineage.entitlement.split(":", 1)[0]))
        if resolution.state in lineages.LIVE_STATES:
            self._awaiting_inclusion()
        if resolution.state == "sent" and self.replaces_envelopes and lineage.parked_reason is None \
                and "parked" not in resolution.evidence:
            self._bid_again(prefix, lineage, resolution)
        return resolution.state

    # -- the fee market: re-bump, fee-capped ----------------------------------------------------

    # Whether this engine may journal a replacement envelope (it holds the fee key); the take-over
    # engine never does.
    replaces_envelopes = True

    def _bid_again(self, prefix: str, lineage: lineages.Lineage, resolution: Resolution) -> None:
        """A sent lineage the chain has not included (resolve just resent its bytes): per the
        market, a replacement fee bump (journaled, then broadcast), fee-capped (it waits), or
        nothing; a lineage that no longer needs a replacement is no longer fee-capped."""
        from paygate_cli.journal.fee_market import INSUFFICIENT_FEE, Capped

        latest = self._seen_latest[0] if self._seen_latest is not None else None
        if latest is None:
            return
        self.market.seen_ledger(latest)
        decision = self.market.replacement(lineage, latest_ledger=latest,
                                           insufficient_fee=resolution.resent_code == INSUFFICIENT_FEE)
        if decision is None:
            if lineage.fee_capped_at is not None:
                lineages.clear_fee_capped(self.conn, lineage.id)
            return
        if isinstance(decision, Capped):
            self.fee_capped[lineage.id] = decision.required
            if lineages.set_fee_capped(self.conn, lineage.id, decision.required) and lineage.fee_capped_at is None:
                price = self.market.price()
                self.ctx.log.warning(
                    "lineage %s is fee-capped: it needs %s stroops per operation, its cap is %s (market %s %s, "
                    "%s replacements of %s); it waits, resending the same bytes", lineage.id, decision.required,
                    decision.cap, self.market.percentile, price.figure if price else "unknown", lineage.replacements,
                    self.ctx.settings.max_replacements,
                    extra={"msgid": "fees.capped", "lineage_id": lineage.id, "fee_required": decision.required,
                           "cap_rate": decision.cap})
            return
        self._replace(prefix, lineage, decision, latest)

    def _replace(self, prefix: str, lineage: lineages.Lineage, rate: int, latest: int) -> None:
        """A replacement fee bump at `rate` around the lineage's same inner transaction: encrypted and
        committed (the CAS on the outer hash it replaces) before it is broadcast; resends send it
        from then on (lineage.envelope is always the newest committed)."""
        from paygate_cli.chain.contracts import rebump
        from paygate_cli.journal.keyring import EnvelopeTampered

        assert lineage.inner_hash is not None and lineage.source_seq is not None
        try:
            envelope = self.keyring.decrypt(lineage.envelope or b"", key_id=lineage.key_id or "",
                                            lineage_id=lineage.id, source=lineage.lane, seq=lineage.source_seq)
        except EnvelopeTampered:
            return  # resolve decrypted these very bytes a moment ago; whoever changed them, resolve parks it
        bumped = rebump(envelope.decode(), self.signer.fee, rate, self.chain.passphrase)
        if bumped.inner_hash != lineage.inner_hash:
            raise AssertionError(f"lineage {lineage.id}: a replacement changed the inner transaction")
        key_id, ciphertext = self.keyring.encrypt(bumped.envelope_xdr.encode(), lineage_id=lineage.id,
                                                  source=lineage.lane, seq=lineage.source_seq)
        if not lineages.replace_envelope(self.conn, lineage, envelope=ciphertext, key_id=key_id,
                                         outer_hash=bumped.outer_hash, bid_rate=rate, bid_ledger=latest):
            return  # replaced or finished by someone else meanwhile: theirs stands, nothing is sent
        crashpoint(f"{prefix}.after_rebump_journal")
        send = self.chain.send(bumped.envelope_xdr)
        crashpoint(f"{prefix}.after_rebump_broadcast")
        self.replaced += 1
        self.fee_capped.pop(lineage.id, None)
        with relaxed_transaction(self.conn):  # re-derivable, like every 'sent' mark
            lineages.mark_sent(self.conn, lineage.id, send.label)
        self.ctx.log.info("lineage %s: replacement %s at %s stroops per operation (was %s): %s", lineage.id,
                          lineage.replacements + 1, rate, lineage.bid_rate, send.label,
                          extra={"msgid": "fees.rebumped", "lineage_id": lineage.id, "bid_rate": rate,
                                 "replaced_outer_hash": (lineage.outer_hash or b"").hex(),
                                 "outer_hash": bumped.outer_hash.hex()})
        if send.status == "ERROR" and send.code in TERMINAL_SEND_CODES:
            # These bytes are refused for good (a bug of ours: the same inner transaction was
            # accepted before). Not proof the lineage is dead: the replaced bytes may still land.
            self.ctx.log.error("lineage %s: its replacement was refused with ERROR %s", lineage.id, send.code,
                               extra={"msgid": "fees.replacement_refused", "lineage_id": lineage.id})

    def _report(self, lineage: lineages.Lineage, resolution: Resolution) -> None:
        if resolution.foreign_sequence_use:
            # docs/architecture.md §4 step 3 / rule 10: the lineage is proven dead (superseded) and resolve fenced
            # the lane; a human is asked about the lane (exit 3). The work itself is not in doubt.
            self.needs_human += 1
            self.ctx.log.error("lane %s sequence %s was consumed by a transaction this gateway never journaled "
                               "(someone else is using the lane's key); lineage %s superseded, lane fenced (drained)",
                               lineage.lane, lineage.source_seq, lineage.id,
                               extra={"msgid": "journal.foreign_sequence_use", "lineage_id": lineage.id,
                                      "lane": lineage.lane, "chain_seq": resolution.evidence.get("chain_seq")})
        if resolution.repeated_rejection is not None:
            # Resent again and again, refused with the same code each time: the lane's finding opened
            # just now (journal/rejections.py); a human is asked once (exit 3), the lineage waits on.
            found = resolution.repeated_rejection
            self.needs_human += 1
            self.ctx.log.error("lane %s: lineage %s rejected with ERROR %s on %s consecutive resends (a chain "
                               "behind the journal?); repeated_rejection finding opened",
                               lineage.lane, lineage.id, found["code"], found["consecutive_rejections"],
                               extra={"msgid": "journal.repeated_rejection", "lineage_id": lineage.id,
                                      "lane": lineage.lane, "code": found["code"]})
        if resolution.evidence.get("decision") == "wait":
            # Disagreement or no majority of covering answers: never decided, but reported.
            self.ctx.log.warning("lineage %s waits: no majority of read endpoints agrees (%s)", lineage.id,
                                 resolution.evidence.get("verdicts"),
                                 extra={"msgid": "journal.no_quorum", "lineage_id": lineage.id})

    def sweep(self, orphans_sql: str, limit: int = 8) -> int:
        """Drive live lineages that no row holds any more (the row was settled by someone else,
        e.g. the observer winning the credit race): a lineage left `sent` pins its lane for ever.
        Resolve is a CAS and a resend repeats the same bytes, so two sweepers racing are harmless."""
        ids = [int(r[0]) for r in self.conn.execute(orphans_sql, {"limit": limit}).fetchall()]
        live = [lineage for lineage in map(self.load, ids) if lineage.live]
        for lineage, state in zip(live, self.drive_all([(None, lineage) for lineage in live]), strict=True):
            if isinstance(state, NeedsHuman):
                # No row to hand to a human (e.g. an envelope that does not decrypt, parked just now
                # with its lane fenced): the tick asks for one itself, once (a parked lineage is
                # never reported again).
                self.needs_human += 1
                self.ctx.log.error("lineage %s needs a human: %s", lineage.id, state,
                                   extra={"msgid": state.msgid, "lineage_id": lineage.id})
        return len(ids)

    # -- liveness --------------------------------------------------------------------------------

    def stall_reason(self) -> str | None:
        """Why this tick's work cannot move: no lane (stall_reason below), or units fee-capped
        (the market asks more than their cap: docs/architecture.md §4 "Fees and the fee market").
        A worker asks when it found no free lane, or when `fee_capped` says this tick saw one.
        Either changes with a ledger close (a lane frees when its transaction lands, the market
        moves per ledger), so the loop ticks again at the next close rather than at its slot."""
        with contextlib.suppress(PaygateError, ValueError):  # no (usable) chain answer: the loop keeps its cadence
            self.ctx.wake_after(self._latest().sequence)
        reasons = [self.fee_capped_reason()]
        if not self.broadcasts:  # a tick that broadcast work moves, whatever still waits for a lane
            reasons.append(stall_reason(self.conn, self.ctx.settings, self.lanes))
        found = [r for r in reasons if r]
        return "; ".join(found) if found else None

    def fee_capped_reason(self) -> str | None:
        """The fee-capped live units of the paths this tick drove (counted in the database: every
        such unit, not only the ones this tick looked at), or None."""
        if not self.fee_capped:
            return None
        count, required, cap = lineages.fee_capped_of(self.conn, self._paths)
        if not count:
            return None
        price = self.market.price()
        units = f"{count} unit{'s' if count != 1 else ''} fee-capped: market {self.market.percentile}"
        if price is not None and cap is not None and price.figure <= cap:
            # The market is under the cap, but a replacement must bid 10x: that is over it.
            return f"{units} {price.figure}, a replacement needs {required} > cap {cap}"
        return f"{units} {price.figure if price else 'unknown'} > cap {cap}"


class SigningRefused(RuntimeError):
    """A take-over engine was asked to allocate or sign: a bug in its caller (a take-over never starts
    a transaction), so never a PaygateError a worker could count as an outcome: exit 70."""


# The lanes the signing workers registered (Engine.for_tick syncs them from the lane seeds).
REGISTERED_LANES_SQL = "SELECT address FROM paygate.lanes WHERE status <> 'retired' ORDER BY address"


class TakeoverEngine(Engine):
    """Engine.for_takeover(): drives, sweeps and reports like any engine, and holds no signing key.
    Allocating or signing refuses before anything is read or written, and so does any other reach
    for the signer."""

    replaces_envelopes = False  # no fee key: a starving lineage waits for an engine that has one

    def __init__(self, ctx: TickContext, chain: ChainClient, keyring: Keyring) -> None:
        super().__init__(ctx, chain, None, keyring)  # type: ignore[arg-type]  # the signer property takes None
        self._registered: list[str] | None = None

    @property  # type: ignore[override]
    def signer(self) -> Signer:
        self._refuse("the signer")

    @signer.setter
    def signer(self, value: None) -> None:
        if value is not None:
            raise SigningRefused("a take-over engine holds no signer")

    @property
    def lanes(self) -> list[str]:
        if self._registered is None:
            self._registered = [address for (address,) in self.conn.execute(REGISTERED_LANES_SQL)]
        return list(self._registered)

    def allocate_many(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("allocate_many")

    def prepare(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("prepare")

    def send_prepared(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("send_prepared")

    def _refuse(self, what: str) -> NoReturn:
        raise SigningRefused(f"{what} on a take-over engine (Engine.for_takeover): it holds no lane or fee key and "
                             "never starts a transaction; a path that signs builds Engine.for_tick")


def sweep_when_idle(ctx: TickContext, orphans_sql: str) -> tuple[int, int] | None:
    """For a tick that claimed nothing: drive the live lineages no row of the path holds any more
    (a unit settled elsewhere, or handed to a human with its lineage parked), since nothing else
    resolves them and each pins its lane. None when there are none, so an idle tick stays one query
    and never loads stellar_sdk; else (lineages driven, alarms raised: exit 3). Sweeping resolves and resends
    journaled bytes only, so it runs with the take-over engine: no lane or fee key."""
    if ctx.conn.execute(orphans_sql, {"limit": 1}).fetchone() is None:
        return None
    engine = Engine.for_takeover(ctx)
    try:
        driven = engine.sweep(orphans_sql)
    finally:
        engine.chain.close()
    return driven, engine.needs_human


def stall_reason(conn: psycopg.Connection, settings: Any, lanes: list[str]) -> str | None:
    """Why queued work cannot move, or None when a lane is free or will be soon. Call it when a path
    had work and found no free lane: a momentary "all lanes busy" is not a stall."""
    if not lanes:
        return "no lanes configured"
    grace = 2 * float(settings.tx_validity) + 60
    active, free, young, restore = conn.execute(LANE_HEALTH_SQL, {"lanes": sorted(lanes), "grace": grace}
                                                ).fetchone()
    if restore is not None:
        # No lane is allocated while the restore halt is set (lineage.free_lane_ctes), free or not.
        return f"submissions closed by the restore halt: {restore}; run `paygate recover-check`"
    if not active:
        return f"every lane is fenced or drained ({len(lanes)} configured)"
    if free or young:
        return None
    return (f"no free lane: every active lane ({active}) holds a live lineage older than a lineage can "
            f"live ({grace:.0f} s): a lane leak")
