"""`trace`: one unit of money's whole story, the database and the chain side by side, and a verdict.

A unit is a deposit, a charge, a relay, a bot job (each by its id), a transaction (by its inner or any
outer hash: the unit its lineage pays for) or an account (deposits − charges against its balance in
the billing contract). The database side is read in one read-only snapshot, hot tables and
`paygate_archive` alike (a charge retention archived is traced from there); the chain side is re-read
now, with no transaction open (docs/architecture.md §1 rule 2): each lineage's receipt by
getTransaction on every read endpoint and decided by the journal's own quorum rule
(journal/resolve.py judge/decide), the deposit's authorisation nonce, the billing events of the
unit, the account's balance entry.

The verdict uses the reconciler's regimes (workers/reconciler.py): `match` (the sides agree),
`in_flight` (work the chain has not included yet), `lagging` (the chain is ahead of what the
database has recorded: a worker's next tick or the observer records it), `unexplained` (a human
must look: exit 3), plus `unreadable` when the chain could not be read (exit 1, said in the
verdict). Read-only: nothing is sent or written; never an envelope, ciphertext, auth entry or secret."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from paygate_cli.endpoints import redact_urls
from paygate_cli.errors import ConfigError, UsageError
from paygate_cli.journal import lineage as lineages

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.rpc import ChainClient

UNIT_KINDS = ("deposit", "charge", "relay", "bot-job")
KINDS = (*UNIT_KINDS, "tx", "account")
# Worst first: the verdict of a unit is its worst part's regime.
REGIMES = ("unexplained", "unreadable", "lagging", "in_flight", "match")
TIMELINE_LIMIT = 200  # an account's deposits and charges listed on its timeline (the sums count all)
EVENT_PAGES = 5  # getEvents pages read past the observer's cursor for an account
HASH_RE = re.compile(r"^[0-9a-f]{64}$")

SNAPSHOT_SQL = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"

# The lineage columns with the ciphertext never read: nothing here may print it.
_LINEAGE_SELECT = ", ".join("NULL::bytea AS envelope" if c == "envelope" else c for c in lineages.LINEAGE_COLUMNS)
_LINEAGE_EXTRA = "created_at, signed_at, sent_at, resolved_at, send_count, last_send_status, parked_at"
LINEAGES_SQL = f"""
SELECT {_LINEAGE_SELECT}, {_LINEAGE_EXTRA}, NULL::timestamptz AS archived_at FROM paygate.lineages
WHERE id = ANY(%(ids)s) OR entitlement = ANY(%(entitlements)s)
UNION ALL
SELECT {_LINEAGE_SELECT}, {_LINEAGE_EXTRA}, archived_at FROM paygate_archive.lineages
WHERE id = ANY(%(ids)s) OR entitlement = ANY(%(entitlements)s)
ORDER BY 1
"""
ENVELOPES_SQL = """
SELECT lineage_id, replaced_by, outer_hash, bid_rate, bid_ledger, replaced_at FROM paygate.lineage_envelopes
WHERE lineage_id = ANY(%s) ORDER BY lineage_id, replaced_by
"""
# Which lineage a hash names: its inner hash, its current outer hash, or an outer hash it replaced.
HASH_SQL = """
SELECT id, entitlement, 'inner' FROM paygate.lineages WHERE inner_hash = %(h)s
UNION ALL SELECT id, entitlement, 'inner' FROM paygate_archive.lineages WHERE inner_hash = %(h)s
UNION ALL SELECT id, entitlement, 'outer' FROM paygate.lineages WHERE outer_hash = %(h)s
UNION ALL SELECT id, entitlement, 'outer' FROM paygate_archive.lineages WHERE outer_hash = %(h)s
UNION ALL SELECT e.lineage_id, l.entitlement, 'replaced outer' FROM paygate.lineage_envelopes e
          JOIN paygate.lineages l ON l.id = e.lineage_id WHERE e.outer_hash = %(h)s
"""
BATCH_CHARGES_SQL = """
SELECT id FROM paygate.charges WHERE lineage_id = %(id)s OR %(id)s = ANY(dead_lineages)
UNION SELECT id FROM paygate_archive.charges WHERE lineage_id = %(id)s OR %(id)s = ANY(dead_lineages)
ORDER BY 1
"""
DEPOSIT_SQL = """
SELECT id, account, amount, auth_nonce, auth_expiration_ledger, idempotency_key, status, attempts, lease_token::text,
       lease_expires_at, claimed_by, deposit_lineage_id, credit_lineage_id, deposit_tx, pending_failure, reason,
       settled_by, settled_at, created_at, updated_at
FROM paygate.deposits WHERE id = %s
"""
CHARGE_COLUMNS = ("id, charge_id, account, amount, idempotency_key, description, subscription_id, period_start, "
                  "status, claimed_at, claimed_by, lineage_id, attempts, dead_lineages, reason, failed_by, event_id, "
                  "settled_ledger, settled_at, failed_at, created_at, updated_at")
CHARGE_SQL = f"""
SELECT {CHARGE_COLUMNS}, NULL::timestamptz AS archived_at FROM paygate.charges WHERE id = %(id)s
UNION ALL SELECT {CHARGE_COLUMNS}, archived_at FROM paygate_archive.charges WHERE id = %(id)s
"""
BATCHES_SQL = """
SELECT lineage_id, entries, lease_token::text, lease_expires_at, claimed_by, outcome, created_at, closed_at,
       NULL::timestamptz AS archived_at FROM paygate.charge_batches WHERE lineage_id = ANY(%(ids)s)
UNION ALL
SELECT lineage_id, entries, lease_token::text, lease_expires_at, claimed_by, outcome, created_at, closed_at,
       archived_at
FROM paygate_archive.charge_batches WHERE lineage_id = ANY(%(ids)s)
"""
RELAY_SQL = """
SELECT id, account, contract, function, auth_nonces, auth_expiration_ledger, max_fee, idempotency_key, status,
       attempts, lease_token::text, lease_expires_at, claimed_by, lineage_id, dead_lineages, pending_failure,
       fee_charged, tx_hash, reason, finished_at, created_at, updated_at
FROM paygate.relays WHERE id = %s
"""
RESERVATIONS_SQL = """
SELECT round, amount, status, fee_charged, lineage_id, reason, created_at, closed_at
FROM paygate.fee_reservations WHERE relay_id = %s ORDER BY round
"""
BOT_JOB_SQL = """
SELECT id, job_key, contract, function, status, attempts, max_attempts, lease_token::text, lease_expires_at, claimed_by,
       lineage_id, dead_lineages, pending_failure, fee_charged, tx_hash, reason, finished_at, created_at, updated_at
FROM paygate.bot_jobs WHERE id = %s
"""
IDEMPOTENCY_SQL = "SELECT created_at, expires_at FROM paygate.idempotency_keys WHERE scope = %s AND key = %s"
# The outbox rows announcing the unit (payload names it by the id key of its events). Never the
# endpoint's URL or secret (webhook_endpoints is not readable read-only), nor a delivery's error text.
WEBHOOKS_SQL = """
SELECT id, event_type, endpoint_id, status, attempts, last_status_code, created_at, delivered_at, dead_at,
       NULL::timestamptz AS archived_at
FROM paygate.webhook_outbox WHERE payload ->> %(key)s = %(id)s
UNION ALL
SELECT id, event_type, endpoint_id, status, attempts, last_status_code, created_at, delivered_at, dead_at, archived_at
FROM paygate_archive.webhook_outbox WHERE payload ->> %(key)s = %(id)s
ORDER BY created_at, id
"""
AUDIT_SQL = """
SELECT id, at, actor, action, target, details FROM paygate.audit_log WHERE target = ANY(%s) ORDER BY at, id
"""
FINDINGS_SQL = """
SELECT id, kind, subject, summary, first_seen, last_seen, seen_count, resolved_at, resolved_by
FROM paygate.findings WHERE subject = ANY(%s) ORDER BY first_seen, id
"""
CHAIN_EVENTS_SQL = """
SELECT event_id, ledger, tx_hash, kind, effect, applied_to, quarantined, observed_at,
       NULL::timestamptz AS archived_at FROM paygate.chain_events
