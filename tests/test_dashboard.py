"""The Grafana dashboard (jobs/grafana/paygate.json) is written against what paygate really exports:
every metric selector of every panel's PromQL names a series, and every label matcher and grouping
label a label, that the textfile collector files hold after real ticks (a funding tick moving a
deposit, the gas monitor, the webhooks worker) wrote them into a metrics directory."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.chain_env import admit_deposit, chain_environ, sign_deposit
from tests.support.cli import run_cli
from tests.support.devnet_support import start_devnet
from tests.support.pg import PgServer

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "jobs" / "grafana" / "paygate.json"
# What a PromQL expression may name besides series: the functions, aggregations and keywords the
# dashboard uses (a name outside both lists is a typo or a series paygate does not export).
PROMQL_WORDS = {"sum", "min", "max", "avg", "count", "by", "without", "time", "rate", "increase", "delta",
                "absent", "clamp_min", "clamp_max", "on", "ignoring", "and", "or", "unless", "bool", "offset"}
_STRING = r'"(?:[^"\\]|\\.)*"'
_MATCHER = re.compile(rf"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*({_STRING})\s*(?:,|$)")
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
_NUMBER = re.compile(r"(?<![a-zA-Z0-9_:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")

Exported = dict[str, dict[str, set[str]]]  # metric -> label -> the values seen


def exported_series(directory: Path) -> Exported:
    """Every metric in the directory's .prom files, with its labels and their values."""
    found: Exported = {}
    for path in sorted(directory.glob("*.prom")):
        for family in text_string_to_metric_families(path.read_text()):
            for sample in family.samples:
                labels = found.setdefault(sample.name, {})
                for name, value in sample.labels.items():
                    labels.setdefault(name, set()).add(value)
    return found


def expression_problems(expr: str, exported: Exported) -> list[str]:
    """What in `expr` is not what the files hold: an unknown series, a matcher on a label the series
    lacks (or, for `=`, a value no series has), a grouping label no series of the expression has."""
    problems: list[str] = []
    metrics: set[str] = set()
    rest = expr
    for match in _SELECTOR.finditer(expr):
        name, body = match.group(1), match.group(2)
        metrics.add(name)
        labels = exported.get(name, {})
        consumed = "".join(m.group(0) for m in _MATCHER.finditer(body))
        if consumed.strip() != body.strip():
            problems.append(f"{name}{{{body}}}: label matchers do not parse")
        for label, op, quoted in _MATCHER.findall(body):
            value = json.loads(quoted)
            if label not in labels:
                problems.append(f"{name}: no label {label!r} (it has {sorted(labels)})")
            elif op == "=" and value not in labels[label]:
                problems.append(f"{name}{{{label}={quoted}}}: no such series (values: {sorted(labels[label])})")
    rest = _SELECTOR.sub(lambda m: f" {m.group(1)} ", rest)
    grouping: set[str] = set()
    for match in _GROUPING.finditer(rest):
        grouping |= {label.strip() for label in match.group(1).split(",") if label.strip()}
    rest = _GROUPING.sub(" ", rest)
    rest = re.sub(_STRING, " ", _NUMBER.sub(" ", rest))
    for word in _IDENTIFIER.findall(rest):
        if word in PROMQL_WORDS:
            continue
        metrics.add(word)
    for name in sorted(metrics):
        if name not in exported:
            problems.append(f"{name}: not a series paygate exports")
    for label in sorted(grouping):
        lacking = [m for m in sorted(metrics) if m in exported and label not in exported[m]]
        if lacking:
            problems.append(f"grouping by {label!r}: {', '.join(lacking)} has no such label")
    if not metrics:
        problems.append("no series at all")
    return problems


