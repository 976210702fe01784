"""The devnet's fee model and Soroban network limits.

Real Stellar prices Soroban resources from on-chain config settings. The devnet uses one fixed,
documented linear model (rates close to mainnet's) so that simulation and submission agree: a
transaction prepared from `simulateTransaction` always passes the `sendTransaction` check, and a
hand-built one that under-declares its resource fee gets `txSOROBAN_INVALID`, as on a real network.

It also holds the fee market's rules (capacity per ledger, surge pricing), docs/devnet.md "Fee market".
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

BASE_FEE = 100  # stroops per operation (LedgerHeader.base_fee)
BASE_RESERVE = 5_000_000  # stroops (LedgerHeader.base_reserve, 0.5 XLM)

# Per-transaction network limits (the network's published values, docs/devnet.md).
MAX_INSTRUCTIONS = 100_000_000
MAX_DISK_READ_BYTES = 200 * 1024
MAX_WRITE_BYTES = 132 * 1024
MAX_FOOTPRINT_KEYS = 100
MAX_WRITE_ENTRIES = 50
MAX_TX_SIZE = 132 * 1024

# Fee rates (stroops). Per-KB rates are charged per started KiB so the model is monotonic and simple.
FEE_PER_10K_INSTRUCTIONS = 25
FEE_PER_READ_ENTRY = 6_250
FEE_PER_WRITE_ENTRY = 10_000
FEE_PER_READ_KB = 1_786
FEE_PER_WRITE_KB = 11_800
FEE_PER_TX_SIZE_KB = 1_624 + 16_235  # bandwidth + historical storage
FEE_PER_EVENTS_KB = 10_000  # refundable part: events and the return value

# Simulation pads the transaction size it prices: the envelope it sees has no signatures yet
# and auth entries still carry void signatures.
SIM_SIZE_MARGIN = 1_024
SIM_SIZE_PER_AUTH_ENTRY = 200


def _kb(n: int) -> int:
    return (max(0, n) + 1023) // 1024


@dataclass(frozen=True)
class Resources:
    instructions: int
    disk_read_bytes: int
    write_bytes: int
    read_entries: int  # read-only footprint keys
    write_entries: int  # read-write footprint keys


def non_refundable_fee(res: Resources, tx_size: int) -> int:
    """What the declared resources cost no matter what the call does (charged in full)."""
    return (
        -(-res.instructions // 10_000) * FEE_PER_10K_INSTRUCTIONS
        + (res.read_entries + res.write_entries) * FEE_PER_READ_ENTRY
        + res.write_entries * FEE_PER_WRITE_ENTRY
        + _kb(res.disk_read_bytes) * FEE_PER_READ_KB
        + _kb(res.write_bytes) * FEE_PER_WRITE_KB
        + _kb(tx_size) * FEE_PER_TX_SIZE_KB
    )


def refundable_fee(events_bytes: int) -> int:
    """The refundable part: events plus return value. Unused refundable fee is not charged."""
    return _kb(events_bytes) * FEE_PER_EVENTS_KB if events_bytes > 0 else 0


# Rent (state archival, docs/devnet.md "State archival"): soroban-env-host's compute_rent_fee with
# fixed rates. Mainnet's rent per KB follows the size of the live Soroban state; the devnet uses the
# floor the host never goes below (1,000 stroops per KB) and mainnet's rent rate denominators: a KB of
# persistent state costs RENT_FEE_PER_KB every PERSISTENT_RENT_DENOMINATOR ledgers (temporary: half).
RENT_FEE_PER_KB = 1_000
PERSISTENT_RENT_DENOMINATOR = 1_215
TEMPORARY_RENT_DENOMINATOR = 2_430
TTL_ENTRY_SIZE = 48  # bytes of the TTL entry a TTL change writes
CODE_RENT_DISCOUNT = 3  # contract code pays a third of the rent


@dataclass(frozen=True)
class RentChange:
    """One entry's change as rent sees it; a new (or restored) entry has old_size = old_live_until = 0."""

    persistent: bool
    code: bool
    old_size: int
    new_size: int
    old_live_until: int
    new_live_until: int


