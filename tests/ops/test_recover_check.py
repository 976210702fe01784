"""`paygate recover-check` as a command (ops/recover_check.py, commands/recover_check.py): it writes,
so it asks (no prompt without a TTY: exit 2 naming --yes); --dry-run reports and changes nothing;
with no restore halt it still compares and says so; a chain nobody can read is 69; lanes read
behind the journal, and a lane no read host knows, are blockers. Real Postgres; the lane cases
on a real devnet (its `node_lag` fault for the lagging reads), a lane made really ahead by a
transaction signed with its key outside paygate (`devnet_consumeSequence`). The restore itself:
tests/journal/test_restore_gate.py."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from paygate_cli.chain.accounts import account_address
from paygate_cli.errors import ExitCode
from tests.support.chain_env import ChainEnv, admit_deposit, chain_environ, recovery_environ, sign_deposit
from tests.support.cli import run_cli
from tests.support.devnet_support import start_devnet


@pytest.fixture
def chain(tmp_path: Path, dsn: str) -> Iterator[ChainEnv]:
    devnet = start_devnet(tmp_path / "devnet", lanes=2, users=1)
    yield ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))
    devnet.stop()


def audit_count(db: psycopg.Connection) -> int:
    return int(db.execute("SELECT count(*) FROM paygate.audit_log WHERE action LIKE 'restore%'").fetchone()[0])


def test_it_refuses_without_a_tty_or_yes_and_with_no_halt_says_so(dsn: str, db: psycopg.Connection) -> None:
    refused = run_cli("recover-check", dsn=dsn)
    assert refused.code == ExitCode.USAGE and "--yes" in refused.err
    assert audit_count(db) == 0

    clean = run_cli("recover-check", "--yes", dsn=dsn)
    assert clean.code == ExitCode.OK, clean.err
    assert "no restore halt set" in clean.out and "clean: nothing unresolved" in clean.out
    document = json.loads(run_cli("recover-check", "--yes", "--json", dsn=dsn).out)
    assert "schema_version" in document and document["recover_check"]["restore_halt"] is None
    assert document["recover_check"]["clean"] is True and document["recover_check"]["cleared"] is False
    plain = run_cli("recover-check", "--dry-run", "--plain", dsn=dsn)
    assert plain.code == ExitCode.OK and plain.out.splitlines()[0].split("\t")[:2] == ["lane", "status"]
    # Without a halt there is nothing to clear: a clean pass records only the command's check.
    assert db.execute("SELECT count(*) FROM paygate.audit_log WHERE action = 'restore_clear'").fetchone()[0] == 0


def test_a_chain_no_read_host_answers_is_69(dsn: str, db: psycopg.Connection, tmp_path: Path) -> None:
    lanes = [account_address(os.urandom(32)) for _ in range(2)]
    db.execute("INSERT INTO paygate.lanes (address) SELECT unnest(%s::text[])", (lanes,))
    db.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('restore', 'a drill', 'test')")
    keys = tmp_path / "journal-keys"
    keys.write_text(json.dumps({"k1": os.urandom(32).hex()}))
    keys.chmod(0o600)
    result = run_cli("recover-check", "--yes", dsn=dsn, PAYGATE_RPC_URL="http://127.0.0.1:9/",
                     PAYGATE_RPC_TIMEOUT="0.5s", PAYGATE_JOURNAL_KEYS_FILE=str(keys),
                     PAYGATE_JOURNAL_ACTIVE_KEY_ID="k1")
    assert result.code == ExitCode.UNAVAILABLE, result.err
    assert "no Stellar RPC read endpoint answered" in result.err
    assert db.execute("SELECT count(*) FROM paygate.halts WHERE kind = 'restore'").fetchone()[0] == 1


def test_lanes_behind_block_a_lane_ahead_is_reported_by_a_dry_run_then_fenced_and_the_halt_clears(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    user = chain.genesis["users"][0]
    entry, nonce, expiration = sign_deposit(chain.devnet, user["secret"], 4_000_000)
    deposit = admit_deposit(db, user["public"], 4_000_000, entry, nonce, expiration, "rc-1")
    for _ in range(10):
        assert chain.tick("funding", "--once").code == 0
        if db.execute("SELECT status FROM paygate.deposits WHERE id = %s", (deposit,)).fetchone()[0] == "settled":
            break
        chain.devnet.close_ledger()
    lane = db.execute("SELECT lane FROM paygate.lineages WHERE state = 'applied' ORDER BY id LIMIT 1").fetchone()[0]
    db.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('restore', 'a drill', 'test')")
    environ = recovery_environ(chain.environ)

    # A lane the journal has used (an accepted sequence) that no read host knows: no quorum, a blocker.
    ghost = account_address(os.urandom(32))
    db.execute("INSERT INTO paygate.lanes (address, accepted_seq) VALUES (%s, 7)", (ghost,))
    # Every read answers as a node from before the lanes' transactions: behind the journal proves
    # nothing, so each used lane is a blocker and the halt stays (exit 3, the check audited).
    landed = db.execute("SELECT min(ledger) FROM paygate.lineages WHERE state = 'applied'").fetchone()[0]
    chain.devnet.set_fault("node_lag", ledgers=chain.devnet.latest_ledger() - int(landed) + 1)
    lagging = run_cli("recover-check", "--yes", "--json", environ=environ)
    chain.devnet.clear_faults()
    assert lagging.code == ExitCode.NEEDS_HUMAN, lagging.err
    report = json.loads(lagging.out)["recover_check"]
    verdicts = {c["lane"]: c for c in report["lanes"]}
    unreadable = verdicts.pop(ghost)
    assert unreadable["verdict"] == "blocked" and "no quorum of read hosts agrees" in unreadable["detail"]
    assert {c["verdict"] for c in verdicts.values()} == {"blocked"}
    assert all("the chain reads behind the journal" in c["detail"] for c in verdicts.values())
    assert len(verdicts) == 2 and not report["cleared"] and len(report["blockers"]) == 3
    # Retired, the unknown lane is no longer compared (a retired lane is never allocated again).
    db.execute("UPDATE paygate.lanes SET status = 'retired', drained_at = now() WHERE address = %s", (ghost,))
    assert db.execute("SELECT count(*) FROM paygate.halts WHERE kind = 'restore'").fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM paygate.lanes WHERE status = 'drained'").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM paygate.audit_log WHERE action = 'restore_check'").fetchone()[0] == 1
    before = audit_count(db)

    chain.devnet.rpc("devnet_consumeSequence", {"account": lane})  # the lane's key used outside paygate
    chain.devnet.close_ledger()

    dry = run_cli("recover-check", "--dry-run", "--json", environ=environ)
    assert dry.code == ExitCode.NEEDS_HUMAN, dry.err
    report = json.loads(dry.out)["recover_check"]
    [ahead] = [c for c in report["lanes"] if c["lane"] == lane]
    assert ahead["verdict"] == "fenced" and "would be fenced" in ahead["detail"]
    assert ahead["chain_seq"] == ahead["journal_seq"] + 1 and report["would_fence"] == 1
    assert report["dry_run"] and not report["cleared"]
    assert db.execute("SELECT status FROM paygate.lanes WHERE address = %s", (lane,)).fetchone()[0] == "active"
    assert db.execute("SELECT count(*) FROM paygate.findings WHERE kind = 'lane_fence'").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM paygate.halts WHERE kind = 'restore'").fetchone()[0] == 1
    assert audit_count(db) == before

    done = run_cli("recover-check", "--yes", environ=environ)
    assert done.code == ExitCode.NEEDS_HUMAN, done.err  # a lane fenced: a human must look
    assert "restore halt: a drill" in done.out and "cleared:" in done.out
    assert db.execute("SELECT status, drained_by FROM paygate.lanes WHERE address = %s", (lane,)).fetchone() == \
        ("drained", "paygate:chain_ahead_of_journal")
    assert db.execute("SELECT count(*) FROM paygate.halts WHERE kind = 'restore'").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM paygate.audit_log WHERE action = 'restore_clear'").fetchone()[0] == 1


def test_resume_never_lifts_the_restore_halt_and_says_how_it_clears(dsn: str, db: psycopg.Connection) -> None:
    db.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('restore', 'a drill', 'test'),"
               " ('operator', 'maintenance', 'someone')")
    result = run_cli("resume", "--yes", dsn=dsn)
    assert result.code == ExitCode.OK, result.err
    assert "operator halt cleared; still set: restore" in result.out
    assert "the restore halt remains" in result.out and "paygate recover-check" in result.out
    assert [kind for (kind,) in db.execute("SELECT kind FROM paygate.halts")] == ["restore"]
