"""The gas monitor against a real devnet: the fee account drained on chain crosses warning ->
critical (durable gas halt, admission refused with the gas reason) -> resume only at or above the
resume floor; the operator's own halt is never touched; open relay reservations count."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import Asset, Keypair, TransactionBuilder

from paygate_cli.journal import lineage as lineages
from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.cli import run_cli
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.relay_admission import admit as admit_relay
from tests.support.relay_admission import allowed as allowed

XLM = 10_000_000


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=2)
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))


def drain_fee_account(chain: ChainEnv, xlm: int) -> None:
    """A classic payment out of the fee account, on chain (the devnet applies it at the next close)."""
    g = chain.genesis
    fee = Keypair.from_secret(g["fee_account"]["secret"])
    with chain.server() as server:
        tx = (TransactionBuilder(server.load_account(fee.public_key), g["passphrase"], base_fee=100)
              .append_payment_op(g["users"][1]["public"], Asset.native(), str(xlm)).set_timeout(300).build())
        tx.sign(fee)
        assert server.send_transaction(tx).status.value == "PENDING"
    chain.devnet.close_ledger()


def gas_tick(chain: ChainEnv) -> dict:
    result = chain.tick("gas")
    assert result.code == 0, result.err
    return json.loads(result.out)["run_tick"]["last_details"]


def halts(db: psycopg.Connection) -> dict[str, str]:
    return dict(db.execute("SELECT kind, reason FROM paygate.halts").fetchall())


def gas_events(db: psycopg.Connection) -> list[str]:
    return [r[0] for r in db.execute("SELECT event_type FROM paygate.webhook_outbox WHERE event_type LIKE 'gas.%' "
                                     "ORDER BY id")]


CHARGED = "GCQ2DINBUGQ2DINBUGQ2DINBUGQ2DINBUGQ2DINBUGQ2DINBUGQ2DJX7"  # a valid StrKey (admission checks the checksum)


def admit_charge(db: psycopg.Connection, key: str) -> None:
    db.execute("SELECT * FROM paygate.admit_charge(%s, 1, %s)", (CHARGED, key))


def test_drained_fee_account_halts_admission_and_resumes_only_above_the_resume_floor(
        chain: ChainEnv, allowed: psycopg.Connection) -> None:
    db = allowed
    db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 100)", (CHARGED,))
    first = gas_tick(chain)
    assert first["level"] == "ok" and first["halted"] is False and first["reserved_fees"] == 0
    h0 = first["headroom"]
    assert h0 == first["balance"] - first["reserve"]
    # Floors relative to what the devnet's fee account holds: warning 10, resume 20, critical 30 XLM below.
    db.execute("UPDATE paygate.relay_config SET gas_warning_floor = %s, gas_resume_floor = %s, "
               "gas_critical_floor = %s", (h0 - 10 * XLM, h0 - 20 * XLM, h0 - 30 * XLM))

    # An open relay reservation is liability: it lowers the headroom by exactly its amount.
    admit_relay(db, "r1", max_fee=2 * XLM)
    assert gas_tick(chain)["headroom"] == h0 - 2 * XLM
    db.execute("SELECT paygate.release_relay_fee(1, 'test')")

    drain_fee_account(chain, 15)
    warn = gas_tick(chain)
    assert warn["level"] == "warning" and warn["halted"] is False and halts(db) == {}
    assert warn["headroom"] < h0 - 15 * XLM
    admit_charge(db, "c1")  # a warning alerts; it does not close admission

    db.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('operator', 'maintenance', 'alice')")
    drain_fee_account(chain, 20)
    crit = gas_tick(chain)
    assert crit["level"] == "critical" and crit["halted"] is True and crit["action"] == "halt"
    assert "below the critical floor" in halts(db)["gas"]
    db.execute("DELETE FROM paygate.halts WHERE kind = 'operator'")  # the operator resumes; gas still halts
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="gas: fee account headroom"):
        admit_charge(db, "c2")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="gas: fee account headroom"):
        admit_relay(db, "r2")
    assert gas_tick(chain)["action"] is None  # still critical: the halt is written once

    chain.devnet.fund(chain.genesis["fee_account"]["public"], xlm=10 * XLM)  # above critical, below resume
    between = gas_tick(chain)
    assert between["level"] == "warning" and between["halted"] is True and between["action"] is None
    assert "gas" in halts(db)

    db.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('operator', 'still looking', 'alice')")
    chain.devnet.fund(chain.genesis["fee_account"]["public"], xlm=10 * XLM)  # at/above the resume floor
    resumed = gas_tick(chain)
    assert resumed["headroom"] >= h0 - 20 * XLM
    assert resumed["halted"] is False and resumed["action"] == "resume"
    assert halts(db) == {"operator": "still looking"}  # the operator's halt is theirs
    db.execute("DELETE FROM paygate.halts WHERE kind = 'operator'")
    admit_charge(db, "c3")

    assert gas_events(db) == ["gas.warning", "gas.halted", "gas.critical", "gas.warning", "gas.resumed"]
    audit = [r[0] for r in db.execute("SELECT action FROM paygate.audit_log WHERE actor = 'gas-monitor' ORDER BY id")]
    assert audit == ["gas.halt", "gas.resume"]
    state = db.execute("SELECT level, halted, headroom FROM paygate.gas_state").fetchone()
    assert state == ("warning", False, resumed["headroom"])


def test_lanes_below_their_minimum_are_reported(chain: ChainEnv, db: psycopg.Connection) -> None:
    lanes = [lane["public"] for lane in chain.genesis["lanes"][:2]]
    # The lanes the signing workers register (Engine.for_tick syncs them from the seeds); the gas
    # monitor reads them from there, with no seed of its own.
    lineages.sync_lanes(db, lanes)
    first = gas_tick(chain)
    assert first["low_lanes"] == []
    db.execute("UPDATE paygate.relay_config SET lane_min_balance = 10000000000000")
    reported = gas_tick(chain)
    assert sorted(lane["lane"] for lane in reported["low_lanes"]) == sorted(lanes)
    assert reported["halted"] is False  # a low lane is reported, it does not halt admission


def test_relay_worker_keeps_broadcasting_under_the_gas_halt(chain: ChainEnv, db: psycopg.Connection) -> None:
    """Rows holding signed authorisations and reserved fees are committed liability: the gas halt
    closes admission, never the relay worker (draining them is what restores headroom)."""
    from tests.support.relay_support import admit_relay as admit_market_relay
    from tests.support.relay_support import allow_market, relay_rows

    allow_market(db, chain.genesis["contracts"]["market"])
    users = chain.genesis["users"]
    queued = admit_market_relay(db, chain.devnet, users[0], "before-halt")
    db.execute("UPDATE paygate.relay_config SET gas_critical_floor = 10000000000000000, "
               "gas_warning_floor = 10000000000000000, gas_resume_floor = 20000000000000000")
    assert gas_tick(chain)["halted"] is True
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="gas"):
        admit_market_relay(db, chain.devnet, users[1], "during-halt")
    for _ in range(6):
        assert chain.tick("relay").code == 0
        if relay_rows(db)[queued]["status"] != "queued":
            break
        chain.devnet.close_ledger()
    assert relay_rows(db)[queued]["status"] == "applied"
    assert "gas" in halts(db)  # still halted: the relay went out under it


def test_gas_watches_by_address_and_holds_no_seed(chain: ChainEnv, db: psycopg.Connection) -> None:
    """Least privilege: the fee account's public address is all the monitor needs; no seed file."""
    fee = chain.genesis["fee_account"]["public"]
    lane = chain.genesis["lanes"][0]["public"]
    lineages.sync_lanes(db, [lane])
    db.execute("UPDATE paygate.relay_config SET lane_min_balance = 10000000000000")
    environ = {k: v for k, v in chain.environ.items()
               if k not in ("PAYGATE_FEE_SECRET_FILE", "PAYGATE_LANE_SECRETS_FILE")}
    result = run_cli("run-tick", "gas", "--json", environ={**environ, "PAYGATE_FEE_ACCOUNT": fee})
    assert result.code == 0, result.err
    details = json.loads(result.out)["run_tick"]["last_details"]
    assert details["fee_account"] == fee and details["balance"] > 0
    assert [low["lane"] for low in details["low_lanes"]] == [lane]
    # Neither the address nor the seed: refused before the first tick, naming the setting.
    bare = run_cli("run-tick", "gas", "--json", environ=environ)
    assert bare.code == 78 and "PAYGATE_FEE_ACCOUNT" in bare.err, bare.err


def test_a_fee_account_that_is_not_the_fee_seeds_account_is_refused(chain: ChainEnv) -> None:
    """Two places name the fee account; the signer (built by every signing worker once a tick has
    chain work) refuses them when they disagree: the gas monitor would watch an account that pays
    nothing while the real one runs dry."""
    from paygate_cli.chain.keys import Signer
    from paygate_cli.errors import ConfigError, ExitCode
    from paygate_cli.settings import load_settings

    other = chain.genesis["users"][0]["public"]
    with pytest.raises(ConfigError, match="PAYGATE_FEE_ACCOUNT") as refused:
        Signer.from_settings(load_settings({**chain.environ, "PAYGATE_FEE_ACCOUNT": other}))
    assert refused.value.exit_code == ExitCode.CONFIG
    fee = chain.genesis["fee_account"]["public"]
    signer = Signer.from_settings(load_settings({**chain.environ, "PAYGATE_FEE_ACCOUNT": fee}))
    assert signer.fee.public_key == fee
