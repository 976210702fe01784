"""The fee market (docs/architecture.md §4 "Fees and the fee market"): the bid, the re-bump and the
fee cap as pure decisions, the journal statements behind them, and the engine doing them through
real worker ticks on the devnet (its surge fault is the competing demand)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from stellar_sdk import Account, Keypair, Network, SorobanDataBuilder, TransactionBuilder, scval
from stellar_sdk.base_soroban_server import _assemble_transaction
from stellar_sdk.soroban_rpc import SimulateTransactionResponse

from paygate_cli.chain.accounts import MalformedAnswer
from paygate_cli.chain.contracts import rebump
from paygate_cli.chain.rpc import fee_stats_of
from paygate_cli.journal import lineage as lineages
from paygate_cli.journal.fee_market import (
    ENVELOPE_OPS,
    Capped,
    Price,
    bid_for,
    cap_for,
    floor_rate,
    needs_replacement,
    replacement_for,
)
from tests.support.chain_env import ChainEnv, admit_deposit, chain_environ, recovery_environ, sign_deposit
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.drill_support import crash_tick

PASSPHRASE = Network.STANDALONE_NETWORK_PASSPHRASE
CONTRACT = "CDYAT2YCKJDYQTVDXSFYW3CV3AXDMQIFAK3QVU6L6SKKPVRFDBDG6OAX"
AMOUNT = 5_000_000


class Settings:
    """The fee settings the pure decisions read (the defaults of settings.py)."""

    fee_bump_base_fee = 200
    base_fee = 100
    max_inclusion_fee = 100_000


# -- the decisions -------------------------------------------------------------------------------------

def test_the_bid_is_the_price_clamped_between_the_floor_and_the_cap() -> None:
    floor = floor_rate(Settings())
    assert floor == 200
    assert bid_for(1_234, floor=floor, cap=100_000) == 1_234
    assert bid_for(100, floor=floor, cap=100_000) == 200  # a quiet market: never below the floor
    assert bid_for(0, floor=floor, cap=100_000) == 200  # a price of zero is no free bid
    assert bid_for(250_000, floor=floor, cap=100_000) == 100_000  # never above the cap
    assert bid_for(None, floor=floor, cap=7_000) == 7_000  # no price ever read: the cap
    assert bid_for(1_000, floor=floor, cap=150) == 150  # a cap under the floor wins (the promise)


def test_a_starving_lineage_needs_a_replacement_only_as_the_rules_say() -> None:
    due = {"bid_rate": 200, "bid_ledger": 10, "rebump_after_ledgers": 2, "insufficient_fee": False}
    assert not needs_replacement(**due, latest_ledger=11, figure=5_000)  # one ledger: not yet
    assert needs_replacement(**due, latest_ledger=12, figure=5_000)  # two ledgers, the market's figure above its bid
    tied = {**due, "bid_rate": 2_000}
    assert needs_replacement(**tied, latest_ledger=12, figure=2_000)  # a tie loses: competing demand came first
    assert not needs_replacement(**tied, latest_ledger=40, figure=1_999)  # the figure below its bid: just wait
    assert needs_replacement(**due, latest_ledger=12, figure=None)  # no price known: as if above
    # A quiet market (every transaction charged the base fee: a fee bump shows 200) outbid nobody, even
    # at a tie with the bid: a late lineage there lost a send or met a lagging node; a resend does it.
    assert not needs_replacement(**due, latest_ledger=40, figure=200)
    assert needs_replacement(**due, latest_ledger=12, figure=201)
    # Refused for its fee by a full queue: at once, whatever its age or the price.
    assert needs_replacement(**{**due, "insufficient_fee": True}, latest_ledger=10, figure=100)


def test_the_figure_is_a_whole_transactions_inclusion_fee_and_a_new_bid_just_outbids_it_per_operation() -> None:
    # stellar-rpc counts a Soroban transaction's whole inclusion fee: a fee bump of one call (what paygate
    # sends: ENVELOPE_OPS operations) charged 1000 per operation shows 2000, a plain call at 2000 too.
    # The figure cannot say which: a new bid outbids the plain reading by one stroop (a tie loses).
    assert ENVELOPE_OPS == 2
    assert Price(2000, "p90", 1, "h").rate == 2001 and Price(2001, "p90", 1, "h").rate == 2002
    # A starving lineage reads it the other way (one-operation calls bidding 2000 each may be ahead):
    # the replacement outbids the figure itself, at least 10x its bid.
    assert replacement_for(bid_rate=1000, market_bid=2001, cap_rate=100_000, replacements=0,
                           max_replacements=3) == 10_000
    assert replacement_for(bid_rate=100, market_bid=2001, cap_rate=100_000, replacements=0,
                           max_replacements=3) == 2001


def test_a_replacement_bids_ten_times_or_the_market_up_to_the_cap_else_it_is_capped() -> None:
    rules = {"cap_rate": 100_000, "replacements": 0, "max_replacements": 3}
    assert replacement_for(bid_rate=200, market_bid=1_000, **rules) == 2_000  # the network's 10x rule
    assert replacement_for(bid_rate=200, market_bid=50_000, **rules) == 50_000  # the market, when higher
    assert replacement_for(bid_rate=2_000, market_bid=100_000, **rules) == 100_000  # up to the cap (>= 10x)
    # 10x the bid is above the cap: no replacement can be made; it needs 10x and waits.
    assert replacement_for(bid_rate=20_000, market_bid=100_000, **rules) == Capped(200_000, 100_000)
    assert replacement_for(bid_rate=200, market_bid=1_500, **{**rules, "cap_rate": 1_500}) == Capped(2_000, 1_500)
    # Its replacements used up: capped at the rate it would need, even under the cap.
    assert replacement_for(bid_rate=200, market_bid=1_000, **{**rules, "replacements": 3}) == Capped(2_000, 100_000)


def test_a_relays_cap_is_what_its_reservation_leaves_per_operation() -> None:
    assert cap_for(Settings(), max_fee=None, resource_fee=50_000, fee_ops=2) == 100_000
    assert cap_for(Settings(), max_fee=1_050_000, resource_fee=50_000, fee_ops=2) == 100_000  # the global cap
    assert cap_for(Settings(), max_fee=90_000, resource_fee=50_000, fee_ops=2) == 20_000
    assert cap_for(Settings(), max_fee=40_000, resource_fee=50_000, fee_ops=2) < 0  # the resource fee alone is over


def _stats(**soroban: Any) -> dict[str, Any]:
    dist = {k: "100" for k in ("max", "min", "mode", "p10", "p20", "p30", "p40", "p50", "p60", "p70", "p80", "p90",
                                "p95", "p99")} | {"transactionCount": "3", "ledgerCount": 50}
    return {"sorobanInclusionFee": dist | soroban, "inclusionFee": dict(dist), "latestLedger": 77}


def test_fee_stats_are_parsed_from_their_strings_and_a_malformed_answer_is_no_price() -> None:
    stats = fee_stats_of(_stats(p90="1500", max="9000"), "rpc.example:443")
    assert stats.soroban_inclusion_fee.percentile("p90") == 1_500
    assert stats.soroban_inclusion_fee.percentile("max") == 9_000
    assert (stats.soroban_inclusion_fee.transaction_count, stats.soroban_inclusion_fee.ledger_count) == (3, 50)
    assert (stats.latest_ledger, stats.endpoint) == (77, "rpc.example:443")
    for bad in ({"p90": "-5"}, {"p90": "1e3"}, {"p90": None}, {"p90": True}, {"ledgerCount": "x"},
                {"transactionCount": []}):
        with pytest.raises(MalformedAnswer):
            fee_stats_of(_stats(**bad), "h")
    with pytest.raises(MalformedAnswer):
        fee_stats_of({"sorobanInclusionFee": _stats()["sorobanInclusionFee"], "latestLedger": 1}, "h")
    with pytest.raises(MalformedAnswer):
        fee_stats_of([], "h")


def test_rebump_wraps_the_same_inner_bytes_as_the_sdks_fee_bump_does() -> None:
    lane, fee = Keypair.random(), Keypair.random()
    builder = TransactionBuilder(Account(lane.public_key, 41), PASSPHRASE, base_fee=300)
    builder.append_invoke_contract_function_op(CONTRACT, "credit", [scval.to_address(lane.public_key)])
    builder.add_time_bounds(0, 2_000_000_000)
    unsigned = builder.build()
    data = SorobanDataBuilder().set_resource_fee(31_337).set_resources(10, 20, 30).build().to_xdr()
    answer = SimulateTransactionResponse.model_validate({
        "transactionData": data, "minResourceFee": 31_337, "latestLedger": 7,
        "results": [{"auth": [], "xdr": "AAAAAQ=="}]})
    inner = _assemble_transaction(unsigned, answer)
    inner.sign(lane)
    first = TransactionBuilder.build_fee_bump_transaction(fee.public_key, 300, inner, PASSPHRASE)
    first.sign(fee)

    bumped = rebump(first.to_xdr(), fee, 2_000, PASSPHRASE)

    sdk = TransactionBuilder.build_fee_bump_transaction(fee.public_key, 2_000, inner, PASSPHRASE)
    sdk.sign(fee)
    assert bumped.envelope_xdr == sdk.to_xdr()  # byte for byte
    assert bumped.inner_hash == inner.hash() and bumped.outer_hash == sdk.hash() != first.hash()
    assert bumped.fee == 2_000 * 2 + 31_337 and bumped.bid_rate == 2_000
    with pytest.raises(ValueError, match="at least the inner"):
        rebump(first.to_xdr(), fee, 250, PASSPHRASE)  # below the inner rate (300): the network would refuse it too
    with pytest.raises(ValueError, match="not a fee-bump"):
        rebump(inner.to_xdr(), fee, 2_000, PASSPHRASE)


# -- the journal's statements ------------------------------------------------------------------------------

def _signed(db: psycopg.Connection, entitlement: str = "deposit:1:deposit", purpose: str = "deposit",
            bid: int = 200, cap: int = 100_000) -> lineages.Lineage:
    """A lineage anchored by the engine's own statement (its bid recorded), with a made-up envelope."""
    lane = Keypair.random().public_key
    lineages.sync_lanes(db, [lane])
    with db.transaction():
        allocated = lineages.allocate(db, purpose=purpose, entitlement=entitlement, lanes=[lane])
    assert allocated is not None
    sql = lineages.ANCHOR_HELD_SQL.format(hold="SELECT 1", install=lineages.NO_INSTALL)
    assert lineages.one_statement(db, sql, {
        "x_id": allocated[0], "x_seq": 5, "x_key_id": "k1", "x_envelope": b"sealed", "x_inner_hash": os.urandom(32),
        "x_outer_hash": os.urandom(32), "x_max_time": 2_000_000_000, "x_signed_at_ledger": 9, "x_max_ledger": None,
        "x_bid_rate": bid, "x_fee_ops": 2, "x_resource_fee": 31_337, "x_cap_rate": cap}).fetchone()[:2] == (1, 1)
    return lineages.load(db, allocated[0])


