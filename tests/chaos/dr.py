"""The disaster-recovery drills' machinery (docs/reliability.md "Disaster recovery drills"): the
soak's world, supervisor, load generator and invariants (tests/chaos/soak.py, invariants.py) run
through a disaster (a restore from a dump taken mid-run, a failover to a standby that lagged), and
what is asked afterwards, against the chain: every unit of money at most once, every unit the
database knows terminal or asking a human with its reason, lanes ahead of the journal fenced with
evidence and never reused at a consumed sequence, no tick process exited 70, the restore halt set
and cleared by the recovery pass.

A plain module: the tests (test_restore_drill.py, test_failover_drill.py) wire it together."""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import psycopg

from paygate_cli.settings import parse_duration
from tests.chaos.invariants import (
    Findings,
    LostCommits,
    _hash_map,
    _rows,
    chain_events,
    chain_transactions,
    check_balances,
    check_charges,
    check_deposits,
    check_landings_and_fees,
    check_relays,
    check_subscriptions,
    check_terminal,
)
from tests.chaos.soak import AdminLedger, LoadGenerator, Supervisor, World, final_observer
from tests.support.chain_env import ChainEnv
from tests.support.cli import run_proc

DEFAULT_SECONDS = 20.0
# The money paths and what keeps them honest; bot jobs, webhooks and the TTL keeper are the soak's
# (their invariants do not change with a restore), so a drill stays cheap on a 2-core machine.
DRILL_PLAN: list[tuple[str, int, str]] = [
    ("funding", 1, "0.5s"), ("settlement", 1, "0.5s"), ("subscriptions", 1, "2s"), ("recovery", 1, "1s"),
    ("observer", 1, "1s"), ("relay", 1, "0.5s"), ("relay_expiry", 1, "5s"), ("reconciler", 1, "3s"),
]
DRILL_WEIGHTS = {"deposit": 3, "charge": 6, "relay": 3, "subscription": 1}
MONEY_WORKERS = ("funding", "settlement", "relay")
# A lane fenced ahead of a restored journal asks a human (exit 3) by design; a tick refused while
# the restore halt holds submissions back is told so, not crashed.
DRILL_TOLERATED = {3}
OPERATOR = "dr-drill"

# Work that is not finished for a drill: a unit asking a human (with its reason) is finished here.
DRILL_OPEN_WORK_SQL = """
SELECT (SELECT count(*) FROM paygate.deposits WHERE status = 'pending') AS deposits,
       (SELECT count(*) FROM paygate.charges WHERE status = 'authorized') AS charges,
       (SELECT count(*) FROM paygate.charge_batches WHERE closed_at IS NULL) AS batches,
       (SELECT count(*) FROM paygate.lineages WHERE state IN ('allocated', 'signed', 'sent')) AS lineages,
       (SELECT count(*) FROM paygate.relays WHERE status = 'queued') AS relays,
       (SELECT count(*) FROM paygate.halts WHERE kind = 'restore') AS restore_halt,
       (SELECT count(*) FROM paygate.findings WHERE kind = 'lane_fence' AND resolved_at IS NULL) AS open_fences
"""

UNIT_TABLES = {"deposits": "pending", "charges": "authorized", "relays": "queued"}


def drill_seconds() -> float:
    """PAYGATE_DRILL_SECONDS: how long the load runs (plain seconds or a duration: `make soak
    SCENARIO=restore DURATION=10m` passes it); half before the disaster's moment T, half after."""
    return parse_duration(os.environ.get("PAYGATE_DRILL_SECONDS") or DEFAULT_SECONDS, name="PAYGATE_DRILL_SECONDS")


def drill_supervisor(environ: dict[str, str], logs: Any, rng: Any) -> Supervisor:
    # Long-lived processes: a process's start (its imports, the preflight) is most of an idle
    # worker's CPU, and the drills' disasters need no churn of their own.
    return Supervisor(environ, logs, rng, plan=list(DRILL_PLAN), tolerated=set(DRILL_TOLERATED), run_for=(90, 150))


