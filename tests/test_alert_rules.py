"""The Prometheus alerting rules: valid for Prometheus itself (`promtool check rules`), behaving as
intended on sample series (`promtool test rules` with jobs/prometheus/paygate.rules.test.yml), and
written against metrics paygate really exports, with a runbook for each alert."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from paygate_cli.metrics import HELP, STATE_HELP

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "jobs" / "prometheus" / "paygate.rules.yml"
RULE_TESTS = ROOT / "jobs" / "prometheus" / "paygate.rules.test.yml"
# node_exporter's own series a rule may use besides ours.
FOREIGN_METRICS = {"node_textfile_mtime_seconds", "node_textfile_scrape_error"}


def rules() -> list[dict]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (Debian package `prometheus`; .ci/run installs it): "
                    "the YAML structure is still checked by the other tests here")
    return path


def test_rules_cover_the_situations_on_call_needs() -> None:
    exprs = {rule["alert"]: rule["expr"] for rule in rules()}
    fee_capped = {rule["labels"]["severity"]: rule for rule in rules() if rule["alert"] == "PaygateFeeCapped"}
    # A ticket after 5 minutes, escalated to a page when it lasts 30: one alert, two severities.
    assert {severity: rule["for"] for severity, rule in fee_capped.items()} == {"ticket": "5m", "page": "30m"}
    assert all("paygate_fee_capped_units" in rule["expr"] for rule in fee_capped.values())
    assert "paygate_fee_market_age_seconds" in exprs["PaygateFeeMarketStale"]
    assert "absent(paygate_fee_market_age_seconds)" in exprs["PaygateFeeMarketStale"]  # never read is not fresh
    assert "== 3" in exprs["PaygateWorkerNeedsHuman"]
    assert "paygate_tick_last_success_timestamp_seconds" in exprs["PaygateTickNotSucceeding"]
    assert "paygate_worker_stalled" in exprs["PaygateWorkerStalled"]
    assert "paygate_queue_oldest_age_seconds" in exprs["PaygateQueueOldestItemTooOld"]
    assert 'queue="webhooks.dead"' in exprs["PaygateWebhooksDead"]
    assert 'kind="gas"' in exprs["PaygateGasHalt"]
    assert 'kind="restore"' in exprs["PaygateRestoreHalt"]
    assert "paygate_findings_open" in exprs["PaygateReconciliationFindings"]


def test_every_rule_is_well_formed_and_uses_only_metrics_paygate_exports() -> None:
    exported = set(HELP) | set(STATE_HELP) | FOREIGN_METRICS
    # One alert may escalate (a ticket, then a page under the same name): never two rules alike.
    names = [(rule["alert"], rule["labels"]["severity"]) for rule in rules()]
    assert len(names) == len(set(names))
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("page", "ticket"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["runbook_url"].startswith("runbooks/")
        used = set(re.findall(r"\b((?:paygate|node)_[a-z_]+)\b", rule["expr"])) - {"paygate_instance"}
        assert used and used <= exported, (rule["alert"], used - exported)
        # Prometheus owns `instance`; ours is paygate_instance.
        assert not re.search(r"\binstance\b", rule["expr"]), rule["alert"]


def test_promtool_accepts_the_rules() -> None:
    result = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(rules())} rules found" in result.stdout


def test_promtool_rejects_a_broken_expression(tmp_path: Path) -> None:
    broken = tmp_path / "broken.rules.yml"
    broken.write_text(RULES.read_text().replace("max by (worker) (paygate_worker_stalled) == 1",
                                                "max by (worker) (paygate_worker_stalled == 1", 1))
    result = subprocess.run([promtool(), "check", "rules", str(broken)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0


def test_rules_fire_on_sample_series_as_intended() -> None:
    result = subprocess.run([promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                            timeout=120, cwd=RULE_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
