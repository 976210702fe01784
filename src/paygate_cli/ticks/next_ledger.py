"""Waking a `--every` loop at the chain's next ledger close (docs/workers.md "Ticks at ledger close").

A transaction a tick sent is included, at best, in the next ledger, and its lane is free for new work
only once a tick has read its receipt. On a fixed cadence alone a lane carries one transaction per
cadence-plus-a-ledger; a tick that starts as soon as the awaited ledger closes lets it carry one a
ledger, the chain's own ceiling. The fixed-rate slot still bounds every wait: this only ever starts a
tick earlier, never later, and an RPC that does not answer here just leaves the loop on its cadence.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from paygate_cli.errors import PaygateError
from paygate_cli.logs import get_logger

if TYPE_CHECKING:
    from paygate_cli.chain.rpc import ChainClient

log = get_logger("ticks")

# Between getLatestLedger polls once a close is due. Before that the waiter sleeps: it predicts the
# close from the interval between the closes it saw (mainnet's 5-6 s, the devnet's 1 s), so a poll
# rarely lands more than this after the close and rarely wastes a call long before it.
POLL_SECONDS = 0.1


class NextLedgerWaiter:
    """Waits until the chain's latest ledger is past a given one, or a deadline."""

    def __init__(self, chain_factory: Callable[[], ChainClient], monotonic: Callable[[], float]) -> None:
        self._chain_factory = chain_factory
        self._chain: ChainClient | None = None
        self._monotonic = monotonic
        self._seen: tuple[int, float] | None = None  # (sequence, when this process first saw it)
        self._interval: float | None = None  # the shortest interval between two closes seen

    def close(self) -> None:
        if self._chain is not None:
            self._chain.close()
            self._chain = None

    def _latest(self) -> int | None:
        try:
            if self._chain is None:
                self._chain = self._chain_factory()
            sequence = self._chain.latest_ledger().sequence
        except (PaygateError, OSError, ValueError) as exc:  # ValueError: a malformed answer
            log.debug("next-ledger wait: no answer (%s); the loop keeps its cadence", exc,
                      extra={"msgid": "tick.ledger_wait_failed"})
            return None
        now = self._monotonic()
        if self._seen is None or sequence > self._seen[0]:
            if self._seen is not None and sequence == self._seen[0] + 1:
                gap = now - self._seen[1]
                self._interval = gap if self._interval is None else min(self._interval, max(gap, POLL_SECONDS))
            self._seen = (sequence, now)
        return sequence

    def wait_past(self, ledger: int, deadline: float, stop: threading.Event) -> bool:
        """Return True as soon as a ledger after `ledger` has closed, False at `deadline` or on stop."""
        while not stop.is_set():
            now = self._monotonic()
            if now >= deadline:
                return False
            sequence = self._latest()
            if sequence is None:
                return False
            if sequence > ledger:
                return True
            now = self._monotonic()
            pause = POLL_SECONDS
            if self._seen is not None and self._interval is not None:
                due = self._seen[1] + self._interval - POLL_SECONDS
                pause = max(pause, due - now)
            stop.wait(max(0.0, min(pause, deadline - now)))
        return False
