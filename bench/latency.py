"""Latency as the customer sees it, in ledgers and seconds, at 50 % and 90 % of the chain's ceiling.
A benchmark, not a test: it prints figures, asserts nothing.

The world as deployed: a private Postgres, a devnet closing a ledger every second (`--ledger-interval
1s`) holding `--capacity` Soroban transactions a ledger (100, about mainnet's), and every worker of
the catalogue run as deployed: `--deployment systemd` (the default) runs jobs/systemd's units as
shipped (each worker's tick-W.env arguments: 10-minute loops, started again 1 s after they end);
`--deployment cron` starts every line of crontab.example as shipped, each minute, beside the run
still ticking (the bounded loops' `--for 65s` and lock wait make the handover), so every worker
starts cold once a minute; `--deployment soak` runs them under the soak's supervisor
(tests/chaos/soak.py: a process every 20-45 s, lock wait 0, no chaos here). Each phase also reports
the machine's cores in use and who used them, and the p99 of units admitted within 10 s of a process
start against the rest. A load generator thread admits deposits,
one-off charges, subscriptions (their periods become charges when the subscriptions worker runs) and
relays at a steady rate.

The ceiling (docs/architecture.md §4: one transaction in flight per lane, a ledger holds at most
`--capacity`): T = min(lanes, capacity) transactions a ledger. The load's lane-ledgers are split
between the paths (`--deposit-lanes`, `--charge-lanes`, `--relay-lanes`): at a fraction f, deposits
arrive at f x deposit_lanes / 2 a ledger (two transactions each), relays at f x relay_lanes, charges
at f x charge_lanes x the batch the footprint allows (50 read-write keys: entries + distinct accounts,
so 42 for 8 accounts), a tenth of them subscription periods (the charges' figures count both; the
one-off charges and the periods are also shown apart, as settlement claims one-off charges first).
What was really admitted is printed beside the target, as a fraction of the ceiling.

Latency: from the row's created_at to its terminal time (deposits.settled_at, charges.settled_at,
relays.finished_at), in seconds and in ledgers (the ledger closes between the two: a thread records the
wall time each ledger is first seen). The floor, in ledgers, is what the chain itself needs: a charge's
batch lands in a ledger and the observer reads it after (1); a deposit's transfer, then its credit (2);
a relay (1). A short idle phase first measures what a lone unit takes with the same workers (the
cadences included). Where the time went, from the journal: admission -> lineage created (claim and
lane wait), created -> sent (sign and broadcast), sent -> the close of its landed ledger (inclusion),
landed -> terminal (the observer or the worker's resolve); a deposit adds its two lineages' parts.

Targets (reported, not asserted): at 90 % of the ceiling, p50 <= floor + 1 ledger, p99 <= floor + 2.
The last lines, one per path and load, are for scripts:
`latency charges at 90%: p50 1.4 ledgers, p99 2.8 ledgers, floor 1.0 ledgers`.

    .venv/bin/python bench/latency.py [--minutes 3] [--lanes 8] [--capacity 100] [--users 8]
                                      [--deposit-lanes 3] [--charge-lanes 2] [--relay-lanes 3]
                                      [--deployment systemd|cron|soak] [--cadence WORKER=DURATION ...]
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import math
import os
import random
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from bench.meter import machine_busy, postgres_cpu, process_cpu
from paygate_cli.catalogue import WORKERS
from paygate_cli.chain.charges import CONTRACT_MAX_BATCH, MAX_WRITE_ENTRIES
from paygate_cli.db.migrate import migrate
from paygate_cli.sandbox.pg_cluster import Cluster
from tests.chaos.soak import Supervisor, open_work
from tests.support.chain_env import admit_deposit, sign_deposit
from tests.support.charges_support import admit_charge, charge_chain
from tests.support.cli import paygate_cmd
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.relay_support import MAX_FEE, admit_relay, allow_market

PATHS = ("deposits", "charges", "relays")
FLOOR = {"deposits": 2, "charges": 1, "relays": 1}  # ledgers the chain itself needs (see the docstring)
LOADS = (0.5, 0.9)
SUBSCRIPTION_SHARE = 0.1  # of the charge rate: subscription periods
FUNDING = 2 * 10**9  # per user, for the charges (of the 1,000 USDC each devnet user holds)
DEPOSIT = 1_000_000
SETTLEMENT_BATCH = WORKERS["settlement"].batch or CONTRACT_MAX_BATCH
# Two processes for the workers with slots on the money path (as the soak runs them), one for the rest.
TWO_SLOTS = {"funding", "settlement"}

OPEN_SQL = """
SELECT (SELECT count(*) FROM paygate.deposits WHERE status = 'pending') AS deposits,
       (SELECT count(*) FROM paygate.charges WHERE status = 'authorized') AS charges,
       (SELECT count(*) FROM paygate.relays WHERE status = 'queued') AS relays
