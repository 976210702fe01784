"""The chaos soak's machinery: every worker in looping processes under a supervisor, a load
generator admitting every kind of money, a monkey that SIGKILLs workers, toggles every devnet fault
and restarts Postgres and the devnet once each, then quiescence and the invariants, each checked
against the chain and reported with the rows and lineages involved.

A plain module: the test (tests/chaos/test_soak.py) wires it together. Everything random comes from
one seeded generator per actor, so a seed reproduces the same sequence of choices (the interleaving
with real processes is the OS's, which is the point of a soak)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from paygate_cli.db.migrate import migrate
from paygate_cli.sandbox.devnet.contracts.market import ORDER_TTL_LEDGERS
from paygate_cli.sandbox.devnet.faults import KINDS
from paygate_cli.sandbox.pg_cluster import Cluster
from paygate_cli.settings import parse_duration
from tests.support.chain_env import ChainEnv, admit_deposit, sign_deposit
from tests.support.charges_support import charge_chain
from tests.support.cli import paygate_cmd, run_proc
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.relay_support import admit_close, admit_relay, allow_market
from tests.support.webhook_receiver import Receiver

# Every devnet fault but `reject_send`: that one models a chain behind the journal (a reset network,
# a wrong RPC), which asks a human by design (tests/journal/test_repeated_rejection.py), not chaos the
# system heals from by itself.
FAULT_KINDS = sorted(set(KINDS) - {"reject_send"})

DEFAULT_SECONDS = 150.0
# Two processes for each worker that has slots to share, one for each single writer: every worker of
# the catalogue runs, 16 processes, and the cadences keep the idle ones cheap on a 2-core machine.
WORKER_PLAN: list[tuple[str, int, str]] = [
    ("funding", 2, "0.5s"), ("settlement", 2, "0.5s"), ("subscriptions", 2, "1s"), ("webhooks", 2, "0.5s"),
    ("recovery", 2, "2s"), ("observer", 1, "0.5s"), ("relay", 1, "0.5s"), ("relay_drainer", 1, "1s"),
    ("relay_expiry", 1, "2s"), ("reconciler", 1, "2s"), ("gas", 1, "3s"), ("idempotency_sweep", 1, "5s"),
    ("ttl", 1, "2s"),
]
LANES = 6
USERS = 6
# The fee market (docs/architecture.md §4 "Fees and the fee market"): a ledger holds as many Soroban
# transactions as paygate has lanes, so without a surge nothing of ours waits, and a surge dealt
# around that size really competes. A short fee-stats window lets getFeeStats (and paygate's bids)
# follow a surge within a ledger and forget it a few ledgers after it ends.
CAPACITY = LANES
FEE_STATS_WINDOW = 5
LEDGER_SECONDS = 1
# State archival (docs/architecture.md §4 "State archival (TTL)"): a persistent entry lives
# PERSISTENT_TTL ledgers and the TTL keeper extends whatever expires within TTL_THRESHOLD ledgers: an
# entry older than ten ledgers is due the moment the keeper reads it live, so it really extends under
# the chaos (the contract's entries at its first read). An entry it read before it was written (an
# account's balance entry, registered while its first deposit is in flight) is read again within the
# hour (workers/ttl.py's rotation), inside PERSISTENT_TTL ledgers of 1 s: it cannot archive unseen,
# however long the soak. The keeper converts durations at 5 s per ledger (chain/ttl.py), whatever the
# devnet's ledger time. What it does not keep (the market contract, the SAC's instance) archives only
# after PERSISTENT_TTL ledgers, past a short soak; a longer one restores them on the way (auto-restore).
PERSISTENT_TTL = 4_000
TTL_THRESHOLD = 3_990
TTL_EXTEND_TO = 5_000
KEEPER_LEDGER_SECONDS = 5
DEVNET_ARGS = ["--ledger-max-soroban-txs", str(CAPACITY), "--fee-stats-window-soroban", str(FEE_STATS_WINDOW),
               "--min-persistent-ttl", str(PERSISTENT_TTL), "--max-entry-ttl", "20000"]  # >= the temporary TTL (17,280)
# Surges bid 10x-30x the base fee; the cap sits between, so a surge below it is outbid by a
# replacement and one above it parks its lineages fee-capped. A floor bid (200) is replaced at
# min(cap, 10 x 200): the cap must be at least 2000 for a replacement to happen at all.
SURGE_RATES = (1_000, 3_000)
MAX_INCLUSION_FEE = 2_500
DEPOSIT_AMOUNTS = (20_000_000, 30_000_000)
WEBHOOK_SECRET = "whsec_soak_0123456789abcdef"

# Work that is not finished: quiescence is every one of these at zero.
OPEN_WORK_SQL = """
SELECT (SELECT count(*) FROM paygate.deposits WHERE status = 'pending') AS deposits,
       (SELECT count(*) FROM paygate.charges WHERE status = 'authorized') AS charges,
       (SELECT count(*) FROM paygate.charge_batches WHERE closed_at IS NULL) AS batches,
       (SELECT count(*) FROM paygate.lineages WHERE state IN ('allocated', 'signed', 'sent')) AS lineages,
       (SELECT count(*) FROM paygate.relays WHERE status = 'queued') AS relays,
       (SELECT count(*) FROM paygate.bot_jobs WHERE status = 'queued') AS bot_jobs,
       (SELECT count(*) FROM paygate.fee_reservations WHERE status = 'reserved') AS reservations,
       (SELECT count(*) FROM paygate.webhook_outbox WHERE status IN ('pending', 'delivering')) AS webhooks,
       (SELECT count(*) FROM paygate.ttl_jobs WHERE status = 'pending') AS ttl_jobs
