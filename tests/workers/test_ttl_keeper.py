"""The TTL keeper (workers/ttl.py, docs/architecture.md §6 "TTL keeper") against a real devnet whose
entries live a few thousand ledgers (`--min-persistent-ttl`), with the keeper's threshold and extend
distance scaled to them (durations at 5 s per ledger):

- sync and rotation: the contract's entries and the balance entry of every account with money on it
  are registered and read, each about hourly, the never-read first, at most PAYGATE_TTL_READS_PER_TICK
  a tick; `status` shows the nearest expiry in ledgers and days;
- an entry under the threshold is extended through the engine: the ExtendFootprintTTL lineage is
  journaled before its broadcast (a process killed between the two resends the same bytes), the job
  applied with its fee counted as the day's rent, the entry's liveUntilLedgerSeq on chain moved;
- over the day's budget: the most urgent go first, the rest are left (ttl_rent.left_unextended, the
  tick stalls: exit 1), shown by status and the state metrics;
- an entry read archived gets one restore and is live again; archived a second time it asks a human
  (exit 3, the key in status); a restore that fails on chain or cannot be built asks a human too;
- months of ledgers (`devnet advance`) with the keeper ticking every ~10 days of them: nothing it keeps
  alive ever archives (each entry extended twice), and the rent stays within the budget.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.charges_support import fund
from tests.support.cli import Result, run_cli
from tests.support.devnet_support import DevnetHandle, start_devnet, ttl_args
from tests.support.drill_support import crash_tick

LEDGER_SECONDS = 5  # the keeper's ledger time (chain/ttl.py): durations in the settings are seconds
MIN_TTL = 3_000  # ledgers a new (or restored) persistent entry lives
MAX_TTL = 30_000
THRESHOLD = 500  # ledgers: the keeper extends an entry expiring sooner
EXTEND_TO = 4_000  # ledgers ahead an extension reaches
DEPOSIT = 20_000_000


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=3, users=2,
                          extra_args=ttl_args(MIN_TTL, MAX_TTL))
    yield handle
    handle.stop()


def wired(devnet: DevnetHandle, dsn: str, tmp_path: Path, **extra: str) -> ChainEnv:
    environ = chain_environ(devnet, dsn, tmp_path / "keys")
    environ.update(PAYGATE_TTL_THRESHOLD=f"{THRESHOLD * LEDGER_SECONDS}s",
                   PAYGATE_TTL_EXTEND_TO=f"{EXTEND_TO * LEDGER_SECONDS}s", PAYGATE_FEE_STATS_CACHE="0s",
                   PAYGATE_OBSERVER_START_LEDGER="1", **extra)
    return ChainEnv(devnet, dsn, environ)


def keeper(chain: ChainEnv, *args: str, **extra: str) -> Result:
    return chain.tick("ttl", "--once", *args, **extra)


def entries(db: psycopg.Connection) -> dict[str, dict[str, Any]]:
    """ttl_entries by kind (an account's balance entry by `account_balance:<address>`)."""
    cursor = db.execute("SELECT * FROM paygate.ttl_entries")
    names = [c.name for c in cursor.description or []]
    rows = [dict(zip(names, row, strict=True)) for row in cursor]
    return {(r["kind"] if r["account"] is None else f"{r['kind']}:{r['account']}"): r for r in rows}


def jobs(db: psycopg.Connection) -> list[dict[str, Any]]:
    cursor = db.execute("SELECT * FROM paygate.ttl_jobs ORDER BY id")
    names = [c.name for c in cursor.description or []]
    return [dict(zip(names, row, strict=True)) for row in cursor]


def lineage(db: psycopg.Connection, lineage_id: int) -> dict[str, Any]:
    cursor = db.execute("SELECT * FROM paygate.lineages WHERE id = %s", (lineage_id,))
    return dict(zip([c.name for c in cursor.description or []], cursor.fetchone(), strict=True))


def on_chain(devnet: DevnetHandle, key_xdr: str) -> int | None:
    """liveUntilLedgerSeq of one entry as the RPC reports it (None: no such entry)."""
    found = devnet.rpc("getLedgerEntries", {"keys": [key_xdr]})["entries"]
    return int(found[0]["liveUntilLedgerSeq"]) if found else None


def rent_today(db: psycopg.Connection) -> tuple[int, int, int]:
    row = db.execute("SELECT spent, transactions, left_unextended FROM paygate.ttl_rent"
                     " WHERE day = (now() AT TIME ZONE 'UTC')::date").fetchone()
    return (0, 0, 0) if row is None else (int(row[0]), int(row[1]), int(row[2]))


def status(chain: ChainEnv) -> tuple[int, dict[str, Any]]:
    result = run_cli("status", "--json", environ=chain.environ)
    assert result.code in (0, 1), (result.code, result.err)
    return result.code, dict(json.loads(result.out)["status"])


def advance(devnet: DevnetHandle, ledgers: int) -> int:
    return int(devnet.rpc("devnet_advance", {"ledgers": ledgers})["latestLedger"])


def state_metrics(chain: ChainEnv, directory: Path) -> dict[str, float]:
    """The TTL gauges of the state file a ticking worker writes (a worker with no work: webhooks), by
    name and, for paygate_ttl_entries, `name{state}`."""
    for stale in directory.glob("*.prom"):
        stale.unlink()
    assert chain.tick("webhooks", "--once", "--metrics-dir", str(directory)).code == 0
    values = {}
    for line in (directory / "paygate_state.prom").read_text().splitlines():
        if not line.startswith("paygate_ttl_"):
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        state = labels.split('state="')[1].split('"')[0] if 'state="' in labels else None
        values[f"{name}{{{state}}}" if state else name] = float(value)
    return values


# -- request_restore: one open restore per key ------------------------------------------------------

def test_request_restore_joins_an_open_restore_and_never_widens_it(db: psycopg.Connection) -> None:
    import base64

    a, b, c = (base64.b64encode(os.urandom(48)).decode() for _ in range(3))
    first = db.execute("SELECT paygate.request_restore(%s, 'settlement:charge_batch:1')", ([a, b, a],)).fetchone()[0]
    # Keys an open restore holds join it; only the others make a new job, whose keys are only those.
    second = db.execute("SELECT paygate.request_restore(%s, 'funding:deposit:7')", ([b, c],)).fetchone()[0]
    joined = db.execute("SELECT paygate.request_restore(%s, 'relay:3')", ([b],)).fetchone()[0]
    assert second != first and joined == first
    rows = {row["id"]: row for row in jobs(db)}
    assert rows[first]["keys_xdr"] == [a, b] and rows[first]["requested_by"] == "settlement:charge_batch:1"
    assert rows[second]["keys_xdr"] == [c] and rows[second]["kind"] == "restore"
    assert len(rows) == 2
    # A finished restore holds nothing: the same key asks again.
    db.execute("UPDATE paygate.ttl_jobs SET status = 'applied', finished_at = now() WHERE id = %s", (second,))
    again = db.execute("SELECT paygate.request_restore(%s, 'ttl')", ([c],)).fetchone()[0]
    assert again not in (first, second)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        db.execute("SELECT paygate.request_restore(%s, 'ttl')", (["not base64!"],))
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        db.execute("SELECT paygate.request_restore(%s, 'ttl')", ([],))


# -- sync, rotation, the nearest expiry -----------------------------------------------------------

def test_sync_rotation_and_the_nearest_expiry_in_status(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> None:
    chain = wired(devnet, dsn, tmp_path, PAYGATE_TTL_READS_PER_TICK="2")
    funded, idle = (u["public"] for u in devnet.genesis["users"])
    with psycopg.connect(dsn, autocommit=True) as db:
        # Money on one account (no deposit on chain yet: its balance entry is absent); none on the other.
        db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 5000000), (%s, 0)",
                   (funded, idle))
        first = keeper(chain)
        assert first.code == 0, first.err
        rows = entries(db)
        assert set(rows) == {"instance", "code", "sac_balance", f"account_balance:{funded}"}
        read = {k for k, r in rows.items() if r["read_at"] is not None}
        assert len(read) == 2 and all(rows[k]["state"] == "unread" for k in set(rows) - read)
        second = keeper(chain)
        assert second.code == 0, second.err
        again = entries(db)
        assert all(r["read_at"] is not None for r in again.values())
        assert all(again[k]["read_at"] == rows[k]["read_at"] for k in read)  # read this hour: not again
        assert again["instance"]["state"] == again["code"]["state"] == "live"
        assert again[f"account_balance:{funded}"]["state"] == "absent"  # never written on chain
        for kind in ("instance", "code"):
            assert again[kind]["live_until"] == on_chain(devnet, again[kind]["key_xdr"])
        # Nothing is older than an hour: a third tick reads nothing; one aged entry is read again.
        assert keeper(chain).code == 0
        assert {k: r["read_at"] for k, r in entries(db).items()} == {k: r["read_at"] for k, r in again.items()}
        db.execute("UPDATE paygate.ttl_entries SET read_at = now() - interval '2 hours' WHERE kind = 'code'")
        assert keeper(chain).code == 0
        after = entries(db)
        assert after["code"]["read_at"] > again["code"]["read_at"]
        assert all(after[k]["read_at"] == again[k]["read_at"] for k in after if k != "code")
        code, report = status(chain)
        assert code == 0, report["problems"]
        ttl = report["ttl"]
        nearest = ttl["nearest"]
        soonest = min(after["instance"]["live_until"], after["code"]["live_until"])
        assert nearest["kind"] in ("instance", "code") and nearest["live_until"] == soonest
        latest = max(r["read_ledger"] for r in after.values())
        assert nearest["ledgers_left"] == soonest - latest
        assert nearest["days_left"] == round((soonest - latest) * LEDGER_SECONDS / 86400, 1)
        assert ttl["entries"]["live"] == 2 and ttl["entries"]["absent"] == 2
        assert ttl["threshold_ledgers"] == THRESHOLD and ttl["jobs"] == []
        assert not [p for p in report["problems"] if "ledger entr" in p], report["problems"]
        plain = run_cli("status", "--plain", environ=chain.environ)
        assert f"ttl:nearest\t{soonest - latest} ledgers" in plain.out, plain.out


