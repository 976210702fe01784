"""The units of money traced by id (a deposit, a charge, a relay, a bot job) and the transaction
traced by hash, each: its database rows, its chain side, where its money is and its regime."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paygate_cli.errors import UsageError

if TYPE_CHECKING:
    import psycopg


from paygate_cli.ops.trace.parts import (
    ACCOUNT_SQL,
    CHAIN_EVENTS_SQL,
    CURSOR_SQL,
    SOURCE_SQL,
    Chain,
    all_rows,
    balance_entry,
    balance_event,
    billing_events_at,
    event_at,
    finish,
    hexed,
    load_lineages,
    now_utc,
    one_row,
    open_findings,
    receipt_fee,
    snapshot,
    surroundings,
    trace_lineages,
)

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

# -- deposit ----------------------------------------------------------------------------------------

def _deposit_db(conn: psycopg.Connection, deposit_id: int) -> dict[str, Any]:
    row = one_row(conn, DEPOSIT_SQL, (deposit_id,))
    if row is None:
        raise UsageError(f"no deposit {deposit_id}", msgid="usage.unknown_unit")
    items = load_lineages(conn, ids=[], entitlements=[f"deposit:{deposit_id}:deposit", f"deposit:{deposit_id}:credit"])
    account = one_row(conn, ACCOUNT_SQL, (row["account"],))
    events = all_rows(conn, CHAIN_EVENTS_SQL, {"targets": [f"deposit:{deposit_id}"], "ids": []})
    return {"row": row, "lineages": items, "account": account, "chain_events": events}


def trace_deposit(conn: psycopg.Connection, chain: Chain, deposit_id: int) -> dict[str, Any]:
    timeline: list[dict[str, Any]] = []
    with conn.transaction():
        snapshot(conn)
        db = _deposit_db(conn, deposit_id)
        around = surroundings(conn, timeline, payload_key="deposit_id", unit_id=deposit_id,
                              targets=[f"deposit:{deposit_id}", f"deposits:{deposit_id}"],
                              subjects=[f"deposit:{deposit_id}",
                                        *(f"lineage:{i['lineage'].id}" for i in db["lineages"])],
                              idempotency=("deposit", db["row"]["idempotency_key"]))
        source = (conn.execute(SOURCE_SQL).fetchone() or [None])[0]
    row = db["row"]
    timeline.append(event_at(row["created_at"], "db", "admitted", deposit=deposit_id, account=row["account"],
                             amount=row["amount"], idempotency_key=row["idempotency_key"], nonce=row["auth_nonce"],
                             expiration_ledger=row["auth_expiration_ledger"]))
    if row["lease_token"] is not None or row["attempts"]:
        timeline.append(event_at(row["updated_at"], "db", "lease", claimed_by=row["claimed_by"],
                                 lease_token=row["lease_token"], lease_expires_at=row["lease_expires_at"],
                                 attempts=row["attempts"]))
    if row["status"] != "pending":
        timeline.append(event_at(row["settled_at"] or row["updated_at"], "db", f"deposit.{row['status']}",
                                 settled_by=row["settled_by"], reason=row["reason"],
                                 deposit_tx=hexed(row["deposit_tx"])))
    for event in db["chain_events"]:
        timeline.append(event_at(event["observed_at"], "db", "observed", event["ledger"], event_id=event["event_id"],
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
        timeline.append(event_at(now_utc(), "chain", "nonce", nonce[1], nonce=row["auth_nonce"],
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
                timeline.append(event_at(now_utc(), "chain", "event.credit", credit_event["ledger"],
                                         event_id=credit_event["event_id"], account=credit_event["account"],
                                         amount=credit_event["amount"]))
            else:
                regimes.append(("unexplained", f"no credit event for deposit_tx {hexed(deposit_tx)} in ledger "
                                               f"{applied_credit.ledger}, where the journal says the credit applied"))
    balance = balance_entry(chain, source, row["account"])
    balance_event(timeline, row["account"], balance)

    deposit_lins = [i["lineage"] for i in db["lineages"] if i["lineage"].purpose == "deposit"]
    ours = any(lin.state == "applied" or lin.live for lin in deposit_lins)
    status = row["status"]
    if status == "needs_human":
        regimes.append(("unexplained", f"the deposit needs a human: {row['reason']}"))
        where = "unknown: a human must find the transaction that spent the authorisation"
    elif status == "settled":
        latest = nonce[1] if nonce is not None else None
        if consumed is False and latest is not None and latest <= int(row["auth_expiration_ledger"]):
            # A nonce entry is temporary: it lives until the authorisation's expiration ledger, so
            # before that a settled deposit's nonce must be found consumed.
            regimes.append(("unexplained", f"settled, but nonce {row['auth_nonce']} is not consumed on chain "
                                           f"(ledger {latest}, the authorisation valid until "
                                           f"{row['auth_expiration_ledger']})"))
        else:
            regimes.append(("match", "settled"))
        where = f"in the billing contract, credited to {row['account']}"
    elif status == "pending":
        # The chain's word counts too: a transfer it included before funding recorded the receipt.
        landed = any(lin["purpose"] == "deposit" and "applied" in (lin["state"], (lin["chain"] or {}).get("decision"))
                     for lin in shown)
        where = (f"in the billing contract, not yet credited to {row['account']}" if landed
                 else f"with the user ({row['account']}): the transfer has not landed")
        if consumed and not ours:
            regimes.append(("unexplained", f"nonce {row['auth_nonce']} is consumed on chain and no lineage of ours "
                                           "holds a transaction for it"))
            where = "unknown: a transaction paygate never journaled spent the authorisation"
        elif not db["lineages"]:
            regimes.append(("in_flight", "admitted; funding has not claimed it yet"))
        else:
            regimes.append(("in_flight", "funding is moving it"))
    else:  # expired, failed
        if consumed and not any(lin.state == "applied" for lin in deposit_lins):
            regimes.append(("unexplained", f"the deposit is {status}, but its authorisation nonce is consumed on "
                                           "chain by a transaction paygate never journaled"))
        else:
            regimes.append(("match", f"{status}: {row['reason']}"))
        where = f"with the user ({row['account']}): the deposit {status}, nothing was credited"
    regimes += open_findings(around)
    document = {"deposit": {k: v for k, v in row.items() if k not in ("deposit_tx",)} | {
        "deposit_tx": hexed(deposit_tx)}, "lineages": shown,
        "authorisation": {"nonce": row["auth_nonce"], "expiration_ledger": row["auth_expiration_ledger"],
                          "consumed_on_chain": consumed, "latest_ledger": nonce[1] if nonce else None},
        "credit_event": credit_event,
        "balance": {"account": row["account"], "cached": db["account"]["cached_balance"] if db["account"] else None,
                    "chain": balance[0] if balance else None, "ledger": balance[1] if balance else None},
        "chain_events": db["chain_events"]} | around
    return finish({"kind": "deposit", "id": deposit_id}, document, timeline, regimes, where, chain)


# -- charge -----------------------------------------------------------------------------------------

def trace_charge(conn: psycopg.Connection, chain: Chain, charge_id: int) -> dict[str, Any]:
    timeline: list[dict[str, Any]] = []
    with conn.transaction():
        snapshot(conn)
        row = one_row(conn, CHARGE_SQL, {"id": charge_id})
        if row is None:
            raise UsageError(f"no charge {charge_id}", msgid="usage.unknown_unit")
        ids = sorted({*(row["dead_lineages"] or []), *([row["lineage_id"]] if row["lineage_id"] else [])})
        items = load_lineages(conn, ids=ids, entitlements=[])
        batches = all_rows(conn, BATCHES_SQL, {"ids": ids})
        events = all_rows(conn, CHAIN_EVENTS_SQL, {"targets": [f"charge:{charge_id}"],
                                                "ids": [row["event_id"]] if row["event_id"] else []})
        around = surroundings(conn, timeline, payload_key="charge_row_id", unit_id=charge_id,
                              targets=[f"charge:{charge_id}", f"charges:{charge_id}"],
                              subjects=[f"charge:{charge_id}", *(f"lineage:{i}" for i in ids),
                                        *(f"charge_batch:{i}" for i in ids)],
                              idempotency=("charge", row["idempotency_key"]))
        cursor = conn.execute(CURSOR_SQL).fetchone()
        source = (conn.execute(SOURCE_SQL).fetchone() or [None])[0]
        account = one_row(conn, ACCOUNT_SQL, (row["account"],))
    charge_hex = hexed(row["charge_id"])
    timeline.append(event_at(row["created_at"], "db", "admitted", charge=charge_id, charge_id=charge_hex,
                             account=row["account"], amount=row["amount"], idempotency_key=row["idempotency_key"],
                             subscription_id=row["subscription_id"], period_start=row["period_start"]))
    if row["claimed_at"] is not None:
        timeline.append(event_at(row["claimed_at"], "db", "claimed", claimed_by=row["claimed_by"],
                                 lineage=row["lineage_id"], attempts=row["attempts"]))
    for batch in batches:
        timeline.append(event_at(batch["created_at"], "db", "batch", lineage=batch["lineage_id"],
                                 entries=batch["entries"], claimed_by=batch["claimed_by"],
                                 lease_token=batch["lease_token"],
                                 lease_expires_at=batch["lease_expires_at"], outcome=batch["outcome"],
                                 closed_at=batch["closed_at"], archived=True if batch["archived_at"] else None))
    for event in events:
        timeline.append(event_at(event["observed_at"], "db", "observed", event["ledger"], event_id=event["event_id"],
                                 event=event["kind"], effect=event["effect"]))
    if row["status"] != "authorized":
        timeline.append(event_at(row["settled_at"] or row["failed_at"] or row["updated_at"], "db",
                                 f"charge.{row['status']}", row["settled_ledger"], failed_by=row["failed_by"],
                                 reason=row["reason"], event_id=row["event_id"]))
    if row["archived_at"] is not None:
        timeline.append(event_at(row["archived_at"], "db", "charge.archived", charge=charge_id))
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
                timeline.append(event_at(now_utc(), "chain", f"event.{found[0]['kind']}", found[0]["ledger"],
                                         event_id=found[0]["event_id"], amount=found[0]["amount"],
                                         reason=found[0]["reason"]))
    balance = balance_entry(chain, source, row["account"])
    balance_event(timeline, row["account"], balance)

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
    return finish({"kind": "charge", "id": charge_id}, document, timeline, regimes, where, chain)


# -- relay and bot job -------------------------------------------------------------------------------

def _queue_lease(timeline: list[dict[str, Any]], row: dict[str, Any]) -> None:
    if row["lease_token"] is not None or row["attempts"]:
        timeline.append(event_at(row["updated_at"], "db", "lease", claimed_by=row["claimed_by"],
                                 lease_token=row["lease_token"], lease_expires_at=row["lease_expires_at"],
                                 attempts=row["attempts"], lineage=row["lineage_id"]))
    if row["status"] != "queued":
        timeline.append(event_at(row["finished_at"] or row["updated_at"], "db", f"{row['_kind']}.{row['status']}",
                                 reason=row["reason"], fee_charged=row["fee_charged"], tx_hash=hexed(row["tx_hash"])))


def _fee_verdict(row: dict[str, Any], shown: list[dict[str, Any]], regimes: list[tuple[str, str]]) -> None:
    """An included relay or bot job: its recorded fee is what the chain charged."""
    current = next((s for s in shown if s["id"] == row["lineage_id"]), None)
    chain_fee = receipt_fee(current["chain"]) if current else None
    if chain_fee is not None and row["fee_charged"] is not None and int(row["fee_charged"]) != chain_fee:
        regimes.append(("unexplained", f"fee charged {row['fee_charged']} recorded, the chain charged {chain_fee}"))


def trace_relay(conn: psycopg.Connection, chain: Chain, relay_id: int) -> dict[str, Any]:
    timeline: list[dict[str, Any]] = []
    with conn.transaction():
        snapshot(conn)
        row = one_row(conn, RELAY_SQL, (relay_id,))
        if row is None:
            raise UsageError(f"no relay {relay_id}", msgid="usage.unknown_unit")
        row["_kind"] = "relay"
        items = load_lineages(conn, ids=[], entitlements=[f"relay:{relay_id}"])
        reservations = all_rows(conn, RESERVATIONS_SQL, (relay_id,))
        around = surroundings(conn, timeline, payload_key="relay_id", unit_id=relay_id,
                              targets=[f"relay:{relay_id}", f"relays:{relay_id}"],
                              subjects=[f"relay:{relay_id}", *(f"lineage:{i['lineage'].id}" for i in items)],
                              idempotency=("relay", row["idempotency_key"]))
    timeline.append(event_at(row["created_at"], "db", "admitted", relay=relay_id, account=row["account"],
                             contract=row["contract"], function=row["function"], max_fee=row["max_fee"],
                             idempotency_key=row["idempotency_key"], nonces=list(row["auth_nonces"]),
                             expiration_ledger=row["auth_expiration_ledger"]))
    for r in reservations:
        timeline.append(event_at(r["created_at"], "db", "fee.reserved", round=r["round"], amount=r["amount"]))
        if r["closed_at"] is not None:
            timeline.append(event_at(r["closed_at"], "db", f"fee.{r['status']}", round=r["round"],
                                     fee_charged=r["fee_charged"], lineage=r["lineage_id"], reason=r["reason"]))
    _queue_lease(timeline, row)
    regimes: list[tuple[str, str]] = []
    shown = trace_lineages(chain, items, timeline, regimes)
    from paygate_cli.chain.relay import nonces_consumed

    nonces = chain.read("the authorisation nonces",
                        lambda c: nonces_consumed(c, row["account"], [int(n) for n in row["auth_nonces"]]))
    if nonces is not None:
        timeline.append(event_at(now_utc(), "chain", "nonces", nonces[1], nonces=list(row["auth_nonces"]),
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
    document = {"relay": {k: v for k, v in row.items() if k != "_kind"} | {"tx_hash": hexed(row["tx_hash"])},
                "lineages": shown, "fee_reservations": reservations,
                "authorisation": {"nonces": list(row["auth_nonces"]),
                                  "consumed_on_chain": nonces[0] if nonces else None,
                                  "latest_ledger": nonces[1] if nonces else None}} | around
    return finish({"kind": "relay", "id": relay_id}, document, timeline, regimes, where, chain)


def trace_bot_job(conn: psycopg.Connection, chain: Chain, job_id: int) -> dict[str, Any]:
    timeline: list[dict[str, Any]] = []
    with conn.transaction():
        snapshot(conn)
        row = one_row(conn, BOT_JOB_SQL, (job_id,))
        if row is None:
            raise UsageError(f"no bot job {job_id}", msgid="usage.unknown_unit")
        row["_kind"] = "bot_job"
        items = load_lineages(conn, ids=[], entitlements=[f"bot_job:{job_id}"])
        around = surroundings(conn, timeline, payload_key="bot_job_id", unit_id=job_id,
                              targets=[f"bot_job:{job_id}", f"bot_jobs:{job_id}"],
                              subjects=[f"bot_job:{job_id}", *(f"lineage:{i['lineage'].id}" for i in items)])
    timeline.append(event_at(row["created_at"], "db", "admitted", bot_job=job_id, job_key=row["job_key"],
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
    document = {"bot_job": {k: v for k, v in row.items() if k != "_kind"} | {"tx_hash": hexed(row["tx_hash"])},
                "lineages": shown} | around
    return finish({"kind": "bot-job", "id": job_id}, document, timeline, regimes, where, chain)


# -- a transaction by hash ----------------------------------------------------------------------------

def units_of_hash(conn: psycopg.Connection, tx_hash: str) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    """The lineage a hash names and the units it pays for: [(kind, id)]; a charge batch pays for each
    of its charges; a TTL keeper's job is no unit of money (the lineage alone is traced)."""
    with conn.transaction():
        snapshot(conn)
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
        snapshot(conn)
        items = load_lineages(conn, ids=[lineage_id], entitlements=[])
    regimes: list[tuple[str, str]] = []
    shown = trace_lineages(chain, items, timeline, regimes)
    return finish({"kind": "lineage", "id": lineage_id}, {"lineages": shown}, timeline, regimes,
                   "no money of a customer: a transaction of paygate's own (its fee paid by the fee account)", chain)
