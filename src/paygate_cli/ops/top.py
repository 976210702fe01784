"""The read model of one `paygate top` frame: queues (depth, oldest age, rate between frames), lanes
with their in-flight lineage (state, age in ledgers, bid against the market), halts, the latest
ledger and each RPC endpoint's lag, the workers' last ticks, open findings.

Reads only, through the read models `status` uses (state.py, ops/status.py): a frame is what
`status` would say, laid out to be watched. The one read of its own is the lanes' in-flight
lineages, which `status` does not list."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from paygate_cli.ops.status import last_runs, liveness, rpc_health
from paygate_cli.state import fee_market_state, list_halts, open_findings_summary, queue_depths

if TYPE_CHECKING:
    import psycopg

# Every lane not retired, and its live lineage if it has one (at most one per lane, docs/architecture.md §4).
LANES_IN_FLIGHT_SQL = """
SELECT la.address, la.status, la.drain_reason,
       l.id, l.purpose, l.entitlement, l.state, l.bid_rate, coalesce(l.bid_ledger, l.signed_at_ledger),
       l.replacements, l.fee_capped_at IS NOT NULL, l.parked_at IS NOT NULL,
       extract(epoch FROM now() - l.created_at)::float8
FROM paygate.lanes la
LEFT JOIN paygate.lineages l ON l.lane = la.address AND paygate.lineage_is_live(l.state)
WHERE la.status <> 'retired'
ORDER BY l.created_at NULLS LAST, la.address
"""


def lanes_in_flight(conn: psycopg.Connection, latest_ledger: int | None,
                    market_price: int | None) -> list[dict[str, Any]]:
    """Each lane, its in-flight lineage (None when free), that lineage's age in ledgers since its
    current envelope was journaled (None without a latest ledger), and its bid against the market:
    the bid rule is one stroop per operation over the figure (docs/architecture.md §4 "Fees and the
    fee market"), so `bid_over_market` >= 1 is a bid that wins at today's price."""
    lanes = []
    for (address, status, drain_reason, lineage_id, purpose, entitlement, state, bid, journaled_ledger,
         replacements, fee_capped, parked, age) in conn.execute(LANES_IN_FLIGHT_SQL):
        lineage = None
        if lineage_id is not None:
            lineage = {"id": lineage_id, "purpose": purpose, "entitlement": entitlement, "state": state,
                       "bid_rate": bid, "market_price": market_price,
                       "bid_over_market": bid - market_price if bid is not None and market_price is not None
                       else None,
                       "age_ledgers": latest_ledger - journaled_ledger
                       if latest_ledger is not None and journaled_ledger is not None else None,
                       "age_s": round(age, 1), "replacements": replacements, "fee_capped": fee_capped,
                       "parked": parked}
        lanes.append({"lane": address, "status": status, "drain_reason": drain_reason, "lineage": lineage})
    return lanes


def with_rates(queues: list[dict[str, Any]], before: list[dict[str, Any]] | None,
               seconds: float | None) -> list[dict[str, Any]]:
    """Each queue's depth change per minute since the previous frame's queues (`before`, `seconds`
    ago); None on the first frame (one frame has no rate). Negative: the queue is draining."""
    depths = {q["queue"]: q["depth"] for q in before or []}
    for queue in queues:
        queue["rate_per_min"] = None
        if seconds and queue["queue"] in depths:
            queue["rate_per_min"] = round((queue["depth"] - depths[queue["queue"]]) * 60.0 / seconds, 1)
    return queues


def frame(conn: psycopg.Connection, settings: Any, previous: dict[str, Any] | None = None,
          elapsed_s: float | None = None) -> dict[str, Any]:
    """One frame. `previous` and `elapsed_s` (seconds since it) give the queues their rates."""
    queues = queue_depths(conn)
    workers = last_runs(conn)
    liveness(workers, queues)  # sets each run's `liveness`; `status` is the place for the verdict
    market = fee_market_state(conn)["market"]
    rpc = rpc_health(settings) if settings is not None else {"configured": False, "endpoints": [],
                                                             "problems": []}
    latest = max((e["latest_ledger"] for e in rpc["endpoints"] if e.get("latest_ledger") is not None),
                 default=None)
    quorum_ledger = (rpc.get("quorum") or {}).get("ledger")
    return {
        "at": datetime.now(UTC),
        "queues": with_rates(queues, previous["queues"] if previous else None, elapsed_s),
        "lanes": lanes_in_flight(conn, quorum_ledger or latest, market["price"] if market else None),
        "halts": list_halts(conn),
        "chain": {"latest_ledger": latest, "quorum_ledger": quorum_ledger, "endpoints": rpc["endpoints"],
                  "problems": rpc["problems"]},
        "fee_market": market,
        "workers": [{"worker": w["worker"], "liveness": w.get("liveness"), "last_outcome": w["last_outcome"],
                     "last_run_age_s": w["last_run_age_s"], "last_success_age_s": w["last_success_age_s"],
                     "last_error": w["last_error"] if w["last_finished_outcome"] not in (None, "ok") else None}
                    for w in workers],
        "findings": open_findings_summary(conn),
    }
