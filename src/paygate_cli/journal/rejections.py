"""Repeated rejection of a lineage's resends: a finding, not a quiet wait.

`ERROR txBAD_SEQ` (and `txTOO_LATE`) proves nothing by itself (docs/architecture.md §4), so resolve
keeps resending the same bytes until the chain proves the lineage applied or dead. On a chain behind
the journal (a reset network, an RPC of another deployment) that is every tick until the maxTime,
with every tick exiting 0. So each resend's answer is counted on the lineage (its rejected_* columns):
consecutive rejections with the same code; the count reaching `repeated_rejection_threshold` opens
one `repeated_rejection` finding on the lane, with the evidence, and the tick exits 3 once. An
accepted resend (PENDING, DUPLICATE) clears the count and resolves the finding: the chain took it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paygate_cli.journal import lineage as lineages

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.rpc import SendOutcome

ACCEPTED = ("PENDING", "DUPLICATE")

# The resend's 'sent' mark (journal/lineage.py MARK_SENT_SQL, the same CAS and columns) with the
# rejection count in the same statement, so counting costs a resend no extra round trip. An
# UNKNOWN or TRY_AGAIN_LATER answer says nothing about the bytes: it leaves the count as it is.
# Relaxed like the mark it replaces: a count lost in a crash is counted again.
MARK_SENT_COUNTING_SQL = """
WITH sent AS (
    UPDATE paygate.lineages
    SET state = 'sent', send_count = send_count + 1, last_send_status = %(status)s,
        sent_at = coalesce(sent_at, now()),
        rejected_count = CASE WHEN %(code)s::text IS NOT NULL
                              THEN CASE WHEN rejected_code = %(code)s THEN rejected_count + 1 ELSE 1 END
                              WHEN %(accepted)s THEN 0 ELSE rejected_count END,
        first_rejected_at = CASE WHEN %(code)s::text IS NOT NULL
                                 THEN CASE WHEN rejected_code = %(code)s THEN first_rejected_at ELSE now() END
                                 WHEN %(accepted)s THEN NULL ELSE first_rejected_at END,
        rejected_code = CASE WHEN %(code)s::text IS NOT NULL THEN %(code)s
                             WHEN %(accepted)s THEN NULL ELSE rejected_code END
    WHERE id = %(id)s AND state IN ('signed', 'sent')
    RETURNING lane, rejected_code, rejected_count, first_rejected_at, send_count
), cleared AS (
    UPDATE paygate.findings f SET resolved_at = now(), resolved_by = 'paygate:send_accepted'
    FROM sent
    WHERE %(accepted)s AND f.kind = 'repeated_rejection' AND f.subject = sent.lane AND f.resolved_at IS NULL
    RETURNING f.id
)
SELECT sent.*, (SELECT count(*) FROM cleared), set_config('synchronous_commit', 'off', true) FROM sent
"""
# One open finding per lane (findings_one_open); a later sighting updates the evidence only.
OPEN_FINDING_SQL = """
INSERT INTO paygate.findings AS f (kind, subject, summary, details, alerted_at)
VALUES ('repeated_rejection', %(lane)s, %(summary)s, %(details)s, now())
ON CONFLICT (kind, subject) WHERE resolved_at IS NULL
DO UPDATE SET last_seen = now(), seen_count = f.seen_count + 1, summary = EXCLUDED.summary, details = EXCLUDED.details
RETURNING (f.seen_count = 1) AS new
"""


@dataclass(frozen=True)
class Rejections:
    """What one resend's answer did to its lineage's count."""

    code: str | None
    count: int
    opened: dict[str, Any] | None = None  # the finding's evidence, when this resend opened it


def mark_sent_counting(conn: psycopg.Connection, lineage: lineages.Lineage, outcome: SendOutcome, *,
                       threshold: int) -> Rejections | None:
    """The resend's 'sent' mark and its rejection count in one statement; at `threshold`
    consecutive rejections with one code, the lane's `repeated_rejection` finding (None: the CAS
    found the lineage no longer live)."""
    from psycopg.types.json import Jsonb

    # txINSUFFICIENT_FEE is the fee market's answer (the queue wants a higher bid: journal/fee_market.py),
    # not a chain behind the journal: like TRY_AGAIN_LATER it leaves the count as it is.
    code = outcome.code if outcome.status == "ERROR" and outcome.code != "txINSUFFICIENT_FEE" else None
    row = lineages.one_statement(conn, MARK_SENT_COUNTING_SQL, {
        "id": lineage.id, "status": outcome.label, "code": code,
        "accepted": outcome.status in ACCEPTED}).fetchone()
    if row is None:
        return None
    lane, rejected_code, count, first_rejected_at, send_count = row[:5]
    if code is None or count < max(1, threshold):
        return Rejections(rejected_code, count)
    evidence = {"lineage_id": lineage.id, "lane": lane, "source_seq": lineage.source_seq,
                "inner_hash": lineage.inner_hash.hex() if lineage.inner_hash else None,
                "code": code, "consecutive_rejections": count, "send_count": send_count,
                "first_rejected_at": first_rejected_at.isoformat() if first_rejected_at else None,
                "why": ("every resend is refused with the same code: a chain behind the journal (a reset "
                        "network, an RPC endpoint of another deployment) or a lane sequence moved back")}
    summary = (f"lane {lane}: lineage {lineage.id} (sequence {lineage.source_seq}) rejected with ERROR {code} "
               f"on {count} consecutive resends")
    new = conn.execute(OPEN_FINDING_SQL, {"lane": lane, "summary": summary, "details": Jsonb(evidence)}
                       ).fetchone()[0]
    return Rejections(code, count, opened=evidence if new else None)
