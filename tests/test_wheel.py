"""The wheel is what operators install (`pip install`, `pipx install`): built from a copy of this
checkout, installed with its declared dependencies (and nothing else) into a fresh venv, it must
migrate a database, run every worker and every command in every output format, with no
source tree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from paygate_cli.catalogue import RESERVED_WORKER_IDS, WORKERS
from paygate_cli.db.migrate import available_migrations
from tests.support.chain_env import JOURNAL_KEY_ID, chain_environ
from tests.support.cli import base_environ
from tests.support.devnet_support import start_devnet

ROOT = Path(__file__).resolve().parents[1]
# Build inputs only: no .venv, caches or .git, and nothing written into the checkout by the build.
_IGNORE = shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.egg-info", "build", "dist", ".demo")


def build_wheel(source: Path, tmp: Path) -> Path:
    tree = tmp / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(source / name, tree / name)
    # symlinks=True: a package that still linked its SQL from outside would ship the dangling link
    shutil.copytree(source / "src", tree / "src", symlinks=True, ignore=_IGNORE)
    # Build isolation, as `pip install .` and `pipx` do: the declared build backend, not whatever this venv has.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp / "dist"),
                    str(tree)], check=True, capture_output=True, timeout=300)
    [wheel] = (tmp / "dist").glob("paygate_cli-*.whl")
    return wheel


def _constraints(tmp: Path) -> Path:
    """The versions this test run has installed: the fresh venv resolves the wheel's declared
    dependencies from the package index (pip's cache and the machine's local wheels make that
    quick), pinned to what the rest of the suite tests, and it gets nothing the wheel does not ask for."""
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], check=True,
                            capture_output=True, text=True, timeout=120).stdout
    path = tmp / "constraints.txt"
    path.write_text("".join(line + "\n" for line in frozen.splitlines()
                            if line and not line.startswith(("#", "-e")) and "@" not in line
                            and not line.lower().startswith("paygate")))
    return path


def install_into_fresh_venv(wheel: Path, tmp: Path) -> Path:
    """A venv holding the wheel and its declared dependencies, nothing else: a module the code
    imports without declaring it (or that only the test extras bring) fails here as it would for an
    operator's `pip install`."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                              "--quiet", "--constraint", str(_constraints(tmp)), str(wheel)],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-4000:]
    return venv


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built and installed once for this module's tests."""
    tmp = tmp_path_factory.mktemp("wheel")
    return install_into_fresh_venv(build_wheel(ROOT, tmp), tmp)


