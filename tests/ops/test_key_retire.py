"""`key-retire-check`: a journal key rotation and a lane rotation end to end, as a runbook runs them,
against a real devnet: exit 3 while a lineage is live or the retention has not passed, 0 only after."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.chain_env import JOURNAL_KEY_ID, ChainEnv, admit_deposit, chain_environ, sign_deposit
from tests.support.cli import Result, run_cli
from tests.support.devnet_support import DevnetHandle, start_devnet

AMOUNT = 5_000_000
NEW_KEY_ID = "k2027"


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=3, users=2)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))


def check(chain: ChainEnv, *args: str, **extra: str) -> tuple[Result, dict]:
    result = run_cli("key-retire-check", *args, "--json", environ={**chain.environ, **extra})
    assert result.code in (0, 3), result.err
    return result, json.loads(result.out)["key_retire_check"]


def deposit(chain: ChainEnv, db: psycopg.Connection, n: int) -> int:
    user = chain.genesis["users"][0]
    entry, nonce, expiration = sign_deposit(chain.devnet, user["secret"], AMOUNT, valid_ledgers=200)
    return admit_deposit(db, user["public"], AMOUNT, entry, nonce, expiration, f"dep-{n}")


def settle_all(chain: ChainEnv, db: psycopg.Connection, **extra: str) -> None:
    for _ in range(15):
        assert chain.tick("funding", **extra).code in (0, 1)
        if not db.execute("SELECT count(*) FROM paygate.deposits WHERE status = 'pending'").fetchone()[0] \
                and not db.execute("SELECT count(*) FROM paygate.lineages WHERE state IN "
                                   "('allocated', 'signed', 'sent')").fetchone()[0]:
            return
        chain.devnet.close_ledger()
    raise AssertionError("funding did not settle")


def test_journal_key_rotation_end_to_end(chain: ChainEnv, db: psycopg.Connection, tmp_path: Path) -> None:
    old = {"PAYGATE_INSTANCE_ID": "host-old"}
    deposit(chain, db, 1)
    assert chain.tick("funding", **old).code == 0  # the deposit is sent under the old key, not landed yet
    assert db.execute("SELECT key_id, state FROM paygate.lineages").fetchall() == [(JOURNAL_KEY_ID, "sent")]

    # 1. Add the new key next to the old one and make it the active one.
    keys_file = Path(chain.environ["PAYGATE_JOURNAL_KEYS_FILE"])
    keys = json.loads(keys_file.read_text())
    keys_file.write_text(json.dumps({**keys, NEW_KEY_ID: os.urandom(32).hex()}))
    chain.environ["PAYGATE_JOURNAL_ACTIVE_KEY_ID"] = NEW_KEY_ID
    # 2. Drain the host that ran with the old configuration; it holds no lease between ticks.
    drained = run_cli("drain", "--instance", "host-old", "--wait", "10s", "--yes", environ=chain.environ)
    assert drained.code == 0, drained.err
    # 3. The old key is not retirable while one of its lineages is live.
    result, report = check(chain, JOURNAL_KEY_ID, PAYGATE_KEY_RETENTION="0s")
    assert result.code == 3 and not report["retirable"]
    assert any("not terminal" in b["reason"] for b in report["blockers"])
    # The active key never is.
    result, report = check(chain, NEW_KEY_ID, PAYGATE_KEY_RETENTION="0s")
    assert result.code == 3 and "active journal key" in report["blockers"][0]["reason"]

    # 4. The new host resolves the old lineage (same bytes) and signs the credit with the new key.
    settle_all(chain, db, PAYGATE_INSTANCE_ID="host-new")
    assert db.execute("SELECT purpose, key_id, state FROM paygate.lineages ORDER BY id").fetchall() == [
        ("deposit", JOURNAL_KEY_ID, "applied"), ("credit", NEW_KEY_ID, "applied")]
    # 5. Every lineage is terminal and confirmed on chain, but the retention has not passed: still 3.
    result, report = check(chain, JOURNAL_KEY_ID, PAYGATE_KEY_RETENTION="1h")
    assert result.code == 3 and report["blocker_count"] == 1 and "retention" in report["blockers"][0]["reason"]
    time.sleep(1.2)
    result, report = check(chain, JOURNAL_KEY_ID, PAYGATE_KEY_RETENTION="1s")
    assert result.code == 0 and report["retirable"] and report["checked"]["lineages"] == 1

    # 6. Remove the old key: the money paths keep working without it.
    keys_file.write_text(json.dumps({NEW_KEY_ID: json.loads(keys_file.read_text())[NEW_KEY_ID]}))
    deposit(chain, db, 2)
    settle_all(chain, db, PAYGATE_INSTANCE_ID="host-new")
    assert db.execute("SELECT count(*) FROM paygate.deposits WHERE status = 'settled'").fetchone()[0] == 2


def test_a_receipt_the_chain_does_not_confirm_blocks_retirement(chain: ChainEnv, db: psycopg.Connection) -> None:
    deposit(chain, db, 1)
    settle_all(chain, db)
    lineage_id = db.execute("SELECT id FROM paygate.lineages WHERE purpose = 'credit'").fetchone()[0]
    # Forge the journal: pretend the credit failed. The chain says SUCCESS, so the check must refuse.
    db.execute("ALTER TABLE paygate.lineages DISABLE TRIGGER lineage_transition_guard")
    db.execute("UPDATE paygate.lineages SET state = 'failed' WHERE id = %s", (lineage_id,))
    db.execute("ALTER TABLE paygate.lineages ENABLE TRIGGER lineage_transition_guard")
    result, report = check(chain, JOURNAL_KEY_ID, PAYGATE_KEY_RETENTION="0s", PAYGATE_JOURNAL_ACTIVE_KEY_ID="other",
                           PAYGATE_JOURNAL_KEYS_FILE=chain.environ["PAYGATE_JOURNAL_KEYS_FILE"])
    assert result.code == 3
    assert [b["lineage_id"] for b in report["blockers"]] == [lineage_id]
    assert "FAILED not confirmed" in report["blockers"][0]["reason"]


def test_lane_rotation_end_to_end(chain: ChainEnv, db: psycopg.Connection) -> None:
    deposit(chain, db, 1)
    assert chain.tick("funding").code == 0
    lane = db.execute("SELECT lane FROM paygate.lineages WHERE state = 'sent'").fetchone()[0]
    # Not drained yet: refused (and its lineage is live).
    result, report = check(chain, "--lane", lane, PAYGATE_KEY_RETENTION="0s")
    assert result.code == 3 and any("drain it first" in b["reason"] for b in report["blockers"])
    assert run_cli("drain", "--lane", lane, "--reason", "rotate", "--yes", environ=chain.environ).code == 0
    result, report = check(chain, "--lane", lane, PAYGATE_KEY_RETENTION="0s")
    assert result.code == 3 and [b["reason"] for b in report["blockers"]] == [
        f"lineage {report['blockers'][0]['lineage_id']} is sent (not terminal)"]
    # In-flight work on the drained lane finishes; new work goes to other lanes.
    settle_all(chain, db)
    lanes_used = db.execute("SELECT purpose, lane FROM paygate.lineages ORDER BY id").fetchall()
    assert lanes_used[0] == ("deposit", lane) and lanes_used[1][1] != lane
    result, report = check(chain, "--lane", lane, PAYGATE_KEY_RETENTION="1h")
    assert result.code == 3 and "retention" in report["blockers"][0]["reason"]
    time.sleep(1.2)
    result, report = check(chain, "--lane", lane, PAYGATE_KEY_RETENTION="1s")
    assert result.code == 0, report
    assert report["checked"]["chain_seq"] == report["checked"]["journal_last_consumed_seq"]
    # Remove the lane's secret: funding keeps working on the remaining lanes.
    lanes_file = Path(chain.environ["PAYGATE_LANE_SECRETS_FILE"])
    secrets = [s for s in lanes_file.read_text().split() if s]
    from stellar_sdk import Keypair

    lanes_file.write_text("".join(s + "\n" for s in secrets if Keypair.from_secret(s).public_key != lane))
    deposit(chain, db, 2)
    settle_all(chain, db)
    assert db.execute("SELECT count(*) FROM paygate.lineages WHERE lane = %s", (lane,)).fetchone()[0] == 1


def test_a_key_or_lane_nobody_knows_is_a_usage_error_listing_the_known_ones(chain: ChainEnv) -> None:
    typo = run_cli("key-retire-check", "k-typo", environ=chain.environ)
    assert typo.code == 2, typo.err
    assert "k-typo" in typo.err and JOURNAL_KEY_ID in typo.err and "retirable" not in typo.out
    unknown = run_cli("key-retire-check", "--lane", "G" + "Q" * 55, environ=chain.environ)
    assert unknown.code == 2 and "G" + "Q" * 55 in unknown.err and "known lanes" in unknown.err, unknown.err


def test_one_read_endpoint_is_no_majority_without_the_override(chain: ChainEnv, db: psycopg.Connection) -> None:
    deposit(chain, db, 1)
    settle_all(chain, db)
    single = {k: v for k, v in chain.environ.items() if k != "PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT"}
    for args in ((JOURNAL_KEY_ID,), ("--lane", chain.genesis["lanes"][0]["public"])):
        refused = run_cli("key-retire-check", *args, environ={**single, "PAYGATE_KEY_RETENTION": "0s"})
        assert refused.code == 78, refused.err
        assert "PAYGATE_RPC_READ_URLS" in refused.err and "PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT" in refused.err
    _, report = check(chain, JOURNAL_KEY_ID, PAYGATE_KEY_RETENTION="0s")
    assert report["checked"]["lineages"] >= 2  # with the override it decides (3: it is the active key)


def test_the_rpc_down_is_69_not_a_blocker(chain: ChainEnv, db: psycopg.Connection) -> None:
    deposit(chain, db, 1)
    settle_all(chain, db)
    down = {**chain.environ, "PAYGATE_RPC_URL": "http://user:pw@127.0.0.1:9/v1/k?apikey=SECRETKEY",
            "PAYGATE_RPC_TIMEOUT": "1s", "PAYGATE_KEY_RETENTION": "0s"}
    for args in ((JOURNAL_KEY_ID,), ("--lane", db.execute("SELECT lane FROM paygate.lineages LIMIT 1").fetchone()[0])):
        result = run_cli("key-retire-check", *args, environ=down)
        assert result.code == 69, (args, result.code, result.out, result.err)
        assert "SECRETKEY" not in result.err + result.out and "pw@" not in result.err + result.out
