"""Reconciler: the chain against the database (docs/architecture.md §6). Single writer, paced.

Per tick, at most `batch` chain reads, least recently checked accounts first:

- each account's cached balance against the billing contract's `balance` on chain. The difference
  chain - cached is classified as
    *in flight*  exactly the admitted charges not yet observed (debited in Postgres, not on chain yet),
    *lagging*    exactly that plus the billing events past the observer's cursor (up to the ledger
                 the balance was read at: charges already debited on chain, credits not yet settled),
    *unexplained* anything else: a finding (stored, alerted once, cleared when a later check matches);
- the contract's USDC holdings against what the database says it must hold: cached balances +
  admitted and settled charges (charges stay in the contract) + deposits that landed and are not
  credited yet; deposits still in flight may explain a surplus;
- each lane's chain sequence against the journal's last consumed one;
- accounts the chain holds money for that paygate.accounts does not have (an account first seen
  after the point a database was restored to): found in the billing events the observer stored and
  quarantined (an event naming an account without a row is always quarantined, so the set is exact
  for every event the observer has read; the contract's balance entries cannot be listed without
  their keys), each one's chain balance read like any other account's. A balance that is not zero
  is unexplained (nothing paygate has in flight can be for an account it has no row for): a
  finding naming the account, its chain balance and the events; zero clears it.

Reads are bracketed by two database snapshots (short transactions, none open across a chain call):
an account, the total or a lane whose database side changed meanwhile is "moving" and checked again
next tick, so a race between our reads never looks like drift."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from paygate_cli.chain.drift import classify, lagging_effect
from paygate_cli.context import TickContext, TickResult
from paygate_cli.journal import lineage as lineages
from paygate_cli.queues.findings import Finding, clear_findings, record_findings

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.rpc import ChainClient

HONOURS_DRAIN = True  # a drained instance's reconciler reads nothing and writes nothing

# Never checked first (any of them: no ORDER BY, so the anti-join stops at the first n it finds), then
# least recently checked (an index walk).
PICK_ACCOUNTS_SQL = """
(SELECT a.address FROM paygate.accounts a
 WHERE NOT EXISTS (SELECT 1 FROM paygate.account_checks c WHERE c.address = a.address)
 LIMIT %(n)s)
UNION ALL
(SELECT c.address FROM paygate.account_checks c ORDER BY c.checked_at, c.address LIMIT %(n)s)
LIMIT %(n)s
"""
# One account's database side: cached balance and the admitted charges the chain has not been seen
# to debit (charges_open_account walks only those).
ACCOUNTS_SQL = """
SELECT a.address, a.cached_balance,
       coalesce((SELECT sum(c.amount) FROM paygate.charges c
                 WHERE c.account = a.address AND c.status = 'authorized'), 0)
FROM paygate.accounts a WHERE a.address = ANY(%s)
"""
CURSOR_SQL = "SELECT cursor FROM paygate.observer_cursor"
# Accounts named by quarantined events that paygate.accounts does not have, those never reported
# first, then the least recently seen (the open finding's last_seen): the quarantined set is small
# (each event alarms) and walked by its partial index. With each, a few of the events naming it.
UNKNOWN_ACCOUNTS_SQL = """
SELECT u.account, u.events
FROM (SELECT e.payload->>'account' AS account, (array_agg(e.event_id ORDER BY e.ledger, e.event_id))[1:5] AS events
      FROM paygate.chain_events e
      WHERE e.quarantined AND e.kind IS NOT NULL AND e.payload ? 'account'
      GROUP BY 1) u
WHERE NOT EXISTS (SELECT 1 FROM paygate.accounts a WHERE a.address = u.account)
ORDER BY (SELECT f.last_seen FROM paygate.findings f
          WHERE f.kind = 'balance_drift' AND f.subject = u.account AND f.resolved_at IS NULL) NULLS FIRST, u.account
