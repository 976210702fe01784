"""The gas monitor's headroom counts what in-flight lineages could still be charged at their cap
(docs/workers.md "Gas headroom"): balance - reserve - open relay reservations - sum(cap_rate x fee_ops
+ resource_fee) over the live signed lineages whose fee no open reservation already holds. Against a
real devnet (the fee account's balance on chain), lineages planted as the engine journals them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import Keypair

from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.cli import run_cli
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.relay_admission import admit as admit_relay
from tests.support.relay_admission import allowed as allowed

XLM = 10_000_000
CAP = 100_000  # PAYGATE_MAX_INCLUSION_FEE's default: what a lineage without fee columns counts at, x 2 ops


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path_factory.mktemp("devnet"), lanes=1, users=1)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))


def gas_tick(chain: ChainEnv, **extra: str) -> dict:
    result = chain.tick("gas", **extra)
    assert result.code == 0, result.err
    return json.loads(result.out)["run_tick"]["last_details"]


def plant(db: psycopg.Connection, purpose: str, entitlement: str, *, state: str = "sent", cap: int | None = None,
          fee_ops: int | None = None, resource_fee: int | None = None) -> int:
    """A lineage on a lane of its own, with the fee columns the engine journals (None: signed
    before the fee market had them)."""
    lane = Keypair.random().public_key
    db.execute("INSERT INTO paygate.lanes (address) VALUES (%s)", (lane,))
    signed = state != "allocated"
    return int(db.execute(
        "INSERT INTO paygate.lineages (purpose, entitlement, lane, state, source_seq, key_id, envelope, inner_hash,"
        " outer_hash, max_time, signed_at_ledger, bid_rate, bid_ledger, fee_ops, resource_fee, cap_rate)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
        (purpose, entitlement, lane, state, 7 if signed else None, "k1" if signed else None,
         b"\x01" * 40 if signed else None, os.urandom(32) if signed else None, os.urandom(32) if signed else None,
         2_000_000_000 if signed else None, 10 if signed else None, 200 if cap and signed else None,
         10 if cap and signed else None, fee_ops, resource_fee, cap)).fetchone()[0])


def resolve(db: psycopg.Connection, lineage: int) -> None:
    db.execute("UPDATE paygate.lineages SET state = 'expired', resolution = 'test', resolved_at = now() "
               "WHERE id = %s", (lineage,))


def test_live_lineages_count_at_their_cap_and_relays_once_in_their_reservation(
        chain: ChainEnv, allowed: psycopg.Connection, dsn: str) -> None:
    db = allowed
    h0 = gas_tick(chain)["headroom"]

    plant(db, "deposit", "deposit:1:deposit", cap=CAP, fee_ops=2, resource_fee=80_000)  # 280,000
    plant(db, "charge_batch", "charge_batch:t1", state="signed", cap=30_000, fee_ops=2, resource_fee=1_000_000)
    plant(db, "relay", "bot_job:9", cap=50_000, fee_ops=2, resource_fee=10_000)  # a bot job: no reservation
    plant(db, "credit", "deposit:2:credit")  # before the fee market: max_inclusion_fee x 2 ops, no resource fee
    plant(db, "deposit", "deposit:3:deposit", state="allocated", cap=CAP, fee_ops=2, resource_fee=80_000)  # unsigned
    resolve(db, plant(db, "deposit", "deposit:4:deposit", cap=CAP, fee_ops=2, resource_fee=80_000))  # terminal
    relay_id = admit_relay(db, "r1", max_fee=2 * XLM)[0]
    plant(db, "relay", f"relay:{relay_id}", cap=900_000, fee_ops=2, resource_fee=200_000)  # inside its reservation
    closed = admit_relay(db, "r2", max_fee=XLM)[0]
    db.execute("SELECT paygate.release_relay_fee(%s, 'test')", (closed,))
    plant(db, "relay", f"relay:{closed}", cap=4_000, fee_ops=2, resource_fee=2_000)  # reservation closed: counted

    committed = (280_000 + (30_000 * 2 + 1_000_000) + (50_000 * 2 + 10_000) + CAP * 2 + (4_000 * 2 + 2_000))
    details = gas_tick(chain)
    assert details["committed_fees"] == committed and details["committed_lineages"] == 5
    assert details["reserved_fees"] == 2 * XLM
    assert details["headroom"] == h0 - 2 * XLM - committed
    state = db.execute("SELECT reserved_fees, committed_fees, headroom FROM paygate.gas_state").fetchone()
    assert state == (2 * XLM, committed, h0 - 2 * XLM - committed)

    # A higher PAYGATE_MAX_INCLUSION_FEE raises what the lineage without fee columns counts at.
    assert gas_tick(chain, PAYGATE_MAX_INCLUSION_FEE="400000")["committed_fees"] == committed + (400_000 - CAP) * 2

    report = json.loads(run_cli("status", "--json", dsn=dsn).out)["status"]
    assert report["gas"]["committed_fees"] == committed + (400_000 - CAP) * 2
    line = next(line for line in run_cli("status", dsn=dsn).out.splitlines() if line.startswith("│ gas "))
    assert f"committed by in-flight lineages at their cap {committed + 600_000} stroops (" in line


def test_committed_fees_set_the_halt_and_it_clears_only_at_the_resume_floor(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    h0 = gas_tick(chain)["headroom"]
    db.execute("UPDATE paygate.relay_config SET gas_warning_floor = %s, gas_critical_floor = %s, "
               "gas_resume_floor = %s", (h0 - 100_000, h0 - 200_000, h0 - 50_000))
    a = plant(db, "deposit", "deposit:1:deposit", cap=50_000, fee_ops=2, resource_fee=20_000)  # 120,000
    b = plant(db, "charge_batch", "charge_batch:t1")  # 200,000 at the default cap

    crit = gas_tick(chain)
    assert crit["headroom"] == h0 - 320_000
    assert crit["level"] == "critical" and crit["halted"] is True and crit["action"] == "halt"
    assert db.execute("SELECT count(*) FROM paygate.halts WHERE kind = 'gas'").fetchone()[0] == 1

    resolve(db, b)  # above critical, below resume: the halt stays (hysteresis)
    between = gas_tick(chain)
    assert between["headroom"] == h0 - 120_000
    assert between["level"] == "warning" and between["halted"] is True and between["action"] is None

    resolve(db, a)
    resumed = gas_tick(chain)
    assert resumed["headroom"] == h0 and resumed["committed_fees"] == 0
    assert resumed["level"] == "ok" and resumed["halted"] is False and resumed["action"] == "resume"
    assert db.execute("SELECT count(*) FROM paygate.halts WHERE kind = 'gas'").fetchone()[0] == 0
