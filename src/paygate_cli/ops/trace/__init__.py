"""`trace`: one unit of money's whole story, the database and the chain side by side, and a verdict.

A unit is a deposit, a charge, a relay, a bot job (each by its id), a transaction (by its inner or any
outer hash: the unit its lineage pays for) or an account (deposits − charges against its balance in
the billing contract). The database side is read in one read-only snapshot, hot tables and
`paygate_archive` alike (a charge retention archived is traced from there); the chain side is re-read
now, with no transaction open (docs/architecture.md §1 rule 2): each lineage's receipt by
getTransaction on every read endpoint and decided by the journal's own quorum rule
(journal/resolve.py judge/decide), the deposit's authorisation nonce, the billing events of the
unit, the account's balance entry.

The verdict uses the reconciler's regimes (workers/reconciler.py): `match` (the sides agree),
`in_flight` (work the chain has not included yet), `lagging` (the chain is ahead of what the
database has recorded: a worker's next tick or the observer records it), `unexplained` (a human
must look: exit 3), plus `unreadable` when the chain could not be read (exit 1, said in the
verdict). Read-only: nothing is sent or written; never an envelope, ciphertext, auth entry or secret.

The package: parts.py (what every trace shares: the checks, the chain side, the lineages, the unit's
surroundings, the verdict), units.py (deposit, charge, relay, bot job, a transaction by hash),
account.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from paygate_cli.ops.trace.account import trace_account
from paygate_cli.ops.trace.parts import KINDS, REGIMES, Chain, check_request, now_utc
from paygate_cli.ops.trace.units import (
    trace_bot_job,
    trace_charge,
    trace_deposit,
    trace_lineage_only,
    trace_relay,
    units_of_hash,
)

if TYPE_CHECKING:
    import psycopg

__all__ = ["KINDS", "check_request", "trace"]


def trace(conn: psycopg.Connection, settings: Any, kind: str, ref: str) -> dict[str, Any]:
    """The whole command's document: unit, timeline, verdict and the evidence by part."""
    ref = check_request(kind, ref)
    chain = Chain(conn, settings)
    try:
        if kind == "deposit":
            return trace_deposit(conn, chain, int(ref))
        if kind == "charge":
            return trace_charge(conn, chain, int(ref))
        if kind == "relay":
            return trace_relay(conn, chain, int(ref))
        if kind == "bot-job":
            return trace_bot_job(conn, chain, int(ref))
        if kind == "account":
            return trace_account(conn, chain, ref)
        tx, units = units_of_hash(conn, ref)
        if not units:
            return trace_lineage_only(conn, chain, tx["lineage"]) | {"tx": tx}
        traced = [_TRACERS[k](conn, chain, i) for k, i in units]
        if len(traced) == 1:
            return traced[0] | {"tx": tx}
        # A charge batch: every charge it carried, each traced; the worst verdict is the batch's.
        regime = min((t["verdict"]["regime"] for t in traced), key=REGIMES.index)
        timeline = [e | {"unit": t["unit"]} for t in traced for e in t["timeline"]]
        timeline.sort(key=lambda e: (e["source"] == "chain", e["at"] is None, e["at"] or now_utc()))
        return {"unit": {"kind": "tx", "id": ref}, "tx": tx, "timeline": timeline,
                "verdict": {"agree": all(t["verdict"]["agree"] for t in traced), "regime": regime,
                            "where": "; ".join(f"charge {t['unit']['id']}: {t['verdict']['where']}" for t in traced),
                            "explanation": "; ".join(f"charge {t['unit']['id']}: {t['verdict']['explanation']}"
                                                     for t in traced if t["verdict"]["regime"] == regime),
                            "chain_readable": all(t["verdict"]["chain_readable"] for t in traced)},
                "units": [{"unit": t["unit"], "verdict": t["verdict"]} for t in traced]}
    finally:
        chain.close()


_TRACERS: dict[str, Callable[[Any, Chain, int], dict[str, Any]]] = {
    "deposit": trace_deposit, "charge": trace_charge, "relay": trace_relay, "bot-job": trace_bot_job}
