"""Ledger state of the devnet: accounts, the ledger chain, the transaction queue, applied
transactions and their events, hash bans. One `Devnet` object; callers hold `Devnet.lock`.

Queue semantics follow stellar-core's TransactionQueue: one queued transaction
per sequence source, DUPLICATE for a queued hash, TRY_AGAIN_LATER for a banned hash or a busy
source, replace-by-fee at 10x the rate, drop after 4 ledgers without inclusion, bans of 10 ledgers.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal

from stellar_sdk import Asset, Keypair, StrKey, xdr

from paygate_cli.sandbox.devnet import fees
from paygate_cli.sandbox.devnet.host import ContractHost, InvokeOutcome
from paygate_cli.sandbox.devnet.storage import (  # the host's SCVal encoder: same bytes, much faster
    ADDR_ACCOUNT,
    enc_scval,
    sc_address,
    sc_i128,
    sc_sym,
)
from paygate_cli.sandbox.devnet.validate import (
    TRC,
    Context,
    Parsed,
    Rejected,
    archived_indices,
    check,
    declared_resources,
    parse_envelope,
)
from paygate_cli.sandbox.devnet.xdrutil import (
    event_id,
    fee_bump_result,
    g_to_account_id,
    invoke_result,
    muxed_to_g,
    network_id,
    tx_result,
)

PROTOCOL_VERSION = 28  # Protocol 28, what stellar-rpc v28 speaks (ADDRESS_V2 needs >= 27)
QUEUE_TIMEOUT_LEDGERS = 4  # HerderImpl TRANSACTION_QUEUE_TIMEOUT_LEDGERS
BAN_LEDGERS = 10  # HerderImpl TRANSACTION_QUEUE_BAN_LEDGERS
RBF_MULTIPLIER = 10
DEFAULT_RETENTION = 120_960
ACCOUNT_HISTORY_DEPTH = 64  # ledgers of account versions kept for the account-lag fault
TOTAL_COINS = 100_000_000_000 * 10_000_000
MAX_EVENTS_BYTES = 16 * 1024  # events + return value per transaction


@dataclass
class Account:
    balance: int
    seq: int
    last_modified: int
    num_sub_entries: int = 0
    thresholds: bytes = b"\x01\x00\x00\x00"  # master weight, low, medium, high

    def entry_data(self, g: str) -> xdr.LedgerEntryData:
        return xdr.LedgerEntryData(
            type=xdr.LedgerEntryType.ACCOUNT,
            account=xdr.AccountEntry(
                account_id=g_to_account_id(g), balance=xdr.Int64(self.balance),
                seq_num=xdr.SequenceNumber(xdr.Int64(self.seq)), num_sub_entries=xdr.Uint32(self.num_sub_entries),
                inflation_dest=None, flags=xdr.Uint32(0), home_domain=xdr.String32(b""),
                thresholds=xdr.Thresholds(self.thresholds), signers=[], ext=xdr.AccountEntryExt(0),
            ),
        )

    def entry(self, g: str) -> xdr.LedgerEntry:
        return xdr.LedgerEntry(
            last_modified_ledger_seq=xdr.Uint32(self.last_modified), data=self.entry_data(g),
            ext=xdr.LedgerEntryExt(0),
        )

    def copy(self) -> Account:
        return Account(self.balance, self.seq, self.last_modified, self.num_sub_entries, self.thresholds)


@dataclass
class LedgerInfo:
    seq: int
    close_time: int
    hash: bytes
    header: xdr.LedgerHeader


class LedgerChain:
    """`Devnet.ledgers`: the retained ledgers by sequence, contiguous, with a real hash chain.

    Ledgers closed by `Devnet.close_empty` (devnet_advance: months of empty ledgers in seconds) are
    held as runs of (close time, hash) rather than header objects; a run's header is built when it is
    asked for (the last few are cached). Everything else is a plain LedgerInfo."""

    CACHE = 64

    def __init__(self, make_header: Callable[[int, int, bytes, bytes, bytes], xdr.LedgerHeader]) -> None:
        self._full: dict[int, LedgerInfo] = {}
        self._runs: list[_EmptyRun] = []  # ascending, disjoint from each other and from _full
        self._cache: dict[int, LedgerInfo] = {}
        self._make_header = make_header

    def _run(self, seq: int) -> _EmptyRun | None:
        for r in self._runs:
            if r.first <= seq <= r.last:
                return r
        return None

    def __contains__(self, seq: object) -> bool:
        return seq in self._full or (isinstance(seq, int) and self._run(seq) is not None)

    def __getitem__(self, seq: int) -> LedgerInfo:
        info = self._full.get(seq) or self._cache.get(seq)
        if info is not None:
            return info
        run = self._run(seq)
        if run is None:
            raise KeyError(seq)
        prev = run.prev if seq == run.first else run.hash(seq - 1)
        info = LedgerInfo(seq, run.close_time(seq), run.hash(seq),
                          self._make_header(seq, run.close_time(seq), prev, EMPTY_SET_HASH, EMPTY_SET_HASH))
        if len(self._cache) >= self.CACHE:
            del self._cache[next(iter(self._cache))]
        self._cache[seq] = info
        return info

    def __setitem__(self, seq: int, info: LedgerInfo) -> None:
        self._full[seq] = info

    def __iter__(self) -> Iterator[int]:
        return iter(sorted([*self._full, *(s for r in self._runs for s in range(r.first, r.last + 1))]))

    def __len__(self) -> int:
        return len(self._full) + sum(r.last - r.first + 1 for r in self._runs)

    def pop(self, seq: int, default: LedgerInfo | None = None) -> LedgerInfo | None:
        """Forget the OLDEST held ledger (retention prunes from the front)."""
        self._cache.pop(seq, None)
        if seq in self._full:
            return self._full.pop(seq)
        self.drop_below(seq + 1)
        return default

    def drop_below(self, oldest: int) -> None:
        """Forget every ledger below `oldest`, at the cost of what is held (not of the gap)."""
        for seq in [s for s in self._full if s < oldest]:
            del self._full[seq]
        for seq in [s for s in self._cache if s < oldest]:
            del self._cache[seq]
        kept = []
        for r in self._runs:
            if r.last >= oldest:
                r.trim_below(oldest)
                kept.append(r)
        self._runs = kept

    def add_run(self, run: _EmptyRun) -> None:
        self._runs.append(run)

    def headers(self) -> list[LedgerInfo]:
        """The ledgers held as headers, ascending (what --state files keep one by one)."""
        return [self._full[s] for s in sorted(self._full)]

    def runs_json(self) -> list[list]:
        return [[r.first, r.last, r.close0, r.step, r.prev.hex(), base64.b64encode(bytes(r.hashes)).decode()]
                for r in self._runs]

    def load_runs(self, runs: list[list]) -> None:
        for first, last, close0, step, prev, hashes in runs:
            self._runs.append(_EmptyRun(first, last, close0, step, bytes.fromhex(prev),
                                        bytearray(base64.b64decode(hashes))))
        self._runs.sort(key=lambda r: r.first)


@dataclass
class _EmptyRun:
    """Consecutive ledgers without transactions: `hashes` holds each one's hash (32 bytes a ledger)."""

    first: int
    last: int
    close0: int  # close time of `first`
    step: int  # seconds between closes
    prev: bytes  # hash of the ledger before `first`
    hashes: bytearray

    def close_time(self, seq: int) -> int:
        return self.close0 + (seq - self.first) * self.step

    def hash(self, seq: int) -> bytes:
        i = (seq - self.first) * 32
        return bytes(self.hashes[i:i + 32])

    def trim_below(self, oldest: int) -> None:
        if oldest <= self.first:
            return
        self.prev = self.hash(oldest - 1)
        cut = (oldest - self.first) * 32
        self.close0 = self.close_time(oldest)
        del self.hashes[:cut]
        self.first = oldest


