"""The tick runner (docs/architecture.md §3): one worker's lock for the whole process, ticks on a fixed-rate
monotonic schedule, a heartbeat row per tick, signals finish the current tick first."""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from paygate_cli.context import TickContext, TickResult
from paygate_cli.db.connect import (
    connect,
    connection_target,
    describe_target,
    dsn_target,
    is_connection_lost,
    is_read_only_error,
    no_writer_error,
)
from paygate_cli.db.locks import acquire_slot, describe_key
from paygate_cli.db.migrate import require_schema
from paygate_cli.errors import CannotWork, ConfigError, ExitCode, NeedsHuman, PaygateError, Unavailable, UsageError
from paygate_cli.logs import get_logger
from paygate_cli.secrets import scrub
from paygate_cli.settings import check_read_quorum
from paygate_cli.ticks.next_ledger import NextLedgerWaiter
from paygate_cli.ticks.preflight import check_secrets

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.catalogue import WorkerSpec
    from paygate_cli.chain.rpc import ChainClient
    from paygate_cli.env import Env
    from paygate_cli.settings import Settings

log = get_logger("ticks")

INSTANCE_SEEN_SQL = """
INSERT INTO paygate.instances (instance_id) VALUES (%s)
ON CONFLICT (instance_id) DO UPDATE SET last_seen = now()
"""
# One round trip: open the heartbeat row, learn whether this instance is drained, and compare the
# database's identity with the recorded one (the restore gate, docs/architecture.md §8: a reason when
# it changed, and the `restore` halt is set in this same transaction). That halt commits relaxed with
# the heartbeat: a crash may lose it, and the next tick sets it again (the identity still differs).
HEARTBEAT_START_SQL = """
WITH run AS (
    INSERT INTO paygate.worker_runs (worker, instance_id, slot, pid) VALUES (%s, %s, %s, %s)
    RETURNING id
)
SELECT run.id,
       EXISTS (SELECT 1 FROM paygate.instances i WHERE i.instance_id = %s AND i.drained_at IS NOT NULL),
       paygate.check_db_identity(%s)
FROM run
"""
HEARTBEAT_FINISH_SQL = """
UPDATE paygate.worker_runs
SET finished_at = clock_timestamp(), outcome = %s, processed = %s, failed = %s, error = %s
WHERE id = %s
"""
LAST_SUCCESS_SQL = """
SELECT extract(epoch FROM max(finished_at))::float8 FROM paygate.worker_runs
WHERE worker = %s AND outcome = 'ok'
"""
# Heartbeats are kept a week; pruned by each process at start, bounded so it never stalls a start.
PRUNE_RUNS_SQL = """
DELETE FROM paygate.worker_runs WHERE id IN (
    SELECT id FROM paygate.worker_runs
    WHERE worker = %s AND started_at < now() - interval '7 days'
    ORDER BY started_at LIMIT 5000
)
"""

_SEVERITY = {"ok": ExitCode.OK, "stalled": ExitCode.FAILED, "failed": ExitCode.FAILED,
             "needs_human": ExitCode.NEEDS_HUMAN}


@dataclass
class RunOptions:
    once: bool = True
    every: float | None = None
    for_seconds: float | None = None  # None with --every: until signalled
    lock_wait: float = 10.0
    batch: int | None = None
    metrics_dir: str | None = None

    def validate(self) -> None:
        if self.once and self.every is not None:
            raise UsageError("--once and --every are mutually exclusive")
        if self.for_seconds is not None and self.every is None:
            raise UsageError("--for needs --every")
        if self.every is not None and self.every <= 0:
            raise UsageError("--every must be positive")
        if self.batch is not None and self.batch <= 0:
            raise UsageError("--batch must be positive")


@dataclass
class RunSummary:
    worker: str
    slot: int
    ticks: int = 0
    processed: int = 0
    failed: int = 0
    needs_human: int = 0
    drained_ticks: int = 0
    exit_code: int = ExitCode.OK
    stopped_by: str | None = None
    last_details: dict[str, Any] = field(default_factory=dict)
    # The host and port the run reached (of a multi-host DSN: the one that answered as the writer).
    database: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


