"""The devnet's fee model and Soroban network limits.

Real Stellar prices Soroban resources from on-chain config settings. The devnet uses one fixed,
documented linear model (rates close to mainnet's) so that simulation and submission agree: a
transaction prepared from `simulateTransaction` always passes the `sendTransaction` check, and a
hand-built one that under-declares its resource fee gets `txSOROBAN_INVALID`, as on a real network.
"""

from __future__ import annotations

from dataclasses import dataclass

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