EMPTY_SET_HASH = hashlib.sha256(b"").digest()  # tx set and result set hash of a ledger with no transaction


@dataclass
class EventRecord:
    id: str
    ledger: int
    tx_index: int  # 1-based application order
    op_index: int
    contract_id: str
    topics: list[str]  # base64 SCVal
    value: str  # base64 SCVal
    tx_hash: str  # outer hash for fee bumps
    event_b64: str  # the ContractEvent
    successful: bool = True  # inSuccessfulContractCall: the transaction succeeded (fee events of failed ones)


@dataclass
class TxRecord:
    status: Literal["SUCCESS", "FAILED"]
    ledger: int
    application_order: int
    fee_bump: bool
    full_hash: str
    inner_hash: str
    envelope_xdr: str
    result_xdr: str
    result_meta_xdr: str
    contract_events: list[list[str]]  # base64 ContractEvent per operation
    created_at: int  # ledger close time
    fee_rate: int = 0  # inclusion fee CHARGED per operation (the phase's surge price or the base fee), for getFeeStats
    # getFeeStats' figure for this transaction, as stellar-rpc computes it (feewindow.go): a Soroban
    # transaction's whole charged inclusion fee (a fee bump's extra operation included), a classic
    # one's per operation of its inner transaction.
    fee_stat: int = 0
    soroban: bool = False
    transaction_events: list[str] = field(default_factory=list)  # base64 TransactionEvent (CAP-67 fee events)


@dataclass
class Queued:
    p: Parsed
    added_ledger: int  # latest ledger when it was accepted
    hold_until: int = 0  # fault: not included before this ledger (and exempt from aging)
    never: bool = False  # fault: never included; ages out and is banned like a starved tx


@dataclass
class Applied:
    record: TxRecord
    events: list[EventRecord] = field(default_factory=list)
    # CAP-67 fee events: the charge (stage beforeAllTxs) and the Soroban refund (afterAllTxs), which
    # getEvents indexes per ledger rather than per transaction (stellar-rpc db/event.go).
    fee_before: _EncodedEvent | None = None
    fee_after: _EncodedEvent | None = None


