"""The restore gate's recovery pass (docs/architecture.md §8): after a restore from backup or a
promotion the database may be behind the chain, so submissions stay closed (the `restore` halt,
sql/0004_restore_gate.sql) until this pass has compared the journal with the chain.

    result = run_pass(conn, settings, chain_of, actor=..., dry_run=False, log=log)

1. The identity: paygate.check_db_identity (sets the halt if a tick has not yet seen the change),
   then the identity as it is now, kept to be compared again before anything is cleared.
2. Every registered lane: its sequence on every distinct read host in one batched getLedgerEntries,
   against the journal's last consumed one (lineage.last_consumed_seq_sql), by the engine's quorum
   rule (engine.judge_lane_views). Equal: ok. Ahead: fenced with the engine's evidence
   (engine.chain_ahead_evidence) and a `lane_fence` finding, as the engine fences it. Behind (the
   chain lags, or lost ledgers) or no quorum: not decided, a blocker. A lane with a live lineage is
   blocked by it (the chain may be one ahead with that very lineage).
3. Every live lineage is a blocker (state, lane, sequence, the lease of the row holding it). The
   pass drives none itself: the caller has already driven them through the queues' take-over
   routines (workers/recovery.py's tick; ops/recover_check.py), with the normal grace.
4. Clean (no blocker) and a restore halt set: in ONE transaction, the identity recorded and the
   halt deleted, with an audit row `restore_clear` — only if the identity is still the one read in
   step 1 (a second promotion during the pass keeps the halt).

`lanes_ahead_halt` is recovery's cheap check while no restore halt is set: two or more lanes ahead
of the journal at once is a database that went back in time without changing identity."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from paygate_cli.errors import Unavailable
from paygate_cli.journal import lineage as lineages
from paygate_cli.journal.engine import CHAIN_AHEAD_BY, LaneReading, chain_ahead_evidence, judge_lane_views

if TYPE_CHECKING:
    import logging

    import psycopg

    from paygate_cli.chain.accounts import AccountView
    from paygate_cli.chain.rpc import ChainClient

# The identity now (sql/functions/db_identity_now.sql, as check_db_identity reads it): cluster, writer's
# timeline, database.
IDENTITY_SQL = "SELECT system_identifier, timeline, database_oid FROM paygate.db_identity_now()"
CHECK_IDENTITY_SQL = "SELECT paygate.check_db_identity(%s)"
RESTORE_HALT_SQL = "SELECT reason, set_by, set_at FROM paygate.halts WHERE kind = 'restore'"
RECORDED_IDENTITY_SQL = "SELECT system_identifier, timeline, database_oid FROM paygate.db_identity"
LOCK_RESTORE_HALT_SQL = "SELECT reason FROM paygate.halts WHERE kind = 'restore' FOR UPDATE"
RECORD_IDENTITY_SQL = """
INSERT INTO paygate.db_identity (system_identifier, timeline, database_oid, recorded_by)
VALUES (%(system_identifier)s, %(timeline)s, %(database_oid)s, %(by)s)
ON CONFLICT (singleton) DO UPDATE
SET system_identifier = EXCLUDED.system_identifier, timeline = EXCLUDED.timeline,
    database_oid = EXCLUDED.database_oid, recorded_at = now(), recorded_by = EXCLUDED.recorded_by
"""
CLEAR_RESTORE_HALT_SQL = "DELETE FROM paygate.halts WHERE kind = 'restore'"
SET_RESTORE_HALT_SQL = """
INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('restore', %(reason)s, %(by)s)
ON CONFLICT (kind) DO NOTHING
"""
AUDIT_SQL = "INSERT INTO paygate.audit_log (actor, action, target, details) VALUES (%s, %s, 'restore', %s)"

# The chain is read BEFORE the journal it is compared with: an envelope is anchored (committed)
# before it is broadcast, so whatever of ours the chain shows is in the journal read after it. Read
# the other way round, a worker's transaction anchored and landed between the two reads would look
# like a sequence used outside the journal.
REGISTERED_LANES_SQL = "SELECT address FROM paygate.lanes WHERE status <> 'retired' ORDER BY address"
# Those lanes with the journal's last consumed sequence, the live lineage (if any) and the open
# sequence-fence finding (if any).
LANES_SQL = """
SELECT l.address, l.status, """ + lineages.last_consumed_seq_sql("l.address") + """,
       x.id, x.source_seq, f.id