def _rent_for(persistent: bool, size: int, ledgers: int) -> int:
    denominator = PERSISTENT_RENT_DENOMINATOR if persistent else TEMPORARY_RENT_DENOMINATOR
    return -(-size * RENT_FEE_PER_KB * ledgers // (1024 * denominator))


def rent_fee(changes: list[RentChange], ledger_seq: int) -> int:
    """Rent owed at `ledger_seq`: the ledgers an entry now lives past what it had paid for (a new entry:
    from this ledger on) at its new size, plus the size increase over the ledgers already paid, plus a
    TTL-entry write for every entry that lives longer. Monotonic in size and in ledgers."""
    fee = 0
    extended = 0
    for c in changes:
        new = c.old_size == 0 and c.old_live_until == 0
        start = ledger_seq - 1 if new else c.old_live_until
        one = 0
        if c.new_live_until >= start:
            one += _rent_for(c.persistent, c.new_size, c.new_live_until - start)
        if not new and c.old_live_until >= ledger_seq and c.new_size > c.old_size:
            one += _rent_for(c.persistent, c.new_size - c.old_size, c.old_live_until - ledger_seq + 1)
        fee += -(-one // CODE_RENT_DISCOUNT) if c.code else one
        if c.old_live_until < c.new_live_until:
            extended += 1
    return fee + extended * FEE_PER_WRITE_ENTRY + _kb_rate(extended * TTL_ENTRY_SIZE, FEE_PER_WRITE_KB)


def _kb_rate(size: int, per_kb: int) -> int:
    return -(-size * per_kb // 1024)


def limits_violation(res: Resources, tx_size: int) -> str | None:
    """Why the declared resources exceed the network limits, or None."""
    if res.instructions > MAX_INSTRUCTIONS:
        return f"instructions {res.instructions} exceed the network limit {MAX_INSTRUCTIONS}"
    if res.disk_read_bytes > MAX_DISK_READ_BYTES:
        return f"disk read bytes {res.disk_read_bytes} exceed the network limit {MAX_DISK_READ_BYTES}"
    if res.write_bytes > MAX_WRITE_BYTES:
        return f"write bytes {res.write_bytes} exceed the network limit {MAX_WRITE_BYTES}"
    if res.read_entries + res.write_entries > MAX_FOOTPRINT_KEYS:
        return f"footprint has more than {MAX_FOOTPRINT_KEYS} keys"
    if res.write_entries > MAX_WRITE_ENTRIES:
        return f"footprint has more than {MAX_WRITE_ENTRIES} read-write keys"
    if tx_size > MAX_TX_SIZE:
        return f"transaction size {tx_size} exceeds the network limit {MAX_TX_SIZE}"
    return None


# ----- the fee market: ledger capacity, surge pricing ------------------------------------------------

DEFAULT_LEDGER_MAX_SOROBAN_TXS = 100  # mainnet's Soroban phase holds about 100 transactions a ledger
DEFAULT_LEDGER_MAX_CLASSIC_OPS = 1000
QUEUE_MULTIPLIER = 2  # the Soroban queue holds this many ledgers' worth of transactions


@dataclass(frozen=True)
class Bid:
    """One candidate for a ledger: a queued transaction (`item`) or a phantom of the surge fault (None)."""

    item: object
    inclusion_fee: int  # the bid: fee minus the declared resource fee
    ops: int  # operations the bid is spread over (a fee bump counts one more)
    arrival: tuple[int, int, int]  # earlier first: (ledger it arrived in, 0 phantom / 1 sent, order)
    soroban: bool

    @property
    def rate(self) -> Fraction:
        return Fraction(self.inclusion_fee, max(1, self.ops))

    @property
    def per_op(self) -> int:
        """The rate as stellar-core prices it from protocol 20 on: rounded down."""
        return self.inclusion_fee // max(1, self.ops)


@dataclass
class Selection:
    included: list[Bid]  # in the order they were picked (highest rate first)
    left_out: list[Bid]
    soroban_price: int  # the rate each included transaction of the phase is charged per operation
    classic_price: int


def select(bids: list[Bid], *, max_soroban_txs: int, max_classic_ops: int) -> Selection:
    """stellar-core's surge pricing, per phase: highest rate first (ties by arrival), up to the phase's
    capacity (Soroban: transactions; classic: operations, a transaction that does not fit is passed
    over for smaller ones). A phase that left anything out charges every included transaction its
    lowest included rate; a phase with room charges the base fee."""
    included: list[Bid] = []
    left_out: list[Bid] = []
    prices = {True: BASE_FEE, False: BASE_FEE}
    for soroban in (False, True):
        phase = sorted((b for b in bids if b.soroban is soroban), key=lambda b: (-b.rate, b.arrival))
        room = max_soroban_txs if soroban else max_classic_ops
        taken: list[Bid] = []
        for b in phase:
            cost = 1 if soroban else b.ops
            if cost <= room:
                taken.append(b)
                room -= cost
            else:
                left_out.append(b)
        if len(taken) < len(phase) and taken:
            prices[soroban] = max(BASE_FEE, min(b.per_op for b in taken))
        included += taken
    return Selection(included, left_out, prices[True], prices[False])


def charged_inclusion(inclusion_fee: int, ops: int, price: int) -> int:
    """What an included transaction pays for inclusion: the phase's price per operation, never more
    than it bid (stellar-core's getFee when applying)."""
    return min(inclusion_fee, price * max(1, ops))
