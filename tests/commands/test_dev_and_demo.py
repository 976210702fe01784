"""`paygate dev db` and `paygate demo`, end to end with real processes and a real cluster."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from paygate_cli.errors import ExitCode
from tests.support.cli import base_environ, run_proc
from tests.support.dirs import public_tmp as public_tmp


def test_dev_db_up_url_down(public_tmp: Path) -> None:
    data = str(public_tmp / "pg")
    up = run_proc("dev", "db", "up", "--data-dir", data, "--json")
    try:
        assert up.code == 0, up.err
        dsn = json.loads(up.out)["dsn"]
        assert run_proc("dev", "db", "url", "--data-dir", data).out.strip() == dsn
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT 1").fetchone()[0] == 1
            # Unix socket only: nothing listens on TCP
            assert conn.execute("SHOW listen_addresses").fetchone()[0] == ""
        again = run_proc("dev", "db", "up", "--data-dir", data, "--json")
        assert json.loads(again.out)["started"] is False  # idempotent
    finally:
        down = run_proc("dev", "db", "down", "--data-dir", data, "--json")
    assert down.code == 0 and json.loads(down.out)["stopped"] is True


@pytest.fixture
def private_tmp() -> Iterator[Path]:
    """Like `d=$(mktemp -d)`: mode 0700, so as root the postgres OS user cannot traverse it."""
    path = Path(tempfile.mkdtemp())
    assert path.stat().st_mode & 0o777 == 0o700
    yield path
    for pointer in path.rglob("paygate-datadir"):
        shutil.rmtree(pointer.read_text().strip(), ignore_errors=True)
    shutil.rmtree(path, ignore_errors=True)


def test_dev_db_up_from_a_private_directory(private_tmp: Path) -> None:
    data = str(private_tmp / ".demo" / "pg")
    up = run_proc("dev", "db", "up", "--data-dir", data, "--json")
    try:
        assert up.code == 0, up.err
        document = json.loads(up.out)
        assert document["requested_data_dir"] == data
        assert run_proc("dev", "db", "url", "--data-dir", data).out.strip() == document["dsn"]
        with psycopg.connect(document["dsn"]) as conn:
            assert conn.execute("SELECT 1").fetchone()[0] == 1
        assert private_tmp.stat().st_mode & 0o777 == 0o700  # nobody chmod-ed the user's directory
        if os.geteuid() == 0:  # relocated to a private directory the postgres user owns, found via the pointer
            real = Path(document["data_dir"])
            assert real.parent == Path("/var/tmp") and real.owner() == "postgres"
            assert real.stat().st_mode & 0o777 == 0o700
            assert (Path(data) / "paygate-datadir").read_text().strip() == str(real)
    finally:
        down = run_proc("dev", "db", "down", "--data-dir", data, "--json")
    assert down.code == 0 and json.loads(down.out)["stopped"] is True, down.err
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(document["dsn"], connect_timeout=2)


def test_dev_db_up_with_the_default_data_dir_in_a_private_home(private_tmp: Path) -> None:
    """`paygate dev db up` with no flags, HOME private (as /root is): $HOME/.local/share/paygate/pg."""
    environ = {**base_environ(None), "HOME": str(private_tmp)}
    environ.pop("XDG_DATA_HOME", None)
    up = run_proc("dev", "db", "up", "--json", environ=environ)
    try:
        assert up.code == 0, up.err
        document = json.loads(up.out)
        assert document["requested_data_dir"] == str(private_tmp / ".local" / "share" / "paygate" / "pg")
        assert run_proc("dev", "db", "url", environ=environ).out.strip() == document["dsn"]
    finally:
        down = run_proc("dev", "db", "down", "--json", environ=environ)
    assert down.code == 0 and json.loads(down.out)["stopped"] is True, down.err


@pytest.fixture(scope="module")
def readable_by_nobody() -> Iterator[tuple[Path, Path]]:
    """This checkout's source and installed packages where the `nobody` user can read them. A clone
    in a private directory (`mktemp -d`, /root: what CI does) is unreadable to other users, so then
    they are copied once into a world-readable temporary directory."""
    src = Path(__file__).resolve().parents[2] / "src"
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    if _nobody_can("-r", str(src / "paygate_cli" / "__init__.py")) and _nobody_can("-r", str(site)):
        yield src, site
        return
    copy = Path(tempfile.mkdtemp(prefix="paygate-for-nobody-", dir="/tmp"))
    copy.chmod(0o755)
    try:
        ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
        shutil.copytree(src, copy / "src", symlinks=True, ignore=ignore)
        shutil.copytree(site, copy / "site-packages", symlinks=True, ignore=ignore)
        yield copy / "src", copy / "site-packages"
    finally:
        shutil.rmtree(copy, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="running as an ordinary user needs root to switch to one")
def test_dev_db_up_as_an_ordinary_user(tmp_path: Path, readable_by_nobody: tuple[Path, Path]) -> None:
    home = Path(tempfile.mkdtemp(prefix="pgu-", dir="/tmp"))
    shutil.chown(home, "nobody")
    try:
        data = str(home / "pg")
        environ = {"PATH": os.environ.get("PATH", ""), "HOME": str(home)}
        python = sys.executable
        if subprocess.run(["runuser", "-u", "nobody", "--", "test", "-x", python]).returncode != 0:
            # This interpreter lives under a private home (pyenv in /root): use the system's same-version
            # Python with this checkout's code and installed packages instead.
            python = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}",
                                  path="/usr/local/bin:/usr/bin") or ""
            if not python:
                pytest.skip("no interpreter an ordinary user can run")
            src, site = readable_by_nobody
            environ["PYTHONPATH"] = os.pathsep.join([str(src), str(site)])
        as_user = ["runuser", "-u", "nobody", "--", python, "-m", "paygate_cli"]
        up = subprocess.run([*as_user, "dev", "db", "up", "--data-dir", data, "--json"], env=environ,
                            capture_output=True, text=True, timeout=120)
        try:
            assert up.returncode == 0, up.stderr
            assert json.loads(up.stdout)["data_dir"] == data
            assert (home / "pg" / "PG_VERSION").stat().st_uid == home.stat().st_uid  # the user's own cluster
        finally:
            subprocess.run([*as_user, "dev", "db", "down", "--data-dir", data], env=environ, capture_output=True,
                           timeout=60)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_no_server_binaries_is_a_clear_78(public_tmp: Path) -> None:
    result = run_proc("dev", "db", "up", "--data-dir", str(public_tmp / "pg"), PAYGATE_PG_BINDIR="/nonexistent/bin")
    assert result.code == ExitCode.CONFIG
    assert "no PostgreSQL server binaries found" in result.err and "apt-get install postgresql" in result.err


def test_demo_runs_end_to_end_from_a_private_directory(private_tmp: Path) -> None:
    data = str(private_tmp / ".demo" / "pg")  # what `make demo` uses in a clone made in `mktemp -d`
    try:
        result = run_proc("demo", "--data-dir", data, "--json", timeout=180)
        assert result.code == 0, result.err
        report = json.loads(result.out)["demo"]
        statuses = sorted(d["status"] for d in report["deposits"])
        assert statuses == ["failed", "settled", "settled", "settled"]
        charges = sorted((c["status"], c["kind"].split(" ")[0]) for c in report["charges"])
        assert charges == [("failed", "one-off")] + [("settled", "one-off")] * 3 + [("settled", "subscription")] * 3
        drifted = [b for b in report["balances"] if b["cached"] != b["on_chain"]]
        assert len(drifted) == 1 and drifted[0]["cached"] == 1_000_000 and drifted[0]["on_chain"] == 0
        assert sum(b["on_chain"] for b in report["balances"]) == 150_000_000 - 7_000_000 - 12_000_000
        outbox = {row["event"]: row for row in report["outbox"]}
        assert outbox["demo.hello"]["dead"] == 1
        assert outbox["deposit.settled"]["delivered"] == 6 and outbox["charge.settled"]["delivered"] > 0
        assert report["received"] and all(r["signature_ok"] for r in report["received"])
        assert report["idempotency_keys_left"] == 5
        rerun = json.loads(run_proc("demo", "--data-dir", data, "--json", timeout=180).out)["demo"]
        assert len(rerun["deposits"]) == len(report["deposits"])  # a second run starts from scratch
    finally:
        run_proc("dev", "db", "down", "--data-dir", data)


def _nobody_can(*check: str) -> bool:
    return subprocess.run(["runuser", "-u", "nobody", "--", "test", *check]).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="running as an ordinary user needs root to switch to one")
def test_make_demo_from_a_private_clone_as_an_ordinary_user(readable_by_nobody: tuple[Path, Path]) -> None:
    """`make demo` in a clone made in a private directory (mode 0700, as `mktemp -d` or a home is),
    run by an ordinary user: the user's own cluster inside the clone, nothing relocated or chmod-ed.
    The venv step of the Makefile needs the network, so the clone gets a ready venv (this run's
    packages, the clone's own source) and the stamp that tells make it is installed; everything
    from `make demo` on is the real thing."""
    root = Path(__file__).resolve().parents[2]
    # This interpreter may live under a private home (pyenv in /root): then the system's same version.
    python = sys.executable if _nobody_can("-x", sys.executable) else "/usr/bin/python3.11"
    site = readable_by_nobody[1]
    if not Path(python).exists():
        pytest.skip("no interpreter an ordinary user can run")
    clone = Path(tempfile.mkdtemp(prefix="pgclone-"))
    assert clone.stat().st_mode & 0o777 == 0o700
    try:
        for name in ("Makefile", "pyproject.toml", "README.md"):
            shutil.copy2(root / name, clone / name)
        shutil.copytree(root / "src", clone / "src", symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        (clone / "sql").symlink_to("src/paygate_cli/sql")
        venv = clone / ".venv"
        subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
        probe = "import sysconfig; print(sysconfig.get_path('purelib'))"
        purelib = subprocess.run([str(venv / "bin" / "python"), "-c", probe], check=True, capture_output=True,
                                 text=True).stdout.strip()
        Path(purelib, "paygate_clone.pth").write_text(f"{clone / 'src'}\n{site}\n")
        script = venv / "bin" / "paygate"
        script.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom paygate_cli.__main__ import main\n"
                          "sys.exit(main())\n")
        script.chmod(0o755)
        checksum = subprocess.run("cksum < pyproject.toml | cut -d' ' -f1", shell=True, cwd=clone, check=True,
                                  capture_output=True, text=True).stdout.strip()
        (venv / f".installed-{checksum}").touch()  # newer than pyproject.toml: make skips the pip step
        subprocess.run(["chown", "-R", "nobody:", str(clone)], check=True)
        environ = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(clone), "LANG": "C.UTF-8"}
        as_user = ["runuser", "-u", "nobody", "--", "make", "-C", str(clone)]
        try:
            demo = subprocess.run([*as_user, "demo"], env=environ, capture_output=True, text=True, timeout=240)
            assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
            assert "pip install" not in demo.stdout  # the real demo ran, not the venv step
            assert "deposits (admitted -> settled on the devnet)" in demo.stdout, demo.stdout[-3000:]
            assert "all signatures valid: True" in demo.stdout, demo.stdout[-3000:]
            cluster = clone / ".demo" / "pg"
            assert (cluster / "PG_VERSION").stat().st_uid == clone.stat().st_uid  # the user's own cluster, in place
            assert not (cluster / "paygate-datadir").exists()
            assert clone.stat().st_mode & 0o777 == 0o700  # nobody's directory was chmod-ed
        finally:
            subprocess.run([*as_user, "clean"], env=environ, capture_output=True, timeout=60)
    finally:
        shutil.rmtree(clone, ignore_errors=True)
