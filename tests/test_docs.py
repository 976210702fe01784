"""The README and docs/ stand alone in a clone and agree with the code they describe."""

from __future__ import annotations

import re
from pathlib import Path

from paygate_cli.db.locks import LOCK_NAMESPACE
from paygate_cli.errors import ExitCode

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"
WORKERS_DOC = DOCS / "workers.md"
CONFIGURATION_DOC = DOCS / "configuration.md"
README_MAX_BYTES = 8192


def _docs() -> dict[str, str]:
    paths = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in paths}


def _project_texts() -> dict[str, str]:
    """Every text file a reader or a reviewer reads: src/, tests/, bench/, docs/, runbooks/, README."""
    suffixes = {".py", ".md", ".sql", ".toml", ".yml", ".yaml", ".sh", ".txt"}
    texts = {"README.md": README}
    for top in ("src", "tests", "bench", "docs", "runbooks"):
        for path in sorted((ROOT / top).rglob("*")):
            if (path.is_file() and path.suffix in suffixes and "__pycache__" not in path.parts
                    and not any(part.endswith(".egg-info") for part in path.parts)):
                texts[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8", errors="replace")
    return texts


def test_readme_starts_with_make_demo_and_make_test() -> None:
    body = README.split("\n", 1)[1].lstrip("\n")  # after the title
    assert body.startswith("```sh\nmake demo")
    first_block = body.split("```")[1]
    assert [line.split()[:2] for line in first_block.strip().splitlines()[1:]] == [["make", "demo"], ["make", "test"]]


def test_readme_is_a_front_door() -> None:
    assert len(README.encode("utf-8")) <= README_MAX_BYTES, len(README.encode("utf-8"))


def test_the_docs_are_self_contained() -> None:
    for name, text in _docs().items():
        assert "../shared" not in text, name


def test_architecture_doc_covers_the_design() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    for heading in ("Invariants", "Layout", "Ticks", "Stellar model", "Money paths", "Safety nets", "Exit codes"):
        assert re.search(rf"^## \d+\. {heading}", text, re.MULTILINE), heading


def test_lock_namespace_in_the_docs_is_the_codes() -> None:
    for name, text in _docs().items():
        numbers = {int(n) for n in re.findall(r"\b(1[0-9]{9})\b", text)}
        assert numbers <= {LOCK_NAMESPACE}, (name, numbers)
    for path in (WORKERS_DOC, ARCHITECTURE):
        assert str(LOCK_NAMESPACE) in path.read_text(encoding="utf-8"), path.name


def test_readme_summarises_every_exit_code_and_links_the_contract() -> None:
    # The table itself is docs/exit-codes.md (tests/commands/test_exit_codes.py holds it to the code).
    section = README.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    summary = section.split("\n\n")[1]
    assert {int(code) for code in ExitCode} <= {int(n) for n in re.findall(r"\b(\d+)\b", summary)}
    assert "(docs/exit-codes.md)" in summary


def test_the_docs_name_the_metrics_files_the_code_writes() -> None:
    from paygate_cli.metrics import STATE_FILE, textfile_path

    assert Path(textfile_path("d", "funding", 0)).name == "paygate_funding_slot0.prom"
    assert Path(textfile_path("d", "funding", None)).name == "paygate_funding_start.prom"
    for name, text in _docs().items():
        stale = re.findall(r"paygate_<worker>\.prom", text)
        assert not stale, name
    workers_doc = WORKERS_DOC.read_text(encoding="utf-8")
    assert "paygate_<worker>_slot<N>.prom" in workers_doc and "paygate_<worker>_start.prom" in workers_doc
    assert STATE_FILE in workers_doc


def test_the_readme_lists_every_command_and_the_workers_doc_every_worker() -> None:
    from paygate_cli.app import COMMANDS
    from paygate_cli.catalogue import WORKERS

    for command in COMMANDS:
        assert re.search(rf"`paygate {re.escape(command)}\b", README), command
    workers_doc = WORKERS_DOC.read_text(encoding="utf-8")
    for worker in WORKERS:
        assert re.search(rf"^\| {worker} \|", workers_doc, re.MULTILINE), worker
    assert "(runbooks/README.md)" in README


def _table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the first table under `## heading`, header and rule rows dropped."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]


def test_the_configuration_doc_is_every_setting_with_its_variable_and_default() -> None:
    from paygate_cli.settings import FIELD_BY_NAME, SECRETS, URL_FILES, env_var

    text = CONFIGURATION_DOC.read_text(encoding="utf-8")
    rows = {row[0].strip("`"): row for row in _table_rows(text, "Settings")}
    assert set(rows) == set(FIELD_BY_NAME)
    for name, (_, variable, default, *_rest) in rows.items():
        field = FIELD_BY_NAME[name]
        assert variable.strip("`") == env_var(name), name
        if default == "—":
            assert field.default in (None, [], {}), name
        else:
            assert field.parse(default.strip("`"), name) == field.default, name
    secrets = {row[0].strip("`"): row for row in _table_rows(text, "Secrets")}
    assert set(secrets) == set(SECRETS)
    for name, (_, variable, credential, *_rest) in secrets.items():
        assert variable.strip("`") == env_var(name) + "_FILE", name
        assert credential.strip("`") == name.replace("_", "-"), name
    for name in URL_FILES:
        assert env_var(name) + "_FILE" in text and name.replace("_", "-") in text and f"{name}_file" in text, name


# -- references, citations, links ---------------------------------------------------------------------

_DOC_REFERENCE = re.compile(r"(?:docs/([\w-]+)\.md|\b(architecture)\.md) §(\d+)")
_NUMBERED_HEADING = re.compile(r"^## (\d+)\. ", re.MULTILINE)


def test_every_section_reference_names_a_numbered_heading_of_that_doc() -> None:
    """`docs/<doc>.md §n` (or `architecture.md §n`, and a `§m` later on the same line before any other
    file is named) must be a `## n.` heading of that doc."""
    headings: dict[str, set[str]] = {}
    for path in DOCS.glob("*.md"):
        headings[path.stem] = set(_NUMBERED_HEADING.findall(path.read_text(encoding="utf-8")))
    broken = []
    for name, text in _project_texts().items():
        for line_number, line in enumerate(text.splitlines(), start=1):
            for match in _DOC_REFERENCE.finditer(line):
                doc = match.group(1) or match.group(2)
                rest = line[match.end():]
                rest = rest[:m.start()] if (m := re.search(r"\.md\b", rest)) else rest
                for section in [match.group(3), *re.findall(r"§(\d+)", rest)]:
                    if section not in headings.get(doc, set()):
                        broken.append(f"{name}:{line_number}: {doc}.md §{section}")
    assert not broken, broken


# Tracker references in the words people write them with. Contract error codes (`Error(Contract, #4)`)
# are not references: a bare `#n` counts only after a word that points at a tracker.
_TRACKER = re.compile(
    r"\b(?:issue|issues|task|tasks|ticket|tickets|PR|pull request)\s*#?\d+\b"
    r"|\b(?:see|fixes|fixed|closes|closed|refs?|per)\s+#\d+\b"
    r"|\b[A-Za-z][\w.-]*#\d+(?![\w-])"  # repo#123 (not a link's `doc.md#3-ticks` anchor)
    r"|/(?:issues|pull)/\d+\b",
    re.IGNORECASE)
_DESIGN_CITATION = re.compile(r"\bDESIGN(?: §|\.md)")
THIS_FILE = str(Path(__file__).resolve().relative_to(ROOT))


def test_no_tracker_number_and_no_design_citation_anywhere() -> None:
    found = []
    for name, text in _project_texts().items():
        if name == THIS_FILE:  # it spells the patterns
            continue
        for line_number, line in enumerate(text.splitlines(), start=1):
            for pattern in (_TRACKER, _DESIGN_CITATION):
                found += [f"{name}:{line_number}: {m.group(0)}" for m in pattern.finditer(line)]
    assert not found, found


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)  # no headings in code
    return {_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    broken = []
    for name, text in _docs().items():
        here = (ROOT / name).parent
        prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path_part, _, anchor = target.partition("#")
            path = (here / path_part).resolve() if path_part else ROOT / name
            if not path.exists():
                broken.append(f"{name}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path.read_text(encoding="utf-8")):
                broken.append(f"{name}: {target} (no such heading)")
    assert not broken, broken


def test_the_configuration_examples_use_only_real_keys() -> None:
    import tomllib

    from paygate_cli.settings import FIELD_BY_NAME, SECRETS, URL_FILES

    known = set(FIELD_BY_NAME) | {f"{name}_file" for name in (*SECRETS, *URL_FILES)}
    for text in (README, CONFIGURATION_DOC.read_text(encoding="utf-8")):
        examples = re.findall(r"^```toml\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
        assert examples
        for example in examples:
            assert set(tomllib.loads(example)) <= known, set(tomllib.loads(example)) - known
