"""Gas monitor: the fee account's XLM headroom against the floors in paygate.relay_config.

headroom = fee account balance - its reserve - fees reserved by in-flight relays (every open
paygate.fee_reservations row: liability the gateway has already accepted) - what the other live
signed lineages could still be charged at their cap (committed: their envelopes are journaled and
may land at any bid up to cap_rate; docs/workers.md "Gas headroom").
- below the warning floor: alert (outbox event on the change of level, tick details, gas_state for
  `status`);
- below the critical floor: the durable `gas` halt (admission of deposits, charges, relays and bot
  jobs closes: every admit_* function refuses while any halt row exists);
- the halt clears only at or above the higher resume floor (hysteresis), never in between.
It never touches the operator's halt, and never stops the relay workers: rows holding signed
authorisations and reserved fees are committed liability, and draining them restores headroom.
Lanes whose spendable XLM is below their own minimum are reported too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from paygate_cli.context import TickContext, TickResult
from paygate_cli.errors import Unavailable

if TYPE_CHECKING:
    from paygate_cli.chain.relay import XlmBalance

CONFIG_SQL = """
SELECT gas_warning_floor, gas_critical_floor, gas_resume_floor, lane_min_balance FROM paygate.relay_config
"""
# The rows, not the accumulator: the open reservations are the liability itself.
RESERVED_SQL = "SELECT coalesce(sum(amount), 0)::bigint FROM paygate.fee_reservations WHERE status = 'reserved'"
# Live signed lineages whose fee no open relay reservation already holds (funding, settlement, bot
# jobs; a relay whose reservation was closed), each at the most it may still be charged: its cap rate
# for every operation it pays for, plus its resource fee. A lineage signed before the fee market
# (no cap_rate/fee_ops/resource_fee) counts at max_inclusion_fee for a 1-op fee bump's 2 operations,
# and no resource fee: its real bound is inside its encrypted envelope, which the monitor cannot read.
# One that already landed but is not resolved yet is counted until it is (briefly conservative).
COMMITTED_SQL = """
SELECT coalesce(sum(coalesce(l.cap_rate, %(cap)s) * coalesce(l.fee_ops, 2) + coalesce(l.resource_fee, 0)), 0)::bigint,
       count(*)
FROM paygate.lineages l
WHERE l.state IN ('signed', 'sent')
  AND NOT EXISTS (SELECT 1 FROM paygate.fee_reservations r
                  WHERE r.status = 'reserved'
                    AND r.relay_id = CASE WHEN l.purpose = 'relay' AND l.entitlement LIKE 'relay:%%'
                                          THEN substr(l.entitlement, 7)::bigint END)
"""
# The monitor is the only writer of its state row; FOR UPDATE orders two overlapping monitors.
PREVIOUS_SQL = "SELECT level, ledger FROM paygate.gas_state FOR UPDATE"
HALTED_SQL = "SELECT reason FROM paygate.halts WHERE kind = 'gas' FOR UPDATE"
SET_HALT_SQL = """
INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('gas', %s, 'gas-monitor')
ON CONFLICT (kind) DO NOTHING RETURNING kind
"""
# Only the gas row: the operator's own halt is theirs to clear.
CLEAR_HALT_SQL = "DELETE FROM paygate.halts WHERE kind = 'gas' RETURNING reason"
SAVE_STATE_SQL = """
INSERT INTO paygate.gas_state (singleton, fee_account, balance, reserve, reserved_fees, committed_fees, headroom,
                               level, halted, low_lanes, ledger, checked_at)
VALUES (true, %(fee_account)s, %(balance)s, %(reserve)s, %(reserved)s, %(committed)s, %(headroom)s, %(level)s,
        %(halted)s, %(low_lanes)s, %(ledger)s, now())
ON CONFLICT (singleton) DO UPDATE SET
    fee_account = EXCLUDED.fee_account, balance = EXCLUDED.balance, reserve = EXCLUDED.reserve,
    reserved_fees = EXCLUDED.reserved_fees, committed_fees = EXCLUDED.committed_fees,
    headroom = EXCLUDED.headroom, level = EXCLUDED.level,
    halted = EXCLUDED.halted, low_lanes = EXCLUDED.low_lanes, ledger = EXCLUDED.ledger, checked_at = now()
"""
EMIT_SQL = "SELECT paygate.emit_event(%s, %s)"
# The lanes the signing workers have registered (Engine.for_tick syncs them from the lane seeds).
LANES_SQL = "SELECT address FROM paygate.lanes WHERE status <> 'retired' ORDER BY address"
AUDIT_SQL = "INSERT INTO paygate.audit_log (actor, action, target, details) VALUES ('gas-monitor', %s, 'gas', %s)"


def _headroom(fee: XlmBalance, liability: int) -> int:
    """Spendable XLM beyond what is already promised: `liability` = reserved relay fees + the other
    live lineages' fees at their cap."""
    return (fee.balance - fee.reserve - fee.selling_liabilities - liability) if fee.exists else -liability


def level_of(headroom: int, warning: int, critical: int) -> str:
    if headroom < critical:
        return "critical"
    return "warning" if headroom < warning else "ok"