def money_moved(dsn: str) -> bool:
    """A charge has settled (so deposits were credited and the charge path works end to end)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return bool(conn.execute("SELECT EXISTS (SELECT 1 FROM paygate.charges WHERE status = 'settled')"
                                 ).fetchone()[0])


def db_now(dsn: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT clock_timestamp()").fetchone()[0]


# ----- what the database knows, and what a lost one knew -------------------------------------------


def unit_statuses(conn: psycopg.Connection) -> dict[str, dict[int, str]]:
    """Every deposit, charge and relay: id -> status."""
    return {table: dict(conn.execute(f"SELECT id, status FROM paygate.{table}").fetchall()) for table in UNIT_TABLES}


def in_flight(conn: psycopg.Connection) -> dict[str, list[int]]:
    """The units not yet finished, and the live lineages: what was in flight at the backup's moment
    when read from the restored database before any worker ran on it."""
    found = {table: [r[0] for r in conn.execute(f"SELECT id FROM paygate.{table} WHERE status = %s ORDER BY id",
                                                (status,))] for table, status in UNIT_TABLES.items()}
    found["lineages"] = [r[0] for r in conn.execute(
        "SELECT id FROM paygate.lineages WHERE state IN ('allocated', 'signed', 'sent') ORDER BY id")]
    return found


@dataclass
class LostDatabase(LostCommits):
    """LostCommits, and what the drill's own checks read of the lost database: its lineages by
    (lane, sequence) (the operator explains a fenced range with them) and its subscription charges'
    periods (charge id -> (subscription, period start))."""
    by_seq: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    periods: dict[bytes, tuple[int, Any]] = field(default_factory=dict)


def read_lost(dsn: str) -> tuple[LostDatabase, dict[str, dict[int, str]]]:
    """The lost database as it was when the disaster struck: its journal's hashes, its deposits and
    charge ids (the invariants count their effects on chain as ours), and every unit's status."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        lineages = _rows(conn, "SELECT lane, source_seq, encode(inner_hash, 'hex') AS inner, state "
                               "FROM paygate.lineages WHERE source_seq IS NOT NULL")
        lost = LostDatabase(
            hashes=_hash_map(conn),
            deposits=_rows(conn, "SELECT id, account, auth_nonce, amount, status, deposit_tx, deposit_lineage_id, "
                                 "credit_lineage_id, reason FROM paygate.deposits ORDER BY id"),
            charge_ids={bytes(r[0]) for r in conn.execute("SELECT charge_id FROM paygate.charges")},
            by_seq={(r["lane"], int(r["source_seq"])): r for r in lineages},
            periods={bytes(r[0]): (r[1], r[2]) for r in conn.execute(
                "SELECT charge_id, subscription_id, period_start FROM paygate.charges "
                "WHERE subscription_id IS NOT NULL")})
        statuses = unit_statuses(conn)
    return lost, statuses


# ----- lanes: the chain against the restored journal -------------------------------------------------


def chain_lane_sequences(chain: ChainEnv) -> dict[str, int]:
    """Every lane's sequence on chain, read through SorobanServer (never through paygate)."""
    with chain.server() as server:
        return {lane["public"]: int(server.load_account(lane["public"]).sequence) for lane in chain.genesis["lanes"]}


def journal_consumed(conn: psycopg.Connection) -> dict[str, int | None]:
    """Each lane's last sequence the journal knows consumed (an applied or failed lineage, or an
    accepted fence), as journal/lineage.py counts it: None for a lane it never used."""
    rows = conn.execute("""
        SELECT l.address, greatest((SELECT max(x.source_seq) FROM paygate.lineages x WHERE x.lane = l.address
                                    AND x.state IN ('applied', 'failed')), l.accepted_seq)
        FROM paygate.lanes l""").fetchall()
    return {lane: (None if seq is None else int(seq)) for lane, seq in rows}


