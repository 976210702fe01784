"""`replay`: a dead webhook delivery replayed is delivered (same event id, attempts reset, audited);
deposits refused per row when their effect is already on chain (re-verified on the devnet), their
lineage is not terminal, or their authorisation expired; a replayable deposit settles afterwards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.chain_env import ChainEnv, admit_deposit, chain_environ, sign_deposit
from tests.support.cli import base_environ, run_cli
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.funding import submit_directly
from tests.support.pg import hand_edit
from tests.support.webhook_receiver import Receiver
from tests.support.webhooks import SECRET, dead_webhook

AMOUNT = 3_000_000


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver().start()
    yield server
    server.stop()


def test_replaying_a_dead_webhook_delivers_it(dsn: str, db: psycopg.Connection, receiver: Receiver) -> None:
    outbox_id = dead_webhook(db, receiver.base + "/ok")
    pending = db.execute("INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload) SELECT endpoint_id, "
                         "'x', '{}' FROM paygate.webhook_outbox WHERE id = %s RETURNING id", (outbox_id,)).fetchone()[0]
    event_id = db.execute("SELECT event_id FROM paygate.webhook_outbox WHERE id = %s", (outbox_id,)).fetchone()[0]

    refused = run_cli("replay", "webhooks", "--all-dead", dsn=dsn)
    assert refused.code == 2 and "--yes" in refused.err  # no TTY, no --yes: nothing changed
    dry = run_cli("replay", "webhooks", "--all-dead", "--dry-run", "--json", dsn=dsn)
    assert dry.code == 0 and json.loads(dry.out)["replay"]["rows"][0]["outcome"] == "would_replay"
    assert db.execute("SELECT status FROM paygate.webhook_outbox WHERE id = %s", (outbox_id,)).fetchone()[0] == "dead"

    result = run_cli("replay", "webhooks", str(outbox_id), str(pending), "--yes", "--json", dsn=dsn)
    document = json.loads(result.out)["replay"]
    assert result.code == 1  # one row refused
    assert {r["id"]: r["outcome"] for r in document["rows"]} == {outbox_id: "replayed", pending: "refused"}
    assert "not dead (status pending)" in document["rows"][1]["reason"]
    row = db.execute("SELECT status, attempts, event_id, last_error, dead_at FROM paygate.webhook_outbox "
                     "WHERE id = %s", (outbox_id,)).fetchone()
    assert row == ("pending", 0, event_id, "HTTP 500", None)  # same idempotency key, history kept
    audit = db.execute("SELECT action, target, details FROM paygate.audit_log").fetchall()
    assert [(a, t) for a, t, _ in audit] == [("replay.webhooks", f"webhooks:{outbox_id}")]
    assert audit[0][2]["was"]["attempts"] == 8

    environ = base_environ(dsn, PAYGATE_WEBHOOK_ALLOW_HOSTS="127.0.0.1/32")
    assert run_cli("run-tick", "webhooks", environ=environ).code == 0
    assert db.execute("SELECT status, attempts FROM paygate.webhook_outbox WHERE id = %s",
                      (outbox_id,)).fetchone() == ("delivered", 1)
    delivered = [r for r in receiver.requests if r["headers"]["Paygate-Event-Id"] == str(event_id)]
    assert len(delivered) == 1 and json.loads(delivered[0]["body"])["data"] == {"charge": 7}


def test_usage_errors(dsn: str) -> None:
    assert run_cli("replay", "payouts", "1", "--yes", dsn=dsn).code == 2  # not a replayable queue
    assert run_cli("replay", "webhooks", "--yes", dsn=dsn).code == 2  # neither IDS nor --all-dead
    assert run_cli("replay", "webhooks", "1", "--all-dead", "--yes", dsn=dsn).code == 2


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=3)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))


def status_of(db: psycopg.Connection, pending_id: int) -> str:
    return db.execute("SELECT status FROM paygate.deposits WHERE id = %s", (pending_id,)).fetchone()[0]


def test_deposit_replay_refusals_and_a_replay_that_settles(chain: ChainEnv, db: psycopg.Connection) -> None:
    users = chain.genesis["users"]
    # 1. Already on chain: the user's authorisation was spent outside paygate (needs_human).
    entry, nonce, expiration = sign_deposit(chain.devnet, users[0]["secret"], AMOUNT)
    submit_directly(chain, entry, users[0]["public"], AMOUNT)
    spent = admit_deposit(db, users[0]["public"], AMOUNT, entry, nonce, expiration, "spent")
    # 2. Authorisation expired.
    entry, nonce, expiration = sign_deposit(chain.devnet, users[1]["secret"], AMOUNT, valid_ledgers=2)
    expired = admit_deposit(db, users[1]["public"], AMOUNT, entry, nonce, expiration, "expired")
    chain.devnet.close_ledger(3)
    assert chain.tick("funding").code == 3
    assert (status_of(db, spent), status_of(db, expired)) == ("needs_human", "expired")
    # 3. Not terminal: its deposit transaction is in flight when the row is (wrongly) marked failed.
    entry, nonce, expiration = sign_deposit(chain.devnet, users[2]["secret"], AMOUNT)
    in_flight = admit_deposit(db, users[2]["public"], AMOUNT, entry, nonce, expiration, "in-flight")
    assert chain.tick("funding").code == 0
    db.execute("UPDATE paygate.deposits SET status = 'failed', reason = 'hand edit', lease_token = NULL, "
               "lease_expires_at = NULL WHERE id = %s", (in_flight,))

    result = run_cli("replay", "deposits", "--all-dead", "--yes", "--json", environ=chain.environ)
    assert result.code == 1, result.err
    reasons = {r["id"]: r.get("reason", "") for r in json.loads(result.out)["replay"]["rows"]}
    assert "effect already on chain: authorisation nonce" in reasons[spent]
    assert "authorisation expired at ledger" in reasons[expired]
    assert "is not terminal" in reasons[in_flight] and ":sent" in reasons[in_flight]
    assert (status_of(db, spent), status_of(db, expired), status_of(db, in_flight)) == (
        "needs_human", "expired", "failed")
    assert db.execute("SELECT count(*) FROM paygate.audit_log WHERE action = 'replay.deposits'").fetchone()[0] == 0

    # 4. Put the hand edit right; once its deposit applied it is on chain: a replay is refused for that.
    hand_edit(db, "UPDATE paygate.deposits SET status = 'pending', reason = NULL WHERE id = %s", (in_flight,))
    chain.devnet.close_ledger()
    assert chain.tick("funding").code == 0
    assert db.execute("SELECT deposit_tx IS NOT NULL FROM paygate.deposits WHERE id = %s",
                      (in_flight,)).fetchone()[0]
    for _ in range(6):
        chain.devnet.close_ledger()
        chain.tick("funding")
    assert status_of(db, in_flight) == "settled"
    hand_edit(db, "UPDATE paygate.deposits SET status = 'failed', reason = 'hand edit', settled_at = NULL "
               "WHERE id = %s", (in_flight,))
    result = run_cli("replay", "deposits", str(in_flight), "--yes", "--json", environ=chain.environ)
    assert result.code == 1
    assert "its deposit transaction applied" in json.loads(result.out)["replay"]["rows"][0]["reason"]

    # 5. A dead deposit whose authorisation is unspent and unexpired is replayed and then settles.
    db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES ('http://127.0.0.1:9/h', %s)", (SECRET,))
    entry, nonce, expiration = sign_deposit(chain.devnet, users[2]["secret"], AMOUNT)
    retry = admit_deposit(db, users[2]["public"], AMOUNT, entry, nonce, expiration, "retry")
    db.execute("UPDATE paygate.deposits SET status = 'failed', reason = 'simulated outage', attempts = 5 "
               "WHERE id = %s", (retry,))
    result = run_cli("replay", "deposits", str(retry), "--yes", "--json", environ=chain.environ)
    assert result.code == 0, result.out + result.err
    row = db.execute("SELECT status, attempts, idempotency_key FROM paygate.deposits WHERE id = %s",
                     (retry,)).fetchone()
    assert row == ("pending", 0, "retry")
    assert db.execute("SELECT count(*) FROM paygate.webhook_outbox WHERE event_type = 'deposit.replayed'"
                      ).fetchone()[0] == 1
    for _ in range(6):
        chain.tick("funding")
        chain.devnet.close_ledger()
    assert status_of(db, retry) == "settled"


def test_on_a_tty_a_progress_bar_goes_to_stderr_and_the_table_to_stdout(dsn: str, db: psycopg.Connection) -> None:
    import io

    from paygate_cli.__main__ import main
    from paygate_cli.env import Env
    from tests.support.cli import _FakeTTY

    ids = [dead_webhook(db, "http://127.0.0.1:9/h") for _ in range(3)]
    out, err = io.StringIO(), _FakeTTY()
    env = Env(stdin=_FakeTTY("y\n"), stdout=out, stderr=err, environ=base_environ(dsn, NO_COLOR="1"))
    assert main(["replay", "webhooks", "--all-dead"], env=env) == 0  # confirmed at the prompt
    assert "replay 3 webhooks row(s) on database " in err.getvalue() and "? [y/N]" in err.getvalue()
    assert "3 replayed" in out.getvalue() and all(str(i) in out.getvalue() for i in ids)
    assert db.execute("SELECT count(*) FROM paygate.webhook_outbox WHERE status = 'pending'").fetchone()[0] == 3


def _dead_deposit(chain: ChainEnv, db: psycopg.Connection, key: str) -> int:
    user = chain.genesis["users"][0]
    entry, nonce, expiration = sign_deposit(chain.devnet, user["secret"], AMOUNT)
    pending = admit_deposit(db, user["public"], AMOUNT, entry, nonce, expiration, key)
    db.execute("UPDATE paygate.deposits SET status = 'failed', reason = 'simulated outage' WHERE id = %s",
               (pending,))
    return pending


def test_replay_refuses_a_quorum_of_one_endpoint_without_the_override(chain: ChainEnv,
                                                                      db: psycopg.Connection) -> None:
    """The money movers' rule: re-verifying on chain needs 3 distinct read hosts, or the override."""
    pending = _dead_deposit(chain, db, "quorum")
    single = {k: v for k, v in chain.environ.items() if k != "PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT"}
    refused = run_cli("replay", "deposits", str(pending), "--dry-run", environ=single)
    assert refused.code == 78, refused.err
    assert "PAYGATE_RPC_READ_URLS" in refused.err and "PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT" in refused.err
    assert len(refused.err.strip().splitlines()) == 1
    allowed = run_cli("replay", "deposits", str(pending), "--dry-run", "--json", environ=chain.environ)
    assert allowed.code == 0, allowed.err
    assert json.loads(allowed.out)["replay"]["rows"][0]["outcome"] == "would_replay"


def test_replay_dry_run_with_the_rpc_down_exits_69_with_one_clean_line(chain: ChainEnv,
                                                                       db: psycopg.Connection) -> None:
    pending = _dead_deposit(chain, db, "rpc-down")
    down = {**chain.environ, "PAYGATE_RPC_URL": "http://user:pw@127.0.0.1:9/v1/k?apikey=SECRETKEY",
            "PAYGATE_RPC_TIMEOUT": "1s"}
    result = run_cli("replay", "deposits", str(pending), "--dry-run", environ=down)
    assert result.code == 69, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "read endpoint" in lines[0] and "Traceback" not in result.err, result.err
    assert "SECRETKEY" not in result.err + result.out and "pw@" not in result.err and "/v1/k" not in result.err
    assert status_of(db, pending) == "failed"