WHERE applied_to = ANY(%(targets)s) OR event_id = ANY(%(ids)s)
UNION ALL
SELECT event_id, ledger, tx_hash, kind, effect, applied_to, quarantined, observed_at, archived_at
FROM paygate_archive.chain_events WHERE applied_to = ANY(%(targets)s) OR event_id = ANY(%(ids)s)
ORDER BY ledger, event_id
"""
CURSOR_SQL = "SELECT cursor, ledger FROM paygate.observer_cursor"
SOURCE_SQL = "SELECT address FROM paygate.lanes ORDER BY address LIMIT 1"
ACCOUNT_SQL = "SELECT address, cached_balance, created_at, updated_at FROM paygate.accounts WHERE address = %s"
# deposits − charges, every charge counted (the archive holds only settled and failed ones).
ACCOUNT_SUMS_SQL = """
SELECT (SELECT coalesce(sum(amount), 0) FROM paygate.deposits WHERE account = %(a)s AND status = 'settled'),
       (SELECT count(*) FROM paygate.deposits WHERE account = %(a)s AND status = 'settled'),
       coalesce(sum(amount) FILTER (WHERE status = 'settled'), 0),
       coalesce(sum(amount) FILTER (WHERE status = 'authorized'), 0),
       coalesce(sum(amount) FILTER (WHERE status = 'needs_human'), 0),
       count(*) FILTER (WHERE status = 'settled'), count(*) FILTER (WHERE archived),
       coalesce(sum(amount) FILTER (WHERE status = 'settled' AND archived), 0)
FROM (SELECT amount, status, false AS archived FROM paygate.charges WHERE account = %(a)s
      UNION ALL SELECT amount, status, true FROM paygate_archive.charges WHERE account = %(a)s) c
"""
# The units that can explain a difference: charges debited and not on chain yet, charges a human
# holds, deposits under way.
ACCOUNT_OPEN_SQL = """
SELECT 'charge', c.id, c.amount, c.status, x.state, x.id, NULL::bytea FROM paygate.charges c
LEFT JOIN paygate.lineages x ON x.id = c.lineage_id
WHERE c.account = %(a)s AND c.status IN ('authorized', 'needs_human')
UNION ALL
SELECT 'deposit', d.id, d.amount, d.status, x.state, x.id, d.deposit_tx FROM paygate.deposits d
LEFT JOIN paygate.lineages x ON x.id = d.credit_lineage_id
WHERE d.account = %(a)s AND d.status IN ('pending', 'needs_human')
ORDER BY 1, 2
"""
ACCOUNT_HISTORY_SQL = """
(SELECT 'deposit' AS unit, id, amount, status, created_at, settled_at AS finished_at, false AS archived
 FROM paygate.deposits WHERE account = %(a)s ORDER BY id DESC LIMIT %(n)s)
UNION ALL
(SELECT 'charge', id, amount, status, created_at, coalesce(settled_at, failed_at), false FROM paygate.charges
 WHERE account = %(a)s ORDER BY id DESC LIMIT %(n)s)
UNION ALL
(SELECT 'charge', id, amount, status, created_at, coalesce(settled_at, failed_at), true FROM paygate_archive.charges
 WHERE account = %(a)s ORDER BY id DESC LIMIT %(n)s)
