"""Crash drills: run one real `paygate run-tick` process with a crash point armed and prove it died
there (SIGKILL exit and the crash point's own marker on stderr) before any invariant is checked."""

from __future__ import annotations

from paygate_cli.crashpoints import MARKER
from tests.support.cli import Result, run_proc


def crash_environ(environ: dict[str, str], point: str) -> dict[str, str]:
    return {**environ, "PAYGATE_ENABLE_CRASHPOINTS": "1", "PAYGATE_CRASH_AT": point}


def assert_crashed_at(result: Result, point: str) -> None:
    assert result.code == -9, f"expected a SIGKILL at {point}, got exit {result.code}\n{result.err[-3000:]}"
    assert f"{MARKER} {point}\n" in result.err, f"the process died, but not at {point}:\n{result.err[-3000:]}"


def crash_tick(environ: dict[str, str], worker: str, point: str, *args: str, timeout: float = 60) -> Result:
    """One real tick process (a fresh OS process) that must die at `point`."""
    result = run_proc("run-tick", worker, "--once", "--json", *args, environ=crash_environ(environ, point),
                      timeout=timeout)
    assert_crashed_at(result, point)
    return result
