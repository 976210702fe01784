"""Prometheus textfile gauges, one file per worker, rewritten atomically after every tick."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class TickMetrics:
    worker: str
    instance: str
    last_run: float
    last_success: float | None  # from worker_runs, so a failed process does not erase it
    duration: float
    processed: int
    exit_code: int


def write_textfile(directory: str, metrics: TickMetrics) -> str:
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    registry = CollectorRegistry()  # not the default one: no process metrics in a textfile
    labels = ["worker", "instance"]
    values = {
        "paygate_tick_last_run_timestamp_seconds": ("Unix time the last tick finished", metrics.last_run),
        "paygate_tick_last_success_timestamp_seconds": ("Unix time of the last successful tick",
                                                        metrics.last_success or 0.0),
        "paygate_tick_duration_seconds": ("Duration of the last tick", metrics.duration),
        "paygate_tick_processed_items": ("Items processed by the last tick", metrics.processed),
        "paygate_tick_exit_code": ("Exit code the last tick maps to", metrics.exit_code),
    }
    for name, (help_text, value) in values.items():
        Gauge(name, help_text, labels, registry=registry).labels(metrics.worker, metrics.instance).set(value)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"paygate_{metrics.worker}.prom")
    write_to_textfile(path, registry)  # temp file + rename: the collector never reads half a file
    return path
