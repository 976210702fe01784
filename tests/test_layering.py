"""The package's import edges point one way (docs/architecture.md §2). Every module of src/paygate_cli
is read with `ast` (imports at the top, inside functions and under TYPE_CHECKING alike; relative
imports resolved) and each edge is held against the layers' allowed edges below. A failure lists
every violating edge as file:line."""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "paygate_cli"

# Root modules every layer may import (and that import only each other).
BASE = frozenset({"errors", "env", "settings", "secrets", "logs", "metrics", "crashpoints", "context", "endpoints"})

# Layer -> the layers it may import, besides itself. Imports within one layer are allowed, except
# between workers (no worker imports another) and between commands' private names (see below).
ALLOWED: dict[str, frozenset[str]] = {
    "base": frozenset(),
    "db": frozenset({"base"}),
    "chain": frozenset({"db", "base"}),
    "journal": frozenset({"chain", "db", "base"}),
    # queues -> journal: SQL text and constants, taken when the queue module is imported (checked below)
    "queues": frozenset({"journal", "db", "base"}),
    "catalogue": frozenset({"db", "base"}),
    "state": frozenset({"queues", "db", "base"}),
    # workers -> catalogue: recovery resolves the owning worker's take_over through it, lazily, as
    # the tick runner resolves a tick target (the catalogue sits below journal/ and workers/)
    "workers": frozenset({"queues", "journal", "chain", "catalogue", "db", "base"}),
    "ops": frozenset({"state", "catalogue", "queues", "journal", "chain", "db", "base"}),
    # ticks reach the workers only through the catalogue's lazy resolver (importlib, not an import)
    "ticks": frozenset({"state", "catalogue", "queues", "journal", "chain", "db", "base"}),
    # output renders for the commands (rich); nothing below the commands prints through it
    "output": frozenset({"base"}),
    # commands parse, call ops/ or ticks/, render: no worker, queue, journal or chain code of their own
    "commands": frozenset({"ops", "ticks", "output", "state", "catalogue", "db", "base", "sandbox"}),
    # the sandbox (devnet, demo, dev cluster) drives the real code; only a few commands reach it
    "sandbox": frozenset({"ops", "ticks", "output", "state", "catalogue", "workers", "queues", "journal",
                          "chain", "db", "base"}),
    # nothing imports commands/ but app.py (and commands themselves)
    "app": frozenset({"commands", "base"}),
    "main": frozenset({"app", "output", "db", "base"}),
}

# Each layer's rank: ALLOWED points strictly down it (a test holds this), so the layers form no cycle.
RANK = {"base": 0, "db": 1, "chain": 2, "catalogue": 2, "journal": 3, "queues": 4, "state": 5, "workers": 5,
        "ops": 6, "ticks": 6, "output": 6, "sandbox": 7, "commands": 8, "app": 9, "main": 10}

# Only these command modules may import the sandbox.
SANDBOX_COMMANDS = frozenset({"commands.dev", "commands.devnet", "commands.demo"})
# Third-party packages kept to their layers: what each may be imported from (a module path prefix).
CONFINED = {
    "stellar_sdk": ("chain", "sandbox.devnet"),
    "typer": ("commands", "app", "__main__"),
    "rich": ("commands", "app", "__main__", "output"),
}

# The command modules that open connections: only the shared one, commands/_common.py (open_db),
# which hands db/connect.py's Connection on; no command imports psycopg or runs SQL.
CONNECTING_COMMANDS = frozenset({"commands._common"})

def layer_of(module: str) -> str:
    """`module` relative to the package (`ops.status`, `state`, `__main__`)."""
    head = module.split(".")[0]
    if head == "__main__":
        return "main"
    if head in BASE or head == "__init__":
        return "base"
    return head


@dataclass(frozen=True)
class Edge:
    path: str  # file, relative to the source root
    line: int
    importer: str  # module, relative to the package
    imported: str  # module (or top-level third-party package)
    names: tuple[str, ...]  # `from x import a, b`: (a, b); `import x`: ()

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.imported.removeprefix('external:')}" + (
            f" ({', '.join(self.names)})" if self.names else "")


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package under `root`, by its name relative to the package."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root / PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1] or ["__init__"]
        found[".".join(parts)] = path
    return found


