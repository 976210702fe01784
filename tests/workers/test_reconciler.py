"""The reconciler and `reconcile-report` against a real devnet: each regime produced for real (an
unobserved charge, events past the observer's cursor, a balance edited behind paygate's back),
classified correctly; the finding is stored, alerted once, and cleared after the repair."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.chain_env import ChainEnv, billing_balance
from tests.support.charges_support import admit_charge, charge_chain, fund
from tests.support.cli import base_environ, run_cli
from tests.support.devnet_support import DevnetHandle, start_devnet

DEPOSIT = 10_000_000


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=3, users=3)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return charge_chain(devnet, dsn, tmp_path / "keys")


@pytest.fixture
def funded(chain: ChainEnv, db: psycopg.Connection) -> list[str]:
    users = chain.genesis["users"][:2]
    fund(chain, db, [(user, DEPOSIT) for user in users])
    assert chain.tick("observer").code == 0  # the observer has a cursor, and it is caught up
    return [user["public"] for user in users]


def reconcile(chain: ChainEnv, code: int = 0) -> dict:
    result = chain.tick("reconciler")
    assert result.code == code, result.out + result.err
    return json.loads(result.out)["run_tick"]["last_details"]


def check(db: psycopg.Connection, account: str) -> tuple:
    return db.execute("SELECT regime, drift, in_flight, lagging FROM paygate.account_checks WHERE address = %s",
                      (account,)).fetchone()


def report(chain: ChainEnv, *args: str) -> tuple[int, dict]:
    result = run_cli("reconcile-report", "--format", "json", *args, environ=chain.environ)
    assert result.code in (0, 3), result.err
    return result.code, json.loads(result.out)["reconcile_report"]


def test_everything_matches_after_funding(chain: ChainEnv, db: psycopg.Connection, funded: list[str]) -> None:
    details = reconcile(chain)
    assert details["match"] == 2 and details["total"]["regime"] == "match", details
    assert details["lane_match"] >= 1
    assert [check(db, a)[0] for a in funded] == ["match", "match"]
    code, document = report(chain)
    assert code == 0 and document["unexplained"] == 0 and document["totals"][0]["accounts"] == 2
    assert report(chain, "--since", "7d")[1]["totals"] == document["totals"]  # days too (runbooks use 7d)
    assert run_cli("reconcile-report", "--since", "soon", environ=chain.environ).code == 2


def test_an_unobserved_charge_is_in_flight(chain: ChainEnv, db: psycopg.Connection, funded: list[str]) -> None:
    admit_charge(db, funded[0], 1_234, "c1")  # debited in Postgres, not sent to the chain
    details = reconcile(chain)
    assert check(db, funded[0]) == ("in_flight", 1_234, 1_234, 0)
    assert check(db, funded[1])[0] == "match"
    assert details["total"]["regime"] == "match"  # the USDC never left the contract
    code, document = report(chain, "--account", funded[0])
    assert code == 0 and [d["regime"] for d in document["drift"]] == ["in_flight"]


def test_events_past_the_observer_cursor_are_lagging(chain: ChainEnv, db: psycopg.Connection,
                                                     funded: list[str]) -> None:
    admit_charge(db, funded[0], 500, "c1")
    admit_charge(db, funded[0], 700, "c2")
    admit_charge(db, funded[1], 300, "c3")
    for _ in range(5):  # settle on chain, but the observer does not run
        assert chain.tick("settlement").code in (0, 1)
        chain.devnet.close_ledger()
    assert billing_balance(chain, funded[0]) == DEPOSIT - 1_200  # debited on chain ...
    assert db.execute("SELECT count(*) FROM paygate.charges WHERE status = 'authorized'").fetchone()[0] == 3
    details = reconcile(chain)  # ... and not yet observed: explained by the events past the cursor
    assert check(db, funded[0]) == ("lagging", 0, 1_200, -1_200)
    assert check(db, funded[1]) == ("lagging", 0, 300, -300)
    assert details["lagging"] == 2 and details["findings_new"] == 0
    # Once the observer catches up, they match.
    assert chain.tick("observer").code == 0
    reconcile(chain)
    assert [check(db, a)[0] for a in funded] == ["match", "match"]


def test_a_balance_edited_behind_paygates_back_is_a_finding_until_repaired(
        chain: ChainEnv, db: psycopg.Connection, funded: list[str], tmp_path: Path) -> None:
    db.execute("UPDATE paygate.accounts SET cached_balance = cached_balance + 777 WHERE address = %s", (funded[0],))
    details = reconcile(chain, code=3)  # a new finding: alerted (exit 3) ...
    assert check(db, funded[0]) == ("unexplained", -777, 0, 0)
    assert details["findings_new"] == 2  # the account, and the contract's total
    findings = db.execute("SELECT kind, subject, seen_count, alerted_at IS NOT NULL FROM paygate.findings "
                          "WHERE resolved_at IS NULL ORDER BY kind").fetchall()
    assert findings == [("balance_drift", funded[0], 1, True), ("total_drift", "contract", 1, True)]
    details = reconcile(chain, code=0)  # ... once: the next sighting updates the same finding
    assert details["findings_new"] == 0 and details["findings_open_seen"] == 2
    assert db.execute("SELECT max(seen_count), count(*) FROM paygate.findings").fetchone() == (2, 2)

    code, document = report(chain)
    assert code == 3 and document["unexplained"] == 2
    assert document["drift"][0]["address"] == funded[0] and int(document["drift"][0]["unexplained"]) == -777
    status = run_cli("status", "--json", environ={**chain.environ, "PAYGATE_RPC_URL": ""})
    assert {f["kind"] for f in json.loads(status.out)["status"]["findings"]} == {"balance_drift", "total_drift"}
    # Every format renders the same facts; --out writes the file.
    out = tmp_path / "report.md"
    result = run_cli("reconcile-report", "--format", "markdown", "--out", str(out), environ=chain.environ)
    assert result.code == 3 and "| " + funded[0] in out.read_text() and result.out == ""
    rows = list(csv.DictReader(io.StringIO(run_cli("reconcile-report", "--format", "csv",
                                                   environ=chain.environ).out)))
    assert {r["section"] for r in rows} >= {"totals", "drift", "findings"}
    table = run_cli("reconcile-report", environ={**chain.environ, "NO_COLOR": "1"})
    assert table.code == 3 and "UNEXPLAINED DRIFT" in table.out

    db.execute("UPDATE paygate.accounts SET cached_balance = cached_balance - 777 WHERE address = %s", (funded[0],))
    details = reconcile(chain)
    assert details["findings_cleared"] == 2 and check(db, funded[0])[0] == "match"
    assert db.execute("SELECT count(*) FROM paygate.findings WHERE resolved_at IS NULL").fetchone()[0] == 0
    code, document = report(chain, "--since", "1h")
    assert code == 0 and {f["resolved_by"] for f in document["findings"]} == {"reconciler"}


def test_reads_are_paced_least_recently_checked_first(chain: ChainEnv, db: psycopg.Connection,
                                                      funded: list[str]) -> None:
    assert db.execute("SELECT count(*) FROM paygate.lanes").fetchone()[0] == 3
    batch = "4"  # 4 reads: the contract's total, 2 lanes (at most half the budget), 1 account
    first = chain.tick("reconciler", "--batch", batch)
    assert json.loads(first.out)["run_tick"]["last_details"]["accounts"] == 1
    checked = {a for (a,) in db.execute("SELECT address FROM paygate.account_checks")}
    chain.tick("reconciler", "--batch", batch)
    assert {a for (a,) in db.execute("SELECT address FROM paygate.account_checks")} == set(funded)
    before = dict(db.execute("SELECT address, checked_at FROM paygate.account_checks").fetchall())
    chain.tick("reconciler", "--batch", batch)
    after = dict(db.execute("SELECT address, checked_at FROM paygate.account_checks").fetchall())
    oldest = next(iter(checked))
    newer = next(a for a in funded if a != oldest)
    assert after[oldest] > before[oldest]  # the least recently checked one was read again ...
    assert after[newer] == before[newer]  # ... and only that one


def test_an_unreadable_account_is_a_finding_not_a_crash(chain: ChainEnv, db: psycopg.Connection,
                                                       funded: list[str]) -> None:
    bad = "G" + "A" * 55  # passes the table's shape check, but its StrKey checksum is wrong
    db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 5)", (bad,))
    details = reconcile(chain, code=3)
    assert details["unreadable"] == 1 and details["match"] == 2
    summary = db.execute("SELECT summary FROM paygate.findings WHERE subject = %s AND resolved_at IS NULL",
                         (bad,)).fetchone()[0]
    assert "cannot read its chain balance" in summary


def test_a_lane_used_behind_the_journal_is_a_lane_gap(chain: ChainEnv, db: psycopg.Connection,
                                                      funded: list[str]) -> None:
    from stellar_sdk import Keypair, TransactionBuilder

    lane = db.execute("SELECT lane FROM paygate.lineages WHERE state = 'applied' ORDER BY id LIMIT 1").fetchone()[0]
    secret = next(p["secret"] for p in chain.genesis["lanes"] if p["public"] == lane)
    details = reconcile(chain)
    assert details.get("lane_gap", 0) == 0 and details["lane_match"] >= 1
    # Someone with the lane's key sends a transaction paygate never journaled.
    with chain.server() as server:
        tx = (TransactionBuilder(server.load_account(lane), chain.genesis["passphrase"], base_fee=100)
              .append_bump_sequence_op(0).set_timeout(300).build())
        tx.sign(Keypair.from_secret(secret))
        assert server.send_transaction(tx).status.value == "PENDING"
    chain.devnet.close_ledger()
    reconcile(chain, code=3)
    finding = db.execute("SELECT summary FROM paygate.findings WHERE kind = 'lane_gap' AND resolved_at IS NULL"
                         ).fetchone()[0]
    assert lane in finding and "never journaled" in finding
    code, document = report(chain)
    assert code == 3 and [g["subject"] for g in document["lane_gaps"]] == [lane]  # a nonce gap needs a human


def _bash_pipe(command: str, environ: dict[str, str]) -> int:
    import subprocess
    import sys

    script = f"{sys.executable} -m paygate_cli {command} | head -1 >/dev/null"
    return subprocess.run(["bash", "-o", "pipefail", "-c", script], env=environ, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL).returncode


def test_a_closed_pipe_never_changes_the_verdict(dsn: str, db: psycopg.Connection) -> None:
    """`reconcile-report | head -1` under pipefail: 3 as unpiped; the output (far more than a pipe
    holds) ends early, the verdict does not."""
    from stellar_sdk import Keypair

    for n in range(1000):
        address = Keypair.random().public_key
        db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 100)", (address,))
        db.execute("INSERT INTO paygate.account_checks (address, chain_balance, cached_balance, regime, drift) "
                   "VALUES (%s, %s, 100, 'unexplained', %s)", (address, 100 + n + 1, n + 1))
    environ = base_environ(dsn)
    assert run_cli("reconcile-report", dsn=dsn).code == 3
    assert _bash_pipe("reconcile-report", environ) == 3
    assert _bash_pipe("reconcile-report --format csv", environ) == 3


def test_reconcile_report_does_not_vouch_for_what_it_never_checked(dsn: str, db: psycopg.Connection) -> None:
    from stellar_sdk import Keypair

    empty = run_cli("reconcile-report", dsn=dsn)
    assert empty.code == 0 and "nothing to reconcile" in empty.out, empty.out + empty.err
    banana = run_cli("reconcile-report", "--account", "banana", dsn=dsn)
    assert banana.code == 2 and "not a Stellar address" in banana.err, banana.err
    real = Keypair.random().public_key
    lowered = run_cli("reconcile-report", "--account", real.lower(), dsn=dsn)
    assert lowered.code == 2, lowered.err
    unknown = run_cli("reconcile-report", "--account", real, dsn=dsn)
    assert unknown.code == 2 and "not known to paygate" in unknown.err, unknown.err
    db.execute("INSERT INTO paygate.accounts (address) VALUES (%s)", (real,))
    never = run_cli("reconcile-report", dsn=dsn)
    assert never.code == 1 and never.out.startswith("NEVER CHECKED: 1 of 1"), never.out
    assert "no unexplained drift" not in never.out
    one = run_cli("reconcile-report", "--account", real, "--format", "json", dsn=dsn)
    assert one.code == 1 and json.loads(one.out)["reconcile_report"]["accounts_never_checked"] == 1