@pytest.mark.slow
def test_wheel_installed_in_a_fresh_venv_migrates_and_runs(installed: Path, tmp_path: Path, empty_dsn: str) -> None:
    venv = installed
    environ = {k: v for k, v in base_environ(empty_dsn).items() if k != "PYTHONPATH"}
    paygate = str(venv / "bin" / "paygate")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([paygate, *args], env=environ, cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)

    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import paygate_cli.db.migrate as m; print(m.__file__); print(m.SQL_DIR)"],
                           env=environ, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split()
    assert where[0].startswith(str(venv)), where  # the installed copy, not this checkout
    sql_dir = Path(where[1])
    assert sql_dir.is_dir() and not sql_dir.is_symlink()
    shipped = sorted(p.name for p in sql_dir.glob("*.sql"))
    assert shipped == sorted(m.path.name for m in available_migrations())
    assert (sql_dir / "roles" / "runtime_role.sql").is_file()

    migrate = run("migrate", "--roles", "--json")
    assert migrate.returncode == 0, migrate.stderr
    assert len(json.loads(migrate.stdout)["migrate"]["applied"]) == len(shipped)
    status = run("status", "--json")
    report = json.loads(status.stdout)["status"]
    assert report["schema"]["schema_version"] == report["schema"]["expected_version"] == int(shipped[-1][:4])
    assert report["schema"]["pending"] == []
    # Ready: no worker has run, so none failed to start, and no work waits (this shell's missing RPC,
    # keys and contracts are not the fleet's: status judges the workers by their heartbeats).
    assert status.returncode == 0 and report["problems"] == [], report["problems"]
    # Every worker of the catalogue, once, from the installed copy against a devnet, with nothing
    # queued: a complete money-mover environment (one devnet: the single-endpoint dev override).
    devnet = start_devnet(tmp_path / "devnet")
    try:
        chain = chain_environ(devnet, empty_dsn, tmp_path / "keys")
        chain = {k: v for k, v in chain.items() if k != "PYTHONPATH"}
        chain["PAYGATE_OBSERVER_START_LEDGER"] = str(devnet.latest_ledger())
        ran = {}
        for worker in sorted(WORKERS):
            tick = subprocess.run([paygate, "run-tick", worker, "--once", "--json"], env=chain, cwd=tmp_path,
                                  capture_output=True, text=True, timeout=120)
            ran[worker] = tick.returncode
            assert tick.returncode == 0, (worker, tick.returncode, tick.stderr)
            summary = json.loads(tick.stdout)["run_tick"]
            assert (summary["worker"], summary["ticks"]) == (worker, 1), tick.stdout
        assert sorted(ran) == sorted(RESERVED_WORKER_IDS) and len(ran) == 14, ran
    finally:
        devnet.stop()
    assert os.access(venv / "bin" / "paygate", os.X_OK)


# Every command the installed wheel has, found by walking its own CLI (so a new command is covered or
# this test says it is not): the leaf paths, their options, and the choices of a `--format`.
_WALK = r"""
import json, re, typer
from paygate_cli.app import make_app
def walk(cmd, path):
    options = sorted(o for p in cmd.params for o in getattr(p, "opts", ()) if o.startswith("--"))
    formats = [re.split(r"\s*\|\s*", p.help.split("(")[0].strip()) for p in cmd.params
               if "--format" in getattr(p, "opts", ())]
    rows = [{"path": path, "group": hasattr(cmd, "commands"), "options": options,
             "formats": formats[0] if formats else []}]
    for name, sub in getattr(cmd, "commands", {}).items():
        rows += walk(sub, [*path, name])
    return rows
print(json.dumps(walk(typer.main.get_command(make_app()), [])))
"""

# Commands that write, serve or start things: their --help runs from the wheel, and they are run for
# real elsewhere (migrate and run-tick above, the rest in their own tests against this same code).
HELP_ONLY = {("demo",), ("devnet", "start"), ("devnet", "fund"), ("devnet", "close"), ("devnet", "fault"),
             ("devnet", "advance"), ("devnet", "limits"), ("dev", "db", "up"), ("dev", "db", "down"),
             ("dev", "db", "url"), ("migrate",), ("run-tick",),
             ("halt",), ("resume",), ("undrain",),
             # read-only, but every unit it traces must exist (an empty database has none: exit 2); run for
             # real in tests/commands/test_trace_cli.py
             ("trace",)}


def _read_only_invocations(devnet_url: str, out_file: Path) -> dict[tuple[str, ...], list[list[str]]]:
    """Each read-only command and the arguments it is run with; the test adds every output format
    the command offers (its --json, --plain and each --format choice, as the wheel's CLI declares
    them) to each, and runs the default, human one too."""
    return {
        ("status",): [[]],
        ("top",): [["--once"]],
        ("workers",): [[], ["--offline"]],
        ("config", "show"): [[], ["--sources"]],
        ("nonce-inspect",): [[]],
        # the groups an empty database and one devnet can answer (1: one read host, the override set)
        ("doctor",): [["--only", "config,rpc,journal,clock,metrics"]],
        ("key-retire-check",): [[JOURNAL_KEY_ID]],
        ("reconcile-report",): [[], ["--out", str(out_file)]],
        ("replay",): [[queue, "--all-dead", "--dry-run"] for queue in ("webhooks", "deposits", "relays", "bot_jobs")],
        ("drain",): [["--instance", "wheel-test", "--force", "--dry-run"]],
        ("recover-check",): [["--dry-run"]],
        ("devnet", "state"): [["--url", devnet_url]],
        ("completion",): [[shell] for shell in ("bash", "zsh", "fish")],
    }