"""
# Credits the cached balance already holds (a credit event past the observer's cursor whose deposit
# funding settled is not lagging: the reconciler's rule, workers/reconciler.py).
SETTLED_TX_SQL = """
SELECT encode(deposit_tx, 'hex') FROM paygate.deposits
WHERE account = %s AND status = 'settled' AND deposit_tx IS NOT NULL
"""
ACCOUNT_CHECK_SQL = """
SELECT checked_at, chain_ledger, chain_balance, cached_balance, in_flight, lagging, regime, drift
FROM paygate.account_checks WHERE address = %s
"""


# -- the request ------------------------------------------------------------------------------------

def check_request(kind: str, ref: str) -> str:
    """Refused before the database is asked anything (2): an unknown kind, an id that is not a
    positive integer, a hash that is not 64 hex digits, an account that is not a Stellar address.
    -> the reference normalised (a hash in lower case)."""
    from paygate_cli.chain.strkey import is_address

    if kind not in KINDS:
        raise UsageError(f"trace: {kind[:40]!r} is not one of {', '.join(KINDS)}", msgid="usage.trace_kind")
    if kind in UNIT_KINDS:
        if not ref.isascii() or not ref.isdigit() or int(ref) <= 0 or int(ref) >= 2**63:
            raise UsageError(f"trace {kind}: {ref[:80]!r} is not an id (a positive integer)", msgid="usage.trace_id")
        return str(int(ref))
    if kind == "tx":
        if not HASH_RE.match(ref.lower()):
            raise UsageError(f"trace tx: {ref[:80]!r} is not a transaction hash (64 hex digits)",
                             msgid="usage.trace_hash")
        return ref.lower()
    if not is_address(ref):
        raise UsageError(f"trace account: {ref[:80]!r} is not a Stellar address (G… or C…, 56 characters, "
                         "upper case, valid checksum)", msgid="usage.bad_address")
    return ref


# -- small pieces -----------------------------------------------------------------------------------

def _snapshot(conn: psycopg.Connection) -> None:
    """Every part of the database side from one read-only snapshot, so the parts agree."""
    conn.execute(SNAPSHOT_SQL)
    # An account's sums walk all its charges (no index on charges (account): sql/0001_baseline.sql);
    # JIT compilation costs more than it saves on such plain aggregates, as in reconcile-report.
    conn.execute("SET LOCAL jit = off")


def _rows(conn: psycopg.Connection, sql: str, params: Any) -> list[dict[str, Any]]:
    cursor = conn.execute(sql, params)
    names = [c.name for c in cursor.description or []]
    return [dict(zip(names, row, strict=True)) for row in cursor]


def _one(conn: psycopg.Connection, sql: str, params: Any) -> dict[str, Any] | None:
    found = _rows(conn, sql, params)
    return found[0] if found else None


def _hex(value: Any) -> str | None:
    return bytes(value).hex() if value is not None else None


def _event(at: Any, source: str, kind: str, ledger: int | None = None, **details: Any) -> dict[str, Any]:
    return {"at": at, "ledger": ledger, "source": source, "kind": kind,
            "details": {k: v for k, v in details.items() if v is not None}}


def _worst(regimes: list[tuple[str, str]]) -> tuple[str, list[str]]:
    """The worst regime of the parts, and the explanations of every part at that regime."""
    if not regimes:
        return "match", []
    worst = min((r for r, _ in regimes), key=REGIMES.index)
    return worst, [text for r, text in regimes if r == worst]


def _now() -> datetime:
    return datetime.now(UTC)


class Chain:
    """The chain side of one trace: the client (built on first use, so a unit the database does
    not know costs no stellar_sdk) and every read that failed, said in the verdict."""

    def __init__(self, conn: psycopg.Connection, settings: Any) -> None:
        self.conn, self.settings = conn, settings
        self.client: ChainClient | None = None
        self.errors: list[str] = []
        self.unusable: str | None = None

    def get(self) -> ChainClient | None:
        if self.client is None and self.unusable is None:
            from paygate_cli.chain.rpc import ChainClient

            try:
                self.client = ChainClient(self.settings, guard_conn=self.conn)
            except ConfigError as exc:  # no RPC configured: the chain side cannot be read, said so
                self.unusable = str(exc)
                self.errors.append(str(exc))
        return self.client

    def read(self, what: str, fn: Callable[[ChainClient], Any]) -> Any:
        """fn(client), or None with the failure recorded (an unreachable RPC, a refused read)."""
        client = self.get()
        if client is None:
            return None
        try:
            return fn(client)
        except (AssertionError, AttributeError, NameError, TypeError):
            raise  # a bug in paygate, never "the chain could not be read"
        except Exception as exc:  # an unreachable RPC, an error answer, a refused simulation, a retention gap
            # Host only: a provider's API key may ride in an endpoint's URL (endpoints.py).
            self.errors.append(redact_urls(f"{what}: {type(exc).__name__}: {exc}")[:300])
            return None

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


# -- lineages ---------------------------------------------------------------------------------------

def load_lineages(conn: psycopg.Connection, *, ids: list[int], entitlements: list[str]) -> list[dict[str, Any]]:
    """Hot and archived lineages, each as {lineage (Lineage), times, archived_at, outer_hashes}."""
    rows = conn.execute(LINEAGES_SQL, {"ids": ids, "entitlements": entitlements}).fetchall()
    count = len(lineages.LINEAGE_COLUMNS)
    found = []
    for row in rows:
        lineage = lineages.Lineage(*row[:count])
        created, signed, sent, resolved, send_count, last_send, parked, archived = row[count:]
        found.append({"lineage": lineage, "created_at": created, "signed_at": signed, "sent_at": sent,
                      "resolved_at": resolved, "send_count": send_count, "last_send_status": last_send,
                      "parked_at": parked, "archived_at": archived, "replaced": []})
    by_id = {item["lineage"].id: item for item in found}
    for lineage_id, replaced_by, outer, bid, bid_ledger, at in conn.execute(ENVELOPES_SQL, (list(by_id),)):
        by_id[lineage_id]["replaced"].append({"replaced_by": replaced_by, "outer_hash": _hex(outer),
                                              "bid_rate": bid, "bid_ledger": bid_ledger, "replaced_at": at})
    return found


def lineage_events(item: dict[str, Any]) -> list[dict[str, Any]]:
    lin: lineages.Lineage = item["lineage"]
    ref = {"lineage": lin.id, "purpose": lin.purpose, "entitlement": lin.entitlement}
    events = [_event(item["created_at"], "db", "lineage.allocated", **ref, lane=lin.lane)]
    replaced = item["replaced"]
    if item["signed_at"] is not None or lin.inner_hash is not None:
        first_outer = replaced[0]["outer_hash"] if replaced else _hex(lin.outer_hash)
        first_bid = replaced[0]["bid_rate"] if replaced else lin.bid_rate
        events.append(_event(item["signed_at"], "db", "lineage.signed", lin.signed_at_ledger, **ref,
                             lane=lin.lane, sequence=lin.source_seq, inner_hash=_hex(lin.inner_hash),
                             outer_hash=first_outer, bid_rate=first_bid, fee_ops=lin.fee_ops,
                             resource_fee=lin.resource_fee, cap_rate=lin.cap_rate, max_time=lin.max_time,
                             max_ledger=lin.max_ledger, key_id=lin.key_id))
    for n, env in enumerate(replaced):
        # Each replacement: the outer envelope it replaced, and the one that took its place.
        after = replaced[n + 1] if n + 1 < len(replaced) else None
        events.append(_event(env["replaced_at"], "db", "lineage.rebumped", **ref, replaced_outer_hash=env["outer_hash"],
                             replaced_bid_rate=env["bid_rate"],
                             outer_hash=after["outer_hash"] if after else _hex(lin.outer_hash),
                             bid_rate=after["bid_rate"] if after else lin.bid_rate))
    if item["sent_at"] is not None:
        events.append(_event(item["sent_at"], "db", "lineage.sent", **ref, sends=item["send_count"],
                             last_send_status=item["last_send_status"]))
    if lin.fee_capped_at is not None:
        events.append(_event(lin.fee_capped_at, "db", "lineage.fee_capped", **ref, fee_required=lin.fee_required,
                             cap_rate=lin.cap_rate))
    if item["parked_at"] is not None:
        events.append(_event(item["parked_at"], "db", "lineage.parked", **ref, reason=lin.parked_reason))
    if not lin.live:
        events.append(_event(item["resolved_at"], "db", f"lineage.{lin.state}", lin.ledger, **ref,
                             fee_charged=lin.fee_charged, result_code=lin.result_code, resolution=lin.resolution))
    if item["archived_at"] is not None:
        events.append(_event(item["archived_at"], "db", "lineage.archived", **ref))
    return events


def read_receipt(chain: Chain, lin: lineages.Lineage) -> dict[str, Any] | None:
    """getTransaction(inner hash) on every read endpoint, decided as resolve decides; None when the
    chain could not be asked at all."""
    if lin.inner_hash is None:
        return None
    from paygate_cli.journal.resolve import decide, judge

    probes = chain.read(f"lineage {lin.id} receipt",
                        lambda c: c.probe(lin.lane, lin.inner_hash.hex(), receipt_first=True))  # type: ignore[union-attr]
    if probes is None:
        return None
    verdicts = [judge(p, lin) for p in probes]
    return {"decision": decide(verdicts),
            "endpoints": [{"endpoint": p.endpoint, "verdict": v, "error": p.error, "tx_status": p.tx_status,
                           "ledger": p.tx_ledger, "fee_charged": p.fee_charged, "result_code": p.result_code,
                           "latest_ledger": p.latest_ledger, "oldest_ledger": p.oldest_ledger}
                          for p, v in zip(probes, verdicts, strict=True)]}


def compare_lineage(lin: lineages.Lineage, receipt: dict[str, Any] | None) -> tuple[str, str]:
    """The journal's state of one lineage against the chain's receipt: (regime, why)."""
    name = f"lineage {lin.id} ({lin.purpose})"
    if lin.inner_hash is None:  # never signed: nothing of it can be on chain
        return ("in_flight", f"{name} allocated, not signed yet") if lin.live else ("match", f"{name} {lin.state}")
    if receipt is None or all(e["error"] for e in receipt["endpoints"]):
        errors = "; ".join(e["error"] for e in receipt["endpoints"])[:200] if receipt else "the chain was not read"
        return "unreadable", f"{name}: no read endpoint answered getTransaction ({errors})"
    decision = receipt["decision"]
    landed = [e for e in receipt["endpoints"] if e["tx_status"] in ("SUCCESS", "FAILED")]
    where = f" in ledger {landed[0]['ledger']}" if landed else ""
    if lin.state in ("applied", "failed"):
        if decision == lin.state:
            return "match", f"{name} {lin.state} in ledger {lin.ledger}, as the chain says"
        if decision in ("applied", "failed"):
            return "unexplained", f"{name}: the journal says {lin.state}, the chain says {decision}{where}"
        oldest = [e["oldest_ledger"] for e in receipt["endpoints"] if e["oldest_ledger"] is not None]
        if oldest and lin.ledger is not None and min(oldest) > lin.ledger:
            return "unreadable", (f"{name} {lin.state} in ledger {lin.ledger}: the read endpoints keep ledgers from "
                                  f"{min(oldest)} on, so the receipt cannot be read again")
        return "unexplained", (f"{name}: the journal says {lin.state} in ledger {lin.ledger}, but a majority of the "
                               f"read endpoints do not find it (decision: {decision})")
    if lin.live:
        if decision in ("applied", "failed"):
            return "lagging", (f"{name}: the chain has it {decision}{where}; the journal has not recorded it yet "
                               "(its worker's next tick or recovery resolves it)")
        return "in_flight", f"{name} {lin.state}, not on chain yet (chain: {decision})"
    if decision in ("applied", "failed"):  # expired / superseded, yet included
        return "unexplained", f"{name}: the journal says {lin.state}, but the chain has it {decision}{where}"
    return "match", f"{name} {lin.state}: not on chain, as the journal says"


def trace_lineages(chain: Chain, items: list[dict[str, Any]], timeline: list[dict[str, Any]],
                   regimes: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Each lineage's events, its receipt re-read from the chain, and its comparison."""
    shown = []
    for item in items:
        lin: lineages.Lineage = item["lineage"]
        timeline.extend(lineage_events(item))
        receipt = read_receipt(chain, lin)
        if receipt is not None and not all(e["error"] for e in receipt["endpoints"]):  # some endpoint answered
            landed = [e for e in receipt["endpoints"] if e["tx_status"] in ("SUCCESS", "FAILED")]
            timeline.append(_event(_now(), "chain", "receipt", landed[0]["ledger"] if landed else None,
                                   lineage=lin.id, inner_hash=_hex(lin.inner_hash), decision=receipt["decision"],
                                   fee_charged=landed[0]["fee_charged"] if landed else None,
                                   result_code=landed[0]["result_code"] if landed else None,
                                   endpoints=[f"{e['endpoint']}: {e['tx_status'] or e['error']}"
                                              for e in receipt["endpoints"]]))
        regime, why = compare_lineage(lin, receipt)
        regimes.append((regime, why))
        outer = [r["outer_hash"] for r in item["replaced"]] + ([_hex(lin.outer_hash)] if lin.outer_hash else [])
        shown.append(lin.public() | {"outer_hashes": outer, "created_at": item["created_at"],
                                     "signed_at": item["signed_at"], "sent_at": item["sent_at"],
                                     "resolved_at": item["resolved_at"], "send_count": item["send_count"],
                                     "archived": item["archived_at"] is not None, "chain": receipt,
                                     "regime": regime, "explanation": why})
    return shown


