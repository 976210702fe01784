"""The exit-code contract is written once (errors.ExitCode and EXIT_CODE_MEANINGS; the per-command
table in commands/_common.py), rendered in docs/exit-codes.md, and checked per command: the doc
equals the code, and the codes a command really ends in are the ones it declares."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from paygate_cli.app import COMMANDS
from paygate_cli.commands._common import COMMAND_EXIT_CODES
from paygate_cli.errors import EXIT_CODE_MEANINGS, ExitCode
from tests.support.cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "exit-codes.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", DOC, re.MULTILINE | re.DOTALL)
    assert match, title
    return match.group(1)


def test_the_doc_table_is_the_enum_exactly() -> None:
    rows = re.findall(r"^\| (\d+) \| `([A-Z_]+)` \| (.+) \|$", _section("The codes"), re.MULTILINE)
    documented = {int(code): (name, meaning) for code, name, meaning in rows}
    assert len(rows) == len(documented)  # no code twice
    assert documented == {int(c): (c.name, EXIT_CODE_MEANINGS[c]) for c in ExitCode}


def test_every_command_documents_exactly_the_codes_it_declares() -> None:
    rows = re.findall(r"^\| `([a-z-]+)` \| ([\d, ]+) \|$", _section("By command"), re.MULTILINE)
    documented = {command: {int(c) for c in codes.split(",")} for command, codes in rows}
    assert len(rows) == len(documented)
    assert set(COMMAND_EXIT_CODES) == set(COMMANDS) == set(documented)
    for command, codes in COMMAND_EXIT_CODES.items():
        assert codes <= set(ExitCode), command
        assert documented[command] == {int(c) for c in codes}, command


def test_what_a_command_module_returns_or_risks_is_declared() -> None:
    """A code the command's own module names (`ExitCode.X`), a database it connects to (69, 77, 78,
    1) and a confirmation it asks (2) must be declared for every command that module registers."""
    for command, (module_name, _) in COMMANDS.items():
        source = inspect.getsource(importlib.import_module(f"paygate_cli.commands.{module_name}"))
        declared = COMMAND_EXIT_CODES[command]
        named = {ExitCode[name] for name in re.findall(r"\bExitCode\.([A-Z_]+)", source)}
        assert named <= declared, (command, named - declared)
        if re.search(r"\bconnect\(", source):
            assert {ExitCode.UNAVAILABLE, ExitCode.NOPERM, ExitCode.CONFIG, ExitCode.FAILED} <= declared, command
        if re.search(r"\bconfirm\(", source):
            assert ExitCode.USAGE in declared, command


def test_the_readme_and_architecture_link_the_contract_instead_of_restating_it() -> None:
    for name in ("README.md", "docs/architecture.md"):
        text = (ROOT / name).read_text(encoding="utf-8")
        assert "exit-codes.md" in text, name
        assert not re.search(r"^\| 77 \|", text, re.MULTILINE), f"{name} restates the table"


# Each command that talks to Postgres, pointed at a socket where no server listens: it must end in
# 69 (after its bounded retries), and 69 must be one of its declared codes.
_DATABASE_COMMANDS = [
    ["status"], ["workers"], ["halt", "--reason", "x", "--yes"], ["resume", "--yes"],
    ["drain", "--instance", "h", "--force", "--yes"], ["undrain", "--instance", "h", "--yes"], ["migrate"],
    ["reconcile-report"], ["run-tick", "webhooks", "--once"], ["recover-check", "--yes"],
]


@pytest.mark.parametrize("args", _DATABASE_COMMANDS, ids=lambda a: a[0])
def test_a_database_outage_ends_in_a_declared_69(tmp_path: Path, args: list[str]) -> None:
    nowhere = f"postgresql:///postgres?host={tmp_path}&port=1&user=postgres"
    result = run_cli(*args, dsn=nowhere)
    assert result.code == ExitCode.UNAVAILABLE, (args, result.err)
    assert ExitCode.UNAVAILABLE in COMMAND_EXIT_CODES[args[0]]


@pytest.mark.parametrize("args", _DATABASE_COMMANDS, ids=lambda a: a[0])
def test_an_invalid_database_url_ends_in_a_declared_78(tmp_path: Path, args: list[str]) -> None:
    bogus = f"postgresql:///postgres?host={tmp_path}&port=1&user=postgres&sslmode=bogus"
    result = run_cli(*args, dsn=bogus)
    assert result.code == ExitCode.CONFIG, (args, result.err)
    assert "invalid sslmode value" in result.err
    assert ExitCode.CONFIG in COMMAND_EXIT_CODES[args[0]]
