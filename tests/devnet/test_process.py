"""The devnet as a process: genesis line, --state persistence across restarts and crashes,
automatic ledger closing, and the `paygate devnet fund|close|fault|state` wrappers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from stellar_sdk import Asset, Keypair, SorobanServer, StrKey, TransactionBuilder
from stellar_sdk.soroban_rpc import GetTransactionStatus, SendTransactionStatus

from tests.support.devnet_support import DevnetHandle, start_devnet


def _pay(server: SorobanServer, devnet: DevnetHandle) -> str:
    src = Keypair.from_secret(devnet.genesis["users"][0]["secret"])
    tx = (TransactionBuilder(server.load_account(src.public_key), devnet.passphrase, base_fee=100)
          .append_payment_op(devnet.genesis["issuer"]["public"], Asset.native(), "1").set_timeout(600).build())
    tx.sign(src)
    assert server.send_transaction(tx).status == SendTransactionStatus.PENDING
    return tx.hash_hex()


def test_genesis_line_is_deterministic_and_complete(tmp_path: Path) -> None:
    a = start_devnet(tmp_path / "a", seed="same", lanes=2, users=1)
    b = start_devnet(tmp_path / "b", seed="same", lanes=2, users=1)
    try:
        ga, gb = a.genesis, b.genesis
        assert ga["url"] != gb["url"]
        for k in ("fee_account", "lanes", "issuer", "users", "contracts", "passphrase", "asset"):
            assert ga[k] == gb[k]
        assert len(ga["lanes"]) == 2 and len(ga["users"]) == 1 and ga["latest_ledger"] == 1
        assert Keypair.from_secret(ga["lanes"][0]["secret"]).public_key == ga["lanes"][0]["public"]
        assert all(StrKey.is_valid_contract(c) for c in ga["contracts"].values())
        assert Asset("USDC", ga["issuer"]["public"]).contract_id(ga["passphrase"]) == ga["contracts"]["usdc"]
        assert a.rpc("devnet_genesis")["contracts"] == ga["contracts"]
    finally:
        a.stop()
        b.stop()


def test_state_survives_restart_and_crash(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    dev = start_devnet(tmp_path, state=state, lanes=1, users=1)
    with SorobanServer(dev.url) as server:
        h = _pay(server, dev)
        dev.close_ledger()
        ledger = server.get_latest_ledger()
    assert dev.stop() == 0
    dev = start_devnet(tmp_path, state=state, lanes=1, users=1)
    with SorobanServer(dev.url) as server:
        assert dev.genesis["contracts"] and server.get_latest_ledger().sequence == ledger.sequence
        assert server.get_latest_ledger().close_time == ledger.close_time  # not the wall clock
        assert server.get_transaction(h).status == GetTransactionStatus.SUCCESS
        h2 = _pay(server, dev)
        dev.close_ledger()
    dev.kill()  # no shutdown hook: the state written at the last close must be enough
    dev = start_devnet(tmp_path, state=state, lanes=1, users=1)
    with SorobanServer(dev.url) as server:
        assert server.get_transaction(h2).status == GetTransactionStatus.SUCCESS
        assert server.get_latest_ledger().sequence == ledger.sequence + 1
    dev.stop()


def test_automatic_ledger_interval(tmp_path: Path) -> None:
    dev = start_devnet(tmp_path, ledger_interval="200ms", lanes=0, users=0)
    try:
        first = dev.rpc("getLatestLedger")
        time.sleep(1.0)
        later = dev.rpc("getLatestLedger")
        closed = later["sequence"] - first["sequence"]
        assert closed >= 2
        # close time moves by whole seconds per ledger, not by the host clock
        assert int(later["closeTime"]) - int(first["closeTime"]) == closed
    finally:
        dev.stop()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paygate_cli", "devnet", *args], capture_output=True, text=True,
                          timeout=60)


def test_cli_wrappers(tmp_path: Path) -> None:
    dev = start_devnet(tmp_path, lanes=1, users=1)
    try:
        r = _cli("close", "--url", dev.url, "-n", "2", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["latestLedger"] == 3
        who = Keypair.random().public_key
        r = _cli("fund", who, "--url", dev.url, "--xlm", "50000000", "--usdc", "7", "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["xlm"] == 50_000_000 and doc["usdc"] == 7
        r = _cli("fault", "slow", "--url", dev.url, "--ms", "10", "--count", "1", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["faults"][0]["kind"] == "slow"
        r = _cli("state", "--url", dev.url, "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["latestLedger"] == 3
        r = _cli("fault", "clear", "--url", dev.url, "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["faults"] == []
        r = _cli("fault", "bogus", "--url", dev.url)
        assert r.returncode == 2
    finally:
        dev.stop()
    r = _cli("state", "--url", dev.url)
    assert r.returncode == 69  # unreachable devnet → Unavailable
    r = _cli("start", "--port", "0", "--ledger-interval", "often")
    assert r.returncode == 2 and "ledger-interval" in r.stderr
