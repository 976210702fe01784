"""The worker registry: name -> lock id, cadence, batch, concurrency, tick function.

Worker ids are fixed forever (they are advisory-lock keys that running hosts agree on); the ids of
catalogue workers not built yet are reserved here so nothing else takes them."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from paygate_cli.db.locks import worker_lock_key
from paygate_cli.errors import UsageError

if TYPE_CHECKING:
    from paygate_cli.ticks.context import TickContext, TickResult

# DESIGN §3 catalogue order. Never renumber: ids are lock keys shared by every running host.
RESERVED_WORKER_IDS: dict[str, int] = {
    "funding": 1, "settlement": 2, "subscriptions": 3, "relay": 4, "observer": 5, "recovery": 6,
    "reconciler": 7, "relay_drainer": 8, "relay_expiry": 9, "gas": 10, "idempotency_sweep": 11,
    "webhooks": 12,
}


@dataclass(frozen=True)
class WorkerSpec:
    name: str
    cadence: float  # seconds between ticks, the scheduler default
    batch: int | None
    single_writer: bool
    concurrency: int  # slots; single writers have exactly 1
    target: str  # "module:function" of the tick, imported only when the worker runs
    description: str

    @property
    def worker_id(self) -> int:
        return RESERVED_WORKER_IDS[self.name]

    def lock_keys(self) -> list[int]:
        return [worker_lock_key(self.worker_id, slot) for slot in range(self.concurrency)]

    def load(self) -> Callable[[TickContext], TickResult]:
        module_name, _, function = self.target.partition(":")
        return getattr(importlib.import_module(module_name), function)


WORKERS: dict[str, WorkerSpec] = {
    spec.name: spec
    for spec in (
        WorkerSpec("funding", cadence=2, batch=16, single_writer=False, concurrency=4,
                   target="paygate_cli.workers.funding:tick",
                   description="pending deposits -> SAC transfer (user-signed auth) -> credit on the billing contract"),
        WorkerSpec("settlement", cadence=2, batch=48, single_writer=False, concurrency=4,
                   target="paygate_cli.workers.settlement:tick",
                   description="authorized charges -> charge_batch (<=50 read-write footprint keys per batch)"),
        WorkerSpec("observer", cadence=2, batch=1000, single_writer=True, concurrency=1,
                   target="paygate_cli.workers.observer:tick",
                   description="billing contract events (credit, charge, charge_failed) -> promotions; owns cursor"),
        WorkerSpec("subscriptions", cadence=60, batch=16, single_writer=False, concurrency=4,
                   target="paygate_cli.workers.subscriptions:tick",
                   description="due subscriptions -> one charge per period (UNIQUE(subscription, period_start))"),
        WorkerSpec("idempotency_sweep", cadence=3600, batch=1000, single_writer=True, concurrency=1,
                   target="paygate_cli.workers.idempotency_sweep:tick",
                   description="deletes expired idempotency keys in bounded batches"),
        WorkerSpec("webhooks", cadence=1, batch=32, single_writer=False, concurrency=4,
                   target="paygate_cli.workers.webhooks:tick",
                   description="outbox -> customer HTTP (HMAC-signed), backoff, dead after N attempts"),
        WorkerSpec("relay", cadence=2, batch=16, single_writer=True, concurrency=1,
                   target="paygate_cli.workers.relay:tick",
                   description="queued relays -> chain, four phases under a lease; fees settled from receipts"),
        WorkerSpec("relay_drainer", cadence=10, batch=25, single_writer=True, concurrency=1,
                   target="paygate_cli.workers.relay_drainer:tick",
                   description="permissionless contract calls queued as bot jobs (source-account auth only)"),
        WorkerSpec("relay_expiry", cadence=60, batch=100, single_writer=True, concurrency=1,
                   target="paygate_cli.workers.relay_expiry:tick",
                   description="relays whose authorisation expired -> terminal, reservation released, told once"),
        WorkerSpec("gas", cadence=300, batch=None, single_writer=False, concurrency=1,
                   target="paygate_cli.workers.gas:tick",
                   description="fee account XLM headroom vs floors; writes/clears the durable gas halt"),
    )
}


def get_worker(name: str) -> WorkerSpec:
    spec = WORKERS.get(name.replace("-", "_"))
    if spec is None:
        known = ", ".join(sorted(WORKERS))
        raise UsageError(f"unknown worker {name!r}; known workers: {known}", msgid="usage.unknown_worker")
    return spec
