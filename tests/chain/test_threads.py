"""chain/threads.py: reads on daemon threads. Every question of `ask_at_once` is asked at once, and
what a call raised reaches the caller's thread (ReadAhead.answer). The Ctrl-C these threads must
never hold up is driven through a real terminal in tests/commands/test_top.py."""

from __future__ import annotations

import threading

import pytest

from paygate_cli.chain.threads import ReadAhead, ask_at_once


def test_every_question_is_asked_at_once_and_a_failure_reaches_the_caller() -> None:
    # Each question waits until all five are being asked: asked one after another, the first
    # would wait alone and the barrier break (BrokenBarrierError reaches the caller).
    together = threading.Barrier(5, timeout=30)
    answers = ask_at_once({n: lambda n=n: (together.wait(), n * n)[1] for n in range(5)})
    assert answers == {n: n * n for n in range(5)}

    def refuses() -> None:
        raise LookupError("no such endpoint")

    with pytest.raises(LookupError, match="no such endpoint"):
        ask_at_once({"fine": lambda: 1, "refuses": refuses})
    assert ask_at_once({}) == {}


def test_a_read_ahead_runs_on_its_own_daemon_thread_and_its_answer_or_error_comes_back() -> None:
    started = threading.Event()
    release = threading.Event()

    def read() -> tuple[str, bool]:
        started.set()
        release.wait(30)
        return threading.current_thread().name, threading.current_thread().daemon

    ahead = ReadAhead(read, name="page after")
    assert started.wait(30)  # running before anyone asked for its answer
    release.set()
    assert ahead.answer() == ("page after", True)

    def fails() -> None:
        raise ConnectionError("getEvents: connection reset")

    with pytest.raises(ConnectionError, match="connection reset"):
        ReadAhead(fails, name="failing read").answer()
