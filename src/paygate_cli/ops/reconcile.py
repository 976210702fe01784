"""`reconcile-report`: what the reconciler and recovery found, and what is still open, read from
the same tables `status` and alerts read. Set-based SQL only: every section is one statement."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paygate_cli.errors import UsageError
from paygate_cli.queues.ttl import UNKEPT_ENTRIES_SQL

if TYPE_CHECKING:
    import psycopg

ROW_LIMIT = 1000  # rows listed per section; the totals always count everything

# Totals by regime over the latest check of every account (or one account).
TOTALS_SQL = """
SELECT regime, count(*), coalesce(sum(drift), 0), coalesce(sum(in_flight), 0), coalesce(sum(lagging), 0),
       min(checked_at), max(checked_at)
FROM paygate.account_checks
WHERE (%(account)s::text IS NULL OR address = %(account)s)
  AND (%(since)s::timestamptz IS NULL OR checked_at >= %(since)s)
GROUP BY regime ORDER BY regime
"""
# Accounts whose last check did not match (account_checks_regime: only those rows are walked).
DRIFT_SQL = """
SELECT address, regime, chain_balance, cached_balance, drift, in_flight, lagging,
       drift - in_flight - lagging AS unexplained, chain_ledger, checked_at, true AS known_to_paygate
FROM paygate.account_checks
WHERE regime <> 'match' AND (%(account)s::text IS NULL OR address = %(account)s)
  AND (%(since)s::timestamptz IS NULL OR checked_at >= %(since)s)
ORDER BY (regime = 'unexplained') DESC, abs(drift - in_flight - lagging) DESC, address
LIMIT %(limit)s
"""
# Accounts the chain holds money for that paygate.accounts does not have (the reconciler's open
# finding: they have no check row), listed beside the drift rows: no cached balance at all.
UNKNOWN_DRIFT_SQL = """
SELECT subject AS address, 'unexplained' AS regime, (details->>'chain_balance')::numeric AS chain_balance,
       NULL::numeric AS cached_balance, (details->>'chain_balance')::numeric AS drift, 0 AS in_flight, 0 AS lagging,
       (details->>'chain_balance')::numeric AS unexplained, (details->>'ledger')::integer AS chain_ledger,
       last_seen AS checked_at, false AS known_to_paygate
FROM paygate.findings
WHERE kind = 'balance_drift' AND resolved_at IS NULL AND details->>'known_to_paygate' = 'false'
  AND (%(account)s::text IS NULL OR subject = %(account)s)
  AND (%(since)s::timestamptz IS NULL OR last_seen >= %(since)s)
ORDER BY abs((details->>'chain_balance')::numeric) DESC NULLS LAST, subject
LIMIT %(limit)s
"""
# An account paygate has, or one the reconciler reports the chain holding money for.
ACCOUNT_KNOWN_SQL = """
SELECT EXISTS (SELECT 1 FROM paygate.accounts WHERE address = %(account)s)
    OR EXISTS (SELECT 1 FROM paygate.findings WHERE kind = 'balance_drift' AND subject = %(account)s
               AND resolved_at IS NULL AND details->>'known_to_paygate' = 'false')
"""
ACCOUNTS_SQL = """
SELECT count(*) FROM paygate.accounts a WHERE (%(account)s::text IS NULL OR a.address = %(account)s)
"""
UNCHECKED_SQL = """
SELECT count(*) FROM paygate.accounts a
WHERE (%(account)s::text IS NULL OR a.address = %(account)s)
  AND NOT EXISTS (SELECT 1 FROM paygate.account_checks c WHERE c.address = a.address)
"""
# Live lineages older than the threshold (lineages_one_live_per_lane covers only live rows).
UNRESOLVED_SQL = """
SELECT id, purpose, entitlement, lane, state, source_seq, send_count, created_at,
       extract(epoch FROM now() - created_at)::float8 AS age_s
FROM paygate.lineages
WHERE paygate.lineage_is_live(state) AND created_at < now() - make_interval(secs => %(older)s)
ORDER BY created_at LIMIT %(limit)s
"""
QUARANTINED_SQL = """
SELECT event_id, ledger, kind, quarantine_reason, observed_at FROM paygate.chain_events
WHERE quarantined AND (%(since)s::timestamptz IS NULL OR observed_at >= %(since)s)
ORDER BY observed_at LIMIT %(limit)s
"""
# Rows waiting longer than the threshold, per queue: one statement, each branch on its own index.
STUCK_SQL = """
SELECT 'deposits' AS queue, count(*), min(created_at) FROM paygate.deposits
WHERE status = 'pending' AND created_at < now() - make_interval(secs => %(older)s)
UNION ALL
SELECT 'charges', count(*), min(created_at) FROM paygate.charges
WHERE status = 'authorized' AND created_at < now() - make_interval(secs => %(older)s)
UNION ALL
SELECT 'charge_batches', count(*), min(created_at) FROM paygate.charge_batches
WHERE closed_at IS NULL AND created_at < now() - make_interval(secs => %(older)s)
UNION ALL
SELECT 'webhooks.delivering', count(*), min(lease_expires_at) FROM paygate.webhook_outbox
WHERE status = 'delivering' AND lease_expires_at < now() - make_interval(secs => %(older)s)
"""
FINDINGS_SQL = """
SELECT id, kind, subject, summary, first_seen, last_seen, seen_count, resolved_at, resolved_by
FROM paygate.findings
WHERE (resolved_at IS NULL OR (%(since)s::timestamptz IS NOT NULL AND resolved_at >= %(since)s))
  AND (%(account)s::text IS NULL OR subject = %(account)s)
