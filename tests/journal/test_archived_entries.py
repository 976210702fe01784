"""Archived ledger entries on the money paths (docs/architecture.md §4 "State archival (TTL)"), on a
devnet whose persistent entries live 1,000 ledgers (`--min-persistent-ttl`; `devnet_advance` moves
time):

- an idle account's balance entry archived: the next charge and the next deposit for it still settle,
  restoring it on the way (the simulation's ext v1 is journaled as given; its rent is in the fee
  charged);
- the billing contract's USDC balance in the SAC archived: funding recovers the same way;
- a restore that does not fit the call's transaction (the simulation answers a restorePreamble): a
  charge batch of many charges splits and every charge settles; a unit that cannot split asks for a
  restore (a ttl_jobs row, joined by the next ask), is handed back with nothing failed, and lands
  once the restore has;
- the TTL keeper killed (a real process, PAYGATE_CRASH_AT) in each phase of a restore lineage: the
  restore lands once, journaled once, its rent counted once.

chain/ttl.py's keys, TTL reads and footprint calls are exercised against the same devnet."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from stellar_sdk import Keypair, scval, xdr

from paygate_cli.chain import ttl
from paygate_cli.chain.authority import CHARGE_BATCH, TTL, Policy
from paygate_cli.chain.charges import charge_batch
from paygate_cli.chain.contracts import FootprintCall, Invocation, RestoreRequired, build_signed
from paygate_cli.chain.rpc import ChainClient
from paygate_cli.context import TickContext
from paygate_cli.db.connect import connect
from paygate_cli.journal import lineage as lineages
from paygate_cli.journal.engine import Allocation, Engine, Prepared, RestorePending
from paygate_cli.settings import load_settings
from tests.support.chain_env import ChainEnv, billing_balance, chain_environ
from tests.support.charges_support import admit_charge, fund, run_until_quiet
from tests.support.devnet_support import MAX_SHORT_TTL, SHORT_TTL, DevnetHandle, start_short_ttl_devnet
from tests.support.drill_support import crash_tick
from tests.support.funding import admit
from tests.support.funding import run_until_quiet as fund_until_quiet

MIN_P = SHORT_TTL  # ledgers a new (or restored) persistent entry lives
MAX_TTL = MAX_SHORT_TTL  # nothing lives longer
PAST_TTL = MIN_P + 50  # an advance that archives what was written (or restored) just before it
DEPOSIT = 20_000_000


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_short_ttl_devnet(tmp_path / "devnet")
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    # paygate's lanes are the first three; the test's own transactions come from the admin account.
    environ = chain_environ(devnet, dsn, tmp_path / "keys", lanes=3)
    environ.update(PAYGATE_OBSERVER_START_LEDGER="1", PAYGATE_SETTLEMENT_LEASE="1s", PAYGATE_FEE_STATS_CACHE="0s")
    return ChainEnv(devnet, dsn, environ)


def client(chain: ChainEnv) -> ChainClient:
    return ChainClient(load_settings(chain.environ))


def advance(chain: ChainEnv, ledgers: int) -> int:
    return int(chain.devnet.rpc("devnet_advance", {"ledgers": ledgers})["latestLedger"])


def by_hand(chain: ChainEnv, call: FootprintCall) -> dict[str, Any]:
    """A footprint operation from the admin account (no lane of paygate's: its journal stays exact),
    built by build_signed and landed; -> getTransaction's answer."""
    g = chain.genesis
    admin = Keypair.from_secret(g["admin"]["secret"])
    rpc = client(chain)
    try:
        latest = rpc.latest_ledger()
        signed = build_signed(rpc, lane=admin, fee_account=admin, seq=rpc.account_sequence(admin.public_key) + 1,
                              call=call, max_time=latest.close_time + 600, base_fee=100, bid_rate=200)
        assert rpc.send(signed.envelope_xdr).status == "PENDING"
    finally:
        rpc.close()
    chain.devnet.close_ledger()
    got = chain.devnet.rpc("getTransaction", {"hash": signed.inner_hash.hex()})
    assert got["status"] == "SUCCESS", got
    return dict(got)


def ttls(chain: ChainEnv, keys: list[xdr.LedgerKey]) -> list[ttl.EntryTtl]:
    rpc = client(chain)
    try:
        found = ttl.read_ttls(rpc, [k.to_xdr() for k in keys])
    finally:
        rpc.close()
    return [found[k.to_xdr()] for k in keys]


def landed(chain: ChainEnv, inner_hash: bytes) -> tuple[xdr.SorobanTransactionData, dict[str, Any]]:
    """The inner transaction's SorobanTransactionData as it landed, and getTransaction's answer."""
    got = chain.devnet.rpc("getTransaction", {"hash": bytes(inner_hash).hex()})
    assert got["status"] == "SUCCESS", got
    envelope = xdr.TransactionEnvelope.from_xdr(got["envelopeXdr"])
    data = envelope.fee_bump.tx.inner_tx.v1.tx.ext.soroban_data
    assert data is not None
    return data, dict(got)


def restored_by(data: xdr.SorobanTransactionData) -> set[str]:
    """The keys a transaction marked for restoration (ext v1 archivedSorobanEntries)."""
    if data.ext.v != 1:
        return set()
    read_write = data.resources.footprint.read_write
    return {read_write[i.uint32].to_xdr() for i in data.ext.resource_ext.archived_soroban_entries}


def lineage_row(db: psycopg.Connection, lineage_id: int) -> dict[str, Any]:
    cursor = db.execute("SELECT * FROM paygate.lineages WHERE id = %s", (lineage_id,))
    return dict(zip([c.name for c in cursor.description or []], cursor.fetchone(), strict=True))


def contract_keys(chain: ChainEnv) -> list[xdr.LedgerKey]:
    billing = chain.genesis["contracts"]["billing"]
    rpc = client(chain)
    try:
        return [ttl.instance_key(billing), ttl.code_key(rpc, billing)]
    finally:
        rpc.close()


def balance_key(chain: ChainEnv, user: int) -> xdr.LedgerKey:
    g = chain.genesis
    return ttl.account_balance_key(g["contracts"]["billing"], g["users"][user]["public"])


# -- chain/ttl.py against the devnet -------------------------------------------------------------

def test_read_ttls_reports_live_archived_and_absent_entries_and_footprint_calls_move_them(
        chain: ChainEnv) -> None:
    g = chain.genesis
    kept = contract_keys(chain)
    never = ttl.account_balance_key(g["contracts"]["billing"], Keypair.random().public_key)
    assert ttls(chain, kept) == [ttl.EntryTtl(MIN_P, False, False)] * 2  # genesis entries: ledger 1 + MIN_P - 1
    assert ttls(chain, [never]) == [ttl.EntryTtl(None, False, True)]
    got = by_hand(chain, ttl.extend_call([k.to_xdr() for k in kept], 2_000))
    assert [t.live_until for t in ttls(chain, kept)] == [got["ledger"] + 2_000] * 2
    advance(chain, got["ledger"] + 2_001 - chain.devnet.latest_ledger())
    assert ttls(chain, kept) == [ttl.EntryTtl(None, True, False)] * 2
    # Extending an archived entry cannot be built: the simulation asks for a restore first.
    rpc = client(chain)
    admin = Keypair.from_secret(g["admin"]["secret"])
    with pytest.raises(RestoreRequired) as asked:
        build_signed(rpc, lane=admin, fee_account=admin, seq=rpc.account_sequence(admin.public_key) + 1,
                     call=ttl.extend_call([k.to_xdr() for k in kept], 2_000),
                     max_time=rpc.latest_ledger().close_time + 600, base_fee=100, bid_rate=200)
    rpc.close()
    assert sorted(asked.value.keys_xdr) == sorted(k.to_xdr() for k in kept) and asked.value.min_resource_fee > 0
    got = by_hand(chain, ttl.restore_call([k.to_xdr() for k in kept]))
    assert ttls(chain, kept) == [ttl.EntryTtl(got["ledger"] + MIN_P - 1, False, False)] * 2


# -- (a) an idle account's archived balance entry ------------------------------------------------

def test_an_idle_accounts_archived_balance_is_restored_by_its_next_charge_and_deposit(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    g = chain.genesis
    users = g["users"]
    fund(chain, db, [(users[0], DEPOSIT), (users[1], DEPOSIT)])
    kept = contract_keys(chain)
    by_hand(chain, ttl.extend_call([k.to_xdr() for k in kept], MAX_TTL - 100))  # only the balances archive
    advance(chain, PAST_TTL)
    balances = [balance_key(chain, 0), balance_key(chain, 1)]
    assert [t.archived for t in ttls(chain, balances + kept)] == [True, True, False, False]

    # The next charge: its batch restores the balance entry on the way and settles.
    charge, _ = admit_charge(db, users[0]["public"], 1_000, "archived-charge-1")
    run_until_quiet(chain, db)
    status, lineage_id = db.execute("SELECT status, lineage_id FROM paygate.charges WHERE id = %s",
                                    (charge,)).fetchone()
    assert status == "settled"
    first = lineage_row(db, lineage_id)
    data, got = landed(chain, first["inner_hash"])
    assert restored_by(data) == {balances[0].to_xdr()}  # the simulation's ext v1, journaled as given
    assert ttls(chain, balances[:1]) == [ttl.EntryTtl(got["ledger"] + MIN_P - 1, False, False)]
    assert first["fee_charged"] == xdr.TransactionResult.from_xdr(got["resultXdr"]).fee_charged.int64
    # The rent rode in the fee: the same charge once the entry is live costs less.
    charge, _ = admit_charge(db, users[0]["public"], 1_000, "archived-charge-2")
    run_until_quiet(chain, db)
    lineage_id = db.execute("SELECT lineage_id FROM paygate.charges WHERE id = %s AND status = 'settled'",
                            (charge,)).fetchone()[0]
    second = lineage_row(db, lineage_id)
    assert restored_by(landed(chain, second["inner_hash"])[0]) == set()
    assert first["fee_charged"] > second["fee_charged"]
    assert db.execute("SELECT max(attempts) FROM paygate.charges").fetchone()[0] == 0

    # The next deposit of the other idle account: its credit restores that account's balance entry.
    deposit = admit(chain, db, user=1, amount=DEPOSIT)
    fund_until_quiet(chain, db)
    status, credit_lineage = db.execute("SELECT status, credit_lineage_id FROM paygate.deposits WHERE id = %s",
                                        (deposit,)).fetchone()
    assert status == "settled"
    credit = lineage_row(db, credit_lineage)
    data, got = landed(chain, credit["inner_hash"])
    assert restored_by(data) == {balances[1].to_xdr()}
    assert not ttls(chain, balances[1:])[0].archived
    for user in (0, 1):
        cached = db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s",
                            (users[user]["public"],)).fetchone()[0]
        assert int(cached) == billing_balance(chain, users[user]["public"])
    assert billing_balance(chain, users[1]["public"]) == 2 * DEPOSIT
    assert not db.execute("SELECT count(*) FROM paygate.ttl_jobs").fetchone()[0]  # nothing needed a restore job


# -- (c) the billing contract's USDC balance in the SAC archived ----------------------------------

def test_funding_recovers_when_the_billing_contracts_usdc_balance_is_archived(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    g = chain.genesis
    usdc, billing = g["contracts"]["usdc"], g["contracts"]["billing"]
    fund(chain, db, [(g["users"][0], DEPOSIT)])
    sac_balance = ttl.sac_balance_key(usdc, billing)
    # The SAC extends the balance to 30 days itself when touched, clamped by the network's maximum.
    advance(chain, MAX_TTL + 50)
    kept = contract_keys(chain)
    assert [t.archived for t in ttls(chain, [sac_balance, *kept, balance_key(chain, 0)])] == [True] * 4

    deposit = admit(chain, db, user=0, amount=DEPOSIT)
    fund_until_quiet(chain, db)
    row = db.execute("SELECT status, deposit_lineage_id, credit_lineage_id FROM paygate.deposits WHERE id = %s",
                     (deposit,)).fetchone()
    assert row[0] == "settled"
    moved, _ = landed(chain, lineage_row(db, row[1])["inner_hash"])
    assert sac_balance.to_xdr() in restored_by(moved)  # the transfer restored the SAC's entry on the way
    credited, _ = landed(chain, lineage_row(db, row[2])["inner_hash"])
    assert {k.to_xdr() for k in [*kept, balance_key(chain, 0)]} <= restored_by(credited)
    assert not any(t.archived for t in ttls(chain, [sac_balance, *kept, balance_key(chain, 0)]))
    cached = db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s",
                        (g["users"][0]["public"],)).fetchone()[0]
    assert int(cached) == billing_balance(chain, g["users"][0]["public"]) == 2 * DEPOSIT


# -- (e) a restore that does not fit the call's transaction ---------------------------------------

def test_a_charge_batch_whose_restore_does_not_fit_splits_and_every_charge_settles(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    g = chain.genesis
    users = g["users"]
    fund(chain, db, [(users[i], DEPOSIT) for i in range(3)])
    advance(chain, PAST_TTL)  # the contract's instance and code archived, and every balance entry
    kept = contract_keys(chain)
    assert all(t.archived for t in ttls(chain, kept))
    # 47 charges of 3 accounts: 50 read-write keys, the most a batch claims. Restoring the instance and
    # the code moves them to the read-write footprint too: 52, more than one transaction may write.
    for n in range(47):
        admit_charge(db, users[n % 3]["public"], 1_000, f"full-{n}")
    results = run_until_quiet(chain, db)
    assert any("settlement.batch_split" in r.err for r in results if r.err)
    statuses = db.execute("SELECT status, count(*), max(attempts) FROM paygate.charges GROUP BY status").fetchall()
    assert statuses == [("settled", 47, 0)]  # every account settled, no attempt spent
    assert not db.execute("SELECT count(*) FROM paygate.ttl_jobs").fetchone()[0]  # the split restored them
    assert not any(t.archived for t in ttls(chain, kept))
    for user in users:
        cached = db.execute("SELECT cached_balance FROM paygate.accounts WHERE address = %s",
                            (user["public"],)).fetchone()[0]
        assert int(cached) == billing_balance(chain, user["public"])


# A unit that cannot be split (the engine sees only its SQL): one row of a stand-in table, whose
# lineage pointer is its one-statement attach.
UNITS_DDL = ("CREATE TABLE public.units (id bigint PRIMARY KEY, token uuid NOT NULL, lineage_id bigint, "
             "handed_back int NOT NULL DEFAULT 0)")
HOLD_SQL = "SELECT id FROM public.units WHERE id = %(unit)s AND token = %(unit_token)s FOR UPDATE"
ATTACH_SQL = """
UPDATE public.units u SET lineage_id = lineage.id FROM lineage
WHERE u.id = %(unit)s AND u.token = %(unit_token)s RETURNING 1
"""
HOLD_MANY_SQL = """
SELECT u.id AS row_id FROM public.units u JOIN req ON u.id = req.row_id WHERE u.token = req.row_token FOR UPDATE OF u
"""
ATTACH_MANY_SQL = """
UPDATE public.units u SET lineage_id = lineage.id FROM lineage JOIN req USING (entitlement)
WHERE u.id = req.row_id AND u.token = req.row_token RETURNING 1
"""
UNHOOK_SQL = """
UPDATE public.units SET lineage_id = NULL, handed_back = handed_back + 1
WHERE id = %(unit)s AND lineage_id = %(lineage)s
"""


@dataclass
class Unit:
    """journal/engine.py's Job for one row of public.units: `build(lane)` is its call."""

    unit: int
    build: Any
    purpose: str
    crash: str
    authority: Policy
    token: uuid.UUID = field(default_factory=uuid.uuid4)
    max_ledger: int | None = None
    max_fee: int | None = None
    failures: list[Exception] = field(default_factory=list)
    hold_sql = HOLD_SQL
    attach_sql = ATTACH_SQL
    install_sql = lineages.NO_INSTALL
    hold_many_sql = HOLD_MANY_SQL
    attach_many_sql = ATTACH_MANY_SQL
    install_many_sql = lineages.NO_INSTALL

    def params(self) -> dict[str, Any]:
        return {"unit": self.unit, "unit_token": self.token}

    def row_key(self) -> tuple[int, Any]:
        return self.unit, self.token

    def call(self, lane: str) -> Invocation | FootprintCall:
        return self.build(lane)  # type: ignore[no-any-return]

    def hold(self, conn: psycopg.Connection) -> bool:
        return conn.execute(HOLD_SQL, self.params()).fetchone() is not None

    def on_abandon(self, conn: psycopg.Connection, lineage_id: int, why: str) -> None:
        conn.execute(UNHOOK_SQL, {"unit": self.unit, "lineage": lineage_id})

    def on_sent(self, conn: psycopg.Connection, lineage_id: int, send: Any, terminal: bool) -> None:
        return None

    def on_build_failure(self, conn: psycopg.Connection, lineage_id: int, exc: Exception) -> bool:
        self.failures.append(exc)
        return False  # one call: nothing to split

    def check(self, signed: Any) -> None:
        return None


def _through_engine(engine: Engine, job: Unit, entitlement: str) -> Prepared | RestorePending:
    allocation = engine.allocate_many([job], [entitlement])[0]
    assert isinstance(allocation, Allocation), allocation
    outcome = engine.prepare(job, allocation)
    assert isinstance(outcome, (Prepared, RestorePending)), outcome
    return outcome


def _land(chain: ChainEnv, engine: Engine, job: Unit, prepared: Prepared) -> str:
    engine.send_prepared([prepared])
    engine.flush_sent()
    chain.devnet.close_ledger()
    return str(engine.drive(job, engine.load(prepared.lineage_id)))


def test_a_unit_whose_restore_does_not_fit_asks_for_one_is_handed_back_and_lands_after_it(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    g = chain.genesis
    billing, user = g["contracts"]["billing"], g["users"][0]["public"]
    fund(chain, db, [(g["users"][0], DEPOSIT)])
    advance(chain, PAST_TTL)
    wanted = {k.to_xdr() for k in [*contract_keys(chain), balance_key(chain, 0)]}
    db.execute(UNITS_DDL)
    db.execute("INSERT INTO public.units (id, token) VALUES (1, %s), (2, %s)", (uuid.uuid4(), uuid.uuid4()))
    ids = [os.urandom(32) for _ in range(48)]  # 49 read-write keys; with the instance and code, 51

    def batch(lane: str) -> Invocation:
        return charge_batch(billing, lane, [user] * 48, [1] * 48, ids)

    settings = load_settings(chain.environ)
    with connect(settings, "test-archived") as conn:
        ctx = TickContext(conn=conn, settings=settings, worker="settlement", instance_id="test", slot=0, batch=8,
                          log=logging.getLogger("test"))
        engine = Engine.for_tick(ctx)
        try:
            job = Unit(1, batch, "charge_batch", "test.unit", CHARGE_BATCH)
            db.execute("UPDATE public.units SET token = %s WHERE id = 1", (job.token,))
            asked = _through_engine(engine, job, "test_unit:1")
            assert isinstance(asked, RestorePending) and set(asked.keys) == wanted
            assert isinstance(job.failures[0], RestoreRequired)  # the job was asked first (it could not split)
            (restore,) = db.execute("SELECT id, kind, status, requested_by, keys_xdr FROM paygate.ttl_jobs").fetchall()
            assert restore[:4] == (asked.job_id, "restore", "pending", "test.unit:test_unit:1")
            assert set(restore[4]) == wanted
            # Handed back in the same transaction: the lineage abandoned (never signed: no attempt), the
            # row's pointer gone, nothing failed.
            abandoned = db.execute("SELECT id, state FROM paygate.lineages WHERE entitlement = 'test_unit:1'"
                                   ).fetchall()
            assert [state for _, state in abandoned] == ["abandoned"]
            assert db.execute("SELECT lineage_id, handed_back FROM public.units WHERE id = 1").fetchone() == (None, 1)
            # Asked again while the restore is pending: it joins the same job.
            again = _through_engine(engine, job, "test_unit:1")
            assert isinstance(again, RestorePending) and again.job_id == asked.job_id
            assert db.execute("SELECT count(*) FROM paygate.ttl_jobs").fetchone()[0] == 1

            # The restore lands (a RestoreFootprint of the job's keys through the same engine).
            keeper = Unit(2, lambda lane: ttl.restore_call(list(restore[4])), "restore", "ttl.restore", TTL)
            db.execute("UPDATE public.units SET token = %s WHERE id = 2", (keeper.token,))
            restoring = _through_engine(engine, keeper, f"ttl_job:{asked.job_id}")
            assert isinstance(restoring, Prepared)
            assert _land(chain, engine, keeper, restoring) == "applied"
            assert not any(t.archived for t in ttls(chain, [xdr.LedgerKey.from_xdr(k) for k in wanted]))

            # The unit is built again and lands: nothing left to restore on the way.
            built = _through_engine(engine, job, "test_unit:1")
            assert isinstance(built, Prepared)
            assert _land(chain, engine, job, built) == "applied"
        finally:
            engine.chain.close()
    data, got = landed(chain, lineage_row(db, built.lineage_id)["inner_hash"])
    assert restored_by(data) == set()
    result = xdr.TransactionMeta.from_xdr(got["resultMetaXdr"]).v4.soroban_meta.return_value
    assert scval.to_native(result) == [48, 0, 0]  # settled, failed, skipped
    assert billing_balance(chain, user) == DEPOSIT - 48


# -- crash drills: the restore lineage's phases (the TTL keeper's tick, a real process) -------------

RESTORE_POINTS = ["ttl.restore.after_allocate", "ttl.restore.after_sign", "ttl.restore.after_anchor",
                  "ttl.restore.after_broadcast", "ttl.restore.before_resolve", "ttl.restore.after_resolve"]


def _keeper(chain: ChainEnv) -> None:
    wait_for_ttl_leases(chain)
    result = chain.tick("ttl", "--once")
    assert result.code == 0, (result.code, result.err[-2000:])


def wait_for_ttl_leases(chain: ChainEnv) -> None:
    """Sleep until no pending ttl job holds a lease (DB time): a killed keeper's claim has lapsed."""
    with psycopg.connect(chain.dsn, autocommit=True) as conn:
        left = conn.execute("SELECT coalesce(extract(epoch FROM max(lease_expires_at) - now()), 0)::float8 "
                            "FROM paygate.ttl_jobs WHERE status = 'pending' AND lease_expires_at > now()"
                            ).fetchone()[0]
    if left > 0:
        time.sleep(left + 0.05)


@pytest.mark.parametrize("point", RESTORE_POINTS)
def test_a_keeper_killed_in_a_restore_phase_lands_it_once(chain: ChainEnv, db: psycopg.Connection,
                                                          point: str) -> None:
    chain.environ["PAYGATE_TTL_THRESHOLD"] = "50s"  # 10 ledgers: nothing live is due for an extension
    advance(chain, PAST_TTL)  # the billing contract's instance and code archived
    kept = contract_keys(chain)
    _keeper(chain)  # reads them archived: one restore job
    (job_id,) = db.execute("SELECT id FROM paygate.ttl_jobs WHERE kind = 'restore' AND status = 'pending'"
                           ).fetchone()
    if point.endswith("resolve"):
        _keeper(chain)  # sent; the next tick resolves it
        chain.devnet.close_ledger()
    crash_tick(chain.environ, "ttl", point)
    for _ in range(6):
        _keeper(chain)
        if db.execute("SELECT status FROM paygate.ttl_jobs WHERE id = %s", (job_id,)).fetchone()[0] != "pending":
            break
        chain.devnet.close_ledger()
    status, lineage_id, fee = db.execute("SELECT status, lineage_id, fee_charged FROM paygate.ttl_jobs WHERE id = %s",
                                         (job_id,)).fetchone()
    assert status == "applied"
    # One RestoreFootprint signed and journaled for the job, whatever died where: a lineage killed
    # before its anchor was abandoned (nothing signed survives it), an anchored one was resent as is.
    signed = db.execute("SELECT id, state FROM paygate.lineages WHERE purpose = 'restore' AND envelope IS NOT NULL"
                        ).fetchall()
    assert signed == [(lineage_id, "applied")]
    assert lineage_row(db, lineage_id)["fee_charged"] == fee
    spent, transactions = db.execute("SELECT spent, transactions FROM paygate.ttl_rent").fetchone()
    assert (spent, transactions) == (fee, 1)  # its rent counted once
    assert not any(t.archived for t in ttls(chain, kept))
    assert {state for (state,) in db.execute("SELECT state FROM paygate.ttl_entries WHERE kind IN ('instance', "
                                             "'code')")} == {"live"}
