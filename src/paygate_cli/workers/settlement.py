"""Settlement: authorized charges -> one `charge_batch` per claim (DESIGN §5).

A tick first drives the open batches whose lease has lapsed (resolve the lineage; a proven-dead one
hands its charges back for a new lineage, or fails them after `settlement_max_attempts`), then claims
new batches while lanes are free:

    claim + allocate (tx) -> simulate, sign (no tx) -> anchor (tx) -> broadcast (no tx) -> mark sent (tx)

The claim takes rows `WHERE status = 'authorized' AND claimed_at IS NULL AND lineage_id IS NULL`
and records the lineage on every row in the same transaction, so a row with a lineage is never
claimed again while that lineage could land. The worker never marks a charge settled: the observer
does, from the contract's events.

Batch sizing (why the default --batch is 48, not the contract's 100): each entry writes its
charge-id entry and each distinct account its balance entry, and Soroban allows 50 read-write
footprint keys (100 in all) and 16 KB of events per transaction. The claim trims its rows so
entries + distinct accounts <= 50 (25 charges of 25 different accounts, 49 of one account); if the
prepared footprint or the simulation still reports a resource limit, the batch is halved (the
dropped rows are handed back in the same lease) until it fits."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from paygate_cli.db.connect import relaxed_transaction
from paygate_cli.errors import PaygateError, Unavailable
from paygate_cli.journal import lineage as lineages
from paygate_cli.ticks.context import TickContext, TickResult
from paygate_cli.ticks.crash import crashpoint

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.keys import Signer
    from paygate_cli.chain.rpc import ChainClient
    from paygate_cli.journal.keyring import Keyring

HAS_WORK_SQL = """
SELECT EXISTS (SELECT 1 FROM paygate.charges
               WHERE status = 'authorized' AND claimed_at IS NULL AND lineage_id IS NULL),
       EXISTS (SELECT 1 FROM paygate.charge_batches
               WHERE closed_at IS NULL AND (lease_expires_at IS NULL OR lease_expires_at < now()))