def test_a_replacement_is_one_compare_and_set_that_keeps_the_outer_hash_it_replaced(db: psycopg.Connection) -> None:
    lineage = _signed(db)
    assert (lineage.bid_rate, lineage.bid_ledger, lineage.fee_ops, lineage.resource_fee, lineage.cap_rate,
            lineage.replacements) == (200, 9, 2, 31_337, 100_000, 0)
    new_outer = os.urandom(32)
    assert lineages.replace_envelope(db, lineage, envelope=b"sealed again", key_id="k2", outer_hash=new_outer,
                                     bid_rate=2_000, bid_ledger=12)
    now = lineages.load(db, lineage.id)
    assert (bytes(now.envelope or b""), now.key_id, now.outer_hash, now.bid_rate, now.bid_ledger,
            now.replacements) == (b"sealed again", "k2", new_outer, 2_000, 12, 1)
    assert (now.inner_hash, now.source_seq, now.max_time) == (lineage.inner_hash, lineage.source_seq,
                                                              lineage.max_time)
    assert db.execute("SELECT replaced_by, outer_hash, bid_rate, bid_ledger FROM paygate.lineage_envelopes "
                      "WHERE lineage_id = %s", (lineage.id,)).fetchall() == [(1, lineage.outer_hash, 200, 9)]
    # A replacer that read the lineage before this one (its outer hash, its count) writes nothing.
    assert not lineages.replace_envelope(db, lineage, envelope=b"late", key_id="k1", outer_hash=os.urandom(32),
                                         bid_rate=3_000, bid_ledger=13)
    assert lineages.load(db, lineage.id).outer_hash == new_outer
    # The database refuses any other rewrite of a signed envelope: uncounted, or another inner transaction.
    with pytest.raises(psycopg.errors.CheckViolation, match="never replaced"):
        db.execute("UPDATE paygate.lineages SET envelope = 'x', outer_hash = %s WHERE id = %s",
                   (os.urandom(32), lineage.id))
    with pytest.raises(psycopg.errors.CheckViolation, match="never replaced"):
        db.execute("UPDATE paygate.lineages SET envelope = 'x', outer_hash = %s, replacements = 2, inner_hash = %s "
                   "WHERE id = %s", (os.urandom(32), os.urandom(32), lineage.id))
    # Terminal: nothing replaces it any more.
    assert lineages.finish(db, lineage.id, "applied", ledger=14, fee=4_100, resolution="receipt")
    assert not lineages.replace_envelope(db, now, envelope=b"after", key_id="k1", outer_hash=os.urandom(32),
                                         bid_rate=20_000, bid_ledger=15)