def receipt_fee(receipt: dict[str, Any] | None) -> int | None:
    """The fee charged as the landed answers say (the first that has one)."""
    for endpoint in (receipt or {}).get("endpoints", []):
        if endpoint["tx_status"] in ("SUCCESS", "FAILED") and endpoint["fee_charged"] is not None:
            return int(endpoint["fee_charged"])
    return None


# -- the unit's surroundings: admission key, webhooks, audit, findings -------------------------------

def surroundings(conn: psycopg.Connection, timeline: list[dict[str, Any]], *, payload_key: str, unit_id: int,
                 targets: list[str], subjects: list[str], idempotency: tuple[str, str] | None = None
                 ) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if idempotency is not None:
        key = _one(conn, IDEMPOTENCY_SQL, idempotency)
        found["idempotency"] = {"scope": idempotency[0], "key": idempotency[1],
                                "recorded_at": key["created_at"] if key else None,
                                "expires_at": key["expires_at"] if key else None, "swept": key is None}
    webhooks = _rows(conn, WEBHOOKS_SQL, {"key": payload_key, "id": str(unit_id)})
    for hook in webhooks:
        timeline.append(_event(hook["created_at"], "db", "webhook", outbox_id=hook["id"], event=hook["event_type"],
                               endpoint_id=hook["endpoint_id"], status=hook["status"], attempts=hook["attempts"],
                               last_status_code=hook["last_status_code"],
                               delivered_at=hook["delivered_at"], dead_at=hook["dead_at"],
                               archived=True if hook["archived_at"] else None))
    audit = _rows(conn, AUDIT_SQL, (targets,))
    for entry in audit:
        timeline.append(_event(entry["at"], "db", "audit", audit_id=entry["id"], actor=entry["actor"],
                               action=entry["action"], target=entry["target"]))
    findings = _rows(conn, FINDINGS_SQL, (subjects,))
    for finding in findings:
        timeline.append(_event(finding["first_seen"], "db", "finding", finding_id=finding["id"],
                               finding=finding["kind"], subject=finding["subject"], summary=finding["summary"],
                               resolved_at=finding["resolved_at"], resolved_by=finding["resolved_by"]))
    return found | {"webhooks": webhooks, "audit": audit, "findings": findings}


def open_findings(found: dict[str, Any]) -> list[tuple[str, str]]:
    return [("unexplained", f"open finding {f['id']} ({f['kind']}): {f['summary']}"[:300])
            for f in found["findings"] if f["resolved_at"] is None]


def billing_events_at(chain: Chain, ledger: int, match: Callable[[Any], bool]) -> list[dict[str, Any]] | None:
    """The billing contract's events in `ledger` that `match` (decoded), or None when unreadable."""
    from paygate_cli.chain.charges import UndecodableEvent, decode_billing_event, get_events

    billing = chain.settings.billing_contract
    if not billing:
        chain.errors.append("no billing contract configured (PAYGATE_BILLING_CONTRACT): its events were not read")
        return None

    def read(client: ChainClient) -> list[dict[str, Any]]:
        found = []
        cursor: str | None = None
        for _ in range(EVENT_PAGES):
            page = get_events(client, billing, cursor=cursor, start_ledger=None if cursor else ledger, limit=1000)
            for raw in page.events:
                if raw.ledger != ledger:
                    continue
                try:
                    event = decode_billing_event(raw)
                except UndecodableEvent:
                    continue
                if match(event):
                    found.append({"event_id": raw.id, "ledger": raw.ledger, "kind": event.kind,
                                  "account": event.account, "amount": event.amount, "ref": event.ref.hex(),
                                  "reason": event.reason})
            if len(page.events) < 1000 or page.events[-1].ledger > ledger:
                break
            cursor = page.cursor
        return found

    return chain.read(f"billing events of ledger {ledger}", read)


def balance_entry(chain: Chain, conn_source: str | None, account: str) -> tuple[int, int] | None:
    """The account's balance in the billing contract now, (balance, ledger), or None."""
    from paygate_cli.chain.balances import billing_balance_at

    billing = chain.settings.billing_contract
    if not billing:
        chain.errors.append("no billing contract configured (PAYGATE_BILLING_CONTRACT): the balance was not read")
        return None
    # Simulation needs a source account that exists: any lane, else the account itself.
    source = conn_source or (account if account.startswith("G") else None)
    if source is None:
        chain.errors.append(f"no lane to simulate balance({account}) from")
        return None
    return chain.read(f"balance({account})",
                      lambda c: billing_balance_at(c, billing=billing, account=account, source=source))


def _balance_event(timeline: list[dict[str, Any]], account: str, read: tuple[int, int] | None) -> None:
    if read is not None:
        timeline.append(_event(_now(), "chain", "balance", read[1], account=account, balance=read[0]))


# -- deposit ----------------------------------------------------------------------------------------

def _deposit_db(conn: psycopg.Connection, deposit_id: int) -> dict[str, Any]:
    row = _one(conn, DEPOSIT_SQL, (deposit_id,))
    if row is None:
        raise UsageError(f"no deposit {deposit_id}", msgid="usage.unknown_unit")
    items = load_lineages(conn, ids=[], entitlements=[f"deposit:{deposit_id}:deposit", f"deposit:{deposit_id}:credit"])
    account = _one(conn, ACCOUNT_SQL, (row["account"],))
    events = _rows(conn, CHAIN_EVENTS_SQL, {"targets": [f"deposit:{deposit_id}"], "ids": []})
    return {"row": row, "lineages": items, "account": account, "chain_events": events}


