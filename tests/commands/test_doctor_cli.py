"""`paygate doctor` end to end: a real Postgres, a real devnet over HTTP, and two loopback stand-ins for
other RPC providers in front of it (tests/support/rpc_proxy.py, on 127.0.0.2 and 127.0.0.3: three
distinct read hosts, as the money movers need). Each test breaks one thing a tick needs and reads the
check that says so, its fix and the exit code; the output never holds a seed or a key."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from stellar_sdk import Keypair

from paygate_cli.db.privileges import READONLY_ROLE
from tests.support.chain_env import JOURNAL_KEY_ID, admit_deposit, chain_environ, sign_deposit
from tests.support.cli import Result, run_cli
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.roles import as_role
from tests.support.rpc_proxy import RpcProxy

GROUPS = ("config", "schema", "rpc", "lanes", "fee_account", "journal", "ttl", "clock", "db", "metrics")
FIXED_IDS = {"config.settings", "config.secret_files", "schema.version", "roles.grants", "rpc.distinct_hosts",
             "lanes.known", "fee_account.balance", "fee_account.runway", "journal.active_key",
             "journal.envelope_keys", "ttl.horizon", "clock.skew", "db.reachable", "db.writer", "db.restore_gate",
             "db.pooling", "metrics.dir"}


class BehindHead(RpcProxy):
    """A provider whose node reports a latest ledger `behind` ledgers older than the devnet's."""

    def __init__(self, upstream: str, host: str, behind: int = 0) -> None:
        self.behind = behind
        super().__init__(upstream, host=host)

    def rewrite(self, request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        result = answer.get("result")
        if request.get("method") == "getHealth" and isinstance(result, dict):
            result["latestLedger"] -= self.behind
        return answer


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path_factory.mktemp("devnet"), lanes=4, users=2)
    handle.close_ledger(n=20, advance_seconds=0)  # ledgers for a provider to lag behind (the clock kept)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def providers(devnet: DevnetHandle) -> Iterator[tuple[BehindHead, BehindHead]]:
    second, third = BehindHead(devnet.url, "127.0.0.2"), BehindHead(devnet.url, "127.0.0.3")
    yield second, third
    second.close()
    third.close()


def deployment(devnet: DevnetHandle, providers: tuple[BehindHead, BehindHead], dsn: str, directory: Path,
               lanes: list[int]) -> dict[str, str]:
    """A host's environment: the given lanes' seeds, three distinct read hosts (no override), a metrics dir."""
    environ = chain_environ(devnet, dsn, directory)
    (directory / "lanes").write_text("".join(devnet.genesis["lanes"][i]["secret"] + "\n" for i in lanes))
    environ.pop("PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT")
    environ["PAYGATE_RPC_READ_URLS"] = ",".join([devnet.url, providers[0].url, providers[1].url])
    (directory / "metrics").mkdir()
    environ["PAYGATE_METRICS_DIR"] = str(directory / "metrics")
    return environ


def doctor(environ: dict[str, str], *args: str) -> tuple[Result, dict[str, Any], dict[str, dict[str, Any]]]:
    result = run_cli("doctor", "--json", *args, environ=environ)
    document = json.loads(result.out)
    return result, document, {c["id"]: c for c in document["checks"]}


def secrets_of(devnet: DevnetHandle, directory: Path) -> list[str]:
    keys = json.loads((directory / "journal-keys").read_text())
    return [*(lane["secret"] for lane in devnet.genesis["lanes"]), devnet.genesis["fee_account"]["secret"],
            *keys.values()]


def assert_no_secret(result: Result, secrets: list[str]) -> None:
    for secret in secrets:
        assert secret not in result.out and secret not in result.err


def settle_a_deposit(devnet: DevnetHandle, environ: dict[str, str], dsn: str, user: int) -> None:
    secret = devnet.genesis["users"][user]["secret"]
    entry, nonce, expiration = sign_deposit(devnet, secret, 5_000_000)
    with psycopg.connect(dsn, autocommit=True) as db:
        deposit = admit_deposit(db, Keypair.from_secret(secret).public_key, 5_000_000, entry, nonce, expiration,
                                f"doctor-{user}")
        for _ in range(20):
            assert run_cli("run-tick", "funding", "--once", environ=environ).code in (0, 1)
            if db.execute("SELECT status FROM paygate.deposits WHERE id = %s", (deposit,)).fetchone()[0] == "settled":
                return
            devnet.close_ledger(advance_seconds=1)
    raise AssertionError("the deposit did not settle")