ORDER BY resolved_at IS NOT NULL, first_seen LIMIT %(limit)s
"""


def _rows(conn: psycopg.Connection, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    cursor = conn.execute(sql, params)
    names = [c.name for c in cursor.description or []]
    return [dict(zip(names, row, strict=True)) for row in cursor]


def report(conn: psycopg.Connection, *, since: Any = None, account: str | None = None,
           older_than: float = 600.0) -> dict[str, Any]:
    """The whole report as one document; `unexplained` decides the exit code (3 when any). Every
    section reads the same snapshot (one read-only transaction), so the sections agree."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        # Plain aggregates over large tables: JIT compilation costs seconds here and saves nothing.
        conn.execute("SET LOCAL jit = off")
        return _report(conn, since=since, account=account, older_than=older_than)


def check_account(conn: psycopg.Connection, account: str) -> None:
    """--account must be a real address (2) that paygate has, or that the reconciler found the chain
    holding money for (2, "not known to paygate"): a report about an account nobody holds would say
    "no drift" of anything."""
    from paygate_cli.chain.strkey import is_address

    if not is_address(account):
        raise UsageError(f"--account: {account[:80]!r} is not a Stellar address (G… or C…, 56 characters, "
                         "upper case, valid checksum)", msgid="usage.bad_address")
    if not conn.execute(ACCOUNT_KNOWN_SQL, {"account": account}).fetchone()[0]:
        raise UsageError(f"--account: {account} is not known to paygate (no such account in the database)",
                         msgid="usage.unknown_account")


def _report(conn: psycopg.Connection, *, since: Any, account: str | None, older_than: float) -> dict[str, Any]:
    params = {"since": since, "account": account, "limit": ROW_LIMIT, "older": older_than}
    if account is not None:
        check_account(conn, account)
    totals = [{"regime": r, "accounts": int(n), "drift": d, "in_flight": f, "lagging": lag,
               "oldest_check": lo, "newest_check": hi}
              for r, n, d, f, lag, lo, hi in conn.execute(TOTALS_SQL, params)]
    drift = _rows(conn, DRIFT_SQL, params)
    unknown = _rows(conn, UNKNOWN_DRIFT_SQL, params)  # counted as unexplained through their findings below
    findings = _rows(conn, FINDINGS_SQL, params)
    stuck = [{"queue": q, "count": int(n), "oldest": oldest}
             for q, n, oldest in conn.execute(STUCK_SQL, params) if n]
    unresolved = _rows(conn, UNRESOLVED_SQL, params)
    quarantined = _rows(conn, QUARANTINED_SQL, params)
    # The entries the TTL keeper keeps alive that it cannot vouch for: read archived (a restore is
    # due) or asking a human. An account's balance entry archived is money no transaction moves
    # until it is restored: never reported as "no drift".
    ttl_entries = _rows(conn, UNKEPT_ENTRIES_SQL, params)
    unchecked = int(conn.execute(UNCHECKED_SQL, params).fetchone()[0])
    accounts = int(conn.execute(ACCOUNTS_SQL, params).fetchone()[0])
    open_findings = [f for f in findings if f["resolved_at"] is None]
    unexplained_accounts = sum(t["accounts"] for t in totals if t["regime"] == "unexplained")
    unexplained = unexplained_accounts + sum(1 for f in open_findings if f["kind"] in ("balance_drift",
                                                                                     "total_drift")
                                             and f["subject"] not in {d["address"] for d in drift})
    return {
        "filters": {"since": since, "account": account, "older_than_s": older_than},
        "unexplained": unexplained,
        "totals": totals,
        "accounts": accounts,
        "accounts_never_checked": unchecked,
        "drift": drift + unknown,
        "unresolved_lineages": unresolved,
        "quarantined_events": quarantined,
        "stuck": stuck,
        "lane_gaps": [f for f in open_findings if f["kind"] == "lane_gap"],
        "ttl_entries": ttl_entries,
        "ttl_needs_human": sum(1 for e in ttl_entries if e["state"] == "needs_human"),
        "findings": findings,
    }
