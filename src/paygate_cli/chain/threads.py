"""Chain reads on threads of their own: several asked at once (`ask_at_once`: every RPC endpoint's
health), or the next one started while the caller works on the last answer (`ReadAhead`: the
observer's next page of events while it applies this one).

Daemon threads, not a ThreadPoolExecutor: an executor's exit, and the interpreter's, join its
threads, so a Ctrl-C or a SIGTERM while a slow endpoint is asked would hold the process until that
endpoint's RPC timeout; an abandoned daemon thread ends with the process. A read on one of these
threads holds no database transaction (docs/architecture.md §1: no network wait inside one)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ReadAhead(Generic[T]):
    """One call started now on its own thread; `answer()` waits for it and returns what it
    returned, or raises what it raised, in the caller's thread. Not waited for, it is abandoned."""

    def __init__(self, call: Callable[[], T], name: str) -> None:
        self._answers: queue.SimpleQueue[tuple[T | None, BaseException | None]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, args=(call,), name=name, daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], T]) -> None:
        try:
            self._answers.put((call(), None))
        except BaseException as exc:  # reported to the caller's thread, which re-raises it
            self._answers.put((None, exc))

    def answer(self) -> T:
        answer, error = self._answers.get()  # a signal (Ctrl-C, SIGTERM's handler) interrupts this wait
        if error is not None:
            raise error
        return answer  # type: ignore[return-value]  # None only with an error


def ask_at_once(calls: Mapping[Hashable, Callable[[], Any]]) -> dict[Hashable, Any]:
    """Every call on its own thread, all at once; -> each call's answer by its key (the first call
    that raised, in key order, raises here)."""
    started = {key: ReadAhead(call, name=f"ask {key}") for key, call in calls.items()}
    return {key: read.answer() for key, read in started.items()}
