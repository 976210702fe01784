"""The parts every trace shares: the request's checks, the snapshot, the chain side and its failures, the
lineages with their receipts, the unit's surroundings (admission key, webhooks, audit, findings) and
the verdict. What a trace is: the package's docstring."""

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

def snapshot(conn: psycopg.Connection) -> None:
    """Every part of the database side from one read-only snapshot, so the parts agree."""
    conn.execute(SNAPSHOT_SQL)
    # An account's sums walk all its charges (no index on charges (account): sql/0001_baseline.sql);
    # JIT compilation costs more than it saves on such plain aggregates, as in reconcile-report.
    conn.execute("SET LOCAL jit = off")


def all_rows(conn: psycopg.Connection, sql: str, params: Any) -> list[dict[str, Any]]:
    cursor = conn.execute(sql, params)
    names = [c.name for c in cursor.description or []]
    return [dict(zip(names, row, strict=True)) for row in cursor]


def one_row(conn: psycopg.Connection, sql: str, params: Any) -> dict[str, Any] | None:
    found = all_rows(conn, sql, params)
    return found[0] if found else None


def hexed(value: Any) -> str | None:
    return bytes(value).hex() if value is not None else None


def event_at(at: Any, source: str, kind: str, ledger: int | None = None, **details: Any) -> dict[str, Any]:
    return {"at": at, "ledger": ledger, "source": source, "kind": kind,
            "details": {k: v for k, v in details.items() if v is not None}}


def worst_regime(regimes: list[tuple[str, str]]) -> tuple[str, list[str]]:
    """The worst regime of the parts, and the explanations of every part at that regime."""
    if not regimes:
        return "match", []
    worst = min((r for r, _ in regimes), key=REGIMES.index)
    return worst, [text for r, text in regimes if r == worst]


def now_utc() -> datetime:
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
        by_id[lineage_id]["replaced"].append({"replaced_by": replaced_by, "outer_hash": hexed(outer),
                                              "bid_rate": bid, "bid_ledger": bid_ledger, "replaced_at": at})
    return found


