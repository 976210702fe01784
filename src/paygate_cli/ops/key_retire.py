"""`key-retire-check KEY_ID | --lane ADDRESS`: may this journal key (or lane) be retired?

Retirable only when (docs/architecture.md §7):
- no non-terminal lineage uses it;
- every lineage under it is terminal and the chain agrees: a majority of read endpoints confirm an
  applied/failed receipt (or, for expired/superseded, none of them has the transaction and a
  majority prove it dead), unless the lineage is older than the endpoints' retention and its
  terminal state was recorded from the chain when it was resolved;
- the configured retention (`key_retention`) since its last use has passed (DB time);
- a key is not the active key; a lane is drained, and its chain sequence (majority) equals the
  journal's last consumed sequence (nothing we did not journal used it).
Read-only: it probes the chain, writes nothing, resends nothing."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from paygate_cli.errors import Unavailable, UsageError
from paygate_cli.journal import lineage as lineages

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.rpc import ChainClient

MAX_LISTED = 20  # blockers listed in full; the rest are counted
MAX_PROBED = 500  # lineages verified on chain per run; beyond that they block until a re-run gets to them

# Every lineage of the key / lane, newest first (the ones most likely still inside RPC retention).
KEY_LINEAGES_SQL = """
SELECT id FROM paygate.lineages WHERE key_id = %(target)s ORDER BY id DESC
"""
LANE_LINEAGES_SQL = """
SELECT id FROM paygate.lineages WHERE lane = %(target)s ORDER BY id DESC
"""
# Last use in DB time and whether the retention since then has passed, in one statement.
KEY_LAST_USE_SQL = """
SELECT max(signed_at), coalesce(now() - max(signed_at) >= make_interval(secs => %(retention)s), true)
FROM paygate.lineages WHERE key_id = %(target)s
"""
LANE_LAST_USE_SQL = """
SELECT max(greatest(created_at, signed_at, sent_at, resolved_at)),
       coalesce(now() - max(greatest(created_at, signed_at, sent_at, resolved_at))
                >= make_interval(secs => %(retention)s), true)
FROM paygate.lineages WHERE lane = %(target)s
"""
LANE_ROW_SQL = "SELECT status, drained_at FROM paygate.lanes WHERE address = %s"
KEY_IN_JOURNAL_SQL = "SELECT EXISTS (SELECT 1 FROM paygate.lineages WHERE key_id = %s)"
# The distinct key ids of the journal, one index probe each (a skip scan over lineages_key_id).
JOURNAL_KEY_IDS_SQL = """
WITH RECURSIVE ids AS (
    (SELECT key_id FROM paygate.lineages WHERE key_id IS NOT NULL ORDER BY key_id LIMIT 1)
    UNION ALL
    SELECT (SELECT l.key_id FROM paygate.lineages l WHERE l.key_id > ids.key_id ORDER BY l.key_id LIMIT 1)
    FROM ids WHERE ids.key_id IS NOT NULL
)
SELECT key_id FROM ids WHERE key_id IS NOT NULL LIMIT %(limit)s
"""
KNOWN_LANES_SQL = "SELECT address FROM paygate.lanes ORDER BY address LIMIT %(limit)s"
MAX_NAMED = 20  # known key ids / lanes named in a usage error
NO_SUCH_TX = "00" * 32  # a hash no transaction has: the probe then reads only the lane's sequence


def _answered_by_majority(probes: list[Any], what: str) -> int:
    """The majority of the read endpoints; Unavailable (69) when fewer than that answered at all:
    the chain's view is unknown, which is an outage to retry, not a blocker for a human."""
    majority = len(probes) // 2 + 1
    answered = [p for p in probes if not p.error]
    if len(answered) < majority:
        errors = "; ".join(f"{p.endpoint}: {p.error}" for p in probes if p.error)
        raise Unavailable(f"key-retire-check cannot verify {what}: {len(answered)} of {len(probes)} read "
                          f"endpoint(s) answered ({errors})"[:500], msgid="rpc.unavailable")
    return majority