def clock_now(devnet: DevnetHandle) -> None:
    """A ledger closed now: the devnet's close times are its own (manual closes), a real network's are
    the wall clock's, which clock.skew compares the host's with."""
    close_time = int(devnet.rpc("getLatestLedger")["closeTime"])
    assert close_time <= time.time() + 5, "the devnet's clock ran ahead: close fewer ledgers, or with less advance"
    devnet.close_ledger(advance_seconds=max(0, int(time.time()) - close_time))


def test_a_healthy_deployment_passes_and_a_lane_used_outside_the_journal_fails(
        devnet: DevnetHandle, providers: tuple[BehindHead, BehindHead], dsn: str, tmp_path: Path) -> None:
    environ = deployment(devnet, providers, dsn, tmp_path / "host", lanes=[0, 1])
    assert run_cli("migrate", "--roles", environ=environ).code == 0
    settle_a_deposit(devnet, environ, dsn, user=0)  # lanes in the journal, fees charged: real history to check
    clock_now(devnet)
    result, document, checks = doctor(environ)
    assert result.code == 0, [c for c in document["checks"] if c["verdict"] != "ok"]
    assert document["schema_version"] == 1
    assert document["summary"] == {"ok": len(checks), "warn": 0, "fail": 0, "exit_code": 0}
    assert document["groups"] == dict.fromkeys(GROUPS, "ok")
    lanes = [devnet.genesis["lanes"][i]["public"] for i in (0, 1)]
    endpoint_ids = {f"rpc.{n}.{what}" for n in (1, 2, 3)
                    for what in ("reachable", "network", "protocol", "lag", "retention")}
    lane_ids = {f"lane.{lane}.{what}" for lane in lanes for what in ("exists", "operator", "xlm", "sequence")}
    assert set(checks) == FIXED_IDS | endpoint_ids | lane_ids
    for check in document["checks"]:
        assert set(check) == {"id", "group", "verdict", "evidence", "fix", "kind"} and check["evidence"]
    # the lane that moved the deposit: its chain sequence is the journal's last consumed one
    used = [c for lane in lanes if "journal's last consumed none" not in (c := checks[f"lane.{lane}.sequence"])
            ["evidence"]]
    assert used and all("; ok" in c["evidence"] for c in used), used
    assert "days of runway" in checks["fee_account.runway"]["evidence"]
    assert_no_secret(result, secrets_of(devnet, tmp_path / "host"))
    human = run_cli("doctor", environ=environ)
    assert human.code == 0 and "config: ok" in human.out and "doctor: " in human.out.splitlines()[-1]
    assert_no_secret(human, secrets_of(devnet, tmp_path / "host"))
    plain = run_cli("doctor", "--plain", "--only", "clock", environ=environ)
    assert plain.out.splitlines()[0] == "group\tcheck\tverdict\tevidence\tfix"
    assert plain.out.splitlines()[1].startswith("clock\tclock.skew\tok\t")
    # a transaction paygate never journaled takes the used lane's next sequence: a gap, for a human
    lane = used[0]["id"].split(".")[1]
    devnet.rpc("devnet_consumeSequence", {"account": lane})
    devnet.close_ledger(advance_seconds=1)
    result, document, checks = doctor(environ, "--only", "lanes")
    gap = checks[f"lane.{lane}.sequence"]
    assert gap["verdict"] == "fail" and gap["kind"] == "human" and f"nonce-inspect --lane {lane}" in gap["fix"]
    assert result.code == 3


