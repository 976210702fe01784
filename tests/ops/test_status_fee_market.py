"""The fee market as status and the state metrics show it (docs/architecture.md §4 "Fees and the fee
market"): the last price read (or "not read yet", never a price of 0), the cap, and per path the
fee-capped live lineages (count, highest rate needed vs allowed, since when, each unit), which make
status not ready as stalled work does; the state file's fee gauges. Rows are planted as the engine
writes them (real Postgres, no chain needed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg
from prometheus_client.parser import text_string_to_metric_families
from stellar_sdk import Keypair

from paygate_cli.errors import ExitCode
from tests.support.cli import run_cli


def plant_lineage(db: psycopg.Connection, purpose: str, entitlement: str, *, state: str = "sent",
                  bid: int | None = 200, cap: int | None = 100_000, required: int | None = None,
                  capped_ago: str | None = None) -> int:
    """A live lineage on a lane of its own (one live lineage per lane), with the fee columns the
    engine journals; `required` and `capped_ago` make it fee-capped since that long ago."""
    lane = Keypair.random().public_key
    db.execute("INSERT INTO paygate.lanes (address) VALUES (%s)", (lane,))
    signed = state != "allocated"
    return int(db.execute(
        "INSERT INTO paygate.lineages (purpose, entitlement, lane, state, source_seq, key_id, envelope, inner_hash,"
        " outer_hash, max_time, signed_at_ledger, bid_rate, bid_ledger, fee_ops, resource_fee, cap_rate,"
        " fee_required, fee_capped_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
        " now() - %s::interval) RETURNING id",
        (purpose, entitlement, lane, state, 7 if signed else None, "k1" if signed else None,
         b"\x01" * 40 if signed else None, os.urandom(32) if signed else None, os.urandom(32) if signed else None,
         2_000_000_000 if signed else None, 10 if signed else None, bid if signed else None, 10 if signed else None,
         2, 50_000, cap, required, capped_ago)).fetchone()[0])


def plant_price(db: psycopg.Connection, price: int, *, ago: str = "40 seconds") -> None:
    db.execute("INSERT INTO paygate.fee_market (percentile, price, max_fee, transactions, ledgers, ledger, endpoint,"
               " read_at) VALUES ('p90', %s, %s, 120, 10, 4242, 'rpc-a.example', now() - %s::interval)",
               (price, price * 2, ago))


def status(dsn: str, *args: str) -> tuple[int, dict]:
    result = run_cli(*args, "status", "--json", dsn=dsn)
    return result.code, json.loads(result.out)["status"]


def by_path(report: dict) -> dict[str, dict]:
    return {p["path"]: p for p in report["fee_market"]["paths"]}


def test_never_read_is_not_read_yet_never_a_price_of_0(dsn: str) -> None:
    code, report = status(dsn)
    assert code == ExitCode.OK, report["problems"]
    fee = report["fee_market"]
    assert fee["status"] == "not read yet" and fee["price"] is None and fee["age_s"] is None
    assert fee["percentile"] == "p90" and fee["cap"] == 100_000  # the configured ones
    assert [p["path"] for p in fee["paths"]] == ["funding", "settlement", "relay", "bot_jobs", "ttl"]
    assert all(p["fee_capped"] == 0 and p["units"] == [] for p in fee["paths"])
    human = run_cli("status", dsn=dsn).out
    line = next(line for line in human.splitlines() if "fee_market" in line)
    assert "not read yet" in line and "cap 100000 stroops (0.01 XLM)/op" in line
    assert " 0 stroops" not in line


def test_the_last_price_read_is_shown_with_its_age_ledger_and_host(dsn: str, db: psycopg.Connection) -> None:
    plant_price(db, 1_500)
    code, report = status(dsn, "--json")
    assert code == ExitCode.OK, report["problems"]
    fee = report["fee_market"]
    assert (fee["status"], fee["percentile"], fee["price"], fee["ledger"], fee["endpoint"]) == \
        ("read", "p90", 1_500, 4242, "rpc-a.example")
    assert 40 <= fee["age_s"] < 100
    line = next(line for line in run_cli("status", dsn=dsn).out.splitlines() if "fee_market" in line)
    # getFeeStats' figure is a whole transaction's inclusion fee, not a rate per operation
    assert "p90 1500" in line and "1500 stroops (0.00015 XLM) a transaction" in line
    assert "at ledger 4242 from rpc-a.example" in line and "ago" in line


def test_fee_capped_units_are_shown_per_path_and_make_status_not_ready(dsn: str, db: psycopg.Connection) -> None:
    plant_price(db, 250_000)
    deposit = plant_lineage(db, "deposit", "deposit:1:deposit", bid=20_000, required=250_000, capped_ago="12 minutes")
    credit = plant_lineage(db, "credit", "deposit:2:credit", bid=20_000, required=300_000, capped_ago="3 minutes")
    plant_lineage(db, "charge_batch", "charge_batch:t1", bid=5_000)  # bidding, not capped
    bot = plant_lineage(db, "relay", "bot_job:3", bid=9_000, required=250_000, capped_ago="1 minute")
    plant_lineage(db, "relay", "relay:4", bid=700, cap=4_000)  # a relay bidding under its reservation
    plant_lineage(db, "deposit", "deposit:5:deposit", state="allocated", bid=None)  # no bid yet
    restore = plant_lineage(db, "restore", "ttl_job:8", bid=1_000, required=260_000, capped_ago="30 seconds")

    code, report = status(dsn)
    assert code == ExitCode.FAILED and report["ready"] is False
    paths = by_path(report)
    funding = paths["funding"]
    assert funding["fee_capped"] == 2 and funding["highest_required"] == 300_000 and funding["allowed"] == 100_000
    assert 12 * 60 <= funding["since_age_s"] < 13 * 60 and funding["highest_bid"] == 20_000
    assert [(u["lineage_id"], u["entitlement"], u["bid_rate"], u["fee_required"], u["cap_rate"])
            for u in funding["units"]] == [(deposit, "deposit:1:deposit", 20_000, 250_000, 100_000),
                                           (credit, "deposit:2:credit", 20_000, 300_000, 100_000)]
    assert paths["bot_jobs"]["fee_capped"] == 1 and paths["bot_jobs"]["units"][0]["lineage_id"] == bot
    assert paths["settlement"]["fee_capped"] == 0 and paths["settlement"]["highest_bid"] == 5_000
    assert paths["relay"]["fee_capped"] == 0 and paths["relay"]["highest_bid"] == 700  # relay:N, not bot_job:N
    assert paths["ttl"]["fee_capped"] == 1 and paths["ttl"]["units"][0]["lineage_id"] == restore  # the TTL keeper's
    assert report["fee_market"]["fee_capped"] == 4
    fee_problems = [p for p in report["problems"] if "fee-capped" in p]
    assert len(fee_problems) == 3 and len(report["problems"]) == 3  # nothing else is wrong here
    assert fee_problems[0].startswith("2 funding unit(s) fee-capped for 12m")
    assert "market p90 250000, needs up to 300000 > cap 100000 stroops/op" in fee_problems[0]
    assert "nothing failed" in fee_problems[0] and "runbooks/fee-capped.md" in fee_problems[0]
    assert fee_problems[1].startswith("1 bot_jobs unit(s) fee-capped for 1m")

    # Human: one row per fee-capped path; each unit only with --wide.
    narrow = run_cli("status", dsn=dsn)
    assert narrow.code == ExitCode.FAILED
    rows = [line for line in narrow.out.splitlines() if "fee_capped:" in line]
    assert len(rows) == 3 and "fee_capped:funding" in rows[0] and "fee_capped:bot_jobs" in rows[1]
    assert "needs up to 300000 stroops (0.03 XLM)/op, allowed 100000 stroops (0.01 XLM)/op" in rows[0]
    assert "deposit:1:deposit" not in narrow.out
    wide = run_cli("--wide", "status", dsn=dsn).out
    unit = next(line for line in wide.splitlines() if f"fee_capped:funding:{deposit}" in line)
    assert "deposit:1:deposit" in unit and f"lineage {deposit}: bid 20000 stroops (0.002 XLM)/op" in unit
    assert "needs 250000 stroops (0.025 XLM)/op, allowed 100000 stroops (0.01 XLM)/op, since 12m" in unit
    assert f"fee_capped:bot_jobs:{bot}" in wide and "bot_job:3" in wide


def test_cleared_fee_caps_make_status_ready_again(dsn: str, db: psycopg.Connection) -> None:
    plant_price(db, 250_000)
    lineage = plant_lineage(db, "charge_batch", "charge_batch:t2", bid=20_000, required=250_000, capped_ago="6 minutes")
    assert status(dsn)[0] == ExitCode.FAILED
    # The market fell below its bid: the engine clears both columns together (a CHECK holds them so).
    db.execute("UPDATE paygate.lineages SET fee_capped_at = NULL, fee_required = NULL WHERE id = %s", (lineage,))
    code, report = status(dsn)
    assert code == ExitCode.OK, report["problems"]
    assert by_path(report)["settlement"]["fee_capped"] == 0


def test_a_terminal_lineage_that_was_fee_capped_is_not_live_work(dsn: str, db: psycopg.Connection) -> None:
    lineage = plant_lineage(db, "deposit", "deposit:6:deposit", bid=20_000, required=250_000, capped_ago="9 minutes")
    db.execute("UPDATE paygate.lineages SET state = 'expired', resolution = 'test', resolved_at = now() "
               "WHERE id = %s", (lineage,))
    code, report = status(dsn)
    assert code == ExitCode.OK, report["problems"]
    assert by_path(report)["funding"]["fee_capped"] == 0


def state_samples(directory: Path) -> list[tuple[str, dict[str, str], float]]:
    text = (directory / "paygate_state.prom").read_text()
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def test_the_state_file_has_the_fee_gauges(dsn: str, db: psycopg.Connection, tmp_path: Path) -> None:
    first = tmp_path / "never-read"
    assert run_cli("run-tick", "webhooks", "--metrics-dir", str(first), dsn=dsn, PAYGATE_INSTANCE_ID="h").code == 0
    got = state_samples(first)
    names = {name for name, _, _ in got}
    # Never read: no price and no age (not 0); no live lineage: no bid; every path's count is there, 0.
    assert "paygate_fee_market_price_stroops" not in names and "paygate_fee_market_age_seconds" not in names
    assert "paygate_fee_bid_stroops" not in names
    assert {labels["path"]: value for name, labels, value in got if name == "paygate_fee_capped_units"} == \
        {"funding": 0, "settlement": 0, "relay": 0, "bot_jobs": 0, "ttl": 0}
    assert [(labels, value) for name, labels, value in got if name == "paygate_fee_cap_stroops"] == \
        [({"paygate_instance": "h"}, 100_000)]

    plant_price(db, 250_000, ago="90 seconds")
    plant_lineage(db, "deposit", "deposit:1:deposit", bid=20_000, required=250_000, capped_ago="7 minutes")
    plant_lineage(db, "relay", "relay:4", bid=700, cap=4_000)
    second = tmp_path / "read"
    assert run_cli("run-tick", "webhooks", "--metrics-dir", str(second), dsn=dsn, PAYGATE_INSTANCE_ID="h",
                   PAYGATE_MAX_INCLUSION_FEE="120000").code == 0
    got = state_samples(second)
    capped = {labels["path"]: value for name, labels, value in got if name == "paygate_fee_capped_units"}
    assert capped == {"funding": 1, "settlement": 0, "relay": 0, "bot_jobs": 0, "ttl": 0}
    assert {labels["path"]: value for name, labels, value in got if name == "paygate_fee_bid_stroops"} == \
        {"funding": 20_000, "relay": 700}
    price = [(labels, value) for name, labels, value in got if name == "paygate_fee_market_price_stroops"]
    assert price == [({"percentile": "p90", "paygate_instance": "h"}, 250_000)]
    age = next(value for name, _, value in got if name == "paygate_fee_market_age_seconds")
    assert 90 <= age < 150
    assert next(value for name, _, value in got if name == "paygate_fee_cap_stroops") == 120_000