class Devnet:
    def __init__(self, passphrase: str, host: ContractHost, *, retention: int = DEFAULT_RETENTION) -> None:
        self.lock = threading.RLock()
        self.passphrase = passphrase
        self.net_id = network_id(passphrase)
        # The native asset's SAC: CAP-67 gives classic XLM movements and fees its events.
        self.native_sac = Asset.native().contract_id(passphrase)
        self.native_sac_raw = StrKey.decode_contract(self.native_sac)
        self._fee_topics: dict[str, list[bytes]] = {}  # fee source -> encoded fee-event topics
        self.host = host
        self.retention = retention
        self.accounts: dict[str, Account] = {}
        # account → [(ledger, version)] of recent versions, oldest first, for the lag fault
        self.account_history: dict[str, list[tuple[int, Account]]] = {}
        self.ledgers = LedgerChain(self._make_header)  # contiguous: first_ledger … latest
        self.first_ledger = 1
        self.latest = 0
        self.queue: list[Queued] = []
        self.bans: dict[bytes, int] = {}  # full hash → first ledger at which it is no longer banned
        self.txs: dict[str, TxRecord] = {}  # inner and outer hash hex → record
        self.txs_by_ledger: dict[int, list[TxRecord]] = {}
        self.events_by_ledger: dict[int, list[EventRecord]] = {}
        self.pending_consume: list[str] = []  # fault: accounts whose next sequence a competitor takes
        self.secrets: dict[str, str] = {}  # devnet-generated throwaway keys, to sign competing txs
        self.genesis: dict = {}
        # The fee market (docs/devnet.md "Fee market"): capacity per ledger and per phase, the surge
        # fault's competing demand (rate, txs) for the ledger being built, and what its phantoms were
        # charged per closed ledger (ledger -> (rate, count)), which getFeeStats counts.
        self.ledger_max_soroban_txs = fees.DEFAULT_LEDGER_MAX_SOROBAN_TXS
        self.ledger_max_classic_ops = fees.DEFAULT_LEDGER_MAX_CLASSIC_OPS
        self.surge_demand: Callable[[], tuple[int, int] | None] = lambda: None
        self.phantom_fees: dict[int, tuple[int, int]] = {}
        self.fee_window_soroban = 50  # getFeeStats' windows in ledgers, as stellar-rpc's defaults
        self.fee_window_classic = 10

    # ----- ledger chain -------------------------------------------------------------------------

    @property
    def latest_info(self) -> LedgerInfo:
        return self.ledgers[self.latest]

    @property
    def oldest(self) -> int:
        return max(1, self.latest - self.retention + 1)

    def oldest_available(self) -> int:
        """Oldest ledger still held (headers are pruned with the retention window)."""
        return max(self.oldest, self.first_ledger)

    def _make_header(self, seq: int, close_time: int, prev: bytes, tx_set: bytes, results: bytes
                     ) -> xdr.LedgerHeader:
        return xdr.LedgerHeader(
            ledger_version=xdr.Uint32(PROTOCOL_VERSION), previous_ledger_hash=xdr.Hash(prev),
            scp_value=xdr.StellarValue(
                tx_set_hash=xdr.Hash(tx_set), close_time=xdr.TimePoint(xdr.Uint64(close_time)), upgrades=[],
                ext=xdr.StellarValueExt(xdr.StellarValueType.STELLAR_VALUE_BASIC),
            ),
            tx_set_result_hash=xdr.Hash(results), bucket_list_hash=xdr.Hash(hashlib.sha256(
                b"bucketlist%d" % seq).digest()),
            ledger_seq=xdr.Uint32(seq), total_coins=xdr.Int64(TOTAL_COINS), fee_pool=xdr.Int64(0),
            inflation_seq=xdr.Uint32(0), id_pool=xdr.Uint64(0), base_fee=xdr.Uint32(fees.BASE_FEE),
            base_reserve=xdr.Uint32(fees.BASE_RESERVE), max_tx_set_size=xdr.Uint32(1000),
            skip_list=[xdr.Hash(bytes(32))] * 4, ext=xdr.LedgerHeaderExt(0),
        )

    def _add_ledger(self, seq: int, close_time: int, tx_set: bytes, results: bytes) -> None:
        prev = self.ledgers[seq - 1].hash if seq - 1 in self.ledgers else bytes(32)
        header = self._make_header(seq, close_time, prev, tx_set, results)
        self.ledgers[seq] = LedgerInfo(seq, close_time, hashlib.sha256(header.to_xdr_bytes()).digest(), header)
        self.latest = seq

    def start_genesis(self, close_time: int) -> None:
        self._add_ledger(1, close_time, bytes(32), bytes(32))

    def header_entry(self, seq: int) -> xdr.LedgerHeaderHistoryEntry:
        """What stellar-rpc's getLedgers sends as headerXdr (hash + header + ext)."""
        info = self.ledgers[seq]
        return xdr.LedgerHeaderHistoryEntry(hash=xdr.Hash(info.hash), header=info.header,
                                            ext=xdr.LedgerHeaderHistoryEntryExt(0))

    def close_meta_xdr(self, seq: int) -> str:
        """The ledger's LedgerCloseMeta v2 (what stellar-core emits from protocol 23 on and stellar-rpc
        serves verbatim as metadataXdr), base64: the header entry, a GeneralizedTransactionSet (phase 0
        classic, phase 1 Soroban as one parallel stage/cluster) and a TransactionResultMetaV1 per
        transaction in application order, with the result and meta getTransaction serves. Assembled from
        the stored XDR bytes without decoding them; fee processing changes stay empty (the fee charge is
        in the TransactionMeta's txChangesBefore) and no upgrades, SCP info or evictions."""
        pack = struct.pack
        recs = self.txs_by_ledger.get(seq, [])
        envs = [(r.soroban, base64.b64decode(r.envelope_xdr)) for r in recs]
        classic = [e for soroban, e in envs if not soroban]
        soroban = [e for is_soroban, e in envs if is_soroban]
        info = self.ledgers[seq]
        out = [pack(">ii", 2, 0), self.header_entry(seq).to_xdr_bytes()]
        out.append(pack(">i", 1) + info.header.previous_ledger_hash.hash + pack(">I", 2))
        # Phase 0 (v0): one TXSET_COMP_TXS_MAYBE_DISCOUNTED_FEE component, baseFee absent.
        out.append(pack(">iI", 0, 1 if classic else 0))
        if classic:
            out.append(pack(">iII", 0, 0, len(classic)) + b"".join(classic))
        # Phase 1 (v1, parallel Soroban): baseFee absent, one stage holding one cluster.
        out.append(pack(">iI", 1, 0))
        out.append(pack(">III", 1, 1, len(soroban)) + b"".join(soroban) if soroban else pack(">I", 0))
        out.append(pack(">I", len(recs)))
        for r in recs:
            out.append(pack(">i", 0) + bytes.fromhex(r.full_hash) + base64.b64decode(r.result_xdr)
                       + pack(">I", 0) + base64.b64decode(r.result_meta_xdr) + pack(">I", 0))
        # upgradesProcessing, scpInfo, totalByteSizeOfLiveSorobanState (not modelled: 0), evictedKeys.
        out.append(pack(">IIQI", 0, 0, 0, 0))
        return base64.b64encode(b"".join(out)).decode()

    # ----- accounts -----------------------------------------------------------------------------

    def _touch(self, g: str, acct: Account) -> None:
        """Record a new version of an account (for the lag fault's per-ledger history)."""
        acct.last_modified = max(acct.last_modified, self.latest)
        hist = self.account_history.setdefault(g, [])
        if hist and hist[-1][0] == acct.last_modified:
            hist[-1] = (acct.last_modified, acct.copy())
        else:
            hist.append((acct.last_modified, acct.copy()))
        if len(hist) > ACCOUNT_HISTORY_DEPTH:
            del hist[0]

    def account_at(self, g: str, ledger: int) -> Account | None:
        """The account as it was at the end of `ledger` (None if it did not exist yet)."""
        if g not in self.accounts:
            return None
        for seq, version in reversed(self.account_history.get(g, [])):
            if seq <= ledger:
                return version
        hist = self.account_history.get(g)
        if hist and len(hist) >= ACCOUNT_HISTORY_DEPTH:
            return hist[0][1]  # older than we remember: the oldest version we kept
        return None

    def create_account(self, g: str, balance: int, *, ledger: int | None = None) -> Account:
        seq_ledger = self.latest if ledger is None else ledger
        # A new account's sequence number is (ledger it was created in) << 32, as on Stellar.
        acct = Account(balance=balance, seq=seq_ledger << 32, last_modified=seq_ledger)
        self.accounts[g] = acct
        self._touch(g, acct)
        return acct

    def fund_xlm(self, g: str, amount: int) -> Account:
        acct = self.accounts.get(g)
        if acct is None:
            return self.create_account(g, amount)
        acct.balance += amount
        self._touch(g, acct)
        return acct

    # ----- submission ---------------------------------------------------------------------------

    def queued_fees(self, exclude: Queued | None = None) -> dict[str, int]:
        out: dict[str, int] = {}
        for q in self.queue:
            if q is not exclude:
                out[q.p.fee_source] = out.get(q.p.fee_source, 0) + q.p.fee
        return out

    def submit(self, p: Parsed) -> tuple[str, xdr.TransactionResult | None]:
        """stellar-core's TransactionQueue::tryAdd. Returns (status, errorResult)."""
        if self.bans.get(p.full_hash, 0) > self.latest:
            return "TRY_AGAIN_LATER", None
        existing: Queued | None = None
        for q in self.queue:
            if q.p.full_hash == p.full_hash or q.p.inner_hash == p.full_hash:
                # the same envelope, or a plain tx whose fee-bump wrapper is already queued
                return "DUPLICATE", None
            if q.p.source == p.source:
                existing = q
        if existing is not None:
            old = existing.p
            if p.seq != old.seq or not p.fee_bump:
                return "TRY_AGAIN_LATER", None
            # Replace-by-fee: the new inclusion fee rate must be >= 10x the queued one.
            if p.inclusion_fee * old.fee_ops < RBF_MULTIPLIER * old.inclusion_fee * p.fee_ops:
                needed = -(-RBF_MULTIPLIER * old.inclusion_fee * p.fee_ops // old.fee_ops) + p.resource_fee
                return "ERROR", tx_result(needed, TRC.txINSUFFICIENT_FEE)
        ctx = Context(self.accounts, self.latest + 1, self.latest_info.close_time,
                      self.queued_fees(exclude=existing), max_entry_ttl=self.host.ttl.max_entry)
        try:
            check(p, ctx)
        except Rejected as rej:
            return "ERROR", rej.result
        evict: Queued | None = None
        if existing is None and p.soroban is not None:
            full, evict = self._soroban_queue_full(p)
            if full is not None:
                return "ERROR", full
        if existing is not None:
            self.queue.remove(existing)
        if evict is not None:  # dropped and banned like a transaction that starved
            self.queue.remove(evict)
            self.bans[evict.p.full_hash] = self.latest + 1 + BAN_LEDGERS
        self.queue.append(Queued(p, self.latest))
        return "PENDING", None

    def _soroban_queue_full(self, p: Parsed) -> tuple[xdr.TransactionResult | None, Queued | None]:
        """The Soroban queue holds QUEUE_MULTIPLIER ledgers' worth (the surge's phantoms of the ledger
        being built count). When full, a bid must beat the lowest queued rate: then it evicts the lowest
        real transaction (phantoms give way without one); else txINSUFFICIENT_FEE with the fee needed."""
        queued = [q for q in self.queue if q.p.soroban is not None]
        demand = self.surge_demand()
        phantoms = demand[1] if demand else 0
        if len(queued) + phantoms < fees.QUEUE_MULTIPLIER * self.ledger_max_soroban_txs:
            return None, None
        rates = [Fraction(q.p.inclusion_fee, q.p.fee_ops) for q in queued]
        lowest = min(rates + ([Fraction(demand[0])] if demand else []))
        if Fraction(p.inclusion_fee, p.fee_ops) <= lowest:
            needed = (int(lowest) + 1) * p.fee_ops + p.resource_fee
            return tx_result(needed, TRC.txINSUFFICIENT_FEE), None
        if demand is not None and lowest == demand[0] and (not rates or min(rates) > lowest):
            return None, None
        # The lowest real one; of equal rates the latest arrival goes first.
        i = min(range(len(queued)), key=lambda k: (rates[k], -k))
        return None, queued[i]

    # ----- closing ------------------------------------------------------------------------------

    def close_ledger(self, advance_seconds: int) -> list[TxRecord]:
        seq = self.latest + 1
        close_time = self.latest_info.close_time + advance_seconds
        applied: list[Applied] = []
        included: list[bytes] = []
        for g in self.pending_consume:
            a = self._apply_competitor(g, seq, close_time, len(applied) + 1)
            if a is not None:
                applied.append(a)
                included.append(bytes.fromhex(a.record.full_hash))
        self.pending_consume = []
        kept: set[int] = set()  # id() of the queued transactions that stay queued
        bids: list[fees.Bid] = []
        for i, q in enumerate(self.queue):
            if q.never or seq < q.hold_until:
                if not q.hold_until and seq - q.added_ledger >= QUEUE_TIMEOUT_LEDGERS:
                    self.bans[q.p.full_hash] = seq + BAN_LEDGERS  # starved: dropped and banned
                else:
                    kept.add(id(q))
                continue
            ctx = Context(self.accounts, seq, close_time, {})
            try:
                # Invalid at this ledger (time bounds passed, sequence taken): trimmed from the tx set
                # like core's trimInvalid does, never included, so no fee and no sequence consumed.
                check(q.p, ctx, at_apply=True)
            except Rejected:
                self.bans[q.p.full_hash] = seq + BAN_LEDGERS
                continue
            bids.append(fees.Bid(q, q.p.inclusion_fee, q.p.fee_ops, (q.added_ledger, 1, i), q.p.soroban is not None))
        # The surge fault's phantoms arrive when this ledger opens: before anything sent during it.
        demand = self.surge_demand()
        if demand is not None:
            bids += [fees.Bid(None, demand[0], 1, (self.latest, 0, k), True) for k in range(demand[1])]
        chosen = fees.select(bids, max_soroban_txs=self.ledger_max_soroban_txs,
                             max_classic_ops=max(0, self.ledger_max_classic_ops - len(applied)))
        picked = {id(b.item) for b in chosen.included if b.item is not None}
        for q in self.queue:  # applied in arrival order
            if id(q) in picked:
                price = chosen.soroban_price if q.p.soroban is not None else chosen.classic_price
                applied.append(self._apply(q.p, seq, close_time, len(applied) + 1, price))
                included.append(q.p.full_hash)
                self.bans[q.p.full_hash] = seq + BAN_LEDGERS
        for b in chosen.left_out:
            if not isinstance(b.item, Queued):
                continue  # a phantom left out is gone: the surge brings fresh demand each ledger
            if seq - max(b.item.added_ledger, b.item.hold_until - 1) >= QUEUE_TIMEOUT_LEDGERS:
                self.bans[b.item.p.full_hash] = seq + BAN_LEDGERS  # starved: dropped and banned
            else:
                kept.add(id(b.item))
        self.queue = [q for q in self.queue if id(q) in kept]
        n_phantoms = sum(1 for b in chosen.included if b.item is None)
        if n_phantoms:
            self.phantom_fees[seq] = (fees.charged_inclusion(demand[0] if demand else 0, 1, chosen.soroban_price),
                                      n_phantoms)
        for old in [k for k in self.phantom_fees if k <= seq - max(self.fee_window_soroban, self.fee_window_classic)]:
            del self.phantom_fees[old]
        tx_set = hashlib.sha256(b"".join(included)).digest()
        results = hashlib.sha256("".join(a.record.result_xdr for a in applied).encode()).digest()
        self._add_ledger(seq, close_time, tx_set, results)
        self.host.expire(seq)  # state archival: what is not live in this ledger is archived or gone
        records = [a.record for a in applied]
        if records:
            self.txs_by_ledger[seq] = records
            for r in records:
                self.txs[r.full_hash] = r
                self.txs[r.inner_hash] = r
        events = self._ledger_events(seq, applied)
        if events:
            self.events_by_ledger[seq] = events
        self.bans = {h: until for h, until in self.bans.items() if until > seq}
        self._prune()
        return records

    def close_empty(self, n: int, step: int) -> tuple[int, int]:
        """Close `n` ledgers holding no transaction at once (devnet_advance), `step` seconds apart.

        Each gets a real header hash (the chain stays verifiable), computed by patching one encoded
        header instead of building n header objects; expiry is applied once, as of the last ledger,
        and retention prunes as after any close. The queue must be empty (the caller closes normally
        while it is not). Returns what expiry (deleted, archived)."""
        assert not self.queue and not self.pending_consume
        first, prev = self.latest + 1, self.latest_info.hash
        close0 = self.latest_info.close_time + step
        keep = min(n, self.retention)
        hashes = _empty_chain(self._make_header, first, n, close0, step, prev, keep)
        if hashes is None:  # the header layout is not the one patched: build each ledger (slow, exact)
            for i in range(n):
                self._add_ledger(first + i, close0 + i * step, EMPTY_SET_HASH, EMPTY_SET_HASH)
        else:
            kept_first = first + n - keep
            self.ledgers.add_run(_EmptyRun(kept_first, first + n - 1, close0 + (n - keep) * step, step,
                                           hashes[0], hashes[1]))
            self.latest = first + n - 1
        expired = self.host.expire(self.latest)
        self.bans = {h: until for h, until in self.bans.items() if until > self.latest}
        self._prune()
        return expired

    def _ledger_events(self, seq: int, applied: list[Applied]) -> list[EventRecord]:
        """The ledger's events in getEvents order (stellar-rpc db/event.go): the beforeAllTxs fee
        events under transaction index 0, each transaction's operation events, then the afterAllTxs
        refunds under the maximum transaction index; the per-stage event index runs over the ledger."""
        out: list[EventRecord] = []

        def fee(e: _EncodedEvent, tx_index: int, n: int, a: Applied) -> EventRecord:
            return EventRecord(
                id=event_id(seq, tx_index, 0, n), ledger=seq, tx_index=tx_index, op_index=0,
                contract_id=e.contract_id, topics=[base64.b64encode(t).decode() for t in e.topics],
                value=base64.b64encode(e.data).decode(), tx_hash=a.record.full_hash, event_b64=e.b64,
                successful=a.record.status == "SUCCESS")

        for n, a in enumerate(x for x in applied if x.fee_before is not None):
            assert a.fee_before is not None
            out.append(fee(a.fee_before, 0, n, a))
        out.extend(e for a in applied for e in a.events)
        for n, a in enumerate(x for x in applied if x.fee_after is not None):
            assert a.fee_after is not None
            out.append(fee(a.fee_after, TOID_TX_MASK, n, a))
        return out

    def _prune(self) -> None:
        oldest = self.oldest
        if oldest - self.first_ledger > 1024:  # after close_empty: drop by what is held, not by the gap
            self.ledgers.drop_below(oldest)
            for seq in [s for s in self.events_by_ledger if s < oldest]:
                del self.events_by_ledger[seq]
            for seq in [s for s in self.txs_by_ledger if s < oldest]:
                for r in self.txs_by_ledger.pop(seq):
                    self.txs.pop(r.full_hash, None)
                    self.txs.pop(r.inner_hash, None)
            self.first_ledger = oldest
        while self.first_ledger < oldest:
            seq = self.first_ledger
            self.first_ledger += 1
            self.ledgers.pop(seq, None)
            self.events_by_ledger.pop(seq, None)
            for r in self.txs_by_ledger.pop(seq, []):
                self.txs.pop(r.full_hash, None)
                self.txs.pop(r.inner_hash, None)

    def _charge(self, p: Parsed, fee: int, seq_ledger: int) -> list[xdr.LedgerEntryChange]:
        """Charge the fee and consume the sequence number; returns txChangesBefore for the meta."""
        changes: list[xdr.LedgerEntryChange] = []
        for g in dict.fromkeys([p.fee_source, p.source]):
            acct = self.accounts[g]
            changes.append(xdr.LedgerEntryChange(type=xdr.LedgerEntryChangeType.LEDGER_ENTRY_STATE,
                                                 state=acct.entry(g)))
            if g == p.fee_source:
                acct.balance -= min(fee, acct.balance)
            if g == p.source:
                acct.seq = p.seq
            acct.last_modified = seq_ledger
            self._touch(g, acct)
            changes.append(xdr.LedgerEntryChange(type=xdr.LedgerEntryChangeType.LEDGER_ENTRY_UPDATED,
                                                 updated=acct.entry(g)))
        return changes

    def _apply(self, p: Parsed, seq: int, close_time: int, order: int, price: int = fees.BASE_FEE) -> Applied:
        """Apply a valid transaction in ledger `seq`: the fee and sequence are consumed either way.
        `price`: its phase's inclusion fee per operation this ledger (surge price or base fee)."""
        inclusion = fees.charged_inclusion(p.inclusion_fee, p.fee_ops, price)
        op = p.tx.operations[0]
        # Per operation: the encoded events (ContractEvent XDR) and their topics/data encodings.
        op_events: list[list[_EncodedEvent]] = [[] for _ in p.tx.operations]
        rv_bytes = _VOID
        ok = True
        if p.soroban is not None:
            res = declared_resources(p.soroban)
            non_refundable = fees.non_refundable_fee(res, p.inner_size)
            code, outcome, encoded = self._apply_soroban(p, op, seq, close_time, non_refundable)
            ok = code == xdr.InvokeHostFunctionResultCode.INVOKE_HOST_FUNCTION_SUCCESS
            refundable_used = 0
            if ok and outcome is not None:
                op_events[0] = encoded
                if outcome.return_value is not None:
                    rv_bytes = enc_scval(outcome.return_value)
                refundable_used = outcome.rent_fee  # rent (state archival) is refundable too
                if op.body.type == xdr.OperationType.INVOKE_HOST_FUNCTION:
                    refundable_used += fees.refundable_fee(sum(len(e.raw) for e in encoded) + len(rv_bytes))
            fee_charged = inclusion + min(p.resource_fee, non_refundable + refundable_used)
            if op.body.type != xdr.OperationType.INVOKE_HOST_FUNCTION:
                op_results = [_footprint_op_result(op.body.type, code)]
            else:
                # InvokeHostFunctionSuccessPreImage{returnValue, events}, hashed as in the real host
                success_hash = hashlib.sha256(
                    rv_bytes + _U32(len(op_events[0])) + b"".join(e.raw for e in op_events[0])
                ).digest() if ok else None
                op_results = [invoke_result(code, success_hash)]
        else:
            fee_charged = inclusion
            ok, op_results, staged, classic_events = self._apply_classic(p)
            if ok:
                op_events = [[_encode_event(e) for e in evs] for evs in classic_events]
        before = self._charge(p, fee_charged, seq)
        if ok and p.soroban is None:
            self._commit_classic(p, seq, *staged)
        # CAP-67: the fee source pays the whole bid resource fee up front and gets the unused part of
        # a Soroban transaction's resource fee back after all transactions (a negative amount).
        up_front = inclusion + (p.resource_fee if p.soroban is not None else 0)
        fee_before = self._fee_event(p.fee_source, up_front)
        fee_after = self._fee_event(p.fee_source, fee_charged - up_front) if up_front > fee_charged else None
        tx_events = [(TX_EVENT_BEFORE_ALL_TXS, fee_before)]
        if fee_after is not None:
            tx_events.append((TX_EVENT_AFTER_ALL_TXS, fee_after))
        tx_events_raw = [_U32(stage) + ev.raw for stage, ev in tx_events]
        code = TRC.txSUCCESS if ok else TRC.txFAILED
        if p.fee_bump:
            result = fee_bump_result(fee_charged, p.inner_hash, code, op_results)
        else:
            result = tx_result(fee_charged, code, op_results)
        # TransactionMeta v4, assembled from already-encoded parts (encoding events twice through
        # the SDK's pure-Python XDR would cost more than the rest of applying the transaction).
        meta = [_U32(4), _ZERO, xdr.LedgerEntryChanges(before).to_xdr_bytes(), _U32(len(op_events))]
        for evs in op_events:
            meta += [_ZERO, _ZERO, _U32(len(evs)), *(e.raw for e in evs)]
        meta.append(_ZERO)  # txChangesAfter
        if p.soroban is not None:
            meta.append(_ONE + _ZERO + (_ONE + rv_bytes if ok and rv_bytes is not _VOID else _ZERO))
        else:
            meta.append(_ZERO)
        meta += [_U32(len(tx_events_raw)), *tx_events_raw, _ZERO]  # transaction events, no diagnostic events
        full_hex = p.full_hash.hex()
        ev_b64 = [[e.b64 for e in evs] for evs in op_events]
        record = TxRecord(
            status="SUCCESS" if ok else "FAILED", ledger=seq, application_order=order, fee_bump=p.fee_bump,
            full_hash=full_hex, inner_hash=p.inner_hash.hex(), envelope_xdr=p.b64,
            result_xdr=result.to_xdr(), result_meta_xdr=base64.b64encode(b"".join(meta)).decode(),
            contract_events=ev_b64, created_at=close_time,
            fee_rate=inclusion // max(1, p.fee_ops), soroban=p.soroban is not None,
            fee_stat=inclusion if p.soroban is not None else inclusion // max(1, p.n_ops),
            transaction_events=[base64.b64encode(r).decode() for r in tx_events_raw],
        )
        applied = Applied(record, fee_before=fee_before, fee_after=fee_after)
        for op_index, evs in enumerate(op_events):
            for i, e in enumerate(evs):
                applied.events.append(EventRecord(
                    id=event_id(seq, order, op_index, i), ledger=seq, tx_index=order, op_index=op_index,
                    contract_id=e.contract_id, topics=[base64.b64encode(t).decode() for t in e.topics],
                    value=base64.b64encode(e.data).decode(), tx_hash=full_hex, event_b64=e.b64))
        return applied

    def _fee_event(self, fee_source: str, amount: int) -> _EncodedEvent:
        """CAP-67 fee event of the native SAC: topics ["fee", feeSource], data i128 amount. Built from
        bytes (two per transaction on the hot path; the SDK's XDR objects would cost ~65 µs each)."""
        topics = self._fee_topics.get(fee_source)
        if topics is None:
            topics = [_FEE_SYM, _ADDR_ACCOUNT_SCV + StrKey.decode_ed25519_public_key(fee_source)]
            self._fee_topics[fee_source] = topics
        data = _I128_TAG + struct.pack(">qQ", amount >> 64, amount & 0xFFFFFFFFFFFFFFFF)
        raw = (_ZERO + _ONE + self.native_sac_raw + _U32(xdr.ContractEventType.CONTRACT.value) + _ZERO
               + _U32(2) + b"".join(topics) + data)
        return _EncodedEvent(raw, base64.b64encode(raw).decode(), self.native_sac, topics, data)

    def _native_transfer(self, src: str, dest: str, amount: int) -> xdr.ContractEvent:
        """CAP-67: an XLM movement by a classic operation is the native SAC's transfer event."""
        return xdr.ContractEvent(
            ext=xdr.ExtensionPoint(0), contract_id=xdr.ContractID(xdr.Hash(self.native_sac_raw)),
            type=xdr.ContractEventType.CONTRACT,
            body=xdr.ContractEventBody(0, v0=xdr.ContractEventV0(
                topics=[sc_sym("transfer"), sc_address(ADDR_ACCOUNT + StrKey.decode_ed25519_public_key(src)),
                        sc_address(ADDR_ACCOUNT + StrKey.decode_ed25519_public_key(dest)), _NATIVE_NAME],
                data=sc_i128(amount))))

    def _apply_soroban(self, p: Parsed, op: xdr.Operation, seq: int, close_time: int, non_refundable: int
                       ) -> tuple[xdr.InvokeHostFunctionResultCode, InvokeOutcome | None, list[_EncodedEvent]]:
        ihf = xdr.InvokeHostFunctionResultCode
        if op.body.type != xdr.OperationType.INVOKE_HOST_FUNCTION:
            return self._apply_footprint_op(p, op, seq, non_refundable)
        assert p.soroban is not None and op.body.invoke_host_function_op is not None
        fp = p.soroban.resources.footprint
        footprint = (list(fp.read_only), list(fp.read_write))
        call = op.body.invoke_host_function_op
        kwargs = dict(host_function=call.host_function, auth=list(call.auth), source_account=p.op_source(op),
                      ledger_seq=seq, ledger_close_time=close_time, footprint=footprint,
                      archived=archived_indices(p.soroban))
        declared = declared_resources(p.soroban)
        verdict: dict[str, object] = {}

        def within_declared(outcome: InvokeOutcome) -> bool:
            """Checked on the successful outcome before the host commits: the declared resources
            (which the host does not know) bound what the call may use, as the real host enforces."""
            encoded = [_encode_event(e) for e in outcome.events]
            size = sum(len(e.raw) for e in encoded)
            if outcome.return_value is not None:
                size += len(enc_scval(outcome.return_value))
            verdict["encoded"] = encoded
            if (outcome.instructions > declared.instructions or outcome.read_bytes > declared.disk_read_bytes
                    or outcome.write_bytes > declared.write_bytes or size > MAX_EVENTS_BYTES):
                verdict["code"] = ihf.INVOKE_HOST_FUNCTION_RESOURCE_LIMIT_EXCEEDED
                return False
            if fees.refundable_fee(size) + outcome.rent_fee > p.resource_fee - non_refundable:
                verdict["code"] = ihf.INVOKE_HOST_FUNCTION_INSUFFICIENT_REFUNDABLE_FEE
                return False
            return True

        # One run: the host stages its writes and commits them only when within_declared agrees.
        outcome = self.host.invoke(mode="apply", commit_if=within_declared, **kwargs)  # type: ignore[arg-type]
        if not outcome.ok:
            return _trap_code(outcome), outcome, []
        if "code" in verdict:
            return verdict["code"], outcome, []  # type: ignore[return-value]
        return ihf.INVOKE_HOST_FUNCTION_SUCCESS, outcome, verdict["encoded"]  # type: ignore[return-value]

    def _apply_footprint_op(self, p: Parsed, op: xdr.Operation, seq: int, non_refundable: int
                            ) -> tuple[xdr.InvokeHostFunctionResultCode, InvokeOutcome, list[_EncodedEvent]]:
        """ExtendFootprintTTL / RestoreFootprint, applied by the host (docs/devnet.md "State archival").
        Their rent is refundable: what the resource fee leaves after the declared resources bounds it.
        The result code comes back as its InvokeHostFunction twin (_footprint_op_result maps it)."""
        ihf = xdr.InvokeHostFunctionResultCode
        assert p.soroban is not None
        fp = p.soroban.resources.footprint
        max_rent = p.resource_fee - non_refundable
        if op.body.type == xdr.OperationType.EXTEND_FOOTPRINT_TTL:
            assert op.body.extend_footprint_ttl_op is not None
            out = self.host.extend_footprint(list(fp.read_only), op.body.extend_footprint_ttl_op.extend_to.uint32,
                                             seq, max_rent=max_rent, commit=True)
        else:
            declared = declared_resources(p.soroban)
            out = self.host.restore_footprint(list(fp.read_write), seq, max_read_bytes=declared.disk_read_bytes,
                                              max_write_bytes=declared.write_bytes, max_rent=max_rent, commit=True)
        code = {"success": ihf.INVOKE_HOST_FUNCTION_SUCCESS,
                "resource_limit_exceeded": ihf.INVOKE_HOST_FUNCTION_RESOURCE_LIMIT_EXCEEDED,
                "insufficient_refundable_fee": ihf.INVOKE_HOST_FUNCTION_INSUFFICIENT_REFUNDABLE_FEE}[out.code]
        return code, InvokeOutcome(ok=out.code == "success", error=None, error_kind=None, return_value=None,
                                   rent_fee=out.rent_fee if out.code == "success" else 0), []

    # Classic operations: just enough for accounts and XLM (create account, native payment,
    # bump sequence); anything else fails with opNOT_SUPPORTED.
    def _apply_classic(self, p: Parsed) -> tuple[bool, list[xdr.OperationResult], tuple[dict, dict],
                                                 list[list[xdr.ContractEvent]]]:
        """Run the classic operations against staged balances; nothing is written here. Also returns
        each operation's CAP-67 events (the native SAC's transfer for CreateAccount and Payment)."""
        ot = xdr.OperationType
        staged: dict[str, int] = {}  # balance deltas
        created: dict[str, int] = {}
        results: list[xdr.OperationResult] = []
        events: list[list[xdr.ContractEvent]] = []
        ok = True

        def bal(g: str) -> int | None:
            if g in created:
                return created[g] + staged.get(g, 0)
            a = self.accounts.get(g)
            return None if a is None else a.balance + staged.get(g, 0)

        for op in p.tx.operations:
            src = p.op_source(op)
            t = op.body.type
            events.append([])
            if t == ot.CREATE_ACCOUNT:
                body = op.body.create_account_op
                assert body is not None
                dest = StrKey.encode_ed25519_public_key(body.destination.account_id.ed25519.uint256)
                amount = body.starting_balance.int64
                rc = xdr.CreateAccountResultCode
                if amount < 2 * fees.BASE_RESERVE:
                    code = rc.CREATE_ACCOUNT_LOW_RESERVE
                elif bal(dest) is not None:
                    code = rc.CREATE_ACCOUNT_ALREADY_EXIST
                elif (bal(src) or 0) - amount < 2 * fees.BASE_RESERVE + p.fee:
                    code = rc.CREATE_ACCOUNT_UNDERFUNDED
                else:
                    code = rc.CREATE_ACCOUNT_SUCCESS
                    staged[src] = staged.get(src, 0) - amount
                    created[dest] = amount
                    events[-1].append(self._native_transfer(src, dest, amount))
                ok &= code == rc.CREATE_ACCOUNT_SUCCESS
                results.append(xdr.OperationResult(code=xdr.OperationResultCode.opINNER, tr=xdr.OperationResultTr(
                    type=t, create_account_result=xdr.CreateAccountResult(code))))
            elif t == ot.PAYMENT and op.body.payment_op is not None and \
                    op.body.payment_op.asset.type == xdr.AssetType.ASSET_TYPE_NATIVE:
                body = op.body.payment_op
                dest = muxed_to_g(body.destination)
                amount = body.amount.int64
                pc = xdr.PaymentResultCode
                if amount <= 0:
                    code = pc.PAYMENT_MALFORMED
                elif bal(dest) is None:
                    code = pc.PAYMENT_NO_DESTINATION
                elif (bal(src) or 0) - amount < 2 * fees.BASE_RESERVE + p.fee:
                    code = pc.PAYMENT_UNDERFUNDED
                else:
                    code = pc.PAYMENT_SUCCESS
                    staged[src] = staged.get(src, 0) - amount
                    staged[dest] = staged.get(dest, 0) + amount
                    events[-1].append(self._native_transfer(src, dest, amount))
                ok &= code == pc.PAYMENT_SUCCESS
                results.append(xdr.OperationResult(code=xdr.OperationResultCode.opINNER, tr=xdr.OperationResultTr(
                    type=t, payment_result=xdr.PaymentResult(code))))
            elif t == ot.BUMP_SEQUENCE:
                results.append(xdr.OperationResult(code=xdr.OperationResultCode.opINNER, tr=xdr.OperationResultTr(
                    type=t, bump_seq_result=xdr.BumpSequenceResult(xdr.BumpSequenceResultCode.BUMP_SEQUENCE_SUCCESS))))
            else:
                ok = False
                results.append(xdr.OperationResult(code=xdr.OperationResultCode.opNOT_SUPPORTED))
        return ok, results, (staged, created), events

    def _commit_classic(self, p: Parsed, seq: int, staged: dict[str, int], created: dict[str, int]) -> None:
        for g, amount in created.items():
            self.create_account(g, amount, ledger=seq)
        for g, delta in staged.items():
            acct = self.accounts[g]
            acct.balance += delta
            acct.last_modified = seq
            self._touch(g, acct)
        for op in p.tx.operations:
            if op.body.type == xdr.OperationType.BUMP_SEQUENCE and op.body.bump_sequence_op is not None:
                g = p.op_source(op)
                acct = self.accounts[g]
                acct.seq = max(acct.seq, op.body.bump_sequence_op.bump_to.sequence_number.int64)
                self._touch(g, acct)

    def _apply_competitor(self, g: str, seq: int, close_time: int, order: int) -> Applied | None:
        """Fault: another party's no-op transaction from `g` takes its next sequence number."""
        from stellar_sdk import Account as SdkAccount
        from stellar_sdk import TransactionBuilder

        acct = self.accounts.get(g)
        if acct is None:
            return None
        tb = TransactionBuilder(SdkAccount(g, acct.seq), self.passphrase, base_fee=fees.BASE_FEE)
        tx = tb.append_bump_sequence_op(0).set_timeout(0).build()
        secret = self.secrets.get(g)
        if secret:
            tx.sign(Keypair.from_secret(secret))
        p = parse_envelope(tx.to_xdr(), self.net_id)
        if acct.balance < p.fee:
            acct.balance = p.fee  # the competitor's envelope must be payable; devnet tops it up
        self.bans[p.full_hash] = seq + BAN_LEDGERS
        return self._apply(p, seq, close_time, order)


def _empty_chain(make_header: Callable[[int, int, bytes, bytes, bytes], xdr.LedgerHeader], first: int, n: int,
                 close0: int, step: int, prev: bytes, keep: int) -> tuple[bytes, bytearray] | None:
    """Hashes of the last `keep` of `n` empty ledgers from `first` on, chained from `prev`. One header
    is encoded by the SDK; the fields that differ between empty ledgers (previous hash, close time,
    bucket list hash, sequence) are spliced in around its fixed parts. Ledgers that fall out of the
    retention window at once are never built (no one can ask for them): the first kept one's previous
    hash then names a pruned ledger. Returns (hash before the first kept ledger, the kept hashes), or
    None when a second SDK-built header disagrees with the spliced one (a layout this does not know)."""
    pack_q, pack_i = struct.Struct(">Q").pack, struct.Struct(">I").pack
    sha, join = hashlib.sha256, b"".join

    def bucket(seq: int) -> bytes:
        return sha(b"bucketlist%d" % seq).digest()

    tpl = make_header(first, close0, prev, EMPTY_SET_HASH, EMPTY_SET_HASH).to_xdr_bytes()
    if (tpl[4:36] != prev or tpl[68:76] != pack_q(close0) or tpl[116:148] != bucket(first)
            or tpl[148:152] != pack_i(first)):
        return None
    a, b, c, d = tpl[:4], tpl[36:68], tpl[76:116], tpl[152:]

    def encoded(seq: int, close_time: int, before: bytes) -> bytes:
        return join((a, before, b, pack_q(close_time), c, bucket(seq), pack_i(seq), d))

    probe = bytes(32 * [7])
    if encoded(first + 1, close0 + step, probe) != make_header(first + 1, close0 + step, probe, EMPTY_SET_HASH,
                                                               EMPTY_SET_HASH).to_xdr_bytes():
        return None
    start = n - keep
    if start > 0:
        prev = sha(b"paygate-devnet: ledger %d, pruned by devnet_advance" % (first + start - 1)).digest()
    before_kept = prev
    out = []
    for i in range(start, n):
        seq = first + i
        prev = sha(join((a, prev, b, pack_q(close0 + i * step), c, sha(b"bucketlist%d" % seq).digest(),
                         pack_i(seq), d))).digest()
        out.append(prev)
    return before_kept, bytearray(join(out))


def _trap_code(outcome: InvokeOutcome) -> xdr.InvokeHostFunctionResultCode:
    if outcome.error_kind == "resource_limit_exceeded":
        return xdr.InvokeHostFunctionResultCode.INVOKE_HOST_FUNCTION_RESOURCE_LIMIT_EXCEEDED
    if outcome.error_kind == "entry_archived":  # an archived footprint entry the tx did not mark
        return xdr.InvokeHostFunctionResultCode.INVOKE_HOST_FUNCTION_ENTRY_ARCHIVED
    return xdr.InvokeHostFunctionResultCode.INVOKE_HOST_FUNCTION_TRAPPED


def _footprint_op_result(t: xdr.OperationType, code: xdr.InvokeHostFunctionResultCode) -> xdr.OperationResult:
    """The footprint operation's result with the code its InvokeHostFunction twin names."""
    suffix = code.name.removeprefix("INVOKE_HOST_FUNCTION_")
    if t == xdr.OperationType.EXTEND_FOOTPRINT_TTL:
        tr = xdr.OperationResultTr(type=t, extend_footprint_ttl_result=xdr.ExtendFootprintTTLResult(
            xdr.ExtendFootprintTTLResultCode["EXTEND_FOOTPRINT_TTL_" + suffix]))
    else:
        tr = xdr.OperationResultTr(type=t, restore_footprint_result=xdr.RestoreFootprintResult(
            xdr.RestoreFootprintResultCode["RESTORE_FOOTPRINT_" + suffix]))
    return xdr.OperationResult(code=xdr.OperationResultCode.opINNER, tr=tr)


_U32 = struct.Struct(">I").pack
TX_EVENT_BEFORE_ALL_TXS, TX_EVENT_AFTER_TX, TX_EVENT_AFTER_ALL_TXS = 0, 1, 2  # TransactionEventStage
TOID_TX_MASK = 0xFFFFF  # the largest transaction index of a TOID (stellar-rpc's afterAllTxs cursor)
_NATIVE_NAME = xdr.SCVal(xdr.SCValType.SCV_STRING, str=xdr.SCString(b"native"))
_FEE_SYM = enc_scval(xdr.SCVal(xdr.SCValType.SCV_SYMBOL, sym=xdr.SCSymbol(b"fee")))
_ADDR_ACCOUNT_SCV = _U32(xdr.SCValType.SCV_ADDRESS.value) + ADDR_ACCOUNT  # + ed25519: an SCV_ADDRESS of a G…
_I128_TAG = _U32(xdr.SCValType.SCV_I128.value)
_ZERO = b"\x00\x00\x00\x00"
_ONE = b"\x00\x00\x00\x01"
_VOID = b"\x00\x00\x00\x01"  # SCVal SCV_VOID


@dataclass
class _EncodedEvent:
    raw: bytes  # ContractEvent XDR
    b64: str
    contract_id: str
    topics: list[bytes]
    data: bytes


def _encode_event(ev: xdr.ContractEvent) -> _EncodedEvent:
    """ContractEvent XDR from its parts: ext, contractID*, type, body v0 {topics<>, data}."""
    assert ev.body.v0 is not None
    topics = [enc_scval(t) for t in ev.body.v0.topics]
    data = enc_scval(ev.body.v0.data)
    if ev.contract_id is not None:
        cid_raw = ev.contract_id.contract_id.hash
        head = _ZERO + _ONE + cid_raw
        cid = StrKey.encode_contract(cid_raw)
    else:
        head, cid = _ZERO + _ZERO, ""
    raw = head + _U32(ev.type.value) + _ZERO + _U32(len(topics)) + b"".join(topics) + data
    return _EncodedEvent(raw, base64.b64encode(raw).decode(), cid, topics, data)


__all__ = ["Account", "Devnet", "EventRecord", "LedgerInfo", "Queued", "TxRecord"]