"""
# One row per unit: admitted, terminal (NULL if not), status, then (created, sent, landed ledger) of each
# lineage on its path (a deposit: its transfer, then its credit). Epoch seconds, the database's clock:
# the same machine's clock as the ledger sampler.
UNITS_SQL = {
    "deposits": """
SELECT extract(epoch FROM d.created_at)::float8, extract(epoch FROM d.settled_at)::float8, d.status,
       extract(epoch FROM a.created_at)::float8, extract(epoch FROM a.sent_at)::float8, a.ledger,
       extract(epoch FROM b.created_at)::float8, extract(epoch FROM b.sent_at)::float8, b.ledger, false
FROM paygate.deposits d LEFT JOIN paygate.lineages a ON a.id = d.deposit_lineage_id
LEFT JOIN paygate.lineages b ON b.id = d.credit_lineage_id WHERE d.idempotency_key LIKE 'lat-%'""",
    "charges": """
SELECT extract(epoch FROM c.created_at)::float8, extract(epoch FROM c.settled_at)::float8, c.status,
       extract(epoch FROM l.created_at)::float8, extract(epoch FROM l.sent_at)::float8, l.ledger,
       NULL::float8, NULL::float8, NULL::int, c.subscription_id IS NOT NULL
FROM paygate.charges c LEFT JOIN paygate.lineages l ON l.id = c.lineage_id
WHERE c.idempotency_key LIKE 'lat-%' OR c.subscription_id IS NOT NULL""",
    "relays": """
SELECT extract(epoch FROM r.created_at)::float8,
       extract(epoch FROM r.finished_at)::float8, r.status,
       extract(epoch FROM l.created_at)::float8, extract(epoch FROM l.sent_at)::float8, l.ledger,
       NULL::float8, NULL::float8, NULL::int, false
FROM paygate.relays r LEFT JOIN paygate.lineages l ON l.id = r.lineage_id WHERE r.idempotency_key LIKE 'lat-%'""",
}
DONE = {"settled", "applied"}
# Every lineage's life on its lane (created -> resolved): how long a lane stays taken per transaction.
LANE_SQL = """
SELECT purpose, extract(epoch FROM created_at)::float8, extract(epoch FROM coalesce(resolved_at, now()))::float8,
       ledger - signed_at_ledger
