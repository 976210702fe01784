"""`paygate demo` relays market.buy calls: one applied, two racing for one item (one applies, the
other fails on chain with its fee settled), one expired; fees reserved vs settled add up."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import run_proc
from tests.support.dirs import public_tmp as public_tmp


def test_demo_relays_show_fees_reserved_vs_settled(public_tmp: Path) -> None:
    data = str(public_tmp / "demo-pg")
    try:
        result = run_proc("demo", "--data-dir", data, "--json", timeout=240)
        assert result.code == 0, result.err
        report = json.loads(result.out)["demo"]
        relays = report["relays"]
        assert len(relays) == 4
        assert relays[0]["status"] == "applied" and relays[3]["status"] == "expired"
        assert sorted(r["status"] for r in relays[1:3]) == ["applied", "failed"]
        for relay in relays:
            if relay["status"] in ("applied", "failed"):
                assert relay["reservation"] == "settled" and 0 < relay["fee_settled"] <= relay["fee_reserved"]
            else:
                assert relay["reservation"] == "released" and relay["fee_settled"] == 0
        fees = report["relay_fees"]
        assert fees["open_reserved"] == 0
        assert fees["settled"] == sum(r["fee_settled"] for r in relays)
        assert fees["released"] == relays[3]["fee_reserved"]
        human = run_proc("demo", "--data-dir", data, timeout=240)
        assert human.code == 0 and "relays (the gateway pays the fees)" in human.out
    finally:
        run_proc("dev", "db", "down", "--data-dir", data)