LIMIT %(n)s
"""
# Which of them have a row now (admission created it meanwhile): those are "moving", checked as
# ordinary accounts from then on.
KNOWN_NOW_SQL = "SELECT address FROM paygate.accounts WHERE address = ANY(%s)"
# What the contract must hold in USDC: every cached balance, every admitted or settled charge (the
# contract keeps charged funds), every deposit that landed and is not settled (credited on chain or
# not, the USDC is in the contract and not in any cached balance). And the deposits still in
# flight, which may have landed a moment ago.
#
# The settled charges are the one large sum (every charge ever settled), so it is read once per tick;
# the "moving" check compares only the parts that any change to it also changes (a settle moves an
# amount out of the authorized sum; an admission changes the cached sum).
TOTAL_MOVING_SQL = """
SELECT (SELECT coalesce(sum(cached_balance), 0) FROM paygate.accounts),
       (SELECT coalesce(sum(amount), 0) FROM paygate.charges WHERE status = 'authorized'),
       (SELECT coalesce(sum(p.amount), 0) FROM paygate.deposits p
        LEFT JOIN paygate.lineages l ON l.id = p.deposit_lineage_id
        WHERE p.status IN ('pending', 'needs_human') AND (p.deposit_tx IS NOT NULL OR l.state = 'applied')),
       (SELECT coalesce(array_agg(p.amount::text ORDER BY p.id), '{}') FROM paygate.deposits p
        JOIN paygate.lineages l ON l.id = p.deposit_lineage_id
        WHERE p.status = 'pending' AND p.deposit_tx IS NULL AND l.state IN ('signed', 'sent'))
"""
# Settled charges are USDC the contract holds, archived or not: the retention worker adds what it
# archives to retention_totals in the statement that moves it (one snapshot reads both).
SETTLED_CHARGES_SQL = """
SELECT (SELECT coalesce(sum(amount), 0) FROM paygate.charges WHERE status = 'settled')
       + coalesce((SELECT settled_charges_amount FROM paygate.retention_totals), 0)
"""
# Each snapshot is one consistent view: under READ COMMITTED every statement sees a newer one, so a
# deposit settled between reading the cached balance and reading which deposits are settled looked
# like unexplained drift (a false exit 3 the chaos soak caught).
SNAPSHOT_SQL = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
# Plain sums over large tables: JIT compilation costs seconds here and saves nothing.
NO_JIT_SQL = "SET LOCAL jit = off"
# The journal's last consumed sequence is the engine's own rule (a sequence an operator accepted
# after a lane fence counts), so a lane the engine would use is never reported as a gap here.
LANES_SQL = ("SELECT l.address, " + lineages.last_consumed_seq_sql("l.address") + """,
       (SELECT x.source_seq FROM paygate.lineages x WHERE x.lane = l.address AND x.state IN ('signed', 'sent'))
FROM paygate.lanes l WHERE l.address = ANY(%s) ORDER BY l.address
""")
# Lanes share the read budget with accounts (at most half of it); with more lanes than that, a
# random sample each tick covers them all over a few ticks without keeping state per lane.
PICK_LANES_SQL = "SELECT address FROM paygate.lanes WHERE status <> 'retired' ORDER BY random() LIMIT %s"
SOURCE_SQL = "SELECT address FROM paygate.lanes ORDER BY address LIMIT 1"
SETTLED_DEPOSITS_SQL = """
SELECT encode(deposit_tx, 'hex') FROM paygate.deposits WHERE deposit_tx = ANY(%s) AND status = 'settled'
"""
RECORD_CHECKS_SQL = """
INSERT INTO paygate.account_checks (address, checked_at, chain_ledger, chain_balance, cached_balance, in_flight,
                                    lagging, regime, drift)
SELECT address, now(), ledger, chain, cached, in_flight, lagging, regime, drift
FROM unnest(%(address)s::text[], %(ledger)s::integer[], %(chain)s::numeric[], %(cached)s::numeric[],
            %(in_flight)s::numeric[], %(lagging)s::numeric[], %(regime)s::text[], %(drift)s::numeric[])
     AS c(address, ledger, chain, cached, in_flight, lagging, regime, drift)
ON CONFLICT (address) DO UPDATE
SET checked_at = now(), chain_ledger = EXCLUDED.chain_ledger, chain_balance = EXCLUDED.chain_balance,
    cached_balance = EXCLUDED.cached_balance, in_flight = EXCLUDED.in_flight, lagging = EXCLUDED.lagging,
    regime = EXCLUDED.regime, drift = EXCLUDED.drift
