"""The wheel is what operators install (`pip install`, `pipx install`): built from a copy of this
checkout, installed into a fresh venv, it must migrate a database and run every worker, with no
source tree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from paygate_cli.db.migrate import available_migrations
from paygate_cli.ticks.registry import RESERVED_WORKER_IDS, WORKERS
from tests.chain_env import chain_environ
from tests.cli import base_environ
from tests.devnet_support import start_devnet

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


def install_into_fresh_venv(wheel: Path, tmp: Path) -> Path:
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True, timeout=300)
    # The dependencies come from this test run's environment (no network in CI); paygate_cli itself
    # only from the wheel: the fresh site-packages precedes the path added here.
    probe = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", probe],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "zz_test_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


@pytest.mark.slow
def test_wheel_installed_in_a_fresh_venv_migrates_and_runs(tmp_path: Path, empty_dsn: str) -> None:
    venv = install_into_fresh_venv(build_wheel(ROOT, tmp_path), tmp_path)
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
    # Not ready only because no RPC, keys or contracts are configured here: nothing else is wrong.
    assert status.returncode == 1 and all("cannot work" in p for p in report["problems"]), report["problems"]
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
        assert sorted(ran) == sorted(RESERVED_WORKER_IDS) and len(ran) == 13, ran
    finally:
        devnet.stop()
    assert os.access(venv / "bin" / "paygate", os.X_OK)