def _verify_terminal(chain: ChainClient, lineage: lineages.Lineage) -> str | None:
    """None when the chain confirms the recorded terminal state; else why not."""
    from paygate_cli.journal.resolve import judge

    if lineage.state == "abandoned" or lineage.inner_hash is None:
        return None  # never signed: nothing of it can be on chain
    probes = chain.probe(lineage.lane, lineage.inner_hash.hex())
    majority = _answered_by_majority(probes, f"lineage {lineage.id}")
    answered = [p for p in probes if not p.error and p.tx_status is not None]
    if lineage.state in ("applied", "failed"):
        want = "SUCCESS" if lineage.state == "applied" else "FAILED"
        if sum(p.tx_status == want for p in answered) >= majority:
            return None
        past_retention = [p for p in answered if p.oldest_ledger is not None and lineage.ledger is not None
                          and p.oldest_ledger > lineage.ledger]
        if lineage.ledger is not None and len(past_retention) >= majority:
            return None  # older than retention, with the ledger recorded when the receipt was read
        seen = dict(Counter(p.tx_status or "no answer" for p in probes))
        return f"receipt {want} not confirmed by a majority of read endpoints ({seen})"
    # expired / superseded: nobody may have it, and a majority must still prove it dead.
    if any(p.tx_status in ("SUCCESS", "FAILED") for p in answered):
        return f"recorded {lineage.state}, but a read endpoint has the transaction included"
    verdicts = [judge(p, lineage) for p in probes]
    if sum(v in ("expired", "superseded") for v in verdicts) >= majority:
        return None
    past_retention = [p for p in answered if p.oldest_ledger is not None and lineage.signed_at_ledger is not None
                      and p.oldest_ledger > lineage.signed_at_ledger]
    if lineage.resolution and len(past_retention) >= majority:
        return None  # older than retention; proven dead when resolved (the resolution says how)
    return f"recorded {lineage.state}, not proven dead by a majority of read endpoints ({verdicts})"


def _lineage_blockers(conn: psycopg.Connection, chain: ChainClient, sql: str, target: str) -> tuple[list[dict], int]:
    blockers: list[dict[str, Any]] = []
    ids = [int(i) for (i,) in conn.execute(sql, {"target": target})]
    probed = 0
    for lineage_id in ids:
        lineage = lineages.load(conn, lineage_id)
        if lineage.live:
            blockers.append({"lineage_id": lineage.id, "state": lineage.state, "lane": lineage.lane,
                             "reason": f"lineage {lineage.id} is {lineage.state} (not terminal)"})
            continue
        if probed >= MAX_PROBED:
            blockers.append({"lineage_id": lineage.id, "state": lineage.state,
                             "reason": f"not verified in this run (more than {MAX_PROBED} lineages); run again"})
            continue
        probed += lineage.state != "abandoned"
        why = _verify_terminal(chain, lineage)
        if why:
            blockers.append({"lineage_id": lineage.id, "state": lineage.state, "lane": lineage.lane, "reason": why})
    return blockers, len(ids)


def _retention_blocker(conn: psycopg.Connection, sql: str, target: str, retention: float) -> tuple[dict | None, Any]:
    last_use, elapsed = conn.execute(sql, {"target": target, "retention": retention}).fetchone()
    if elapsed:
        return None, last_use
    return {"reason": f"last used at {last_use.isoformat()}; the retention of {retention:g}s since then has "
                      "not passed"}, last_use


def _majority_sequence(chain: ChainClient, lane: str) -> tuple[int | None, dict[str, Any]]:
    probes = chain.probe(lane, NO_SUCH_TX)
    seqs = Counter(p.account_seq for p in probes if not p.error and p.account_seq is not None)
    majority = _answered_by_majority(probes, f"lane {lane}'s sequence")
    seq, count = seqs.most_common(1)[0] if seqs else (None, 0)
    return (seq if count >= majority else None), {p.endpoint: p.account_seq for p in probes}


def keyring_ids(settings: Any) -> list[str]:
    """The key ids of the configured journal keys file (ids only; the keys are never read out) and
    the active key id."""
    import json

    ids = {settings.journal_active_key_id} - {None}
    secret = settings.secret("journal_keys")
    if secret is not None:
        try:
            document = json.loads(secret.reveal())
        except ValueError:
            document = None
        if isinstance(document, dict):
            ids |= {str(k) for k in document}
    return sorted(ids)


def _require_known_key(conn: psycopg.Connection, settings: Any, key_id: str) -> None:
    """A key id in neither the keyring nor the journal is a typo: saying it is retirable (no lineage
    uses it) would be true of any string, and would let an operator retire the wrong key."""
    in_keyring = keyring_ids(settings)
    if key_id in in_keyring or conn.execute(KEY_IN_JOURNAL_SQL, (key_id,)).fetchone()[0]:
        return
    in_journal = [str(k) for (k,) in conn.execute(JOURNAL_KEY_IDS_SQL, {"limit": MAX_NAMED})]
    known = sorted(set(in_keyring) | set(in_journal))[:MAX_NAMED]
    raise UsageError(f"key {key_id!r} is neither in the journal keys file nor used by any lineage; known key "
                     f"ids: {', '.join(known) or 'none'}", msgid="usage.unknown_key")


