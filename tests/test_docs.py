"""The README and docs/ stand alone in a clone and agree with the code they describe."""

from __future__ import annotations

import re
from pathlib import Path

from paygate_cli.db.locks import LOCK_NAMESPACE
from paygate_cli.errors import ExitCode

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def test_readme_starts_with_make_demo_and_make_test() -> None:
    body = README.split("\n", 1)[1].lstrip("\n")  # after the title
    assert body.startswith("```sh\nmake demo")
    first_block = body.split("```")[1]
    assert [line.split()[:2] for line in first_block.strip().splitlines()[1:]] == [["make", "demo"], ["make", "test"]]


def test_readme_is_self_contained() -> None:
    assert "../shared" not in README and "DESIGN.md" not in README
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).is_file(), target


def test_architecture_doc_covers_the_design() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert "../shared" not in text and "DESIGN.md" not in text
    for heading in ("Invariants", "Layout", "Ticks", "Stellar model", "Money paths", "Safety nets", "Exit codes"):
        assert re.search(rf"^## \d+\. {heading}", text, re.MULTILINE), heading


def test_lock_namespace_in_the_docs_is_the_codes() -> None:
    for text in (README, ARCHITECTURE.read_text(encoding="utf-8")):
        numbers = {int(n) for n in re.findall(r"\b(1[0-9]{9})\b", text)}
        assert numbers == {LOCK_NAMESPACE}, numbers


def test_readme_summarises_every_exit_code_and_links_the_contract() -> None:
    # The table itself is docs/exit-codes.md (tests/commands/test_exit_codes.py holds it to the code).
    section = README.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    summary = section.split("\n\n")[1]
    assert {int(code) for code in ExitCode} <= {int(n) for n in re.findall(r"\b(\d+)\b", summary)}
    assert "(docs/exit-codes.md)" in summary


def _docs() -> dict[str, str]:
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in paths}


def test_the_docs_name_the_metrics_files_the_code_writes() -> None:
    from paygate_cli.metrics import STATE_FILE, textfile_path

    assert Path(textfile_path("d", "funding", 0)).name == "paygate_funding_slot0.prom"
    assert Path(textfile_path("d", "funding", None)).name == "paygate_funding_start.prom"
    for name, text in _docs().items():
        stale = re.findall(r"paygate_<worker>\.prom", text)
        assert not stale, name
    assert "paygate_<worker>_slot<N>.prom" in README and "paygate_<worker>_start.prom" in README
    assert STATE_FILE in README


def test_the_readme_lists_every_command_and_worker() -> None:
    from paygate_cli.app import COMMANDS
    from paygate_cli.catalogue import WORKERS

    for command in COMMANDS:
        assert re.search(rf"`paygate {re.escape(command)}\b", README), command
    for worker in WORKERS:
        assert re.search(rf"^\| {worker} \|", README, re.MULTILINE), worker
    assert "(runbooks/README.md)" in README
