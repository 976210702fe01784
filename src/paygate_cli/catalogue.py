"""The worker registry: name -> lock id, cadence, batch, concurrency, tick function.

Worker ids are fixed forever (they are advisory-lock keys that running hosts agree on); the ids of
catalogue workers not built yet are reserved here so nothing else takes them."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from paygate_cli.db.locks import worker_lock_key
from paygate_cli.errors import CannotWork, ConfigError, UsageError

if TYPE_CHECKING:
    from paygate_cli.context import TickContext, TickResult
    from paygate_cli.settings import Settings


def _has_secret(settings: Settings, name: str) -> bool:
    secret = settings.secret(name)
    return secret is not None and bool(secret.reveal().strip())


# What a worker may need before it can do its job, and how to say it is missing. Checked from
# configuration alone (no database, no RPC call), before the first tick, even an idle one: a worker
# that cannot move money must not report success while work would pile up behind it.
REQUIREMENTS: dict[str, tuple[str, Callable[[Settings], bool]]] = {
    "rpc": ("an RPC endpoint (PAYGATE_RPC_URL)", lambda s: bool(s.rpc_url)),
    "billing_contract": ("the billing contract id (PAYGATE_BILLING_CONTRACT)", lambda s: bool(s.billing_contract)),
    "usdc_contract": ("the USDC contract id (PAYGATE_USDC_CONTRACT)", lambda s: bool(s.usdc_contract)),
    "lane_keys": ("lane keys (PAYGATE_LANE_SECRETS_FILE)", lambda s: _has_secret(s, "lane_secrets")),
    "fee_key": ("the fee account key (PAYGATE_FEE_SECRET_FILE)", lambda s: _has_secret(s, "fee_secret")),
    "fee_account": ("the fee account (PAYGATE_FEE_ACCOUNT, or its key in PAYGATE_FEE_SECRET_FILE)",
                    lambda s: bool(s.fee_account) or _has_secret(s, "fee_secret")),
    "journal_keys": ("journal keys (PAYGATE_JOURNAL_KEYS_FILE)", lambda s: _has_secret(s, "journal_keys")),
    "journal_active_key": ("the active journal key id (PAYGATE_JOURNAL_ACTIVE_KEY_ID)",
                           lambda s: bool(s.journal_active_key_id)),
}
# A worker that signs and sends transactions from lanes, fee-bumped, journaled before broadcast;
# the billing contract's paths also need its id.
SIGNS = ("rpc", "lane_keys", "fee_key", "journal_keys", "journal_active_key")
SENDS_TRANSACTIONS = (*SIGNS, "billing_contract")
# A worker that only drives lineages already journaled (recovery: record what the chain proves, or
# resend the same bytes): RPC and the journal keys that decrypt those bytes; no lane or fee seed.
RESENDS_JOURNALED = ("rpc", "journal_keys", "journal_active_key")

# docs/architecture.md §3 catalogue order. Never renumber: ids are lock keys shared by every running host.
RESERVED_WORKER_IDS: dict[str, int] = {
    "funding": 1, "settlement": 2, "subscriptions": 3, "relay": 4, "observer": 5, "recovery": 6,
    "reconciler": 7, "relay_drainer": 8, "relay_expiry": 9, "gas": 10, "idempotency_sweep": 11,
    "webhooks": 12, "retention": 13, "ttl": 14,
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
    requires: tuple[str, ...] = ()  # keys of REQUIREMENTS, checked before the first tick
    # The `status` queues (state.py QUEUE_SQL) whose items wait for this worker: a worker that
    # never ran while one of them is non-empty is a blocker, one with nothing waiting is not deployed.
    queues: tuple[str, ...] = ()

    @property
    def overdue_after(self) -> float:
        """Seconds without a heartbeat after which the worker counts as not running: three
        cadences, and at least a minute more than one (a cron-started run every minute, a slow tick)."""
        return max(3 * self.cadence, self.cadence + 60)

    def missing(self, settings: Settings) -> list[str]:
        """What this worker lacks to do its job, as phrases naming the setting; [] when it can work."""
        return [REQUIREMENTS[name][0] for name in self.requires if not REQUIREMENTS[name][1](settings)]

    def check_requirements(self, settings: Settings) -> None:
        missing = self.missing(settings)
        if missing:
            raise CannotWork(f"{self.name} cannot work: missing {', '.join(missing)}")

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
                   description="pending deposits -> SAC transfer (user-signed auth) -> credit on the billing contract",
                   requires=(*SENDS_TRANSACTIONS, "usdc_contract"), queues=("deposits.pending",)),
        WorkerSpec("settlement", cadence=2, batch=48, single_writer=False, concurrency=4,
                   target="paygate_cli.workers.settlement:tick",
                   description="authorized charges -> charge_batch (<=50 read-write footprint keys per batch)",
                   requires=SENDS_TRANSACTIONS, queues=("charges.waiting",)),
        WorkerSpec("observer", cadence=2, batch=1000, single_writer=True, concurrency=1,
                   target="paygate_cli.workers.observer:tick",
                   description="billing contract events (credit, charge, charge_failed) -> promotions; owns cursor",
                   requires=("rpc", "billing_contract"), queues=("charges.in_batch",)),
        WorkerSpec("subscriptions", cadence=2, batch=500, single_writer=False, concurrency=4,
                   target="paygate_cli.workers.subscriptions:tick",
                   description="due subscriptions -> one charge per period (UNIQUE(subscription, period_start))",
                   queues=("subscriptions.due",)),
        WorkerSpec("recovery", cadence=30, batch=50, single_writer=False, concurrency=2,
                   target="paygate_cli.workers.recovery:tick",
                   description="claimed rows whose owner died -> resolved by receipt / lineage rules or released",
                   requires=RESENDS_JOURNALED),
        WorkerSpec("reconciler", cadence=60, batch=50, single_writer=True, concurrency=1,
                   target="paygate_cli.workers.reconciler:tick",
                   description="chain vs DB balances (in flight / lagging / unexplained), lanes; paced chain reads",
                   requires=("rpc", "billing_contract", "usdc_contract")),
        WorkerSpec("idempotency_sweep", cadence=3600, batch=1000, single_writer=True, concurrency=1,
                   target="paygate_cli.workers.idempotency_sweep:tick",
                   description="deletes expired idempotency keys in bounded batches", queues=("idempotency.expired",)),
        WorkerSpec("webhooks", cadence=1, batch=32, single_writer=False, concurrency=4,
                   target="paygate_cli.workers.webhooks:tick",
                   description="outbox -> customer HTTP (HMAC-signed), backoff, dead after N attempts",
                   queues=("webhooks.pending",)),
        WorkerSpec("relay", cadence=2, batch=16, single_writer=True, concurrency=1,
                   target="paygate_cli.workers.relay:tick",
                   description="queued relays -> chain, four phases under a lease; fees settled from receipts",
                   requires=SIGNS, queues=("relays.queued",)),
        WorkerSpec("relay_drainer", cadence=10, batch=25, single_writer=True, concurrency=1,
                   target="paygate_cli.workers.relay_drainer:tick",
                   description="permissionless contract calls queued as bot jobs (source-account auth only)",
                   requires=SIGNS, queues=("bot_jobs.queued",)),
        WorkerSpec("relay_expiry", cadence=60, batch=100, single_writer=True, concurrency=1,
                   target="paygate_cli.workers.relay_expiry:tick",
                   description="relays whose authorisation expired -> terminal, reservation released, told once",
                   requires=("rpc",)),
        WorkerSpec("gas", cadence=300, batch=None, single_writer=False, concurrency=1,
                   target="paygate_cli.workers.gas:tick",
                   description="fee account XLM headroom vs floors; writes/clears the durable gas halt",
                   requires=("rpc", "fee_account")),
        WorkerSpec("retention", cadence=300, batch=5000, single_writer=True, concurrency=1,
                   target="paygate_cli.workers.retention:tick",
                   description="terminal rows older than the retention window -> paygate_archive, in bounded batches"),
        WorkerSpec("ttl", cadence=60, batch=8, single_writer=True, concurrency=1,
                   target="paygate_cli.workers.ttl:tick",
                   description="keeps the contract's entries and funded accounts' balances alive: extend / restore "
                               "through the engine, within a daily rent budget",
                   requires=SENDS_TRANSACTIONS, queues=("ttl_jobs.pending",)),
    )
}


@dataclass(frozen=True)
class Recoverable:
    """A queue recovery takes over (workers/recovery.py): rows whose owner left no result past the
    grace window go through the owning worker's own `take_over(ctx, grace) -> outcome counts`."""

    queue: str
    worker: str  # owns the queue's claims (its cadence is "a tick"); its module holds take_over
    receipt_timeout: str  # the Settings field: longest a live owner may wait on one answer without a write

    def timeout(self, settings: Settings) -> float:
        return float(getattr(settings, self.receipt_timeout))

    def load(self) -> Callable[[TickContext, float], dict[str, int]]:
        """The owning worker's take_over, imported only when recovery runs (as a tick target is), so
        recovery itself imports no other worker."""
        module_name = WORKERS[self.worker].target.partition(":")[0]
        return importlib.import_module(module_name).take_over


