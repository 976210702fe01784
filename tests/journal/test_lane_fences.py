"""A lane whose chain sequence is ahead of the journal is fenced with the evidence, never silently
reused (docs/architecture.md §4, rule 10); a lagging read is never a reason to fence. Real Postgres,
real devnet: the devnet's `devnet_consumeSequence` is a competitor's transaction signed with the
lane's key, which paygate never journaled, landing while the lane is idle."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from paygate_cli.errors import ExitCode
from tests.support.chain_env import ChainEnv, admit_deposit, chain_environ, sign_deposit
from tests.support.cli import run_cli
from tests.support.devnet_support import start_devnet

AMOUNT = 6_000_000


@pytest.fixture
def chain(tmp_path: Path, dsn: str) -> Iterator[ChainEnv]:
    devnet = start_devnet(tmp_path / "devnet", lanes=2, users=3)
    yield ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))
    devnet.stop()


def admit(chain: ChainEnv, db: psycopg.Connection, user: int, key: str) -> int:
    u = chain.genesis["users"][user]
    entry, nonce, expiration = sign_deposit(chain.devnet, u["secret"], AMOUNT)
    return admit_deposit(db, u["public"], AMOUNT, entry, nonce, expiration, key)


def status_of(db: psycopg.Connection, pending_id: int) -> str:
    return db.execute("SELECT status FROM paygate.deposits WHERE id = %s", (pending_id,)).fetchone()[0]


def settle(chain: ChainEnv, db: psycopg.Connection, pending_id: int) -> list[int]:
    """Tick and close ledgers until the deposit settles; the tick exit codes seen."""
    codes = []
    for _ in range(10):
        result = chain.tick("funding", "--once")
        codes.append(result.code)
        if status_of(db, pending_id) == "settled":
            return codes
        chain.devnet.close_ledger()
    raise AssertionError(f"deposit {pending_id} did not settle: {codes}")


def next_lane(db: psycopg.Connection) -> str:
    """The lane the next allocation takes (least recently used, as journal/lineage.py picks it)."""
    return db.execute("SELECT address FROM paygate.lanes WHERE status = 'active'"
                      " ORDER BY last_allocated_at NULLS FIRST, address LIMIT 1").fetchone()[0]


def journal_seq(db: psycopg.Connection, lane: str) -> int:
    return int(db.execute("SELECT max(source_seq) FROM paygate.lineages WHERE lane = %s AND state IN"
                          " ('applied', 'failed')", (lane,)).fetchone()[0])


def fences(db: psycopg.Connection, lane: str) -> list[dict[str, Any]]:
    cols = ("id", "summary", "details", "seen_count", "resolved_at", "resolved_by")
    rows = db.execute("SELECT id, summary, details, seen_count, resolved_at, resolved_by FROM paygate.findings"
                      " WHERE kind = 'lane_fence' AND subject = %s ORDER BY id", (lane,)).fetchall()
    return [dict(zip(cols, row, strict=True)) for row in rows]


def lane_row(db: psycopg.Connection, lane: str) -> tuple[str, str | None, str | None, int | None]:
    return db.execute("SELECT status, drained_by, drain_reason, accepted_seq FROM paygate.lanes WHERE address = %s",
                      (lane,)).fetchone()


def inspect_lane(chain: ChainEnv, lane: str) -> tuple[int, dict[str, Any]]:
    result = run_cli("nonce-inspect", "--json", "--lane", lane, environ=chain.environ)
    return result.code, json.loads(result.out)["lanes"][0]


def test_an_idle_lane_ahead_of_the_journal_is_fenced_with_evidence_once(chain: ChainEnv, db: psycopg.Connection
                                                                        ) -> None:
    settle(chain, db, admit(chain, db, 0, "fence-1"))  # both lanes used: deposit, then credit
    lane = next_lane(db)
    ours = journal_seq(db, lane)
    # While the lane is idle, a transaction paygate never journaled takes its next sequence.
    chain.devnet.rpc("devnet_consumeSequence", {"account": lane})
    chain.devnet.close_ledger()
    second = admit(chain, db, 1, "fence-2")

    result = chain.tick("funding", "--once")
    assert result.code == ExitCode.NEEDS_HUMAN, result.err
    assert "journal.lane_fenced" in result.err
    status, drained_by, reason, accepted = lane_row(db, lane)
    assert (status, drained_by, accepted) == ("drained", "paygate:chain_ahead_of_journal", None)
    assert reason is not None and "chain ahead of journal" in reason and f"{ours + 1}..{ours + 1}" in reason
    [finding] = fences(db, lane)
    evidence = finding["details"]
    assert (evidence["journal_seq"], evidence["chain_seq"], evidence["range"]) == (ours, ours + 1, [ours + 1, ours + 1])
    assert evidence["last_modified_ledger"] is not None  # the devnet's entries carry no ext v3 seqLedger
    [foreign] = evidence["transactions"]  # the competitor's transaction, found on chain by its source
    assert foreign["seq"] == ours + 1 and foreign["status"] == "SUCCESS"
    assert foreign["operations"] == ["BumpSequence"]
    assert all("://" not in json.dumps(e) for e in evidence["read_endpoints"])  # hosts only, never URLs
    # Nothing was built on the fenced lane; the work moved to the other lane in the same tick.
    on_lane = db.execute("SELECT state, resolution FROM paygate.lineages WHERE lane = %s AND source_seq IS NULL",
                         (lane,)).fetchall()
    assert [state for state, _ in on_lane] == ["abandoned"] and "chain ahead of journal" in on_lane[0][1]
    [(deposit_lane, deposit_state)] = db.execute(
        "SELECT lane, state FROM paygate.lineages WHERE entitlement LIKE %s AND state <> 'abandoned'",
        (f"deposit:{second}:%",)).fetchall()
    assert deposit_lane != lane and deposit_state in ("signed", "sent")

    # Later ticks: the same finding, never a second one, no second alarm.
    for code in settle(chain, db, second):
        assert code == ExitCode.OK
    [again] = fences(db, lane)
    assert again["id"] == finding["id"] and again["seen_count"] == 1 and again["resolved_at"] is None

    # nonce-inspect shows the fence, its reason and its evidence: not "ok", needs a human.
    code, report = inspect_lane(chain, lane)
    assert code == ExitCode.NEEDS_HUMAN
    assert report["finding"].startswith("fenced") and report["needs_human"] is True
    assert report["drain_reason"] == reason and report["fence"]["evidence"]["chain_seq"] == ours + 1
    text = run_cli("nonce-inspect", "--lane", lane, environ=chain.environ)
    assert "sequences" in text.out and foreign["hash"] in text.out

    # undrain does not resolve it; only the operator's accept does, and then the lane works again.
    assert run_cli("undrain", "--lane", lane, "--yes", environ=chain.environ).code == 0
    assert fences(db, lane)[0]["resolved_at"] is None
    assert db.execute("SELECT paygate.accept_lane_fence(%s, 'test-operator')", (lane,)).fetchone()[0] == ours + 1
    [resolved] = fences(db, lane)
    assert resolved["resolved_by"] == "test-operator" and lane_row(db, lane)[3] == ours + 1
    assert db.execute("SELECT count(*) FROM paygate.audit_log WHERE action = 'lane.fence_resolved' AND target = %s",
                      (lane,)).fetchone()[0] == 1
    # The reconciler counts the accepted sequence as the engine does: no lane_gap for the lane.
    reconciled = chain.tick("reconciler")
    assert reconciled.code == ExitCode.OK, reconciled.err[-2000:]
    assert db.execute("SELECT count(*) FROM paygate.findings WHERE kind = 'lane_gap' AND resolved_at IS NULL"
                      ).fetchone()[0] == 0
    db.execute("UPDATE paygate.lanes SET last_allocated_at = NULL WHERE address = %s", (lane,))  # taken next
    third = admit(chain, db, 2, "fence-3")
    assert all(code == ExitCode.OK for code in settle(chain, db, third))
    assert lane_row(db, lane)[0] == "active" and len(fences(db, lane)) == 1
    assert journal_seq(db, lane) > ours + 1  # the lane was used again, after the accepted sequence
    code, report = inspect_lane(chain, lane)
    assert code == ExitCode.OK and report["finding"] == "ok"


def test_a_lagging_sequence_read_passes_the_lane_over_and_never_fences(chain: ChainEnv, db: psycopg.Connection
                                                                        ) -> None:
    first = admit(chain, db, 0, "lag-1")
    settle(chain, db, first)
    # Every read now answers as a node from before the lanes' last transactions: their sequences
    # read behind the journal's.
    landed = db.execute("SELECT min(ledger) FROM paygate.lineages WHERE state = 'applied'").fetchone()[0]
    chain.devnet.set_fault("node_lag", ledgers=chain.devnet.latest_ledger() - int(landed) + 1)
    second = admit(chain, db, 1, "lag-2")
    result = chain.tick("funding", "--once")
    assert result.code != ExitCode.NEEDS_HUMAN, result.err
    assert "journal.lane_sequence_lagging" in result.err
    assert db.execute("SELECT count(*) FROM paygate.lanes WHERE status <> 'active'").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM paygate.findings WHERE kind = 'lane_fence'").fetchone()[0] == 0
    # Nothing was built while the read lagged (never a sequence guessed below or past the journal's).
    built = db.execute("SELECT count(*) FROM paygate.lineages WHERE entitlement LIKE %s AND source_seq IS NOT NULL",
                       (f"deposit:{second}:%",)).fetchone()[0]
    assert built == 0
    chain.devnet.clear_faults()
    assert all(code == ExitCode.OK for code in settle(chain, db, second))
    assert db.execute("SELECT count(*) FROM paygate.lanes WHERE status <> 'active'").fetchone()[0] == 0


def test_a_foreign_sequence_use_fence_says_why_on_the_lane_and_opens_the_finding(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    from tests.support.funding import crash_tick, wait_for_leases

    admit(chain, db, 0, "foreign-1")
    crash_tick(chain, "funding.after_anchor")  # anchored, never broadcast
    [(lineage_id, lane, seq, inner)] = db.execute(
        "SELECT id, lane, source_seq, encode(inner_hash, 'hex') FROM paygate.lineages WHERE state = 'signed'"
    ).fetchall()
    chain.devnet.rpc("devnet_consumeSequence", {"account": lane})  # someone else takes that very sequence
    chain.devnet.close_ledger()
    wait_for_leases(db)
    result = chain.tick("funding", "--once")
    assert result.code == ExitCode.NEEDS_HUMAN, result.err
    status, drained_by, reason, _ = lane_row(db, lane)
    assert (status, drained_by) == ("drained", "paygate:foreign_sequence_use")
    assert reason is not None and f"sequence {seq} of lineage {lineage_id}" in reason and inner in reason
    [finding] = fences(db, lane)
    assert finding["details"]["chain_seq"] == seq and finding["details"]["inner_hash"] == inner
    assert all("://" not in host for host in finding["details"]["verdicts"])
    code, report = inspect_lane(chain, lane)
    assert code == ExitCode.NEEDS_HUMAN and report["finding"].startswith("fenced") and report["drain_reason"] == reason


def test_a_lane_failure_fence_says_why_on_the_lane(chain: ChainEnv, db: psycopg.Connection) -> None:
    from tests.support.charges_support import admit_charge, fund
    from tests.support.lanes import remove_operator

    users = chain.genesis["users"]
    fund(chain, db, [(users[0], AMOUNT)])
    bad = next_lane(db)
    remove_operator(chain, bad)
    admit_charge(db, users[0]["public"], 1000, "fence-c1")
    result = chain.tick("settlement", "--once")
    assert result.code == ExitCode.NEEDS_HUMAN, result.err
    status, drained_by, reason, _ = lane_row(db, bad)
    assert (status, drained_by) == ("drained", "paygate:lane_failure")
    assert reason is not None and "operator" in reason
    assert fences(db, bad) == []  # no sequence used outside the journal: nothing for rule 10
    status_doc = json.loads(run_cli("status", "--json", environ=chain.environ).out)
    assert {"kind": "lane", "target": bad, "reason": reason} in [
        {k: d[k] for k in ("kind", "target", "reason")} for d in status_doc["status"]["drains"]]
    code, report = inspect_lane(chain, bad)
    assert code == ExitCode.OK  # no sequence gap: nonce-inspect asks no human, and says why the lane idles
    assert report["drain_reason"] == reason and report["finding"] == f"drained by paygate:lane_failure: {reason}"