def test_fee_capped_is_set_once_updated_cleared_and_counted_per_path(db: psycopg.Connection) -> None:
    relay = _signed(db, "relay:1", "relay")
    bot = _signed(db, "bot_job:1", "relay", cap=1_500)
    assert lineages.set_fee_capped(db, relay.id, 2_000)
    since = lineages.load(db, relay.id).fee_capped_at
    assert since is not None and not lineages.set_fee_capped(db, relay.id, 2_000)  # nothing new: no write
    assert lineages.set_fee_capped(db, relay.id, 5_000)  # a higher market: the rate changes, not the time
    assert (lineages.load(db, relay.id).fee_capped_at, lineages.load(db, relay.id).fee_required) == (since, 5_000)
    assert lineages.set_fee_capped(db, bot.id, 2_000)
    assert lineages.fee_capped_of(db, {("relay", "relay")}) == (1, 5_000, 100_000)  # relays, not bot jobs
    assert lineages.fee_capped_of(db, {("relay", "relay"), ("relay", "bot_job")}) == (2, 5_000, 1_500)
    assert lineages.fee_capped_of(db, {("deposit", "deposit")}) == (0, None, None)
    assert lineages.clear_fee_capped(db, relay.id) and not lineages.clear_fee_capped(db, relay.id)
    assert lineages.load(db, relay.id).fee_capped_at is None
    assert lineages.fee_capped_of(db, {("relay", "relay")}) == (0, None, None)


