"""Prometheus textfile gauges, one file per worker slot, rewritten atomically after every tick.

Label names: `worker`, `slot` and `paygate_instance`. Never `instance`: Prometheus sets that label
itself on every scraped series (the node_exporter's address), so ours would be renamed to
`exported_instance` or overwrite the target's, depending on `honor_labels`.

Files: `paygate_<worker>_slot<N>.prom` for a run that holds slot N (slots of one worker run side by
side on one host, so each needs its own file), and `paygate_<worker>_start.prom` for a run that ended
before it held a slot (database down 69, configuration 78, a bug 70): without it a worker that cannot
even start would leave only its last good file behind and look healthy. A later run that gets a slot
removes the start file, so a fixed start failure does not alert for ever. node_exporter merges every
file of the directory, so the label sets of the files never collide (the slot label differs)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

START_SLOT = "none"  # the slot label of a run that never held a slot


def require_parent(directory: str, where: str = "--metrics-dir") -> str:
    """The metrics directory may be created, but only inside a directory that exists: a mistyped
    path (`/var/lib/node_exportr/textfile`) is a configuration error (78), never a tree of new
    directories that no collector reads."""
    from paygate_cli.errors import ConfigError

    path = os.path.abspath(directory)
    parent = os.path.dirname(path)
    if not os.path.isdir(path) and not os.path.isdir(parent):
        raise ConfigError(f"{where} {path}: its parent directory {parent} does not exist (a typo?); "
                          "create it, or point the metrics directory at an existing one",
                          msgid="config.metrics_dir")
    return path


def _ensure_directory(directory: str) -> None:
    """Create the metrics directory itself when missing (never its parents)."""
    path = require_parent(directory)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path)

HELP = {
    "paygate_tick_last_run_timestamp_seconds": "Unix time the last tick (or failed start) of this slot finished",
    "paygate_tick_last_success_timestamp_seconds": "Unix time of the worker's last successful tick (worker_runs)",
    "paygate_tick_duration_seconds": "Duration of the last tick",
    "paygate_tick_processed_items": "Items processed by the last tick",
    "paygate_tick_exit_code": "Exit code the last tick (or failed start) maps to",
    "paygate_worker_stalled": "1 when the last tick's outcome was 'stalled' (work waiting that it could not move)",
}


@dataclass
class TickMetrics:
    worker: str
    instance: str
    slot: int | None  # None: the run ended before it held a slot
    last_run: float
    last_success: float | None  # from worker_runs, so a failed process does not erase it; None = unknown
    duration: float | None
    processed: int | None
    exit_code: int
    stalled: bool = False


def textfile_path(directory: str, worker: str, slot: int | None) -> str:
    suffix = "start" if slot is None else f"slot{slot}"
    return os.path.join(directory, f"paygate_{worker}_{suffix}.prom")


def write_textfile(directory: str, metrics: TickMetrics) -> str:
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    registry = CollectorRegistry()  # not the default one: no process metrics in a textfile
    values: dict[str, float | None] = {
        "paygate_tick_last_run_timestamp_seconds": metrics.last_run,
        # Unknown is left out, not written as 0: a 0 would read as "last success in 1970".
        "paygate_tick_last_success_timestamp_seconds": metrics.last_success,
        "paygate_tick_duration_seconds": metrics.duration,
        "paygate_tick_processed_items": metrics.processed,
        "paygate_tick_exit_code": metrics.exit_code,
        "paygate_worker_stalled": 1.0 if metrics.stalled else 0.0,
    }
    slot = START_SLOT if metrics.slot is None else str(metrics.slot)
    for name, value in values.items():
        if value is None:
            continue
        gauge = Gauge(name, HELP[name], ["worker", "slot", "paygate_instance"], registry=registry)
        gauge.labels(metrics.worker, slot, metrics.instance).set(value)
    _ensure_directory(directory)
    path = textfile_path(directory, metrics.worker, metrics.slot)
    write_to_textfile(path, registry)  # temp file + rename: the collector never reads half a file
    if metrics.slot is not None:
        # This run started, so an older "could not start" file on this host no longer tells the truth.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(textfile_path(directory, metrics.worker, None))
    return path


# --- the shared state file -----------------------------------------------------------------------
# Queue ages, dead webhooks, halts and open findings are facts of the database, not of one tick. Any
# worker ticking on a host rewrites `paygate_state.prom` when it is older than STATE_INTERVAL, so the
# alert rules have them without another process to run. Every host writes the same values; the rules
# aggregate with max() over paygate_instance.
STATE_FILE = "paygate_state.prom"
STATE_INTERVAL = 30.0

STATE_HELP = {
    "paygate_queue_depth": "Items in a queue state (paygate status --json: queues)",
    "paygate_queue_oldest_age_seconds": "Age of the oldest item in a queue state; 0 when empty",
    "paygate_halt": "1 while a halt of this kind is set (operator, gas, restore)",
    "paygate_findings_open": "Open reconciliation findings (unexplained drift)",
    "paygate_state_timestamp_seconds": "Unix time this state file was written",
    "paygate_fee_capped_units": "Live lineages of a path that are fee-capped: the market asks more than their "
                                "cap (0: none)",
    "paygate_fee_market_price_stroops": "The last fee market price read (getFeeStats' percentile of "
                                        "sorobanInclusionFee: a transaction's whole inclusion fee, stroops); "
                                        "absent when never read",
    "paygate_fee_market_age_seconds": "Age of the last fee market price read when this file was written; absent when "
                                      "never read",
    "paygate_fee_bid_stroops": "Highest current bid (stroops/op) of a live signed lineage of a path; absent when none",
    "paygate_fee_cap_stroops": "PAYGATE_MAX_INCLUSION_FEE: the highest bid (stroops/op) any envelope may make",
    "paygate_ttl_nearest_expiry_ledgers": "Ledgers until the nearest expiry of a ledger entry the TTL keeper keeps "
                                          "alive (as last read); absent when none was read live",
    "paygate_ttl_entries": "Ledger entries the TTL keeper keeps alive, by state as last read (0: none)",
    "paygate_ttl_rent_spent_stroops": "Rent (extend and restore fees) the TTL keeper paid today (UTC)",
    "paygate_ttl_left_unextended": "Due entries the TTL keeper's daily rent budget left unextended today",
    "paygate_ttl_threshold_ledgers": "PAYGATE_TTL_THRESHOLD in ledgers: the keeper extends an entry expiring sooner",
    "paygate_gas_headroom_stroops": "The fee account's headroom as the gas monitor last read it (stroops; "
                                    "docs/workers.md Gas headroom); absent before its first check",
    "paygate_gas_balance_stroops": "The fee account's balance as the gas monitor last read it (stroops); absent before "
                                   "its first check",
    "paygate_gas_committed_fees_stroops": "What the in-flight lineages could still be charged at their cap (stroops); "
                                          "absent before the gas monitor's first check",
}


@dataclass
class StateMetrics:
    instance: str
    queues: list[dict]  # state.queue_depths()
    halts: list[str]  # kinds currently set
    findings_open: int | None  # None: this schema has no findings table yet
    written: float
    fee: dict | None = None  # state.fee_market_state(); None: not read (no fee gauges at all)
    fee_cap: int | None = None  # settings.max_inclusion_fee of the writing worker
    ttl: dict | None = None  # state.ttl_state(); None: not read (no TTL gauges at all)
    ttl_threshold: int | None = None  # settings.ttl_threshold in ledgers, of the writing worker
    gas: dict | None = None  # state.gas_state(); None: not read (no gas gauges at all)


def state_is_stale(directory: str, now: float) -> bool:
    try:
        return now - os.stat(os.path.join(directory, STATE_FILE)).st_mtime >= STATE_INTERVAL
    except FileNotFoundError:
        return True


def write_state_textfile(directory: str, state: StateMetrics) -> str:
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    registry = CollectorRegistry()
    depth = Gauge("paygate_queue_depth", STATE_HELP["paygate_queue_depth"], ["queue", "paygate_instance"],
                  registry=registry)
    age = Gauge("paygate_queue_oldest_age_seconds", STATE_HELP["paygate_queue_oldest_age_seconds"],
                ["queue", "paygate_instance"], registry=registry)
    for queue in state.queues:
        depth.labels(queue["queue"], state.instance).set(queue["depth"])
        age.labels(queue["queue"], state.instance).set(queue["oldest_age_s"] or 0.0)
    halt = Gauge("paygate_halt", STATE_HELP["paygate_halt"], ["kind", "paygate_instance"], registry=registry)
    for kind in ("operator", "gas", "restore", *sorted(set(state.halts) - {"operator", "gas", "restore"})):
        # Every kind always present (0 or 1), so "cleared" is a value, not a vanished series.
        halt.labels(kind, state.instance).set(1.0 if kind in state.halts else 0.0)
    if state.findings_open is not None:
        Gauge("paygate_findings_open", STATE_HELP["paygate_findings_open"], ["paygate_instance"],
              registry=registry).labels(state.instance).set(state.findings_open)
    Gauge("paygate_state_timestamp_seconds", STATE_HELP["paygate_state_timestamp_seconds"], ["paygate_instance"],
          registry=registry).labels(state.instance).set(state.written)
    if state.fee is not None:
        _fee_gauges(registry, state)
    if state.ttl is not None:
        _ttl_gauges(registry, state)
    if state.gas is not None and state.gas.get("level") is not None:  # never checked: absent, never 0
        for name, key in (("paygate_gas_headroom_stroops", "headroom"), ("paygate_gas_balance_stroops", "balance"),
                          ("paygate_gas_committed_fees_stroops", "committed_fees")):
            if state.gas.get(key) is not None:
                Gauge(name, STATE_HELP[name], ["paygate_instance"], registry=registry).labels(
                    state.instance).set(state.gas[key])
    _ensure_directory(directory)
    path = os.path.join(directory, STATE_FILE)
    write_to_textfile(path, registry)
    return path


def _fee_gauges(registry: CollectorRegistry, state: StateMetrics) -> None:
    """The fee market's gauges. Every path has a fee-capped count, 0 included, so "cleared" is a
    value and the alert always has a series; a price never read and a path with no live bid are
    left out, never written as 0 (a 0 would read as a free market, or a bid of nothing)."""
    from prometheus_client import Gauge

    fee = state.fee or {}
    capped = Gauge("paygate_fee_capped_units", STATE_HELP["paygate_fee_capped_units"], ["path", "paygate_instance"],
                   registry=registry)
    bid = Gauge("paygate_fee_bid_stroops", STATE_HELP["paygate_fee_bid_stroops"], ["path", "paygate_instance"],
                registry=registry)
    for path in fee.get("paths", []):
        capped.labels(path["path"], state.instance).set(path["fee_capped"])
        if path["highest_bid"] is not None:
            bid.labels(path["path"], state.instance).set(path["highest_bid"])
    market = fee.get("market")
    if market is not None:
        Gauge("paygate_fee_market_price_stroops", STATE_HELP["paygate_fee_market_price_stroops"],
              ["percentile", "paygate_instance"], registry=registry).labels(
                  market["percentile"], state.instance).set(market["price"])
        Gauge("paygate_fee_market_age_seconds", STATE_HELP["paygate_fee_market_age_seconds"], ["paygate_instance"],
              registry=registry).labels(state.instance).set(market["age_s"])
    if state.fee_cap is not None:
        Gauge("paygate_fee_cap_stroops", STATE_HELP["paygate_fee_cap_stroops"], ["paygate_instance"],
              registry=registry).labels(state.instance).set(state.fee_cap)


def _ttl_gauges(registry: CollectorRegistry, state: StateMetrics) -> None:
    """The TTL keeper's gauges. Every entry state has a count, 0 included; the nearest expiry is left
    out when no kept entry was read live (never 0: that would read as "expiring now")."""
    from prometheus_client import Gauge

    ttl = state.ttl or {}
    entries = Gauge("paygate_ttl_entries", STATE_HELP["paygate_ttl_entries"], ["state", "paygate_instance"],
                    registry=registry)
    for name, count in ttl.get("entries", {}).items():
        entries.labels(name, state.instance).set(count)
    nearest = ttl.get("nearest")
    if nearest is not None and nearest.get("ledgers_left") is not None:
        Gauge("paygate_ttl_nearest_expiry_ledgers", STATE_HELP["paygate_ttl_nearest_expiry_ledgers"],
              ["paygate_instance"], registry=registry).labels(state.instance).set(nearest["ledgers_left"])
    rent = ttl.get("rent", {})
    Gauge("paygate_ttl_rent_spent_stroops", STATE_HELP["paygate_ttl_rent_spent_stroops"], ["paygate_instance"],
          registry=registry).labels(state.instance).set(rent.get("spent", 0))
    Gauge("paygate_ttl_left_unextended", STATE_HELP["paygate_ttl_left_unextended"], ["paygate_instance"],
          registry=registry).labels(state.instance).set(rent.get("left_unextended", 0))
    if state.ttl_threshold is not None:
        Gauge("paygate_ttl_threshold_ledgers", STATE_HELP["paygate_ttl_threshold_ledgers"], ["paygate_instance"],
              registry=registry).labels(state.instance).set(state.ttl_threshold)