def tick(ctx: TickContext) -> TickResult:
    from paygate_cli.chain.keys import fee_account_address
    from paygate_cli.chain.relay import xlm_balances_by_host
    from paygate_cli.chain.rpc import ChainClient

    # Addresses only: the monitor watches balances and needs no seed (least privilege).
    fee_account = fee_account_address(ctx.settings)
    lanes = [lane for (lane,) in ctx.conn.execute(LANES_SQL)]
    chain = ChainClient(ctx.settings, guard_conn=ctx.conn)
    try:
        views = xlm_balances_by_host(chain, [fee_account, *lanes])  # no transaction open (rule 2)
    finally:
        chain.close()
    # The halt is a decision like the other money decisions: from a majority of the distinct read
    # hosts, never one node's balance (a lying or lagging node could halt admission, or lift the halt).
    answered = [v for v in views if not isinstance(v, str)]
    need = len(views) // 2 + 1
    if len(answered) < need:
        raise Unavailable(f"gas: {len(answered)} of {len(views)} read hosts gave the fee account's balance, a "
                          f"decision needs {need} ({'; '.join(v for v in views if isinstance(v, str))})"[:500],
                          msgid="rpc.no_quorum")
    with ctx.conn.transaction():
        warning, critical, resume, lane_min = ctx.conn.execute(CONFIG_SQL).fetchone()
        reserved = int(ctx.conn.execute(RESERVED_SQL).fetchone()[0])
        committed, committed_lineages = ctx.conn.execute(
            COMMITTED_SQL, {"cap": int(ctx.settings.max_inclusion_fee)}).fetchone()
        committed = int(committed)
        liability = reserved + committed
        ranked = sorted(answered, key=lambda v: _headroom(v[fee_account], liability))
        # ranked[need - 1] below a floor: a majority is below it; ranked[-need] at or above the resume
        # floor: a majority is at or above it (both cannot hold: critical < resume).
        balances, upper = ranked[need - 1], ranked[-need]
        fee = balances[fee_account]
        low_lanes = [{"lane": b.address, "spendable": b.spendable if b.exists else None, "minimum": lane_min,
                      "exists": b.exists}
                     for b in (balances[lane] for lane in lanes) if not b.exists or b.spendable < lane_min]
        headroom = _headroom(fee, liability)
        level = level_of(headroom, warning, critical)
        previous = ctx.conn.execute(PREVIOUS_SQL).fetchone()
        previous_level = previous[0] if previous else "ok"
        halted = ctx.conn.execute(HALTED_SQL).fetchone() is not None
        if previous is not None and previous[1] is not None and fee.ledger < int(previous[1]):
            # The hosts are behind the last check: an older balance decides nothing. Wait for them.
            waiting = (f"the read hosts' ledger {fee.ledger} is behind ledger {previous[1]} of the last check; "
                       f"the gas state is kept")
            ctx.log.warning("gas monitor waiting: %s", waiting, extra={"msgid": "gas.readers_behind"})
            return TickResult(processed=0, details={"level": previous_level, "halted": halted, "waiting": waiting})
        facts: dict[str, Any] = {"fee_account": fee_account, "balance": fee.balance, "reserve": fee.reserve,
                                 "reserved_fees": reserved, "committed_fees": committed,
                                 "committed_lineages": int(committed_lineages), "headroom": headroom,
                                 "warning_floor": warning, "critical_floor": critical, "resume_floor": resume,
                                 "ledger": fee.ledger}
        action = None
        if level == "critical" and not halted:
            reason = (f"fee account headroom {headroom} stroops is below the critical floor {critical}"
                      + ("" if fee.exists else " (the fee account does not exist on chain)"))
            if ctx.conn.execute(SET_HALT_SQL, (reason,)).fetchone() is not None:
                action, halted = "halt", True
        elif halted and _headroom(upper[fee_account], liability) >= resume \
                and ctx.conn.execute(CLEAR_HALT_SQL).fetchone() is not None:
            action, halted = "resume", False
        if action is not None:
            ctx.conn.execute(AUDIT_SQL, (f"gas.{action}", Jsonb(facts)))
            ctx.conn.execute(EMIT_SQL, ("gas.halted" if action == "halt" else "gas.resumed", Jsonb(facts)))
        if level != previous_level:
            # One event per change of level, not one every 300 s while it stays low.
            ctx.conn.execute(EMIT_SQL, (f"gas.{level}", Jsonb({**facts, "previous_level": previous_level})))
        ctx.conn.execute(SAVE_STATE_SQL, {
            "fee_account": fee_account, "balance": fee.balance, "reserve": fee.reserve, "reserved": reserved,
            "committed": committed, "headroom": headroom, "level": level, "halted": halted,
            "low_lanes": Jsonb(low_lanes), "ledger": fee.ledger})
    if level != "ok":
        ctx.log.warning("fee account %s headroom %s stroops is %s (warning floor %s, critical %s, resume %s)%s",
                        fee_account, headroom, level, warning, critical, resume,
                        "; admission halted" if halted else "",
                        extra={"msgid": f"gas.{level}", "headroom": headroom})
    for lane in low_lanes:
        ctx.log.warning("lane %s spendable XLM %s is below its minimum %s", lane["lane"], lane["spendable"],
                        lane_min, extra={"msgid": "gas.lane_low", "lane": lane["lane"]})
    return TickResult(processed=1, details={**facts, "level": level, "halted": halted, "action": action,
                                            "low_lanes": low_lanes})
