"""What a tick receives and returns."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.settings import Settings


@dataclass
class TickContext:
    conn: psycopg.Connection  # the work connection, autocommit: ticks open short transactions
    settings: Settings
    worker: str
    instance_id: str
    slot: int
    batch: int
    log: logging.Logger
    # This instance is drained (`paygate drain --instance`): finish held work, take no new claims.
    draining: bool = False
    # The tick left work the next ledger moves (a transaction in flight, units waiting for a free
    # lane or under their fee cap, the observer caught up): the latest ledger it knew then. A
    # `--every` loop starts its next tick as soon as a later ledger closes (ticks/next_ledger.py).
    wake_after_ledger: int | None = None

    def wake_after(self, ledger: int) -> None:
        """Ask for the next tick once a ledger after `ledger` closed (the earliest such ask wins)."""
        if self.wake_after_ledger is None or ledger < self.wake_after_ledger:
            self.wake_after_ledger = ledger


@dataclass
class TickResult:
    processed: int = 0
    failed: int = 0
    needs_human: int = 0
    details: dict[str, Any] = field(default_factory=dict)
    # Work is waiting that this tick could not move (no free lane for too long, every lane fenced...):
    # the reason. A stalled tick is not a success (exit 1, status not ready), never a quiet 0.
    stalled: str | None = None

    @property
    def outcome(self) -> str:
        if self.needs_human:
            return "needs_human"
        if self.failed:
            return "failed"
        return "stalled" if self.stalled else "ok"