def trace_deposit(conn: psycopg.Connection, chain: Chain, deposit_id: int) -> dict[str, Any]:
    timeline: list[dict[str, Any]] = []
    with conn.transaction():
        _snapshot(conn)
        db = _deposit_db(conn, deposit_id)
        around = surroundings(conn, timeline, payload_key="deposit_id", unit_id=deposit_id,
                              targets=[f"deposit:{deposit_id}", f"deposits:{deposit_id}"],
                              subjects=[f"deposit:{deposit_id}",
                                        *(f"lineage:{i['lineage'].id}" for i in db["lineages"])],
                              idempotency=("deposit", db["row"]["idempotency_key"]))
        source = (conn.execute(SOURCE_SQL).fetchone() or [None])[0]
    row = db["row"]
    timeline.append(_event(row["created_at"], "db", "admitted", deposit=deposit_id, account=row["account"],
                           amount=row["amount"], idempotency_key=row["idempotency_key"], nonce=row["auth_nonce"],
                           expiration_ledger=row["auth_expiration_ledger"]))
    if row["lease_token"] is not None or row["attempts"]:
        timeline.append(_event(row["updated_at"], "db", "lease", claimed_by=row["claimed_by"],
                               lease_token=row["lease_token"], lease_expires_at=row["lease_expires_at"],
                               attempts=row["attempts"]))
    if row["status"] != "pending":
        timeline.append(_event(row["settled_at"] or row["updated_at"], "db", f"deposit.{row['status']}",
                               settled_by=row["settled_by"], reason=row["reason"], deposit_tx=_hex(row["deposit_tx"])))
    for event in db["chain_events"]:
        timeline.append(_event(event["observed_at"], "db", "observed", event["ledger"], event_id=event["event_id"],
                               event=event["kind"], effect=event["effect"]))
    regimes: list[tuple[str, str]] = []
    shown = trace_lineages(chain, db["lineages"], timeline, regimes)

    from paygate_cli.chain.balances import nonce_consumed_by_quorum

    nonce = chain.read("the authorisation nonce",
                       lambda c: nonce_consumed_by_quorum(c, row["account"], int(row["auth_nonce"])))
    if nonce is not None and not any(isinstance(v, bool) for v in nonce[2].values()):
        chain.errors.append(f"the authorisation nonce: no read endpoint answered ({nonce[2]})"[:300])
        nonce = None
    consumed = nonce[0] if nonce is not None else None
    if nonce is not None:
        timeline.append(_event(_now(), "chain", "nonce", nonce[1], nonce=row["auth_nonce"],
                               consumed={True: "yes", False: "no", None: "no majority"}[consumed],
                               endpoints=nonce[2]))
        if consumed is None:
            regimes.append(("unreadable", f"the read endpoints do not agree whether nonce {row['auth_nonce']} is "
                                          f"consumed: {nonce[2]}"))
    credit_event = None
    deposit_tx = row["deposit_tx"]
    credits = [i["lineage"] for i in db["lineages"] if i["lineage"].purpose == "credit" and i["lineage"].ledger]
    applied_credit = next((lin for lin in credits if lin.state == "applied"), None)
    if applied_credit is not None and deposit_tx is not None:
        found = billing_events_at(chain, int(applied_credit.ledger),  # type: ignore[arg-type]
                                  lambda e: e.kind == "credit" and e.ref == bytes(deposit_tx))
        if found is not None:
            credit_event = found[0] if found else None
            if credit_event:
                timeline.append(_event(_now(), "chain", "event.credit", credit_event["ledger"],
                                       event_id=credit_event["event_id"], account=credit_event["account"],
                                       amount=credit_event["amount"]))
            else:
                regimes.append(("unexplained", f"no credit event for deposit_tx {_hex(deposit_tx)} in ledger "
                                               f"{applied_credit.ledger}, where the journal says the credit applied"))
    balance = balance_entry(chain, source, row["account"])
    _balance_event(timeline, row["account"], balance)

    deposit_lins = [i["lineage"] for i in db["lineages"] if i["lineage"].purpose == "deposit"]
    ours = any(lin.state == "applied" or lin.live for lin in deposit_lins)
    status = row["status"]
    if status == "needs_human":
        regimes.append(("unexplained", f"the deposit needs a human: {row['reason']}"))
        where = "unknown: a human must find the transaction that spent the authorisation"
    elif status == "settled":
        regimes.append(("match", "settled"))
        where = f"in the billing contract, credited to {row['account']}"
    elif status == "pending":
        if consumed and not ours:
            regimes.append(("unexplained", f"nonce {row['auth_nonce']} is consumed on chain and no lineage of ours "
                                           "holds a transaction for it"))
        elif not db["lineages"]:
            regimes.append(("in_flight", "admitted; funding has not claimed it yet"))
        else:
            regimes.append(("in_flight", "funding is moving it"))
        landed = any(lin.state == "applied" for lin in deposit_lins)
        where = (f"in the billing contract, not yet credited to {row['account']}" if landed
                 else f"with the user ({row['account']}): the transfer has not landed")
    else:  # expired, failed
        if consumed and not any(lin.state == "applied" for lin in deposit_lins):
            regimes.append(("unexplained", f"the deposit is {status}, but its authorisation nonce is consumed on "
                                           "chain by a transaction paygate never journaled"))
        else:
            regimes.append(("match", f"{status}: {row['reason']}"))
        where = f"with the user ({row['account']}): the deposit {status}, nothing was credited"
    regimes += open_findings(around)
    document = {"deposit": {k: v for k, v in row.items() if k not in ("deposit_tx",)} | {
        "deposit_tx": _hex(deposit_tx)}, "lineages": shown,
        "authorisation": {"nonce": row["auth_nonce"], "expiration_ledger": row["auth_expiration_ledger"],
                          "consumed_on_chain": consumed, "latest_ledger": nonce[1] if nonce else None},
        "credit_event": credit_event,
        "balance": {"account": row["account"], "cached": db["account"]["cached_balance"] if db["account"] else None,
                    "chain": balance[0] if balance else None, "ledger": balance[1] if balance else None},
        "chain_events": db["chain_events"]} | around
    return _finish({"kind": "deposit", "id": deposit_id}, document, timeline, regimes, where, chain)


# -- charge -----------------------------------------------------------------------------------------