def panels() -> list[dict]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, pg_server: PgServer) -> Iterator[Exported]:
    """The files real ticks write: the gas monitor's check, then a funding tick that reads the fee
    market and sends a deposit (its lineage stays live: the devnet closes no ledger by itself), and
    the webhooks worker; the state file is rewritten after funding's tick (made stale first, as 30 s
    would), so it holds the gas reading, the fee market and the live bid together."""
    tmp_path = tmp_path_factory.mktemp("dashboard")
    database = pg_server.create_database()
    devnet = start_devnet(tmp_path / "devnet", lanes=1, users=1)
    try:
        environ = chain_environ(devnet, database, tmp_path / "keys")
        metrics = tmp_path / "metrics"
        user = devnet.genesis["users"][0]
        entry, nonce, expiration = sign_deposit(devnet, user["secret"], 1_000_000)
        with psycopg.connect(database, autocommit=True) as conn:
            admit_deposit(conn, user["public"], 1_000_000, entry, nonce, expiration, "dashboard-1")
        gas = run_cli("run-tick", "gas", "--metrics-dir", str(metrics), environ=environ)
        assert gas.code == 0, gas.err
        os.utime(metrics / "paygate_state.prom", (0, 0))
        funding = run_cli("run-tick", "funding", "--metrics-dir", str(metrics), environ=environ)
        assert funding.code == 0, funding.err
        webhooks = run_cli("run-tick", "webhooks", "--metrics-dir", str(metrics), environ=environ)
        assert webhooks.code == 0, webhooks.err
        yield exported_series(metrics)
    finally:
        devnet.stop()
        pg_server.drop_database(database)


def test_every_panel_expression_uses_only_what_the_textfiles_hold(exported: Exported) -> None:
    assert {"paygate_gas_headroom_stroops", "paygate_fee_bid_stroops", "paygate_tick_exit_code"} <= set(exported)
    problems = {f"{p['title']} / {t['refId']}": expression_problems(t["expr"], exported)
                for p in panels() for t in p["targets"]}
    assert {where: found for where, found in problems.items() if found} == {}


def test_the_checker_refuses_what_paygate_does_not_export(exported: Exported) -> None:
    assert expression_problems("max by (queue) (paygate_queue_depth)", exported) == []
    assert expression_problems('max(paygate_queue_depth{queue="lineages.live"}) / 1e7', exported) == []
    assert expression_problems("max by (queue) (paygate_queue_depht)", exported) == [
        "paygate_queue_depht: not a series paygate exports"]
    assert expression_problems('paygate_halt{knd="gas"}', exported)[0].startswith("paygate_halt: no label 'knd'")
    assert expression_problems('paygate_halt{kind="gaz"}', exported)[0].startswith(
        'paygate_halt{kind="gaz"}: no such series')
    assert expression_problems("max by (worker) (paygate_queue_depth)", exported) == [
        "grouping by 'worker': paygate_queue_depth has no such label"]
    assert expression_problems('paygate_halt{kind="gas",', exported)  # a selector that does not close
    assert expression_problems("time() - max(paygate_state_timestamp_seconds{instance=~\".+\"})", exported)


def test_the_dashboard_covers_what_on_call_watches() -> None:
    document = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in document["panels"]]
    assert len(ids) == len(set(ids))
    assert [v["name"] for v in document["templating"]["list"]] == ["datasource"]
    exprs = [t["expr"] for p in panels() for t in p["targets"]]
    for p in panels():
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"} and p["targets"], p["title"]
    joined = "\n".join(exprs)
    for needed in ("paygate_queue_depth", "paygate_queue_oldest_age_seconds", "paygate_tick_exit_code",
                   "paygate_halt", "paygate_gas_headroom_stroops", 'queue="lineages.live"', "paygate_findings_open"):
        assert needed in joined, needed
    assert "max by (worker) (paygate_tick_exit_code)" in exprs  # tick outcomes by worker
    # Prometheus owns `instance` (ours is paygate_instance), as in the alert rules.
    assert not any(re.search(r"\binstance\b", e) for e in exprs)
