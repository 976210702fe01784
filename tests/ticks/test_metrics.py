"""Prometheus textfiles written by run-tick, read back with prometheus_client's own parser: one file
per slot, no `instance` label (Prometheus owns it), a file even when a run fails before its first
tick, and `paygate_worker_stalled`."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from paygate_cli.catalogue import WorkerSpec
from paygate_cli.context import TickContext, TickResult
from paygate_cli.env import Env
from paygate_cli.errors import ConfigError, ExitCode
from paygate_cli.ticks.runner import RunOptions, run_worker
from tests.support.cli import base_environ, run_cli, spawn


def samples(path: Path) -> dict[str, tuple[dict[str, str], float]]:
    return {s.name: (s.labels, s.value)
            for family in text_string_to_metric_families(path.read_text()) for s in family.samples}


def test_a_tick_writes_its_slot_file_with_paygate_instance_not_instance(dsn: str, tmp_path: Path) -> None:
    result = run_cli("run-tick", "webhooks", "--metrics-dir", str(tmp_path), dsn=dsn, PAYGATE_INSTANCE_ID="host-a")
    assert result.code == 0, result.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["paygate_state.prom", "paygate_webhooks_slot0.prom"]
    got = samples(tmp_path / "paygate_webhooks_slot0.prom")
    labels, _ = got["paygate_tick_exit_code"]
    assert labels == {"worker": "webhooks", "slot": "0", "paygate_instance": "host-a"}
    assert all("instance" not in labels for labels, _ in got.values())
    assert got["paygate_tick_exit_code"][1] == 0
    assert got["paygate_worker_stalled"][1] == 0
    assert got["paygate_tick_last_success_timestamp_seconds"][1] > time.time() - 60


def test_concurrent_slots_write_separate_files(dsn: str, tmp_path: Path) -> None:
    holder = spawn("run-tick", "webhooks", "--every", "0.2s", "--for", "20s", "--metrics-dir", str(tmp_path), dsn=dsn)
    try:
        deadline = time.monotonic() + 15
        while not (tmp_path / "paygate_webhooks_slot0.prom").exists():
            assert time.monotonic() < deadline and holder.poll() is None, holder.stderr.read() if holder.stderr else ""
            time.sleep(0.05)
        second = run_cli("run-tick", "webhooks", "--metrics-dir", str(tmp_path), dsn=dsn)
        assert second.code == 0, second.err
    finally:
        holder.terminate()
        holder.communicate(timeout=30)
    files = sorted(tmp_path.glob("paygate_webhooks_*.prom"))
    assert [p.name for p in files] == ["paygate_webhooks_slot0.prom", "paygate_webhooks_slot1.prom"]
    slots = {samples(p)["paygate_tick_exit_code"][0]["slot"] for p in files}
    assert slots == {"0", "1"}


def test_database_down_before_the_first_tick_writes_a_start_file_with_69(tmp_path: Path) -> None:
    dead = f"postgresql:///paygate?host={tmp_path / 'no-such-socket-dir'}&connect_timeout=1"
    metrics = tmp_path / "metrics"
    result = run_cli("run-tick", "webhooks", "--metrics-dir", str(metrics), dsn=dead)
    assert result.code == ExitCode.UNAVAILABLE, result.err
    got = samples(metrics / "paygate_webhooks_start.prom")
    assert got["paygate_tick_exit_code"][1] == 69
    assert got["paygate_tick_exit_code"][0]["slot"] == "none"
    assert "paygate_tick_last_success_timestamp_seconds" not in got  # unknown is not "1970"


def test_bad_config_writes_78_and_a_later_good_start_clears_it(dsn: str, tmp_path: Path) -> None:
    result = run_cli("run-tick", "webhooks", "--metrics-dir", str(tmp_path), dsn=dsn,
                     PAYGATE_FEE_SECRET_FILE=str(tmp_path / "missing-secret"))
    assert result.code == ExitCode.CONFIG, result.err
    assert samples(tmp_path / "paygate_webhooks_start.prom")["paygate_tick_exit_code"][1] == 78
    assert run_cli("run-tick", "webhooks", "--metrics-dir", str(tmp_path), dsn=dsn).code == 0
    assert sorted(p.name for p in tmp_path.glob("paygate_webhooks_*.prom")) == ["paygate_webhooks_slot0.prom"]


# Test workers plugged into the real runner (the registry's shape, a tick function from this module),
# because no shipped worker can be made to stall or to find its configuration wrong on demand yet.
def stalled_tick(ctx: TickContext) -> TickResult:
    return TickResult(stalled="no free lane for 30 s")


def misconfigured_tick(ctx: TickContext) -> TickResult:
    raise ConfigError("billing contract not configured")


def _spec(target: str) -> WorkerSpec:
    # "gas" holds a reserved lock id; each test has its own database, so nothing else holds its lock.
    return WorkerSpec("gas", cadence=1, batch=1, single_writer=True, concurrency=1,
                      target=f"tests.ticks.test_metrics:{target}", description="test worker")


def _env(dsn: str) -> Env:
    return Env(stdin=io.StringIO(), stdout=io.StringIO(), stderr=io.StringIO(), environ=base_environ(dsn))


def test_a_stalled_tick_sets_paygate_worker_stalled_and_exit_code_1(dsn: str, tmp_path: Path) -> None:
    summary = run_worker(_env(dsn), _spec("stalled_tick"), RunOptions(metrics_dir=str(tmp_path)))
    assert summary.exit_code == ExitCode.FAILED
    got = samples(tmp_path / "paygate_gas_slot0.prom")
    assert got["paygate_worker_stalled"][1] == 1
    assert got["paygate_tick_exit_code"][1] == 1


def test_config_error_inside_the_first_tick_writes_78_to_the_slot_file(dsn: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        run_worker(_env(dsn), _spec("misconfigured_tick"), RunOptions(metrics_dir=str(tmp_path)))
    got = samples(tmp_path / "paygate_gas_slot0.prom")
    assert got["paygate_tick_exit_code"][1] == 78
    assert got["paygate_worker_stalled"][1] == 0


def test_a_tick_writes_the_state_file_with_dead_webhooks_queue_age_and_halts(dsn: str, tmp_path: Path) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("INSERT INTO paygate.webhook_outbox (event_type, payload, status, dead_at, created_at)"
                   " VALUES ('deposit.settled', '{}', 'dead', now() - interval '10 minutes', now())")
        db.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('gas', 'headroom below floor', 'gas')")
    assert run_cli("run-tick", "idempotency_sweep", "--metrics-dir", str(tmp_path), dsn=dsn,
                   PAYGATE_INSTANCE_ID="host-a").code == 0
    families = {f.name: f for f in text_string_to_metric_families((tmp_path / "paygate_state.prom").read_text())}
    depth = {s.labels["queue"]: s.value for s in families["paygate_queue_depth"].samples}
    age = {s.labels["queue"]: s.value for s in families["paygate_queue_oldest_age_seconds"].samples}
    halts = {s.labels["kind"]: s.value for s in families["paygate_halt"].samples}
    assert depth["webhooks.dead"] == 1 and 590 < age["webhooks.dead"] < 900
    assert depth["deposits.pending"] == 0 and age["deposits.pending"] == 0
    assert halts == {"gas": 1.0, "operator": 0.0, "restore": 0.0}
    assert all(s.labels["paygate_instance"] == "host-a" for f in families.values() for s in f.samples)