"""


def soak_seconds() -> float:
    """PAYGATE_SOAK_SECONDS: plain seconds or a duration (`30m`, as `make soak DURATION=30m` passes it)."""
    return parse_duration(os.environ.get("PAYGATE_SOAK_SECONDS") or DEFAULT_SECONDS, name="PAYGATE_SOAK_SECONDS")


def soak_seed() -> int:
    raw = os.environ.get("PAYGATE_SOAK_SEED")
    return int(raw) if raw else random.SystemRandom().randrange(1, 2**31)


# ----- the world: a private Postgres we may restart, a devnet with a state file, a webhook receiver ----


@dataclass
class World:
    tmp: Path
    cluster: Cluster | None  # None: Postgres is the caller's (the failover drill's replicated pair)
    pg_dir: str | None
    dsn: str
    devnet: DevnetHandle
    state_file: Path
    port: int
    chain: ChainEnv
    receiver: Receiver
    pg_restarts: int = 0
    devnet_restarts: int = 0

    @property
    def genesis(self) -> dict[str, Any]:
        return self.devnet.genesis

    def restart_postgres(self, down_for: float) -> None:
        """A clean stop (`-m fast`: every connection is cut, nothing committed is lost) and a start."""
        assert self.cluster is not None
        self.cluster.stop()
        time.sleep(down_for)
        self.cluster.start(fast=True)
        self.pg_restarts += 1

    def restart_devnet(self, down_for: float) -> None:
        """SIGTERM (state saved), then the same node again from its state file on the same port: the
        workers' RPC URL does not change. Queued transactions are lost, as a real node's mempool is."""
        self.devnet.stop()
        time.sleep(down_for)
        handle = start_devnet(self.tmp / "devnet", seed="soak", lanes=LANES, users=USERS,
                              ledger_interval=f"{LEDGER_SECONDS}s", state=self.state_file,
                              extra_args=[*DEVNET_ARGS, "--port", str(self.port)])
        assert handle.url == self.devnet.url, (handle.url, self.devnet.url)
        self.devnet = self.chain.devnet = handle
        self.devnet_restarts += 1

    def close(self) -> None:
        self.receiver.stop()
        self.devnet.stop()
        try:
            if self.cluster is not None:
                self.cluster.stop()
        finally:
            if self.pg_dir is not None:
                shutil.rmtree(self.pg_dir, ignore_errors=True)


def build_world(tmp: Path) -> World:
    """The soak's world on a private Postgres of its own (database `soak`)."""
    pg_dir = tempfile.mkdtemp(prefix="pgs-", dir="/tmp")  # short: the socket path limit
    if os.geteuid() == 0:
        os.chmod(pg_dir, 0o755)  # the postgres user must traverse it
    cluster = Cluster.at(Path(pg_dir) / "d")
    try:
        cluster.init(fast=True)
        cluster.start(fast=True)
        with psycopg.connect(cluster.dsn("postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE soak")
        dsn = cluster.dsn("soak")
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
        return world_on(tmp, dsn, cluster=cluster, pg_dir=pg_dir)
    except BaseException:
        cluster.stop()
        shutil.rmtree(pg_dir, ignore_errors=True)
        raise


def world_on(tmp: Path, dsn: str, *, cluster: Cluster | None = None, pg_dir: str | None = None) -> World:
    """The soak's world on the migrated database `dsn`: the devnet, paygate wired to both, the
    webhook receiver. `cluster`/`pg_dir`: the Postgres the world owns (stopped and removed by close)."""
    devnet: DevnetHandle | None = None
    try:
        state_file = tmp / "devnet-state.json"
        devnet = start_devnet(tmp / "devnet", seed="soak", lanes=LANES, users=USERS,
                              ledger_interval=f"{LEDGER_SECONDS}s", state=state_file, extra_args=DEVNET_ARGS)
        chain = charge_chain(devnet, dsn, tmp / "keys")
        chain.environ.update(
            PAYGATE_WEBHOOK_ALLOW_HOSTS="127.0.0.1/32",
            PAYGATE_WEBHOOK_LEASE="5s",
            PAYGATE_WEBHOOK_BACKOFF_BASE="1s",
            PAYGATE_WEBHOOK_BACKOFF_MAX="4s",
            PAYGATE_WEBHOOK_MAX_ATTEMPTS="50",  # the receiver always answers 200: only chaos fails attempts
            PAYGATE_RECOVERY_GRACE="15s",  # the default 180 s is longer than the soak
            PAYGATE_INSTANCE_ID="soak",
            PAYGATE_MAX_INCLUSION_FEE=str(MAX_INCLUSION_FEE),
            PAYGATE_FEE_STATS_CACHE="1s",  # the default 5 s is five of the soak's ledgers: a surge is short
            PAYGATE_TTL_THRESHOLD=f"{TTL_THRESHOLD * KEEPER_LEDGER_SECONDS}s",
            PAYGATE_TTL_EXTEND_TO=f"{TTL_EXTEND_TO * KEEPER_LEDGER_SECONDS}s",
        )
        receiver = Receiver().start()
        with psycopg.connect(dsn, autocommit=True) as conn:
            allow_market(conn, devnet.genesis["contracts"]["market"])
            conn.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES (%s, %s)",
                         (f"{receiver.base}/ok", WEBHOOK_SECRET))
    except BaseException:
        if devnet is not None:
            devnet.stop()
        raise
    return World(tmp=tmp, cluster=cluster, pg_dir=pg_dir, dsn=dsn, devnet=devnet, state_file=state_file,
                 port=int(devnet.url.rsplit(":", 1)[1]), chain=chain, receiver=receiver)


