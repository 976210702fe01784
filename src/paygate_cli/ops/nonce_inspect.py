"""`nonce-inspect`: per lane, the journal's view against the chain's sequence; per deposit, the
authorisation nonce on chain. Read-only: it judges what `resolve` would do, but sends and writes
nothing. Never returns envelopes or ciphertext."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from paygate_cli.errors import UsageError
from paygate_cli.journal import lineage as lineages

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.rpc import ChainClient

# With the lane's open fence finding (a sequence used outside the journal) and its evidence.
LANES_SQL = """
SELECT l.address, l.status, l.drained_at, l.drained_by, l.drain_reason, l.accepted_seq,
       f.id, f.summary, f.details, f.first_seen, f.last_seen, f.seen_count
FROM paygate.lanes l
LEFT JOIN paygate.findings f ON f.kind = 'lane_fence' AND f.subject = l.address AND f.resolved_at IS NULL
WHERE %(lane)s::text IS NULL OR l.address = %(lane)s
ORDER BY l.address
"""
# The journal's last consumed sequence is what allocation compares the chain with (applied/failed
# lineages and an operator's accepted sequence: journal/lineage.py last_consumed_seq_sql).
LANE_JOURNAL_SQL = """
SELECT """ + lineages.last_consumed_seq_sql("%(lane)s") + """,
       count(*) FILTER (WHERE state IN ('applied', 'failed')),
       (SELECT id FROM paygate.lineages l WHERE l.lane = %(lane)s AND paygate.lineage_is_live(l.state))
FROM paygate.lineages WHERE lane = %(lane)s
"""
# The lane's open repeated_rejection finding (journal/rejections.py) and the in-flight lineage's
# count: the evidence that a "chain behind the journal" is not a lagging read.
REJECTION_SQL = """
SELECT f.id, f.summary, f.details, f.first_seen, f.last_seen, f.seen_count,
       (SELECT jsonb_build_object('lineage_id', x.id, 'code', x.rejected_code, 'consecutive_rejections',
                                  x.rejected_count, 'first_rejected_at', x.first_rejected_at,
                                  'last_send_status', x.last_send_status)
        FROM paygate.lineages x WHERE x.lane = %(lane)s AND x.state IN ('signed', 'sent') AND x.rejected_count > 0)
FROM (SELECT 1) one
LEFT JOIN paygate.findings f ON f.kind = 'repeated_rejection' AND f.subject = %(lane)s AND f.resolved_at IS NULL
"""
CREDIT_SQL = """
SELECT id, account, amount::text, auth_nonce, auth_expiration_ledger, status, reason, deposit_lineage_id,
       credit_lineage_id, encode(deposit_tx, 'hex'), attempts, lease_expires_at
FROM paygate.deposits WHERE id = %s
"""
CREDIT_LINEAGES_SQL = "SELECT id FROM paygate.lineages WHERE entitlement LIKE %s ORDER BY id"
RELAY_SQL = """
SELECT r.id, r.account, r.contract, r.function, r.auth_nonces, r.auth_expiration_ledger, r.status, r.reason,
       r.lineage_id, r.attempts, r.lease_expires_at, r.max_fee, r.fee_charged, f.status, f.fee_charged
FROM paygate.relays r
LEFT JOIN LATERAL (SELECT status, fee_charged FROM paygate.fee_reservations WHERE relay_id = r.id
                   ORDER BY round DESC LIMIT 1) f ON true  -- the current round (a replay opens a new one)