# -- extend --------------------------------------------------------------------------------------------

def test_an_entry_under_the_threshold_is_extended_through_the_engine(devnet: DevnetHandle, dsn: str,
                                                                     tmp_path: Path) -> None:
    chain = wired(devnet, dsn, tmp_path)
    with psycopg.connect(dsn, autocommit=True) as db:
        assert keeper(chain).code == 0
        before = entries(db)
        expiry = before["instance"]["live_until"]
        assert expiry == on_chain(devnet, before["instance"]["key_xdr"])
        advance(devnet, expiry - THRESHOLD + 50 - devnet.latest_ledger())  # inside the threshold now
        assert keeper(chain).code == 0  # read again, found due: a job
        [job] = jobs(db)
        assert job["kind"] == "extend" and job["status"] == "pending" and job["extend_to"] == EXTEND_TO
        assert set(job["keys_xdr"]) == {before["instance"]["key_xdr"], before["code"]["key_xdr"]}
        # Killed after the anchor, before the broadcast: the envelope is journaled, nothing was sent.
        crash_tick(chain.environ, "ttl", "ttl.after_anchor")
        journaled = lineage(db, jobs(db)[0]["lineage_id"])
        assert journaled["purpose"] == "ttl_extend" and journaled["entitlement"] == f"ttl_job:{job['id']}"
        assert journaled["state"] == "signed" and journaled["envelope"] is not None
        assert not devnet.state()["queue"]
        db.execute("UPDATE paygate.ttl_jobs SET lease_expires_at = now() - interval '1 second'")  # the dead owner's
        resent = keeper(chain)  # the same bytes, sent again
        assert resent.code == 0, resent.err
        assert [q["hash"] for q in devnet.state()["queue"]] == [bytes(journaled["outer_hash"]).hex()]
        devnet.close_ledger()
        landed = keeper(chain)
        assert landed.code == 0, landed.err
        [done] = jobs(db)
        applied = lineage(db, done["lineage_id"])
        assert done["status"] == "applied" and applied["state"] == "applied" and applied["id"] == journaled["id"]
        assert done["fee_charged"] == applied["fee_charged"] > 0
        assert rent_today(db)[:2] == (applied["fee_charged"], 1)
        after = entries(db)
        for kind in ("instance", "code"):
            moved = on_chain(devnet, after[kind]["key_xdr"])
            assert moved == after[kind]["live_until"] == applied["ledger"] + EXTEND_TO
        assert not [j for j in jobs(db) if j["status"] == "pending"]  # not due any more
        _, report = status(chain)
        assert report["ttl"]["rent"]["spent"] == applied["fee_charged"]
        assert report["ttl"]["nearest"]["live_until"] == applied["ledger"] + EXTEND_TO


