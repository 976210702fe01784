"""`paygate nonce-inspect` against a real devnet: lanes, deposits, gaps; never an envelope."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import Keypair

from paygate_cli.errors import ExitCode
from paygate_cli.journal import lineage as lineages
from tests.support.chain_env import ChainEnv, admit_deposit, chain_environ, sign_deposit
from tests.support.cli import run_cli
from tests.support.devnet_support import start_devnet

AMOUNT = 7_000_000


@pytest.fixture
def chain(tmp_path: Path, dsn: str) -> Iterator[ChainEnv]:
    devnet = start_devnet(tmp_path / "devnet", lanes=2, users=2)
    yield ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))
    devnet.stop()


def settle_one(chain: ChainEnv, db: psycopg.Connection) -> int:
    user = chain.genesis["users"][0]
    entry, nonce, expiration = sign_deposit(chain.devnet, user["secret"], AMOUNT)
    pending_id = admit_deposit(db, user["public"], AMOUNT, entry, nonce, expiration, "n-1")
    for _ in range(8):
        chain.tick()
        if db.execute("SELECT status FROM paygate.deposits WHERE id = %s", (pending_id,)).fetchone()[0] \
                == "settled":
            return pending_id
        chain.devnet.close_ledger()
    raise AssertionError("deposit did not settle")


def inspect(chain: ChainEnv, *args: str) -> tuple[int, dict, str]:
    result = run_cli("nonce-inspect", "--json", *args, environ=chain.environ)
    return result.code, json.loads(result.out) if result.out else {}, result.out + result.err


def test_lanes_agree_with_the_chain_after_a_deposit(chain: ChainEnv, db: psycopg.Connection) -> None:
    settle_one(chain, db)
    code, report, text = inspect(chain)
    assert code == 0, text
    used = [lane for lane in report["lanes"] if lane["journal_consumed_count"]]
    assert used and all(lane["chain_seq"] == lane["journal_last_consumed_seq"] for lane in used)
    assert all(lane["finding"] in ("ok", "no journaled use yet") for lane in report["lanes"])


def test_credit_view_shows_nonce_consumed_and_both_lineages(chain: ChainEnv, db: psycopg.Connection) -> None:
    pending_id = settle_one(chain, db)
    code, report, _ = inspect(chain, "--deposit", str(pending_id))
    assert code == 0
    assert report["deposit"]["authorisation"]["consumed_on_chain"] is True
    assert [(lin["purpose"], lin["state"]) for lin in report["deposit"]["lineages"]] == [
        ("deposit", "applied"), ("credit", "applied")]


def test_never_prints_envelopes_or_ciphertext(chain: ChainEnv, db: psycopg.Connection) -> None:
    pending_id = settle_one(chain, db)
    envelopes = [bytes(e) for (e,) in db.execute("SELECT envelope FROM paygate.lineages")]
    for args in ([], ["--deposit", str(pending_id)], ["--plain"]):
        result = run_cli("nonce-inspect", *args, environ=chain.environ)
        text = result.out + result.err
        assert "envelope" not in text.lower()
        for blob in envelopes:
            assert blob.hex() not in text and base64.b64encode(blob).decode()[:24] not in text


def test_sequence_used_outside_the_journal_is_a_gap_needing_a_human(chain: ChainEnv, db: psycopg.Connection) -> None:
    settle_one(chain, db)
    lane = db.execute("SELECT lane FROM paygate.lineages ORDER BY id DESC LIMIT 1").fetchone()[0]
    chain.devnet.rpc("devnet_consumeSequence", {"account": lane})
    chain.devnet.close_ledger()
    code, report, _ = inspect(chain, "--lane", lane)
    assert code == ExitCode.NEEDS_HUMAN
    assert report["lanes"][0]["finding"].startswith("gap")


def test_in_flight_lineage_shows_what_resolve_would_do(chain: ChainEnv, db: psycopg.Connection) -> None:
    user = chain.genesis["users"][1]
    entry, nonce, expiration = sign_deposit(chain.devnet, user["secret"], AMOUNT)
    admit_deposit(db, user["public"], AMOUNT, entry, nonce, expiration, "n-2")
    chain.tick()  # deposit signed and sent; no ledger closed yet
    code, report, _ = inspect(chain)
    assert code == 0
    [busy] = [lane for lane in report["lanes"] if lane["in_flight"]]
    assert busy["in_flight"]["state"] == "sent"
    assert busy["in_flight"]["resolution"]["would"] == "resend the same envelope and wait"
    assert db.execute("SELECT count(*) FROM paygate.lineages WHERE state = 'sent'").fetchone()[0] == 1  # unchanged


def test_unknown_credit_is_a_usage_error(chain: ChainEnv) -> None:
    assert run_cli("nonce-inspect", "--deposit", "999", environ=chain.environ).code == ExitCode.USAGE


def test_lane_inspection_reads_the_chain_without_stellar_sdk(chain: ChainEnv, db: psycopg.Connection) -> None:
    """`nonce-inspect --lane L` with nothing in flight reads the lane's sequence SDK-free, in a fresh
    process, and reads it right."""
    lane = chain.genesis["lanes"][0]["public"]
    lineages.sync_lanes(db, [lane])
    probe = ("import sys, io, contextlib, json\nfrom paygate_cli.__main__ import main\n"
             "out = io.StringIO()\n"
             "with contextlib.redirect_stdout(out):\n"
             f"    code = main(['nonce-inspect', '--json', '--lane', {lane!r}])\n"
             "print('REPORT', json.dumps(json.loads(out.getvalue())))\n"
             "print('RESULT', code, *(m in sys.modules for m in ('stellar_sdk', 'requests', 'tenacity')))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=chain.environ,
                          timeout=60)
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].split() == ["RESULT", "0", "False", "False", "False"], proc.stdout + proc.stderr
    [report] = json.loads(lines[-2].removeprefix("REPORT "))["lanes"]
    with chain.server() as server:
        assert report["chain_seq"] == server.load_account(lane).sequence
    assert report["lane"] == lane and report["finding"] == "no journaled use yet"


def test_a_journaled_lane_absent_on_chain_is_not_visible_yet(chain: ChainEnv, db: psycopg.Connection) -> None:
    """One read endpoint cannot prove a lane missing: 69 "not visible yet", as the workers see it."""
    ghost = Keypair.random().public_key
    lineages.sync_lanes(db, [ghost])
    code, _, text = inspect(chain, "--lane", ghost)
    assert code == ExitCode.UNAVAILABLE and "not visible on chain yet" in text, text
    assert "rpc.lane_not_visible" in text and "Traceback" not in text
