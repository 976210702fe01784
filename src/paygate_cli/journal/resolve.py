"""Resolving a live lineage (docs/architecture.md §4), one function for workers, recovery and the CLI.

Each read endpoint is probed (sequence first, then the transaction by hash) and judged on its own;
a decision needs a majority of endpoints to reach the same verdict. A NOT_FOUND counts only from an
answer that covers the ledgers where the transaction could have landed, so a lagging node can never
turn "not seen yet" into "dead"."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from paygate_cli.errors import Unavailable
from paygate_cli.journal import lineage as lineages
from paygate_cli.journal.keyring import EnvelopeTampered
from paygate_cli.journal.lineage import Lineage

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.rpc import ChainClient, Probe
    from paygate_cli.journal.keyring import Keyring


def judge(probe: Probe, lineage: Lineage) -> str:
    """One endpoint's verdict: applied | failed | superseded | expired | pending | unknown."""
    if probe.error or probe.tx_status is None:
        return "unknown"
    if probe.tx_status == "SUCCESS":
        return "applied"
    if probe.tx_status == "FAILED":
        return "failed"
    assert lineage.signed_at_ledger is not None and lineage.max_time is not None and lineage.source_seq is not None
    covered = (probe.seq_ledger is not None and probe.latest_ledger is not None and probe.oldest_ledger is not None
               and probe.latest_ledger >= probe.seq_ledger and probe.oldest_ledger <= lineage.signed_at_ledger)
    if not covered:
        return "unknown"
    # Both prove it dead; a consumed sequence is checked first because it also tells us whether
    # someone else used the lane's key (which expiry alone would hide).
    if probe.account_seq is not None and probe.account_seq >= lineage.source_seq:
        return "superseded"
    if probe.latest_close_time is not None and probe.latest_close_time > lineage.max_time:
        return "expired"
    if lineage.max_ledger is not None and probe.latest_ledger > lineage.max_ledger:
        return "expired"  # a closed ledger is past its ledger bound: it can never be included
    return "pending"


def decide(verdicts: list[str]) -> str:
    """Quorum over per-endpoint verdicts: applied | failed | superseded | expired | pending | wait."""
    majority = len(verdicts) // 2 + 1
    counts = Counter(verdicts)
    for found in ("applied", "failed"):
        if counts[found] >= majority:
            return found
    if counts["applied"] or counts["failed"]:
        return "wait"  # some node has it: never call it dead, wait for the others to agree
    if counts["superseded"] >= majority:
        return "superseded"
    if counts["expired"] + counts["superseded"] >= majority:
        return "expired"
    return "pending" if counts["pending"] else "wait"


@dataclass(frozen=True)
class Receipt:
    """What a quorum of read endpoints proved about a lineage that landed: applied or failed, in
    which ledger, for which fee. Recorded by record_receipts()."""

    lineage: Lineage
    state: str  # applied | failed
    ledger: int | None
    fee: int | None
    code: str | None
    resolution: str

    def written(self) -> Lineage:
        """The lineage as the receipt's CAS records it."""
        return replace(self.lineage, state=self.state, ledger=self.ledger, fee_charged=self.fee,
                       result_code=self.code, resolution=self.resolution)


def record_receipts(conn: psycopg.Connection, receipts: list[Receipt]) -> list[Lineage]:
    """Record receipts (a tick's, in one relaxed statement: the chain keeps them, so a lost commit
    is read again); the lineages whose CAS this call won, as written. A deadlock with another
    writer of the same lineages rolled the statement back: they are recorded one by one instead."""
    import psycopg

    rows = [{"id": r.lineage.id, "state": r.state, "ledger": r.ledger, "fee": r.fee, "code": r.code,
             "resolution": r.resolution} for r in receipts]
    try:
        won = lineages.finish_receipts(conn, rows)
    except psycopg.errors.DeadlockDetected:
        won = set().union(*(lineages.finish_receipts(conn, [row]) for row in rows))
    return [r.written() for r in receipts if r.lineage.id in won]


@dataclass
class Resolution:
    state: str  # the lineage's state after this call
    verdicts: list[str] = field(default_factory=list)
    resent: str | None = None  # status of the resend, when one happened
    resent_code: str | None = None  # its ERROR code (txINSUFFICIENT_FEE: the bid is too low for the queue)
    foreign_sequence_use: bool = False  # superseded by a transaction we never journaled
    evidence: dict[str, Any] = field(default_factory=dict)
    probes: list[Probe] = field(default_factory=list)  # what the read endpoints answered (engine reuses them)
    written: Lineage | None = None  # the lineage as this call's own CAS recorded its receipt
    receipt: Receipt | None = None  # applied / failed: what the chain proved (recorded, or left to the caller)
    repeated_rejection: dict[str, Any] | None = None  # this resend opened the lane's finding (journal/rejections.py)