class OtherNetwork(RpcProxy):
    def rewrite(self, request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        if request.get("method") == "getNetwork":
            answer["result"]["passphrase"] = "Public Global Stellar Network ; September 2015"
        return answer


def test_an_endpoint_on_another_network(devnet: DevnetHandle, providers: tuple[BehindHead, BehindHead], dsn: str,
                                        tmp_path: Path) -> None:
    mainnet = OtherNetwork(devnet.url, host="127.0.0.5")
    try:
        environ = deployment(devnet, providers, dsn, tmp_path / "host", lanes=[2])
        environ["PAYGATE_RPC_READ_URLS"] = ",".join([mainnet.url, devnet.url, providers[0].url])
        result, _, checks = doctor(environ, "--only", "rpc,lanes")
    finally:
        mainnet.close()
    network = checks["rpc.2.network"]
    assert network["verdict"] == "fail" and network["kind"] == "config" and "Public Global" in network["evidence"]
    assert checks["rpc.3.network"]["verdict"] == "ok" and result.code == 78
    assert checks[f"lane.{devnet.genesis['lanes'][2]['public']}.exists"]["verdict"] == "ok"  # read elsewhere


def test_a_lane_that_is_no_operator_or_not_funded_is_a_configuration_failure(
        devnet: DevnetHandle, providers: tuple[BehindHead, BehindHead], dsn: str, tmp_path: Path) -> None:
    environ = deployment(devnet, providers, dsn, tmp_path / "host", lanes=[2])
    funded, unfunded = Keypair.random(), Keypair.random()
    devnet.fund(funded.public_key, xlm=100)
    with (tmp_path / "host" / "lanes").open("a") as lanes:
        lanes.write(f"{funded.secret}\n{unfunded.secret}\n")
    result, document, checks = doctor(environ, "--only", "lanes")
    assert result.code == 78
    good = devnet.genesis["lanes"][2]["public"]
    assert checks[f"lane.{good}.operator"]["verdict"] == "ok"
    stranger = checks[f"lane.{funded.public_key}.operator"]
    assert stranger["verdict"] == "fail" and stranger["kind"] == "config" and "add_operator" in stranger["fix"]
    assert checks[f"lane.{funded.public_key}.exists"]["verdict"] == "ok"
    assert checks[f"lane.{unfunded.public_key}.exists"]["verdict"] == "fail"
    assert checks[f"lane.{unfunded.public_key}.xlm"]["verdict"] == "fail"
    assert document["groups"] == {"lanes": "fail"}
    assert_no_secret(result, [funded.secret, unfunded.secret, *secrets_of(devnet, tmp_path / "host")])


def test_a_lagging_read_endpoint(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> None:
    far, near = BehindHead(devnet.url, "127.0.0.2", behind=15), BehindHead(devnet.url, "127.0.0.3", behind=4)
    try:
        environ = chain_environ(devnet, dsn, tmp_path / "host")
        environ.pop("PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT")
        environ["PAYGATE_RPC_READ_URLS"] = ",".join([devnet.url, far.url, near.url])
        result, document, checks = doctor(environ, "--only", "rpc")
    finally:
        far.close()
        near.close()
    assert checks["rpc.1.lag"]["verdict"] == "ok"
    assert checks["rpc.2.lag"]["verdict"] == "fail" and checks["rpc.2.lag"]["kind"] == "unavailable"
    assert "15 behind the furthest endpoint" in checks["rpc.2.lag"]["evidence"]
    assert checks["rpc.3.lag"]["verdict"] == "warn"
    assert document["groups"] == {"rpc": "fail"} and result.code == 69


class Hanging(RpcProxy):
    """A provider that accepts the request and answers only after `delay` seconds."""

    delay = 8.0

    def rewrite(self, request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        time.sleep(self.delay)
        return answer


def test_an_endpoint_that_hangs_costs_one_bounded_probe(devnet: DevnetHandle, providers: tuple[BehindHead,
                                                        BehindHead], dsn: str, tmp_path: Path) -> None:
    hanging = Hanging(devnet.url, host="127.0.0.4")
    try:
        environ = deployment(devnet, providers, dsn, tmp_path / "host", lanes=[0, 1])
        environ["PAYGATE_RPC_READ_URLS"] = ",".join([hanging.url, devnet.url, providers[0].url, providers[1].url])
        started = time.monotonic()
        result, document, checks = doctor(environ, "--only", "rpc,lanes,fee_account")
        elapsed = time.monotonic() - started
    finally:
        hanging.close()
    assert elapsed < Hanging.delay, elapsed  # one probe of at most PAYGATE_RPC_TIMEOUT (3s), all at once
    assert checks["rpc.2.reachable"]["verdict"] == "fail" and "127.0.0.4" in checks["rpc.2.reachable"]["evidence"]
    assert checks["rpc.3.reachable"]["verdict"] == "ok"
    lane = devnet.genesis["lanes"][0]["public"]
    assert checks[f"lane.{lane}.operator"]["verdict"] == "ok"  # read from the endpoints that answered
    assert checks["fee_account.balance"]["verdict"] == "ok"
    assert document["groups"] == {"rpc": "fail", "lanes": "ok", "fee_account": "ok"} and result.code == 69


def test_fewer_than_three_distinct_hosts(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> None:
    environ = chain_environ(devnet, dsn, tmp_path / "host")
    environ["PAYGATE_RPC_READ_URLS"] = f"{devnet.url},{devnet.url}/"  # one node, two spellings
    result, _, checks = doctor(environ, "--only", "rpc")
    assert checks["rpc.distinct_hosts"]["verdict"] == "warn" and result.code == 1  # the development override
    environ.pop("PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT")
    result, _, checks = doctor(environ, "--only", "rpc")
    hosts = checks["rpc.distinct_hosts"]
    assert hosts["verdict"] == "fail" and hosts["kind"] == "config" and "3 distinct hosts" in hosts["fix"]
    assert "1 distinct host(s)" in hosts["evidence"] and result.code == 78


def test_a_live_envelope_whose_key_left_the_keys_file(devnet: DevnetHandle, providers: tuple[BehindHead, BehindHead],
                                                      dsn: str, tmp_path: Path) -> None:
    environ = deployment(devnet, providers, dsn, tmp_path / "host", lanes=[3])
    secret = devnet.genesis["users"][1]["secret"]
    entry, nonce, expiration = sign_deposit(devnet, secret, 3_000_000)
    with psycopg.connect(dsn, autocommit=True) as db:
        admit_deposit(db, Keypair.from_secret(secret).public_key, 3_000_000, entry, nonce, expiration, "doctor-live")
        assert run_cli("run-tick", "funding", "--once", environ=environ).code in (0, 1)
        live = db.execute("SELECT count(*) FROM paygate.lineages WHERE paygate.lineage_is_live(state)"
                          " AND key_id = %s", (JOURNAL_KEY_ID,)).fetchone()[0]
    assert live == 1  # sent, not landed: no ledger closed
    keys_file = tmp_path / "host" / "journal-keys"
    _, _, before = doctor(environ, "--only", "journal")
    assert before["journal.envelope_keys"]["verdict"] == "ok"
    old_keys = keys_file.read_text()
    try:
        keys_file.write_text(json.dumps({"k2027": os.urandom(32).hex()}))  # the active key rotated out
        result, _, checks = doctor({**environ, "PAYGATE_JOURNAL_ACTIVE_KEY_ID": "k2027"}, "--only", "journal")
        assert checks["journal.active_key"]["verdict"] == "ok"
        envelope_keys = checks["journal.envelope_keys"]
        assert envelope_keys["verdict"] == "fail" and envelope_keys["kind"] == "config"
        assert f"{JOURNAL_KEY_ID} (1 envelope(s))" in envelope_keys["evidence"] and result.code == 78
        result, _, checks = doctor(environ, "--only", "journal")  # the active key id names the removed key
        assert checks["journal.active_key"]["verdict"] == "fail" and result.code == 78
        keys_file.write_text(json.dumps({JOURNAL_KEY_ID: os.urandom(32).hex()}))  # same id, other bytes
        result, _, checks = doctor(environ, "--only", "journal")
        assert checks["journal.envelope_keys"]["verdict"] == "fail" and checks["journal.envelope_keys"]["kind"] \
            == "human" and result.code == 3
        assert_no_secret(result, [*json.loads(keys_file.read_text()).values(), *json.loads(old_keys).values()])
    finally:
        devnet.close_ledger(advance_seconds=1)  # the transfer lands: the lane is free for the other tests


def test_a_world_readable_secret_file_is_named_with_the_fix(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> None:
    environ = chain_environ(devnet, dsn, tmp_path / "host")
    lanes = tmp_path / "host" / "lanes"
    lanes.chmod(0o644)
    result, document, checks = doctor(environ, "--only", "config")
    files = checks["config.secret_files"]
    assert files["verdict"] == "fail" and files["kind"] == "config"
    assert f"{lanes} is readable by every user (mode 0644)" in files["evidence"]
    assert f"chmod o-rwx {lanes}" in files["fix"]
    assert result.code == 78 and document["groups"] == {"config": "fail"}
    assert_no_secret(result, secrets_of(devnet, tmp_path / "host"))
    (tmp_path / "host" / "journal-keys").unlink()
    result, _, checks = doctor(environ, "--only", "config")
    assert "does not exist" in checks["config.secret_files"]["evidence"] and result.code == 78


def test_a_metrics_directory_it_cannot_write(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> None:
    environ = chain_environ(devnet, dsn, tmp_path / "host")
    (tmp_path / "a-file").write_text("")
    for target in (tmp_path / "a-file", tmp_path / "missing" / "textfile"):
        result, _, checks = doctor({**environ, "PAYGATE_METRICS_DIR": str(target)}, "--only", "metrics")
        assert checks["metrics.dir"]["verdict"] == "fail" and result.code == 78, checks["metrics.dir"]
    result, _, checks = doctor({**environ, "PAYGATE_METRICS_DIR": str(tmp_path / "new")}, "--only", "metrics")
    assert checks["metrics.dir"]["verdict"] == "ok" and "creates it" in checks["metrics.dir"]["evidence"]
    if os.geteuid() != 0:  # root writes anywhere: the mode only stops an ordinary user
        (tmp_path / "locked").mkdir(mode=0o500)
        result, _, checks = doctor({**environ, "PAYGATE_METRICS_DIR": str(tmp_path / "locked")}, "--only", "metrics")
        assert checks["metrics.dir"]["verdict"] == "fail" and result.code == 78


def test_only_runs_the_groups_asked(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> None:
    environ = chain_environ(devnet, dsn, tmp_path / "host")
    _, document, _ = doctor(environ, "--only", "clock,metrics")
    assert {c["group"] for c in document["checks"]} == {"clock", "metrics"}
    assert list(document["groups"]) == ["clock", "metrics"]
    unknown = run_cli("doctor", "--only", "rpc,nope", environ=environ)
    assert unknown.code == 2 and "nope" in unknown.err and not unknown.out


def test_an_unreachable_database_is_69_and_the_checks_it_blocks_say_so(devnet: DevnetHandle, tmp_path: Path) -> None:
    (tmp_path / "nothing").mkdir()
    environ = chain_environ(devnet, f"postgresql:///x?host={tmp_path / 'nothing'}", tmp_path / "host")
    result, _, checks = doctor(environ, "--only", "db,journal")
    assert checks["db.reachable"]["verdict"] == "fail" and checks["db.reachable"]["kind"] == "unavailable"
    assert checks["journal.active_key"]["evidence"].startswith("not checked")
    assert result.code == 69


def test_as_the_read_only_role_from_a_shell_without_secrets(devnet: DevnetHandle, providers: tuple[BehindHead,
                                                            BehindHead], dsn: str, tmp_path: Path) -> None:
    environ = deployment(devnet, providers, dsn, tmp_path / "host", lanes=[0])
    assert run_cli("migrate", "--roles", environ=environ).code == 0
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("INSERT INTO paygate.lanes (address) VALUES (%s)", (devnet.genesis["lanes"][0]["public"],))
    shell = {k: v for k, v in environ.items() if k not in ("PAYGATE_LANE_SECRETS_FILE", "PAYGATE_FEE_SECRET_FILE",
                                                           "PAYGATE_JOURNAL_KEYS_FILE")}
    shell |= {"PAYGATE_DATABASE_URL": as_role(dsn, READONLY_ROLE),
              "PAYGATE_FEE_ACCOUNT": devnet.genesis["fee_account"]["public"]}
    clock_now(devnet)
    result, document, checks = doctor(shell)
    # every check ran (none stopped on a refused statement); only the absent journal keys fail
    assert not [c for c in document["checks"] if c["id"].endswith(".error")]
    assert [c["id"] for c in document["checks"] if c["verdict"] != "ok"] == ["journal.active_key",
                                                                             "journal.envelope_keys"]
    assert checks[f"lane.{devnet.genesis['lanes'][0]['public']}.operator"]["verdict"] == "ok"
    assert result.code == 78


def test_an_rpc_url_the_settings_refuse_still_leaves_the_other_checks(devnet: DevnetHandle, dsn: str,
                                                                      tmp_path: Path) -> None:
    environ = chain_environ(devnet, dsn, tmp_path / "host") | {"PAYGATE_RPC_URL": "rpc.example/soroban"}
    result, document, checks = doctor(environ, "--only", "rpc,clock,lanes,metrics")
    assert checks["rpc.configured"]["verdict"] == "fail" and "http://" in checks["rpc.configured"]["evidence"]
    assert checks["clock.skew"]["evidence"].startswith("not checked")
    assert checks["lanes.known"]["kind"] == "config" and checks["metrics.dir"]["verdict"] == "ok"
    assert document["groups"] == {"rpc": "fail", "lanes": "fail", "clock": "fail", "metrics": "ok"}
    assert result.code == 78