def _charge_on(db: psycopg.Connection, lineage: lineages.Lineage, account: str) -> int:
    db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 100) ON CONFLICT DO NOTHING",
               (account,))
    row = int(db.execute("SELECT charge_row_id FROM paygate.admit_charge(%s, 10, %s, NULL)",
                         (account, f"key-{lineage.id}")).fetchone()[0])
    db.execute("UPDATE paygate.charges SET lineage_id = %s, claimed_at = now() WHERE id = %s", (lineage.id, row))
    return row


def test_a_starved_charge_batch_hands_its_charges_back_without_an_attempt(db: psycopg.Connection) -> None:
    from paygate_cli.queues import charges

    account = Keypair.random().public_key
    starved, capped, plain = (_signed(db, f"charge_batch:{n}", "charge_batch") for n in range(3))
    rows = {lin.id: _charge_on(db, lin, account) for lin in (starved, capped, plain)}
    assert lineages.replace_envelope(db, starved, envelope=b"e2", key_id="k1", outer_hash=os.urandom(32),
                                     bid_rate=2_000, bid_ledger=12)
    assert lineages.set_fee_capped(db, capped.id, 2_000)
    for lin in (starved, capped, plain):
        assert lineages.finish(db, lin.id, "expired", resolution="maxTime passed")
        db.execute(charges.RELEASE_DEAD_SQL, {"lineage": lin.id, "max": 1, "why": "expired"}).fetchall()

    def state(lin: lineages.Lineage) -> tuple[Any, ...]:
        return db.execute("SELECT status, attempts, lineage_id, dead_lineages FROM paygate.charges WHERE id = %s",
                          (rows[lin.id],)).fetchone()

    # Outbid (replaced, or fee-capped): back to authorized, no attempt counted, the dead lineage noted.
    assert state(starved) == ("authorized", 0, None, [starved.id])
    assert state(capped) == ("authorized", 0, None, [capped.id])
    # An ordinary dead lineage is an attempt: at the limit of one, the charge fails (balance restored).
    assert state(plain)[:2] == ("failed", 1)


