"""`paygate dev db` and `paygate demo`, end to end with real processes and a real cluster."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from paygate_cli.errors import ExitCode
from tests.cli import run_proc


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="pgd-", dir="/tmp"))
    path.chmod(0o755)  # the postgres OS user must traverse it when we run as root
    yield path
    shutil.rmtree(path, ignore_errors=True)


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


@pytest.mark.skipif(os.geteuid() != 0, reason="the unreachable-directory case only exists when running as root")
def test_dev_db_up_in_a_private_directory_explains_itself(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    result = run_proc("dev", "db", "up", "--data-dir", str(tmp_path / "deep" / "pg"))
    assert result.code == ExitCode.CONFIG
    assert "cannot reach" in result.err and "--data-dir" in result.err


def test_demo_runs_end_to_end(public_tmp: Path) -> None:
    data = str(public_tmp / "demo-pg")
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
        assert outbox["credit.settled"]["delivered"] == 6 and outbox["charge.settled"]["delivered"] > 0
        assert report["received"] and all(r["signature_ok"] for r in report["received"])
        assert report["idempotency_keys_left"] == 5
        rerun = json.loads(run_proc("demo", "--data-dir", data, "--json", timeout=180).out)["demo"]
        assert len(rerun["deposits"]) == len(report["deposits"])  # a second run starts from scratch
    finally:
        run_proc("dev", "db", "down", "--data-dir", data)
