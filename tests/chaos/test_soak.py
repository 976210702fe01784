"""a chaos soak. Every worker running in looping processes, a load generator admitting
deposits, one-off charges, subscriptions, relays and bot jobs, a loopback webhook receiver; random
SIGKILLs every few seconds, every devnet fault switched on and off at random (competing fee-market
surges among them, on a devnet whose ledgers hold only as many Soroban transactions as paygate has
lanes, with a fee cap that some surges exceed), one Postgres restart and one devnet restart (from its
state file) mid-run, and entries that live a few hundred ledgers, so the TTL keeper really extends.
Then quiescence and the question users ask:
did every unit of money end exactly once?

`make test` runs it for PAYGATE_SOAK_SECONDS (default 150: chaos, then quiesce); `make soak
DURATION=30m` runs the same test longer. The seed is printed; PAYGATE_SOAK_SEED=N replays its
choices (kills, faults, admissions; the OS still interleaves the processes)."""

from __future__ import annotations

import random
import resource
import time
from pathlib import Path

import pytest

from tests.chaos.invariants import Findings, check_all
from tests.chaos.soak import (
    FAULT_KINDS,
    AdminLedger,
    FaultMonkey,
    FeeWatch,
    LoadGenerator,
    Supervisor,
    build_world,
    final_observer,
    in_flight,
    log_msgids,
    open_work,
    soak_seconds,
    soak_seed,
)
from tests.support.devnet_support import DevnetHandle

pytestmark = [pytest.mark.soak, pytest.mark.slow]

QUIET_CHECKS = 3  # consecutive polls with no open work


def _report(seed: int, seconds: float, stats: dict, findings: Findings, supervisor: Supervisor) -> str:
    lines = [f"chaos soak: seed={seed} duration={seconds:.0f}s (replay: PAYGATE_SOAK_SEED={seed})"]
    for key, value in stats.items():
        lines.append(f"  {key:<34} {value}")
    lines.append("  units of money and their end states:")
    for key, value in findings.counts.items():
        lines.append(f"    {key:<32} {value}")
    lines.append("  exit codes per worker (-9 = our SIGKILL):")
    for worker, codes in supervisor.histogram().items():
        lines.append(f"    {worker:<32} {dict(sorted(codes.items()))}")
    return "\n".join(lines)


def _clear_faults(devnet: DevnetHandle) -> None:
    for _ in range(30):
        try:
            devnet.clear_faults()
            return
        except OSError:  # mid-restart
            time.sleep(1)
    devnet.clear_faults()