# -- the engine through real ticks on the devnet ------------------------------------------------------------

FAST = {"PAYGATE_FEE_STATS_CACHE": "0s"}  # every tick reads the market (still at most once a tick)


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    # One Soroban transaction per ledger: two surge phantoms are enough to leave ours out.
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=2,
                          extra_args=["--ledger-max-soroban-txs", "1", "--fee-stats-window-soroban", "3"])
    yield handle
    handle.stop()


@pytest.fixture
def chain(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> ChainEnv:
    env = ChainEnv(devnet, dsn, chain_environ(devnet, dsn, tmp_path / "keys"))
    env.environ.update(FAST)
    return env


def _deposit(chain: ChainEnv, db: psycopg.Connection, user: int = 0) -> int:
    u = chain.genesis["users"][user]
    entry, nonce, expiration = sign_deposit(chain.devnet, u["secret"], AMOUNT, valid_ledgers=300)
    return admit_deposit(db, u["public"], AMOUNT, entry, nonce, expiration, f"fee-{user}-{nonce}")


def _lineages(db: psycopg.Connection) -> list[dict[str, Any]]:
    cursor = db.execute("SELECT * FROM paygate.lineages ORDER BY id")
    names = [c.name for c in cursor.description]
    return [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]


def _market(db: psycopg.Connection) -> tuple[Any, ...] | None:
    return db.execute("SELECT percentile, price, endpoint FROM paygate.fee_market").fetchone()


def _surge_price(chain: ChainEnv, rate: int) -> None:
    """Make the market's charged price `rate`: one ledger whose capacity two phantoms at `rate` overflow."""
    chain.devnet.set_fault("surge", rate=rate, txs=2, ledgers=1)
    chain.devnet.close_ledger()


def _tick(chain: ChainEnv, *codes: int, **extra: str) -> Any:
    result = chain.tick("funding", "--once", **extra)
    assert result.code in (codes or (0,)), (result.code, result.err[-3000:])
    return result


def test_new_envelopes_bid_the_markets_percentile_and_a_stats_outage_falls_back_to_the_last_price(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    _surge_price(chain, 700)
    pending = _deposit(chain, db)
    _tick(chain)
    (deposit,) = _lineages(db)
    # p90 of the charged inclusion fees (the phantoms' surge price, one operation each), read once and
    # remembered (host only); a new envelope outbids it per operation by one stroop.
    assert _market(db) == ("p90", 700, chain.devnet.url.split("//")[1])
    assert (deposit["bid_rate"], deposit["fee_ops"], deposit["cap_rate"], deposit["bid_ledger"]) == (
        701, 2, 100_000, deposit["signed_at_ledger"])
    assert deposit["resource_fee"] > 0
    chain.devnet.close_ledger()
    # getFeeStats fails from now on: the remembered price stands (never lower, never free).
    chain.devnet.set_fault("http_503", methods=["getFeeStats"])
    result = _tick(chain)
    assert "fees.stats_unavailable" in result.err
    credit = _lineages(db)[1]
    assert credit["purpose"] == "credit" and credit["bid_rate"] == 701 and _market(db)[1] == 700
    chain.devnet.close_ledger()
    _tick(chain)
    assert db.execute("SELECT status FROM paygate.deposits WHERE id = %s", (pending,)).fetchone()[0] == "settled"
    # What the fee account was charged is the chain's word, recorded per lineage.
    from paygate_cli.chain.rpc import fee_charged_of

    server = chain.server()
    for lin in _lineages(db):
        assert lin["state"] == "applied"
        assert lin["fee_charged"] == fee_charged_of(server.get_transaction(bytes(lin["inner_hash"]).hex()).result_xdr)


def test_with_no_price_ever_read_an_outage_bids_the_cap(chain: ChainEnv, db: psycopg.Connection) -> None:
    chain.devnet.set_fault("http_503", methods=["getFeeStats"])
    _deposit(chain, db)
    _tick(chain, PAYGATE_MAX_INCLUSION_FEE="3000")
    assert _market(db) is None
    assert [(x["bid_rate"], x["cap_rate"]) for x in _lineages(db)] == [(3_000, 3_000)]


def _starve(chain: ChainEnv, db: psycopg.Connection, **extra: str) -> dict[str, Any]:
    """A deposit sent at the floor (a quiet market), then a surge at 1000 leaves it out for two ledgers."""
    _deposit(chain, db)
    _tick(chain, **extra)
    (sent,) = _lineages(db)
    assert sent["bid_rate"] == 200 and sent["state"] in ("signed", "sent")
    chain.devnet.set_fault("surge", rate=1_000, txs=2, ledgers=6)
    chain.devnet.close_ledger()
    return sent


def test_a_starving_lineage_is_replaced_around_the_same_inner_transaction_and_lands_once(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    first = _starve(chain, db)
    _tick(chain)  # one ledger left out: not yet (rebump_after_ledgers = 2)
    assert _lineages(db)[0]["replacements"] == 0
    chain.devnet.close_ledger()
    result = _tick(chain)  # two ledgers, the market (1000) above its bid (200): a replacement at 10x
    assert "fees.rebumped" in result.err
    (now,) = _lineages(db)
    assert (now["replacements"], now["bid_rate"], now["state"]) == (1, 2_000, "sent")
    assert bytes(now["inner_hash"]) == bytes(first["inner_hash"])
    assert bytes(now["outer_hash"]) != bytes(first["outer_hash"])
    assert (now["source_seq"], now["max_time"]) == (first["source_seq"], first["max_time"])
    assert db.execute("SELECT replaced_by, outer_hash, bid_rate FROM paygate.lineage_envelopes").fetchall() == [
        (1, first["outer_hash"], 200)]
    chain.devnet.close_ledger()  # the replacement (2000) outbids the phantoms (1000)
    _tick(chain)
    deposit = _lineages(db)[0]
    assert deposit["state"] == "applied" and deposit["replacements"] == 1
    landed = chain.server().get_transaction(bytes(now["outer_hash"]).hex())
    assert landed.status.value == "SUCCESS"
    # Applied once, under the inner hash; the fee recorded is the chain's feeCharged for it.
    from paygate_cli.chain.rpc import fee_charged_of

    assert deposit["fee_charged"] == fee_charged_of(landed.result_xdr)
    assert db.execute("SELECT count(*) FROM paygate.lineages WHERE entitlement = %s AND state = 'applied'",
                      (deposit["entitlement"],)).fetchone()[0] == 1


def test_a_lineage_over_its_cap_is_fee_capped_waits_and_stalls_its_tick(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    capped = {"PAYGATE_MAX_INCLUSION_FEE": "1500"}
    first = _starve(chain, db, **capped)
    _tick(chain, **capped)
    chain.devnet.close_ledger()
    result = _tick(chain, 1, **capped)  # 10x its bid is over the cap: no replacement, fee-capped, exit 1
    assert "fees.capped" in result.err
    (now,) = _lineages(db)
    assert now["fee_capped_at"] is not None and now["fee_required"] == 2_000 and now["replacements"] == 0
    assert bytes(now["outer_hash"]) == bytes(first["outer_hash"])  # the same bytes, resent
    assert "1 unit fee-capped: market p90 1000, a replacement needs 2000 > cap 1500" in result.err
    # The surge ends: the same bytes land, never failed for the fee.
    chain.devnet.clear_faults()
    for _ in range(3):
        chain.devnet.close_ledger()
        _tick(chain, 0, 1, **capped)
    assert _lineages(db)[0]["state"] == "applied"


def test_the_take_over_engine_never_replaces_an_envelope(chain: ChainEnv, db: psycopg.Connection) -> None:
    from paygate_cli.context import TickContext
    from paygate_cli.db.connect import connect
    from paygate_cli.journal.engine import Engine
    from paygate_cli.settings import load_settings

    first = _starve(chain, db)
    chain.devnet.close_ledger()  # two ledgers left out, the market above its bid: a replacement is due

    def drive(environ: dict[str, str], takeover: bool) -> str:
        settings = load_settings(environ)
        with connect(settings, "test-fees") as conn:
            ctx = TickContext(conn=conn, settings=settings, worker="recovery" if takeover else "funding",
                              instance_id="test", slot=0, batch=10, log=logging.getLogger("test"))
            engine = Engine.for_takeover(ctx) if takeover else Engine.for_tick(ctx)
            try:
                return engine.drive(None, engine.load(first["id"]))
            finally:
                engine.chain.close()

    assert drive(recovery_environ(chain.environ), takeover=True) == "sent"  # resent the same bytes
    (now,) = _lineages(db)
    assert (now["replacements"], bytes(now["outer_hash"]), now["fee_capped_at"]) == (
        0, bytes(first["outer_hash"]), None)
    assert db.execute("SELECT count(*) FROM paygate.lineage_envelopes").fetchone()[0] == 0
    assert drive(chain.environ, takeover=False) == "sent"  # the signing engine, holding the fee key, does
    assert _lineages(db)[0]["replacements"] == 1


def test_a_replacement_journaled_but_never_sent_is_what_the_next_tick_resends(
        chain: ChainEnv, db: psycopg.Connection) -> None:
    first = _starve(chain, db)
    chain.devnet.close_ledger()
    crash_tick(chain.environ, "funding", "funding.after_rebump_journal")  # committed, not broadcast
    (journaled,) = _lineages(db)
    assert journaled["replacements"] == 1 and bytes(journaled["outer_hash"]) != bytes(first["outer_hash"])
    time.sleep(1.1)  # the dead process's lease on the deposit lapses (PAYGATE_FUNDING_LEASE 1s)
    _tick(chain)  # resolve resends the newest committed envelope: the replacement
    assert _lineages(db)[0]["replacements"] == 1  # not replaced again: its bid is one ledger old
    chain.devnet.close_ledger()
    _tick(chain)
    deposit = _lineages(db)[0]
    assert deposit["state"] == "applied"
    assert chain.server().get_transaction(bytes(journaled["outer_hash"]).hex()).status.value == "SUCCESS"