FROM paygate.lineages"""


# ----- the ledger clock: which ledger was open at a wall time --------------------------------------


@dataclass
class LedgerClock:
    """Polls the devnet's latest ledger and records the wall time each one was first seen (its close,
    within the poll interval). The devnet is not faulted here, so getLatestLedger tells the truth."""

    devnet: DevnetHandle
    poll: float = 0.05
    seen: dict[int, float] = field(default_factory=dict)
    stop_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="latency-ledgers", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(10)

    def _run(self) -> None:
        while not self.stop_event.wait(self.poll):
            try:
                latest = self.devnet.latest_ledger()
            except OSError:
                continue
            self.seen.setdefault(latest, time.time())

    def closes(self) -> list[float]:
        return sorted(self.seen.values())

    def closes_between(self, closes: list[float], start: float, end: float) -> int:
        """Ledgers closed in (start, end]: the ledgers a unit waited through."""
        return bisect.bisect_right(closes, end) - bisect.bisect_right(closes, start)

    def close_of(self, ledger: int | None) -> float | None:
        """The wall time `ledger` closed; a ledger the poll missed (two closes within one poll) is
        given the close of the next one seen."""
        if ledger is None:
            return None
        later = [t for n, t in self.seen.items() if n >= ledger]
        return min(later) if later else None


# ----- the deployment: jobs/systemd or crontab.example as shipped, or the soak's restarts -----------------

CRONTAB = Path(__file__).resolve().parents[1] / "crontab.example"
SYSTEMD = Path(__file__).resolve().parents[1] / "jobs" / "systemd"
# 1: work waited at the end (a stall is reported by the figures); 75: skipped; 143: stopped by SIGTERM
OK_EXITS = {0, 1, 75, 143}


def cron_lines() -> list[tuple[str, list[str]]]:
    """(minute field, run-tick arguments) of every line of crontab.example: the shipped file is what
    runs, its `--for`, its `--lock-wait`, its one start a minute."""
    lines = []
    for line in CRONTAB.read_text().splitlines():
        if not re.match(r"^[\d*/,-]+\s", line):
            continue
        fields = line.split(None, 5)
        words = shlex.split(fields[5].split("2>>")[0])
        lines.append((fields[0], words[words.index("paygate") + 1:]))
    return lines


def minute_matches(field_: str, minute: int) -> bool:
    if field_ == "*":
        return True
    if field_.startswith("*/"):
        return minute % int(field_[2:]) == 0
    return minute % 60 == int(field_)


@dataclass
class Deployment:
    """Runs the workers as a scheduler would and records every exit; one outside OK_EXITS is a crash,
    reported with its log's tail. A subclass says when to start what (`start_due`)."""

    environ: dict[str, str]
    logs: Path
    cadences: dict[str, str]  # --every overrides of the bench's --cadence
    started: float = field(default_factory=time.monotonic)
    procs: list[tuple[str, subprocess.Popen, Path]] = field(default_factory=list)
    exits: Counter = field(default_factory=Counter)
    crashes: list[tuple[str, int, str]] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)  # wall time of each process start
    stopped: bool = False

    def __post_init__(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)

    def poll(self) -> None:
        for worker, proc, log in list(self.procs):
            code = proc.poll()
            if code is not None:
                self.procs.remove((worker, proc, log))
                self._exited(worker, code, log, OK_EXITS)
        if not self.stopped:
            self.start_due(time.monotonic())

    def start_due(self, now: float) -> None:
        raise NotImplementedError

    def spawn(self, args: list[str]) -> None:
        if "--every" in args:
            args = list(args)
            args[args.index("--every") + 1] = self.cadences.get(args[1], args[args.index("--every") + 1])
        log = self.logs / f"{args[1]}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(paygate_cmd(*args), env=self.environ, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=out)
        self.procs.append((args[1], proc, log))
        self.starts.append(time.time())

    def _exited(self, worker: str, code: int, log: Path, ok: set[int]) -> None:
        self.exits[(worker, code)] += 1
        if code not in ok:
            self.crashes.append((worker, code, log.read_text(errors="replace")[-4000:]))

    def live(self) -> list[tuple[str, int]]:
        return [(worker, proc.pid) for worker, proc, _ in self.procs]

    def stop(self, timeout: float = 90) -> None:
        self.stopped = True  # nothing starts any more
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for worker, proc, log in self.procs:
            try:
                code = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            self._exited(worker, code, log, OK_EXITS | {-signal.SIGTERM})
        self.procs.clear()

    def kill_all(self) -> None:
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@dataclass
class CronDeployment(Deployment):
    """Every crontab.example line, as shipped, started at each minute of the bench (minute 0 at its
    start), beside the run still ticking: its `--for 65s` and `--lock-wait` make the handover."""

    lines: list[tuple[str, list[str]]] = field(default_factory=lambda: cron_lines())
    minute: int = -1

    def start_due(self, now: float) -> None:
        minute = int((now - self.started) // 60)
        while self.minute < minute:
            self.minute += 1
            for when, args in self.lines:
                if minute_matches(when, self.minute):
                    self.spawn(args)


@dataclass
class SystemdDeployment(Deployment):
    """Every paygate-tick@W unit of jobs/systemd as shipped: ExecStart with tick-W.env's arguments
    (a bounded loop of 10 minutes, or one tick), started again by its timer OnUnitInactiveSec after it
    exits (1 s for the loops)."""

    units: list[tuple[str, list[str], float]] = field(default_factory=lambda: systemd_units())
    next_start: dict[str, float] = field(default_factory=dict)  # worker -> when its timer fires
    ever: set[str] = field(default_factory=set)

    def start_due(self, now: float) -> None:
        running = {worker for worker, _, _ in self.procs}
        for worker, args, gap in self.units:
            if worker in running:
                continue
            # the timer's OnActiveSec=0 at first, OnUnitInactiveSec after each exit
            due = self.next_start.setdefault(worker, now + gap if worker in self.ever else now)
            if now >= due:
                del self.next_start[worker]
                self.ever.add(worker)
                self.spawn(args)


def systemd_units() -> list[tuple[str, list[str], float]]:
    """(worker, run-tick arguments, timer gap) of each unit, read the way systemd would."""
    from tests.test_scheduler_files import ALL_WORKERS, env_file_args, systemd_command, systemd_environment, timer_gap

    template = systemd_environment(SYSTEMD / "paygate-tick@.service")
    return [(w, systemd_command(w, {**template, "PAYGATE_TICK_ARGS": env_file_args(w)}), timer_gap(w))
            for w in ALL_WORKERS if (SYSTEMD / f"tick-{w}.env").exists()]


@dataclass
class CpuBook:
    """Who used the machine's cores: each worker's processes (read at every poll; a process's last
    fraction of a poll before it exits is not counted), Postgres, the devnet, this process (the load
    generator and the ledger clock) and the whole machine, as cores in use over a phase."""

    postmaster: int
    devnet: int
    seen: dict[int, tuple[str, float]] = field(default_factory=dict)  # pid -> (worker, CPU seconds last read)

    def sample(self, live: list[tuple[str, int]]) -> None:
        for worker, pid in live:
            cpu = process_cpu(pid)
            if not math.isnan(cpu):
                self.seen[pid] = (worker, cpu)

    def totals(self) -> dict[str, float]:
        total: Counter = Counter()
        for worker, cpu in self.seen.values():
            total[worker] += cpu
        usage = resource.getrusage(resource.RUSAGE_SELF)
        busy, _ = machine_busy()
        return {**total, "postgres": postgres_cpu(self.postmaster), "devnet": process_cpu(self.devnet),
                "bench": usage.ru_utime + usage.ru_stime, "machine": busy, "wall": time.monotonic()}

    @staticmethod
    def cores(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        seconds = after["wall"] - before["wall"]
        return {k: (v - before.get(k, 0.0)) / seconds for k, v in after.items() if k != "wall" and seconds > 0}


def soak_live(supervisor: Supervisor) -> list[tuple[str, int]]:
    return [(slot.worker, slot.proc.pid) for slot in supervisor.slots if slot.proc is not None]


# ----- the load generator -----------------------------------------------------------------------------


@dataclass
class Load:
    """Admits each path at its rate (units a second), evenly spaced, from one thread (the API)."""

    dsn: str
    devnet: DevnetHandle
    users: list[dict[str, str]]
    rates: dict[str, float] = field(default_factory=dict)  # deposits, charges (one-off), relays
    admitted: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)
    behind: float = 0.0  # the most admissions the thread was ever behind its schedule
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    stop_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    error: BaseException | None = None
    _n: int = 0

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="latency-load", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(30)

    def _run(self) -> None:
        owed = dict.fromkeys(PATHS, 0.0)
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                last = time.monotonic()
                while not self.stop_event.wait(0.02):
                    now = time.monotonic()
                    for path in PATHS:
                        owed[path] += self.rates.get(path, 0.0) * (now - last)
                    last = now
                    self.behind = max(self.behind, sum(owed.values()))
                    for path in PATHS:
                        while owed[path] >= 1 and not self.stop_event.is_set():
                            owed[path] -= 1
                            self.admit(conn, path)
        except BaseException as exc:  # reported by main: a load generator bug must not pass silently
            self.error = exc

    def admit(self, conn: psycopg.Connection, path: str) -> None:
        self._n += 1
        user = self.users[self._n % len(self.users)]
        key = f"lat-{path}-{self._n}"
        try:
            if path == "deposits":
                entry, nonce, expiration = sign_deposit(self.devnet, user["secret"], DEPOSIT, valid_ledgers=600)
                admit_deposit(conn, user["public"], DEPOSIT, entry, nonce, expiration, key)
            elif path == "charges":
                admit_charge(conn, user["public"], 1000 + self._n % 7, key)
            else:
                admit_relay(conn, self.devnet, user, key, f"lat_{self._n}", 7, valid_ledgers=600)
            self.admitted[path] += 1
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                raise
            self.refused[f"{path}:{exc.sqlstate}"] += 1

    def subscribe(self, conn: psycopg.Connection, count: int) -> None:
        """`count` more one-minute subscriptions, their anchors spread over the next minute: periods
        fall due at count a minute (the subscriptions worker turns them into charges each tick)."""
        for _ in range(count):
            self._n += 1
            user = self.users[self._n % len(self.users)]
            conn.execute("SELECT paygate.create_subscription(%s, %s, interval '1 minute', "
                         "now() + make_interval(secs => %s), %s)",
                         (user["public"], 1000 + self._n % 7, self.rng.uniform(0, 60), f"lat-sub-{self._n}"))
            self.admitted["subscriptions"] += 1


# ----- the figures ------------------------------------------------------------------------------------


@dataclass
class Unit:
    admitted: float
    terminal: float | None
    status: str
    lineages: list[tuple[float | None, float | None, int | None]]  # (created, sent, ledger) in path order
    subscription: bool


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return float(ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1])