def trace_charge(conn: psycopg.Connection, chain: Chain, charge_id: int) -> dict[str, Any]:
    timeline: list[dict[str, Any]] = []
    with conn.transaction():
        _snapshot(conn)
        row = _one(conn, CHARGE_SQL, {"id": charge_id})
        if row is None:
            raise UsageError(f"no charge {charge_id}", msgid="usage.unknown_unit")
        ids = sorted({*(row["dead_lineages"] or []), *([row["lineage_id"]] if row["lineage_id"] else [])})
        items = load_lineages(conn, ids=ids, entitlements=[])
        batches = _rows(conn, BATCHES_SQL, {"ids": ids})
        events = _rows(conn, CHAIN_EVENTS_SQL, {"targets": [f"charge:{charge_id}"],
                                                "ids": [row["event_id"]] if row["event_id"] else []})
        around = surroundings(conn, timeline, payload_key="charge_row_id", unit_id=charge_id,
                              targets=[f"charge:{charge_id}", f"charges:{charge_id}"],
                              subjects=[f"charge:{charge_id}", *(f"lineage:{i}" for i in ids),
                                        *(f"charge_batch:{i}" for i in ids)],
                              idempotency=("charge", row["idempotency_key"]))
        cursor = conn.execute(CURSOR_SQL).fetchone()
        source = (conn.execute(SOURCE_SQL).fetchone() or [None])[0]
        account = _one(conn, ACCOUNT_SQL, (row["account"],))
    charge_hex = _hex(row["charge_id"])
    timeline.append(_event(row["created_at"], "db", "admitted", charge=charge_id, charge_id=charge_hex,
                           account=row["account"], amount=row["amount"], idempotency_key=row["idempotency_key"],
                           subscription_id=row["subscription_id"], period_start=row["period_start"]))
    if row["claimed_at"] is not None:
        timeline.append(_event(row["claimed_at"], "db", "claimed", claimed_by=row["claimed_by"],
                               lineage=row["lineage_id"], attempts=row["attempts"]))
    for batch in batches:
        timeline.append(_event(batch["created_at"], "db", "batch", lineage=batch["lineage_id"],
                               entries=batch["entries"], claimed_by=batch["claimed_by"],
                               lease_token=batch["lease_token"],
                               lease_expires_at=batch["lease_expires_at"], outcome=batch["outcome"],
                               closed_at=batch["closed_at"], archived=True if batch["archived_at"] else None))
    for event in events:
        timeline.append(_event(event["observed_at"], "db", "observed", event["ledger"], event_id=event["event_id"],
                               event=event["kind"], effect=event["effect"]))
    if row["status"] != "authorized":
        timeline.append(_event(row["settled_at"] or row["failed_at"] or row["updated_at"], "db",
                               f"charge.{row['status']}", row["settled_ledger"], failed_by=row["failed_by"],
                               reason=row["reason"], event_id=row["event_id"]))
    if row["archived_at"] is not None:
        timeline.append(_event(row["archived_at"], "db", "charge.archived", charge=charge_id))
    regimes: list[tuple[str, str]] = []
    shown = trace_lineages(chain, items, timeline, regimes)
    # Where the chain's own event for this charge id would be: the ledger the observer recorded, else
    # the ledger the current lineage landed in (as the chain says).
    ledger = row["settled_ledger"]
    if ledger is None:
        current = next((s for s in shown if s["id"] == row["lineage_id"]), None)
        landed = [e for e in ((current or {}).get("chain") or {}).get("endpoints", []) if e["ledger"]]
        ledger = landed[0]["ledger"] if landed else None
    on_chain = None
    if ledger is not None:
        found = billing_events_at(chain, int(ledger), lambda e: e.kind in ("charge", "charge_failed")
                                  and e.ref == bytes(row["charge_id"]))
        if found is not None:
            on_chain = found[0] if found else {"kind": None, "ledger": ledger}
            if found:
                timeline.append(_event(_now(), "chain", f"event.{found[0]['kind']}", found[0]["ledger"],
                                       event_id=found[0]["event_id"], amount=found[0]["amount"],
                                       reason=found[0]["reason"]))
    balance = balance_entry(chain, source, row["account"])
    _balance_event(timeline, row["account"], balance)

    status, kind = row["status"], (on_chain or {}).get("kind")
    if status == "needs_human":
        regimes.append(("unexplained", f"the charge needs a human: {row['reason']}"))
        where = f"held: still debited from {row['account']}'s cached balance, its batch waiting for a human"
    elif status == "settled":
        if on_chain is not None and kind != "charge":
            regimes.append(("unexplained", f"settled in the database, but ledger {ledger} has "
                                           f"{'a charge_failed event' if kind else 'no charge event'} for it"))
        else:
            regimes.append(("match", f"settled from the chain's charge event in ledger {ledger}"))
        where = f"charged: taken from {row['account']}'s balance in the billing contract (ledger {ledger})"
    elif status == "failed":
        if kind == "charge":
            regimes.append(("unexplained", f"failed in the database, but the chain debited it in ledger {ledger}"))
        else:
            regimes.append(("match", f"failed: {row['reason']}"))
        where = f"returned to {row['account']}'s balance: the charge failed"
    else:  # authorized
        cursor_ledger = int(cursor[1]) if cursor else None
        if kind in ("charge", "charge_failed"):
            if cursor_ledger is None or cursor_ledger <= int(ledger):  # type: ignore[arg-type]
                regimes.append(("lagging", f"the chain has its {kind} event in ledger {ledger}; the observer's "
                                           f"cursor is at ledger {cursor_ledger}: its next page applies it"))
            else:
                regimes.append(("unexplained", f"the chain has its {kind} event in ledger {ledger}, the observer's "
                                               f"cursor is past it (ledger {cursor_ledger}), yet the charge is still "
                                               "authorized"))
        else:
            regimes.append(("in_flight", "admitted and debited from the cached balance; settlement is moving it"
                            if items else "admitted; settlement has not claimed it yet"))
        where = f"debited from {row['account']}'s cached balance; not yet taken on chain"
    regimes += open_findings(around)
    document = {"charge": row | {"charge_id": charge_hex, "archived": row["archived_at"] is not None},
                "lineages": shown, "batches": batches, "chain_event": on_chain, "chain_events": events,
                "balance": {"account": row["account"], "cached": account["cached_balance"] if account else None,
                            "chain": balance[0] if balance else None, "ledger": balance[1] if balance else None}
                } | around
    return _finish({"kind": "charge", "id": charge_id}, document, timeline, regimes, where, chain)


# -- relay and bot job -------------------------------------------------------------------------------

def _queue_lease(timeline: list[dict[str, Any]], row: dict[str, Any]) -> None:
    if row["lease_token"] is not None or row["attempts"]:
        timeline.append(_event(row["updated_at"], "db", "lease", claimed_by=row["claimed_by"],
                               lease_token=row["lease_token"], lease_expires_at=row["lease_expires_at"],
                               attempts=row["attempts"], lineage=row["lineage_id"]))
    if row["status"] != "queued":
        timeline.append(_event(row["finished_at"] or row["updated_at"], "db", f"{row['_kind']}.{row['status']}",
                               reason=row["reason"], fee_charged=row["fee_charged"], tx_hash=_hex(row["tx_hash"])))


def _fee_verdict(row: dict[str, Any], shown: list[dict[str, Any]], regimes: list[tuple[str, str]]) -> None:
    """An included relay or bot job: its recorded fee is what the chain charged."""
    current = next((s for s in shown if s["id"] == row["lineage_id"]), None)
    chain_fee = receipt_fee(current["chain"]) if current else None
    if chain_fee is not None and row["fee_charged"] is not None and int(row["fee_charged"]) != chain_fee:
        regimes.append(("unexplained", f"fee charged {row['fee_charged']} recorded, the chain charged {chain_fee}"))


def trace_relay(conn: psycopg.Connection, chain: Chain, relay_id: int) -> dict[str, Any]:
    timeline: list[dict[str, Any]] = []
    with conn.transaction():
        _snapshot(conn)
        row = _one(conn, RELAY_SQL, (relay_id,))
        if row is None:
            raise UsageError(f"no relay {relay_id}", msgid="usage.unknown_unit")
        row["_kind"] = "relay"
        items = load_lineages(conn, ids=[], entitlements=[f"relay:{relay_id}"])
        reservations = _rows(conn, RESERVATIONS_SQL, (relay_id,))
        around = surroundings(conn, timeline, payload_key="relay_id", unit_id=relay_id,
                              targets=[f"relay:{relay_id}", f"relays:{relay_id}"],
                              subjects=[f"relay:{relay_id}", *(f"lineage:{i['lineage'].id}" for i in items)],
                              idempotency=("relay", row["idempotency_key"]))
    timeline.append(_event(row["created_at"], "db", "admitted", relay=relay_id, account=row["account"],
                           contract=row["contract"], function=row["function"], max_fee=row["max_fee"],
                           idempotency_key=row["idempotency_key"], nonces=list(row["auth_nonces"]),
                           expiration_ledger=row["auth_expiration_ledger"]))
    for r in reservations:
        timeline.append(_event(r["created_at"], "db", "fee.reserved", round=r["round"], amount=r["amount"]))
        if r["closed_at"] is not None:
            timeline.append(_event(r["closed_at"], "db", f"fee.{r['status']}", round=r["round"],
                                   fee_charged=r["fee_charged"], lineage=r["lineage_id"], reason=r["reason"]))
    _queue_lease(timeline, row)
    regimes: list[tuple[str, str]] = []
    shown = trace_lineages(chain, items, timeline, regimes)
    from paygate_cli.chain.relay import nonces_consumed

    nonces = chain.read("the authorisation nonces",
                        lambda c: nonces_consumed(c, row["account"], [int(n) for n in row["auth_nonces"]]))
    if nonces is not None:
        timeline.append(_event(_now(), "chain", "nonces", nonces[1], nonces=list(row["auth_nonces"]),
                               consumed=nonces[0]))
    status = row["status"]
    ours = any(i["lineage"].state == "applied" or i["lineage"].live for i in items)
    latest = reservations[-1] if reservations else None
    if status == "needs_human":
        regimes.append(("unexplained", f"the relay needs a human: {row['reason']}"))
        where = f"unknown: a human decides (its fee reservation is {latest['status'] if latest else 'missing'})"
    elif status in ("applied", "failed"):
        _fee_verdict(row, shown, regimes)
        regimes.append(("match", f"{status} on chain"))
        where = f"fee {row['fee_charged']} stroops paid by the fee account (reservation settled)"
    elif status == "queued":
        regimes.append(("in_flight", "queued; the relay worker is moving it" if items else
                        "queued; the relay worker has not claimed it yet"))
        where = f"reserved: {row['max_fee']} stroops held against the fee budget"
    else:  # expired, rejected
        if nonces is not None and nonces[0] and not ours:
            regimes.append(("unexplained", f"the relay is {status}, but its nonces {nonces[0]} are consumed on "
                                           "chain by a transaction paygate never journaled"))
        else:
            regimes.append(("match", f"{status}: {row['reason']}"))
        where = "released: no fee was spent"
    regimes += open_findings(around)
    document = {"relay": {k: v for k, v in row.items() if k != "_kind"} | {"tx_hash": _hex(row["tx_hash"])},
                "lineages": shown, "fee_reservations": reservations,
                "authorisation": {"nonces": list(row["auth_nonces"]),
                                  "consumed_on_chain": nonces[0] if nonces else None,
                                  "latest_ledger": nonces[1] if nonces else None}} | around
    return _finish({"kind": "relay", "id": relay_id}, document, timeline, regimes, where, chain)


