"""Stellar RPC methods over the devnet's ledger state, with stellar-rpc v28's wire field names and
types (stellar.md §1): int64s as strings where Go tags them `,string`, numbers where it does not.

Each handler takes the params object (already `{}` for `null`) and returns the result object, or
raises RpcError. Handlers run under `Devnet.lock`, taken by the server.
"""

from __future__ import annotations

import base64
import datetime as dt
from typing import TYPE_CHECKING, Any

from stellar_sdk import StrKey, xdr

from paygate_cli.devnet import fees
from paygate_cli.devnet.ledger import PROTOCOL_VERSION, Devnet, TxRecord
from paygate_cli.devnet.validate import InvalidXdr, Parsed, decode_b64, parse_envelope
from paygate_cli.devnet.xdrutil import account_id_to_g, event_id, parse_event_id, toid

if TYPE_CHECKING:
    from paygate_cli.devnet.faults import Faults

INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

MAX_LEDGER_ENTRY_KEYS = 200
EVENTS_DEFAULT_LIMIT, EVENTS_MAX_LIMIT = 100, 10_000
TXS_DEFAULT_LIMIT, TXS_MAX_LIMIT = 50, 200
LEDGER_SCAN_LIMIT = 10_000
SOROBAN_FEE_WINDOW, CLASSIC_FEE_WINDOW = 50, 10
VERSION = "28.0.0-paygate-devnet"


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def invalid_params(msg: str) -> RpcError:
    return RpcError(INVALID_PARAMS, msg)


# ----- parameter helpers ---------------------------------------------------------------------------

def opt_int(params: dict, name: str, *, minimum: int = 0) -> int | None:
    v = params.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise invalid_params(f"{name}: expected an integer")
    if v < minimum:
        raise invalid_params(f"{name}: must be >= {minimum}")
    return v


def opt_str(params: dict, name: str) -> str | None:
    v = params.get(name)
    if v is None:
        return None
    if not isinstance(v, str):
        raise invalid_params(f"{name}: expected a string")
    return v


def opt_obj(params: dict, name: str) -> dict:
    v = params.get(name)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise invalid_params(f"{name}: expected an object")
    return v


def check_xdr_format(params: dict) -> None:
    fmt = opt_str(params, "xdrFormat")
    if fmt not in (None, "", "base64"):
        if fmt == "json":
            raise invalid_params("xdrFormat json is not supported by the devnet; use base64")
        raise invalid_params(f"unknown xdrFormat {fmt!r}")