def test_over_the_budget_the_most_urgent_go_first(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> None:
    chain = wired(devnet, dsn, tmp_path, PAYGATE_TTL_KEYS_PER_TX="2", PAYGATE_TTL_RENT_BUDGET="1")
    user = devnet.genesis["users"][0]
    with psycopg.connect(dsn, autocommit=True) as db:
        fund(chain, db, [(user, DEPOSIT)])  # the account's balance entry, written a few ledgers after genesis
        assert keeper(chain).code == 0
        rows = entries(db)
        account = rows[f"account_balance:{user['public']}"]
        assert account["state"] == "live" and account["live_until"] > rows["instance"]["live_until"]
        advance(devnet, rows["instance"]["live_until"] - THRESHOLD + 50 - devnet.latest_ledger())
        assert keeper(chain).code == 0
        urgent, later = jobs(db)  # the contract's two entries first, then the account's
        assert set(urgent["keys_xdr"]) == {rows["instance"]["key_xdr"], rows["code"]["key_xdr"]}
        assert later["keys_xdr"] == [account["key_xdr"]]
        # A budget of 1 stroop covers nothing: the most urgent is simulated and refused, nothing is sent.
        refused = keeper(chain)
        assert refused.code == 1, refused.err
        assert rent_today(db) == (0, 0, 3)
        assert not devnet.state()["queue"]
        estimate = jobs(db)[0]["rent_estimate"]
        assert estimate and estimate > 0
        # Enough for the most urgent (its resource fee, plus the floor bid for its two operations) only.
        budget = str(estimate + 2 * 200 + 10)
        sent = keeper(chain, PAYGATE_TTL_RENT_BUDGET=budget)
        assert sent.code == 1, sent.err
        [stall] = db.execute("SELECT error FROM paygate.worker_runs WHERE worker = 'ttl' AND outcome = 'stalled'"
                             " ORDER BY started_at DESC LIMIT 1").fetchone()
        assert stall.startswith("1 kept entries left unextended") and f"budget {budget} stroops" in stall, stall
        assert rent_today(db)[2] == 1
        first, second = jobs(db)
        assert first["lineage_id"] is not None and second["lineage_id"] is None
        devnet.close_ledger()
        landed = keeper(chain, PAYGATE_TTL_RENT_BUDGET=budget)
        assert landed.code == 1, landed.err
        first, second = jobs(db)
        assert first["status"] == "applied" and second["status"] == "pending" and second["lineage_id"] is None
        spent, transactions, left = rent_today(db)
        assert (spent, transactions, left) == (first["fee_charged"], 1, 1) and spent <= int(budget)
        _, report = status(ChainEnv(devnet, dsn, {**chain.environ, "PAYGATE_TTL_RENT_BUDGET": budget}))
        assert report["ttl"]["rent"] == {"spent": spent, "transactions": 1, "left_unextended": 1}
        assert report["ttl"]["rent_budget"] == int(budget)
        assert any(w["worker"] == "ttl" and w["liveness"] == "stalled" for w in report["workers"])
        gauges = state_metrics(chain, tmp_path / "metrics")
        assert gauges["paygate_ttl_left_unextended"] == 1
        assert gauges["paygate_ttl_rent_spent_stroops"] == spent
        assert gauges["paygate_ttl_threshold_ledgers"] == THRESHOLD


# -- archived entries ------------------------------------------------------------------------------

def test_an_archived_entry_gets_one_restore_and_a_second_archive_asks_a_human(devnet: DevnetHandle, dsn: str,
                                                                              tmp_path: Path) -> None:
    chain = wired(devnet, dsn, tmp_path)
    with psycopg.connect(dsn, autocommit=True) as db:
        assert keeper(chain).code == 0
        rows = entries(db)
        advance(devnet, rows["instance"]["live_until"] + 10 - devnet.latest_ledger())  # nobody kept them alive
        found = keeper(chain)
        assert found.code == 0, found.err
        archived = entries(db)
        assert archived["instance"]["state"] == archived["code"]["state"] == "archived"
        [restore] = jobs(db)
        assert restore["kind"] == "restore" and restore["requested_by"] == "ttl"
        assert set(restore["keys_xdr"]) == {rows["instance"]["key_xdr"], rows["code"]["key_xdr"]}
        _, report = status(chain)
        assert [j["id"] for j in report["ttl"]["restores_pending"]] == [restore["id"]]
        assert keeper(chain).code == 0  # sent (restores first)
        assert lineage(db, jobs(db)[0]["lineage_id"])["purpose"] == "restore"
        devnet.close_ledger()
        restored = keeper(chain)
        assert restored.code == 0, restored.err
        [done] = jobs(db)  # one restore, never a second
        landed = lineage(db, done["lineage_id"])
        assert done["status"] == "applied" and landed["state"] == "applied"
        live = entries(db)
        for kind in ("instance", "code"):
            assert live[kind]["state"] == "live" and live[kind]["restored_at"] is not None
            assert live[kind]["live_until"] == on_chain(devnet, live[kind]["key_xdr"]) == landed["ledger"] + MIN_TTL - 1
        assert rent_today(db)[:2] == (landed["fee_charged"], 1)
        # Archived again after its restore (nobody ticked for its whole TTL): no second restore, a human.
        advance(devnet, live["instance"]["live_until"] + 10 - devnet.latest_ledger())
        again = keeper(chain)
        assert again.code == 3, again.err
        asked = entries(db)
        for kind in ("instance", "code"):
            assert asked[kind]["state"] == "needs_human" and asked[kind]["key_xdr"] in asked[kind]["reason"]
        assert len(jobs(db)) == 1
        code, report = status(chain)
        assert code == 1
        assert any(p.startswith("2 kept ledger entries need a human") for p in report["problems"]), report["problems"]
        assert {e["key_xdr"] for e in report["ttl"]["needs_human"]} == {rows["instance"]["key_xdr"],
                                                                         rows["code"]["key_xdr"]}
        assert keeper(chain).code == 0  # asked once; the entries wait for the human
        reconcile = run_cli("reconcile-report", "--json", environ=chain.environ)
        assert reconcile.code == 3, reconcile.err
        assert json.loads(reconcile.out)["reconcile_report"]["ttl_needs_human"] == 2


def test_a_restore_that_cannot_be_built_asks_a_human_with_the_key(devnet: DevnetHandle, dsn: str,
                                                                  tmp_path: Path) -> None:
    chain = wired(devnet, dsn, tmp_path)
    user = devnet.genesis["users"][1]["public"]
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 1000000)", (user,))
        assert keeper(chain).code == 0
        key = entries(db)[f"account_balance:{user}"]["key_xdr"]  # absent on chain: never written
        db.execute("SELECT paygate.request_restore(ARRAY[%s], 'settlement:charge_batch:9')", (key,))
        failed = keeper(chain)
        assert failed.code == 3, failed.err
        [job] = jobs(db)
        assert job["status"] == "needs_human" and "cannot be built" in job["reason"]
        entry = entries(db)[f"account_balance:{user}"]
        assert entry["state"] == "needs_human" and key in entry["reason"]
        code, report = status(chain)
        assert code == 1 and any(f"ttl job {job['id']} (restore, asked by settlement:charge_batch:9) needs a human"
                                 in p for p in report["problems"]), report["problems"]