"""

# DESIGN §5: a row with a lineage is never re-claimable. The rows stay locked until the claim
# transaction commits with the lineage recorded on them.
CLAIM_CANDIDATES_SQL = """
SELECT id, account, amount, charge_id FROM paygate.charges
WHERE status = 'authorized' AND claimed_at IS NULL AND lineage_id IS NULL
ORDER BY created_at, id
LIMIT %(batch)s
FOR UPDATE SKIP LOCKED
"""
# Record the lineage on every claimed row and open the batch under this process's lease, in one
# round trip; `entries` is what was really marked.
MARK_CLAIMED_SQL = """
WITH claimed AS (
    UPDATE paygate.charges
    SET claimed_at = now(), claimed_by = %(owner)s, lineage_id = %(lineage)s, updated_at = now()
    WHERE id = ANY(%(ids)s) AND status = 'authorized' AND claimed_at IS NULL AND lineage_id IS NULL
    RETURNING 1
)
INSERT INTO paygate.charge_batches (lineage_id, entries, lease_token, lease_expires_at, claimed_by)
SELECT %(lineage)s, count(*), %(token)s, now() + make_interval(secs => %(lease)s), %(owner)s FROM claimed
RETURNING entries
"""

# Batches whose lease lapsed (their process died or finished its step): any settlement process
# may pick them up and drive their lineage one step further.
CLAIM_OPEN_BATCHES_SQL = """
WITH open AS (
    SELECT lineage_id FROM paygate.charge_batches
    WHERE closed_at IS NULL AND (lease_expires_at IS NULL OR lease_expires_at < now())
    ORDER BY created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE paygate.charge_batches b
SET lease_token = gen_random_uuid(), lease_expires_at = now() + make_interval(secs => %(lease)s),
    claimed_by = %(owner)s
FROM open WHERE b.lineage_id = open.lineage_id
RETURNING b.lineage_id, b.lease_token
"""
BATCH_ROWS_SQL = """
SELECT id, account, amount, charge_id FROM paygate.charges WHERE lineage_id = %s ORDER BY created_at, id
"""
# Guard for every write made on behalf of a batch: the lease this process holds is still its own.
HOLD_BATCH_SQL = """
SELECT 1 FROM paygate.charge_batches
WHERE lineage_id = %(lineage)s AND lease_token = %(token)s AND closed_at IS NULL
FOR UPDATE
"""
RELEASE_BATCH_LEASE_SQL = """
UPDATE paygate.charge_batches SET lease_token = NULL, lease_expires_at = NULL
WHERE lineage_id = %(lineage)s AND lease_token = %(token)s AND closed_at IS NULL
"""
SHRINK_BATCH_SQL = """
UPDATE paygate.charge_batches SET entries = %(entries)s
WHERE lineage_id = %(lineage)s AND lease_token = %(token)s AND closed_at IS NULL
"""
CLOSE_BATCH_SQL = """
UPDATE paygate.charge_batches
SET outcome = %(outcome)s, closed_at = now(), lease_token = NULL, lease_expires_at = NULL
WHERE lineage_id = %(lineage)s AND lease_token = %(token)s AND closed_at IS NULL
"""
# Hand rows back without counting an attempt: their lineage never got signed bytes (abandoned),
# or they were trimmed from a batch before signing.
UNCLAIM_SQL = """
UPDATE paygate.charges SET claimed_at = NULL, claimed_by = NULL, lineage_id = NULL, updated_at = now()
WHERE lineage_id = %(lineage)s AND status = 'authorized' AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s))
"""
# Journal the signed envelope (journal.lineage.ANCHOR_SQL's CAS, allocated -> signed), only while
# this process still holds the batch's lease: one round trip.
ANCHOR_BATCH_SQL = """
WITH held AS (
    SELECT lineage_id FROM paygate.charge_batches
    WHERE lineage_id = %(id)s AND lease_token = %(token)s AND closed_at IS NULL
    FOR UPDATE
), anchored AS (
    UPDATE paygate.lineages
    SET state = 'signed', source_seq = %(seq)s, key_id = %(key_id)s, envelope = %(envelope)s,
        inner_hash = %(inner_hash)s, outer_hash = %(outer_hash)s, max_time = %(max_time)s,
        signed_at_ledger = %(signed_at_ledger)s, signed_at = now()
    WHERE id = (SELECT lineage_id FROM held) AND state = 'allocated'
    RETURNING id
)
SELECT (SELECT count(*) FROM held), (SELECT count(*) FROM anchored)
"""
# journal.lineage.MARK_SENT_SQL and the release of the batch lease, in one round trip.
SENT_SQL = """
WITH sent AS (
    UPDATE paygate.lineages
    SET state = 'sent', send_count = send_count + 1, last_send_status = %(status)s,
        sent_at = coalesce(sent_at, now())
    WHERE id = %(lineage)s AND state IN ('signed', 'sent')
    RETURNING id
)
UPDATE paygate.charge_batches SET lease_token = NULL, lease_expires_at = NULL
WHERE lineage_id = %(lineage)s AND lease_token = %(token)s AND closed_at IS NULL
"""
# The lineage is proven dead (it cannot land: expired, superseded, or included and failed, which
# reverts every entry). Its rows get a new chance, or, at the attempt limit, fail with the balance
# restored and the product told, in this one statement — guarded by the lineage's terminal state.
RELEASE_DEAD_SQL = """
WITH dead AS (
    SELECT id FROM paygate.lineages WHERE id = %(lineage)s AND state IN ('failed', 'expired', 'superseded')
), released AS (
    UPDATE paygate.charges c
    SET attempts = c.attempts + 1, dead_lineages = c.dead_lineages || c.lineage_id,
        lineage_id = NULL, claimed_at = NULL, claimed_by = NULL,
        status = CASE WHEN c.attempts + 1 >= %(max)s THEN 'failed' ELSE 'authorized' END,
        failed_at = CASE WHEN c.attempts + 1 >= %(max)s THEN now() END,
        failed_by = CASE WHEN c.attempts + 1 >= %(max)s THEN 'settlement' END,
        reason = CASE WHEN c.attempts + 1 >= %(max)s
                      THEN format('%%s charge_batch transactions were each proven dead (last: %%s)',
                                  c.attempts + 1, %(why)s::text) END,
        updated_at = now()
    FROM dead WHERE c.lineage_id = dead.id AND c.status = 'authorized'
    RETURNING c.id, c.charge_id, c.account, c.amount, c.status, c.attempts, c.reason
), restored AS (
    UPDATE paygate.accounts a SET cached_balance = a.cached_balance + r.total, updated_at = now()
    FROM (SELECT account, sum(amount) AS total FROM released WHERE status = 'failed' GROUP BY account) r
    WHERE a.address = r.account
    RETURNING a.address, a.cached_balance
)
SELECT r.id, r.status,
       CASE WHEN r.status = 'failed' THEN paygate.emit_event('charge.failed', jsonb_build_object(
           'charge_row_id', r.id, 'charge_id', encode(r.charge_id, 'hex'), 'account', r.account,
           'amount', r.amount::text, 'reason', r.reason,
           'balance', (SELECT x.cached_balance::text FROM restored x WHERE x.address = r.account)))
       END
