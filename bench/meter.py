"""Shared by the benchmarks: wall time spent inside wrapped callables (RPC calls, SQL round trips)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class Meter:
    """Wraps `owner.name` (a class method or function attribute) and, while `enabled`, adds up the
    calls and the seconds spent inside them."""

    def __init__(self, enabled: bool = False) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.enabled = enabled

    def wrap(self, owner: Any, name: str) -> None:
        original: Callable[..., Any] = getattr(owner, name)
        meter = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not meter.enabled:
                return original(*args, **kwargs)
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                meter.seconds += time.perf_counter() - started
                meter.calls += 1

        setattr(owner, name, timed)
