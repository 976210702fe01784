"""Every third-party module paygate imports is a declared dependency of the wheel. A module that only
arrives through another package (or through the test extras) works in this venv and crashes an
installed wheel the day that package stops bringing it in."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "paygate_cli"


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_dependencies() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {_normalise(re.match(r"[A-Za-z0-9._-]+", spec).group(0)) for spec in project["dependencies"]}


def third_party_imports() -> dict[str, set[str]]:
    """Top-level module -> the files importing it, for every absolute import in src/ that is neither
    the standard library nor paygate_cli itself (lazy imports inside functions included)."""
    found: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "paygate_cli":
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_third_party_import_is_a_declared_dependency() -> None:
    imports = third_party_imports()
    assert {"psycopg", "stellar_sdk", "typer"} <= set(imports)  # the walk sees the imports at all
    providers = packages_distributions()
    declared = declared_dependencies()
    undeclared = {}
    for module, files in sorted(imports.items()):
        distributions = {_normalise(d) for d in providers.get(module, [])}
        if not distributions & declared:
            undeclared[module] = (sorted(distributions) or ["not installed"], sorted(files))
    assert undeclared == {}, f"imported by src/ but not in [project] dependencies: {undeclared}"