def rfc3339(ts: int) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Methods:
    def __init__(self, dev: Devnet, faults: Faults) -> None:
        self.dev = dev
        self.faults = faults
        self.table = {
            "getHealth": self.get_health,
            "getNetwork": self.get_network,
            "getVersionInfo": self.get_version_info,
            "getLatestLedger": self.get_latest_ledger,
            "getFeeStats": self.get_fee_stats,
            "getLedgerEntries": self.get_ledger_entries,
            "getLedgers": self.get_ledgers,
            "sendTransaction": self.send_transaction,
            "getTransaction": self.get_transaction,
            "getTransactions": self.get_transactions,
            "getEvents": self.get_events,
            "simulateTransaction": self.simulate_transaction,
        }

    # ----- small ones -----------------------------------------------------------------------------

    def _window(self) -> tuple[int, int, int, int]:
        d = self.dev
        oldest = d.oldest_available()
        latest = self.faults.lagged_latest(d.latest, oldest)  # node_lag: the whole node is behind
        return latest, d.ledgers[latest].close_time, oldest, d.ledgers[oldest].close_time

    def get_health(self, params: dict) -> dict:
        latest, latest_ct, oldest, oldest_ct = self._window()
        return {"status": "healthy", "latestLedger": latest, "latestLedgerCloseTime": latest_ct,
                "oldestLedger": oldest, "oldestLedgerCloseTime": oldest_ct,
                "ledgerRetentionWindow": self.dev.retention}

    def get_network(self, params: dict) -> dict:
        return {"passphrase": self.dev.passphrase, "protocolVersion": PROTOCOL_VERSION}

    def get_version_info(self, params: dict) -> dict:
        return {"version": VERSION, "commitHash": "0" * 40, "buildTimestamp": "2026-11-30T00:00:00Z",
                "captiveCoreVersion": "paygate-devnet (no stellar-core)", "protocolVersion": PROTOCOL_VERSION}

    def _ledger_obj(self, seq: int) -> dict:
        info = self.dev.ledgers[seq]
        return {"hash": info.hash.hex(), "sequence": seq, "ledgerCloseTime": str(info.close_time),
                "headerXdr": info.header.to_xdr(), "metadataXdr": self.dev.close_meta(seq).to_xdr()}

    def get_latest_ledger(self, params: dict) -> dict:
        d = self.dev
        latest = self._window()[0]
        info = d.ledgers[latest]
        return {"id": info.hash.hex(), "protocolVersion": PROTOCOL_VERSION, "sequence": latest,
                "closeTime": str(info.close_time), "headerXdr": info.header.to_xdr(),
                "metadataXdr": d.close_meta(latest).to_xdr()}

    def get_ledgers(self, params: dict) -> dict:
        check_xdr_format(params)
        start = opt_int(params, "startLedger")
        pag = opt_obj(params, "pagination")
        cursor = opt_str(pag, "cursor")
        limit = opt_int(pag, "limit") or 50
        if limit > 200:
            raise invalid_params("limit must not exceed 200")
        latest, latest_ct, oldest, oldest_ct = self._window()
        if cursor:
            if start:
                raise invalid_params("startLedger and cursor cannot both be set")
            if not cursor.isdigit():
                raise invalid_params("invalid cursor")
            start = int(cursor) + 1
        elif not start or not oldest <= start <= latest:
            raise RpcError(INVALID_REQUEST, f"start ledger must be between the oldest ledger: {oldest} "
                           f"and the latest ledger: {latest} for this rpc instance")
        seqs = list(range(max(start, oldest), min(latest, start + limit - 1) + 1))
        ledgers = [self._ledger_obj(s) for s in seqs]
        return {"ledgers": ledgers, "latestLedger": latest, "latestLedgerCloseTime": latest_ct,
                "oldestLedger": oldest, "oldestLedgerCloseTime": oldest_ct,
                "cursor": str(seqs[-1]) if seqs else str(start - 1)}

    def get_fee_stats(self, params: dict) -> dict:
        d = self.dev
        soroban: list[int] = []
        classic: list[int] = []
        soroban_ledgers = classic_ledgers = 0
        for seq in range(d.latest, max(0, d.latest - SOROBAN_FEE_WINDOW), -1):
            recs = d.txs_by_ledger.get(seq, [])
            soroban_ledgers += 1
            if d.latest - seq < CLASSIC_FEE_WINDOW:
                classic_ledgers += 1
            for r in recs:
                if r.soroban:
                    soroban.append(r.fee_rate)
                elif d.latest - seq < CLASSIC_FEE_WINDOW:
                    classic.append(r.fee_rate)
        return {"sorobanInclusionFee": _distribution(soroban, soroban_ledgers),
                "inclusionFee": _distribution(classic, classic_ledgers), "latestLedger": d.latest}

    # ----- ledger entries -------------------------------------------------------------------------

    def get_ledger_entries(self, params: dict) -> dict:
        check_xdr_format(params)
        keys = params.get("keys")
        if keys is None:
            keys = []
        if not isinstance(keys, list):
            raise invalid_params("keys: expected a list of base64 LedgerKeys")
        if len(keys) > MAX_LEDGER_ENTRY_KEYS:
            raise invalid_params(f"key count ({len(keys)}) exceeds maximum supported ({MAX_LEDGER_ENTRY_KEYS})")
        d = self.dev
        lag = self.faults.peek("account_lag", "getLedgerEntries")
        latest = self._window()[0]  # node_lag: accounts as of the node's lagged latest ledger
        entries = []
        for i, b64 in enumerate(keys):
            try:
                key = decode_b64(b64, xdr.LedgerKey)
            except InvalidXdr as exc:
                raise invalid_params(f"cannot unmarshal key value {b64!r} at index {i}: invalid_xdr") from exc
            assert isinstance(key, xdr.LedgerKey)
            if key.type == xdr.LedgerEntryType.TTL:
                raise invalid_params("ledger ttl entries cannot be queried directly")
            if key.type == xdr.LedgerEntryType.ACCOUNT:
                assert key.account is not None
                g = account_id_to_g(key.account.account_id)
                behind = d.latest - latest + (lag.ledgers if lag else 0)
                acct = d.account_at(g, d.latest - behind) if behind else d.accounts.get(g)
                if acct is None:
                    continue
                entries.append({"key": key.to_xdr(), "xdr": acct.entry_data(g).to_xdr(),
                                "lastModifiedLedgerSeq": acct.last_modified})
                continue
            if key.type not in (xdr.LedgerEntryType.CONTRACT_DATA, xdr.LedgerEntryType.CONTRACT_CODE,
                                xdr.LedgerEntryType.TRUSTLINE):
                continue  # offers, claimable balances, … never exist on the devnet
            found = d.host.get_ledger_entry(key, d.latest)
            if found is None:
                continue
            entry, live_until = found
            item: dict[str, Any] = {"key": key.to_xdr(), "xdr": entry.data.to_xdr(),
                                    "lastModifiedLedgerSeq": entry.last_modified_ledger_seq.uint32}
            if key.type != xdr.LedgerEntryType.TRUSTLINE:
                item["liveUntilLedgerSeq"] = live_until if live_until is not None else 0
            entries.append(item)
        return {"entries": entries, "latestLedger": latest}

    # ----- transactions ---------------------------------------------------------------------------

    def parse_tx_param(self, params: dict) -> Parsed:
        check_xdr_format(params)
        b64 = params.get("transaction")
        if b64 is None:
            raise invalid_params("transaction: required")
        try:
            return parse_envelope(b64, self.dev.net_id)
        except InvalidXdr as exc:
            raise RpcError(INVALID_PARAMS, "invalid_xdr", str(exc)) from exc

    def send_transaction(self, params: dict, p: Parsed | None = None, *, forced_status: str | None = None
                         ) -> tuple[dict, Parsed | None]:
        if p is None:
            p = self.parse_tx_param(params)
        d = self.dev
        if forced_status is not None:
            status, err = forced_status, None
        else:
            status, err = d.submit(p)
        out: dict[str, Any] = {"status": status, "hash": p.full_hash.hex(), "latestLedger": d.latest,
                               "latestLedgerCloseTime": str(d.latest_info.close_time)}
        if err is not None:
            out["errorResultXdr"] = err.to_xdr()
            out["diagnosticEventsXdr"] = []
        return out, p if status == "PENDING" else None

    def _tx_fields(self, r: TxRecord) -> dict:
        return {"status": r.status, "applicationOrder": r.application_order, "feeBump": r.fee_bump,
                "envelopeXdr": r.envelope_xdr, "resultXdr": r.result_xdr, "resultMetaXdr": r.result_meta_xdr,
                "diagnosticEventsXdr": [],
                "events": {"transactionEventsXdr": [], "contractEventsXdr": r.contract_events},
                "ledger": r.ledger}

    def get_transaction(self, params: dict) -> dict:
        check_xdr_format(params)
        h = opt_str(params, "hash")
        if h is None:
            raise invalid_params("hash: required")
        if len(h) != 64:
            raise invalid_params(f"unexpected hash length ({len(h)})")
        try:
            bytes.fromhex(h)
        except ValueError as exc:
            raise invalid_params(f"incorrect hash: {exc}") from exc
        latest, latest_ct, oldest, oldest_ct = self._window()
        out: dict[str, Any] = {"txHash": h.lower(), "latestLedger": latest, "latestLedgerCloseTime": str(latest_ct),
                               "oldestLedger": oldest, "oldestLedgerCloseTime": str(oldest_ct)}
        r = self.dev.txs.get(h.lower())
        if r is None or r.ledger < oldest or r.ledger > latest:  # node_lag: not seen yet
            out["status"] = "NOT_FOUND"
            return out
        out.update(self._tx_fields(r))
        out["createdAt"] = str(r.created_at)
        return out

    def get_transactions(self, params: dict) -> dict:
        check_xdr_format(params)
        start = opt_int(params, "startLedger")
        pag = opt_obj(params, "pagination")
        cursor = opt_str(pag, "cursor")
        limit = opt_int(pag, "limit")
        if limit is None or limit == 0:
            limit = TXS_DEFAULT_LIMIT
        if limit > TXS_MAX_LIMIT:
            raise invalid_params(f"limit must not exceed {TXS_MAX_LIMIT}")
        latest, latest_ct, oldest, oldest_ct = self._window()
        after = (0, 0)
        if cursor:
            if start:
                raise RpcError(INVALID_REQUEST, "startLedger and cursor cannot both be set")
            if not cursor.isdigit() or int(cursor) >= 1 << 63:
                raise RpcError(INVALID_REQUEST, f"invalid cursor {cursor!r}")
            c = int(cursor)
            after = (c >> 32, (c >> 12) & 0xFFFFF)
            start = after[0]
            if start < oldest:
                raise RpcError(INVALID_REQUEST, f"start ledger must be between the oldest ledger: {oldest} "
                               f"and the latest ledger: {latest} for this rpc instance")
        else:
            if not start or not oldest <= start <= latest:
                raise RpcError(INVALID_REQUEST, f"start ledger must be between the oldest ledger: {oldest} "
                               f"and the latest ledger: {latest} for this rpc instance")
        found: list[dict] = []
        last = (start, 0)
        seq = start
        while seq <= latest and len(found) < limit:
            for r in self.dev.txs_by_ledger.get(seq, []):
                if (seq, r.application_order) <= after:
                    continue
                if len(found) >= limit:
                    break
                item = self._tx_fields(r)
                item["txHash"] = r.full_hash
                item["createdAt"] = r.created_at
                found.append(item)
                last = (seq, r.application_order)
            seq += 1
        if len(found) < limit:
            last = (latest, 0xFFFFF)  # scanned to the tip: resume after everything seen
        return {"transactions": found, "latestLedger": latest, "latestLedgerCloseTimestamp": latest_ct,
                "oldestLedger": oldest, "oldestLedgerCloseTimestamp": oldest_ct,
                "cursor": str(toid(last[0], last[1], 0))}

    # ----- events ---------------------------------------------------------------------------------

    def get_events(self, params: dict) -> dict:
        check_xdr_format(params)
        start = opt_int(params, "startLedger")
        end = opt_int(params, "endLedger")
        pag = opt_obj(params, "pagination")
        cursor = opt_str(pag, "cursor")
        limit = opt_int(pag, "limit")
        if limit is None or limit == 0:
            limit = EVENTS_DEFAULT_LIMIT
        if limit > EVENTS_MAX_LIMIT:
            raise invalid_params(f"limit must not exceed {EVENTS_MAX_LIMIT}")
        filters = _parse_filters(params.get("filters"))
        latest, latest_ct, oldest, oldest_ct = self._window()
        after: tuple[int, int, int, int] | None = None
        if cursor:
            if start or end:
                raise invalid_params("ledger ranges and cursor cannot both be set")
            try:
                after = parse_event_id(cursor)
            except ValueError as exc:
                raise invalid_params(str(exc)) from exc
            start = after[0]
        elif not start:
            raise invalid_params("startLedger must be positive")
        if end is not None and end <= start:
            raise invalid_params("endLedger must be after startLedger")
        if not oldest <= start <= latest:
            raise RpcError(INVALID_REQUEST,
                           f"startLedger must be within the ledger range: {oldest} - {latest}")
        stop = min(start + LEDGER_SCAN_LIMIT, latest + 1)
        if end is not None:
            stop = min(stop, end)
        found: list[dict] = []
        cursor_out = event_id(stop - 1, 0xFFFFF, 0xFFF, 0xFFFFFFFF)  # end of the scanned window
        done = False
        for seq in range(start, stop):
            for e in self.dev.events_by_ledger.get(seq, []):
                if after is not None and (e.ledger, e.tx_index, e.op_index, int(e.id[-10:])) <= after:
                    continue
                if filters and not any(_matches(f, e) for f in filters):
                    continue
                found.append({"type": "contract", "ledger": e.ledger,
                              "ledgerClosedAt": rfc3339(self.dev.ledgers[e.ledger].close_time),
                              "contractId": e.contract_id, "id": e.id, "operationIndex": e.op_index,
                              "transactionIndex": e.tx_index, "txHash": e.tx_hash,
                              "inSuccessfulContractCall": True, "topic": e.topics, "value": e.value})
                if len(found) >= limit:
                    cursor_out = e.id
                    done = True
                    break
            if done:
                break
        return {"events": found, "cursor": cursor_out, "latestLedger": latest, "oldestLedger": oldest,
                "latestLedgerCloseTime": str(latest_ct), "oldestLedgerCloseTime": str(oldest_ct)}

    # ----- simulation -----------------------------------------------------------------------------

    def simulate_transaction(self, params: dict) -> dict:
        from paygate_cli.devnet.simulate import simulate

        p = self.parse_tx_param(params)
        auth_mode = opt_str(params, "authMode")
        if auth_mode not in (None, "", "enforce", "record", "record_allow_nonroot"):
            raise invalid_params(f"invalid authMode {auth_mode!r}")
        upgraded = params.get("useUpgradedAuth")
        if upgraded is not None and not isinstance(upgraded, bool):
            raise invalid_params("useUpgradedAuth: expected a boolean")
        rc = opt_obj(params, "resourceConfig")
        leeway = opt_int(rc, "instructionLeeway") or 0
        return simulate(self.dev, p, auth_mode or None, True if upgraded is None else upgraded, leeway)