def lineage_events(item: dict[str, Any]) -> list[dict[str, Any]]:
    lin: lineages.Lineage = item["lineage"]
    ref = {"lineage": lin.id, "purpose": lin.purpose, "entitlement": lin.entitlement}
    events = [event_at(item["created_at"], "db", "lineage.allocated", **ref, lane=lin.lane)]
    replaced = item["replaced"]
    if item["signed_at"] is not None or lin.inner_hash is not None:
        first_outer = replaced[0]["outer_hash"] if replaced else hexed(lin.outer_hash)
        first_bid = replaced[0]["bid_rate"] if replaced else lin.bid_rate
        events.append(event_at(item["signed_at"], "db", "lineage.signed", lin.signed_at_ledger, **ref,
                               lane=lin.lane, sequence=lin.source_seq, inner_hash=hexed(lin.inner_hash),
                               outer_hash=first_outer, bid_rate=first_bid, fee_ops=lin.fee_ops,
                               resource_fee=lin.resource_fee, cap_rate=lin.cap_rate, max_time=lin.max_time,
                               max_ledger=lin.max_ledger, key_id=lin.key_id))
    for n, env in enumerate(replaced):
        # Each replacement: the outer envelope it replaced, and the one that took its place.
        after = replaced[n + 1] if n + 1 < len(replaced) else None
        events.append(event_at(env["replaced_at"], "db", "lineage.rebumped", **ref,
                               replaced_outer_hash=env["outer_hash"], replaced_bid_rate=env["bid_rate"],
                               outer_hash=after["outer_hash"] if after else hexed(lin.outer_hash),
                               bid_rate=after["bid_rate"] if after else lin.bid_rate))
    if item["sent_at"] is not None:
        events.append(event_at(item["sent_at"], "db", "lineage.sent", **ref, sends=item["send_count"],
                               last_send_status=item["last_send_status"]))
    if lin.fee_capped_at is not None:
        events.append(event_at(lin.fee_capped_at, "db", "lineage.fee_capped", **ref, fee_required=lin.fee_required,
                               cap_rate=lin.cap_rate))
    if item["parked_at"] is not None:
        events.append(event_at(item["parked_at"], "db", "lineage.parked", **ref, reason=lin.parked_reason))
    if not lin.live:
        events.append(event_at(item["resolved_at"], "db", f"lineage.{lin.state}", lin.ledger, **ref,
                               fee_charged=lin.fee_charged, result_code=lin.result_code, resolution=lin.resolution))
    if item["archived_at"] is not None:
        events.append(event_at(item["archived_at"], "db", "lineage.archived", **ref))
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
            timeline.append(event_at(now_utc(), "chain", "receipt", landed[0]["ledger"] if landed else None,
                                     lineage=lin.id, inner_hash=hexed(lin.inner_hash), decision=receipt["decision"],
                                     fee_charged=landed[0]["fee_charged"] if landed else None,
                                     result_code=landed[0]["result_code"] if landed else None,
                                     endpoints=[f"{e['endpoint']}: {e['tx_status'] or e['error']}"
                                                for e in receipt["endpoints"]]))
        regime, why = compare_lineage(lin, receipt)
        regimes.append((regime, why))
        outer = [r["outer_hash"] for r in item["replaced"]] + ([hexed(lin.outer_hash)] if lin.outer_hash else [])
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
        key = one_row(conn, IDEMPOTENCY_SQL, idempotency)
        found["idempotency"] = {"scope": idempotency[0], "key": idempotency[1],
                                "recorded_at": key["created_at"] if key else None,
                                "expires_at": key["expires_at"] if key else None, "swept": key is None}
    webhooks = all_rows(conn, WEBHOOKS_SQL, {"key": payload_key, "id": str(unit_id)})
    for hook in webhooks:
        timeline.append(event_at(hook["created_at"], "db", "webhook", outbox_id=hook["id"], event=hook["event_type"],
                                 endpoint_id=hook["endpoint_id"], status=hook["status"], attempts=hook["attempts"],
                                 last_status_code=hook["last_status_code"],
                                 delivered_at=hook["delivered_at"], dead_at=hook["dead_at"],
                                 archived=True if hook["archived_at"] else None))
    audit = all_rows(conn, AUDIT_SQL, (targets,))
    for entry in audit:
        timeline.append(event_at(entry["at"], "db", "audit", audit_id=entry["id"], actor=entry["actor"],
                                 action=entry["action"], target=entry["target"]))
    findings = all_rows(conn, FINDINGS_SQL, (subjects,))
    for finding in findings:
        timeline.append(event_at(finding["first_seen"], "db", "finding", finding_id=finding["id"],
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


def balance_event(timeline: list[dict[str, Any]], account: str, read: tuple[int, int] | None) -> None:
    if read is not None:
        timeline.append(event_at(now_utc(), "chain", "balance", read[1], account=account, balance=read[0]))


# -- the verdict and the whole command ---------------------------------------------------------------

def finish(unit: dict[str, Any], document: dict[str, Any], timeline: list[dict[str, Any]],
            regimes: list[tuple[str, str]], where: str, chain: Chain) -> dict[str, Any]:
    if chain.errors:
        regimes = [*regimes, ("unreadable", f"the chain could not be read: {'; '.join(chain.errors)}"[:600])]
    regime, explanations = worst_regime(regimes)
    # Database events in time order; the chain's re-reads (all "now") after them, as read.
    timeline.sort(key=lambda e: (e["source"] == "chain", e["at"] is None, e["at"] or now_utc()))
    verdict = {"agree": regime == "match", "regime": regime, "where": where,
               "explanation": "; ".join(dict.fromkeys(explanations)) or "the database and the chain agree",
               "chain_readable": not chain.errors and all(r != "unreadable" for r, _ in regimes)}
    return {"unit": unit, "timeline": timeline, "verdict": verdict, **document}