"""

MAX_EVENT_PAGES = 20


def subset_sums(amounts: list[int], cap: int = 4096) -> set[int]:
    """Every sum of a subset of `amounts` (deposits that may have landed), bounded in size."""
    sums = {0}
    for amount in amounts:
        sums |= {s + amount for s in sums}
        if len(sums) > cap:
            break
    return sums


@dataclass
class Events:
    """Billing events past the observer's cursor, per account, with how far the read is complete."""

    by_account: dict[str, list[Any]]
    complete_to: int | None  # events are known through this ledger (None: not known at all)
    waiting: str | None = None  # the read nodes are behind the observer's cursor: nothing can be concluded


def _events_past_cursor(conn: psycopg.Connection, chain: ChainClient, settings: Any, cursor: str | None,
                        accounts: set[str], log: Any) -> Events:
    from paygate_cli.chain.charges import (
        ReadersBehind,
        RetentionGap,
        UndecodableEvent,
        decode_billing_event,
        get_events,
    )

    start = None
    if cursor is None:
        start = settings.observer_start_ledger
        if not start:
            return Events({}, None)  # no observer position yet: lagging cannot be told apart
    found: dict[str, list[Any]] = defaultdict(list)
    complete_to: int | None = None
    try:
        for _ in range(MAX_EVENT_PAGES):
            page = get_events(chain, settings.billing_contract, cursor=cursor, start_ledger=start, limit=1000)
            for raw in page.events:
                try:
                    event = decode_billing_event(raw)
                except UndecodableEvent:
                    continue  # the observer quarantines it; it moves no cached balance
                if event.account in accounts:
                    found[event.account].append((raw.ledger, event))
            cursor, start = page.cursor, None
            if len(page.events) < 1000:
                complete_to = page.latest_ledger
                break
            complete_to = page.events[-1].ledger - 1
    except RetentionGap as exc:
        log.warning("reconciler: cannot read the events past the observer's cursor (%s)", exc,
                    extra={"msgid": "reconciler.retention_gap"})
        return Events({}, None)
    except ReadersBehind as exc:
        # A lagging reader loses nothing (the observer waits in the same state): this tick concludes
        # nothing about lagging events, so every account counts as moving, and the tick is not a failure.
        log.warning("reconciler waiting: %s", exc, extra={"msgid": exc.msgid})
        return Events({}, None, waiting=str(exc))
    return Events(found, complete_to)


@dataclass
class Picked:
    """What this tick checks: lanes (at most half the read budget), then accounts."""

    lanes: list[str]
    lanes_before: list[tuple]  # LANES_SQL rows read when picking
    source: str | None  # the account simulations run as (any lane; None: the fee account)
    accounts: list[str]
    unknown: dict[str, list[str]] = field(default_factory=dict)  # not in paygate.accounts -> events naming it


@dataclass
class DatabaseSide:
    """Snapshot 1: the database side of every pick, before the chain is read."""

    accounts: dict[str, tuple[int, int]]  # address -> (cached balance, in flight)
    cursor: str | None  # the observer's
    total: tuple  # TOTAL_MOVING_SQL
    settled_charges: int


@dataclass
class ChainSide:
    balances: dict[str, tuple[int, int | None]]  # address -> (balance, ledger read at; None: unreadable)
    unreadable: dict[str, str]  # address -> why its balance could not be read
    unknown: dict[str, tuple[int, int | None]]  # the same for the accounts paygate has no row for
    usdc: tuple[int, int]  # what the billing contract holds, and the ledger
    lane_seqs: dict[str, int]
    events: Events


@dataclass
class DatabaseAfter:
    """Snapshot 2: the same reads after the chain; what changed meanwhile is "moving", not drift."""

    accounts: dict[str, tuple[int, int]]
    total: tuple
    lanes: list[tuple]
    settled_deposits: set[str]  # hex hashes of the credits past the cursor already settled
    known_now: set[str]  # of the picked unknown accounts, those with a row by now


@dataclass
class Outcome:
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    checks: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))  # RECORD_CHECKS_SQL columns
    findings: list[Finding] = field(default_factory=list)
    clear: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # kind -> subjects now fine