def _distribution(rates: list[int], ledger_count: int) -> dict:
    """FeeDistribution: all int64 fields are strings. With no transactions, every figure is the base fee."""
    s = sorted(rates) or [fees.BASE_FEE]

    def pct(n: int) -> str:
        return str(s[min(len(s) - 1, max(0, -(-n * len(s) // 100) - 1))])

    mode = max(set(s), key=lambda v: (s.count(v), -v))
    out = {"max": str(s[-1]), "min": str(s[0]), "mode": str(mode)}
    for n in (10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99):
        out[f"p{n}"] = pct(n)
    out["transactionCount"] = str(len(rates))
    out["ledgerCount"] = ledger_count
    return out


# ----- event filters --------------------------------------------------------------------------------

class _Filter:
    def __init__(self, types: set[str] | None, contracts: set[str] | None,
                 topics: list[list[str | bytes]]) -> None:
        self.types = types
        self.contracts = contracts
        self.topics = topics


def _parse_filters(raw: object) -> list[_Filter]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid_params("filters: expected a list")
    if len(raw) > 5:
        raise invalid_params("maximum 5 filters per request")
    out = []
    for i, f in enumerate(raw):
        if not isinstance(f, dict):
            raise invalid_params(f"filter {i + 1} invalid: expected an object")
        types = None
        t = f.get("type")
        if t is not None:
            if not isinstance(t, str):
                raise invalid_params(f"filter {i + 1} invalid: type must be a string")
            types = {x.strip() for x in t.split(",") if x.strip()}
            bad = types - {"contract", "system"}
            if bad:
                raise invalid_params(f"filter {i + 1} invalid: if set, type must be either 'contract' or 'system'")
        contracts = None
        cids = f.get("contractIds")
        if cids is not None:
            if not isinstance(cids, list):
                raise invalid_params(f"filter {i + 1} invalid: contractIds must be a list")
            if len(cids) > 5:
                raise invalid_params(f"filter {i + 1} invalid: maximum 5 contract IDs per filter")
            for c in cids:
                if not isinstance(c, str) or not StrKey.is_valid_contract(c):
                    raise invalid_params(f"filter {i + 1} invalid: contract ID {c!r} invalid")
            contracts = set(cids)
        topics: list[list[str | bytes]] = []
        tf = f.get("topics")
        if tf is not None:
            if not isinstance(tf, list):
                raise invalid_params(f"filter {i + 1} invalid: topics must be a list")
            if len(tf) > 5:
                raise invalid_params(f"filter {i + 1} invalid: maximum 5 topic filters per filter")
            for segs in tf:
                topics.append(_parse_topic_filter(segs, i + 1))
        out.append(_Filter(types, contracts, topics))
    return out


def _parse_topic_filter(segs: object, n: int) -> list[str | bytes]:
    if not isinstance(segs, list) or not 1 <= len(segs) <= 4:
        raise invalid_params(f"filter {n} invalid: topic filter must have 1 to 4 segments")
    out: list[str | bytes] = []
    for j, s in enumerate(segs):
        if s == "*":
            out.append("*")
        elif s == "**":
            if j != len(segs) - 1:
                raise invalid_params(f"filter {n} invalid: '**' is only allowed as the last segment")
            out.append("**")
        else:
            try:
                val = decode_b64(s, xdr.SCVal)
            except InvalidXdr as exc:
                raise invalid_params(f"filter {n} invalid: topic segment {s!r}: invalid_xdr") from exc
            assert isinstance(val, xdr.SCVal)
            out.append(val.to_xdr_bytes())  # canonical bytes, compared against the event's topics
    return out


def _matches(f: _Filter, e: Any) -> bool:
    if f.types is not None and "contract" not in f.types:
        return False
    if f.contracts is not None and e.contract_id not in f.contracts:
        return False
    if not f.topics:
        return True
    raw = [base64.b64decode(t) for t in e.topics]
    for segs in f.topics:
        if segs[-1] == "**":
            prefix = segs[:-1]
            if len(raw) < len(prefix):
                continue
        else:
            prefix = segs
            if len(raw) != len(prefix):
                continue
        if all(s == "*" or s == raw[k] for k, s in enumerate(prefix)):
            return True
    return False