# In the order recovery takes them over: webhooks first, which read no chain, so a chain outage that
# fails a later entry has not held them up.
RECOVERABLE: tuple[Recoverable, ...] = (
    # A delivery holds its row for at most the HTTP timeout; its settle follows at once.
    Recoverable("webhooks", "webhooks", "webhook_timeout"),
    # A money worker renews its lease before each phase; within a phase it waits on one RPC answer.
    Recoverable("deposits", "funding", "rpc_timeout"),
    Recoverable("charge_batches", "settlement", "rpc_timeout"),
    Recoverable("relays", "relay", "rpc_timeout"),
    Recoverable("bot_jobs", "relay_drainer", "rpc_timeout"),
)


def recovery_grace(settings: Settings) -> float:
    """The grace window of a take-over (recovery's tick, `recover-check`), or ConfigError (78) when it
    does not exceed every recovered queue's receipt timeout plus one tick of its worker: a shorter
    grace could take work from a live worker."""
    grace = float(settings.recovery_grace)
    for entry in RECOVERABLE:
        needed = entry.timeout(settings) + WORKERS[entry.worker].cadence
        if grace <= needed:
            raise ConfigError(f"recovery_grace {grace:g}s must exceed the {entry.queue} receipt timeout plus one "
                              f"{entry.worker} tick ({needed:g}s): a shorter grace could take work from a live "
                              "worker", msgid="config.recovery_grace")
    return grace


def get_worker(name: str) -> WorkerSpec:
    spec = WORKERS.get(name.replace("-", "_"))
    if spec is None:
        known = ", ".join(sorted(WORKERS))
        raise UsageError(f"unknown worker {name!r}; known workers: {known}", msgid="usage.unknown_worker")
    return spec