class _Stop:
    """First SIGTERM/SIGINT: finish the tick, then stop. Second: abort now (exit 128+N)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self.in_tick = False

    def handle(self, signum: int, _frame: object) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)
        self.signum = signum
        self.event.set()

    def install(self) -> dict[int, Any]:
        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, self.handle)
        return previous


def next_slot(started: float, now: float, every: float) -> float:
    """Fixed rate: the first slot strictly after `now`. Slots a long tick overran are skipped, so a
    slow tick is never followed by a burst of catch-up ticks."""
    return started + (int((now - started) // every) + 1) * every


def _heartbeat_write(conn: psycopg.Connection, sql: str, params: tuple) -> tuple | None:
    """Heartbeats are observability, not money: they commit without waiting for the WAL flush
    (synchronous_commit off for this transaction only), in one pipelined round trip. A crash can
    lose the last few heartbeats; it cannot lose or reorder any money-moving write."""
    with conn.pipeline(), conn.transaction():
        conn.execute("SET LOCAL synchronous_commit = off")
        cursor = conn.execute(sql, params)
    return cursor.fetchone() if cursor.description else None


def _heartbeat_start(conn: psycopg.Connection, spec: WorkerSpec, instance: str, slot: int) -> tuple[int, bool]:
    row = _heartbeat_write(conn, HEARTBEAT_START_SQL, (spec.name, instance, slot, os.getpid(), instance,
                                                       f"{spec.name}:{instance}"))
    assert row is not None
    if row[2] is not None:
        _restore_halt_seen(spec, row[2])
    return int(row[0]), bool(row[1])


_RESTORE_LOGGED: set[str] = set()  # reasons already logged by this process: once each, not every tick


def _restore_halt_seen(spec: WorkerSpec, reason: str) -> None:
    """The database changed identity (a restore, a promotion): the restore halt is durable in the
    database, so the tick goes on (live lineages are still driven); the process says it once."""
    if reason in _RESTORE_LOGGED:
        return
    _RESTORE_LOGGED.add(reason)
    log.error("restore halt: %s", reason, extra={"msgid": "restore.halt_set", "worker": spec.name})


def honours_drain(spec: WorkerSpec) -> bool:
    """A worker module declares `HONOURS_DRAIN = True` once its tick obeys `ctx.draining`; any
    other worker's tick is skipped on a drained instance (it could otherwise take new claims)."""
    import sys

    tick = spec.load()
    return bool(getattr(sys.modules[tick.__module__], "HONOURS_DRAIN", False))


def _run_one_tick(ctx: TickContext, spec: WorkerSpec) -> TickResult:
    return spec.load()(ctx)


def check_metrics_dir(directory: str) -> None:
    """An unwritable --metrics-dir is a configuration error (78) found before any work, not a crash
    (70) after a tick already moved money and could not report it. Probed by creating a file, the
    way the writer will (access() says yes to root on a read-only mount)."""
    import tempfile

    path = os.path.abspath(directory)
    try:
        os.makedirs(path, exist_ok=True)  # as the writer would: a missing collector dir is created
        with tempfile.NamedTemporaryFile(dir=path, prefix=".paygate-probe-"):
            pass
    except OSError as exc:
        raise ConfigError(f"--metrics-dir {path} is not writable: {exc.strerror or exc}",
                          msgid="config.metrics_dir") from None


def preflight(settings: Settings, spec: WorkerSpec) -> None:
    """Everything the worker needs, checked once per process before its first tick, even when there
    is nothing to do (78 otherwise): its settings, its read quorum, every secret parsed, and the
    network each RPC endpoint serves."""
    spec.check_requirements(settings)
    check_read_quorum(settings, spec.name)  # a money mover with a one-node "quorum" never starts (78)
    check_secrets(spec, settings)
    if "rpc" in spec.requires:
        check_network(settings)