@dataclass
class OperatorLog:
    """The runbook's operator, as the drill plays them (runbooks/lane-fenced-chain-ahead.md): a
    fenced lane is accepted only once every sequence of its range is explained by a transaction
    of ours that landed (the lost journal's, found on chain by its hash)."""

    accepted: dict[str, int] = field(default_factory=dict)  # lane -> accepted sequence
    refused: dict[str, str] = field(default_factory=dict)  # lane -> why it was not accepted
    undrain_codes: list[int] = field(default_factory=list)


def explain_and_accept_fences(chain: ChainEnv, dsn: str, lost: LostDatabase, log: OperatorLog,
                              landed: set[str]) -> None:
    by_seq = lost.by_seq
    with psycopg.connect(dsn, autocommit=True) as conn:
        fences = _rows(conn, "SELECT id, subject AS lane, details FROM paygate.findings "
                             "WHERE kind = 'lane_fence' AND resolved_at IS NULL ORDER BY id")
        for fence in fences:
            lane, details = fence["lane"], fence["details"] or {}
            first, last = (details.get("range") or [None, None])[:2]
            if first is None or last is None:
                log.refused[lane] = f"finding {fence['id']} records no range: {details}"
                continue
            unexplained = [seq for seq in range(int(first), int(last) + 1)
                           if by_seq.get((lane, seq), {}).get("inner") not in landed]
            if unexplained:
                log.refused[lane] = f"sequences {unexplained} of {first}..{last}: no landed transaction of ours"
                continue
            accepted = conn.execute("SELECT paygate.accept_lane_fence(%s, %s)", (lane, OPERATOR)).fetchone()[0]
            log.accepted[lane] = int(accepted)
            log.refused.pop(lane, None)
            log.undrain_codes.append(run_proc("undrain", "--lane", lane, "--yes", "--json",
                                              environ={**chain.environ, "PAYGATE_OPERATOR": OPERATOR}).code)


def landed_inner_hashes(chain: ChainEnv) -> set[str]:
    return {tx["inner"] for tx in chain_transactions(chain)}


# ----- the drill's checks ----------------------------------------------------------------------------


@dataclass
class Disaster:
    """What the drill knows of its disaster, recorded as it happened."""

    lost: LostDatabase
    lost_statuses: dict[str, dict[int, str]]  # every unit the lost database knew: id -> status
    in_flight_at_t: dict[str, list[int]]  # read from the recovered database before any worker ran
    known_at_recovery: dict[str, dict[int, str]]  # its units then (id -> status)
    chain_seq_at_recovery: dict[str, int]
    journal_seq_at_recovery: dict[str, int | None]
    max_lineage_at_recovery: int
    recovered_at: Any  # database time when the workers were started again
    recovered_monotonic: float


def check_money(chain: ChainEnv, dsn: str, disaster: Disaster) -> Findings:
    """The soak's invariants as they hold for a database behind the chain: every unit terminal or
    asking a human with its reason; at most once on chain for every deposit, charge id and relay,
    the lost database's included; cached balances equal the chain or an open finding says not."""
    out = Findings()
    with psycopg.connect(dsn, autocommit=True) as conn:
        check_terminal(conn, out, needs_human_ok=True, tables=("deposits", "charges", "relays"))
        check_deposits(chain, conn, out, disaster.lost)
        check_charges(chain, conn, out, disaster.lost)
        check_subscriptions(conn, out)
        check_relays(chain, conn, out)
        check_landings_and_fees(chain, conn, out)
        check_balances(chain, conn, out, drift_ok=True)
        check_periods_on_chain(chain, conn, disaster.lost, out)
    return out


