"""Long operations show progress to a person at a terminal and nothing anywhere else: off a TTY (the
normal subprocess: cron, a pipe, a log) `migrate`, `reconcile-report`, `replay` and `drain --wait`
write no progress noise to stdout or stderr; with stderr on a real pseudo-terminal, `migrate` of an
empty database draws its progress line there (and stdout, a pipe, carries only the result)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import time

from paygate_cli.errors import ExitCode
from tests.support.cli import base_environ, paygate_cmd, run_proc

# What a drawn progress line is made of: rich's cursor and erase sequences, a carriage return, its
# bar and spinner glyphs.
NOISE = ("\x1b[", "\r", "━", "⠋", "⠙", "⠹")


def test_off_a_terminal_long_operations_say_nothing_but_their_result(empty_dsn: str) -> None:
    runs = {
        "migrate": run_proc("migrate", dsn=empty_dsn),
        "reconcile-report": run_proc("reconcile-report", dsn=empty_dsn),
        "replay": run_proc("replay", "webhooks", "--all-dead", "--dry-run", dsn=empty_dsn),
        "drain": run_proc("drain", "--instance", "progress-test", "--force", "--yes", "--wait", "5s", dsn=empty_dsn),
    }
    for name, result in runs.items():
        assert result.code == ExitCode.OK, (name, result.err)
        for stream in (result.out, result.err):
            assert not [n for n in NOISE if n in stream], (name, stream)
    assert runs["migrate"].err == "" and runs["migrate"].out.startswith("applied ")
    assert "in flight" not in runs["drain"].err and "waiting for in-flight work" not in runs["drain"].err


def test_on_a_terminal_migrate_draws_its_progress_on_stderr(empty_dsn: str) -> None:
    controller, terminal = pty.openpty()
    environ = base_environ(empty_dsn, TERM="xterm-256color", COLUMNS="120")
    proc = subprocess.Popen(paygate_cmd("migrate"), env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=terminal, text=False)
    os.close(terminal)
    drawn = b""
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # the child closed its end
                    break
                if not chunk:
                    break
                drawn += chunk
            elif proc.poll() is not None:
                break
        out = proc.communicate(timeout=30)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(controller)
    assert proc.returncode == ExitCode.OK, drawn[-2000:]
    text = drawn.decode(errors="replace")
    # which files a frame catches depends on the machine's speed; the first frame always names one
    assert re.search(r"migrate: \w+\.sql", text), text[-2000:]
    assert "/" in text and "\x1b[" in text  # a count of files and rich's redrawing
    assert out.startswith("applied ") and not [n for n in NOISE if n in out]
