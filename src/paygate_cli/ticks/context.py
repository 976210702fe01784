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


@dataclass
class TickResult:
    processed: int = 0
    failed: int = 0
    needs_human: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        if self.needs_human:
            return "needs_human"
        return "failed" if self.failed else "ok"
