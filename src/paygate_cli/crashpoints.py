"""Named crash points for drills: PAYGATE_CRASH_AT=<name> with PAYGATE_ENABLE_CRASHPOINTS=1 kills
the process hard (SIGKILL, no cleanup, no atexit) exactly there. Ignored otherwise.

Just before dying it writes one line `PAYGATE_CRASHPOINT <name>` to stderr (a raw write, no
logging machinery, nothing buffered), so a drill can prove the process died at the point it names
and not somewhere else: exit -9 alone cannot tell two crash points apart."""

from __future__ import annotations

import os
import signal

MARKER = "PAYGATE_CRASHPOINT"


def crashpoint(name: str) -> None:
    if os.environ.get("PAYGATE_ENABLE_CRASHPOINTS") == "1" and os.environ.get("PAYGATE_CRASH_AT") == name:
        os.write(2, f"{MARKER} {name}\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)