# The preflight's own bound per endpoint: an endpoint that is down must not hold every start of
# every chain worker for the full RPC timeout; not answering here is not a verdict anyway.
NETWORK_CHECK_TIMEOUT = 2.0


def check_network(settings: Settings) -> None:
    """Each endpoint's getNetwork against PAYGATE_NETWORK_PASSPHRASE (plain HTTP, no stellar_sdk, the
    endpoints asked at once): a node of another network would take every read and every send. An
    endpoint that does not answer is left to the chain client's own retries and quorum (69 there),
    not called a configuration error."""
    from paygate_cli.chain.health import get_network_passphrase
    from paygate_cli.endpoints import endpoint_name, redact_urls
    from paygate_cli.settings import distinct_read_urls

    urls = [settings.rpc_url, *distinct_read_urls(list(settings.rpc_read_urls), settings.rpc_url)]
    timeout = min(settings.rpc_timeout, NETWORK_CHECK_TIMEOUT)

    def ask(url: str) -> str | None:
        try:
            return get_network_passphrase(url, timeout)
        except Exception as exc:  # unreachable or not an RPC answer: not a verdict on the network
            log.debug("could not ask %s for its network: %s", endpoint_name(url),
                      redact_urls(scrub(f"{type(exc).__name__}: {exc}"))[:200],
                      extra={"msgid": "tick.network_unchecked"})
            return None

    if len(urls) == 1:
        served = [ask(urls[0])]
    else:
        from paygate_cli.chain.threads import ask_at_once

        answers = ask_at_once({index: lambda url=url: ask(url) for index, url in enumerate(urls)})
        served = [answers[index] for index in range(len(urls))]
    for url, network in zip(urls, served, strict=True):
        if network is not None and network != settings.network_passphrase:
            raise ConfigError(f"RPC endpoint {endpoint_name(url)} serves the network {network!r}, not the configured "
                              f"{settings.network_passphrase!r} (PAYGATE_NETWORK_PASSPHRASE)",
                              msgid="config.wrong_network")


CANNOT_START_SQL = """
INSERT INTO paygate.worker_runs (worker, instance_id, slot, pid, started_at, finished_at, outcome, error)
VALUES (%s, %s, -1, %s, clock_timestamp(), clock_timestamp(), 'error', %s)
"""


def _record_cannot_start(settings: Settings, spec: WorkerSpec, instance: str, reason: str) -> None:
    """A heartbeat saying why this worker cannot start (slot -1: it holds none), so `status` shows a
    worker that exits 78 on every start instead of one that merely never ran. Best effort: the
    database may be what is missing, and the 78 is the answer either way."""
    try:
        conn = connect(settings, f"tick:{spec.name}:preflight", attempts=1)
    except Exception:
        return
    try:
        _heartbeat_write(conn, CANNOT_START_SQL, (spec.name, instance, os.getpid(),
                                                  scrub(f"cannot start: {reason}")[:2000]))
    except Exception as exc:  # e.g. a schema that is not migrated yet
        log.debug("could not record the failed start: %s", exc, extra={"msgid": "tick.cannot_start_unrecorded"})
    finally:
        conn.close()


def run_worker(env: Env, spec: WorkerSpec, opts: RunOptions) -> RunSummary:
    # Until settings load, the instance comes from the environment: a bad config must still report.
    report = _MetricsReport(worker=spec.name, directory=opts.metrics_dir, instance=_fallback_instance(env))
    try:
        return _run_worker(env, spec, opts, report)
    except PaygateError as exc:
        if exc.exit_code != ExitCode.SKIPPED:  # a skip is normal: the lock holder reports for the worker
            report.failed(int(exc.exit_code))
        raise
    except Exception:
        report.failed(int(ExitCode.SOFTWARE))
        raise