FROM paygate.lanes l
LEFT JOIN paygate.lineages x ON x.lane = l.address AND paygate.lineage_is_live(x.state)
LEFT JOIN paygate.findings f ON f.kind = 'lane_fence' AND f.subject = l.address AND f.resolved_at IS NULL
WHERE l.address = ANY(%(lanes)s)
ORDER BY l.address
"""
# Every live lineage, with the lease of the queue row that holds it (NULL: no row holds it; the
# owning worker's idle sweep drives it).
LIVE_LIMIT = 1000
LIVE_SQL = """
SELECT x.id, x.purpose, x.entitlement, x.state, x.lane, x.source_seq, x.created_at, x.parked_at IS NOT NULL,
       greatest((SELECT max(d.lease_expires_at) FROM paygate.deposits d
                 WHERE d.deposit_lineage_id = x.id OR d.credit_lineage_id = x.id),
                (SELECT b.lease_expires_at FROM paygate.charge_batches b WHERE b.lineage_id = x.id),
                (SELECT r.lease_expires_at FROM paygate.relays r WHERE r.lineage_id = x.id),
                (SELECT j.lease_expires_at FROM paygate.bot_jobs j WHERE j.lineage_id = x.id),
                (SELECT t.lease_expires_at FROM paygate.ttl_jobs t WHERE t.lineage_id = x.id))
FROM paygate.lineages x WHERE paygate.lineage_is_live(x.state)
ORDER BY x.id LIMIT %(limit)s
"""
LIVE_COUNT_SQL = "SELECT count(*) FROM paygate.lineages x WHERE paygate.lineage_is_live(x.state)"

@dataclass(frozen=True)
class Identity:
    system_identifier: str
    timeline: int
    database_oid: int

    def as_dict(self) -> dict[str, Any]:
        return {"system_identifier": self.system_identifier, "timeline": self.timeline,
                "database_oid": self.database_oid}


@dataclass
class LaneCheck:
    lane: str
    status: str
    journal_seq: int | None
    chain_seq: int | None
    verdict: str  # ok | fenced | blocked
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)
    live_lineage_id: int | None = None  # blocked by this live lineage (a unit blocker of its own)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class PassResult:
    halt: dict[str, Any] | None  # the restore halt as the pass found it (None: none set)
    identity: Identity
    lanes: list[LaneCheck]
    units: list[dict[str, Any]]  # live lineages: each a blocker
    units_total: int
    dry_run: bool
    fenced_now: int = 0  # lanes this pass fenced (needs a human: runbooks/lane-fenced-chain-ahead.md)
    would_fence: int = 0  # a dry run's lanes ahead of the journal, left unfenced
    cleared: bool = False
    kept_because: str | None = None  # clean, but the halt stays (the identity changed during the pass)
    recorded: Identity | None = None  # paygate.db_identity as the pass found it

    @property
    def blocked_lanes(self) -> list[LaneCheck]:
        return [lane for lane in self.lanes if lane.verdict == "blocked"]

    @property
    def clean(self) -> bool:
        return not self.blocked_lanes and not self.units_total

    def blockers(self) -> list[str]:
        """Each blocker once: a lane blocked by its live lineage is named by that lineage's unit."""
        found = [f"lane {lane.lane}: {lane.detail}" for lane in self.blocked_lanes if lane.live_lineage_id is None]
        found += [f"lineage {u['lineage_id']} ({u['purpose']}, {u['entitlement']}) {u['state']} on lane {u['lane']}"
                  f" seq {u['source_seq']}, lease until {u['lease_expires_at'] or 'no row holds it'}"
                  for u in self.units]
        if self.units_total > len(self.units):
            found.append(f"... and {self.units_total - len(self.units)} more live lineages")
        return found

    def summary(self) -> dict[str, Any]:
        verdicts: dict[str, int] = {}
        for lane in self.lanes:
            verdicts[lane.verdict] = verdicts.get(lane.verdict, 0) + 1
        return {"restore_halt": self.halt, "identity": self.identity.as_dict(),
                "recorded_identity": None if self.recorded is None else self.recorded.as_dict(),
                "identity_changed": self.recorded is not None and self.recorded != self.identity, "lanes": verdicts,
                "live_lineages": self.units_total, "fenced_now": self.fenced_now,
                "would_fence": self.would_fence, "clean": self.clean,
                "cleared": self.cleared, "kept_because": self.kept_because, "dry_run": self.dry_run}

    def as_dict(self) -> dict[str, Any]:
        return {**self.summary(), "lanes": [lane.as_dict() for lane in self.lanes], "units": self.units,
                "blockers": self.blockers()}


