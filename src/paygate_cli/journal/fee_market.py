"""The fee market as a tick sees it (docs/architecture.md §4 "Fees and the fee market").

Every new envelope bids the market: the configured percentile (`fee_percentile`) of getFeeStats'
sorobanInclusionFee, clamped between the floor (max(fee_bump_base_fee, base_fee)) and the unit's cap (cap_rate:
max_inclusion_fee, and for a relay what its fee reservation leaves per operation). The price is read
at most once per tick and reused for `fee_stats_cache` seconds within the process (a
`run-tick --every` loop keeps it across ticks); each read is remembered in paygate.fee_market, and a
failed read falls back to the remembered price (never a lower one, never "free"). With nothing
remembered the bid is the cap.

What the figure means: stellar-rpc counts each Soroban transaction's WHOLE charged inclusion fee,
not per operation, so a fee bump of a one-operation call (every envelope paygate sends) shows twice
its rate, a plain one-operation call its rate. The figure cannot say which it was, so paygate reads it
the way that never loses to the competition: as a plain call's rate, and bids one stroop over it per
operation (ties lose: whatever set the figure was queued first). An included transaction pays the
surge price (the lowest included rate), not its bid, so the over-reading costs nothing while someone
else's transaction is the lowest included. Read the other way (figure / 2 per operation), every new
envelope loses to one-operation competition and starves until a replacement, measured at +4 to +7
ledgers for a deposit in bench/fee_market.py. The one case the over-reading costs: when paygate's own
transactions alone overflow a ledger (more in flight than the network's per-ledger Soroban capacity,
~100 on mainnet: keep lanes well below it), each round's lowest included is its own, whose echo in
the figure is twice its rate, and the price climbs to the cap (docs/architecture.md §4).
A lineage that starves reads the window's highest figure instead (the percentile of a window of quiet
ledgers lags a surge's onset by many ledgers; the max shows it after one): it needs a replacement once
that is at or above its bid, and the replacement bids max(10 x its bid, highest + 1).

A sent lineage that starves (not included `rebump_after_ledgers` ledgers after its envelope was
journaled while the market is at or above its bid: ties lose, competing demand arrives first; or
its last send answered ERROR txINSUFFICIENT_FEE) gets a replacement fee bump at
min(cap_rate, max(10 x bid, market bid)), if that is at least 10 x its bid (the network's
replace-by-fee rule) and it has replacements left; otherwise it is fee-capped: it waits, resending
the same bytes, until it lands or is proven dead, and is never failed for the fee.

The decisions are pure functions (bid_for, needs_replacement, replacement_for); FeeMarket adds the
reading, the caching and the remembering."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paygate_cli.errors import Unavailable

if TYPE_CHECKING:
    import logging

    import psycopg

    from paygate_cli.chain.rpc import ChainClient, FeeStats
    from paygate_cli.journal.lineage import Lineage

# The network's replace-by-fee rule: a fee bump replaces a queued one of the same inner
# transaction only at >= 10x its rate.
REPLACE_BY_FEE = 10
# Operations every paygate envelope pays its bid for: one Soroban operation and its fee bump.
ENVELOPE_OPS = 2
# A send answer that says the bid is too low for the queue (a replacement is due at once).
INSUFFICIENT_FEE = "txINSUFFICIENT_FEE"

# The last price read, remembered (one row). Relaxed: a lost write only means an older fallback.
UPSERT_SQL = """
INSERT INTO paygate.fee_market AS m (singleton, percentile, price, max_fee, transactions, ledgers, ledger, endpoint,
                                     read_at)
VALUES (true, %(percentile)s, %(price)s, %(max_fee)s, %(transactions)s, %(ledgers)s, %(ledger)s, %(endpoint)s, now())
ON CONFLICT (singleton) DO UPDATE
SET percentile = EXCLUDED.percentile, price = EXCLUDED.price, max_fee = EXCLUDED.max_fee,
    transactions = EXCLUDED.transactions, ledgers = EXCLUDED.ledgers, ledger = EXCLUDED.ledger,
    endpoint = EXCLUDED.endpoint, read_at = EXCLUDED.read_at