def trace_bot_job(conn: psycopg.Connection, chain: Chain, job_id: int) -> dict[str, Any]:
    timeline: list[dict[str, Any]] = []
    with conn.transaction():
        _snapshot(conn)
        row = _one(conn, BOT_JOB_SQL, (job_id,))
        if row is None:
            raise UsageError(f"no bot job {job_id}", msgid="usage.unknown_unit")
        row["_kind"] = "bot_job"
        items = load_lineages(conn, ids=[], entitlements=[f"bot_job:{job_id}"])
        around = surroundings(conn, timeline, payload_key="bot_job_id", unit_id=job_id,
                              targets=[f"bot_job:{job_id}", f"bot_jobs:{job_id}"],
                              subjects=[f"bot_job:{job_id}", *(f"lineage:{i['lineage'].id}" for i in items)])
    timeline.append(_event(row["created_at"], "db", "admitted", bot_job=job_id, job_key=row["job_key"],
                           contract=row["contract"], function=row["function"], max_attempts=row["max_attempts"]))
    _queue_lease(timeline, row)
    regimes: list[tuple[str, str]] = []
    shown = trace_lineages(chain, items, timeline, regimes)
    status = row["status"]
    if status == "needs_human":
        regimes.append(("unexplained", f"the bot job needs a human: {row['reason']}"))
    elif status in ("applied", "failed"):
        _fee_verdict(row, shown, regimes)
        regimes.append(("match", f"{status} on chain"))
    elif status == "queued":
        regimes.append(("in_flight", "queued; the drainer is moving it" if items else
                        "queued; the drainer has not claimed it yet"))
    else:
        regimes.append(("match", f"{status}: {row['reason']}"))
    fee = row["fee_charged"]
    where = (f"fee {fee} stroops paid by the fee account" if fee is not None
             else "no fee spent yet" if status == "queued" else "no fee recorded")
    regimes += open_findings(around)
    document = {"bot_job": {k: v for k, v in row.items() if k != "_kind"} | {"tx_hash": _hex(row["tx_hash"])},
                "lineages": shown} | around
    return _finish({"kind": "bot-job", "id": job_id}, document, timeline, regimes, where, chain)


# -- a transaction by hash ----------------------------------------------------------------------------

def units_of_hash(conn: psycopg.Connection, tx_hash: str) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    """The lineage a hash names and the units it pays for: [(kind, id)]; a charge batch pays for each
    of its charges; a TTL keeper's job is no unit of money (the lineage alone is traced)."""
    with conn.transaction():
        _snapshot(conn)
        found = conn.execute(HASH_SQL, {"h": bytes.fromhex(tx_hash)}).fetchall()
        if not found:
            raise UsageError(f"no transaction {tx_hash} in the journal (neither an inner nor an outer hash of a "
                             "lineage, hot or archived)", msgid="usage.unknown_unit")
        lineage_id, entitlement, matched = found[0]
        parts = entitlement.split(":")
        units: list[tuple[str, int]] = []
        if parts[0] == "deposit":
            units = [("deposit", int(parts[1]))]
        elif parts[0] in ("relay", "bot_job"):
            units = [("relay" if parts[0] == "relay" else "bot-job", int(parts[1]))]
        elif parts[0] == "charge_batch":
            units = [("charge", int(i)) for (i,) in conn.execute(BATCH_CHARGES_SQL, {"id": lineage_id})]
    return {"hash": tx_hash, "lineage": lineage_id, "entitlement": entitlement, "matched": matched}, units


def trace_lineage_only(conn: psycopg.Connection, chain: Chain, lineage_id: int) -> dict[str, Any]:
    timeline: list[dict[str, Any]] = []
    with conn.transaction():
        _snapshot(conn)
        items = load_lineages(conn, ids=[lineage_id], entitlements=[])
    regimes: list[tuple[str, str]] = []
    shown = trace_lineages(chain, items, timeline, regimes)
    return _finish({"kind": "lineage", "id": lineage_id}, {"lineages": shown}, timeline, regimes,
                   "no money of a customer: a transaction of paygate's own (its fee paid by the fee account)", chain)


# -- account ------------------------------------------------------------------------------------------

def _subset_explains(residual: int, amounts: list[int]) -> list[int] | None:
    """The deposits under way whose credits would explain `residual` (a subset of them), if any."""
    sums: dict[int, list[int]] = {0: []}
    for n, amount in enumerate(amounts[:16]):  # bounded: a few deposits under way at once
        sums |= {s + amount: [*picked, n] for s, picked in list(sums.items()) if s + amount not in sums}
    return sums.get(residual)


def _events_past_cursor(chain: Chain, cursor: str | None, account: str) -> list[dict[str, Any]] | None:
    """The billing events of `account` past the observer's cursor (the observer has not applied
    them yet), or None when unreadable or when there is no position to read from."""
    from paygate_cli.chain.charges import UndecodableEvent, decode_billing_event, get_events

    billing, start = chain.settings.billing_contract, chain.settings.observer_start_ledger
    if not billing or (cursor is None and not start):
        return None

    def read(client: ChainClient) -> list[dict[str, Any]]:
        found, position = [], cursor
        for _ in range(EVENT_PAGES):
            page = get_events(client, billing, cursor=position, start_ledger=None if position else start, limit=1000)
            for raw in page.events:
                try:
                    event = decode_billing_event(raw)
                except UndecodableEvent:
                    continue
                if event.account == account:
                    found.append({"event_id": raw.id, "ledger": raw.ledger, "kind": event.kind,
                                  "amount": event.amount, "ref": event.ref.hex()})
            if len(page.events) < 1000:
                return found
            position = page.cursor
        raise ValueError(f"more than {EVENT_PAGES} pages of events past the observer's cursor")

    return chain.read("billing events past the observer's cursor", read)