def edges(root: Path) -> list[Edge]:
    known = modules(root)
    found = []
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        rel = str(path.relative_to(root.parent))  # src/paygate_cli/...
        for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found.append(_edge(rel, node.lineno, name, alias.name, (), known))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".") if package and package != "__init__" else []
                    base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                    target = ".".join([PACKAGE, *base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                names = tuple(alias.name for alias in node.names)
                # `from paygate_cli.ops import status`: each name that is a module is its own edge
                sub = [n for n in names if _relative(f"{target}.{n}") in known]
                if sub and target.startswith(PACKAGE):
                    found += [_edge(rel, node.lineno, name, f"{target}.{n}", (), known) for n in sub]
                    rest = tuple(n for n in names if n not in sub)
                    if rest:
                        found.append(_edge(rel, node.lineno, name, target, rest, known))
                else:
                    found.append(_edge(rel, node.lineno, name, target, names, known))
    return found


def _relative(dotted: str) -> str:
    if dotted == PACKAGE:
        return "__init__"
    return dotted.removeprefix(PACKAGE + ".")


def _edge(path: str, line: int, importer: str, dotted: str, names: tuple[str, ...], known: dict[str, Path]) -> Edge:
    if dotted == PACKAGE or dotted.startswith(PACKAGE + "."):
        return Edge(path, line, importer, _relative(dotted), names)
    return Edge(path, line, importer, "external:" + dotted.split(".")[0], names)


def _within(module: str, prefixes: tuple[str, ...] | frozenset[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(root: Path) -> list[str]:
    """Every edge of the package under `root` that breaks a rule, with its file:line and the rule."""
    found = []
    for edge in edges(root):
        importer, imported = edge.importer, edge.imported
        if imported.startswith("external:"):
            package = imported.removeprefix("external:")
            allowed = CONFINED.get(package)
            if allowed is not None and not _within(importer, allowed):
                found.append(f"{edge}: {package} is imported only in {', '.join(allowed)}")
            if package == "psycopg" and layer_of(importer) == "commands":
                found.append(f"{edge}: commands run no SQL: psycopg stays below them")
            continue
        source, target = layer_of(importer), layer_of(imported)
        if target not in ALLOWED:
            found.append(f"{edge}: {target} is not a known layer (add it to ALLOWED)")
            continue
        if source != target and target not in ALLOWED.get(source, frozenset()):
            found.append(f"{edge}: {source} may not import {target}")
            continue
        if source == "workers" == target and importer != imported and imported != "workers":
            found.append(f"{edge}: a worker imports another worker")
        if source == "commands" and imported == "db.connect" and importer not in CONNECTING_COMMANDS:
            found.append(f"{edge}: commands reach the database through commands._common.open_db")
        if target == "sandbox" and source == "commands" and importer not in SANDBOX_COMMANDS:
            found.append(f"{edge}: only {', '.join(sorted(SANDBOX_COMMANDS))} import the sandbox")
        if source == target == "commands" and imported not in ("commands", "commands._common", importer):
            private = [n for n in edge.names if n.startswith("_")]
            if private:
                found.append(f"{edge}: a command takes another command's private name(s)")
    found += _journal_code_in_queues(root)
    return found


def _journal_code_in_queues(root: Path) -> list[str]:
    """queues -> journal is for constants: SQL text and column lists, read or built when the queue
    module is imported. A journal name used inside a function of a queue module runs journal code
    when a statement runs, which belongs in the worker (or the journal) instead."""
    found = []
    for name, path in modules(root).items():
        if layer_of(name) != "queues":
            continue
        rel = str(path.relative_to(root.parent))
        tree = ast.parse(path.read_text(), filename=rel)
        bound: set[str] = set()  # the names the module binds to journal/ (modules or their members)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and _is_journal(node):
                bound |= {alias.asname or alias.name for alias in node.names}
            elif isinstance(node, ast.Import):  # import paygate_cli.journal.lineage as lineages
                bound |= {alias.asname for alias in node.names
                          if alias.asname and alias.name.startswith(PACKAGE + ".journal")}
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Name) and node.id in bound:
                    found.append(f"{rel}:{node.lineno}: {name} uses {node.id} (journal/) inside a function: "
                                 "queues take only constants from journal/")
    return sorted(set(found))


def _is_journal(node: ast.ImportFrom) -> bool:
    module = node.module or ""
    if node.level:  # from ..journal import lineage, from .. import journal (from within queues/)
        if node.level == 2 and not module:
            return any(alias.name == "journal" for alias in node.names)
        return node.level == 2 and (module == "journal" or module.startswith("journal."))
    return module == PACKAGE + ".journal" or module.startswith(PACKAGE + ".journal.")


def test_the_package_imports_point_one_way() -> None:
    found = violations(SRC)
    assert not found, "import edges against docs/architecture.md §2:\n" + "\n".join(found)


def test_every_module_belongs_to_a_layer() -> None:
    unknown = sorted({layer_of(m) for m in modules(SRC)} - set(ALLOWED))
    assert not unknown, f"modules outside every layer (add them to ALLOWED): {unknown}"


def test_the_allowed_edges_point_down_the_ranks() -> None:
    assert set(RANK) == set(ALLOWED)
    upward = sorted((layer, other) for layer, others in ALLOWED.items() for other in others
                    if RANK[other] >= RANK[layer])
    assert not upward, f"ALLOWED edges that do not point to a lower rank: {upward}"


# --- the checker itself fails on planted violations ----------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name in ("__init__.py", "errors.py", "commands/__init__.py", "commands/_common.py",
                 "commands/status.py", "workers/__init__.py", "workers/funding.py", "ops/__init__.py",
                 "ticks/__init__.py", "sandbox/__init__.py", "journal/__init__.py", "journal/lineage.py",
                 "queues/__init__.py", "chain/__init__.py"):
        (tmp_path / PACKAGE / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / PACKAGE / name).write_text("")
    for name, text in files.items():
        (tmp_path / PACKAGE / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / PACKAGE / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize(("files", "expected"), [
    ({"workers/x.py": "from paygate_cli.commands.status import status_command\n"},
     "workers/x.py:1: workers.x imports commands.status (status_command): workers may not import commands"),
    ({"workers/x.py": "def tick():\n    from paygate_cli.workers import funding\n"},
     "workers/x.py:2: workers.x imports workers.funding: a worker imports another worker"),
    ({"workers/x.py": "from . import funding\n"},
     "workers/x.py:1: workers.x imports workers.funding: a worker imports another worker"),
    ({"ops/x.py": "from ..ticks import runner\n"}, "ops may not import ticks"),
    ({"ticks/x.py": "import paygate_cli.ops.status\n"}, "ticks may not import ops"),
    ({"ops/x.py": "from paygate_cli.sandbox import demo\n"}, "ops may not import sandbox"),
    ({"commands/x.py": "from paygate_cli.sandbox.devnet import runner\n"}, "import the sandbox"),
    ({"commands/x.py": "from paygate_cli.commands.status import _progress\n"}, "private name"),
    ({"queues/x.py": "from paygate_cli.journal.lineage import free_lane_ctes\n\n"
                     "def claim():\n    return free_lane_ctes()\n"}, "queues/x.py:4: queues.x uses free_lane_ctes"),
    ({"queues/x.py": "from ..journal import lineage as lineages\n\n"
                     "def claim(conn):\n    return lineages.allocate(conn)\n"}, "inside a function"),
    ({"ops/x.py": "import typer\n"}, "typer is imported only in"),
    ({"commands/x.py": "from paygate_cli.db.connect import connect\n"}, "through commands._common.open_db"),
    ({"commands/x.py": "import psycopg\n"}, "psycopg stays below them"),
    ({"journal/x.py": "from stellar_sdk import xdr\n"}, "stellar_sdk is imported only in"),
    ({"errors.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from paygate_cli.db import connect\n"},
     "errors.py:3: errors imports db (connect): base may not import db"),
])
def test_the_checker_fails_on_a_planted_violation(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    found = violations(_tree(tmp_path, files))
    assert any(expected in line for line in found), found


def test_the_checker_passes_allowed_edges(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "commands/x.py": "from paygate_cli.commands._common import get_env\nfrom . import status\n",
        "queues/x.py": "from paygate_cli.journal import lineage as lineages\n"
                       "CLAIM_SQL = 'SELECT ' + lineages.free_lane_ctes()\n",
        "chain/x.py": "from stellar_sdk import xdr\nfrom .. import errors\n",
        "workers/x.py": "from paygate_cli.queues import x\nfrom paygate_cli.journal.lineage import LIVE_STATES\n",
    })
    assert violations(root) == []


def test_the_real_tree_with_one_upward_import_planted_fails(tmp_path: Path) -> None:
    shutil.copytree(SRC / PACKAGE, tmp_path / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    funding = tmp_path / PACKAGE / "workers" / "funding.py"
    funding.write_text(funding.read_text() + "\n\ndef _planted() -> None:\n"
                       "    from paygate_cli.ops.status import status  # upward: a worker reaching ops/\n")
    found = violations(tmp_path)
    [violation] = found
    assert "workers/funding.py:" in violation and "workers.funding imports ops.status" in violation
