"""Automatic failover under a real Patroni pair (tests/support/patroni.py): the workers carry on after
the leader changes, with no operator step.

An etcd and two Patroni-managed PostgreSQL nodes (asynchronous streaming); paygate migrated on the
leader; the money workers in looping `paygate run-tick` processes (tests/chaos/soak.py's supervisor)
on a DSN listing both nodes with target_session_attrs=read-write, the devnet, and a little load
(deposits, then charges on the funded accounts). Once money moves, the leader's postmaster is
SIGKILLed (Patroni itself keeps running: `primary_start_timeout: 0` makes it fail over rather than
restart in place) and Patroni promotes the replica by itself. A probe tick runs in a loop from the
kill on. Asserted:

- every tick in the gap exits 69 "no writer" (no 70 anywhere, the workers' included);
- the first tick that succeeds after the promotion ran on the new leader and names it;
- the promotion's new timeline set the restore halt (audited), and the recovery worker's pass
  cleared it (audited `restore_clear` by `recovery:…`) with no operator step;
- every deposit and charge ends terminal (or needs_human with its reason) and nothing happened
  twice on chain (tests/chaos/invariants.py through dr.check_money), no lane reused a sequence;
- the old leader rejoins as a replica of the new one by itself.

It prints the RTO: kill -> first successful tick, -> first money tick that moved something, ->
restore halt cleared. `make test` runs it with PAYGATE_DRILL_SECONDS (default 8) of load, half
before the kill; `make soak SCENARIO=patroni DURATION=10m` runs it longer. PAYGATE_SOAK_SEED=N
replays the load's choices."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import subprocess
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import psycopg
import pytest

from paygate_cli.settings import parse_duration
from tests.chaos.dr import (
    Disaster,
    Drill,
    LostDatabase,
    chain_lane_sequences,
    check_money,
    check_recovery,
    children_cpu,
    first_money_ticks,
    raise_problems,
    unit_statuses,
    wait_quiet,
)
from tests.chaos.invariants import _rows
from tests.chaos.soak import AdminLedger, LoadGenerator, Supervisor, soak_seed, world_on
from tests.support.chain_env import ChainEnv
from tests.support.cli import paygate_cmd, run_proc
from tests.support.patroni import PatroniPair

DEFAULT_SECONDS = 8.0
# Money in and out, and the worker whose pass lifts the restore halt; nothing else, to stay cheap.
PLAN: list[tuple[str, int, str]] = [
    ("funding", 1, "0.5s"), ("settlement", 1, "0.5s"), ("observer", 1, "0.5s"), ("recovery", 1, "1s"),
]
WEIGHTS = {"deposit": 2, "charge": 5}
# The probe: a worker the plan does not run (no lock to share), with no RPC of its own.
PROBE_WORKER = "idempotency_sweep"
PROBE_PAUSE = 0.25  # between probes: a scheduler's retry, and CPU left to the failover itself
GAP_LIMIT = 45.0  # Patroni fails over within a few loop_waits; this is the bug's bound, not the plan
QUIESCE_LIMIT = 90.0


def load_seconds() -> float:
    return parse_duration(os.environ.get("PAYGATE_DRILL_SECONDS") or DEFAULT_SECONDS, name="PAYGATE_DRILL_SECONDS")


@dataclass
class Probe:
    started: float  # monotonic
    ended: float
    code: int
    out: str
    err: str

    def last_msgid(self) -> str | None:
        for line in reversed(self.err.strip().splitlines()):
            if line.startswith("{"):
                return str(json.loads(line).get("msgid"))
        return None

    def database(self) -> dict[str, Any]:
        return dict(json.loads(self.out)["run_tick"]["database"])


def probe_until_ok(supervisor: Supervisor, environ: dict[str, str], limit: float) -> list[Probe]:
    """Probe ticks one after another until one succeeds (or `limit` s), the supervisor kept polled
    meanwhile (cron goes on restarting the workers)."""
    probes: list[Probe] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        started = time.monotonic()
        proc = subprocess.Popen(paygate_cmd("--log-format", "json", "run-tick", PROBE_WORKER, "--once", "--json"),
                                env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        while proc.poll() is None:
            supervisor.poll()
            time.sleep(0.05)
        out, err = proc.communicate()
        probes.append(Probe(started, time.monotonic(), proc.returncode, out, err))
        if proc.returncode == 0:
            break
        time.sleep(PROBE_PAUSE)
    return probes


def journal_known_seq(conn: psycopg.Connection) -> dict[str, int | None]:
    """Each lane's highest sequence the journal knows of in any state (a live lineage's too) or has
    accepted: the chain beyond it is a transaction of ours whose commit the failover lost."""
    rows = conn.execute("""
        SELECT l.address, greatest((SELECT max(x.source_seq) FROM paygate.lineages x WHERE x.lane = l.address),
                                   l.accepted_seq)
        FROM paygate.lanes l""").fetchall()
    return {lane: (None if seq is None else int(seq)) for lane, seq in rows}


def failover_disaster(dsn: str, chain: ChainEnv, promoted_mono: float) -> Disaster:
    """The drill's Disaster, read on the new leader right after the promotion: nothing known lost
    (the old leader's unstreamed commits are gone with its rewind; the chain tells if one mattered),
    the journal's lanes against the chain. Only the fields Disaster declares are passed: the record
    is shared with the other drills and grows with them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        known: dict[str, Any] = {
            "lost": LostDatabase(), "lost_statuses": {}, "in_flight_at_t": {},
            "known_at_recovery": unit_statuses(conn),
            "journal_seq_at_recovery": journal_known_seq(conn),
            "chain_seq_at_recovery": chain_lane_sequences(chain),
            "max_lineage_at_recovery": int(conn.execute(
                "SELECT coalesce(max(id), 0) FROM paygate.lineages").fetchone()[0]),
            "recovered_at": conn.execute("SELECT clock_timestamp()").fetchone()[0],
            "recovered_monotonic": promoted_mono,
        }
    return Disaster(**{name: value for name, value in known.items() if name in {f.name for f in fields(Disaster)}})


def wait_identity_on(node_dsn: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(node_dsn, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM paygate.db_identity").fetchone() != (1,):
            assert time.monotonic() < deadline, "the replica never received the recorded database identity"
            time.sleep(0.1)


def seconds_since(since: dt.datetime, at: dt.datetime | None) -> float | None:
    return None if at is None else round((at - since).total_seconds(), 1)


@pytest.mark.soak
@pytest.mark.slow
def test_patroni_promotes_the_replica_after_a_leader_kill_and_the_workers_carry_on(tmp_path: Path) -> None:
    seconds, seed = load_seconds(), soak_seed()
    print(f"\npatroni failover drill: seed={seed} load={seconds:.0f}s (PAYGATE_SOAK_SEED={seed} replays it)",
          flush=True)
    rng = random.Random(seed)
    began = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - began, 1)

    with PatroniPair() as pair:
        phase("patroni pair up")
        dsn = pair.multihost_dsn("paygate", connect_timeout=2)
        world = world_on(tmp_path, dsn)
        world.chain.environ["PAYGATE_CONNECT_TIMEOUT"] = "2s"
        supervisor = Supervisor(world.chain.environ, tmp_path / "logs", random.Random(rng.random()), plan=list(PLAN))
        load = LoadGenerator(dsn, AdminLedger(world.devnet.proc, world.devnet.genesis, world.devnet.log_path),
                             random.Random(rng.random()), weights=dict(WEIGHTS))
        drill = Drill(world, supervisor, load, seed, cpu_at_start=children_cpu())
        load.start()
        drill.started = time.monotonic()
        phase("devnet and load up")
        try:
            # Half the load's time, and not before a charge has settled: money is in flight at the kill.
            drill.load_until_t(seconds)
            old_leader = pair.leader()
            assert old_leader is not None, "no leader before the kill"
            replica = pair.wait_streaming()
            # The gate compares with the identity the first tick recorded (a relaxed commit): the
            # replica must have it, or the promoted one records its own and no halt is due.
            wait_identity_on(pair.node_dsn(replica, "paygate"))
            phase("kill")
            kill_at = dt.datetime.now(dt.UTC)
            killed_mono = time.monotonic()
            pair.kill_postmaster(old_leader)  # the disaster: the leader's PostgreSQL dies, no shutdown

            probes = probe_until_ok(supervisor, world.chain.environ, GAP_LIMIT)
            promoted_mono = probes[-1].ended
            phase("first successful tick")
            new_leader = pair.leader()
            disaster = failover_disaster(dsn, world.chain, promoted_mono)

            drill.run_for(seconds / 2)  # the load goes on against the new leader
            load.stop()
            open_now, quiet_seconds = wait_quiet(supervisor, dsn, limit=QUIESCE_LIMIT)
            phase("quiet")
            rejoined = pair.wait_streaming()
            phase("old leader streaming")
            supervisor.stop()
            # One more observer pass (soak.final_observer), its stderr kept for the report.
            observer = run_proc("run-tick", "observer", "--once", environ=world.chain.environ, timeout=120)
            money = check_money(world.chain, dsn, disaster)
            recovery = check_recovery(dsn, disaster, chain_lane_sequences(world.chain))
            with psycopg.connect(dsn, autocommit=True) as conn:
                halts = _rows(conn, "SELECT actor, at, details FROM paygate.audit_log WHERE action = 'restore_halt' "
                                    "ORDER BY id")
                clears = _rows(conn, "SELECT actor, at FROM paygate.audit_log WHERE action = 'restore_clear' "
                                     "ORDER BY id")
                audited = _rows(conn, "SELECT actor, action FROM paygate.audit_log WHERE at >= %s ORDER BY id",
                                (kill_at,))
                fences = _rows(conn, "SELECT subject, details FROM paygate.findings WHERE kind = 'lane_fence'")
            money_ticks = first_money_ticks(dsn, kill_at)
            phase("checked")
        finally:
            load.stop()
            supervisor.kill_all()
            world.close()
    phase("torn down")

    gap = [p for p in probes if p.code != 0]
    gap_worker_codes = sorted({code for _w, code, end in supervisor.runs if killed_mono <= end <= promoted_mono})
    drill.stats.update({
        "failover: killed leader -> promoted": f"{old_leader.name} -> {new_leader.name if new_leader else None}",
        "probe ticks in the gap (exit codes)": [p.code for p in gap],
        "worker exits in the gap (codes)": gap_worker_codes,
        "RTO: kill -> first successful tick (s)": round(promoted_mono - killed_mono, 1),
        "RTO: kill -> first money tick that moved something (s)": {
            w: (None if s is None else round(s, 1)) for w, s in money_ticks.items()},
        "RTO: kill -> restore halt cleared (s)": seconds_since(kill_at, clears[0]["at"] if clears else None),
        "quiet after the promotion (s)": f"{quiet_seconds:.0f}",
        "old leader rejoined as a replica": rejoined.name,
        "audited after the kill (actor, action)": sorted({(a["actor"], a["action"]) for a in audited}),
        "admitted": dict(load.admitted),
        "exit codes per worker": supervisor.histogram(),
        "phases (s since start)": phases,
    })
    text = drill.report("patroni failover drill", money.counts, recovery.counts)

    problems = [(v.invariant, v.detail) for v in recovery.violations + money.violations]
    if fences:  # what asynchronous replication can cost (docs/configuration.md "What a failover can lose")
        problems.insert(0, ("the failover lost no anchor of a transaction that landed", "lanes fenced ahead of the "
                            f"journal: the replica lacked an acknowledged commit (asynchronous): {fences}"))
    if load.error is not None:
        problems.insert(0, ("the load generator ran without error", repr(load.error)))
    if supervisor.crashes:  # 70, or any code but 0, 1, 69, 75, 143 and our own signals
        problems.insert(0, ("no tick process exited 70 (or any unexpected code)", "\n\n".join(
            f"{w} exited {c}:\n{tail}" for w, c, tail in supervisor.crashes[:3])))
    if any(open_now.values()):
        problems.append((f"quiet within {QUIESCE_LIMIT:.0f}s of the promotion", f"still open: {open_now}"))
    if observer.code != 0:
        problems.append(("the final observer pass succeeds", f"exit {observer.code}: {observer.err[-2000:]}"))
    raise_problems("patroni failover drill", seed, problems, text)

    # The gap: no writer, said as such; a crash (70) is not an answer.
    assert probes[-1].code == 0, f"no tick succeeded within {GAP_LIMIT:.0f}s of the kill\n{text}"
    # No writer (the replica answers read-only) or, while a node restarts, no answer at all: 69 both.
    assert all(p.code == 69 and p.last_msgid() in ("db.no_writer", "db.unavailable") for p in gap), \
        [(p.code, p.last_msgid(), p.err[-500:]) for p in gap]
    assert gap or 69 in gap_worker_codes, f"no tick saw the gap (none exited 69 between kill and promotion)\n{text}"
    assert 70 not in gap_worker_codes
    # The first tick after the promotion ran on the new leader, and says which one it reached.
    assert new_leader is not None and new_leader is not old_leader
    reached = probes[-1].database()
    assert (reached["host"], reached["port"], reached["writer"], reached["in_recovery"]) == (
        new_leader.socket_dir, str(new_leader.pg_port), True, False), reached
    # The restore gate: the promotion's timeline set the halt, the recovery worker's pass lifted it,
    # and nobody else acted: no operator step.
    assert halts, f"no restore halt after the promotion\n{text}"
    recorded, now = halts[0]["details"]["recorded"], halts[0]["details"]["now"]
    assert now["timeline"] > recorded["timeline"] and now["database_oid"] == recorded["database_oid"], halts[0]
    assert "timeline" in halts[0]["details"]["reason"]
    assert clears and all(c["actor"].startswith("recovery:") for c in clears), clears
    operator_steps = [a for a in audited if a["action"] != "restore_halt" and not a["actor"].startswith("recovery:")]
    assert operator_steps == [], f"an operator step after the kill: {operator_steps}"
    # Patroni rejoined the old leader as a replica of the new one, by itself.
    assert rejoined is old_leader
    assert any(s is not None for s in money_ticks.values()), f"no money tick moved anything after the kill\n{text}"
