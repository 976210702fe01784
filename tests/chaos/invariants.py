"""The soak's invariants after quiescence, each read from the database AND the chain (through
SorobanServer, never through paygate). A check never asserts: it returns what it counted and the
violations it found, each with the rows and lineages involved, so a failing soak can print the
first violated invariant with its evidence and the whole table beside it."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import psycopg
from stellar_sdk import Address, FeeBumpTransactionEnvelope, TransactionBuilder, scval, xdr
from stellar_sdk.soroban_rpc import EventFilter, EventFilterType

from tests.support.chain_env import ChainEnv, billing_balance
from tests.support.relay_support import assert_relay_invariants
from tests.support.webhook_receiver import Receiver

TERMINAL = {
    "deposits": {"settled", "expired", "failed"},
    "charges": {"settled", "failed"},
    "relays": {"applied", "failed", "expired", "rejected"},
    "bot_jobs": {"applied", "failed", "dead"},
    "webhook_outbox": {"delivered"},
    "ttl_jobs": {"applied", "failed"},  # a failed extend is followed by a new job once due
}


@dataclass
class Violation:
    invariant: str
    detail: str


@dataclass
class Findings:
    counts: dict[str, Any] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)

    def fail(self, invariant: str, detail: str) -> None:
        self.violations.append(Violation(invariant, detail))


@dataclass
class LostCommits:
    """What the database no longer knows but the chain may: the journal and units of a database lost
    in a disaster, read from it before it was replaced (the drills, tests/chaos/dr.py). A transaction
    of a lost lineage is still ours on chain; a unit admitted after the backup is still a unit."""
    hashes: dict[str, dict[str, Any]] = field(default_factory=dict)  # tx hash -> its lineage (as _hash_map)
    deposits: list[dict[str, Any]] = field(default_factory=list)
    charge_ids: set[bytes] = field(default_factory=set)


def _native(value: Any) -> Any:
    if isinstance(value, Address):
        return value.address
    if isinstance(value, list):
        return [_native(v) for v in value]
    return value


def chain_events(chain: ChainEnv, contract: str) -> list[dict[str, Any]]:
    """Every event of `contract` from ledger 1 on: topics and value decoded, and the tx hash."""
    found = []
    with chain.server() as server:
        cursor = None
        while True:
            kwargs: dict[str, Any] = {"cursor": cursor} if cursor else {"start_ledger": 1}
            page = server.get_events(filters=[EventFilter(event_type=EventFilterType.CONTRACT,
                                                          contract_ids=[contract])], limit=1000, **kwargs)
            for event in page.events:
                found.append({"id": event.id, "topics": [_native(scval.to_native(t)) for t in event.topic],
                              "value": _native(scval.to_native(event.value)), "tx": event.transaction_hash.lower(),
                              "ledger": event.ledger})
            if not page.events:
                break
            cursor = page.cursor
    return found


def chain_transactions(chain: ChainEnv) -> list[dict[str, Any]]:
    """Every transaction the chain included, from ledger 1 on: its inner hash (the transaction itself
    for a plain one), the outer hash that carried it, ledger, status and feeCharged."""
    passphrase = chain.genesis["passphrase"]
    found = []
    with chain.server() as server:
        cursor = None
        while True:
            kwargs: dict[str, Any] = {"cursor": cursor} if cursor else {"start_ledger": 1}
            page = server.get_transactions(limit=200, **kwargs)
            for tx in page.transactions:
                envelope = TransactionBuilder.from_xdr(tx.envelope_xdr, passphrase)
                outer = envelope.hash_hex()
                inner = (envelope.transaction.inner_transaction_envelope.hash_hex()
                         if isinstance(envelope, FeeBumpTransactionEnvelope) else outer)
                found.append({"inner": inner, "outer": outer, "ledger": tx.ledger, "status": tx.status,
                              "fee_charged": int(xdr.TransactionResult.from_xdr(tx.result_xdr).fee_charged.int64)})
            if not page.transactions:
                break
            cursor = page.cursor
    return found


def _rows(conn: psycopg.Connection, sql: str, params: tuple | None = None) -> list[dict[str, Any]]:
    cursor = conn.execute(sql, params)
    names = [c.name for c in cursor.description]
    return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


def _lineages_of(conn: psycopg.Connection, entitlements: list[str]) -> str:
    rows = _rows(conn, "SELECT id, entitlement, lane, source_seq, state, resolution, ledger, "
                       "encode(inner_hash, 'hex') AS inner_hash, send_count, last_send_status "
                       "FROM paygate.lineages WHERE entitlement = ANY(%s) ORDER BY id", (entitlements,))
    return "\n".join(f"    lineage {r}" for r in rows) or "    (no lineages)"


def _hash_map(conn: psycopg.Connection) -> dict[str, dict[str, Any]]:
    """Every transaction hash of ours (inner and fee-bump outer, the outers a replacement replaced
    too: any of them may be the one that landed) -> its lineage."""
    found = {}
    for row in _rows(conn, "SELECT id, entitlement, state, encode(inner_hash, 'hex') AS inner, "
                           "encode(outer_hash, 'hex') AS outer, coalesce((SELECT array_agg(encode(e.outer_hash, "
                           "'hex')) FROM paygate.lineage_envelopes e WHERE e.lineage_id = l.id), '{}') AS replaced "
                           "FROM paygate.lineages l WHERE inner_hash IS NOT NULL"):
        for tx_hash in (row["inner"], row["outer"], *row.pop("replaced")):
            found[tx_hash] = row
    return found


# The units that may end asking a human (each with its reason): after a restore, not in the soak.
NEEDS_HUMAN_UNITS = ("deposits", "charges", "relays", "bot_jobs")


def check_terminal(conn: psycopg.Connection, out: Findings, *, needs_human_ok: bool = False,
                   tables: tuple[str, ...] = tuple(TERMINAL)) -> None:
    """Nothing stuck: every deposit, charge, relay, bot job and webhook event in a terminal state,
    no live lineage, no open charge batch or fee reservation. With `needs_human_ok` (a database
    restored behind the chain) a unit may instead ask a human, never without its reason."""
    for table in tables:
        terminal = TERMINAL[table] | ({"needs_human"} if needs_human_ok and table in NEEDS_HUMAN_UNITS else set())
        by_status = dict(conn.execute(f"SELECT status, count(*) FROM paygate.{table} GROUP BY status").fetchall())
        out.counts[table] = by_status
        if needs_human_ok and table in NEEDS_HUMAN_UNITS:
            silent = _rows(conn, f"SELECT * FROM paygate.{table} WHERE status = 'needs_human' "
                                 "AND coalesce(btrim(reason), '') = '' ORDER BY id LIMIT 5")
            if silent:
                out.fail(f"every needs_human {table} row says why", "\n".join(f"    {r}" for r in silent))
        stuck = {s: n for s, n in by_status.items() if s not in terminal}
        if stuck:
            rows = _rows(conn, f"SELECT * FROM paygate.{table} WHERE status <> ALL(%s) ORDER BY id LIMIT 5",
                         (sorted(terminal),))
            out.fail(f"every {table} row terminal", f"{stuck} not terminal; first rows:\n" +
                     "\n".join(f"    {r}" for r in rows))
    live = _rows(conn, "SELECT id, entitlement, lane, state, source_seq, send_count, last_send_status "
                       "FROM paygate.lineages WHERE state IN ('allocated', 'signed', 'sent') ORDER BY id")
    out.counts["lineages"] = dict(conn.execute("SELECT state, count(*) FROM paygate.lineages GROUP BY state"
                                               ).fetchall())
    if live:
        out.fail("no live lineage left", "\n".join(f"    {r}" for r in live))
    batches = conn.execute("SELECT count(*) FROM paygate.charge_batches WHERE closed_at IS NULL").fetchone()[0]
    if batches:
        out.fail("no open charge batch", f"{batches} charge batches still open")


def check_deposits(chain: ChainEnv, conn: psycopg.Connection, out: Findings, lost: LostCommits | None = None) -> None:
    """On chain, each deposit transferred at most once and credited at most once; settled ⇔ credited.
    With `lost` (a restored database): the lost journal's transfers are ours too, a deposit only the
    lost database knew is checked at most once on chain, and one whose transfer the restored
    journal lost may end asking a human (check_terminal: with its reason) instead of settled."""
    g = chain.genesis
    billing, users = g["contracts"]["billing"], {u["public"] for u in g["users"]}
    deposits = _rows(conn, "SELECT id, account, auth_nonce, amount, status, deposit_tx, deposit_lineage_id, "
                           "credit_lineage_id, reason FROM paygate.deposits ORDER BY id")
    for dep in deposits:
        dep["name"] = f"deposit:{dep['id']}"
    # A deposit is the same in both databases by its authorisation (account, nonce), not its id:
    # ids admitted after the backup are handed out again by the restored database's sequence.
    by_auth = {(d["account"], d["auth_nonce"]): d["name"] for d in deposits}
    only_lost, lost_names = [], {}
    for dep in lost.deposits if lost else []:
        name = by_auth.get((dep["account"], dep["auth_nonce"]))
        if name is None:
            name = f"lost:deposit:{dep['id']}"
            only_lost.append(dict(dep, status="lost", name=name))
        lost_names[dep["id"]] = name
    hashes = _hash_map(conn)
    for tx_hash, lineage in (lost.hashes if lost else {}).items():
        kind, _, rest = lineage["entitlement"].partition(":")
        if tx_hash not in hashes and kind == "deposit":
            number, _, part = rest.partition(":")
            name = lost_names.get(int(number), f"lost:deposit:{number}")
            hashes[tx_hash] = dict(lineage, entitlement=f"{name}:{part}")
        else:
            hashes.setdefault(tx_hash, lineage)
    transfers: dict[str, list[str]] = defaultdict(list)
    for ev in chain_events(chain, g["contracts"]["usdc"]):
        if ev["topics"][0] == "transfer" and ev["topics"][2] == billing and ev["topics"][1] in users:
            lineage = hashes.get(ev["tx"])
            if lineage is None:
                out.fail("every deposit transfer is ours", f"transfer in tx {ev['tx']} matches no lineage: {ev}")
                continue
            transfers[lineage["entitlement"]].append(ev["tx"])
    credits: dict[bytes, list[dict]] = defaultdict(list)
    for ev in chain_events(chain, billing):
        if ev["topics"][0] == "credit":
            credits[bytes(ev["value"][1])].append(ev)
    out.counts["deposit transfers on chain"] = sum(len(v) for v in transfers.values())
    out.counts["credits on chain"] = sum(len(v) for v in credits.values())
    # The transfer's hash a lost journal recorded for a deposit (the credit names it on chain).
    lost_tx = {lost_names[d["id"]]: bytes(d["deposit_tx"]) for d in (lost.deposits if lost else []) if d["deposit_tx"]}
    for dep in deposits + only_lost:
        ent = f"{dep['name']}:deposit"
        moved = transfers.get(ent, [])
        deposit_tx = bytes(dep["deposit_tx"]) if dep["deposit_tx"] else lost_tx.get(dep["name"])
        credited = credits.get(deposit_tx, []) if deposit_tx else []
        evidence = f"deposit {dep}\n  transfers {moved}\n  credits {credited}\n" + _lineages_of(
            conn, [ent, f"{dep['name']}:credit"])
        if len(moved) > 1:
            out.fail("each deposit transferred at most once", evidence)
        if len(credited) > 1:
            out.fail("each deposit credited at most once", evidence)
        if dep["status"] == "lost":
            continue  # only the lost database knew it: at most once on chain is all there is to ask
        if dep["status"] == "settled" and len(credited) != 1:
            out.fail("a settled deposit is credited on chain", evidence)
        if dep["status"] != "settled" and credited and not (lost and dep["status"] == "needs_human"):
            out.fail("a deposit credited on chain ends settled", evidence)
        if dep["status"] != "settled" and moved and not (lost and dep["status"] == "needs_human"):
            out.fail("a deposit that moved USDC ends settled", evidence)
    for deposit_tx, evs in credits.items():
        if not any(d["deposit_tx"] and bytes(d["deposit_tx"]) == deposit_tx for d in deposits) \
                and deposit_tx not in lost_tx.values():
            out.fail("every credit on chain is for a deposit of ours", f"{evs}")


def check_charges(chain: ChainEnv, conn: psycopg.Connection, out: Findings, lost: LostCommits | None = None) -> None:
    """Each charge id debited at most once; the row agrees with the chain. With `lost`: a charge id
    only the lost database knew is still ours (admitted after the backup, debited on chain)."""
    events = [e for e in chain_events(chain, chain.genesis["contracts"]["billing"])
              if e["topics"][0] in ("charge", "charge_failed")]
    seen = Counter(bytes(e["value"][1]) for e in events)
    kinds = {bytes(e["value"][1]): e["topics"][0] for e in events}
    rows = {bytes(r["charge_id"]): r for r in _rows(
        conn, "SELECT id, charge_id, account, amount, status, failed_by, reason, subscription_id, period_start, "
              "lineage_id FROM paygate.charges")}
    out.counts["charge events on chain"] = dict(Counter(e["topics"][0] for e in events))
    for charge_id, n in seen.items():
        row = rows.get(charge_id)
        if n > 1:
            out.fail("each charge id debited at most once", f"{charge_id.hex()} x{n}: {row}")
        if row is None:
            if not (lost and charge_id in lost.charge_ids):
                out.fail("every charge on chain is ours", f"{charge_id.hex()} is not in paygate.charges")
        elif kinds[charge_id] == "charge" and row["status"] != "settled":
            out.fail("debited on chain ⇒ settled", f"{row}")
        elif kinds[charge_id] == "charge_failed" and (row["status"], row["failed_by"]) != ("failed", "observer"):
            out.fail("charge_failed on chain ⇒ failed by the observer", f"{row}")
    for charge_id, row in rows.items():
        if row["status"] == "settled" and kinds.get(charge_id) != "charge":
            out.fail("settled ⇒ debited on chain", f"{row}")
        if row["status"] == "failed" and row["failed_by"] == "settlement" and charge_id in seen:
            out.fail("failed by settlement ⇒ never on chain", f"{row}")


def check_subscriptions(conn: psycopg.Connection, out: Findings) -> None:
    """At most one charge per subscription period, and every period start derived from the anchor."""
    dupes = _rows(conn, "SELECT subscription_id, period_start, count(*) FROM paygate.charges "
                        "WHERE subscription_id IS NOT NULL GROUP BY 1, 2 HAVING count(*) > 1")
    if dupes:
        out.fail("at most one charge per subscription period", f"{dupes}")
    off_grid = _rows(conn, """
        SELECT c.id, c.subscription_id, c.period_start, s.anchor, s.period FROM paygate.charges c
        JOIN paygate.subscriptions s ON s.id = c.subscription_id
        WHERE extract(epoch FROM c.period_start - s.anchor)::numeric % extract(epoch FROM s.period)::numeric <> 0""")
    if off_grid:
        out.fail("every period start is anchor + k x period", f"{off_grid}")
    out.counts["subscription charges"] = dict(conn.execute(
        "SELECT status, count(*) FROM paygate.charges WHERE subscription_id IS NOT NULL GROUP BY status").fetchall())
    out.counts["subscriptions"] = dict(conn.execute(
        "SELECT status, count(*) FROM paygate.subscriptions GROUP BY status").fetchall())


def check_relays(chain: ChainEnv, conn: psycopg.Connection, out: Findings) -> None:
    """Each relay applied at most once on chain (its unique item's order event), the row agrees with
    the chain, and fees settled exactly once (the relay path's own invariant helper)."""
    hashes = _hash_map(conn)
    orders: dict[str, list[dict]] = defaultdict(list)
    for ev in chain_events(chain, chain.genesis["contracts"]["market"]):
        if ev["topics"][0] == "order":
            orders[str(ev["value"][0])].append(ev)
    relays = _rows(conn, "SELECT id, idempotency_key, status, reason, fee_charged, lineage_id, "
                         "encode(tx_hash, 'hex') AS tx FROM paygate.relays ORDER BY id")
    carried: dict[str, str] = {}  # any hash that landed (inner or fee-bump outer) -> its inner hash
    if any(r["lineage_id"] is None and r["status"] == "applied" for r in relays):
        for tx in chain_transactions(chain):
            carried[tx["outer"]] = carried[tx["inner"]] = tx["inner"]
    for relay in relays:
        item = relay["idempotency_key"].replace("-", "_")
        landed = orders.get(item, [])
        evidence = f"relay {relay}\n  orders {landed}\n" + _lineages_of(conn, [f"relay:{relay['id']}"])
        if len(landed) > 1:
            out.fail("each relay applied at most once on chain", evidence)
        # Its own lineage's transaction, or (a restore lost that lineage) settled from the receipt of
        # the very transaction that carried the order.
        by_own_lineage = hashes.get(landed[0]["tx"], {}).get("entitlement") == f"relay:{relay['id']}" if landed \
            else False
        from_receipt = bool(landed) and relay["lineage_id"] is None and relay["tx"] is not None \
            and carried.get(landed[0]["tx"]) == relay["tx"]
        if landed and (relay["status"] != "applied" or not (by_own_lineage or from_receipt)):
            out.fail("an order on chain ⇒ its relay applied, by its own lineage or from that order's receipt",
                     evidence)
        if relay["status"] == "applied" and item.startswith("relay_") and not landed:
            out.fail("an applied relay ⇒ its order on chain", evidence)
    out.counts["orders on chain"] = sum(len(v) for v in orders.values())
    try:
        assert_relay_invariants(chain, conn)
    except AssertionError as exc:
        reservations = _rows(conn, "SELECT * FROM paygate.fee_reservations WHERE status = 'reserved' LIMIT 5")
        out.fail("relay fees settled exactly once (settled = feeCharged on chain; none left reserved)",
                 f"{exc!r}\n  open reservations {reservations}")
    out.counts["fee reservations"] = dict(conn.execute(
        "SELECT status, count(*) FROM paygate.fee_reservations GROUP BY status").fetchall())


# A starved lineage (docs/architecture.md §4 "Fees and the fee market") died waiting for the fee
# market, not for anything its unit did: it expired after a replacement, or while fee-capped.
STARVED = "(l.state = 'expired' AND (l.replacements > 0 OR l.fee_capped_at IS NOT NULL))"
INCLUDED_LINEAGES_SQL = """
SELECT l.id, l.entitlement, l.state, l.ledger, l.fee_charged, l.bid_rate, l.cap_rate, l.fee_ops, l.resource_fee,
       l.replacements, encode(l.inner_hash, 'hex') AS inner, encode(l.outer_hash, 'hex') AS outer,
       coalesce((SELECT array_agg(encode(e.outer_hash, 'hex') ORDER BY e.replaced_by)
                 FROM paygate.lineage_envelopes e WHERE e.lineage_id = l.id), '{}') AS replaced
FROM paygate.lineages l WHERE l.inner_hash IS NOT NULL ORDER BY l.id
"""


def check_landings_and_fees(chain: ChainEnv, conn: psycopg.Connection, out: Findings) -> None:
    """One landing per inner transaction, whichever of its outer envelopes carried it, and agreeing
    with the journal; every fee the chain charged within the lineage's cap and its bid; no envelope
    ever bid above its cap."""
    landed: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for tx in chain_transactions(chain):
        landed[tx["inner"]].append(tx)
    out.counts["transactions on chain"] = sum(len(v) for v in landed.values())
    for inner, txs in landed.items():
        if len(txs) > 1:
            out.fail("one landing per inner transaction", f"inner {inner} landed {len(txs)} times: {txs}")
    lineages = _rows(conn, INCLUDED_LINEAGES_SQL)
    ours = {r["inner"] for r in lineages}
    out.counts["transactions on chain that are not ours"] = sum(1 for inner in landed if inner not in ours)
    for row in lineages:
        txs = landed.get(row["inner"], [])
        evidence = f"lineage {row}\n  on chain {txs}"
        if row["state"] in ("applied", "failed"):
            if len(txs) != 1:
                out.fail("an applied or failed lineage landed exactly once", evidence)
                continue
            tx = txs[0]
            if (tx["status"], tx["ledger"]) != ("SUCCESS" if row["state"] == "applied" else "FAILED", row["ledger"]):
                out.fail("a lineage's state and ledger are the chain's", evidence)
            if tx["outer"] not in {row["outer"], *row["replaced"]}:
                out.fail("what landed is one of the lineage's own outer envelopes", evidence)
            if row["fee_charged"] != tx["fee_charged"]:
                out.fail("the journal's fee_charged is the chain's feeCharged", evidence)
            if None in (row["bid_rate"], row["cap_rate"], row["fee_ops"], row["resource_fee"]):
                out.fail("every included lineage records its bid and cap", evidence)
                continue
            cap = row["cap_rate"] * row["fee_ops"] + row["resource_fee"]
            bid = row["bid_rate"] * row["fee_ops"] + row["resource_fee"]
            if tx["fee_charged"] > cap or tx["fee_charged"] > bid:
                out.fail("fees charged <= cap", f"feeCharged {tx['fee_charged']} > cap {cap} or bid {bid}\n{evidence}")
        elif txs:  # expired, superseded, abandoned: proven dead, so never on chain
            out.fail("a dead lineage never landed", evidence)
    over = _rows(conn, """
        SELECT l.id, l.entitlement, l.bid_rate, l.cap_rate, e.replaced_by, e.bid_rate AS replaced_bid
        FROM paygate.lineages l LEFT JOIN paygate.lineage_envelopes e ON e.lineage_id = l.id
        WHERE l.bid_rate > l.cap_rate OR e.bid_rate > l.cap_rate ORDER BY l.id""")
    if over:
        out.fail("fees charged <= cap (no envelope bids above its cap)", "\n".join(f"    {r}" for r in over))
    out.counts["fee market"] = conn.execute(f"""
        SELECT json_build_object(
            'replacement envelopes', (SELECT count(*) FROM paygate.lineage_envelopes),
            'lineages re-bumped', count(*) FILTER (WHERE l.replacements > 0),
            'fee-capped at the end', count(*) FILTER (WHERE l.fee_capped_at IS NOT NULL),
            'starved', count(*) FILTER (WHERE {STARVED}),
            'highest bid', max(l.bid_rate), 'caps', array_agg(DISTINCT l.cap_rate))
        FROM paygate.lineages l""").fetchone()[0]


# Each unit's lineages, with its failure: (table, the failed statuses, how a lineage belongs to a row).
UNIT_LINEAGES = {
    "deposits": ("'failed'", "l.entitlement IN ('deposit:' || u.id || ':deposit', 'deposit:' || u.id || ':credit')"),
    "charges": ("'failed'", "l.id = ANY(u.dead_lineages || u.lineage_id)"),
    "relays": ("'failed'", "l.entitlement = 'relay:' || u.id"),
    "bot_jobs": ("'failed', 'dead'", "l.entitlement = 'bot_job:' || u.id"),
}


def check_fee_failures(conn: psycopg.Connection, out: Findings) -> None:
    """No unit failed for its fee: none failed (or dead) whose lineages all starved, and no starved
    lineage counted as an attempt by an attempt limit (charges, bot jobs)."""
    for table, (failed, joins) in UNIT_LINEAGES.items():
        rows = _rows(conn, f"""
            SELECT u.id, u.status, u.reason, array_agg(l.id ORDER BY l.id) AS lineages
            FROM paygate.{table} u JOIN paygate.lineages l ON {joins}
            WHERE u.status IN ({failed}) GROUP BY u.id, u.status, u.reason HAVING bool_and({STARVED})
            ORDER BY u.id""")
        for row in rows:
            out.fail("no unit failed for its fee", f"{table} {row}\n" + _lineages_of(
                conn, [e for (e,) in conn.execute("SELECT entitlement FROM paygate.lineages WHERE id = ANY(%s)",
                                                  (row["lineages"],))]))
    for table in ("charges", "bot_jobs"):
        counted = _rows(conn, f"""
            SELECT u.id, u.status, u.attempts, u.dead_lineages,
                   (SELECT count(*) FROM paygate.lineages l WHERE l.id = ANY(u.dead_lineages) AND NOT {STARVED})
                   AS real_attempts
            FROM paygate.{table} u WHERE u.attempts > 0 ORDER BY u.id""")
        for row in counted:
            if row["attempts"] > row["real_attempts"]:
                out.fail("no unit failed for its fee (a starved lineage is no attempt)", f"{table} {row}")


def check_balances(chain: ChainEnv, conn: psycopg.Connection, out: Findings, *, drift_ok: bool = False) -> None:
    """Cached balances equal the chain's. With `drift_ok` (a restored database) an account may
    differ, but never silently: an open balance finding must name it."""
    mismatched = []
    for user in chain.genesis["users"]:
        row = conn.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s",
                           (user["public"],)).fetchone()
        cached = int(row[0]) if row else 0
        on_chain = billing_balance(chain, user["public"])
        if cached != on_chain:
            mismatched.append((user["public"], cached, on_chain))
    out.counts["accounts checked against chain"] = len(chain.genesis["users"])
    if drift_ok and mismatched:
        flagged = {r[0] for r in conn.execute("SELECT subject FROM paygate.findings WHERE resolved_at IS NULL "
                                              "AND kind LIKE '%%drift%%'")}
        out.counts["accounts drifting, with an open finding"] = [m for m in mismatched if m[0] in flagged]
        mismatched = [m for m in mismatched if m[0] not in flagged]
        if mismatched:
            out.fail("a cached balance differs from the chain only with an open finding",
                     f"(account, cached, chain), no open finding: {mismatched}")
        return
    if mismatched:
        out.fail("cached balances equal chain balances", f"(account, cached, chain): {mismatched}")


def _persistent(contract: str, key: xdr.SCVal) -> xdr.LedgerKey:
    return xdr.LedgerKey(type=xdr.LedgerEntryType.CONTRACT_DATA, contract_data=xdr.LedgerKeyContractData(
        contract=Address(contract).to_xdr_sc_address(), key=key, durability=xdr.ContractDataDurability.PERSISTENT))


def kept_keys(chain: ChainEnv, conn: psycopg.Connection) -> dict[str, str]:
    """What paygate keeps alive (docs/architecture.md §4 "State archival (TTL)"), built here from the
    contracts' layouts, not by paygate: the billing contract's instance and code, its USDC balance in
    the SAC, and the balance entry of every account with money on it; plus every key ttl_entries
    holds. -> {key_xdr: what it is}."""
    billing, usdc = chain.genesis["contracts"]["billing"], chain.genesis["contracts"]["usdc"]
    keys = {_persistent(billing, xdr.SCVal(type=xdr.SCValType.SCV_LEDGER_KEY_CONTRACT_INSTANCE)).to_xdr(): "instance"}
    with chain.server() as server:
        [instance] = server.get_ledger_entries([xdr.LedgerKey.from_xdr(next(iter(keys)))]).entries or [None]
    if instance is not None:
        wasm = xdr.LedgerEntryData.from_xdr(instance.xdr).contract_data.val.instance.executable.wasm_hash
        keys[xdr.LedgerKey(type=xdr.LedgerEntryType.CONTRACT_CODE, contract_code=xdr.LedgerKeyContractCode(
            hash=wasm)).to_xdr()] = "code"

    def balance(contract: str, holder: str) -> str:
        return _persistent(contract, scval.to_vec([scval.to_symbol("Balance"), scval.to_address(holder)])).to_xdr()

    keys[balance(usdc, billing)] = "sac_balance"
    for (address,) in conn.execute("SELECT address FROM paygate.accounts WHERE cached_balance > 0 ORDER BY address"):
        keys[balance(billing, address)] = f"account_balance {address}"
    for key, kind, account in conn.execute("SELECT key_xdr, kind, account FROM paygate.ttl_entries"):
        keys.setdefault(key, f"{kind} {account or ''}".strip())
    return keys


def check_ttl(chain: ChainEnv, conn: psycopg.Connection, out: Findings) -> None:
    """Nothing paygate keeps alive is archived at the end: on chain (liveUntilLedgerSeq 0 or behind
    the latest ledger) nor in ttl_entries (archived, or asking a human); what the keeper did is
    counted."""
    keys = kept_keys(chain, conn)
    archived, missing = [], []
    with chain.server() as server:
        items = list(keys)
        for start in range(0, len(items), 200):
            answer = server.get_ledger_entries([xdr.LedgerKey.from_xdr(k) for k in items[start:start + 200]])
            found = {e.key: e for e in answer.entries or []}
            for key in items[start:start + 200]:
                entry = found.get(key)
                if entry is None:
                    # never written: a balance entry exists once money moved on chain
                    if keys[key] in ("instance", "code"):
                        missing.append(keys[key])
                elif not entry.live_until_ledger or entry.live_until_ledger < answer.latest_ledger:
                    archived.append((keys[key], entry.live_until_ledger, answer.latest_ledger))
    out.counts["kept entries checked on chain"] = len(keys)
    out.counts["ttl_entries"] = dict(conn.execute("SELECT state, count(*) FROM paygate.ttl_entries GROUP BY 1 "
                                                  "ORDER BY 1").fetchall())
    out.counts["ttl jobs applied"] = dict(conn.execute("SELECT kind, count(*) FROM paygate.ttl_jobs "
                                                       "WHERE status = 'applied' GROUP BY 1 ORDER BY 1").fetchall())
    if archived or missing:
        out.fail("nothing paygate keeps alive is archived", f"archived (what, liveUntil, latest): {archived}; "
                 f"missing: {missing}")
    bad = _rows(conn, "SELECT kind, account, state, live_until, reason FROM paygate.ttl_entries "
                      "WHERE state IN ('archived', 'needs_human') ORDER BY kind, account")
    if bad:
        out.fail("nothing paygate keeps alive is archived (ttl_entries)", "\n".join(f"    {r}" for r in bad))


def check_events(chain: ChainEnv, conn: psycopg.Connection, out: Findings) -> None:
    billing = [e for e in chain_events(chain, chain.genesis["contracts"]["billing"])
               if e["topics"][0] in ("credit", "charge", "charge_failed")]
    stored = conn.execute("SELECT count(*), count(*) FILTER (WHERE quarantined) FROM paygate.chain_events"
                          ).fetchone()
    if stored[0] != len(billing):
        out.fail("every billing event applied exactly once", f"{stored[0]} stored, {len(billing)} on chain")
    if stored[1]:
        out.fail("no quarantined events", f"{stored[1]} quarantined")


def check_webhooks(conn: psycopg.Connection, receiver: Receiver, out: Findings) -> None:
    """Every outbox event delivered; the receiver saw each at least once (duplicates counted)."""
    ids = {str(r[0]) for r in conn.execute("SELECT event_id FROM paygate.webhook_outbox")}
    with receiver.lock:
        got = Counter(r["headers"].get("Paygate-Event-Id") for r in receiver.requests)
    missing = ids - set(got)
    if missing:
        out.fail("every webhook event delivered", f"{len(missing)} never reached the receiver, e.g. "
                                                  f"{sorted(missing)[:5]}")
    out.counts["webhook deliveries"] = {"events": len(ids), "requests": sum(got.values()),
                                        "duplicates": sum(n - 1 for n in got.values() if n > 1)}


def check_findings(conn: psycopg.Connection, out: Findings) -> None:
    """The reconciler compares balances while money moves, so a finding may appear under chaos (its
    tick exits 3) and must clear on a later check: none may be left open after quiescence. Every
    finding raised during the run is listed in the table with its evidence."""
    rows = _rows(conn, "SELECT id, kind, subject, summary, details, first_seen, last_seen, seen_count, resolved_at, "
                       "resolved_by FROM paygate.findings ORDER BY id")
    out.counts["reconciler findings (raised, open)"] = (len(rows), sum(1 for r in rows if r["resolved_at"] is None))
    for row in rows:
        out.counts[f"finding {row['id']}"] = (f"{row['kind']} {row['subject'][:8]}…: {row['summary']} {row['details']} "
                                              f"(seen {row['seen_count']}x, {row['first_seen']:%H:%M:%S} → "
                                              f"{row['resolved_at'] and format(row['resolved_at'], '%H:%M:%S')})")
        if row["kind"] == "balance_drift":  # the evidence: that account's deposits settled around then
            near = _rows(conn, """
                SELECT p.id, p.amount, p.settled_by, to_char(p.settled_at, 'HH24:MI:SS.MS') AS settled_at,
                       l.ledger AS credit_ledger, to_char(l.resolved_at, 'HH24:MI:SS.MS') AS credit_resolved_at,
                       (SELECT to_char(e.observed_at, 'HH24:MI:SS.MS') || ' ledger ' || e.ledger || ' ' || e.effect
                        FROM paygate.chain_events e WHERE e.applied_to = 'deposit:' || p.id LIMIT 1) AS observed
                FROM paygate.deposits p LEFT JOIN paygate.lineages l ON l.id = p.credit_lineage_id
                WHERE p.account = %s AND p.settled_at BETWEEN %s - interval '60 seconds' AND %s + interval '60 seconds'
                ORDER BY p.id""", (row["subject"], row["first_seen"], row["last_seen"]))
            out.counts[f"finding {row['id']} deposits"] = near
    still_open = [r for r in rows if r["resolved_at"] is None]
    if still_open:
        out.fail("no reconciler finding left open after quiescence", "\n".join(f"    {r}" for r in still_open))


def count_tick_outcomes(conn: psycopg.Connection, out: Findings) -> None:
    """Reported: every tick's heartbeat outcome (an 'error' is a run that ended 69 on a lost dependency)."""
    out.counts["tick outcomes"] = dict(conn.execute(
        "SELECT coalesce(outcome, 'unfinished (killed)'), count(*) FROM paygate.worker_runs GROUP BY 1 ORDER BY 1"
    ).fetchall())
    out.counts["ticks stalled on fee-capped units"] = dict(conn.execute(
        "SELECT worker, count(*) FROM paygate.worker_runs WHERE outcome = 'stalled' AND error LIKE '%fee-capped%' "
        "GROUP BY 1 ORDER BY 1").fetchall())


def check_all(chain: ChainEnv, dsn: str, receiver: Receiver) -> Findings:
    out = Findings()
    with psycopg.connect(dsn, autocommit=True) as conn:
        check_terminal(conn, out)
        check_deposits(chain, conn, out)
        check_charges(chain, conn, out)
        check_subscriptions(conn, out)
        check_relays(chain, conn, out)
        check_landings_and_fees(chain, conn, out)
        check_fee_failures(conn, out)
        check_balances(chain, conn, out)
        check_ttl(chain, conn, out)
        check_events(chain, conn, out)
        check_webhooks(conn, receiver, out)
        check_findings(conn, out)
        count_tick_outcomes(conn, out)
    return out
