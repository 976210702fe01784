"""Findings: what the reconciler and recovery saw that a human should look at (a balance drift, a
lane gap, an item in flight past its alarm age). One open row per (kind, subject): a repeat sighting
updates it, only a new one alerts, and a later check that matches clears it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

RECORD_FINDINGS_SQL = """
INSERT INTO paygate.findings AS f (kind, subject, summary, details, alerted_at)
SELECT kind, subject, summary, details, now()
FROM unnest(%(kind)s::text[], %(subject)s::text[], %(summary)s::text[], %(details)s::jsonb[])
     AS n(kind, subject, summary, details)
ON CONFLICT (kind, subject) WHERE resolved_at IS NULL
DO UPDATE SET last_seen = now(), seen_count = f.seen_count + 1, summary = EXCLUDED.summary, details = EXCLUDED.details
RETURNING f.id, f.kind, f.subject, f.summary, (f.seen_count = 1) AS new
"""
CLEAR_FINDINGS_SQL = """
UPDATE paygate.findings SET resolved_at = now(), resolved_by = %(by)s
WHERE resolved_at IS NULL AND kind = %(kind)s AND subject = ANY(%(subjects)s)
RETURNING id, subject
"""


@dataclass
class Finding:
    kind: str
    subject: str
    summary: str
    details: dict[str, Any]


def record_findings(conn: psycopg.Connection, findings: list[Finding], log: Any) -> list[tuple]:
    """Store findings (one statement); log the new ones once, at error. -> the rows written."""
    from psycopg.types.json import Jsonb

    if not findings:
        return []
    rows = conn.execute(RECORD_FINDINGS_SQL, {
        "kind": [f.kind for f in findings], "subject": [f.subject for f in findings],
        "summary": [f.summary for f in findings], "details": [Jsonb(f.details) for f in findings]}).fetchall()
    for finding_id, kind, subject, summary, new in rows:
        if new:
            log.error("finding %s (%s %s): %s", finding_id, kind, subject, summary,
                      extra={"msgid": f"finding.{kind}", "finding_id": finding_id, "subject": subject})
    return rows


def clear_findings(conn: psycopg.Connection, kind: str, subjects: list[str], by: str, log: Any) -> int:
    if not subjects:
        return 0
    rows = conn.execute(CLEAR_FINDINGS_SQL, {"kind": kind, "subjects": subjects, "by": by}).fetchall()
    for finding_id, subject in rows:
        log.info("finding %s (%s %s) cleared: a later check matches", finding_id, kind, subject,
                 extra={"msgid": f"finding.{kind}.cleared", "finding_id": finding_id})
    return len(rows)