WHERE r.id = %s
"""
RELAY_LINEAGES_SQL = "SELECT id FROM paygate.lineages WHERE entitlement = %s ORDER BY id"


def preview(chain: ChainClient, lineage: lineages.Lineage) -> dict[str, Any]:
    """What resolve() would conclude right now, without resending or writing."""
    from paygate_cli.journal.resolve import decide, judge

    if lineage.state == "allocated":
        return {"would": "abandon (never anchored; nothing can land)"}
    if not lineage.live:
        return {"would": "nothing (terminal)"}
    assert lineage.inner_hash is not None
    probes = chain.probe(lineage.lane, lineage.inner_hash.hex())
    verdicts = [judge(p, lineage) for p in probes]
    decision = decide(verdicts)
    would = {"applied": "record applied", "failed": "record failed", "expired": "record expired (dead)",
             "superseded": "record superseded (dead)", "pending": "resend the same envelope and wait",
             "wait": "wait (no majority of covering answers)"}[decision]
    return {"would": would, "decision": decision,
            "endpoints": [{"endpoint": p.endpoint, "verdict": v, "error": p.error, "account_seq": p.account_seq,
                           "tx_status": p.tx_status, "latest_ledger": p.latest_ledger, "oldest_ledger": p.oldest_ledger}
                          for p, v in zip(probes, verdicts, strict=True)]}


def inspect_lanes(conn: psycopg.Connection, chain_of: Callable[[], ChainClient], lane: str | None,
                  sequence_of: Callable[[str], int]) -> list[dict[str, Any]]:
    """`sequence_of`: a lane's sequence on chain (chain/accounts.py, SDK-free); the chain client is
    built only for a lane with a lineage in flight (its resolution preview probes)."""
    rows = conn.execute(LANES_SQL, {"lane": lane}).fetchall()
    if lane and not rows:
        raise UsageError(f"lane {lane} is not in the journal")
    report = []
    for address, status, drained_at, drained_by, drain_reason, accepted_seq, *fence_row in rows:
        max_seq, consumed, live_id = conn.execute(LANE_JOURNAL_SQL, {"lane": address}).fetchone()
        chain_seq = sequence_of(address)
        live = lineages.load(conn, live_id) if live_id else None
        fence = None if fence_row[0] is None else dict(zip(
            ("finding_id", "summary", "evidence", "first_seen", "last_seen", "seen_count"), fence_row, strict=True))
        rejection_row = conn.execute(REJECTION_SQL, {"lane": address}).fetchone()
        rejection = None if rejection_row[0] is None else dict(zip(
            ("finding_id", "summary", "evidence", "first_seen", "last_seen", "seen_count"), rejection_row[:6],
            strict=True))
        finding = "ok"
        if fence is not None:
            # Fenced for a sequence used outside the journal: never "ok" until an operator resolved it
            # (paygate.accept_lane_fence), whatever the chain and the journal say now.
            finding = f"fenced — needs a human: {drain_reason or fence['summary']}"
        elif max_seq is not None and chain_seq > max_seq:
            # The chain is ahead of what we journaled: fine only if our in-flight lineage is the one
            # that may just have landed.
            if not (live and live.source_seq == chain_seq):
                finding = "gap: chain sequence ahead of the journal (a transaction we never journaled) — needs a human"
        elif max_seq is not None and chain_seq < max_seq:
            finding = "chain behind the journal (lagging read endpoint?)"
        elif max_seq is None:
            finding = "no journaled use yet"
        if rejection is not None and fence is None:
            # Every resend refused with one code: not a lagging read but a chain that will not take
            # the journal's sequence (a reset network, another deployment's RPC).
            evidence = rejection["evidence"] or {}
            finding = (f"sends rejected: ERROR {evidence.get('code')} on {evidence.get('consecutive_rejections')} "
                       f"consecutive resends of lineage {evidence.get('lineage_id')}"
                       + (" with the chain behind the journal" if max_seq is not None and chain_seq < max_seq else "")
                       + " (a reset network or a wrong RPC?) — needs a human")
        if finding in ("ok", "no journaled use yet") and status == "drained" and drain_reason:
            finding = f"drained by {drained_by}: {drain_reason}"  # e.g. a lane failure: why it takes no work
        report.append({
            "lane": address, "status": status, "drained_at": drained_at, "drained_by": drained_by,
            "drain_reason": drain_reason, "chain_seq": chain_seq,
            "journal_last_consumed_seq": max_seq, "journal_consumed_count": consumed, "accepted_seq": accepted_seq,
            "in_flight": live.public() | {"resolution": preview(chain_of(), live)} if live else None,
            "fence": fence, "repeated_rejection": rejection, "rejections_in_flight": rejection_row[6],
            "finding": finding,
            "needs_human": fence is not None or rejection is not None or finding.startswith("gap"),
        })
    return report


def inspect_deposit(conn: psycopg.Connection, chain_of: Callable[[], ChainClient], deposit_id: int) -> dict[str, Any]:
    row = conn.execute(CREDIT_SQL, (deposit_id,)).fetchone()
    if row is None:
        raise UsageError(f"deposit {deposit_id} does not exist")
    from paygate_cli.chain.contracts import nonce_consumed

    chain = chain_of()
    (cid, account, amount, nonce, expiration, status, reason, deposit_lineage, credit_lineage, deposit_tx,
     attempts, lease) = row
    consumed, latest = nonce_consumed(chain, account, nonce)
    history = [lineages.load(conn, i) for (i,) in conn.execute(CREDIT_LINEAGES_SQL, (f"deposit:{cid}:%",))]
    return {
        "deposit": {"id": cid, "account": account, "amount": amount, "status": status, "reason": reason,
                           "attempts": attempts, "lease_expires_at": lease, "deposit_tx": deposit_tx,
                           "deposit_lineage_id": deposit_lineage, "credit_lineage_id": credit_lineage},
        "authorisation": {"nonce": nonce, "expiration_ledger": expiration, "latest_ledger": latest,
                          "consumed_on_chain": consumed, "expired": latest > expiration and not consumed},
        "lineages": [lin.public() | {"resolution": preview(chain, lin)} for lin in history],
        "needs_human": status == "needs_human" or (consumed and not any(
            lin.state == "applied" or lin.live for lin in history if lin.purpose == "deposit")),
    }


def inspect_relay(conn: psycopg.Connection, chain_of: Callable[[], ChainClient], relay_id: int) -> dict[str, Any]:
    """A relay's authorisation nonces on chain, its expiry by ledger, its lineages and what resolve
    would do with a live one, and its fee reservation. Never the auth entries or envelopes."""
    row = conn.execute(RELAY_SQL, (relay_id,)).fetchone()
    if row is None:
        raise UsageError(f"relay {relay_id} does not exist")
    from paygate_cli.chain.relay import nonces_consumed

    chain = chain_of()
    (rid, account, contract, function, nonces, expiration, status, reason, lineage_id, attempts, lease, max_fee,
     fee_charged, reservation, settled_fee) = row
    consumed, latest = nonces_consumed(chain, account, list(nonces))
    history = [lineages.load(conn, i) for (i,) in conn.execute(RELAY_LINEAGES_SQL, (f"relay:{rid}",))]
    ours = any(lin.state == "applied" or lin.live for lin in history)
    return {
        "relay": {"id": rid, "account": account, "contract": contract, "function": function, "status": status,
                  "reason": reason, "attempts": attempts, "lease_expires_at": lease, "lineage_id": lineage_id,
                  "fee_charged": fee_charged},
        "authorisation": {"nonces": list(nonces), "consumed_on_chain": consumed, "expiration_ledger": expiration,
                          "latest_ledger": latest, "expired": latest > expiration},
        "fee_reservation": {"status": reservation, "reserved": max_fee, "settled_fee": settled_fee},
        "lineages": [lin.public() | {"resolution": preview(chain, lin)} for lin in history],
        # A nonce spent with no applied or in-flight lineage of ours: someone else used the authorisation.
        "needs_human": status == "needs_human" or (bool(consumed) and not ours),
    }


def check_request(*, lane: str | None = None, deposit_id: int | None = None, relay_id: int | None = None) -> None:
    """Refused before the database is asked anything (2): more than one of --lane, --deposit, --relay."""
    if sum(x is not None and x != "" for x in (lane, deposit_id, relay_id)) > 1:
        raise UsageError("--lane, --deposit and --relay are mutually exclusive")


def nonce_inspect(conn: psycopg.Connection, settings: Any, *, lane: str | None = None,
                  deposit_id: int | None = None, relay_id: int | None = None) -> dict[str, Any]:
    """The whole command: {"lanes": [...]}, {"deposit": {...}} or {"relay": {...}}, plus "needs_human".
    The chain client (and stellar-sdk with it) is built only once something needs more of the chain
    than a lane's sequence (read SDK-free): an unknown lane, deposit or relay is answered from the
    database alone, a lane with nothing in flight from the database and one getLedgerEntries."""
    from paygate_cli.db.connect import assert_not_in_transaction

    check_request(lane=lane, deposit_id=deposit_id, relay_id=relay_id)
    clients: list[ChainClient] = []

    def chain_of() -> ChainClient:
        if not clients:
            from paygate_cli.chain.rpc import ChainClient

            clients.append(ChainClient(settings, guard_conn=conn))
        return clients[0]

    def sequence_of(address: str) -> int:
        from paygate_cli.chain.accounts import lane_sequence

        return lane_sequence(settings, address, guard=lambda what: assert_not_in_transaction(conn, what))

    try:
        if relay_id is not None:
            relay_report = inspect_relay(conn, chain_of, relay_id)
            return {"relay": relay_report, "needs_human": relay_report["needs_human"]}
        if deposit_id is not None:
            report = inspect_deposit(conn, chain_of, deposit_id)
            return {"deposit": report, "needs_human": report["needs_human"]}
        lanes = inspect_lanes(conn, chain_of, lane, sequence_of)
        return {"lanes": lanes, "needs_human": any(r["needs_human"] for r in lanes)}
    finally:
        for client in clients:
            client.close()
