"""Named crash points for drills: PAYGATE_CRASH_AT=<name> with PAYGATE_ENABLE_CRASHPOINTS=1 kills
the process hard (SIGKILL, no cleanup, no atexit) exactly there. Ignored otherwise."""

from __future__ import annotations

import os
import signal


def crashpoint(name: str) -> None:
    if os.environ.get("PAYGATE_ENABLE_CRASHPOINTS") == "1" and os.environ.get("PAYGATE_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