RETURNING set_config('synchronous_commit', 'off', true)
"""
READ_SQL = "SELECT percentile, price, ledger, endpoint, read_at, max_fee FROM paygate.fee_market WHERE singleton"


@dataclass(frozen=True)
class Price:
    """A market price and where it came from. `figure`: the percentile as getFeeStats gave it (a
    Soroban transaction's whole inclusion fee); `rate`: what a new envelope bids per operation."""

    figure: int
    percentile: str
    ledger: int
    endpoint: str  # host only
    remembered: bool = False  # read from paygate.fee_market after a failed getFeeStats
    # The distribution's max: what a lineage that demonstrably starved must outbid. The percentile
    # of a window full of quiet ledgers lags a surge's onset by many ledgers; the max shows it after one.
    highest: int = 0

    @property
    def rate(self) -> int:
        """What a new envelope bids per operation: one stroop over the figure read as a plain call's
        rate (a tie loses: the competition that set the figure was queued first)."""
        return self.figure + 1


@dataclass(frozen=True)
class Capped:
    """No replacement is possible: the rate the lineage would need, above its cap (or its
    replacements are used up)."""

    required: int
    cap: int


# -- the decisions (pure) -----------------------------------------------------------------------------

def floor_rate(settings: Any) -> int:
    """The lowest bid: the fee bump's configured base, never below the inner transaction's rate."""
    return max(int(settings.fee_bump_base_fee), int(settings.base_fee))


def bid_for(price: int | None, *, floor: int, cap: int) -> int:
    """clamp(price, floor, cap); no price known: the cap. A cap below the floor wins (the floor is
    a preference, the cap a promise)."""
    if price is None:
        return cap
    return min(cap, max(floor, price))


def needs_replacement(*, bid_rate: int, bid_ledger: int, latest_ledger: int, figure: int | None,
                      rebump_after_ledgers: int, insufficient_fee: bool, base_fee: int = 100) -> bool:
    """Whether a sent, not included lineage starves: its last send was refused for its fee, or it
    waited `rebump_after_ledgers` ledgers since its envelope was journaled while the market's figure
    shows a surge (above what a fee bump charged the base fee shows: a quiet market's figures never
    are, whatever was bid) at or above its bid (read pessimistically: one-operation calls bidding the
    figure per operation may be ahead of it; ties lose). No price known counts as a surge. A lineage
    late in a quiet market was not outbid (a lost send, a lagging node): resending handles it."""
    if insufficient_fee:
        return True
    if latest_ledger - bid_ledger < max(1, rebump_after_ledgers):
        return False
    return figure is None or (figure > ENVELOPE_OPS * base_fee and figure >= bid_rate)


def replacement_for(*, bid_rate: int, cap_rate: int, replacements: int, market_bid: int,
                    max_replacements: int) -> int | Capped:
    """The rate of a starving lineage's replacement, or Capped with the rate it would need.
    `market_bid`: what outbids the market read pessimistically (the figure + 1, at least the floor)."""
    wanted = max(REPLACE_BY_FEE * bid_rate, market_bid)
    rate = min(cap_rate, wanted)
    if rate >= REPLACE_BY_FEE * bid_rate and replacements < max_replacements:
        return rate
    return Capped(wanted, cap_rate)


def cap_for(settings: Any, *, max_fee: int | None, resource_fee: int, fee_ops: int) -> int:
    """A unit's cap_rate: max_inclusion_fee, and for a job with a fee bound (a relay's reserved
    max_fee) what that leaves per operation once the resource fee is paid."""
    cap = int(settings.max_inclusion_fee)
    if max_fee is not None:
        cap = min(cap, (int(max_fee) - resource_fee) // fee_ops)
    return cap


# -- the per-tick view -------------------------------------------------------------------------------

# (read endpoints, percentile) -> (the price, time.monotonic() of its read): the process's cache.
_CACHE: dict[tuple[tuple[str, ...], str], tuple[Price, float]] = {}


class FeeMarket:
    """The market for one tick: `price()` read at most once per ledger (the figures change only when a
    ledger closes), and an answer reused across the process's ticks for `fee_stats_cache` seconds
    unless a newer ledger than its own has been seen (`seen_ledger`); `bid()` and `replacement()`
    from it."""

    def __init__(self, conn: psycopg.Connection, chain: ChainClient, settings: Any,
                 log: logging.Logger | None = None) -> None:
        self.conn = conn
        self.chain = chain
        self.settings = settings
        self.log = log
        self._price: Price | None = None
        self._seen = 0  # the newest ledger the engine has seen this tick
        self._read_for: int | None = None  # the seen ledger price() last answered for (None included)

    def seen_ledger(self, sequence: int) -> None:
        """A ledger the engine saw close: an answer about an older one is stale (whatever its age in
        seconds: ledgers close every ~5 s, a backlog of ticks can span several)."""
        self._seen = max(self._seen, int(sequence))

    @property
    def percentile(self) -> str:
        return str(self.settings.fee_percentile)

    def price(self) -> Price | None:
        """The market price, or None when it was never read (and cannot be now)."""
        if self._read_for == self._seen:
            return self._price
        self._read_for = self._seen
        key = (tuple(self.chain.read_urls), self.percentile)
        cached = _CACHE.get(key)
        if cached is not None and cached[0].ledger >= self._seen \
                and time.monotonic() - cached[1] < float(self.settings.fee_stats_cache):
            self._price = cached[0]
            return self._price
        try:
            stats = self.chain.fee_stats()
        except Unavailable as exc:
            self._price = self._remembered()
            if self.log is not None:
                self.log.warning("getFeeStats unavailable (%s); bidding from %s", str(exc)[:200],
                                 f"the price remembered from ledger {self._price.ledger} ({self._price.rate})"
                                 if self._price else "the cap (no price ever read)",
                                 extra={"msgid": "fees.stats_unavailable"})
            return self._price
        self._price = self._remember(stats)
        _CACHE[key] = (self._price, time.monotonic())
        return self._price

    def rate(self) -> int | None:
        """The market's bid per operation; a quiet market's (no figure above what a fee bump charged
        the base fee shows: nobody was outbid) is the floor, not one stroop over its own echo."""
        price = self.price()
        if price is None:
            return None
        return floor_rate(self.settings) if price.figure <= ENVELOPE_OPS * int(self.settings.base_fee) else price.rate

    def figure(self) -> int | None:
        price = self.price()
        return None if price is None else price.figure

    def highest(self) -> int | None:
        """The highest figure of the window (what a starving lineage reads), or None (no price known)."""
        price = self.price()
        return None if price is None else max(price.highest, price.figure)

    def outbid(self) -> int:
        """What a starving lineage's replacement bids at least: one stroop over the window's highest
        figure per operation (the cap: no price known)."""
        highest = self.highest()
        return int(self.settings.max_inclusion_fee) if highest is None else max(floor_rate(self.settings), highest + 1)

    def bid(self, cap_rate: int) -> int:
        return bid_for(self.rate(), floor=floor_rate(self.settings), cap=cap_rate)

    def replacement(self, lineage: Lineage, *, latest_ledger: int, insufficient_fee: bool) -> int | Capped | None:
        """For a sent lineage the chain has not included: a replacement's rate, Capped, or None (it
        does not need one). A lineage signed without a bid (before the fee market) is left alone."""
        if lineage.bid_rate is None or lineage.bid_ledger is None or lineage.cap_rate is None:
            return None
        settings = self.settings
        if not needs_replacement(bid_rate=lineage.bid_rate, bid_ledger=lineage.bid_ledger, latest_ledger=latest_ledger,
                                 figure=self.highest(), rebump_after_ledgers=int(settings.rebump_after_ledgers),
                                 base_fee=int(settings.base_fee),
                                 insufficient_fee=insufficient_fee):
            return None
        return replacement_for(bid_rate=lineage.bid_rate, cap_rate=lineage.cap_rate,
                               replacements=lineage.replacements, market_bid=self.outbid(),
                               max_replacements=int(settings.max_replacements))

    def _remember(self, stats: FeeStats) -> Price:
        dist = stats.soroban_inclusion_fee
        price = Price(dist.percentile(self.percentile), self.percentile, stats.latest_ledger, stats.endpoint,
                      highest=dist.percentile("max"))
        from paygate_cli.journal.lineage import one_statement

        one_statement(self.conn, UPSERT_SQL, {
            "percentile": self.percentile, "price": price.figure, "max_fee": dist.percentile("max"),
            "transactions": dist.transaction_count, "ledgers": dist.ledger_count, "ledger": stats.latest_ledger,
            "endpoint": stats.endpoint})
        return price

    def _remembered(self) -> Price | None:
        row = self.conn.execute(READ_SQL).fetchone()
        if row is None:
            return None
        percentile, rate, ledger, endpoint, _read_at, _highest = row
        return Price(int(rate), str(percentile), int(ledger), str(endpoint), remembered=True, highest=int(row[5]))