def check_periods_on_chain(chain: ChainEnv, conn: psycopg.Connection, lost: LostDatabase, out: Findings) -> None:
    """At most one debit on chain per subscription period, across the lost database's charges and
    the restored one's (charge ids are random: a period charged again after a restore is a second
    debit the contract cannot refuse)."""
    periods = {**lost.periods, **{bytes(r[0]): (r[1], r[2]) for r in conn.execute(
        "SELECT charge_id, subscription_id, period_start FROM paygate.charges WHERE subscription_id IS NOT NULL")}}
    debits: Counter = Counter()
    for ev in chain_events(chain, chain.genesis["contracts"]["billing"]):
        if ev["topics"][0] == "charge" and bytes(ev["value"][1]) in periods:
            debits[periods[bytes(ev["value"][1])]] += 1
    twice = {f"subscription {s} period {p:%H:%M:%S}": n for (s, p), n in debits.items() if n > 1}
    out.counts["subscription periods debited on chain"] = len(debits)
    if twice:
        out.fail("each subscription period debited at most once on chain", f"{twice}")


def check_recovery(dsn: str, disaster: Disaster, chain_seq_now: dict[str, int]) -> Findings:
    """What the restore gate owes: the restore halt set (audited) and cleared, the identity the
    database has now recorded; every lane the chain had ahead of the restored journal fenced with
    the evidence (the range and the chain's sequence); no lineage built after recovery at a
    sequence the chain had consumed."""
    out = Findings()
    with psycopg.connect(dsn, autocommit=True) as conn:
        set_rows = _rows(conn, "SELECT actor, at, details FROM paygate.audit_log WHERE action = 'restore_halt' "
                               "ORDER BY id")
        out.counts["restore halts set (audited)"] = len(set_rows)
        if not set_rows:
            out.fail("the restore halt was set after the restore",
                     "no 'restore_halt' audit row in the recovered database")
        halt = _rows(conn, "SELECT * FROM paygate.halts WHERE kind = 'restore'")
        cleared = _rows(conn, "SELECT actor, at FROM paygate.audit_log WHERE action = 'restore_clear' ORDER BY id")
        out.counts["restore halts cleared by a pass (audited)"] = [f"{r['actor']} {r['at']:%H:%M:%S}" for r in cleared]
        if halt or not cleared:
            out.fail("the restore halt was cleared by the recovery pass",
                     f"still set: {halt}" if halt else "no 'restore_clear' audit row")
        identity = _rows(conn, "SELECT database_oid, timeline, recorded_by, recorded_at FROM paygate.db_identity")
        oid = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
        out.counts["db_identity recorded"] = identity
        if not identity or int(identity[0]["database_oid"]) != int(oid):
            out.fail("the recovered database's identity is recorded once the pass is clean",
                     f"recorded {identity}, this database's oid {oid}")
        fences = defaultdict(list)
        for row in _rows(conn, "SELECT subject, details, resolved_at, resolved_by FROM paygate.findings "
                               "WHERE kind = 'lane_fence' ORDER BY id"):
            fences[row["subject"]].append(row)
        ahead = {lane: seq for lane, seq in disaster.chain_seq_at_recovery.items()
                 if disaster.journal_seq_at_recovery.get(lane) is not None
                 and seq > int(disaster.journal_seq_at_recovery[lane] or 0)}
        out.counts["lanes ahead of the restored journal"] = {lane[:8]: (disaster.journal_seq_at_recovery[lane], seq)
                                                               for lane, seq in ahead.items()}
        for lane, seq in ahead.items():
            evidence = [f["details"] for f in fences.get(lane, [])]
            if not any(d and d.get("range") and int(d.get("chain_seq") or 0) >= seq for d in evidence):
                out.fail("every lane ahead of the restored journal fenced with evidence",
                         f"lane {lane}: chain {seq}, journal {disaster.journal_seq_at_recovery[lane]}; "
                         f"its lane_fence findings: {evidence}")
        reused = _rows(conn, "SELECT id, entitlement, lane, source_seq, state FROM paygate.lineages "
                             "WHERE id > %s AND source_seq IS NOT NULL ORDER BY id",
                       (disaster.max_lineage_at_recovery,))
        for row in reused:
            consumed = disaster.chain_seq_at_recovery.get(row["lane"])
            if consumed is not None and int(row["source_seq"]) <= consumed:
                out.fail("no lane reused at a sequence the chain had consumed",
                         f"lineage {row}: the chain had consumed {consumed} on its lane at recovery")
        out.counts["lineages built after recovery"] = len(reused)
        out.counts["lane sequences (chain at recovery -> now)"] = {
            lane[:8]: (disaster.chain_seq_at_recovery.get(lane), seq) for lane, seq in chain_seq_now.items()}
    return out


