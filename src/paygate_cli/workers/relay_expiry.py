"""Relay expiry: relays whose authorisation can no longer succeed (its signatureExpirationLedger is
below the chain's latest ledger) end `expired`, their fee reservation is released and the product is
told once (one outbox event, in the transaction that wins the flip).

Never while a lineage of the relay could still land: a relay whose current lineage is allocated,
signed or sent is left to the relay worker, whose resolve() proves it dead first (by maxTime or by
its ledger bound), nor while the relay worker holds the row's lease. A lineage included on chain
(applied or failed) is the relay worker's disposition, never an expiry: its fee was burned."""

from __future__ import annotations

from typing import Any

from paygate_cli.context import TickContext, TickResult
from paygate_cli.queues import relays


def tick(ctx: TickContext) -> TickResult:
    earliest = ctx.conn.execute(relays.ANY_QUEUED_SQL).fetchone()[0]
    if earliest is None:
        return TickResult()
    from paygate_cli.chain.rpc import ChainClient

    chain = ChainClient(ctx.settings, guard_conn=ctx.conn)
    try:
        # Ledger time, from the chain (rule 9), and from a majority of the read hosts: expiry is
        # terminal, and one host can claim any future ledger (ChainClient.latest_ledger_quorum).
        head = chain.latest_ledger_quorum()
    finally:
        chain.close()
    latest = head.sequence
    facts: dict[str, Any] = {"latest_ledger": latest, "expired": 0}
    if head.highest != latest:
        facts["highest_claimed"] = head.highest  # a host ahead of the majority: not believed alone
    seen = _observed_ledger(ctx)
    if seen is not None and latest < seen:
        # The hosts are behind what the observer already read: nothing expires early, it only waits.
        facts["waiting"] = f"the read hosts' latest ledger {latest} is behind ledger {seen} already observed"
        ctx.log.warning("relay expiry waiting: %s", facts["waiting"], extra={"msgid": "relay_expiry.readers_behind"})
    if earliest >= latest:
        return TickResult(details=facts)
    with ctx.conn.transaction():
        rows = ctx.conn.execute(relays.EXPIRE_SQL, {"latest": latest, "batch": ctx.batch}).fetchall()
    for relay_id, released, _ in rows:
        if not released:
            # The reservation was already closed: the invariant "settled or released, once" held,
            # but something closed it without ending the relay. Reported, never papered over.
            ctx.log.error("relay %s expired but its reservation was not open", relay_id,
                          extra={"msgid": "relay_expiry.reservation_closed", "relay_id": relay_id})
    ctx.log.log(20 if rows else 10, "relay expiry: %d relay(s) expired at latest ledger %d", len(rows), latest,
                extra={"msgid": "relay_expiry.done"})
    return TickResult(processed=len(rows), details={**facts, "expired": len(rows)})


def _observed_ledger(ctx: TickContext) -> int | None:
    """The ledger of the observer's cursor: a ledger the chain is known to have reached."""
    row = ctx.conn.execute("SELECT cursor FROM paygate.observer_cursor").fetchone()
    if row is None:
        return None
    from paygate_cli.chain.charges import cursor_ledger

    return cursor_ledger(row[0])
