"""A lane whose sends are rejected on every tick is a finding, not a healthy lane: on a chain that
will not take the journal's sequence (a reset network, a wrong RPC), resend after resend answers
ERROR txBAD_SEQ, which proves nothing by itself, so the lineage waits and the ticks exit 0. After
`repeated_rejection_threshold` consecutive rejections with one code, a `repeated_rejection` finding
opens on the lane (once: the tick exits 3 once), `status` names the lane, `nonce-inspect` shows the
evidence; an accepted resend clears it. On the devnet, with its `reject_send` fault."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from paygate_cli.errors import ExitCode
from tests.support.chain_env import ChainEnv, admit_deposit, chain_environ, sign_deposit
from tests.support.cli import run_proc
from tests.support.devnet_support import DevnetHandle, start_devnet

AMOUNT = 1_000_000
THRESHOLD = 3


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=1, users=1)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    environ = chain_environ(devnet, dsn, tmp_path / "keys")
    environ["PAYGATE_REPEATED_REJECTION_THRESHOLD"] = str(THRESHOLD)
    return ChainEnv(devnet, dsn, environ)


def tick(chain: ChainEnv) -> int:
    result = run_proc("run-tick", "funding", "--once", environ=chain.environ)
    assert result.code in (0, ExitCode.NEEDS_HUMAN), result.err
    return result.code


def open_findings(db: psycopg.Connection) -> list[tuple]:
    return db.execute("SELECT subject, details->>'code', (details->>'consecutive_rejections')::int, seen_count"
                      " FROM paygate.findings WHERE kind = 'repeated_rejection' AND resolved_at IS NULL").fetchall()


def test_resends_rejected_tick_after_tick_open_one_finding_shown_by_status_and_nonce_inspect(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    lane = chain.genesis["lanes"][0]["public"]
    user = chain.genesis["users"][0]
    chain.devnet.set_fault("reject_send", account=lane, code="txBAD_SEQ")
    entry, nonce, expiration = sign_deposit(chain.devnet, user["secret"], AMOUNT)
    pending = admit_deposit(db, user["public"], AMOUNT, entry, nonce, expiration, "rejected")

    assert tick(chain) == 0  # the first broadcast: rejected, the lineage is sent and waits
    codes = [tick(chain) for _ in range(THRESHOLD)]  # resends 1..N, each rejected with txBAD_SEQ
    assert codes == [0] * (THRESHOLD - 1) + [ExitCode.NEEDS_HUMAN]  # the Nth opens the finding
    assert open_findings(db) == [(lane, "txBAD_SEQ", THRESHOLD, 1)]
    assert tick(chain) == 0  # a further rejection updates the evidence; the human was asked once
    assert open_findings(db) == [(lane, "txBAD_SEQ", THRESHOLD + 1, 2)]
    lineage = db.execute("SELECT id, state, rejected_code, rejected_count FROM paygate.lineages WHERE lane = %s",
                         (lane,)).fetchone()
    assert lineage[1:] == ("sent", "txBAD_SEQ", THRESHOLD + 1)  # never called dead for the rejections

    status = run_proc("status", "--json", environ=chain.environ)
    assert status.code == ExitCode.FAILED, status.err
    problems = json.loads(status.out)["status"]["problems"]
    assert any(p.startswith(f"lane {lane}: sends rejected (ERROR txBAD_SEQ on {THRESHOLD + 1} consecutive "
                            f"resends of lineage {lineage[0]}") for p in problems), problems

    inspect = run_proc("nonce-inspect", "--lane", lane, "--json", environ=chain.environ)
    assert inspect.code == ExitCode.NEEDS_HUMAN, inspect.err
    report = json.loads(inspect.out)["lanes"][0]
    assert report["finding"].startswith(f"sends rejected: ERROR txBAD_SEQ on {THRESHOLD + 1} consecutive resends "
                                        f"of lineage {lineage[0]}")
    assert report["repeated_rejection"]["evidence"]["lineage_id"] == lineage[0]
    assert report["rejections_in_flight"]["consecutive_rejections"] == THRESHOLD + 1

    # The chain takes the bytes again: the next resend is accepted, the finding resolved, the deposit lands.
    chain.devnet.clear_faults()
    assert tick(chain) == 0
    assert open_findings(db) == []
    assert db.execute("SELECT resolved_by FROM paygate.findings WHERE kind = 'repeated_rejection'").fetchone() == (
        "paygate:send_accepted",)
    for _ in range(6):
        chain.devnet.close_ledger()
        tick(chain)
    assert db.execute("SELECT status FROM paygate.deposits WHERE id = %s", (pending,)).fetchone()[0] == \
        "settled"