def _run_worker(env: Env, spec: WorkerSpec, opts: RunOptions, report: _MetricsReport) -> RunSummary:
    import psycopg

    opts.validate()
    # `--for` counts from here, the lock wait included: cron's next run, started while this one
    # still ticks, waits for the lock and takes over when this one's time is up, never later.
    deadline = None if opts.for_seconds is None else env.monotonic() + opts.for_seconds
    settings = env.settings
    opts.metrics_dir = opts.metrics_dir or settings.metrics_dir
    report.directory = opts.metrics_dir
    instance = report.instance = settings.effective_instance_id()
    report.fee_cap = settings.max_inclusion_fee
    report.ttl_threshold = settings.ttl_threshold
    try:
        preflight(settings, spec)
    except (CannotWork, ConfigError) as exc:
        _record_cannot_start(settings, spec, instance, str(exc))
        raise
    if opts.metrics_dir:
        check_metrics_dir(opts.metrics_dir)
    # pg_stat_activity shows the lock's holder by OS pid and instance (status reads it back).
    # A standby or a read-only database is no writer: 69 before the first write, not 70 at it.
    lock_conn = connect(settings, f"lock:{spec.name} pid={os.getpid()} @{instance}", writer=True)
    try:
        require_schema(lock_conn)
        key = acquire_slot(lock_conn, spec.lock_keys(), opts.lock_wait, what=f"run-tick {spec.name}")
        slot = report.slot = describe_key(key)[1]
        summary = RunSummary(worker=spec.name, slot=slot)
        work = connect(settings, f"tick:{spec.name}:{slot}", writer=True)
        summary.database = _database_reached(settings, spec, work)
        report.conn = work
        try:
            work.execute(INSTANCE_SEEN_SQL, (instance,))
            work.execute(PRUNE_RUNS_SQL, (spec.name,))
            _loop(env, spec, opts, deadline, lock_conn, work, instance, slot, summary, report)
        finally:
            report.conn = None
            work.close()
        return summary
    except psycopg.OperationalError as exc:
        raise Unavailable(f"lost the database during run-tick {spec.name}: {str(exc).strip()}") from None
    except psycopg.Error as exc:
        if is_read_only_error(exc):  # e.g. the heartbeat's write on a primary demoted between ticks
            raise no_writer_error(exc, lock_conn) from None
        raise
    finally:
        lock_conn.close()  # closing the session releases the advisory lock


def _database_reached(settings: Settings, spec: WorkerSpec, work: psycopg.Connection) -> dict[str, Any]:
    """Which host and port the run's work connection reached, said once at its start: at info level
    when the DSN lists several hosts (which one answered is then the news), at debug otherwise."""
    target = connection_target(work)
    listed = dsn_target(settings.dsn()).get("host") or ""
    log.log(20 if "," in listed else 10, "run-tick %s: %s (the writer)", spec.name, describe_target(target),
            extra={"msgid": "tick.database", "worker": spec.name, "db_host": target["host"],
                   "db_port": target["port"]})
    return {"host": target["host"], "port": target["port"], "database": target["database"], "writer": True,
            "in_recovery": False}


def _loop(env: Env, spec: WorkerSpec, opts: RunOptions, deadline: float | None, lock_conn: psycopg.Connection,
          work: psycopg.Connection, instance: str, slot: int, summary: RunSummary,
          report: _MetricsReport) -> None:
    stop = _Stop()
    previous = stop.install() if threading.current_thread() is threading.main_thread() else {}
    worst = ExitCode.OK
    started = env.monotonic()
    waiter = NextLedgerWaiter(lambda: _chain_client(env.settings), env.monotonic)
    try:
        while True:
            lock_conn.execute("SELECT 1")  # lost lock session = lost exclusivity: stop (69)
            outcome, wake_after = _tick_once(env, spec, opts, work, instance, slot, summary, report)
            worst = max(worst, _SEVERITY[outcome])
            if opts.once or stop.event.is_set():
                break
            assert opts.every is not None
            now = env.monotonic()
            next_at = next_slot(started, now, opts.every)
            if deadline is not None and next_at >= deadline:
                break
            # Work in flight: tick again as soon as the ledger it awaits closes, at the latest at the slot.
            if wake_after is None or not waiter.wait_past(wake_after, next_at, stop.event):
                stop.event.wait(max(0.0, next_at - env.monotonic()))
            if stop.event.is_set():
                break
    finally:
        waiter.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stop.signum is not None:
        summary.stopped_by = signal.Signals(stop.signum).name
    summary.exit_code = int(worst)


