"""Recovery: the grace rule (78), a worker killed mid-delivery taken over after the grace window,
recovery racing live workers on the same rows (real processes), stuck items as findings."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.support.chain_env import chain_environ, recovery_environ
from tests.support.cli import run_cli, spawn
from tests.support.devnet_support import start_devnet
from tests.support.drill_support import crash_tick
from tests.support.webhook_receiver import Receiver

SECRET = "whsec_test_0123456789abcdef"
FAST = {"PAYGATE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1/32", "PAYGATE_WEBHOOK_LEASE": "1s",
        "PAYGATE_WEBHOOK_TIMEOUT": "1s", "PAYGATE_RPC_TIMEOUT": "0.5s", "PAYGATE_RECOVERY_GRACE": "11s"}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver().start()
    yield server
    server.stop()


def endpoint(db: psycopg.Connection, url: str) -> int:
    return db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES (%s, %s) RETURNING id",
                      (url, SECRET)).fetchone()[0]


@pytest.fixture
def env(dsn: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Recovery declares what it needs to drive the money paths' lineages (rpc, keys, contracts):
    a devnet-wired environment, with the fast timeouts above."""
    handle = start_devnet(tmp_path / "devnet", lanes=1, users=1)
    yield {**chain_environ(handle, dsn, tmp_path / "keys"), **FAST}
    handle.stop()


def recover(env: dict[str, str], **extra: str) -> tuple[int, dict]:
    result = run_cli("run-tick", "recovery", "--json", environ={**env, **extra})
    return result.code, (json.loads(result.out)["run_tick"]["last_details"] if result.out else {"err": result.err})


def test_a_grace_not_above_receipt_timeout_plus_a_tick_is_refused(env: dict[str, str]) -> None:
    code, details = recover(env, PAYGATE_RECOVERY_GRACE="2s")  # not above any receipt timeout + tick
    assert code == 78 and "must exceed" in details["err"]
    assert recover(env)[0] == 0


def test_recovery_needs_rpc_and_the_journal_keys_and_no_seed(env: dict[str, str]) -> None:
    least = recovery_environ(env)
    assert recover(least)[0] == 0  # no lane or fee seed, no contract id: it works
    without_journal = {k: v for k, v in least.items() if k != "PAYGATE_JOURNAL_KEYS_FILE"}
    code, details = recover(without_journal)
    assert code == 78 and "recovery cannot work: missing journal keys (PAYGATE_JOURNAL_KEYS_FILE)" in details["err"]
    assert "PAYGATE_LANE_SECRETS_FILE" not in details["err"] and "PAYGATE_FEE_SECRET_FILE" not in details["err"]
    code, details = recover({k: v for k, v in least.items() if k != "PAYGATE_RPC_URL"})
    assert code == 78 and "missing an RPC endpoint (PAYGATE_RPC_URL)" in details["err"]


def test_a_worker_killed_mid_delivery_is_taken_over_after_the_grace(env: dict[str, str], db: psycopg.Connection,
                                                                    receiver: Receiver) -> None:
    outbox_id = db.execute("INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload) VALUES "
                           "(%s, 't', %s) RETURNING id", (endpoint(db, receiver.base + "/ok"), Jsonb({}))).fetchone()[0]
    crash_tick(env, "webhooks", "webhooks.after_claim")  # died there, holding the row
    token = db.execute("SELECT lease_token FROM paygate.webhook_outbox WHERE status = 'delivering'").fetchone()[0]
    assert token is not None and receiver.requests == []
    code, details = recover(env)  # the lease has not lapsed by the grace yet: hands off
    assert code == 0 and details["webhooks"] == {} and details["deposits"] == {}
    time.sleep(12.2)  # lease 1 s + grace 11 s, DB time
    code, details = recover(env)
    assert code == 0 and details["webhooks"] == {"pending": 1}
    row = db.execute("SELECT status, lease_token, attempts, last_error FROM paygate.webhook_outbox WHERE id = %s",
                     (outbox_id,)).fetchone()
    assert row[:3] == ("pending", None, 1) and "recovery" in row[3]
    # The dead worker's late settle cannot overwrite anything: its token is gone.
    from paygate_cli.queues.webhooks import SETTLE_SQL

    assert db.execute(SETTLE_SQL, {"status": "delivered", "code": 200, "error": None, "dead_reason": None,
                                   "delay": 0, "id": outbox_id, "token": token}).rowcount == 0
    assert run_cli("run-tick", "webhooks", environ=env).code == 0
    assert db.execute("SELECT status, attempts FROM paygate.webhook_outbox WHERE id = %s",
                      (outbox_id,)).fetchone() == ("delivered", 2)
    assert len(receiver.requests) == 1


