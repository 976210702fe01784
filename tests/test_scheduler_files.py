"""The scheduler definitions name real workers and flags that parse (a renamed flag breaks CI)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from paygate_cli.ticks.registry import WORKERS
from tests.cli import run_cli

ROOT = Path(__file__).resolve().parent.parent


def cron_commands() -> list[list[str]]:
    commands = []
    for line in (ROOT / "crontab.example").read_text().splitlines():
        if re.match(r"^[\d*/,-]+\s", line):
            words = shlex.split(line.split("2>>")[0])
            commands.append(words[words.index("paygate") + 1:])
    return commands


def k8s_commands() -> list[list[str]]:
    commands = []
    for path in (ROOT / "jobs" / "k8s").glob("*.yaml"):
        match = re.search(r"args: (\[.*\])", path.read_text())
        assert match, path
        commands.append([w.strip(' "') for w in match.group(1).strip("[]").split(",")])
    return commands


def systemd_commands() -> list[list[str]]:
    commands = []
    for env_file in (ROOT / "jobs" / "systemd").glob("tick-*.env"):
        worker = env_file.stem.removeprefix("tick-")
        args = re.search(r"PAYGATE_TICK_ARGS=(.*)", env_file.read_text()).group(1)
        commands.append(["run-tick", worker, *shlex.split(args)])
    return commands


def test_every_registered_worker_is_scheduled_everywhere() -> None:
    for commands in (cron_commands(), k8s_commands(), systemd_commands()):
        assert {c[1] for c in commands} == set(WORKERS)


@pytest.mark.parametrize("command", cron_commands() + k8s_commands() + systemd_commands(),
                         ids=lambda c: " ".join(c))
def test_scheduled_command_parses(command: list[str]) -> None:
    assert command[0] == "run-tick" and command[1] in WORKERS
    result = run_cli(*command, "--help")  # click rejects unknown flags before --help exits
    assert result.code == 0, result.err
