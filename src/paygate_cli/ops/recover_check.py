"""`recover-check`: the restore gate's recovery pass by hand (docs/architecture.md §8). Live
lineages are first driven through the queues' own take-over routines, exactly as a recovery tick
does (catalogue.RECOVERABLE, the normal grace: a live owner is never robbed; the take-over engine:
no lane or fee key), then journal/restore_gate.py compares every lane with the chain and clears the
restore halt when nothing is left unresolved. --dry-run drives, fences and clears nothing."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from paygate_cli.catalogue import RECOVERABLE, recovery_grace
from paygate_cli.context import TickContext
from paygate_cli.journal import restore_gate

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.rpc import ChainClient


def recover_check(conn: psycopg.Connection, settings: Any, *, actor: str, dry_run: bool,
                  log: logging.Logger) -> dict[str, Any]:
    """The report: the pass's result (per lane, per unit), what the take-overs did, and whether
    the restore halt was cleared. Audited unless --dry-run: `restore_clear` by the pass when it
    clears, else `restore_check` with the blockers."""
    taken: dict[str, dict[str, int]] = {}
    if not dry_run:
        grace = recovery_grace(settings)
        ctx = TickContext(conn=conn, settings=settings, worker="recovery", instance_id=f"recover-check:{actor}",
                          slot=0, batch=50, log=log)
        for entry in RECOVERABLE:
            outcomes = entry.load()(ctx, grace)
            if any(outcomes.values()):
                taken[entry.queue] = outcomes
    clients: list[ChainClient] = []

    def chain_of() -> ChainClient:
        if not clients:
            from paygate_cli.chain.rpc import ChainClient

            clients.append(ChainClient(settings, guard_conn=conn))
        return clients[0]

    try:
        result = restore_gate.run_pass(conn, settings, chain_of, actor=actor, dry_run=dry_run, log=log)
    finally:
        for client in clients:
            client.close()
    if not dry_run and not result.cleared:
        restore_gate.write_blocked_audit(conn, result, actor)
    return {**result.as_dict(), "taken_over": taken}