def test_a_restore_that_failed_on_chain_asks_a_human_and_pays_its_rent(devnet: DevnetHandle, dsn: str,
                                                                       tmp_path: Path) -> None:
    """The receipt of a RestoreFootprint that was included and failed (its fee charged): planted as
    resolve records one, for the keeper to act on."""
    chain = wired(devnet, dsn, tmp_path)
    lane = devnet.genesis["lanes"][0]["public"]
    with psycopg.connect(dsn, autocommit=True) as db:
        assert keeper(chain).code == 0
        key = entries(db)["instance"]["key_xdr"]
        job_id = db.execute("SELECT paygate.request_restore(ARRAY[%s], 'ttl')", (key,)).fetchone()[0]
        db.execute("INSERT INTO paygate.lanes (address) VALUES (%s) ON CONFLICT DO NOTHING", (lane,))
        failed = db.execute(
            "INSERT INTO paygate.lineages (purpose, entitlement, lane, state, source_seq, key_id, envelope, inner_hash,"
            " outer_hash, max_time, signed_at_ledger, ledger, fee_charged, result_code, resolution)"
            " VALUES ('restore', %s, %s, 'failed', 7, 'k1', %s, %s, %s, 2000000000, 2, 3, 51234,"
            " 'txFEE_BUMP_INNER_FAILED', 'receipt') RETURNING id",
            (f"ttl_job:{job_id}", lane, b"\x01" * 40, os.urandom(32), os.urandom(32))).fetchone()[0]
        db.execute("UPDATE paygate.ttl_jobs SET lineage_id = %s WHERE id = %s", (failed, job_id))
        result = keeper(chain)
        assert result.code == 3, result.err
        [job] = jobs(db)
        assert job["status"] == "needs_human" and job["fee_charged"] == 51234
        assert "failed on chain (txFEE_BUMP_INNER_FAILED)" in job["reason"]
        entry = entries(db)["instance"]
        assert entry["state"] == "needs_human" and key in entry["reason"]
        assert rent_today(db)[:2] == (51234, 1)