def spread(values: list[float]) -> str:
    """p50 p90 p99 max, each in five characters."""
    return " ".join(f"{pct(values, q):5.1f}" for q in (50, 90, 99, 100))


def read_units(conn: psycopg.Connection, path: str) -> list[Unit]:
    units = []
    for row in conn.execute(UNITS_SQL[path]):
        lineages = [(row[3], row[4], row[5])] + ([(row[6], row[7], row[8])] if path == "deposits" else [])
        units.append(Unit(row[0], row[1] if row[2] in DONE else None, row[2], lineages, bool(row[9])))
    return units


def breakdown(unit: Unit, clock: LedgerClock) -> dict[str, float] | None:
    """Where a finished unit's time went (seconds): claim/lane wait, sign/broadcast, inclusion, observer."""
    parts = dict.fromkeys(("claim", "send", "inclusion", "observer"), 0.0)
    since = unit.admitted
    for created, sent, ledger in unit.lineages:
        landed = clock.close_of(ledger)
        if created is None or sent is None or landed is None or unit.terminal is None:
            return None
        parts["claim"] += max(0.0, created - since)
        parts["send"] += max(0.0, sent - created)
        parts["inclusion"] += max(0.0, landed - sent)
        since = landed
    parts["observer"] = max(0.0, unit.terminal - since)  # type: ignore[operator]
    return parts