def resolve(conn: psycopg.Connection, chain: ChainClient, keyring: Keyring, lineage: Lineage, *,
            receipts: list[Receipt] | None = None, rejection_threshold: int = 5) -> Resolution:
    """Advance one live, signed lineage as far as the chain proves. `conn` must be outside a
    transaction (the chain client refuses otherwise); each terminal write is its own CAS.
    `receipts`: a receipt (applied / failed) is appended there instead of recorded now, for the
    caller to record with others in one statement (record_receipts) before it acts on any of them.
    `rejection_threshold`: consecutive resends rejected with one ERROR code that open the lane's
    `repeated_rejection` finding (journal/rejections.py)."""
    if not lineage.live or lineage.state == "allocated":
        return Resolution(lineage.state)
    assert lineage.inner_hash is not None
    # Receipt first: a landed transaction (the common case) costs one read per endpoint; anything
    # else is read in the order the proof needs (sequence, then the transaction).
    probes = chain.probe(lineage.lane, lineage.inner_hash.hex(), receipt_first=True)
    if all(p.error for p in probes):
        # No read endpoint answered at all: the RPC is unavailable, not "undecided". Say so (the
        # caller hands its work back) instead of reporting a quiet wait.
        raise Unavailable(f"no read endpoint answered for lineage {lineage.id}: {probes[0].error}"[:500],
                          msgid="rpc.unavailable")
    verdicts = [judge(p, lineage) for p in probes]
    decision = decide(verdicts)
    # Keyed by endpoint name (host only): evidence is stored and shown, and a URL may carry an API key.
    evidence = {"verdicts": {p.endpoint: v for p, v in zip(probes, verdicts, strict=True)}, "decision": decision}
    if decision in ("applied", "failed"):
        probe = next(p for p, v in zip(probes, verdicts, strict=True) if v == decision)
        receipt = Receipt(lineage, decision, probe.tx_ledger, probe.fee_charged, probe.result_code,
                          f"receipt {probe.tx_status} in ledger {probe.tx_ledger}")
        # What this CAS wrote, so the caller need not read the row back (None: someone else's did).
        written = None
        if receipts is None:
            written = next(iter(record_receipts(conn, [receipt])), None)
        else:
            receipts.append(receipt)
        return Resolution(decision, verdicts, evidence={**evidence, "ledger": probe.tx_ledger}, probes=probes,
                          written=written, receipt=receipt)
    if decision in ("expired", "superseded"):
        foreign = False
        if decision == "superseded":
            others = conn.execute(lineages.OTHER_AT_SEQ_SQL, (lineage.lane, lineage.source_seq, lineage.id)).fetchall()
            foreign = not others
        probe = next(p for p, v in zip(probes, verdicts, strict=True) if v in ("expired", "superseded"))
        why = (f"NOT_FOUND through ledger {probe.latest_ledger}; " +
               (f"lane sequence {probe.account_seq} >= {lineage.source_seq}" if decision == "superseded"
                else f"ledger close time {probe.latest_close_time} > maxTime {lineage.max_time}"
                if (probe.latest_close_time or 0) > (lineage.max_time or 0)
                else f"latest ledger {probe.latest_ledger} > maxLedger {lineage.max_ledger}"))
        if foreign:
            why += "; no lineage of ours holds that sequence: consumed by a transaction this gateway never journaled"
            evidence.update(lane=lineage.lane, source_seq=lineage.source_seq, chain_seq=probe.account_seq,
                            lineage_id=lineage.id)
        with conn.transaction():
            # The superseded row and the lane fence commit together: after this, nothing allocates
            # on a lane whose key someone else is using, until a human undrains it.
            if lineages.finish(conn, lineage.id, decision, resolution=why) and foreign:
                # The lane says why; the finding keeps the evidence until an operator resolves it
                # (accepting the chain's sequence: lanes.accepted_seq), so the lane is not fenced again
                # for the same sequence once it is explained and undrained.
                reason = (f"foreign sequence use: sequence {lineage.source_seq} of lineage {lineage.id} "
                          f"(inner hash {lineage.inner_hash.hex()}) consumed by a transaction this gateway "
                          f"never journaled; chain sequence {probe.account_seq}")
                from paygate_cli.settings import rpc_host

                # Endpoints by host only: a URL may carry an API key, and findings are shown.
                hosts = {rpc_host(url): v for url, v in zip(chain.read_urls, verdicts, strict=True)}
                lineages.fence_lane(conn, lineage.lane, by="paygate:foreign_sequence_use",
                                    details={"why": why, **evidence, "verdicts": hosts,
                                             "inner_hash": lineage.inner_hash.hex()},
                                    reason=reason, finding=f"lane {lineage.lane}: {reason}")
        return Resolution(decision, verdicts, foreign_sequence_use=foreign, evidence={**evidence, "why": why},
                          probes=probes)
    # Not proven either way: resend the identical bytes (always safe) and wait. lineage.envelope is
    # the newest committed outer envelope (a replacement fee bump, once one was journaled: the
    # replacement's CAS wrote it), so a resend never revives a replaced bid.
    if lineage.parked_reason is not None:
        # Its bytes do not decrypt (parked earlier): nothing to resend. The probes above still decide
        # it from the chain once a ledger proves it applied, failed or past its maxTime.
        return Resolution("sent", verdicts, evidence={**evidence, "parked": lineage.parked_reason}, probes=probes)
    try:
        envelope = keyring.decrypt(lineage.envelope or b"", key_id=lineage.key_id or "", lineage_id=lineage.id,
                                   source=lineage.lane, seq=lineage.source_seq or 0)
    except EnvelopeTampered as exc:
        # Only the resend needs the bytes, and these cannot be resent; nor may the lineage be called
        # dead (the bytes broadcast earlier may still land, consuming the lane's sequence). Park it and
        # fence its lane: its unit goes to a human, everything else moves on other lanes. Whoever
        # parked it reports it (raises); a racing resolver that lost the park waits quietly.
        if lineages.park(conn, lineage, str(exc)):
            raise
        return Resolution("sent", verdicts, evidence={**evidence, "parked": str(exc)}, probes=probes)
    outcome = chain.send(envelope.decode())
    from paygate_cli.journal.rejections import mark_sent_counting

    counted = mark_sent_counting(conn, lineage, outcome, threshold=rejection_threshold)
    return Resolution("sent", verdicts, resent=outcome.status, resent_code=outcome.code, evidence=evidence,
                      probes=probes, repeated_rejection=counted.opened if counted is not None else None)