def _runs_for(command: dict, invocations: list[list[str]]) -> list[list[str]]:
    formats = [[], *[[f] for f in ("--json", "--plain") if f in command["options"]],
               *[["--format", f] for f in command["formats"]]]
    return [[*command["path"], *args, *fmt] for args in invocations
            for fmt in (formats if "--out" not in args else [[]])]


@pytest.mark.slow
def test_every_command_and_output_format_runs_from_the_wheel(installed: Path, tmp_path: Path,
                                                             empty_dsn: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    paygate = str(installed / "bin" / "paygate")
    python = str(installed / "bin" / "python")
    environ = {k: v for k, v in base_environ(empty_dsn).items() if k != "PYTHONPATH"}
    # Nothing but the wheel's declared dependencies: the test extras are not importable here.
    probe = subprocess.run([python, "-c", "import importlib.util as u; print([m for m in ('pytest', 'hypothesis', "
                            "'pgqueuer', 'asyncpg') if u.find_spec(m)])"], env=environ, cwd=tmp_path,
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "[]", probe.stdout
    commands = json.loads(subprocess.run([python, "-c", _WALK], env=environ, cwd=tmp_path, capture_output=True,
                                         text=True, check=True).stdout)
    leaves = [c for c in commands if not c["group"]]
    assert len(leaves) >= 20, [c["path"] for c in leaves]

    def run(args: list[str], env: dict[str, str]) -> tuple[list[str], subprocess.CompletedProcess[str]]:
        return args, subprocess.run([paygate, *args], env=env, cwd=tmp_path, capture_output=True, text=True,
                                    timeout=120, stdin=subprocess.DEVNULL)

    devnet = start_devnet(tmp_path / "devnet")
    try:
        chain = {k: v for k, v in chain_environ(devnet, empty_dsn, tmp_path / "keys").items() if k != "PYTHONPATH"}
        assert run(["migrate", "--json"], chain)[1].returncode == 0
        invocations = _read_only_invocations(devnet.url, tmp_path / "report.txt")
        # Every leaf is run for real in every format it offers, or is deliberately help-only.
        unclassified = [c["path"] for c in leaves if tuple(c["path"]) not in {*invocations, *HELP_ONLY}]
        assert unclassified == [], f"new commands: add them to _read_only_invocations or HELP_ONLY: {unclassified}"
        runs = [run for c in leaves if tuple(c["path"]) in invocations
                for run in _runs_for(c, invocations[tuple(c["path"])])]
        assert ["reconcile-report", "--format", "markdown"] in runs and ["status", "--plain"] in runs
        helps = [[*c["path"], "--help"] for c in commands] + [["--version"]]
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(lambda a: run(a, chain), helps + runs))
    finally:
        devnet.stop()
    for args, proc in results:
        what = f"paygate {' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
        assert "Traceback" not in proc.stderr and "No module named" not in proc.stderr, what
        if args[-1] == "--help" or args == ["--version"]:
            assert proc.returncode == 0 and proc.stdout.strip(), what
            continue
        # Read-only, against an empty database and a live devnet: 0, 1 (`status` not ready) or 3 (the
        # active journal key is not retirable): never 70, 78 or 69.
        assert proc.returncode in (0, 1, 3), what
        if "--json" in args or args[-2:] == ["--format", "json"]:
            document = json.loads(proc.stdout)
            assert "schema_version" in document, what
        elif "--out" in args:
            assert (tmp_path / "report.txt").read_text().strip(), what