def test_every_unit_of_money_ends_exactly_once_under_chaos(tmp_path: Path) -> None:
    seconds, seed = soak_seconds(), soak_seed()
    print(f"\nchaos soak: seed={seed} duration={seconds:.0f}s (PAYGATE_SOAK_SEED={seed} replays it)", flush=True)
    chaos_seconds = max(60.0, seconds - 45.0)
    quiesce_limit = 180.0 + seconds * 0.05
    rng = random.Random(seed)
    world = build_world(tmp_path)
    supervisor = Supervisor(world.chain.environ, tmp_path / "logs", random.Random(rng.random()))
    # Eleven fault kinds at about 4 s each fill a 60 s chaos phase: a shorter phase deals them faster.
    faults = FaultMonkey(random.Random(rng.random()), pace=min(1.0, chaos_seconds / 80),
                         surge_ready=lambda: in_flight(world.dsn))
    load = LoadGenerator(world.dsn, AdminLedger(world.devnet.proc, world.devnet.genesis, world.devnet.log_path),
                         random.Random(rng.random()))
    fees = FeeWatch(world.dsn)
    stats: dict = {}
    try:
        load.start()
        fees.start()
        started = time.monotonic()
        next_kill = started + rng.uniform(2, 4)
        next_fault = started + rng.uniform(1, 3)
        pg_restart_at = started + chaos_seconds * rng.uniform(0.3, 0.4)
        devnet_restart_at = started + chaos_seconds * rng.uniform(0.6, 0.7)
        while (now := time.monotonic()) < started + chaos_seconds:
            supervisor.poll()
            if now >= next_kill:
                supervisor.kill_random()
                next_kill = now + rng.uniform(1.5, 4.0)
            if now >= next_fault:
                faults.toggle(world.devnet)
                next_fault = now + faults.next_toggle_in()  # on, then off
            if not world.pg_restarts and now >= pg_restart_at:
                world.restart_postgres(rng.uniform(1.0, 3.0))
            if not world.devnet_restarts and now >= devnet_restart_at:
                world.restart_devnet(rng.uniform(0.5, 2.0))
                faults.active = False  # a restarted node starts with no faults
            time.sleep(0.25)
        chaos_ended = time.monotonic()
        # Quiesce: no more faults, kills or admissions; subscriptions (the one worker that makes new
        # work on its own) stop first, then every other worker runs until nothing is open.
        load.stop()
        _clear_faults(world.devnet)
        supervisor.stop({"subscriptions"})
        quiet, open_now = 0, {}
        while quiet < QUIET_CHECKS and time.monotonic() < chaos_ended + quiesce_limit:
            supervisor.poll()
            time.sleep(2)
            open_now = open_work(world.dsn)
            quiet = quiet + 1 if not any(open_now.values()) else 0
        quiesce_seconds = time.monotonic() - chaos_ended
        supervisor.stop()
        fees.stop()
        observer_code = final_observer(world)
        findings = check_all(world.chain, world.dsn, world.receiver)
    finally:
        load.stop()
        fees.stop_event.set()
        supervisor.kill_all()
        world.close()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    stats.update({
        "chaos / quiesce seconds": f"{chaos_ended - started:.0f} / {quiesce_seconds:.0f} (wall, under load)",
        "CPU of the workers and the devnet": f"{children.ru_utime + children.ru_stime:.0f} s",
        "processes started": supervisor.spawned,
        "SIGKILLs sent / seen": f"{supervisor.kills} / {supervisor.kills_confirmed}",
        "faults set": dict(sorted(faults.set_counts.items())),
        "fault clears": faults.clears,
        "surges dealt (rate/op, phantoms, ledgers)": [(s["rate"], s["txs"], s["ledgers"]) for s in faults.surges],
        "replacement envelopes journaled": fees.replacements,
        "lineages ever fee-capped": f"{len(fees.capped)} (sampled {fees.samples}x)",
        "fee market log lines (msgid)": log_msgids(tmp_path / "logs", "fees."),
        "postgres / devnet restarts": f"{world.pg_restarts} / {world.devnet_restarts}",
        "admitted": dict(load.admitted),
        "refused at admission": dict(load.refused),
        "admission while a dependency was down": dict(load.unavailable),
    })
    report = _report(seed, seconds, stats, findings, supervisor)
    print(report, flush=True)
    (tmp_path / "soak-report.txt").write_text(report + "\n")

    # Every problem, in order of importance; the first is reported with its evidence, the rest named.
    problems: list[tuple[str, str]] = []
    if load.error is not None:
        problems.append(("the load generator ran without error", repr(load.error)))
    if supervisor.crashes:  # no process ever crashed (70), nor exited in any other unexpected way
        problems.append(("no process ever exited 70 (or any unexpected code)",
                         "\n\n".join(f"{w} exited {c}:\n{tail}" for w, c, tail in supervisor.crashes[:3])))
    if any(open_now.values()):
        problems.append((f"quiescence within {quiesce_limit:.0f}s", f"still open: {open_now}"))
    if observer_code != 0:
        problems.append(("the final observer pass succeeds", f"exit {observer_code}"))
    problems += [(v.invariant, v.detail) for v in findings.violations]
    if problems:
        others = "; ".join(name for name, _ in problems[1:8])
        raise AssertionError(f"soak seed={seed}: first violated invariant: {problems[0][0]}\n{problems[0][1]}\n"
                             + (f"(also violated: {others})\n" if others else "") + f"\n{report}")

    def check(ok: bool, invariant: str) -> None:
        assert ok, f"soak seed={seed}: the chaos did not happen as it must: {invariant}\n\n{report}"

    # The soak was a soak: chaos really happened and money really flowed to every end it should reach.
    check(supervisor.kills > 0 and supervisor.kills_confirmed > 0, "workers were really SIGKILLed")
    check(set(faults.set_counts) == set(FAULT_KINDS) and faults.clears > 0,
          "every devnet fault was switched on, and faults were switched off")
    check(world.pg_restarts == 1 and world.devnet_restarts == 1, "Postgres and the devnet each restarted once")
    counts = findings.counts
    check(counts["deposits"].get("settled", 0) > 0, "deposits settled")
    check(counts["charges"].get("settled", 0) > 0, "charges settled")
    check(counts["subscription charges"].get("settled", 0) > 0, "subscription periods charged")
    check(counts["relays"].get("applied", 0) > 0, "relays applied")
    check(counts["bot_jobs"].get("applied", 0) > 0, "bot jobs applied")
    check(counts["webhook_outbox"].get("delivered", 0) > 0, "webhooks delivered")
    check(faults.set_counts["surge"] > 0, "a fee-market surge was dealt")
    check(fees.replacements > 0, "a starving lineage got a replacement fee bump")
    check(counts["ttl jobs applied"].get("extend", 0) > 0, "the TTL keeper extended kept entries")