# ----- worker processes under a supervisor ---------------------------------------------------------


@dataclass
class Slot:
    worker: str
    index: int
    every: str
    log: Path
    proc: subprocess.Popen | None = None
    log_offset: int = 0
    restart_at: float = 0.0
    enabled: bool = True
    killed: bool = False  # we sent this process SIGKILL
    terminated: bool = False  # we sent this process SIGTERM (quiescence)


@dataclass
class Supervisor:
    """Keeps every slot's `paygate run-tick W --every … --for …` running, the way cron or a systemd
    timer would: a process that exits (its --for ran out, it was killed, its dependency vanished)
    is started again. Every exit code is recorded per worker."""

    environ: dict[str, str]
    logs: Path
    rng: random.Random
    plan: list[tuple[str, int, str]] = field(default_factory=lambda: list(WORKER_PLAN))
    # Exit codes a run may also end with, beyond the soak's (the disaster-recovery drills: 3, a
    # lane fenced ahead of a restored journal asks a human by design).
    tolerated: set[int] = field(default_factory=set)
    run_for: tuple[int, int] = (20, 45)  # cron's `--for`, seconds: drawn for each process started
    slots: list[Slot] = field(default_factory=list)
    exits: Counter = field(default_factory=Counter)  # (worker, code) -> n
    runs: list[tuple[str, int, float]] = field(default_factory=list)  # (worker, code, monotonic end), in order
    kills: int = 0
    kills_confirmed: int = 0
    crashes: list[tuple[str, int, str]] = field(default_factory=list)  # (worker, code, stderr tail)
    spawned: int = 0

    def __post_init__(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        for worker, count, every in self.plan:
            for i in range(count):
                self.slots.append(Slot(worker, i, every, self.logs / f"{worker}-{i}.log"))

    def _spawn(self, slot: Slot) -> None:
        run_for = self.rng.randint(*self.run_for)  # cron's `--for`: processes also end and restart on their own
        slot.log_offset = slot.log.stat().st_size if slot.log.exists() else 0
        with slot.log.open("ab") as log:
            slot.proc = subprocess.Popen(
                paygate_cmd("run-tick", slot.worker, "--every", slot.every, "--for", f"{run_for}s", "--lock-wait", "0"),
                env=self.environ, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        slot.killed = slot.terminated = False
        self.spawned += 1

    def _record(self, slot: Slot, code: int) -> None:
        self.exits[(slot.worker, code)] += 1
        self.runs.append((slot.worker, code, time.monotonic()))
        if code == -signal.SIGKILL and slot.killed:
            self.kills_confirmed += 1
        # -15: our SIGTERM landed after the run loop had ended and restored the default handler (the
        # process was already on its way out, its work done): what systemd calls a clean stop too.
        expected = {0, 1, 69, 75, 143} | self.tolerated | ({-signal.SIGKILL} if slot.killed else set()) | (
            {-signal.SIGTERM} if slot.terminated else set())
        # The reconciler may raise a balance finding while money moves under chaos (exit 3); it is
        # reported, and the test requires every finding to have cleared by the end.
        if slot.worker == "reconciler" and code == 3:
            expected.add(3)
        if code not in expected:
            with slot.log.open("rb") as log:
                log.seek(slot.log_offset)
                tail = log.read().decode(errors="replace")[-4000:]
            self.crashes.append((slot.worker, code, tail))

    def poll(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.proc is not None:
                code = slot.proc.poll()
                if code is None:
                    continue
                self._record(slot, code)
                slot.proc = None
                # A quick restart after a normal end or a kill; a pause when the dependency is down.
                slot.restart_at = now + (0.2 if code in (0, -signal.SIGKILL) else 1.0)
            if slot.enabled and now >= slot.restart_at:
                self._spawn(slot)

    def kill_random(self) -> str | None:
        live = [s for s in self.slots if s.proc is not None and s.proc.poll() is None]
        if not live:
            return None
        victim = self.rng.choice(live)
        assert victim.proc is not None
        victim.killed = True
        victim.proc.send_signal(signal.SIGKILL)
        self.kills += 1
        return victim.worker

    def stop(self, workers: set[str] | None = None, timeout: float = 90) -> None:
        """SIGTERM (finish the tick, release the lock), wait, record; no restart afterwards."""
        chosen = [s for s in self.slots if workers is None or s.worker in workers]
        for slot in chosen:
            slot.enabled = False
            if slot.proc is not None and slot.proc.poll() is None:
                slot.terminated = True
                slot.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for slot in chosen:
            if slot.proc is None:
                continue
            try:
                code = slot.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                slot.proc.kill()
                code = slot.proc.wait()
                self.crashes.append((slot.worker, code, f"did not stop within {timeout:.0f}s of SIGTERM"))
            self._record(slot, code)
            slot.proc = None

    def sigkill_all(self) -> int:
        """The disaster: every worker process SIGKILLed at once, mid-tick or not, each exit recorded;
        none restarts until `start_all`. -> how many were running."""
        live = [s for s in self.slots if s.proc is not None and s.proc.poll() is None]
        for slot in self.slots:
            slot.enabled = False
        for slot in live:
            assert slot.proc is not None
            slot.killed = True
            slot.proc.send_signal(signal.SIGKILL)
            self.kills += 1
        for slot in self.slots:
            if slot.proc is not None:
                self._record(slot, slot.proc.wait())
                slot.proc = None
        return len(live)

    def freeze(self) -> int:
        """SIGSTOP every live worker process: nothing of theirs commits until `thaw` (the failover
        drill reads what the primary holds at the instant it is killed). -> how many."""
        live = [s.proc for s in self.slots if s.proc is not None and s.proc.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGSTOP)
        return len(live)

    def thaw(self) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.send_signal(signal.SIGCONT)

    def start_all(self) -> None:
        """Every slot enabled again: the next poll starts them (cron after the database came back)."""
        for slot in self.slots:
            slot.enabled, slot.restart_at = True, 0.0

    def kill_all(self) -> None:
        """Teardown after a failure: nothing of ours may outlive the test."""
        for slot in self.slots:
            slot.enabled = False
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.kill()
                slot.proc.wait()

    def histogram(self) -> dict[str, dict[int, int]]:
        table: dict[str, dict[int, int]] = {}
        for (worker, code), n in sorted(self.exits.items()):
            table.setdefault(worker, {})[code] = n
        return table


# ----- the monkey: faults on and off, kills, one restart of each dependency --------------------------


@dataclass
class FaultMonkey:
    """Deals every devnet fault kind from a shuffled deck (so each one is played before any repeats),
    alternating with "all clear": faults toggle on and off for the whole chaos phase. A surge is
    not cleared with the rest: it runs out its ledgers under the faults dealt after it."""

    rng: random.Random
    # Scales how long a fault stays on and "all clear" lasts: a short soak's chaos phase must still
    # deal the whole deck (test_soak.py asks every kind to have been on).
    pace: float = 1.0
    # Whether a surge would compete with something now (paygate has transactions in flight): a
    # surge dealt to an idle journal proves nothing, so it waits for the next turn while it can.
    surge_ready: Callable[[], bool] = lambda: True
    deck: list[str] = field(default_factory=list)
    set_counts: Counter = field(default_factory=Counter)
    clears: int = 0
    active: bool = False
    surges: list[dict[str, int]] = field(default_factory=list)  # the params of each surge dealt
    kind: str | None = None  # the fault dealt last

    def _surge(self) -> dict[str, int]:
        """Alternately above and below the cap. Above it first (a short soak deals one surge), with
        phantoms filling every ledger (a free slot would let paygate's own bids set the surge price):
        the lineages bidding the floor when it starts are replaced at the cap, which still loses, and
        then park fee-capped (five ledgers at least: two before the replacement, two more before
        parking). Below it, phantoms around the capacity: replacements outbid it and land during it."""
        low, high = SURGE_RATES
        if len(self.surges) % 2:
            rate, txs = self.rng.randint(low, MAX_INCLUSION_FEE - 100), self.rng.randint(CAPACITY - 1, CAPACITY + 2)
        else:
            rate, txs = self.rng.randint(MAX_INCLUSION_FEE + 100, high), self.rng.randint(CAPACITY, CAPACITY + 2)
        surge = {"rate": rate, "txs": txs, "ledgers": self.rng.randint(5, 10)}
        self.surges.append(surge)
        return surge

    def params(self, kind: str) -> dict[str, Any]:
        r = self.rng
        if kind == "surge":
            return self._surge()
        return {
            "http_503": {"count": r.randint(1, 6)},
            "http_504": {"count": r.randint(1, 6)},
            "slow": {"ms": r.randint(200, 1500), "count": r.randint(5, 30)},
            "lose_send_answer": {"count": r.randint(1, 3)},
            "try_again_later": {"count": r.randint(1, 4)},
            "account_lag": {"ledgers": r.randint(1, 4)},
            "node_lag": {"ledgers": r.randint(1, 4)},
            "hold_next": {"ledgers": r.randint(2, 6)},
            "drop_next": {},
            "down": {},
        }[kind]

    def toggle(self, devnet: DevnetHandle) -> str:
        if self.active:
            if self.kind != "surge":
                devnet.rpc("devnet_clearFaults", {"kind": self.kind})
            self.active = False
            self.clears += 1
            return "clear"
        if not self.deck:
            self.deck = sorted(FAULT_KINDS)
            self.rng.shuffle(self.deck)
        kind = self.deck.pop()
        if kind == "surge" and self.deck and not self.surge_ready():
            self.deck.insert(len(self.deck) - 1, kind)  # the turn after next
            kind = self.deck.pop()
        params = self.params(kind)
        devnet.set_fault(kind, **params)
        self.set_counts[kind] += 1
        self.active, self.kind = True, kind
        return kind

    def next_toggle_in(self) -> float:
        """Seconds until the next toggle: a fault stays on for a while, "all clear" briefly."""
        return self.pace * (self.rng.uniform(1.5, 4.0) if self.active else self.rng.uniform(0.5, 2.0))


def in_flight(dsn: str) -> bool:
    """paygate has a transaction sent and not yet resolved (a surge now would compete with it)."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
            return bool(conn.execute("SELECT EXISTS (SELECT 1 FROM paygate.lineages WHERE state = 'sent')"
                                     ).fetchone()[0])
    except psycopg.OperationalError:
        return False  # Postgres is restarting: nothing is known to be in flight


# ----- the load generator (the API service's admissions) ----------------------------------------------


class AdminLedger(DevnetHandle):
    """The devnet handle the load generator signs with: the latest ledger comes from the admin state
    (never faulted), so a wallet can still sign while the RPC misbehaves."""

    def latest_ledger(self) -> int:
        return int(self.state()["latestLedger"])


@dataclass
class LoadGenerator:
    dsn: str
    devnet: AdminLedger
    rng: random.Random
    max_subscriptions: int = 6
    # How often each kind is admitted once the plan ran out; a kind left out is never admitted.
    weights: dict[str, int] = field(default_factory=lambda: {"deposit": 2, "charge": 6, "relay": 3, "bot_job": 2,
                                                             "subscription": 1})
    key_series: str = ""  # set apart from another generator's keys on the same database: `deposit-a1`
    admitted: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)
    unavailable: Counter = field(default_factory=Counter)
    stop_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    error: BaseException | None = None
    _n: int = 0

    plan: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    cycles: dict[str, dict[str, str | None]] = field(default_factory=dict)  # bot buyer -> its relay/close keys

    @property
    def users(self) -> list[dict[str, str]]:
        return self.devnet.genesis["users"]

    @property
    def occasional(self) -> list[dict[str, str]]:
        """Users whose orders the bot closes: a user who buys again keeps the order open (the chain
        closes an order only ORDER_TTL_LEDGERS after the user's latest buy), so these only buy in
        their cycle (`_bot_job`), never at random."""
        return self.users[-2:]

    @property
    def shoppers(self) -> list[dict[str, str]]:
        return self.users[:-2]

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="soak-load", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(60)

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        try:
            # The bot's buyers start their cycle (buy, wait out the order's window, close) first: it is
            # long. Then every user deposits: charges, subscriptions and relays need money to flow.
            bots = [("bot_job", user) for user in self.occasional] if self.weights.get("bot_job") else []
            self.plan = bots + [("deposit", user) for user in self.users]
            while not self.stop_event.wait(self.rng.uniform(0.25, 0.8)):
                if self.plan:
                    kind, user = self.plan.pop(0)
                else:
                    kind = self._pick()
                    user = self.rng.choice(self.shoppers if kind == "relay" else self.users)
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=3)
                    getattr(self, f"_{kind}")(conn, user)
                except psycopg.OperationalError:
                    self.unavailable[kind] += 1  # Postgres is restarting: the API would answer 503
                    if conn is not None:
                        conn.close()
                    conn = None
                except OSError:
                    self.unavailable[kind] += 1  # the devnet is restarting: the wallet cannot sign
        except BaseException as exc:  # surfaced by the test: a load generator bug must not pass silently
            self.error = exc
        finally:
            if conn is not None:
                conn.close()

    def _pick(self) -> str:
        return self.rng.choices(list(self.weights), weights=list(self.weights.values()))[0]

    def _key(self, kind: str) -> str:
        self._n += 1
        return f"{kind}-{self.key_series}{self._n}"

    def _refused(self, kind: str, exc: psycopg.Error) -> None:
        # 402 no balance yet, 55000 admission halted (the gas halt), 53400 over the fee budget
        self.refused[f"{kind}:{exc.sqlstate}"] += 1

    def _deposit(self, conn: psycopg.Connection, user: dict[str, str]) -> None:
        amount = self.rng.choice(DEPOSIT_AMOUNTS)
        # One in ten with a short authorisation: it may expire before it lands (a terminal state too).
        valid = 3 if self.rng.random() < 0.1 else 600
        entry, nonce, expiration = sign_deposit(self.devnet, user["secret"], amount, valid_ledgers=valid)
        try:
            admit_deposit(conn, user["public"], amount, entry, nonce, expiration, self._key("deposit"))
            self.admitted["deposit"] += 1
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                raise
            self._refused("deposit", exc)

    def _charge(self, conn: psycopg.Connection, user: dict[str, str]) -> None:
        # The product charges a customer who has money: a user whose deposits have settled.
        amount = self.rng.randint(10_000, 300_000)
        funded = [r[0] for r in conn.execute(FUNDED_SQL, (amount,))]
        if not funded:
            self.refused["charge:no funded account yet"] += 1
            return
        try:
            conn.execute("SELECT paygate.admit_charge(%s, %s, %s)",
                         (self.rng.choice(funded), amount, self._key("charge")))
            self.admitted["charge"] += 1
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                raise
            self._refused("charge", exc)

    def _subscription(self, conn: psycopg.Connection, user: dict[str, str]) -> None:
        if self.admitted["subscription"] >= self.max_subscriptions:
            return
        behind = self.rng.choice([0, 90, 150])  # up to two missed one-minute periods to catch up
        try:
            conn.execute("SELECT paygate.create_subscription(%s, %s, interval '1 minute', "
                         "now() - make_interval(secs => %s), %s)",
                         (user["public"], self.rng.randint(20_000, 60_000), behind, self._key("sub")))
            self.admitted["subscription"] += 1
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                raise
            self._refused("subscription", exc)

    def _relay(self, conn: psycopg.Connection, user: dict[str, str]) -> None:
        key = self._key("relay")
        roll = self.rng.random()
        # Most buy a unique item (so the chain's order events name the relay); some buy "fail", which
        # the contract refuses (rejected at simulation, the reservation released); some carry an
        # authorisation about to expire (expired, released).
        item, valid = ("fail", 600) if roll < 0.1 else (key.replace("-", "_"), 2 if roll < 0.2 else 600)
        self._admit_relay(conn, user, key, item, valid)

    def _admit_relay(self, conn: psycopg.Connection, user: dict[str, str], key: str, item: str, valid: int) -> bool:
        try:
            admit_relay(conn, self.devnet, user, key, item, 7, expiration=self.devnet.latest_ledger() + valid)
            self.admitted["relay"] += 1
            return True
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                raise
            self._refused("relay", exc)
            return False

    def _bot_job(self, conn: psycopg.Connection, _user: dict[str, str]) -> None:
        """One step of each bot buyer's cycle: buy; once the buy applied and the order's window has
        passed on chain (ORDER_TTL_LEDGERS ledgers of 1 s), queue the bot job closing it; when that
        job is terminal (closed, or refused by the chain), buy again. A buy that did not apply or an
        admission that did not happen starts the step again: the cycle heals itself under chaos."""
        for user in self.occasional:
            cycle = self.cycles.setdefault(user["public"], {"relay": None, "close": None})
            relay_status, age, close_status = conn.execute(CYCLE_SQL, cycle).fetchone()
            if cycle["close"] is not None:
                if close_status == "queued":
                    continue
                cycle.update(relay=None, close=None)
                relay_status = None
            if relay_status in (None, "expired", "rejected", "failed"):
                key = self._key("relay")
                cycle["relay"] = key if self._admit_relay(conn, user, key, key.replace("-", "_"), 600) else None
            elif relay_status == "applied" and age > ORDER_TTL_LEDGERS + 3:
                key = self._key("close")
                try:
                    admit_close(conn, self.devnet, user["public"], key)
                except psycopg.Error as exc:
                    if isinstance(exc, psycopg.OperationalError):
                        raise
                    self._refused("bot_job", exc)
                    continue
                cycle["close"] = key
                self.admitted["bot_job"] += 1


CYCLE_SQL = """
SELECT (SELECT status FROM paygate.relays WHERE idempotency_key = %(relay)s),
       (SELECT extract(epoch FROM now() - finished_at)::float8 FROM paygate.relays WHERE idempotency_key = %(relay)s),
       (SELECT status FROM paygate.bot_jobs WHERE job_key = %(close)s)
"""
FUNDED_SQL = "SELECT address FROM paygate.accounts WHERE cached_balance >= %s ORDER BY address"


@dataclass
class FeeWatch:
    """Samples the journal while the soak runs: which lineages were ever fee-capped (the mark is
    cleared once the market falls below a lineage's bid, so the end state alone undercounts) and
    the replacement envelopes journaled so far."""

    dsn: str
    capped: set[int] = field(default_factory=set)
    replacements: int = 0
    samples: int = 0
    stop_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="soak-fees", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(30)
        self.sample()  # and once more at the end, over whatever the last seconds capped

    def sample(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=3) as conn:
                self.capped.update(r[0] for r in conn.execute(
                    "SELECT id FROM paygate.lineages WHERE fee_capped_at IS NOT NULL"))
                self.replacements = max(self.replacements, int(conn.execute(
                    "SELECT count(*) FROM paygate.lineage_envelopes").fetchone()[0]))
                self.samples += 1
        except psycopg.OperationalError:
            pass  # Postgres is restarting: the next sample sees what this one missed, if it is still marked

    def _run(self) -> None:
        while not self.stop_event.wait(1.0):
            self.sample()


def log_msgids(logs: Path, prefix: str) -> dict[str, int]:
    """How often the workers logged each msgid starting with `prefix` (their stderr is JSON lines):
    what the fee market did, as the workers saw it."""
    seen: Counter = Counter()
    for path in sorted(logs.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if f'"msgid": "{prefix}' in line:
                seen[line.split('"msgid": "', 1)[1].split('"', 1)[0]] += 1
    return dict(sorted(seen.items()))


def open_work(dsn: str, sql: str = OPEN_WORK_SQL) -> dict[str, int]:
    """The open work right now; a database too slow to answer (a loaded CI box) counts as not quiet."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=30) as conn:
            cursor = conn.execute(sql)
            return dict(zip([c.name for c in cursor.description], cursor.fetchone(), strict=True))
    except psycopg.OperationalError:
        return {"database unreachable": 1}


def final_observer(world: World) -> int:
    """One more observer pass after everything stopped: the last ledgers' events applied."""
    return run_proc("run-tick", "observer", "--once", environ=world.chain.environ, timeout=120).code
