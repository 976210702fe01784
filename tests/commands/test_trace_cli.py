"""`paygate trace` as a command: its three output forms, its usage errors (an unknown unit is 2),
a database outage (69), and what makes it exit 3 from the database alone (a unit that needs a
human, an open finding naming it). A queued bot job has no lineage yet, so nothing here needs the
chain: no devnet, and no RPC configured (the chain side is read only when there is something on it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import StrKey, scval

from paygate_cli.errors import ExitCode
from tests.support.cli import run_cli
from tests.support.pg import hand_edit


@pytest.fixture
def job(db: psycopg.Connection) -> int:
    contract = StrKey.encode_contract(os.urandom(32))
    db.execute("INSERT INTO paygate.bot_job_allowlist (contract, function) VALUES (%s, 'close_expired')", (contract,))
    row = db.execute("SELECT bot_job_id FROM paygate.admit_bot_job('close:trace', %s, 'close_expired', %s)",
                     (contract, scval.to_vec([]).to_xdr())).fetchone()
    return int(row[0])


def test_json_plain_and_human_say_the_same_verdict(dsn: str, job: int) -> None:
    result = run_cli("trace", "bot-job", str(job), "--json", dsn=dsn)
    assert result.code == ExitCode.OK, result.err
    doc = json.loads(result.out)
    assert doc["schema_version"] and doc["unit"] == {"kind": "bot-job", "id": job}
    assert [(e["source"], e["kind"]) for e in doc["timeline"]] == [("db", "admitted")]
    assert doc["timeline"][0]["details"]["job_key"] == "close:trace"
    assert doc["verdict"] == {"agree": False, "regime": "in_flight", "where": "no fee spent yet",
                              "explanation": "queued; the drainer has not claimed it yet", "chain_readable": True}

    plain = run_cli("trace", "bot-job", str(job), "--plain", dsn=dsn)
    assert plain.code == ExitCode.OK, plain.err
    header, admitted, verdict = [line.split("\t") for line in plain.out.splitlines()]
    assert header == ["at", "source", "kind", "ledger", "details"]
    assert admitted[1:3] == ["db", "admitted"] and "job_key=close:trace" in admitted[4]
    assert verdict[1:3] == ["verdict", "in_flight"] and "where=no fee spent yet" in verdict[4]

    human = run_cli("trace", "bot-job", str(job), dsn=dsn)
    assert human.code == ExitCode.OK, human.err
    assert human.out.startswith(f"bot-job {job}: in_flight — queued; the drainer has not claimed it yet\n"
                                "where the money is: no fee spent yet\n"), human.out
    assert "None" not in human.out


@pytest.mark.parametrize(("args", "said"), [
    (["deposti", "1"], "is not one of deposit, charge, relay, bot-job, tx, account"),
    (["deposit", "abc"], "is not an id"),
    (["charge", "0"], "is not an id"),
    (["tx", "abc"], "is not a transaction hash"),
    (["account", "gabc"], "is not a Stellar address"),
    (["bot-job", "424242"], "no bot job 424242"),
    (["deposit", "7", "--json", "--plain"], "mutually exclusive"),
])
def test_a_bad_or_unknown_unit_is_a_usage_error(dsn: str, args: list[str], said: str) -> None:
    result = run_cli("trace", *args, dsn=dsn)
    assert result.code == ExitCode.USAGE and said in result.err, (result.code, result.err)


def test_a_database_outage_is_69(tmp_path: Path) -> None:
    nowhere = f"postgresql:///postgres?host={tmp_path}&port=1&user=postgres"
    result = run_cli("trace", "deposit", "1", dsn=nowhere)
    assert result.code == ExitCode.UNAVAILABLE, result.err


def test_a_unit_that_needs_a_human_or_an_open_finding_is_exit_3(dsn: str, db: psycopg.Connection, job: int) -> None:
    db.execute("INSERT INTO paygate.audit_log (actor, action, target) VALUES ('oncall', 'replay.bot_jobs', %s)",
               (f"bot_jobs:{job}",))
    db.execute("INSERT INTO paygate.findings (kind, subject, summary) VALUES ('stuck', %s, 'queued for too long')",
               (f"bot_job:{job}",))
    result = run_cli("trace", "bot-job", str(job), "--json", dsn=dsn)
    assert result.code == ExitCode.NEEDS_HUMAN, result.err
    doc = json.loads(result.out)
    assert doc["verdict"]["regime"] == "unexplained" and "queued for too long" in doc["verdict"]["explanation"]
    assert {"audit", "finding"} <= {e["kind"] for e in doc["timeline"]}
    db.execute("UPDATE paygate.findings SET resolved_at = now(), resolved_by = 'oncall'")
    assert run_cli("trace", "bot-job", str(job), dsn=dsn).code == ExitCode.OK

    hand_edit(db, "UPDATE paygate.bot_jobs SET status = 'needs_human', reason = 'envelope does not decrypt', "
                  "finished_at = now() WHERE id = %s", (job,))
    result = run_cli("trace", "bot-job", str(job), "--json", dsn=dsn)
    assert result.code == ExitCode.NEEDS_HUMAN, result.err
    assert "needs a human: envelope does not decrypt" in json.loads(result.out)["verdict"]["explanation"]


def test_a_claim_shows_its_lease(dsn: str, db: psycopg.Connection, job: int) -> None:
    db.execute("UPDATE paygate.bot_jobs SET lease_token = gen_random_uuid(), lease_expires_at = now() + interval '30s',"
               " claimed_by = 'host-a:0', attempts = 1 WHERE id = %s", (job,))
    token = str(db.execute("SELECT lease_token FROM paygate.bot_jobs WHERE id = %s", (job,)).fetchone()[0])
    result = run_cli("trace", "bot-job", str(job), "--json", dsn=dsn)
    assert result.code == ExitCode.OK, result.err
    doc = json.loads(result.out)
    [lease] = [e for e in doc["timeline"] if e["kind"] == "lease"]
    assert lease["details"]["claimed_by"] == "host-a:0" and lease["details"]["lease_token"] == token
    assert doc["bot_job"]["lease_token"] == token and lease["details"]["attempts"] == 1


def test_a_transaction_of_paygate_s_own_with_no_rpc_configured_is_exit_1(dsn: str, db: psycopg.Connection) -> None:
    """A TTL keeper's extend (no customer's money) traced by its inner hash, from a shell with no RPC
    configured: the journal's side is shown, and the verdict says the chain could not be read."""
    from stellar_sdk import Keypair

    lane = Keypair.random().public_key
    inner = os.urandom(32)
    db.execute("INSERT INTO paygate.lanes (address) VALUES (%s)", (lane,))
    db.execute("INSERT INTO paygate.lineages (purpose, entitlement, lane, state, source_seq, key_id, envelope,"
               " inner_hash, outer_hash, max_time, signed_at_ledger, signed_at, sent_at) VALUES ('ttl_extend',"
               " 'ttl_job:1', %s, 'sent', 7, 'k1', %s, %s, %s, 2000000000, 40, now(), now())",
               (lane, b"\x01" * 40, inner, os.urandom(32)))
    result = run_cli("trace", "tx", inner.hex(), "--json", dsn=dsn)
    assert result.code == ExitCode.FAILED, result.err
    doc = json.loads(result.out)
    assert doc["unit"]["kind"] == "lineage" and doc["tx"]["entitlement"] == "ttl_job:1"
    assert [e["kind"] for e in doc["timeline"]] == ["lineage.allocated", "lineage.signed", "lineage.sent"]
    assert doc["verdict"]["regime"] == "unreadable" and doc["verdict"]["chain_readable"] is False
    assert "PAYGATE_RPC_URL" in doc["verdict"]["explanation"]
    assert "010101" not in result.out  # the envelope's bytes