def test_recovery_racing_live_workers_on_the_same_rows(env: dict[str, str], db: psycopg.Connection,
                                                       receiver: Receiver) -> None:
    endpoint_id = endpoint(db, receiver.base + "/ok")
    # 60 deliveries whose workers died an hour ago: both recovery and the webhook workers take over
    # lapsed rows, through the same routine.
    db.execute("INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload, status, attempts, lease_token,"
               " lease_expires_at, claimed_by) SELECT %s, 't', jsonb_build_object('n', n), 'delivering', 1,"
               " gen_random_uuid(), now() - interval '1 hour', 'dead-host:0' FROM generate_series(1, 60) n",
               (endpoint_id,))
    # A lease long enough that no live taker's own claim lapses under a loaded machine: a row whose
    # lease did lapse is rightly taken over again (a third attempt), which is not what this counts.
    environ = {**env, "PAYGATE_WEBHOOK_LEASE": "10s"}
    procs = [spawn("run-tick", "recovery", "--every", "0.05s", "--for", "5s", "--batch", "3", environ=environ),
             spawn("run-tick", "recovery", "--every", "0.05s", "--for", "5s", "--batch", "3", environ=environ),
             spawn("run-tick", "webhooks", "--every", "0.05s", "--for", "5s", "--batch", "4", environ=environ),
             spawn("run-tick", "webhooks", "--every", "0.05s", "--for", "5s", "--batch", "4", environ=environ)]
    for proc in procs:
        proc.wait(timeout=60)
        assert proc.returncode == 0, (proc.args, proc.returncode, proc.stderr.read()[-3000:])
    rows = db.execute("SELECT status, attempts FROM paygate.webhook_outbox").fetchall()
    assert Counter(rows) == Counter({("delivered", 2): 60})  # each taken over once, claimed once
    seen = Counter(r["headers"]["Paygate-Event-Id"] for r in receiver.requests)
    assert len(seen) == 60 and set(seen.values()) == {1}  # each delivered exactly once
    taken_by_recovery = db.execute("SELECT sum(processed) FROM paygate.worker_runs WHERE worker = 'recovery'"
                                   ).fetchone()[0]
    assert 0 < taken_by_recovery <= 60  # recovery won some rows; the rest went to the workers


def test_items_stuck_beyond_the_alarm_age_are_findings_until_they_move(env: dict[str, str],
                                                                       db: psycopg.Connection) -> None:
    account = "G" + "A" * 55
    db.execute("INSERT INTO paygate.accounts (address) VALUES (%s)", (account,))
    deposit = db.execute("INSERT INTO paygate.deposits (account, amount, auth_entry, auth_nonce, "
                         "auth_expiration_ledger, idempotency_key, created_at) VALUES (%s, 5, 'AAAA', 1, 10, 'k', "
                         "now() - interval '2 hours') RETURNING id", (account,)).fetchone()[0]
    code, details = recover(env, PAYGATE_RECOVERY_ALARM_AGE="1h")
    assert code == 3 and details["stuck"] == {"open": 1, "new": 1, "cleared": 0}  # alerted once ...
    code, details = recover(env, PAYGATE_RECOVERY_ALARM_AGE="1h")
    assert code == 0 and details["stuck"]["new"] == 0  # ... not again
    finding = db.execute("SELECT subject, seen_count FROM paygate.findings WHERE resolved_at IS NULL").fetchone()
    assert finding == (f"deposit:{deposit}", 2)
    db.execute("UPDATE paygate.deposits SET status = 'failed', reason = 'x' WHERE id = %s", (deposit,))
    code, details = recover(env, PAYGATE_RECOVERY_ALARM_AGE="1h")
    assert code == 0 and details["stuck"]["cleared"] == 1
    assert db.execute("SELECT resolved_by FROM paygate.findings").fetchone()[0] == "recovery"


def test_a_bot_job_queued_beyond_the_alarm_age_is_a_finding_until_it_ends(env: dict[str, str],
                                                                         db: psycopg.Connection) -> None:
    job = db.execute("INSERT INTO paygate.bot_jobs (job_key, request_hash, contract, function, args_xdr, created_at) "
                     "VALUES ('k', '\\x00', %s, 'close_expired', 'AAAAEAAAAAE=', now() - interval '2 hours') "
                     "RETURNING id", ("C" + "A" * 55,)).fetchone()[0]
    code, details = recover(env, PAYGATE_RECOVERY_ALARM_AGE="1h")
    assert code == 3 and details["stuck"]["new"] == 1 and details["bot_jobs"] == {}  # no lease lapsed: not taken
    assert db.execute("SELECT subject FROM paygate.findings WHERE resolved_at IS NULL").fetchall() == [
        (f"bot_job:{job}",)]
    db.execute("UPDATE paygate.bot_jobs SET status = 'dead', reason = 'x', finished_at = now() WHERE id = %s", (job,))
    code, details = recover(env, PAYGATE_RECOVERY_ALARM_AGE="1h")
    assert code == 0 and details["stuck"]["cleared"] == 1


@pytest.mark.parametrize("worker", ["recovery", "reconciler"])
def test_an_idle_safety_tick_does_not_import_stellar_sdk(env: dict[str, str], worker: str) -> None:
    import subprocess
    import sys

    probe = ("import sys\nfrom paygate_cli.__main__ import main\n"
             f"code = main(['run-tick', '{worker}', '--json'])\n"
             "print('RESULT', code, 'stellar_sdk' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert proc.stdout.strip().splitlines()[-1].split() == ["RESULT", "0", "False"], proc.stderr[-2000:]
