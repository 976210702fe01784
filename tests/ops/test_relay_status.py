"""`status` shows the relay and bot-job queues, the gas headroom and the gas halt."""

from __future__ import annotations

import json

import psycopg

from paygate_cli.errors import ExitCode
from tests.support.cli import run_cli
from tests.support.relay_admission import MARKET, admit, args_xdr
from tests.support.relay_admission import allowed as allowed


def test_status_shows_relay_queues_gas_headroom_and_the_gas_halt(dsn: str, allowed: psycopg.Connection) -> None:
    db = allowed
    admit(db, "r1", max_fee=3_000_000)
    db.execute("SELECT * FROM paygate.admit_bot_job('close:1', %s, 'close_expired', %s)", (MARKET, args_xdr()))
    db.execute("INSERT INTO paygate.gas_state (fee_account, balance, reserve, reserved_fees, headroom, level, "
               "halted, low_lanes) VALUES ('G' || repeat('A', 55), 90000000, 10000000, 3000000, 77000000, "
               "'critical', true, '[]')")
    db.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('gas', 'headroom 77000000 below the "
               "critical floor', 'gas-monitor')")
    result = run_cli("status", "--json", dsn=dsn)
    report = json.loads(result.out)["status"]
    assert result.code == ExitCode.FAILED and report["ready"] is False
    assert any("gas halt" in p for p in report["problems"])
    queues = {q["queue"]: q["depth"] for q in report["queues"]}
    assert queues["relays.queued"] == 1 and queues["bot_jobs.queued"] == 1 and queues["relays.needs_human"] == 0
    assert report["gas"]["level"] == "critical" and report["gas"]["headroom"] == 77_000_000
    assert report["gas"]["fees_reserved"] == 3_000_000
    plain = run_cli("status", "--plain", dsn=dsn)
    assert "gas\tcritical\theadroom 77000000 stroops" in plain.out
