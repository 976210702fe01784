"""Funding: a user's signed SAC transfer authorisation -> USDC into the billing contract -> credit.

Phases (DESIGN §5): claim (tx) -> nonce check and prepare (no tx) -> anchor (tx) -> broadcast
(no tx) -> resolve -> credit as its own lineage -> settle (tx). Every step is re-entrant: a tick
looks at what the journal and the chain prove and does the next thing, so a process killed at
any point is picked up by the next tick once its lease lapses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from paygate_cli.db.connect import assert_not_in_transaction, relaxed_transaction
from paygate_cli.errors import NeedsHuman, PaygateError, Unavailable
from paygate_cli.journal import lineage as lineages
from paygate_cli.ticks.context import TickContext, TickResult
from paygate_cli.ticks.crash import crashpoint

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.keys import Signer
    from paygate_cli.chain.rpc import ChainClient
    from paygate_cli.journal.keyring import Keyring

# Rows with a transaction in flight first (resolving them frees lanes), then fresh ones in order.
CLAIM_SQL = """
WITH claimable AS (
    SELECT id FROM paygate.pending_credits
    WHERE status = 'pending' AND (lease_expires_at IS NULL OR lease_expires_at < now())
    ORDER BY (deposit_lineage_id IS NULL AND credit_lineage_id IS NULL), id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
UPDATE paygate.pending_credits p
SET lease_token = gen_random_uuid(), lease_expires_at = now() + make_interval(secs => %(lease)s),
    claimed_by = %(owner)s, attempts = p.attempts + 1, updated_at = now()
FROM claimable WHERE p.id = claimable.id
RETURNING p.id, p.account, p.amount, p.auth_entry, p.auth_nonce, p.auth_expiration_ledger, p.lease_token,
          p.deposit_lineage_id, p.credit_lineage_id, p.deposit_tx, p.pending_failure
"""

# Every write below is guarded by the lease token it claimed with: a worker whose lease lapsed
# (and whose row someone else now owns) changes nothing.
SET_LINEAGE_SQL = """
UPDATE paygate.pending_credits SET {column} = %(lineage)s, updated_at = now()
WHERE id = %(id)s AND status = 'pending' AND lease_token = %(token)s
"""
SET_DEPOSIT_TX_SQL = """
UPDATE paygate.pending_credits SET deposit_tx = %(tx)s, updated_at = now()
WHERE id = %(id)s AND status = 'pending' AND lease_token = %(token)s
"""
SET_PENDING_FAILURE_SQL = """
UPDATE paygate.pending_credits SET pending_failure = %(reason)s, updated_at = now()
WHERE id = %(id)s AND status = 'pending' AND lease_token = %(token)s
"""
FINISH_ROW_SQL = """
UPDATE paygate.pending_credits
SET status = %(status)s, reason = %(reason)s, lease_token = NULL, lease_expires_at = NULL, updated_at = now()
WHERE id = %(id)s AND status = 'pending' AND lease_token = %(token)s
RETURNING account, amount
"""
RELEASE_SQL = """
UPDATE paygate.pending_credits p SET lease_token = NULL, lease_expires_at = NULL, updated_at = now()
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS mine(id, token)
WHERE p.id = mine.id AND p.status = 'pending' AND p.lease_token = mine.token
"""
# The flip and the balance increment are one statement: whichever of funding and the observer
# wins pending -> settled applies the increment; the loser's statement matches no row.
SETTLE_SQL = """
WITH flipped AS (
    UPDATE paygate.pending_credits
    SET status = 'settled', settled_by = %(by)s, settled_at = now(), lease_token = NULL,
        lease_expires_at = NULL, updated_at = now()
    WHERE id = %(id)s AND status = 'pending' AND deposit_tx = %(deposit_tx)s
    RETURNING id, account, amount, deposit_tx
), credited AS (
    UPDATE paygate.accounts a SET cached_balance = a.cached_balance + f.amount, updated_at = now()
    FROM flipped f WHERE a.address = f.account
    RETURNING a.address, a.cached_balance
)
SELECT f.id, f.account, f.amount, c.cached_balance,
       paygate.emit_event('credit.settled', jsonb_build_object(
           'pending_credit_id', f.id, 'account', f.account, 'amount', f.amount::text,
           'deposit_tx', encode(f.deposit_tx, 'hex'), 'balance', c.cached_balance::text))
FROM flipped f JOIN credited c ON c.address = f.account
"""
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

    @property
    def entitlement_deposit(self) -> str:
        return f"pending_credit:{self.id}:deposit"

    @property
    def entitlement_credit(self) -> str:
        return f"pending_credit:{self.id}:credit"


class LeaseLost(PaygateError):
    msgid = "funding.lease_lost"


@dataclass
class Deps:
    ctx: TickContext
    chain: ChainClient
    signer: Signer
    keyring: Keyring
    lanes_needing_a_human: int = 0
    free_lanes: int = 0  # lanes with nothing in flight: a row needing a new transaction waits for one

    @property
    def conn(self) -> psycopg.Connection:
        return self.ctx.conn


def tick(ctx: TickContext) -> TickResult:
    with relaxed_transaction(ctx.conn):
        rows = [Deposit(r[0], r[1], int(r[2]), *r[3:]) for r in ctx.conn.execute(CLAIM_SQL, {
            "batch": ctx.batch, "lease": ctx.settings.funding_lease, "owner": f"{ctx.instance_id}:{ctx.slot}"})]
    if not rows:
        return TickResult()
    crashpoint("funding.after_claim")
    # Heavy imports only now that there is chain work (an idle tick never loads stellar_sdk).
    from paygate_cli.chain.keys import Signer
    from paygate_cli.chain.rpc import ChainClient
    from paygate_cli.journal.keyring import Keyring

    deps = Deps(ctx, ChainClient(ctx.settings, guard_conn=ctx.conn), Signer.from_settings(ctx.settings),
                Keyring.from_settings(ctx.settings))
    lineages.sync_lanes(ctx.conn, list(deps.signer.lanes))
    deps.free_lanes = lineages.free_lane_count(ctx.conn, list(deps.signer.lanes))
    # Rows with a transaction in flight first: resolving them frees lanes for the new ones.
    rows.sort(key=lambda r: (r.deposit_lineage_id is None and r.credit_lineage_id is None, r.id))
    result = TickResult()
    outcomes: dict[str, int] = {}
    try:
        for row in rows:
            try:
                outcome = advance(deps, row)
            except LeaseLost:
                outcome = "lease_lost"
            except NeedsHuman as exc:
                outcome = "needs_human"
                _finish(deps, row, "needs_human", str(exc), event="credit.needs_human")
                ctx.log.error("deposit %s needs a human: %s", row.id, exc,
                              extra={"msgid": exc.msgid, "pending_credit_id": row.id})
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            result.processed += 1
            if outcome == "needs_human":
                result.needs_human += 1
            elif outcome == "lease_lost":
                result.failed += 1
    except Unavailable:
        _release_all(deps, rows)  # the chain is gone: hand the rows back now, not after the lease
        raise
    finally:
        deps.chain.close()
    _release_all(deps, rows)
    result.needs_human += deps.lanes_needing_a_human
    if deps.lanes_needing_a_human:
        outcomes["lane_fenced"] = deps.lanes_needing_a_human
    result.details = outcomes
    return result


def _release_all(deps: Deps, rows: list[Deposit]) -> None:
    with relaxed_transaction(deps.conn):
        deps.conn.execute(RELEASE_SQL, {"ids": [r.id for r in rows], "tokens": [r.token for r in rows]})


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
        lineage = lineages.load(deps.conn, row.deposit_lineage_id)
        state = _drive(deps, row, lineage)
        if state == "applied":
            assert lineage.inner_hash is not None
            with relaxed_transaction(deps.conn):  # re-derivable from the applied lineage
                _write(deps, SET_DEPOSIT_TX_SQL, {"tx": lineage.inner_hash, "id": row.id, "token": row.token})
            row.deposit_tx = lineage.inner_hash
            return "deposit_applied"
        if state == "failed":
            code = lineages.load(deps.conn, lineage.id).result_code
            _finish(deps, row, "failed", f"deposit transaction failed on chain ({code})", event="credit.failed")
            return "failed"
        if state not in ("expired", "superseded", "abandoned"):
            return "waiting"  # still in flight: resent, wait for a ledger
    if row.pending_failure:  # rejected at send; its lineage is now proven dead
        _finish(deps, row, "failed", row.pending_failure, event="credit.failed")
        return "failed"
    try:
        auth = check_deposit_auth(row.auth_entry, account=row.account, amount=row.amount,
                                  usdc=_required(settings.usdc_contract, "PAYGATE_USDC_CONTRACT"),
                                  billing=_required(settings.billing_contract, "PAYGATE_BILLING_CONTRACT"),
                                  passphrase=settings.network_passphrase)
    except BadAuthorization as exc:
        _finish(deps, row, "failed", f"bad authorisation: {exc}", event="credit.failed")
        return "quarantined"
    if auth.nonce != row.auth_nonce or auth.expiration_ledger != row.auth_expiration_ledger:
        _finish(deps, row, "failed", "bad authorisation: nonce/expiration differ from the admitted row",
                event="credit.failed")
        return "quarantined"
    if deps.free_lanes <= 0:
        return "no_free_lane"  # checked before any RPC (a bad authorisation is quarantined first, lane or not)
    consumed, latest = nonce_consumed(deps.chain, row.account, row.auth_nonce)
    if consumed:
        # All our deposit lineages are terminal and none applied (else we would not be here):
        # something that is not this gateway spent the authorisation. Never invent a deposit hash.
        raise NeedsHuman(f"deposit {row.id}: authorisation nonce {row.auth_nonce} of {row.account} is consumed on "
                         "chain but no journaled lineage of ours applied it", msgid="funding.nonce_consumed_elsewhere")
    if latest > row.auth_expiration_ledger:
        _finish(deps, row, "expired", f"authorisation expired at ledger {row.auth_expiration_ledger} "
                f"(latest {latest}) before it could be used", event="credit.expired")
        return "expired"
    from paygate_cli.chain.contracts import sac_transfer

    call = sac_transfer(settings.usdc_contract, row.account, settings.billing_contract, row.amount, auth.entry)
    return _prepare_and_send(deps, row, "deposit", row.entitlement_deposit, "deposit_lineage_id", call)


# -- the credit: the billing contract records the deposit for the account ------------------------

def _credit_phase(deps: Deps, row: Deposit) -> str:
    from paygate_cli.chain.contracts import billing_credit

    assert row.deposit_tx is not None
    if row.credit_lineage_id is not None:
        lineage = lineages.load(deps.conn, row.credit_lineage_id)
        state = _drive(deps, row, lineage)
        if state == "applied":
            crashpoint("funding.before_settle")
            return _settle(deps, row)
        if state == "failed":
            code = lineages.load(deps.conn, lineage.id).result_code
            # The contract dedups on the deposit hash; a credit of ours failing is not explained.
            raise NeedsHuman(f"deposit {row.id}: credit transaction failed on chain ({code}) although the deposit "
                             f"{row.deposit_tx.hex()} applied", msgid="funding.credit_failed")
        if state not in ("expired", "superseded", "abandoned"):
            return "waiting"
    if row.pending_failure:
        raise NeedsHuman(f"deposit {row.id}: credit rejected ({row.pending_failure}) after the deposit applied",
                         msgid="funding.credit_rejected")
    if deps.free_lanes <= 0:
        return "no_free_lane"
    settings = deps.ctx.settings

    def call_for(lane: str) -> Any:
        return billing_credit(settings.billing_contract, lane, row.account, row.amount, row.deposit_tx)

    return _prepare_and_send(deps, row, "credit", row.entitlement_credit, "credit_lineage_id", call_for)


def _settle(deps: Deps, row: Deposit) -> str:
    with deps.conn.transaction():
        won = deps.conn.execute(SETTLE_SQL, {"id": row.id, "by": "funding", "deposit_tx": row.deposit_tx}).fetchone()
    if won is None:
        return "settled_elsewhere"  # the observer won the flip and applied the increment
    deps.ctx.log.info("deposit %s settled: %s credited %s", row.id, row.account, row.amount,
                      extra={"msgid": "funding.settled", "pending_credit_id": row.id})
    return "settled"


# -- shared steps ----------------------------------------------------------------------------------

def _drive(deps: Deps, row: Deposit, lineage: lineages.Lineage) -> str:
    """Move a lineage towards a terminal state; return its state afterwards."""
    from paygate_cli.journal.resolve import resolve

    if lineage.state == "allocated":
        # Allocated but never anchored: the signed bytes (if any) died with their process and were
        # never sent, so nothing can land. Release the lane.
        with relaxed_transaction(deps.conn):
            lineages.abandon(deps.conn, lineage.id, "never anchored (its process stopped before the commit)")
        deps.free_lanes += 1
        return "abandoned"
    if not lineage.live:
        return lineage.state
    resolution = resolve(deps.conn, deps.chain, deps.keyring, lineage)
    if resolution.state not in lineages.LIVE_STATES:
        deps.free_lanes += 1
    if resolution.foreign_sequence_use:
        # DESIGN §4 step 3 / rule 10: the lineage is proven dead (superseded) and resolve fenced the
        # lane; the human is asked about the lane (exit 3). The deposit is not in doubt: its own
        # transaction can never land, and the nonce is checked again before a fresh lineage.
        deps.lanes_needing_a_human += 1
        deps.ctx.log.error("lane %s sequence %s was consumed by a transaction this gateway never journaled "
                           "(someone else is using the lane's key); lineage %s superseded, lane fenced (drained)",
                           lineage.lane, lineage.source_seq, lineage.id,
                           extra={"msgid": "journal.foreign_sequence_use", "pending_credit_id": row.id,
                                  "lineage_id": lineage.id, "lane": lineage.lane,
                                  "chain_seq": resolution.evidence.get("chain_seq")})
    if resolution.evidence.get("decision") == "wait":
        # Disagreement or no majority of covering answers: never decided, but reported.
        deps.ctx.log.warning("lineage %s of deposit %s waits: no majority of read endpoints agrees (%s)",
                             lineage.id, row.id, resolution.evidence.get("verdicts"),
                             extra={"msgid": "journal.no_quorum", "pending_credit_id": row.id,
                                    "lineage_id": lineage.id})
    return resolution.state


def _prepare_and_send(deps: Deps, row: Deposit, purpose: str, entitlement: str, column: str, call: Any) -> str:
    from paygate_cli.chain.contracts import SimulationFailed, build_signed

    settings = deps.ctx.settings
    with relaxed_transaction(deps.conn):  # the anchor's synchronous commit flushes it before any send
        allocated = lineages.allocate(deps.conn, purpose=purpose, entitlement=entitlement,
                                      lanes=list(deps.signer.lanes))
        if allocated is None:
            deps.free_lanes = 0
            return "no_free_lane"
        deps.free_lanes -= 1
        lineage_id, lane = allocated
        _write(deps, SET_LINEAGE_SQL.format(column=column), {"lineage": lineage_id, "id": row.id, "token": row.token})
    crashpoint("funding.after_allocate")
    assert_not_in_transaction(deps.conn, "building a transaction")
    chain_seq = deps.chain.account_sequence(lane)
    seq = lineages.next_sequence(deps.conn, lane, chain_seq)
    latest = deps.chain.latest_ledger()
    invocation = call(lane) if callable(call) else call
    try:
        signed = build_signed(deps.chain, lane=deps.signer.lanes[lane], fee_account=deps.signer.fee, seq=seq,
                              call=invocation, max_time=latest.close_time + int(settings.tx_validity),
                              base_fee=settings.base_fee, fee_bump_base_fee=settings.fee_bump_base_fee)
    except SimulationFailed as exc:
        with deps.conn.transaction():
            lineages.abandon(deps.conn, lineage_id, str(exc))
        if purpose == "deposit":
            _finish(deps, row, "failed", str(exc), event="credit.failed")
            return "failed"
        raise NeedsHuman(f"deposit {row.id}: {exc}", msgid="funding.credit_simulation_failed") from None
    crashpoint("funding.after_sign")
    key_id, ciphertext = deps.keyring.encrypt(signed.envelope_xdr.encode(), lineage_id=lineage_id, source=lane, seq=seq)
    with deps.conn.transaction():
        if not lineages.anchor(deps.conn, lineage_id, seq=seq, key_id=key_id, envelope=ciphertext,
                               inner_hash=signed.inner_hash, outer_hash=signed.outer_hash,
                               max_time=signed.max_time, signed_at_ledger=latest.sequence):
            raise LeaseLost(f"lineage {lineage_id} was no longer allocated at anchor")
        _write(deps, "SELECT 1 FROM paygate.pending_credits WHERE id = %(id)s AND status = 'pending'"
                     " AND lease_token = %(token)s FOR UPDATE", {"id": row.id, "token": row.token})
    # The crash window is closed: the exact bytes are journaled before anything is broadcast.
    crashpoint("funding.after_anchor")
    outcome = deps.chain.send(signed.envelope_xdr)
    crashpoint("funding.after_broadcast" if purpose == "deposit" else "funding.after_credit_broadcast")
    terminal = outcome.status == "ERROR" and outcome.code in TERMINAL_SEND_CODES
    with relaxed_transaction(deps.conn):
        lineages.mark_sent(deps.conn, lineage_id, outcome.label)
        if terminal:
            # Rejected for good; the row ends failed once the lineage is proven dead (maxTime).
            _write(deps, SET_PENDING_FAILURE_SQL, {"reason": f"{purpose} rejected by the network: {outcome.code}",
                                                   "id": row.id, "token": row.token})
    return f"{purpose}_sent"


# Answers that mean "these bytes will never be accepted". txBAD_SEQ, txTOO_LATE and friends are
# not in here: they are not proof by themselves (reference/stellar.md §7); resolve decides.
TERMINAL_SEND_CODES = {"txBAD_AUTH", "txBAD_AUTH_EXTRA", "txMALFORMED", "txSOROBAN_INVALID", "txNO_ACCOUNT",
                       "txNOT_SUPPORTED", "invalid_xdr"}


def _write(deps: Deps, sql: str, params: dict[str, Any]) -> None:
    """A lease-guarded write; zero rows means another worker owns the row now."""
    cursor = deps.conn.execute(sql, params)
    if cursor.rowcount == 0:
        raise LeaseLost(f"deposit {params.get('id')}: lease lost")


def _finish(deps: Deps, row: Deposit, status: str, reason: str, *, event: str) -> None:
    with deps.conn.transaction():
        done = deps.conn.execute(FINISH_ROW_SQL, {"status": status, "reason": reason[:1000], "id": row.id,
                                                  "token": row.token}).fetchone()
        if done is not None:
            deps.conn.execute(EMIT_SQL, (event, Jsonb({"pending_credit_id": row.id, "account": row.account,
                                                       "amount": str(row.amount), "reason": reason[:1000]})))


def _required(value: str | None, variable: str) -> str:
    if not value:
        from paygate_cli.errors import ConfigError

        raise ConfigError(f"{variable} is not set")
    return value