@dataclass
class Phase:
    name: str  # "idle", "50%", "90%"
    fraction: float | None
    start: float = 0.0
    end: float = 0.0
    rates: dict[str, float] = field(default_factory=dict)
    cores: dict[str, float] = field(default_factory=dict)  # CpuBook.cores over the phase


def lane_detail(lives: list[tuple[str, float, float, int | None]], phase: Phase) -> str:
    """Per purpose, for the lineages created in `phase`: how many, the mean seconds each held its lane,
    and the share that landed in the ledger after the one it was signed at (the rest missed a ledger)."""
    parts = []
    for purpose in sorted({p for p, *_ in lives}):
        mine = [(end - start, gap) for p, start, end, gap in lives if p == purpose and phase.start <= start < phase.end]
        landed = [gap for _, gap in mine if gap is not None]
        if mine:
            next_ledger = sum(1 for gap in landed if gap <= 1) / len(landed) if landed else float("nan")
            parts.append(f"{purpose} {len(mine)} held {statistics.fmean(h for h, _ in mine):.2f} s, "
                         f"{next_ledger:.0%} in the next ledger")
    return "; ".join(parts)


TICKS_SQL = """
SELECT worker, extract(epoch FROM started_at)::float8, extract(epoch FROM finished_at - started_at)::float8
FROM paygate.worker_runs WHERE finished_at IS NOT NULL AND slot >= 0"""


def tick_detail(ticks: list[tuple[str, float, float]], phase: Phase) -> str:
    """Per money-path worker, for the ticks started in `phase`: ticks a second, mean and p90 milliseconds."""
    seconds = phase.end - phase.start
    parts = []
    for worker in ("funding", "settlement", "relay", "observer"):
        mine = [d for w, start, d in ticks if w == worker and phase.start <= start < phase.end]
        if mine and seconds > 0:
            parts.append(f"{worker} {len(mine) / seconds:.1f}/s {statistics.fmean(mine) * 1000:.0f} ms "
                         f"(p90 {pct(mine, 90) * 1000:.0f})")
    return "; ".join(parts)


AFTER_STARTS = 10.0  # seconds after a process start in which a unit counts as admitted "after starts"


def start_detail(units: dict[str, list[Unit]], phase: Phase, clock: LedgerClock, closes: list[float],
                 starts: list[float]) -> str:
    """p99 in ledgers of the units admitted within AFTER_STARTS of a process start (cron starts every
    line each minute: a burst of cold starts on the cores the running ticks need) against the rest."""
    starts = sorted(starts)

    def after_start(t: float) -> bool:
        i = bisect.bisect_right(starts, t)
        return i > 0 and t - starts[i - 1] <= AFTER_STARTS

    parts = []
    for path in PATHS:
        done = [u for u in units[path] if phase.start <= u.admitted < phase.end and u.terminal is not None]
        split: dict[bool, list[float]] = {True: [], False: []}
        for u in done:
            split[after_start(u.admitted)].append(float(clock.closes_between(closes, u.admitted, u.terminal)))  # type: ignore[arg-type]
        parts.append(f"{path} {pct(split[True], 99):.0f} ({len(split[True])}) / {pct(split[False], 99):.0f} "
                     f"({len(split[False])})")
    return f"p99 ledgers, admitted within {AFTER_STARTS:g} s of a process start / otherwise (units): " + \
        "; ".join(parts)


def cpu_detail(cores: dict[str, float]) -> str:
    """The machine's cores in use over a phase, and who used them, largest first."""
    machine = cores.get("machine", float("nan"))
    parts = [f"{name} {cores[name]:.2f}" for name in sorted(cores, key=lambda k: -cores[k]) if name != "machine"
             and cores[name] >= 0.005]
    return f"{machine:.2f} of {os.cpu_count()} ({', '.join(parts)})"


def lane_figures(lives: list[tuple[str, float, float, int | None]], phase: Phase, lanes: int
                 ) -> tuple[float, float, float]:
    """(mean seconds a lineage held its lane, p90 of it, the fraction of lane-time taken) for the
    lineages created in `phase`: the lanes' real turnaround, against the one ledger the ceiling assumes."""
    held = [end - start for _, start, end, _ in lives if phase.start <= start < phase.end]
    taken = sum(max(0.0, min(end, phase.end) - max(start, phase.start)) for _, start, end, _ in lives)
    busy = taken / (lanes * (phase.end - phase.start)) if phase.end > phase.start else float("nan")
    return (statistics.fmean(held) if held else float("nan")), pct(held, 90), busy