# -- months --------------------------------------------------------------------------------------

def test_months_of_ledgers_with_the_keeper_ticking_nothing_it_keeps_alive_archives(tmp_path: Path, dsn: str) -> None:
    """The network's real TTLs (120 days for a new entry, 180 at most) and the keeper's defaults
    (extend within 30 days, to 120 days ahead): eight months of ledgers in steps of ~10 days, the
    keeper ticking between them. Nothing it keeps ever reads archived, no restore is ever needed, and
    what it paid stays within the day's budget (the whole run is one UTC day of the database)."""
    devnet = start_devnet(tmp_path / "devnet", lanes=2, users=1)
    try:
        environ = chain_environ(devnet, dsn, tmp_path / "keys")
        environ.update(PAYGATE_FEE_STATS_CACHE="0s", PAYGATE_OBSERVER_START_LEDGER="1")
        chain = ChainEnv(devnet, dsn, environ)
        user = devnet.genesis["users"][0]
        step = 10 * 86400 // LEDGER_SECONDS  # ten days of ledgers: well inside the 30-day threshold
        with psycopg.connect(dsn, autocommit=True) as db:
            fund(chain, db, [(user, DEPOSIT)])
            start = devnet.latest_ledger()
            while devnet.latest_ledger() < start + 24 * step:  # eight months: two rounds of extensions
                for _ in range(3):  # read and decide; send; record
                    result = keeper(chain)
                    assert result.code == 0, result.err
                    devnet.close_ledger()
                kept = entries(db)
                assert not [k for k, r in kept.items() if r["state"] in ("archived", "needs_human")], kept
                advance(devnet, step)
            kept = entries(db)
            assert {k: r["state"] for k, r in kept.items()} == {
                "instance": "live", "code": "live", "sac_balance": "live", f"account_balance:{user['public']}": "live"}
            for row in kept.values():
                assert on_chain(devnet, row["key_xdr"]) > devnet.latest_ledger()
            applied = [j for j in jobs(db) if j["status"] == "applied"]
            assert len(applied) >= 2 and all(j["kind"] == "extend" for j in jobs(db))
            spent, transactions, left = rent_today(db)
            assert spent == sum(j["fee_charged"] for j in applied) and transactions == len(applied) and left == 0
            assert spent <= 100_000_000  # PAYGATE_TTL_RENT_BUDGET's default
    finally:
        devnet.stop()