def trace_account(conn: psycopg.Connection, chain: Chain, address: str) -> dict[str, Any]:
    timeline: list[dict[str, Any]] = []
    with conn.transaction():
        _snapshot(conn)
        account = _one(conn, ACCOUNT_SQL, (address,))
        if account is None:
            raise UsageError(f"no account {address} known to paygate", msgid="usage.unknown_account")
        sums = conn.execute(ACCOUNT_SUMS_SQL, {"a": address}).fetchone()
        open_units = conn.execute(ACCOUNT_OPEN_SQL, {"a": address}).fetchall()
        history = _rows(conn, ACCOUNT_HISTORY_SQL, {"a": address, "n": TIMELINE_LIMIT})
        check = _one(conn, ACCOUNT_CHECK_SQL, (address,))
        settled_txs = {h for (h,) in conn.execute(SETTLED_TX_SQL, (address,))}
        findings = _rows(conn, FINDINGS_SQL, ([address],))
        cursor = conn.execute(CURSOR_SQL).fetchone()
        source = (conn.execute(SOURCE_SQL).fetchone() or [None])[0]
    deposits, n_deposits, settled, authorized, held, n_settled, n_archived, archived_amount = (int(x) for x in sums)
    cached = int(account["cached_balance"])
    timeline.append(_event(account["created_at"], "db", "account", account=address, cached_balance=cached))
    for unit in sorted(history, key=lambda h: (h["created_at"], h["unit"], h["id"])):
        timeline.append(_event(unit["created_at"], "db", f"{unit['unit']}.admitted", id=unit["id"],
                               amount=unit["amount"], status=unit["status"],
                               archived=True if unit["archived"] else None))
        if unit["finished_at"] is not None:
            timeline.append(_event(unit["finished_at"], "db", f"{unit['unit']}.{unit['status']}", id=unit["id"],
                                   amount=unit["amount"]))
    if check is not None:
        timeline.append(_event(check["checked_at"], "db", "reconciler.check", check["chain_ledger"],
                               regime=check["regime"], chain_balance=check["chain_balance"],
                               cached_balance=check["cached_balance"], drift=check["drift"]))
    for finding in findings:
        timeline.append(_event(finding["first_seen"], "db", "finding", finding_id=finding["id"],
                               finding=finding["kind"], summary=finding["summary"], resolved_at=finding["resolved_at"]))
    balance = balance_entry(chain, source, address)
    _balance_event(timeline, address, balance)
    past = _events_past_cursor(chain, cursor[0] if cursor else None, address)
    for event in past or []:
        timeline.append(_event(_now(), "chain", f"event.{event['kind']}", event["ledger"], event_id=event["event_id"],
                               amount=event["amount"], past_observer_cursor=True))

    regimes: list[tuple[str, str]] = []
    # The database against itself: the cached balance is every settled deposit less every charge
    # that holds money (authorized, settled, needs_human; archived ones included).
    ledger_balance = deposits - settled - authorized - held
    if ledger_balance != cached:
        regimes.append(("unexplained", f"the cached balance {cached} is not deposits {deposits} − charges "
                                       f"{settled + authorized + held} = {ledger_balance} (difference "
                                       f"{cached - ledger_balance})"))
    explaining: list[dict[str, Any]] = []
    for kind, unit_id, amount, status, lineage_state, lineage_id, deposit_tx in open_units:
        explaining.append({"unit": kind, "id": unit_id, "amount": int(amount), "status": status,
                           "lineage": lineage_id, "lineage_state": lineage_state, "deposit_tx": _hex(deposit_tx)})
    drift = None
    if balance is None:
        regimes.append(("unreadable", "the account's balance in the billing contract could not be read"))
    else:
        chain_balance = balance[0]
        drift = chain_balance - cached
        lagging, saw = 0, False
        for event in past or []:
            # As the reconciler counts them: charges the chain took and credits it gave that the
            # observer has not applied yet, up to the ledger the balance was read at.
            if event["ledger"] > balance[1]:
                continue
            if event["kind"] == "charge":
                lagging, saw = lagging - event["amount"], True
            elif event["kind"] == "credit" and event["ref"] not in settled_txs:
                lagging, saw = lagging + event["amount"], True
        residual = drift - authorized - lagging
        # Credits under way that the events past the cursor do not already count.
        counted = {e["ref"] for e in past or [] if e["kind"] == "credit" and e["ledger"] <= balance[1]}
        credits = [u for u in explaining if u["unit"] == "deposit" and u["deposit_tx"] not in counted
                   and u["lineage_state"] in ("applied", "signed", "sent")]
        picked = _subset_explains(residual, [u["amount"] for u in credits]) if residual > 0 else None
        if residual == 0:
            regime = "lagging" if saw else "in_flight" if authorized else "match"
            regimes.append((regime, f"chain {chain_balance} − cached {cached} = {drift}: in flight {authorized}, "
                                    f"lagging {lagging}"))
        elif picked is not None:
            ids = [credits[n]["id"] for n in picked]
            regimes.append(("in_flight", f"chain {chain_balance} − cached {cached} = {drift}: in flight {authorized}, "
                                         f"lagging {lagging}, and the credits of deposits {ids} under way"))
        else:
            regimes.append(("unexplained", f"chain {chain_balance} − cached {cached} = {drift}; in flight "
                                           f"{authorized}, lagging {lagging}: {residual} unexplained"))
    regimes += [("unexplained", f"open finding {f['id']} ({f['kind']}): {f['summary']}"[:300])
                for f in findings if f["resolved_at"] is None]
    where = (f"{balance[0]} in the billing contract for {address} (ledger {balance[1]}); cached {cached}"
             if balance else f"cached {cached}; the chain balance could not be read")
    document = {"account": {"address": address, "cached_balance": cached, "created_at": account["created_at"]},
                "sums": {"settled_deposits": deposits, "settled_deposit_count": n_deposits,
                         "settled_charges": settled, "settled_charge_count": n_settled,
                         "archived_charge_count": n_archived, "archived_settled_charges": archived_amount,
                         "authorized_charges": authorized, "needs_human_charges": held,
                         "deposits_minus_charges": ledger_balance},
                "chain": {"balance": balance[0] if balance else None, "ledger": balance[1] if balance else None,
                          "events_past_observer_cursor": past, "drift": drift},
                "explaining_units": explaining, "reconciler_check": check, "findings": findings}
    return _finish({"kind": "account", "id": address}, document, timeline, regimes, where, chain)


# -- the verdict and the whole command ---------------------------------------------------------------

def _finish(unit: dict[str, Any], document: dict[str, Any], timeline: list[dict[str, Any]],
            regimes: list[tuple[str, str]], where: str, chain: Chain) -> dict[str, Any]:
    if chain.errors:
        regimes = [*regimes, ("unreadable", f"the chain could not be read: {'; '.join(chain.errors)}"[:600])]
    regime, explanations = _worst(regimes)
    # Database events in time order; the chain's re-reads (all "now") after them, as read.
    timeline.sort(key=lambda e: (e["source"] == "chain", e["at"] is None, e["at"] or _now()))
    verdict = {"agree": regime == "match", "regime": regime, "where": where,
               "explanation": "; ".join(dict.fromkeys(explanations)) or "the database and the chain agree",
               "chain_readable": not chain.errors and all(r != "unreadable" for r, _ in regimes)}
    return {"unit": unit, "timeline": timeline, "verdict": verdict, **document}


def trace(conn: psycopg.Connection, settings: Any, kind: str, ref: str) -> dict[str, Any]:
    """The whole command's document: unit, timeline, verdict and the evidence by part."""
    ref = check_request(kind, ref)
    chain = Chain(conn, settings)
    try:
        if kind == "deposit":
            return trace_deposit(conn, chain, int(ref))
        if kind == "charge":
            return trace_charge(conn, chain, int(ref))
        if kind == "relay":
            return trace_relay(conn, chain, int(ref))
        if kind == "bot-job":
            return trace_bot_job(conn, chain, int(ref))
        if kind == "account":
            return trace_account(conn, chain, ref)
        tx, units = units_of_hash(conn, ref)
        if not units:
            return trace_lineage_only(conn, chain, tx["lineage"]) | {"tx": tx}
        traced = [_TRACERS[k](conn, chain, i) for k, i in units]
        if len(traced) == 1:
            return traced[0] | {"tx": tx}
        # A charge batch: every charge it carried, each traced; the worst verdict is the batch's.
        regime = min((t["verdict"]["regime"] for t in traced), key=REGIMES.index)
        timeline = [e | {"unit": t["unit"]} for t in traced for e in t["timeline"]]
        timeline.sort(key=lambda e: (e["source"] == "chain", e["at"] is None, e["at"] or _now()))
        return {"unit": {"kind": "tx", "id": ref}, "tx": tx, "timeline": timeline,
                "verdict": {"agree": all(t["verdict"]["agree"] for t in traced), "regime": regime,
                            "where": "; ".join(f"charge {t['unit']['id']}: {t['verdict']['where']}" for t in traced),
                            "explanation": "; ".join(f"charge {t['unit']['id']}: {t['verdict']['explanation']}"
                                                     for t in traced if t["verdict"]["regime"] == regime),
                            "chain_readable": all(t["verdict"]["chain_readable"] for t in traced)},
                "units": [{"unit": t["unit"], "verdict": t["verdict"]} for t in traced]}
    finally:
        chain.close()


_TRACERS: dict[str, Callable[[Any, Chain, int], dict[str, Any]]] = {
    "deposit": trace_deposit, "charge": trace_charge, "relay": trace_relay, "bot-job": trace_bot_job}