def ceiling(args: argparse.Namespace) -> dict[str, float]:
    """Per ledger: transactions, and what each path's lane share can carry."""
    txs = min(args.lanes, args.capacity)
    scale = txs / args.lanes  # fewer when the ledger's capacity, not the lanes, is the limit
    batch = min(SETTLEMENT_BATCH, MAX_WRITE_ENTRIES - min(args.users, MAX_WRITE_ENTRIES // 2))
    return {"txs": txs, "batch": batch, "deposits": args.deposit_lanes * scale / 2,
            "charges": args.charge_lanes * scale * batch, "relays": args.relay_lanes * scale}


def report(args: argparse.Namespace, phases: list[Phase], units: dict[str, list[Unit]], clock: LedgerClock,
           ceil: dict[str, float], load: Load, batches: list[int], per_ledger: list[int],
           lives: list[tuple[str, float, float, int | None]], ticks: list[tuple[str, float, float]],
           starts: list[float]) -> None:
    closes = clock.closes()
    gaps = [b - a for a, b in itertools.pairwise(closes)]
    plan = {name: every for name, _, every in worker_plan(args.cadence)}
    cadences = ", ".join(f"{w} {plan[w]}" for w in ("funding", "settlement", "observer", "relay", "subscriptions"))
    print(f"latency: {args.lanes} lanes, {args.users} users, devnet closing a ledger every "
          f"{args.ledger_interval}, {args.capacity} Soroban transactions a ledger; workers at "
          f"{'the documented cadences' if not args.cadence else 'these cadences'} ({cadences}); "
          f"lane_shares {args.lane_shares}; deployment {args.deployment}")
    print(f"  ceiling per ledger: {ceil['txs']:.0f} transactions (min(lanes, capacity)); batch by footprint "
          f"{ceil['batch']:.0f} charges ({MAX_WRITE_ENTRIES} read-write keys - {args.users} accounts; largest "
          f"batch seen {max(batches, default=0)}); shares: deposits {args.deposit_lanes} lanes -> "
          f"{ceil['deposits']:.2f}/ledger, charges {args.charge_lanes} lanes -> {ceil['charges']:.1f}/ledger, "
          f"relays {args.relay_lanes} lanes -> {ceil['relays']:.2f}/ledger")
    if gaps:
        print(f"  devnet: ledger interval median {statistics.median(gaps):.2f} s, p99 {pct(gaps, 99):.2f} s, "
              f"max {max(gaps):.2f} s over {len(gaps)} closes; paygate transactions in one ledger: max "
              f"{max(per_ledger, default=0)} of {args.capacity}")
    print(f"  {'phase':5s} {'path':9s} {'target/s':>8s} {'admitted/s':>10s} {'of ceil':>7s} {'done':>5s} "
          f"{'open':>4s} {'other':>5s} | {'ledgers p50/p90/p99/max':>23s} | {'seconds p50/p90/p99/max':>23s} | "
          f"{'claim':>5s} {'send':>5s} {'incl':>5s} {'obs':>5s} (mean s)")
    lines = []
    for phase in phases:
        seconds = phase.end - phase.start
        for path in PATHS:
            mine = [u for u in units[path] if phase.start <= u.admitted < phase.end]
            done = [u for u in mine if u.terminal is not None]
            open_ = sum(1 for u in mine if u.status in ("pending", "authorized", "queued"))
            ledgers = [float(clock.closes_between(closes, u.admitted, u.terminal)) for u in done]  # type: ignore[arg-type]
            secs = [u.terminal - u.admitted for u in done]  # type: ignore[operator]
            parts = [p for p in (breakdown(u, clock) for u in done) if p is not None]
            mean = {k: statistics.fmean(p[k] for p in parts) if parts else float("nan")
                    for k in ("claim", "send", "inclusion", "observer")}
            rate = len(mine) / seconds if seconds else 0.0
            per_ledger_ceiling = ceil[path] / args.ledger_seconds
            print(f"  {phase.name:5s} {path:9s} {phase.rates.get(path, 0.0):8.2f} {rate:10.2f} "
                  f"{rate / per_ledger_ceiling:7.0%} {len(done):5d} {open_:4d} {len(mine) - len(done) - open_:5d} | "
                  f"{spread(ledgers)} | {spread(secs)} | "
                  f"{mean['claim']:5.2f} {mean['send']:5.2f} {mean['inclusion']:5.2f} {mean['observer']:5.2f}")
            if path == "charges":  # one-off charges are claimed ahead of periods (docs/architecture.md §5)
                for label, kind in (("(of them one-off)", False), ("(of them subscription periods)", True)):
                    some = [u for u in done if u.subscription is kind]
                    if some:
                        some_ledgers = [float(clock.closes_between(closes, u.admitted, u.terminal)) for u in some]  # type: ignore[arg-type]
                        print(f"  {'':5s} {label:31s} {len(some):>5d}      | {spread(some_ledgers)} |")
            if phase.fraction is not None:
                lines.append((path, phase, pct(ledgers, 50), pct(ledgers, 99)))
        if phase.fraction is not None and starts:
            print(f"  {'':5s} {start_detail(units, phase, clock, closes, starts)}")
        held, held90, busy = lane_figures(lives, phase, args.lanes)
        print(f"  {'':5s} lanes: a lineage held its lane {held:.2f} s on average (p90 {held90:.2f} s), lanes "
              f"taken {busy:.0%} of the time -> at most {args.lanes / held:.1f} transactions a second; "
              f"devnet CPU {phase.cores.get('devnet', float('nan')):.0%} of a core")
        print(f"  {'':5s}   cores in use: {cpu_detail(phase.cores)}")
        print(f"  {'':5s}   by purpose: {lane_detail(lives, phase)}")
        print(f"  {'':5s}   ticks: {tick_detail(ticks, phase)}")
    if load.refused:
        print(f"  refused admissions: {dict(load.refused)}")
    print(f"  the load generator was at most {load.behind:.0f} admissions behind its schedule")
    print("  against the targets at 90% (not asserted): p50 <= floor + 1, p99 <= floor + 2")
    for path, phase, p50, p99 in lines:
        if phase.fraction == LOADS[-1]:
            ok = p50 <= FLOOR[path] + 1 and p99 <= FLOOR[path] + 2
            print(f"    {path:9s} p50 {p50:.1f}, p99 {p99:.1f}, floor {FLOOR[path]} -> {'within' if ok else 'OVER'}")
    for path, phase, p50, p99 in lines:
        print(f"latency {path} at {phase.name}: p50 {p50:.1f} ledgers, p99 {p99:.1f} ledgers, "
              f"floor {FLOOR[path]:.1f} ledgers")


# ----- the run ----------------------------------------------------------------------------------------


def wait_quiet(dsn: str, seconds: float) -> dict[str, int]:
    deadline = time.monotonic() + seconds
    while True:
        left = open_work(dsn, OPEN_SQL)
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(1)


def worker_plan(overrides: list[str]) -> list[tuple[str, int, str]]:
    """Every catalogue worker at its documented cadence, but those `--cadence W=DURATION` names."""
    cadences = {name: f"{spec.cadence:g}s" for name, spec in WORKERS.items()}
    for item in overrides:
        name, _, every = item.partition("=")
        if name not in cadences or not every:
            raise SystemExit(f"--cadence {item!r}: expected WORKER=DURATION of a catalogue worker")
        cadences[name] = every
    return [(name, 2 if name in TWO_SLOTS else 1, every) for name, every in cadences.items()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=3.0, help="of each loaded phase (50%%, then 90%%)")
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="the idle phase: a lone unit at a time")
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--capacity", type=int, default=100, help="Soroban transactions a ledger holds")
    parser.add_argument("--deposit-lanes", type=float, default=3)
    parser.add_argument("--charge-lanes", type=float, default=2)
    parser.add_argument("--relay-lanes", type=float, default=3)
    parser.add_argument("--lane-shares", default="ceiling",
                        help="the workers' lane_shares: 'ceiling' (the split the ceiling assumes: funding, "
                             "settlement and relay get the deposit, charge and relay lanes), 'none', or "
                             "WORKER=COUNT,...")
    parser.add_argument("--deployment", choices=("systemd", "cron", "soak"), default="systemd",
                        help="systemd: jobs/systemd's units as shipped (10-minute loops, restarted 1 s after; "
                             "the default); cron: crontab.example as shipped, every line started each minute; "
                             "soak: the soak supervisor's restarts (a process every 20-45 s, lock wait 0)")
    parser.add_argument("--cadence", action="append", default=[], metavar="WORKER=DURATION",
                        help="run WORKER at another cadence than the documented one (repeatable)")
    args = parser.parse_args()
    args.ledger_interval, args.ledger_seconds = "1s", 1.0
    pg_dir = tempfile.mkdtemp(prefix="pgl-", dir="/tmp")  # short: the socket path limit
    tmp = Path(tempfile.mkdtemp(prefix="latency-"))
    if os.geteuid() == 0:
        os.chmod(pg_dir, 0o755)  # the postgres user must traverse it
    cluster = Cluster.at(Path(pg_dir) / "d")
    cluster.init(fast=True)
    cluster.start(fast=True)
    devnet = supervisor = clock = load = None
    try:
        dsn = cluster.dsn()
        with psycopg.connect(dsn, autocommit=True) as db:
            migrate(db)
        devnet = start_devnet(tmp / "devnet", seed="latency", lanes=args.lanes, users=args.users,
                              ledger_interval=args.ledger_interval,
                              extra_args=["--ledger-max-soroban-txs", str(args.capacity)])
        chain = charge_chain(devnet, dsn, tmp / "keys")
        chain.environ.update(PAYGATE_LOG_LEVEL="warning", PAYGATE_INSTANCE_ID="latency")
        if args.lane_shares == "ceiling":
            args.lane_shares = (f"funding={int(args.deposit_lanes)},settlement={int(args.charge_lanes)},"
                                f"relay={int(args.relay_lanes)}")
        if args.lane_shares != "none":
            chain.environ["PAYGATE_LANE_SHARES"] = args.lane_shares
        users = devnet.genesis["users"]
        ceil = ceiling(args)
        with psycopg.connect(dsn, autocommit=True) as db:
            allow_market(db, devnet.genesis["contracts"]["market"])
            db.execute("UPDATE paygate.relay_config SET fee_budget = %s", (10**6 * MAX_FEE,))
            # Money for the charges, and each user's first buy (it creates the market's per-user
            # entries: two first buys by one user in one ledger would read more than they declared).
            for n, user in enumerate(users):
                entry, nonce, expiration = sign_deposit(devnet, user["secret"], FUNDING, valid_ledgers=600)
                admit_deposit(db, user["public"], FUNDING, entry, nonce, expiration, f"warm-dep-{n}")
                admit_relay(db, devnet, user, f"warm-rel-{n}", f"warm_{n}", 7, valid_ledgers=600)
        supervisor: Supervisor | Deployment
        worker_plan(args.cadence)  # refuses an unknown worker or an empty duration
        if args.deployment != "soak":
            kind = CronDeployment if args.deployment == "cron" else SystemdDeployment
            supervisor = kind(chain.environ, tmp / "logs", dict(item.partition("=")[::2] for item in args.cadence))
        else:
            supervisor = Supervisor(chain.environ, tmp / "logs", random.Random(11), plan=worker_plan(args.cadence))
        postmaster = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
        book = CpuBook(postmaster, devnet.proc.pid)

        def live() -> list[tuple[str, int]]:
            return supervisor.live() if isinstance(supervisor, Deployment) else soak_live(supervisor)
        clock = LedgerClock(devnet)
        clock.start()
        warm_until = time.monotonic() + 120
        while any(open_work(dsn, OPEN_SQL).values()) and time.monotonic() < warm_until:
            supervisor.poll()
            time.sleep(0.5)
        load = Load(dsn, devnet, users)
        load.start()
        phases = [Phase("idle", None)] + [Phase(f"{f:.0%}", f) for f in LOADS]
        with psycopg.connect(dsn, autocommit=True) as db:
            subscriptions = 0
            for phase in phases:
                if phase.fraction is None:
                    phase.rates = dict.fromkeys(PATHS, 1 / 3)  # one of each path every 3 s
                    seconds = args.idle_seconds
                else:
                    phase.rates = {path: phase.fraction * ceil[path] / args.ledger_seconds for path in PATHS}
                    wanted = round(SUBSCRIPTION_SHARE * phase.rates["charges"] * 60)
                    load.subscribe(db, max(0, wanted - subscriptions))
                    subscriptions = max(subscriptions, wanted)
                    phase.rates["charges"] *= 1 - SUBSCRIPTION_SHARE  # the rest arrive as periods
                    seconds = args.minutes * 60
                load.rates = phase.rates
                book.sample(live())
                cpu_before, phase.start = book.totals(), time.time()
                until = time.monotonic() + seconds
                while time.monotonic() < until:
                    supervisor.poll()
                    book.sample(live())
                    time.sleep(0.2)
                phase.end = time.time()
                phase.cores = CpuBook.cores(cpu_before, book.totals())
            load.stop()
            db.execute("SELECT paygate.cancel_subscription(id, 'the bench is over') FROM paygate.subscriptions "
                       "WHERE status = 'active'")
            drain_until = time.monotonic() + 90
            while any(open_work(dsn, OPEN_SQL).values()) and time.monotonic() < drain_until:
                supervisor.poll()
                time.sleep(0.5)
            supervisor.stop()
            clock.stop()
            if load.error is not None:
                raise SystemExit(f"the load generator failed: {load.error!r}")
            units = {path: read_units(db, path) for path in PATHS}
            batches = [int(r[0]) for r in db.execute("SELECT entries FROM paygate.charge_batches")]
            lives = [(str(r[0]), float(r[1]), float(r[2]), None if r[3] is None else int(r[3]))
                     for r in db.execute(LANE_SQL)]
            ticks = [(str(r[0]), float(r[1]), float(r[2])) for r in db.execute(TICKS_SQL)]
            per_ledger = [int(r[0]) for r in db.execute(
                "SELECT count(*) FROM paygate.lineages WHERE ledger IS NOT NULL GROUP BY ledger")]
        if supervisor.crashes:
            for worker, code, tail in supervisor.crashes:
                print(f"  worker {worker} exited {code}: {tail[-600:]}", file=sys.stderr)
        report(args, phases, units, clock, ceil, load, batches, per_ledger, lives, ticks,
               supervisor.starts if isinstance(supervisor, Deployment) else [])
    finally:
        if load is not None:
            load.stop()
        if clock is not None:
            clock.stop()
        if supervisor is not None:
            supervisor.kill_all()
        if devnet is not None:
            devnet.stop()
        cluster.stop()
        shutil.rmtree(pg_dir, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