def _chain_client(settings: Settings) -> ChainClient:
    from paygate_cli.chain.rpc import ChainClient  # stellar-sdk: only for a loop that waits for a ledger

    return ChainClient(settings)


def _tick_once(env: Env, spec: WorkerSpec, opts: RunOptions, work: psycopg.Connection, instance: str,
               slot: int, summary: RunSummary, report: _MetricsReport) -> tuple[str, int | None]:
    """One tick: its outcome, and the ledger whose successor its work awaits (TickContext.wake_after)."""
    import psycopg

    tick_started = time.monotonic()
    run_id, drained = _heartbeat_start(work, spec, instance, slot)
    summary.ticks += 1
    result = TickResult()
    error: str | None = None
    ctx: TickContext | None = None
    try:
        if drained:
            summary.drained_ticks += 1
        if drained and not honours_drain(spec):
            result.details = {"skipped": "instance drained"}
        else:
            # A drained instance still ticks: it finishes what it holds and takes no new claims.
            ctx = TickContext(conn=work, settings=env.settings, worker=spec.name, instance_id=instance,
                              slot=slot, batch=opts.batch or spec.batch or 1, log=get_logger(spec.name),
                              draining=drained)
            result = _run_one_tick(ctx, spec)
        outcome = result.outcome
        if outcome == "stalled":
            error = result.stalled
            log.error("work is waiting and this tick could not move it: %s", result.stalled,
                      extra={"msgid": "tick.stalled", "worker": spec.name})
    except NeedsHuman as exc:
        outcome, error = "needs_human", str(exc)
        result.needs_human += 1
        log.error(str(exc), extra={"msgid": exc.msgid, "worker": spec.name})
    except psycopg.OperationalError as exc:
        if is_connection_lost(exc, work):
            raise  # the database is gone: the caller maps it to 69; the tick's transaction rolled back
        # A deadlock, a lock or statement timeout: the transaction rolled back; the next tick retries.
        outcome, error = "failed", f"{type(exc).__name__}: {str(exc).strip()}"
        result.failed += 1
        log.error("tick failed: %s", error, extra={"msgid": "tick.db_error", "worker": spec.name})
    except (ConfigError, Unavailable) as exc:
        # Configuration does not fix itself on the next tick (78), and a dependency still down after
        # bounded retries (69) is the scheduler's to retry: record it and end the run.
        _finish(work, run_id, "error", result, str(exc))
        raise
    except PaygateError as exc:
        outcome, error = "failed", str(exc)
        result.failed += 1
        log.error(str(exc), extra={"msgid": exc.msgid, "worker": spec.name})
    except Exception as exc:
        if is_read_only_error(exc):
            # The database turned read-only under the tick (a primary demoted or fenced): no writer
            # (69), and no heartbeat can record it; the tick's transaction rolled back.
            raise no_writer_error(exc, work) from None
        # A bug: record it on the heartbeat row, then let it end the process (exit 70).
        _finish(work, run_id, "error", result, scrub(f"{type(exc).__name__}: {exc}"))
        log.error("tick crashed: %s", scrub("".join(traceback.format_exception_only(exc)).strip()),
                  extra={"msgid": "tick.bug", "worker": spec.name})
        raise
    _finish(work, run_id, outcome, result, error)
    summary.processed += result.processed
    summary.failed += result.failed
    summary.needs_human += result.needs_human
    summary.last_details = result.details
    duration = time.monotonic() - tick_started
    level = 20 if result.processed or result.failed else 10
    log.log(level, "tick %s: %s processed=%d failed=%d in %.1f ms", spec.name, outcome, result.processed,
            result.failed, duration * 1000,
            extra={"msgid": "tick.done", "worker": spec.name, "slot": slot, "outcome": outcome})
    report.tick(duration, result, outcome)
    return outcome, ctx.wake_after_ledger if ctx is not None else None