FROM released r
"""


class LeaseLost(PaygateError):
    msgid = "settlement.lease_lost"


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
    signer: Signer
    keyring: Keyring
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def conn(self) -> psycopg.Connection:
        return self.ctx.conn

    @property
    def owner(self) -> str:
        return f"{self.ctx.instance_id}:{self.ctx.slot}"

    def count(self, outcome: str, n: int = 1) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n


def trim_to_fit(rows: list[Entry], limit: int) -> list[Entry]:
    """The longest prefix (claim order) that fits one transaction's footprint estimate."""
    from paygate_cli.chain.charges import fits_estimate

    chosen: list[Entry] = []
    accounts: set[str] = set()
    for row in rows[:limit]:
        new_accounts = accounts | {row.account}
        if not fits_estimate(len(chosen) + 1, len(new_accounts)):
            break
        chosen.append(row)
        accounts = new_accounts
    return chosen


def tick(ctx: TickContext) -> TickResult:
    claimable, drivable = ctx.conn.execute(HAS_WORK_SQL).fetchone()
    if not claimable and not drivable:
        return TickResult()  # idle: no stellar_sdk import, one query
    if not ctx.settings.billing_contract:
        from paygate_cli.errors import ConfigError

        raise ConfigError("PAYGATE_BILLING_CONTRACT is not set")  # before any claim: nothing to strand
    from paygate_cli.chain.keys import Signer
    from paygate_cli.chain.rpc import ChainClient
    from paygate_cli.journal.keyring import Keyring

    deps = Deps(ctx, ChainClient(ctx.settings, guard_conn=ctx.conn), Signer.from_settings(ctx.settings),
                Keyring.from_settings(ctx.settings))
    result = TickResult()
    try:
        lineages.sync_lanes(ctx.conn, list(deps.signer.lanes))
        if drivable:
            _drive_open_batches(deps, result)
        for _ in range(max(1, int(ctx.settings.settlement_batches_per_tick))):
            started = _start_batch(deps, result)
            if not started:
                break
    finally:
        deps.chain.close()
    result.details = deps.outcomes
    return result


# -- new batches -------------------------------------------------------------------------------------

class _Rollback(Exception):
    pass


def _start_batch(deps: Deps, result: TickResult) -> bool:
    """Claim one batch and take it as far as the broadcast. False when nothing (or no lane) is left."""
    ctx = deps.ctx
    batch = max(1, min(int(ctx.batch), 100))
    token = uuid.uuid4()
    try:
        # Relaxed: a claim lost in a database crash only frees its rows; the anchor's synchronous
        # commit flushes it before anything can be broadcast.
        with relaxed_transaction(deps.conn):
            rows = [Entry(r[0], r[1], int(r[2]), bytes(r[3]))
                    for r in deps.conn.execute(CLAIM_CANDIDATES_SQL, {"batch": batch})]
            rows = trim_to_fit(rows, batch)
            if not rows:
                return False
            allocated = lineages.allocate(deps.conn, purpose="charge_batch", entitlement=f"charge_batch:{token}",
                                          lanes=list(deps.signer.lanes))
            if allocated is None:
                raise _Rollback  # roll the claim back: no lane, no claim
            lineage_id, lane = allocated
            claimed = deps.conn.execute(MARK_CLAIMED_SQL, {
                "owner": deps.owner, "lineage": lineage_id, "ids": [r.id for r in rows], "token": token,
                "lease": ctx.settings.settlement_lease}).fetchone()[0]
            assert claimed == len(rows), "rows locked FOR UPDATE changed under the claim"
    except _Rollback:
        deps.count("no_free_lane")
        return False
    crashpoint("settlement.after_claim")
    result.processed += len(rows)
    try:
        outcome = _prepare_and_send(deps, lineage_id, lane, token, rows)
    except Unavailable:
        _give_back(deps, lineage_id, token, "the RPC was unavailable before anything was signed and journaled")
        raise
    except LeaseLost:
        outcome = "lease_lost"
        result.failed += 1
    deps.count(outcome)
    if outcome == "simulation_failed":
        result.failed += 1
    return outcome not in ("simulation_failed",)


