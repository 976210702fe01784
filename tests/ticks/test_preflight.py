"""A bad secret or the wrong network never deploys green: `run-tick` parses every secret its worker
needs and asks each RPC endpoint for its network before the first tick, with nothing queued, and
exits 78 with a "cannot start" heartbeat that `status` shows. Real processes, a real devnet, a real
Postgres; nothing mocked."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import Keypair

from paygate_cli.errors import ExitCode
from tests.support.chain_env import chain_environ
from tests.support.cli import run_cli, run_proc
from tests.support.devnet_support import DevnetHandle, start_devnet

GARBAGE_SEED = "S" + "A" * 55  # the right shape, a wrong checksum: secret files must never be echoed


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path_factory.mktemp("devnet"), lanes=1, users=1)
    yield handle
    handle.stop()


@pytest.fixture
def configured(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> dict[str, str]:
    return chain_environ(devnet, dsn, tmp_path / "keys")


def cannot_start_rows(db: psycopg.Connection, worker: str) -> list[tuple[str, str]]:
    return db.execute("SELECT outcome, error FROM paygate.worker_runs WHERE worker = %s AND slot = -1",
                      (worker,)).fetchall()


def assert_cannot_start(environ: dict[str, str], db: psycopg.Connection, worker: str, says: str) -> None:
    tick = run_proc("run-tick", worker, "--once", environ=environ)
    assert tick.code == ExitCode.CONFIG, (tick.code, tick.err)
    assert says in tick.err, tick.err
    assert GARBAGE_SEED not in tick.err + tick.out
    [(outcome, error)] = cannot_start_rows(db, worker)
    assert outcome == "error" and error.startswith("cannot start: ") and says in error, error
    report = json.loads(run_cli("status", "--json", environ=environ).out)["status"]
    assert report["ready"] is False
    assert any(p.startswith(f"{worker} last run error: cannot start: ") for p in report["problems"]), report
    assert next(w for w in report["workers"] if w["worker"] == worker)["liveness"] == "cannot start"


def test_a_garbage_fee_seed_is_78_before_the_first_tick(configured: dict[str, str], db: psycopg.Connection,
                                                        tmp_path: Path) -> None:
    Path(configured["PAYGATE_FEE_SECRET_FILE"]).write_text(GARBAGE_SEED + "\n")
    assert_cannot_start(configured, db, "funding", "not a valid Stellar secret seed")
    assert db.execute("SELECT count(*) FROM paygate.worker_runs WHERE slot >= 0").fetchone()[0] == 0  # no tick


def test_a_garbage_lane_seed_names_its_line(configured: dict[str, str], db: psycopg.Connection) -> None:
    lanes = Path(configured["PAYGATE_LANE_SECRETS_FILE"])
    lanes.write_text(lanes.read_text() + "# a comment\n" + GARBAGE_SEED + "\n")
    assert_cannot_start(configured, db, "settlement", f"{lanes} line 3: not a valid Stellar secret seed")


def test_an_active_journal_key_missing_from_the_keys_file(configured: dict[str, str],
                                                         db: psycopg.Connection) -> None:
    environ = {**configured, "PAYGATE_JOURNAL_ACTIVE_KEY_ID": "k-missing"}
    assert_cannot_start(environ, db, "recovery", "journal key 'k-missing' (PAYGATE_JOURNAL_ACTIVE_KEY_ID) is not in")


def test_a_fee_account_setting_that_is_not_the_fee_seeds(configured: dict[str, str], db: psycopg.Connection) -> None:
    environ = {**configured, "PAYGATE_FEE_ACCOUNT": Keypair.random().public_key}
    assert_cannot_start(environ, db, "gas", "is not the account of the fee seed")


def test_the_configured_network_differs_from_the_endpoints(configured: dict[str, str],
                                                          db: psycopg.Connection) -> None:
    mainnet = "Public Global Stellar Network ; September 2015"
    environ = {**configured, "PAYGATE_NETWORK_PASSPHRASE": mainnet}
    assert_cannot_start(environ, db, "observer", f"serves the network 'Standalone Network ; February 2017', not "
                                                 f"the configured '{mainnet}'")
    report = json.loads(run_cli("status", "--json", environ=environ).out)["status"]
    assert {e["status"] for e in report["rpc"]["endpoints"]} == {"wrong network"}
    assert any("not the configured network" in p for p in report["problems"])


def test_good_secrets_start_and_tick(configured: dict[str, str], db: psycopg.Connection) -> None:
    environ = {**configured, "PAYGATE_FEE_ACCOUNT": Keypair.from_secret(
        Path(configured["PAYGATE_FEE_SECRET_FILE"]).read_text().strip()).public_key}
    for worker in ("funding", "gas", "recovery"):
        tick = run_proc("run-tick", worker, "--once", environ=environ)
        assert tick.code == 0, (worker, tick.err)
    assert cannot_start_rows(db, "funding") == []
