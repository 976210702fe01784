"""Run paygate the way users do: in-process through main() with an injected Env (fast), or as a
real subprocess (for locks, signals, kills and everything that must be a separate process)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from paygate_cli import secrets
from paygate_cli.__main__ import main
from paygate_cli.env import Env


@dataclass
class Result:
    code: int
    out: str
    err: str


class _FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def base_environ(dsn: str | None, **extra: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PAYGATE_")}
    environ.pop("JOURNAL_STREAM", None)
    environ["XDG_CONFIG_HOME"] = "/nonexistent-paygate-test-config"  # never read a developer's own config
    if dsn:
        environ["PAYGATE_DATABASE_URL"] = dsn
    environ.update(extra)
    return environ


def run_cli(*args: str, dsn: str | None = None, environ: dict[str, str] | None = None,
            stdin: str = "", tty: bool = False, **extra: str) -> Result:
    out, err = io.StringIO(), io.StringIO()
    env = Env(stdin=_FakeTTY(stdin) if tty else io.StringIO(stdin), stdout=out, stderr=err,
              environ=environ if environ is not None else base_environ(dsn, **extra))
    # A new process has read no secret yet: forget what earlier in-process runs registered for
    # scrubbing, so one test's secrets never change how another's output is redacted.
    secrets._REVEALED.clear()
    code = main(list(args), env=env)
    return Result(int(code), out.getvalue(), err.getvalue())


def paygate_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "paygate_cli", *args]


def run_proc(*args: str, dsn: str | None = None, environ: dict[str, str] | None = None,
             timeout: float = 60, **extra: str) -> Result:
    proc = subprocess.run(paygate_cmd(*args), env=environ if environ is not None else base_environ(dsn, **extra),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def spawn(*args: str, dsn: str | None = None, environ: dict[str, str] | None = None, **extra: Any) -> subprocess.Popen:
    return subprocess.Popen(paygate_cmd(*args), env=environ if environ is not None else base_environ(dsn, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