def _prepare_and_send(deps: Deps, lineage_id: int, lane: str, token: uuid.UUID, rows: list[Entry]) -> str:
    from paygate_cli.chain.charges import BatchTooLarge, charge_batch, check_resources, is_resource_failure
    from paygate_cli.chain.contracts import SimulationFailed, build_signed

    settings = deps.ctx.settings
    billing = settings.billing_contract
    chain_seq = deps.chain.account_sequence(lane)
    seq = lineages.next_sequence(deps.conn, lane, chain_seq)
    latest = deps.chain.latest_ledger()
    while True:
        call = charge_batch(billing, lane, [r.account for r in rows], [r.amount for r in rows],
                            [r.charge_id for r in rows])
        try:
            signed = build_signed(deps.chain, lane=deps.signer.lanes[lane], fee_account=deps.signer.fee, seq=seq,
                                  call=call, max_time=latest.close_time + int(settings.tx_validity),
                                  base_fee=settings.base_fee, fee_bump_base_fee=settings.fee_bump_base_fee)
            check_resources(signed)
            break
        except (BatchTooLarge, SimulationFailed) as exc:
            resource = isinstance(exc, BatchTooLarge) or is_resource_failure(str(exc))
            if resource and len(rows) > 1:
                keep, drop = rows[: len(rows) // 2], rows[len(rows) // 2:]
                with deps.conn.transaction():
                    _hold(deps, lineage_id, token)
                    deps.conn.execute(UNCLAIM_SQL, {"lineage": lineage_id, "ids": [r.id for r in drop]})
                    deps.conn.execute(SHRINK_BATCH_SQL, {"entries": len(keep), "lineage": lineage_id, "token": token})
                deps.ctx.log.warning("charge batch of %d exceeds a resource limit (%s); split to %d", len(rows), exc,
                                     len(keep), extra={"msgid": "settlement.batch_split", "lineage_id": lineage_id})
                rows = keep
                continue
            with deps.conn.transaction():
                _hold(deps, lineage_id, token)
                lineages.abandon(deps.conn, lineage_id, str(exc)[:500])
                deps.conn.execute(UNCLAIM_SQL, {"lineage": lineage_id, "ids": None})
                deps.conn.execute(CLOSE_BATCH_SQL, {"outcome": "abandoned", "lineage": lineage_id, "token": token})
            deps.ctx.log.error("charge_batch simulation failed, %d charges handed back: %s", len(rows), exc,
                               extra={"msgid": "settlement.simulation_failed", "lineage_id": lineage_id})
            return "simulation_failed"
    crashpoint("settlement.after_sign")
    key_id, ciphertext = deps.keyring.encrypt(signed.envelope_xdr.encode(), lineage_id=lineage_id, source=lane, seq=seq)
    with deps.conn.transaction():
        held, anchored = deps.conn.execute(ANCHOR_BATCH_SQL, {
            "id": lineage_id, "token": token, "seq": seq, "key_id": key_id, "envelope": ciphertext,
            "inner_hash": signed.inner_hash, "outer_hash": signed.outer_hash, "max_time": signed.max_time,
            "signed_at_ledger": latest.sequence}).fetchone()
        if not held:
            raise LeaseLost(f"charge batch {lineage_id}: lease lost before anchor")
        if not anchored:
            raise LeaseLost(f"lineage {lineage_id} was no longer allocated at anchor")
    # The crash window is closed: the exact bytes are journaled before anything is broadcast.
    crashpoint("settlement.after_anchor")
    outcome = deps.chain.send(signed.envelope_xdr)
    crashpoint("settlement.after_broadcast")
    with relaxed_transaction(deps.conn):  # re-derivable: a 'signed' lineage is resolved the same way
        deps.conn.execute(SENT_SQL, {"status": outcome.label, "lineage": lineage_id, "token": token})
    if outcome.status == "ERROR":
        # Not proof of anything by itself: the lineage is resolved (and, once proven dead, its
        # charges retried) on a later tick.
        deps.ctx.log.warning("charge_batch lineage %s: send answered %s", lineage_id, outcome.label,
                             extra={"msgid": "settlement.send_error", "lineage_id": lineage_id})
    return "sent"


def _close(deps: Deps, lineage_id: int, token: uuid.UUID, outcome: str) -> None:
    """Close the batch under this process's lease (the CAS is the guard for what follows in the
    same transaction)."""
    if deps.conn.execute(CLOSE_BATCH_SQL, {"outcome": outcome, "lineage": lineage_id, "token": token}).rowcount != 1:
        raise LeaseLost(f"charge batch {lineage_id}: lease lost")


def _give_back(deps: Deps, lineage_id: int, token: uuid.UUID, why: str) -> None:
    """Hand a claimed batch back now (not after its lease) when its lineage was never anchored."""
    try:
        with deps.conn.transaction():
            if deps.conn.execute(CLOSE_BATCH_SQL, {"outcome": "abandoned", "lineage": lineage_id,
                                                   "token": token}).rowcount != 1:
                return
            if not lineages.abandon(deps.conn, lineage_id, why):
                raise _Rollback  # anchored after all: roll back; a later tick resolves it
            deps.conn.execute(UNCLAIM_SQL, {"lineage": lineage_id, "ids": None})
    except _Rollback:
        pass


def _hold(deps: Deps, lineage_id: int, token: uuid.UUID) -> None:
    if deps.conn.execute(HOLD_BATCH_SQL, {"lineage": lineage_id, "token": token}).fetchone() is None:
        raise LeaseLost(f"charge batch {lineage_id}: lease lost")


# -- open batches ------------------------------------------------------------------------------------

def _drive_open_batches(deps: Deps, result: TickResult) -> None:
    with deps.conn.transaction():
        batches = deps.conn.execute(CLAIM_OPEN_BATCHES_SQL, {
            "limit": max(8, len(deps.signer.lanes)), "lease": deps.ctx.settings.settlement_lease,
            "owner": deps.owner}).fetchall()
    for lineage_id, token in batches:
        try:
            outcome = _drive(deps, int(lineage_id), token, result)
        except LeaseLost:
            outcome = "lease_lost"
            result.failed += 1
        deps.count(outcome)


def _drive(deps: Deps, lineage_id: int, token: uuid.UUID, result: TickResult) -> str:
    from paygate_cli.journal.resolve import resolve

    lineage = lineages.load(deps.conn, lineage_id)
    if lineage.state == "allocated":
        # Allocated but never anchored: the signed bytes (if any) died with their process and were
        # never sent, so nothing can land. Release the lane and hand the rows back (no attempt used).
        with deps.conn.transaction():
            _hold(deps, lineage_id, token)
            lineages.abandon(deps.conn, lineage_id, "never anchored (its process stopped before the commit)")
            lineage.state = "abandoned"
    if lineage.live:
        crashpoint("settlement.before_resolve")
        resolution = resolve(deps.conn, deps.chain, deps.keyring, lineage)
        crashpoint("settlement.after_resolve")
        if resolution.foreign_sequence_use:
            result.needs_human += 1
            deps.ctx.log.error("lane %s sequence %s was consumed by a transaction this gateway never journaled "
                               "(someone else is using the lane's key); the batch's charges are retried on "
                               "another lineage", lineage.lane, lineage.source_seq,
                               extra={"msgid": "journal.foreign_sequence_use", "lineage_id": lineage_id})
        lineage.state = resolution.state
    if lineage.state in ("allocated", "signed", "sent"):
        with relaxed_transaction(deps.conn):
            deps.conn.execute(RELEASE_BATCH_LEASE_SQL, {"lineage": lineage_id, "token": token})
        return "in_flight"
    if lineage.state == "applied":
        # Landed: the observer promotes each charge from its event.
        with relaxed_transaction(deps.conn):  # re-derivable from the terminal lineage
            _close(deps, lineage_id, token, "applied")
        return "applied"
    if lineage.state == "abandoned":
        with deps.conn.transaction():
            _close(deps, lineage_id, token, "abandoned")
            deps.conn.execute(UNCLAIM_SQL, {"lineage": lineage_id, "ids": None})
        return "abandoned"
    # failed / expired / superseded: proven dead.
    why = f"lineage {lineage_id} {lineage.state}"
    with deps.conn.transaction():
        _close(deps, lineage_id, token, "dead")
        rows = deps.conn.execute(RELEASE_DEAD_SQL, {"lineage": lineage_id, "max": _max_attempts(deps),
                                                    "why": why}).fetchall()
    failed = sum(1 for r in rows if r[1] == "failed")
    if failed:
        deps.ctx.log.warning("%d charges failed after %d dead charge_batch attempts (balances restored)", failed,
                             _max_attempts(deps), extra={"msgid": "settlement.charges_failed",
                                                         "lineage_id": lineage_id})
    deps.count("charges_retried", len(rows) - failed)
    deps.count("charges_failed", failed)
    return "dead"


def _max_attempts(deps: Deps) -> int:
    return max(1, int(deps.ctx.settings.settlement_max_attempts))