def read_identity(conn: psycopg.Connection) -> Identity:
    system, timeline, oid = conn.execute(IDENTITY_SQL).fetchone()
    return Identity(str(system), int(timeline), int(oid))


def restore_halt(conn: psycopg.Connection) -> dict[str, Any] | None:
    row = conn.execute(RESTORE_HALT_SQL).fetchone()
    return None if row is None else {"reason": row[0], "set_by": row[1], "set_at": row[2]}


def run_pass(conn: psycopg.Connection, settings: Any, chain_of: Callable[[], ChainClient], *, actor: str,
             dry_run: bool, log: logging.Logger | logging.LoggerAdapter[Any]) -> PassResult:
    """The pass (the module's docstring). `chain_of`: a chain client, built only when a lane is ahead
    (the evidence's getTransactions); the lanes' sequences are read SDK-free (many_lane_views).
    Unavailable (69) when no read host answered for any lane. A dry run writes nothing, not even
    the halt check_db_identity would set: it says whether the identity differs from the recorded one."""
    if not dry_run:
        conn.execute(CHECK_IDENTITY_SQL, (actor,))  # a change no tick saw yet sets the halt now
    identity = read_identity(conn)
    halt = restore_halt(conn)
    recorded = conn.execute(RECORDED_IDENTITY_SQL).fetchone()
    addresses = [address for (address,) in conn.execute(REGISTERED_LANES_SQL)]
    views = _views(conn, settings, addresses)  # the chain first (REGISTERED_LANES_SQL says why)
    rows = conn.execute(LANES_SQL, {"lanes": addresses}).fetchall()
    checks = [_check_lane(row, views[row[0]]) for row in rows]
    result = PassResult(halt, identity, [check for check, _ in checks], [], 0, dry_run,
                        recorded=None if recorded is None else Identity(str(recorded[0]), int(recorded[1]),
                                                                        int(recorded[2])))
    for check, reading in checks:
        if reading is not None:
            _fence(conn, chain_of(), check, reading, result, log)
    result.units = _live_units(conn)
    result.units_total = max(len(result.units), int(conn.execute(LIVE_COUNT_SQL).fetchone()[0]))
    if result.clean and halt is not None and not dry_run:
        _clear(conn, result, actor, log)
    return result


def _views(conn: psycopg.Connection, settings: Any, addresses: list[str]) -> dict[str, list[AccountView]]:
    from paygate_cli.chain.accounts import many_lane_views
    from paygate_cli.db.connect import assert_not_in_transaction

    if not addresses:
        return {}
    views = many_lane_views(settings, addresses, guard=lambda what: assert_not_in_transaction(conn, what))
    answered = [v for lane_views in views.values() for v in lane_views if v.error in (None, "not found")]
    if not answered:
        errors = sorted({v.error or "" for lane_views in views.values() for v in lane_views})
        raise Unavailable(f"no Stellar RPC read endpoint answered for the lanes' sequences: {'; '.join(errors)}"[:500],
                          msgid="rpc.unavailable")
    return views


