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
        self._last_poll: tuple[int, float] | None = None  # the last answer and when it came
        # A ledger whose close this waiter saw within one poll (its sequence and that time), and the
        # shortest interval between two such closes: what predicts the next close. A ledger first
        # seen after a tick is not timed: it may have closed anywhere during the tick.
        self._close: tuple[int, float] | None = None
        self._interval: float | None = None

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
        last = self._last_poll
        if last is not None and sequence == last[0] + 1 and now - last[1] <= 2 * POLL_SECONDS:
            if self._close is not None and self._close[0] == last[0]:
                gap = max(now - self._close[1], POLL_SECONDS)
                self._interval = gap if self._interval is None else min(self._interval, gap)
            self._close = (sequence, now)
        self._last_poll = (sequence, now)
        return sequence

    def _pause(self, sequence: int, now: float) -> float:
        """Until the next poll: the predicted close less a poll when this ledger's close was timed."""
        if self._close is not None and self._close[0] == sequence and self._interval is not None:
            return max(POLL_SECONDS, self._close[1] + self._interval - POLL_SECONDS - now)
        return POLL_SECONDS

    def wait_past(self, ledger: int, deadline: float, stop: threading.Event) -> bool:
        """Return True as soon as a ledger after `ledger` has closed, False at `deadline` or on stop."""
        while not stop.is_set():
            if self._monotonic() >= deadline:
                return False
            sequence = self._latest()
            if sequence is None:
                return False
            if sequence > ledger:
                return True
            now = self._monotonic()
            stop.wait(max(0.0, min(self._pause(sequence, now), deadline - now)))
        return False
