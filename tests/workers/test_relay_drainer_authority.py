"""Bot jobs never borrow a lane's authority (real devnet, real Postgres).

A bot job carries no authorisation entry, so the engine simulates it in recording mode: a job naming
a lane as the `user` of market.buy records the lane's SOURCE_ACCOUNT authorisation (the lane is the
transaction's source) and, were it spliced in and sent, would buy as the lane. Even with buy (wrongly)
on the bot-job allow-list, the drainer must refuse the envelope before anything is anchored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from stellar_sdk import Account, TransactionBuilder, scval, xdr

from tests.support.chain_env import ChainEnv, chain_environ
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.relay_support import admit_close, admit_relay, allow_market


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=1, users=2)  # one lane: the job's lane is the one it names
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    return ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))


def orders(chain: ChainEnv, user: str) -> int:
    """market.orders(user) as the chain says (SorobanServer simulation: nothing is sent)."""
    g = chain.genesis
    tx = (TransactionBuilder(Account(g["users"][-1]["public"], 0), g["passphrase"], base_fee=100)
          .append_invoke_contract_function_op(g["contracts"]["market"], "orders", [scval.to_address(user)])
          .set_timeout(300).build())
    with chain.server() as server:
        answer = server.simulate_transaction(tx)
    return int(scval.to_native(xdr.SCVal.from_xdr(answer.results[0].xdr)))


def admit_buy_job(db: psycopg.Connection, chain: ChainEnv, key: str, user: str) -> int:
    args = scval.to_vec([scval.to_address(user), scval.to_symbol("book"), scval.to_int128(7)]).to_xdr()
    return int(db.execute("SELECT bot_job_id FROM paygate.admit_bot_job(%s, %s, 'buy', %s)",
                          (key, chain.genesis["contracts"]["market"], args)).fetchone()[0])


def drain(chain: ChainEnv, db: psycopg.Connection) -> None:
    for _ in range(6):
        assert chain.tick("relay_drainer").code in (0, 1)
        if not db.execute("SELECT count(*) FROM paygate.bot_jobs WHERE status = 'queued'").fetchone()[0]:
            return
        chain.devnet.close_ledger()
    raise AssertionError("relay_drainer did not go quiet")


def test_a_bot_job_naming_a_lane_or_a_user_never_applies(chain: ChainEnv, db: psycopg.Connection) -> None:
    market, lane = chain.genesis["contracts"]["market"], chain.genesis["lanes"][0]["public"]
    user = chain.genesis["users"][0]["public"]
    allow_market(db, market)
    # The operator's mistake this must survive: a user-authorised function on the bot-job list.
    db.execute("INSERT INTO paygate.bot_job_allowlist (contract, function) VALUES (%s, 'buy')", (market,))
    as_lane = admit_buy_job(db, chain, "buy:as-lane", lane)
    as_user = admit_buy_job(db, chain, "buy:as-user", user)
    drain(chain, db)
    jobs = dict(db.execute("SELECT id, (status, reason, tx_hash) FROM paygate.bot_jobs").fetchall())
    status, reason, tx = jobs[as_lane]
    assert (status, tx) == ("failed", None) and "not a permissionless call" in reason, reason
    assert "SOURCE_ACCOUNT" in reason and "buy" in reason
    status, reason, tx = jobs[as_user]
    assert (status, tx) == ("failed", None) and f"authorises as {user}" in reason, reason
    # Nothing was anchored (no envelope journaled), so nothing could be broadcast.
    lineages = db.execute("SELECT state, inner_hash, envelope FROM paygate.lineages WHERE entitlement IN (%s, %s)",
                          (f"bot_job:{as_lane}", f"bot_job:{as_user}")).fetchall()
    assert lineages and all(row == ("abandoned", None, None) for row in lineages), lineages
    assert orders(chain, lane) == 0 and orders(chain, user) == 0  # the chain: no order bought as either


def test_only_the_bot_job_allow_list_admits_and_sends(chain: ChainEnv, db: psycopg.Connection) -> None:
    from paygate_cli.sandbox.devnet.contracts.market import ORDER_TTL_LEDGERS

    market, user = chain.genesis["contracts"]["market"], chain.genesis["users"][0]
    allow_market(db, market)
    admit_relay(db, chain.devnet, user, "order-1")
    for _ in range(6):
        assert chain.tick("relay").code in (0, 1)
        chain.devnet.close_ledger()
    chain.devnet.close_ledger(ORDER_TTL_LEDGERS + 1)
    job = admit_close(db, chain.devnet, user["public"])
    # Taken off the bot-job list after admission (the relay list still has buy, and never had
    # close_expired): the claim reads the bot-job list and the job fails with that reason.
    db.execute("UPDATE paygate.bot_job_allowlist SET enabled = false WHERE contract = %s", (market,))
    drain(chain, db)
    status, reason = db.execute("SELECT status, reason FROM paygate.bot_jobs WHERE id = %s", (job,)).fetchone()
    assert status == "failed" and "not on the bot-job allow-list" in reason, reason
    db.execute("UPDATE paygate.bot_job_allowlist SET enabled = true WHERE contract = %s", (market,))
    job = admit_close(db, chain.devnet, user["public"], key="close:again")
    drain(chain, db)
    assert db.execute("SELECT status FROM paygate.bot_jobs WHERE id = %s", (job,)).fetchone()[0] == "applied"