def _check_lane(row: tuple[Any, ...], views: list[AccountView]) -> tuple[LaneCheck, LaneReading | None]:
    """The lane's verdict, and the reading to fence it with when it is ahead of the journal."""
    address, status, journal_seq, live_id, live_seq, fence_id = row
    journal_seq = None if journal_seq is None else int(journal_seq)
    if fence_id is not None:
        # Already fenced for a sequence used outside the journal: a human's (accept_lane_fence).
        check = LaneCheck(address, status, journal_seq, None, "fenced",
                          f"fenced already (finding {fence_id}): runbooks/lane-fenced-chain-ahead.md")
        return check, None
    if journal_seq is None and live_id is None:
        seqs = [v.seq for v in views if v.seq is not None]
        return LaneCheck(address, status, None, max(seqs) if seqs else None, "ok", "no journaled use yet"), None
    reading = judge_lane_views(views, journal_seq if journal_seq is not None else -1)
    check = LaneCheck(address, status, journal_seq, reading.chain_seq, "ok", "chain and journal agree")
    if live_id is not None:
        check.verdict, check.live_lineage_id = "blocked", int(live_id)
        check.detail = (f"lineage {live_id} is live on it (seq {live_seq}): the chain may hold it; resolved by "
                        "its worker or recovery")
        return check, None
    assert journal_seq is not None
    if reading.verdict == "ahead":
        return check, reading
    if reading.verdict == "behind":
        check.verdict = "blocked"
        check.detail = (f"the chain reads behind the journal (sequence {reading.chain_seq} < {journal_seq}: "
                        f"{reading.views_text()}): a lagging read or a chain that lost ledgers; not decided")
    elif reading.verdict == "unknown":
        check.verdict = "blocked"
        check.detail = f"no quorum of read hosts agrees on the lane's sequence ({reading.views_text()})"
    return check, None