def tick(ctx: TickContext) -> TickResult:
    if ctx.draining:
        return TickResult(details={"draining": True})
    settings = ctx.settings
    conn = ctx.conn
    picked = _pick(conn, budget=max(1, int(ctx.batch)))
    if not picked.accounts and not picked.lanes_before and not picked.unknown:
        return TickResult(details={"accounts": 0})
    if not settings.billing_contract or not settings.usdc_contract:
        from paygate_cli.errors import ConfigError

        raise ConfigError("the reconciler needs PAYGATE_BILLING_CONTRACT and PAYGATE_USDC_CONTRACT")

    before = _snapshot_before(conn, picked.accounts)
    chain = _read_chain(ctx, picked, before)
    after = _snapshot_after(conn, picked.lanes, list(before.accounts), chain.events, list(picked.unknown))

    outcome = Outcome()
    _check_accounts(outcome, before, chain, after)
    _check_unknown_accounts(outcome, picked.unknown, chain, after)
    total = _check_total(before.total, after.total, before.settled_charges, chain.usdc, settings.billing_contract)
    outcome.counts[f"total_{total['regime']}"] += 1
    if total["regime"] == "unexplained":
        outcome.findings.append(Finding("total_drift", "contract", total["summary"], total))
    elif total["regime"] != "moving":
        outcome.clear["total_drift"].append("contract")
    for lane in _check_lanes(picked.lanes_before, after.lanes, chain.lane_seqs):
        outcome.counts[f"lane_{lane['regime']}"] += 1
        if lane["regime"] == "gap":
            outcome.findings.append(Finding("lane_gap", lane["lane"], lane["summary"], lane))
        elif lane["regime"] in ("match", "in_flight", "unused"):
            outcome.clear["lane_gap"].append(lane["lane"])

    written, cleared = _record(conn, outcome, ctx.log)
    new = sum(1 for row in written if row[4])
    checked = len(outcome.checks.get("address", []))
    details = {**outcome.counts, "accounts": checked, "findings_new": new,
               "findings_open_seen": len(written) - new, "findings_cleared": cleared, "total": total}
    if chain.events.waiting is not None:
        details["waiting"] = chain.events.waiting
    return TickResult(processed=checked, needs_human=new, details=details)


