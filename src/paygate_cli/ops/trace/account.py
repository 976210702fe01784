"""An account traced: settled deposits − charges (archived ones included) and its cached balance
against its balance in the billing contract, with the units that explain a difference."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paygate_cli.chain.drift import classify, lagging_effect
from paygate_cli.errors import UsageError

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.rpc import ChainClient

from paygate_cli.ops.trace.parts import (
    ACCOUNT_SQL,
    CURSOR_SQL,
    EVENT_PAGES,
    FINDINGS_SQL,
    SOURCE_SQL,
    TIMELINE_LIMIT,
    Chain,
    all_rows,
    balance_entry,
    balance_event,
    event_at,
    finish,
    hexed,
    now_utc,
    one_row,
    snapshot,
)

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
        snapshot(conn)
        account = one_row(conn, ACCOUNT_SQL, (address,))
        if account is None:
            raise UsageError(f"no account {address} known to paygate", msgid="usage.unknown_account")
        sums = conn.execute(ACCOUNT_SUMS_SQL, {"a": address}).fetchone()
        open_units = conn.execute(ACCOUNT_OPEN_SQL, {"a": address}).fetchall()
        history = all_rows(conn, ACCOUNT_HISTORY_SQL, {"a": address, "n": TIMELINE_LIMIT})
        check = one_row(conn, ACCOUNT_CHECK_SQL, (address,))
        settled_txs = {h for (h,) in conn.execute(SETTLED_TX_SQL, (address,))}
        findings = all_rows(conn, FINDINGS_SQL, ([address],))
        cursor = conn.execute(CURSOR_SQL).fetchone()
        source = (conn.execute(SOURCE_SQL).fetchone() or [None])[0]
    deposits, n_deposits, settled, authorized, held, n_settled, n_archived, archived_amount = (int(x) for x in sums)
    cached = int(account["cached_balance"])
    timeline.append(event_at(account["created_at"], "db", "account", account=address, cached_balance=cached))
    for unit in sorted(history, key=lambda h: (h["created_at"], h["unit"], h["id"])):
        timeline.append(event_at(unit["created_at"], "db", f"{unit['unit']}.admitted", id=unit["id"],
                                 amount=unit["amount"], status=unit["status"],
                                 archived=True if unit["archived"] else None))
        if unit["finished_at"] is not None:
            timeline.append(event_at(unit["finished_at"], "db", f"{unit['unit']}.{unit['status']}", id=unit["id"],
                                     amount=unit["amount"]))
    if check is not None:
        timeline.append(event_at(check["checked_at"], "db", "reconciler.check", check["chain_ledger"],
                                 regime=check["regime"], chain_balance=check["chain_balance"],
                                 cached_balance=check["cached_balance"], drift=check["drift"]))
    for finding in findings:
        timeline.append(event_at(finding["first_seen"], "db", "finding", finding_id=finding["id"],
                                 finding=finding["kind"], summary=finding["summary"],
                                 resolved_at=finding["resolved_at"]))
    balance = balance_entry(chain, source, address)
    balance_event(timeline, address, balance)
    past = _events_past_cursor(chain, cursor[0] if cursor else None, address)
    for event in past or []:
        timeline.append(event_at(now_utc(), "chain", f"event.{event['kind']}", event["ledger"],
                                 event_id=event["event_id"], amount=event["amount"], past_observer_cursor=True))

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
                           "lineage": lineage_id, "lineage_state": lineage_state, "deposit_tx": hexed(deposit_tx)})
    drift = None
    if balance is None:
        regimes.append(("unreadable", "the account's balance in the billing contract could not be read"))
    else:
        chain_balance = balance[0]
        drift = chain_balance - cached
        # As the reconciler counts them (chain/drift.py): charges the chain took and credits it gave
        # that the observer has not applied yet, up to the ledger the balance was read at.
        lagging, saw = lagging_effect(((e["ledger"], e["kind"], e["amount"], e["ref"]) for e in past or []),
                                      balance[1], settled_txs)
        residual = drift - authorized - lagging
        # Credits under way that the events past the cursor do not already count.
        counted = {e["ref"] for e in past or [] if e["kind"] == "credit" and e["ledger"] <= balance[1]}
        credits = [u for u in explaining if u["unit"] == "deposit" and u["deposit_tx"] not in counted
                   and u["lineage_state"] in ("applied", "signed", "sent")]
        picked = _subset_explains(residual, [u["amount"] for u in credits]) if residual > 0 else None
        if residual == 0:
            regime = classify(drift, authorized, lagging, saw)
            regimes.append((regime, f"chain {chain_balance} − cached {cached} = {drift}: in flight {authorized}, "
                                    f"lagging {lagging}"))
        elif picked is not None:
            ids = [credits[n]["id"] for n in picked]
            regimes.append(("in_flight", f"chain {chain_balance} − cached {cached} = {drift}: in flight {authorized}, "
                                         f"lagging {lagging}, and the credits of deposits {ids} under way"))
        else:
            why = ""
            if held and residual == held:
                why = f"; the charges a human holds ({held}) are debited here and not on chain"
            elif past is None and not chain.errors:
                why = "; the observer has no position, so events past it were not read"
            regimes.append(("unexplained", f"chain {chain_balance} − cached {cached} = {drift}; in flight "
                                           f"{authorized}, lagging {lagging}: {residual} unexplained{why}"))
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
    return finish({"kind": "account", "id": address}, document, timeline, regimes, where, chain)
