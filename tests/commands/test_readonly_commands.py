"""The read-only commands (`status`, `top`, `reconcile-report`, `nonce-inspect`, `trace`) run as the
read-only database role from a shell holding none of the fleet's secrets (no lane seeds, fee seed or journal
keys: unset, or pointing at files this user cannot read). They use none of them, so they print their
whole document and exit as the facts say; the fleet's readiness comes from its heartbeats (a
worker's "cannot start" record), not from what the operator's shell holds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from paygate_cli.db.privileges import READONLY_ROLE
from paygate_cli.errors import ExitCode
from tests.support.chain_env import admit_deposit, chain_environ, sign_deposit
from tests.support.cli import Result, run_cli, run_proc
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.roles import as_role

SECRET_FILES = ("PAYGATE_LANE_SECRETS_FILE", "PAYGATE_FEE_SECRET_FILE", "PAYGATE_JOURNAL_KEYS_FILE")


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path_factory.mktemp("devnet"), lanes=1, users=1)
    yield handle
    handle.stop()


def operator_shells(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> dict[str, dict[str, str]]:
    """The fleet's environment, and the operator's two shells as the read-only role: one with the
    secret variables unset, one with them pointing at a missing file and at a directory (the tests
    run as root, so a mode-000 file would still be readable; a directory never is)."""
    fleet = chain_environ(devnet, dsn, tmp_path / "keys")
    readonly = as_role(dsn, READONLY_ROLE)
    unset = {k: v for k, v in fleet.items() if k not in SECRET_FILES} | {"PAYGATE_DATABASE_URL": readonly}
    (tmp_path / "not-a-file").mkdir()
    unreadable = unset | {"PAYGATE_LANE_SECRETS_FILE": str(tmp_path / "missing-lanes"),
                          "PAYGATE_FEE_SECRET_FILE": str(tmp_path / "not-a-file"),
                          "PAYGATE_JOURNAL_KEYS_FILE": str(tmp_path / "missing-journal-keys")}
    return {"fleet": fleet, "unset": unset, "unreadable": unreadable}


def document(result: Result, key: str) -> dict:
    assert result.out, result.err
    return json.loads(result.out)[key]


def test_read_only_commands_need_no_secrets(devnet: DevnetHandle, dsn: str, db: psycopg.Connection,
                                            tmp_path: Path) -> None:
    assert run_cli("migrate", "--roles", dsn=dsn).code == 0
    lane = devnet.genesis["lanes"][0]["public"]
    db.execute("INSERT INTO paygate.lanes (address) VALUES (%s)", (lane,))
    shells = operator_shells(devnet, dsn, tmp_path)
    for name in ("unset", "unreadable"):
        environ = shells[name]
        status = run_proc("status", "--json", environ=environ)
        report = document(status, "status")
        # Nothing is wrong with the fleet: no worker has failed, no work waits, the RPC is healthy.
        assert (status.code, report["ready"], report["problems"]) == (ExitCode.OK, True, []), (name, status.err)
        assert report["cannot_work"] == []
        assert [e["status"] for e in report["rpc"]["endpoints"]] == ["healthy", "healthy"]
        assert {w["worker"] for w in report["workers"]} >= {"funding", "settlement"}

        top = run_proc("top", "--once", "--json", environ=environ)
        assert top.code == ExitCode.OK and document(top, "top")["lanes"][0]["lane"] == lane, (name, top.err)

        reconcile = run_proc("reconcile-report", "--json", environ=environ)
        assert reconcile.code == ExitCode.OK, (name, reconcile.err)
        assert document(reconcile, "reconcile_report")["accounts"] == 0

        nonce = run_proc("nonce-inspect", "--json", environ=environ)
        assert nonce.code == ExitCode.OK, (name, nonce.err)
        [row] = json.loads(nonce.out)["lanes"]
        assert (row["lane"], row["finding"]) == (lane, "no journaled use yet")
        assert isinstance(row["chain_seq"], int)
        human = run_proc("nonce-inspect", "--lane", lane, environ=environ)
        assert human.code == ExitCode.OK and lane in human.out, human.err
    # A deposit's authorisation read from the chain (the chain client, contract reads): still no secret.
    user = devnet.genesis["users"][0]
    entry, nonce_value, expiration = sign_deposit(devnet, user["secret"], 1_000_000)
    credit = admit_deposit(db, user["public"], 1_000_000, entry, nonce_value, expiration, "ro-1")
    for name in ("unset", "unreadable"):
        inspected = run_proc("nonce-inspect", "--deposit", str(credit), "--json", environ=shells[name])
        assert inspected.code == ExitCode.OK, (name, inspected.err)
        auth = document(inspected, "deposit")["authorisation"]
        assert (auth["nonce"], auth["consumed_on_chain"], auth["expired"]) == (nonce_value, False, False)
        traced = run_proc("trace", "deposit", str(credit), "--json", environ=shells[name])
        assert traced.code == ExitCode.OK, (name, traced.err)
        assert document(traced, "verdict")["regime"] == "in_flight"  # admitted, not claimed: nothing on chain
        assert document(traced, "authorisation")["consumed_on_chain"] is False


def test_status_takes_cannot_start_from_the_heartbeats(devnet: DevnetHandle, dsn: str,
                                                       tmp_path: Path) -> None:
    """A worker of the fleet that cannot start (its lane keys missing where it runs) is what makes
    the gateway not ready, as the operator's shell without any secrets sees it."""
    assert run_cli("migrate", "--roles", dsn=dsn).code == 0
    shells = operator_shells(devnet, dsn, tmp_path)
    broken_host = {k: v for k, v in shells["fleet"].items() if k != "PAYGATE_LANE_SECRETS_FILE"}
    tick = run_cli("run-tick", "funding", environ=broken_host)
    assert tick.code == ExitCode.CONFIG, tick.err
    for name in ("unset", "unreadable"):
        status = run_proc("status", "--json", environ=shells[name])
        report = document(status, "status")
        assert status.code == ExitCode.FAILED and report["ready"] is False, (name, status.err)
        [cannot] = report["cannot_work"]
        assert cannot["worker"] == "funding"
        assert cannot["error"].startswith("cannot start: funding cannot work: missing lane keys")
        assert any(p.startswith("funding last run error: cannot start") for p in report["problems"])
        # Nothing else: settlement and the other signers are not judged by this shell's secrets.
        assert not [p for p in report["problems"] if not p.startswith("funding ")], report["problems"]
        human = run_proc("status", environ=shells[name])
        assert human.code == ExitCode.FAILED and human.out.startswith("NOT READY: funding"), human.err