def _finish(work: psycopg.Connection, run_id: int, outcome: str, result: TickResult, error: str | None) -> None:
    _heartbeat_write(work, HEARTBEAT_FINISH_SQL, (outcome, result.processed, result.failed,
                                                  error[:2000] if error else None, run_id))


def _fallback_instance(env: Env) -> str:
    import socket

    return env.environ.get("PAYGATE_INSTANCE_ID") or socket.gethostname()


@dataclass
class _MetricsReport:
    """The run's textfile: rewritten after every tick, and once more when the run ends with an error
    (69/70/78) so the last file says how the run ended, even when it ended before its first tick."""

    worker: str
    directory: str | None
    instance: str = ""
    slot: int | None = None  # None until the run holds a slot
    conn: psycopg.Connection | None = None  # the work connection, to read the last success
    last_success: float | None = None
    fee_cap: int | None = None  # max_inclusion_fee, for the state file's paygate_fee_cap_stroops
    ttl_threshold: float | None = None  # seconds, for the state file's paygate_ttl_threshold_ledgers

    def _last_success(self) -> float | None:
        if self.conn is not None and not self.conn.closed:
            try:
                row = self.conn.execute(LAST_SUCCESS_SQL, (self.worker,)).fetchone()
                self.last_success = row[0] if row else None
            except Exception:  # the database may be what failed; keep the last value read
                pass
        return self.last_success

    def tick(self, duration: float, result: TickResult, outcome: str) -> None:
        if not self.directory:
            return
        from paygate_cli.metrics import TickMetrics, write_textfile

        write_textfile(self.directory, TickMetrics(
            worker=self.worker, instance=self.instance, slot=self.slot, last_run=time.time(),
            last_success=self._last_success(), duration=duration, processed=result.processed,
            exit_code=int(_SEVERITY[outcome]), stalled=outcome == "stalled"))
        self._state()

    def _state(self) -> None:
        """The shared state file (queues, halts, findings), at most every STATE_INTERVAL per host."""
        from paygate_cli.metrics import StateMetrics, state_is_stale, write_state_textfile
        from paygate_cli.state import (
            fee_market_state,
            gas_state,
            list_halts,
            open_findings_count,
            queue_depths,
            ttl_state,
        )

        now = time.time()
        if self.conn is None or not self.directory or not state_is_stale(self.directory, now):
            return
        try:
            from paygate_cli.settings import ledgers

            findings = open_findings_count(self.conn)
            write_state_textfile(self.directory, StateMetrics(
                instance=self.instance, queues=queue_depths(self.conn),
                halts=[h["kind"] for h in list_halts(self.conn)], findings_open=findings, written=now,
                fee=fee_market_state(self.conn), fee_cap=self.fee_cap, ttl=ttl_state(self.conn),
                ttl_threshold=None if self.ttl_threshold is None else ledgers(self.ttl_threshold),
                gas=gas_state(self.conn)))
        except Exception as exc:  # observability must not fail the tick it describes
            log.warning("could not write the state metrics: %s", exc, extra={"msgid": "metrics.state_failed"})

    def failed(self, exit_code: int) -> None:
        """Best effort: reporting a failure must never replace the failure being reported."""
        if not self.directory:
            return
        from paygate_cli.metrics import TickMetrics, write_textfile

        if exit_code == ExitCode.UNAVAILABLE:
            self.conn = None  # the database is gone: a query could hang until its timeouts
        try:
            write_textfile(self.directory, TickMetrics(
                worker=self.worker, instance=self.instance, slot=self.slot, last_run=time.time(),
                last_success=self._last_success(), duration=None, processed=None, exit_code=exit_code))
        except Exception as exc:
            log.warning("could not write the metrics file: %s", exc, extra={"msgid": "metrics.write_failed"})