def _pick(conn: psycopg.Connection, *, budget: int) -> Picked:
    lanes = [lane for (lane,) in conn.execute(PICK_LANES_SQL, (budget // 2,))]
    lanes_before = conn.execute(LANES_SQL, (lanes,)).fetchall()
    source_row = conn.execute(SOURCE_SQL).fetchone()
    account_budget = max(0, budget - 1 - len(lanes_before))
    # Accounts paygate has no row for take at most half of the accounts' reads (at least one), first:
    # there are none in steady state, and known accounts must not crowd them out.
    unknown = {a: list(events) for a, events in conn.execute(UNKNOWN_ACCOUNTS_SQL, {
        "n": max(1, account_budget // 2) if account_budget else 0})}
    account_budget -= len(unknown)
    accounts = [a for (a,) in conn.execute(PICK_ACCOUNTS_SQL, {"n": account_budget})] if account_budget > 0 else []
    return Picked(lanes, lanes_before, source_row[0] if source_row is not None else None, accounts, unknown)


def _snapshot_before(conn: psycopg.Connection, accounts: list[str]) -> DatabaseSide:
    """The database side, in one short transaction."""
    with conn.transaction():
        conn.execute(SNAPSHOT_SQL)
        conn.execute(NO_JIT_SQL)
        before = {a: (int(c), int(f)) for a, c, f in conn.execute(ACCOUNTS_SQL, (accounts,))}
        cursor_row = conn.execute(CURSOR_SQL).fetchone()
        total = conn.execute(TOTAL_MOVING_SQL).fetchone()
        settled_charges = int(conn.execute(SETTLED_CHARGES_SQL).fetchone()[0])
    return DatabaseSide(before, cursor_row[0] if cursor_row else None, total, settled_charges)


def _read_chain(ctx: TickContext, picked: Picked, before: DatabaseSide) -> ChainSide:
    """Every chain read of the tick, with no database transaction open."""
    from paygate_cli.chain.balances import billing_balance_at, token_balance_at
    from paygate_cli.chain.contracts import SimulationFailed
    from paygate_cli.chain.rpc import ChainClient

    settings = ctx.settings
    chain = ChainClient(settings, guard_conn=ctx.conn)
    try:
        if picked.source is not None:
            source = picked.source
        else:
            from paygate_cli.chain.keys import fee_account_address

            source = fee_account_address(settings)
        balances: dict[str, tuple[int, int | None]] = {}
        unreadable: dict[str, str] = {}
        unknown: dict[str, tuple[int, int | None]] = {}
        for account in [*before.accounts, *picked.unknown]:
            into = balances if account in before.accounts else unknown
            try:
                into[account] = billing_balance_at(chain, billing=settings.billing_contract, account=account,
                                                   source=source)
            except (ValueError, SimulationFailed) as exc:
                # Poison data (an address the chain cannot parse) or a contract that refuses the read:
                # a finding for that account, never a crash of the whole tick.
                unreadable[account] = f"{type(exc).__name__}: {exc}"[:300]
                into[account] = (0, None)
        usdc = token_balance_at(chain, token=settings.usdc_contract, holder=settings.billing_contract, source=source)
        lane_seqs = {lane: chain.account_sequence(lane) for lane, _, _ in picked.lanes_before}
        events = _events_past_cursor(ctx.conn, chain, settings, before.cursor, set(before.accounts), ctx.log)
    finally:
        chain.close()
    return ChainSide(balances, unreadable, unknown, usdc, lane_seqs, events)


def _snapshot_after(conn: psycopg.Connection, lanes: list[str], accounts: list[str], events: Events,
                    unknown: list[str]) -> DatabaseAfter:
    with conn.transaction():
        conn.execute(SNAPSHOT_SQL)
        conn.execute(NO_JIT_SQL)
        after = {a: (int(c), int(f)) for a, c, f in conn.execute(ACCOUNTS_SQL, (accounts,))}
        total = conn.execute(TOTAL_MOVING_SQL).fetchone()
        lanes_after = conn.execute(LANES_SQL, (lanes,)).fetchall()
        credit_refs = [e.ref for evs in events.by_account.values() for _, e in evs if e.kind == "credit"]
        settled = {h for (h,) in conn.execute(SETTLED_DEPOSITS_SQL, (credit_refs,))} if credit_refs else set()
        known_now = {a for (a,) in conn.execute(KNOWN_NOW_SQL, (unknown,))} if unknown else set()
    return DatabaseAfter(after, total, lanes_after, settled, known_now)


def _check_accounts(outcome: Outcome, before: DatabaseSide, chain: ChainSide, after: DatabaseAfter) -> None:
    """Each account's chain balance against its cached one: a check row, and a finding or a clear."""
    counts, checks, findings, clear = outcome.counts, outcome.checks, outcome.findings, outcome.clear
    events = chain.events
    for account, (cached, in_flight) in before.accounts.items():
        chain_balance, ledger = chain.balances[account]
        if account in chain.unreadable:
            counts["unreadable"] += 1
            findings.append(Finding("balance_drift", account,
                                    f"cannot read its chain balance: {chain.unreadable[account]}",
                                    {"cached_balance": str(cached), "error": chain.unreadable[account]}))
            for key, value in (("address", account), ("ledger", None), ("chain", 0), ("cached", cached),
                               ("in_flight", in_flight), ("lagging", 0), ("regime", "unexplained"),
                               ("drift", -cached)):
                checks[key].append(value)
            continue
        assert ledger is not None
        if after.accounts.get(account) != (cached, in_flight) or events.waiting is not None \
                or (events.complete_to is None and before.cursor is not None) \
                or (events.complete_to is not None and ledger > events.complete_to):
            counts["moving"] += 1
            continue
        lagging, saw = lagging_effect(((at, event.kind, event.amount, event.ref.hex())
                                       for at, event in events.by_account.get(account, [])),
                                      ledger, after.settled_deposits)
        drift = chain_balance - cached
        regime = classify(drift, in_flight, lagging, saw)
        counts[regime] += 1
        for key, value in (("address", account), ("ledger", ledger), ("chain", chain_balance), ("cached", cached),
                           ("in_flight", in_flight), ("lagging", lagging), ("regime", regime), ("drift", drift)):
            checks[key].append(value)
        if regime == "unexplained":
            findings.append(Finding("balance_drift", account, (
                f"chain balance {chain_balance} - cached {cached} = {drift}; in flight {in_flight}, lagging "
                f"{lagging}: {drift - in_flight - lagging} unexplained"), {
                "chain_balance": str(chain_balance), "cached_balance": str(cached), "drift": str(drift),
                "in_flight": str(in_flight), "lagging": str(lagging), "ledger": ledger}))
        else:
            clear["balance_drift"].append(account)


def _check_unknown_accounts(outcome: Outcome, unknown: dict[str, list[str]], chain: ChainSide,
                            after: DatabaseAfter) -> None:
    """Accounts the chain was seen to move that paygate.accounts does not have: a finding per account
    while its chain balance is not zero (there is no check row: account_checks holds accounts paygate
    has), cleared once it is zero; one that got a row meanwhile is moving (checked as an account next)."""
    for account, events in unknown.items():
        if account in after.known_now:
            outcome.counts["moving"] += 1
            continue
        outcome.counts["unknown_accounts"] += 1
        chain_balance, ledger = chain.unknown[account]
        details: dict[str, Any] = {"known_to_paygate": False, "events": events, "cached_balance": None,
                                   "in_flight": "0", "lagging": "0", "regime": "unexplained"}
        if account in chain.unreadable:
            outcome.counts["unreadable"] += 1
            outcome.findings.append(Finding("balance_drift", account, (
                f"account {account} is not in paygate.accounts (named by quarantined billing event {events[0]}) "
                f"and its chain balance cannot be read: {chain.unreadable[account]}"),
                {**details, "error": chain.unreadable[account]}))
            continue
        if chain_balance == 0:
            outcome.counts["match"] += 1
            outcome.clear["balance_drift"].append(account)
            continue
        outcome.counts["unexplained"] += 1
        outcome.findings.append(Finding("balance_drift", account, (
            f"account {account} is not in paygate.accounts but holds {chain_balance} on chain (ledger {ledger}), "
            f"moved by billing event(s) paygate quarantined ({', '.join(events)}): nothing paygate has in flight "
            f"explains it: {chain_balance} unexplained"), {
            **details, "chain_balance": str(chain_balance), "drift": str(chain_balance), "ledger": ledger}))


def _record(conn: psycopg.Connection, outcome: Outcome, log: Any) -> tuple[list[Any], int]:
    """The check rows, new findings and cleared ones, in one transaction: (findings written, cleared)."""
    with conn.transaction():
        if outcome.checks:
            conn.execute(RECORD_CHECKS_SQL, dict(outcome.checks))
        written = record_findings(conn, outcome.findings, log)
        cleared = sum(clear_findings(conn, kind, subjects, "reconciler", log)
                      for kind, subjects in outcome.clear.items())
    return written, cleared


def _check_total(before: tuple, after: tuple, settled_charges: int, usdc: tuple[int, int],
                 contract: str) -> dict[str, Any]:
    if tuple(before) != tuple(after):
        return {"regime": "moving"}
    cached, authorized, landed, in_flight_deposits = before
    charged = int(authorized) + settled_charges
    held, ledger = usdc
    expected = int(cached) + int(charged) + int(landed)
    drift = held - expected
    if drift == 0:
        regime = "match"
    elif drift in subset_sums([int(a) for a in in_flight_deposits]):
        regime = "in_flight"  # deposits sent and landed, not yet resolved by funding
    else:
        regime = "unexplained"
    return {"regime": regime, "contract": contract, "usdc_held": str(held), "ledger": ledger,
            "expected": str(expected), "drift": str(drift), "cached_total": str(cached),
            "charged_total": str(charged), "landed_deposits": str(landed),
            "summary": f"the billing contract holds {held} USDC; the database accounts for {expected} "
                       f"(cached {cached} + charged {charged} + landed deposits {landed}): drift {drift}"}


def _check_lanes(before: list[tuple], after: list[tuple], chain_seqs: dict[str, int]) -> list[dict[str, Any]]:
    unchanged = {row[0]: row for row in after}
    report = []
    for row in before:
        lane, journal, live = row
        chain_seq = chain_seqs[lane]
        base = {"lane": lane, "chain_seq": chain_seq, "journal_last_consumed_seq": journal, "live_seq": live}
        if unchanged.get(lane) != row:
            report.append({**base, "regime": "moving"})
        elif journal is None:
            report.append({**base, "regime": "unused"})
        elif chain_seq == journal:
            report.append({**base, "regime": "match"})
        elif live is not None and chain_seq == live:
            report.append({**base, "regime": "in_flight"})  # our in-flight lineage just landed
        elif chain_seq < journal:
            report.append({**base, "regime": "lagging"})  # the read endpoint is behind the journal
        else:
            report.append({**base, "regime": "gap", "summary": (
                f"lane {lane}: chain sequence {chain_seq} is ahead of the journal's last consumed {journal} "
                f"(in flight: {live}): a transaction this gateway never journaled used the lane")})
    return report