def check_key(conn: psycopg.Connection, chain: ChainClient, settings: Any, key_id: str) -> dict[str, Any]:
    _require_known_key(conn, settings, key_id)
    blockers: list[dict[str, Any]] = []
    if settings.journal_active_key_id == key_id:
        blockers.append({"reason": f"{key_id} is the active journal key (PAYGATE_JOURNAL_ACTIVE_KEY_ID)"})
    found, count = _lineage_blockers(conn, chain, KEY_LINEAGES_SQL, key_id)
    blockers += found
    retention, last_use = _retention_blocker(conn, KEY_LAST_USE_SQL, key_id, settings.key_retention)
    if retention:
        blockers.append(retention)
    return _report("key", key_id, blockers, {"lineages": count, "last_use": last_use,
                                             "retention_s": settings.key_retention})


def check_lane(conn: psycopg.Connection, chain: ChainClient, settings: Any, lane: str) -> dict[str, Any]:
    row = conn.execute(LANE_ROW_SQL, (lane,)).fetchone()
    if row is None:
        known = [str(a) for (a,) in conn.execute(KNOWN_LANES_SQL, {"limit": MAX_NAMED})]
        raise UsageError(f"lane {lane} is not in the journal; known lanes: {', '.join(known) or 'none'}",
                         msgid="usage.unknown_lane")
    blockers: list[dict[str, Any]] = []
    if row[0] == "active":
        blockers.append({"reason": f"lane {lane} is active: drain it first (`paygate drain --lane {lane}`)"})
    found, count = _lineage_blockers(conn, chain, LANE_LINEAGES_SQL, lane)
    blockers += found
    retention, last_use = _retention_blocker(conn, LANE_LAST_USE_SQL, lane, settings.key_retention)
    if retention:
        blockers.append(retention)
    journal_seq = conn.execute(lineages.LAST_CONSUMED_SEQ_SQL, (lane,)).fetchone()[0]
    chain_seq, per_endpoint = _majority_sequence(chain, lane)
    if chain_seq is None:
        blockers.append({"reason": f"no majority of read endpoints agrees on the lane's sequence ({per_endpoint})"})
    elif journal_seq is not None and chain_seq != int(journal_seq):
        blockers.append({"reason": f"chain sequence {chain_seq} differs from the journal's last consumed "
                                   f"{journal_seq}" + (" (a transaction this gateway never journaled used the lane)"
                                                       if chain_seq > int(journal_seq) else "")})
    return _report("lane", lane, blockers, {"lineages": count, "last_use": last_use, "status": row[0],
                                            "chain_seq": chain_seq, "journal_last_consumed_seq": journal_seq,
                                            "retention_s": settings.key_retention})


def _report(kind: str, target: str, blockers: list[dict[str, Any]], checked: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "target": target, "retirable": not blockers, "blocker_count": len(blockers),
            "blockers": blockers[:MAX_LISTED], "checked": checked}


def check_request(settings: Any, *, key_id: str | None, lane: str | None) -> None:
    """What is refused before the database is asked anything: not exactly one target (2), fewer read
    hosts than the quorum rule asks for (78)."""
    if bool(key_id) == bool(lane):
        raise UsageError("give exactly one of KEY_ID or --lane ADDRESS", msgid="usage.retire_target")
    from paygate_cli.settings import require_read_quorum

    require_read_quorum(settings, "key-retire-check refuses to decide",
                        "a key or lane is retirable only when a majority of them confirms every receipt")


def key_retire_check(conn: psycopg.Connection, settings: Any, *, key_id: str | None,
                     lane: str | None) -> dict[str, Any]:
    """The whole command over the caller's connection (the command runs check_request before opening it)."""
    from paygate_cli.chain.rpc import ChainClient

    check_request(settings, key_id=key_id, lane=lane)  # again: the quorum rule holds for every caller
    chain = ChainClient(settings, guard_conn=conn)
    try:
        if lane:
            return check_lane(conn, chain, settings, lane)
        assert key_id is not None
        return check_key(conn, chain, settings, key_id)
    finally:
        chain.close()