def first_money_ticks(dsn: str, since: Any, *, moved: bool = True) -> dict[str, float | None]:
    """Seconds from `since` (database time) to each money worker's first tick that finished ok and,
    with `moved`, moved something (processed > 0)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = dict(conn.execute("""
            SELECT worker, round(extract(epoch FROM min(finished_at) - %s)::numeric, 1)::float8
            FROM paygate.worker_runs WHERE worker = ANY(%s) AND outcome = 'ok' AND (processed > 0 OR NOT %s)
              AND started_at >= %s GROUP BY worker""", (since, list(MONEY_WORKERS), moved, since)).fetchall())
    return {w: rows.get(w) for w in MONEY_WORKERS}


def outcomes(dsn: str, disaster: Disaster, chain: ChainEnv) -> dict[str, Any]:
    """What became of the units in flight at T (their status now, in the recovered database) and of
    the units the disaster lost (admitted after T: only the lost database knew them), with whether
    their money moved on chain anyway."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        now = unit_statuses(conn)
    report: dict[str, Any] = {}
    for table in UNIT_TABLES:
        report[f"{table} in flight at T -> now"] = dict(Counter(now[table].get(i, "gone")
                                                                for i in disaster.in_flight_at_t[table]))
    events = chain_events(chain, chain.genesis["contracts"]["billing"])
    debited = {bytes(e["value"][1]) for e in events if e["topics"][0] == "charge"}
    credited = {bytes(e["value"][1]) for e in events if e["topics"][0] == "credit"}
    with psycopg.connect(dsn, autocommit=True) as conn:
        known_auth = set(conn.execute("SELECT account, auth_nonce FROM paygate.deposits").fetchall())
    lost_deposits = [d for d in disaster.lost.deposits if (d["account"], d["auth_nonce"]) not in known_auth]
    report["deposits lost (on chain / not)"] = (
        sum(1 for d in lost_deposits if d["deposit_tx"] and bytes(d["deposit_tx"]) in credited),
        sum(1 for d in lost_deposits if not (d["deposit_tx"] and bytes(d["deposit_tx"]) in credited)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        known = {bytes(r[0]) for r in conn.execute("SELECT charge_id FROM paygate.charges")}
    lost_charges = disaster.lost.charge_ids - known
    report["charges lost (debited on chain / not)"] = (len(lost_charges & debited), len(lost_charges - debited))
    report["relays lost"] = len(set(disaster.lost_statuses["relays"]) - set(disaster.known_at_recovery["relays"]))
    return report


def wait_quiet(supervisor: Supervisor, dsn: str, *, limit: float, each: Any = None, checks: int = 3
               ) -> tuple[dict[str, int], float]:
    """Poll the supervisor until the drill's open work is zero `checks` times in a row, or `limit`
    seconds; `each()` runs every round (the operator's step) and returns whether it still makes
    work (not quiet while it does). -> (the open work last seen, seconds)."""
    from tests.chaos.soak import open_work

    started = time.monotonic()
    quiet, open_now = 0, {}
    while quiet < checks and time.monotonic() < started + limit:
        supervisor.poll()
        making = bool(each()) if each is not None else False
        time.sleep(1.5)
        open_now = open_work(dsn, DRILL_OPEN_WORK_SQL)
        quiet = quiet + 1 if not any(open_now.values()) and not making else 0
    return open_now, time.monotonic() - started




def children_cpu() -> float:
    """CPU seconds of this process's children that ended (each worker process, the devnet once
    stopped; not Postgres, which pg_ctl detaches)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# ----- one drill, start to end: load, the disaster (the test's), recovery, the checks ------------------

QUIESCE_LIMIT = 240.0  # under a loaded CI box the pass and the fences take minutes, not seconds
AFTER_LOAD_SECONDS = 8.0
PRE_T_LIMIT = 60.0  # at most this long past half the load's time waiting for money to move


@dataclass
class Drill:
    """The pieces every drill shares, around the disaster the test deals."""

    world: World
    supervisor: Supervisor
    load: LoadGenerator
    seed: int
    operator: OperatorLog = field(default_factory=OperatorLog)
    stats: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0
    cpu_at_start: float = 0.0
    after_load: LoadGenerator | None = None  # the API's admissions once submissions reopened
    after_load_until: float = 0.0

    @classmethod
    def start(cls, world: World, seed: int, rng: Any) -> Drill:
        import random

        supervisor = drill_supervisor(world.chain.environ, world.tmp / "logs", random.Random(rng.random()))
        load = LoadGenerator(world.dsn, AdminLedger(world.devnet.proc, world.devnet.genesis, world.devnet.log_path),
                             random.Random(rng.random()), max_subscriptions=3, weights=dict(DRILL_WEIGHTS))
        drill = cls(world, supervisor, load, seed, cpu_at_start=children_cpu())
        load.start()
        drill.started = time.monotonic()
        return drill

    def run_for(self, seconds: float, until: Any = None, limit: float = 0.0) -> None:
        """Keep the workers running for `seconds`, and on while `until()` is false, at most `limit` more."""
        end = time.monotonic() + seconds
        while time.monotonic() < end or (until is not None and not until() and time.monotonic() < end + limit):
            self.supervisor.poll()
            time.sleep(0.25)

    def load_until_t(self, seconds: float) -> float:
        """Half the load's time, and not before money is moving (a charge settled on chain), so
        deposits, charges and relays are in flight at T whatever the machine's speed. -> T (s)."""
        self.run_for(seconds / 2, until=lambda: money_moved(self.world.dsn), limit=PRE_T_LIMIT)
        return time.monotonic() - self.started

    def operator_step(self, lost: LostDatabase) -> None:
        with psycopg.connect(self.world.dsn, autocommit=True, connect_timeout=5) as conn:
            fences = conn.execute("SELECT count(*) FROM paygate.findings WHERE kind = 'lane_fence' "
                                  "AND resolved_at IS NULL").fetchone()[0]
        if fences:
            explain_and_accept_fences(self.world.chain, self.world.dsn, lost, self.operator,
                                      landed_inner_hashes(self.world.chain))

    def stop_loads(self) -> None:
        for load in (self.load, self.after_load):
            if load is not None:
                load.stop()

    def resumed(self) -> bool:
        """Submissions are open again: no restore halt, no lane fence left open."""
        with psycopg.connect(self.world.dsn, autocommit=True, connect_timeout=5) as conn:
            return not conn.execute("SELECT EXISTS (SELECT 1 FROM paygate.halts WHERE kind = 'restore') OR EXISTS "
                                    "(SELECT 1 FROM paygate.findings WHERE kind = 'lane_fence' AND resolved_at IS NULL)"
                                    ).fetchone()[0]

    def recover(self, disaster: Disaster) -> tuple[Findings, Findings, list[tuple[str, str]]]:
        """Run until quiet (the operator accepting explained fences; once submissions are open
        again, AFTER_LOAD_SECONDS of new admissions, so lineages are built on the accepted lanes),
        stop, the final observer pass, the checks. -> (money, recovery, problems: every violation,
        first the worst)."""
        import random

        def step() -> bool:
            with contextlib.suppress(psycopg.OperationalError):  # no writer yet: the next round
                self.operator_step(disaster.lost)
                if self.after_load is None and self.resumed():
                    self.after_load = LoadGenerator(
                        self.world.dsn, self.load.devnet, random.Random(self.seed + 1), max_subscriptions=0,
                        weights={k: v for k, v in DRILL_WEIGHTS.items() if k != "subscription"}, key_series="a")
                    self.after_load.start()
                    self.after_load_until = time.monotonic() + AFTER_LOAD_SECONDS
            if self.after_load is not None and time.monotonic() >= self.after_load_until:
                self.after_load.stop()
            return self.after_load is None or time.monotonic() < self.after_load_until
        limit = QUIESCE_LIMIT + 0.05 * drill_seconds()  # a longer drill leaves more to finish
        open_now, quiesce_seconds = wait_quiet(self.supervisor, self.world.dsn, limit=limit, each=step)
        self.supervisor.stop()
        observer_code = final_observer(self.world)
        money = check_money(self.world.chain, self.world.dsn, disaster)
        recovery = check_recovery(self.world.dsn, disaster, chain_lane_sequences(self.world.chain))
        self.stats.update({
            "units in flight at T": {k: len(v) for k, v in disaster.in_flight_at_t.items()},
            **outcomes(self.world.dsn, disaster, self.world.chain),
            "quiet after recovery (s)": f"{quiesce_seconds:.0f}",
            "lane fences accepted by the operator (lane: seq)": {k[:8]: v for k, v in self.operator.accepted.items()},
            "lane fences the operator could not explain": self.operator.refused,
            "admitted": dict(self.load.admitted),
            "admitted once submissions reopened": dict(self.after_load.admitted) if self.after_load else None,
            "exit codes per worker (-9 = our SIGKILL)": self.supervisor.histogram(),
        })
        problems = [(v.invariant, v.detail) for v in recovery.violations + money.violations]
        for load in (self.load, self.after_load):
            if load is not None and load.error is not None:
                problems.insert(0, ("the load generator ran without error", repr(load.error)))
        if self.after_load is None:
            problems.append(("submissions reopened after recovery (no restore halt, every fence accepted)",
                             "they never did: no admission after recovery"))
        if self.supervisor.crashes:  # 70, or any code but 0, 1, 3, 69, 75, 143 and our own signals
            problems.insert(0, ("no tick process exited 70 (or any unexpected code)", "\n\n".join(
                f"{w} exited {c}:\n{tail}" for w, c, tail in self.supervisor.crashes[:3])))
        if any(open_now.values()):
            problems.append((f"quiet within {limit:.0f}s of recovery", f"still open: {open_now}"))
        if observer_code != 0:
            problems.append(("the final observer pass succeeds", f"exit {observer_code}"))
        if any(code != 0 for code in self.operator.undrain_codes):
            problems.append(("undrain after an accepted fence succeeds", f"exit codes {self.operator.undrain_codes}"))
        return money, recovery, problems

    def report(self, name: str, *sections: dict[str, Any]) -> str:
        lines = [f"{name}: seed={self.seed} (PAYGATE_SOAK_SEED={self.seed} replays the load's choices); "
                 f"{time.monotonic() - self.started:.0f} s wall, {children_cpu() - self.cpu_at_start:.0f} s CPU "
                 "in the workers and the devnet"]
        for part in (self.stats, *sections):
            lines += [f"  {key:<50} {value}" for key, value in part.items()]
        text = "\n".join(lines)
        print(text, flush=True)
        (self.world.tmp / f"{name.replace(' ', '-')}-report.txt").write_text(text + "\n")
        return text


def raise_problems(name: str, seed: int, problems: list[tuple[str, str]], report: str) -> None:
    if problems:
        others = "; ".join(p for p, _ in problems[1:8])
        raise AssertionError(f"{name} seed={seed}: first violated: {problems[0][0]}\n{problems[0][1]}\n"
                             + (f"(also violated: {others})\n" if others else "") + f"\n{report}")