def _fence(conn: psycopg.Connection, chain: ChainClient, check: LaneCheck, reading: LaneReading, result: PassResult,
           log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    """A lane ahead of the journal: fenced as the engine fences it (the same evidence, the finding)."""
    assert check.journal_seq is not None
    why, evidence = chain_ahead_evidence(chain, check.lane, check.journal_seq, reading)
    check.verdict, check.evidence = "fenced", evidence
    if result.dry_run:
        check.detail = f"{why} (dry run: would be fenced)"
        result.would_fence += 1
        return
    check.detail = why
    with conn.transaction():
        lineages.fence_lane(conn, check.lane, by=CHAIN_AHEAD_BY, details={"why": why[:500], "by": "restore gate",
                                                                           **evidence},
                            reason=why[:1000], finding=f"lane {check.lane}: {why}")
    result.fenced_now += 1
    log.error("lane %s fenced (drained): %s", check.lane, why,
              extra={"msgid": "journal.lane_fenced", "lane": check.lane})


def _live_units(conn: psycopg.Connection) -> list[dict[str, Any]]:
    cols = ("lineage_id", "purpose", "entitlement", "state", "lane", "source_seq", "created_at", "parked",
            "lease_expires_at")
    return [dict(zip(cols, row, strict=True)) for row in conn.execute(LIVE_SQL, {"limit": LIVE_LIMIT})]


def _clear(conn: psycopg.Connection, result: PassResult, actor: str,
           log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    """Record the identity and lift the halt in one transaction, only if the identity is still the
    one the pass started from."""
    from psycopg.types.json import Jsonb

    with conn.transaction():
        if conn.execute(LOCK_RESTORE_HALT_SQL).fetchone() is None:
            return  # another pass cleared it meanwhile
        now = read_identity(conn)
        if now != result.identity:
            result.kept_because = (f"the database's identity changed during the pass ({result.identity.as_dict()} -> "
                                   f"{now.as_dict()}): run it again")
            return
        conn.execute(RECORD_IDENTITY_SQL, {**now.as_dict(), "by": actor})
        conn.execute(CLEAR_RESTORE_HALT_SQL)
        conn.execute(AUDIT_SQL, (actor, "restore_clear", Jsonb(_jsonable({**result.summary(), "cleared": True}))))
    result.cleared = True
    log.warning("restore halt cleared: the journal agrees with the chain on every lane and nothing is live",
                extra={"msgid": "restore.halt_cleared"})


def _jsonable(value: Any) -> Any:
    import json

    return json.loads(json.dumps(value, default=str))


def write_blocked_audit(conn: psycopg.Connection, result: PassResult, actor: str) -> None:
    """The command's record of a pass that left the halt in place (a recovery tick writes none)."""
    from psycopg.types.json import Jsonb

    conn.execute(AUDIT_SQL, (actor, "restore_check", Jsonb(_jsonable(
        {**result.summary(), "blockers": result.blockers()[:50]}))))


# -- while no restore halt is set ------------------------------------------------------------------

# Active lanes the journal has used, without an open sequence fence (those are a human's already),
# with the last consumed sequence and the live lineage's. Read twice: to learn whether two such
# lanes exist at all (else no chain read), and again after the chain (REGISTERED_LANES_SQL says why).
AHEAD_CHECK_SQL = """
SELECT l.address, """ + lineages.last_consumed_seq_sql("l.address") + """, x.source_seq
FROM paygate.lanes l
LEFT JOIN paygate.lineages x ON x.lane = l.address AND paygate.lineage_is_live(x.state)
WHERE l.status = 'active' AND (%(lanes)s::text[] IS NULL OR l.address = ANY(%(lanes)s))
  AND NOT EXISTS (SELECT 1 FROM paygate.findings f
                  WHERE f.kind = 'lane_fence' AND f.subject = l.address AND f.resolved_at IS NULL)
ORDER BY l.address
"""


def lanes_ahead_halt(conn: psycopg.Connection, settings: Any, *, actor: str,
                     log: logging.Logger | logging.LoggerAdapter[Any]) -> list[str]:
    """Two or more active lanes ahead of the journal at once (one batched read): the database went
    back in time without changing identity (e.g. a file-level snapshot), so the restore halt is set.
    One lane ahead is that lane's fence only (someone else used its key), left to the engine. A lane
    whose live lineage may be the one the chain holds counts ahead only past that lineage's sequence.
    The lanes found ahead (none: nothing set)."""
    used = [lane for lane, seq, _ in conn.execute(AHEAD_CHECK_SQL, {"lanes": None}) if seq is not None]
    if len(used) < 2:
        return []
    views = _views(conn, settings, used)
    rows = [(lane, int(seq), live) for lane, seq, live in conn.execute(AHEAD_CHECK_SQL, {"lanes": used})
            if seq is not None]
    ahead = [lane for lane, seq, live in rows
             if judge_lane_views(views[lane], max(seq, int(live or 0))).verdict == "ahead"]
    if len(ahead) < 2:
        return []
    from psycopg.types.json import Jsonb

    reason = (f"lanes ahead of the journal: {len(ahead)} lanes ({', '.join(ahead[:5])}) show sequences the journal "
              "never recorded: the database went back in time without changing identity (e.g. a file-level "
              "snapshot); submissions stay closed until a recovery pass compares the journal with the chain "
              "(paygate recover-check)")[:1000]
    with conn.transaction():
        if conn.execute(SET_RESTORE_HALT_SQL, {"reason": reason, "by": actor}).rowcount == 1:
            conn.execute(AUDIT_SQL, (actor, "restore_halt", Jsonb({"reason": reason, "lanes": ahead})))
    log.error("restore halt: %s", reason, extra={"msgid": "restore.halt_set"})
    return ahead
