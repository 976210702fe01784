"""Stellar RPC methods over the devnet's ledger state, with stellar-rpc v28's wire field names and
types as its Go structs marshal them: int64s as strings where Go tags them `,string`, numbers
where it does not.

Each handler takes the params object (already `{}` for `null`) and returns the result object, or
raises RpcError. Handlers run under `Devnet.lock`, taken by the server.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections import Counter
from typing import TYPE_CHECKING, Any

from stellar_sdk import StrKey, xdr

from paygate_cli.sandbox.devnet.ledger import PROTOCOL_VERSION, Devnet, TxRecord
from paygate_cli.sandbox.devnet.validate import InvalidXdr, Parsed, decode_b64, parse_envelope
from paygate_cli.sandbox.devnet.xdrutil import (
    account_id_to_g,
    event_id,
    fee_bump_result,
    parse_event_id,
    toid,
    tx_result,
)

if TYPE_CHECKING:
    from paygate_cli.sandbox.devnet.faults import Faults

INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

MAX_LEDGER_ENTRY_KEYS = 200
EVENTS_DEFAULT_LIMIT, EVENTS_MAX_LIMIT = 100, 10_000
TXS_DEFAULT_LIMIT, TXS_MAX_LIMIT = 50, 200
LEDGERS_DEFAULT_LIMIT, LEDGERS_MAX_LIMIT = 50, 200
LEDGER_SCAN_LIMIT = 10_000
VERSION = "28.0.0-paygate-devnet"
# get_ledger_entries.go ledgerKeyEntryToResult: every entry carries its LedgerEntry.ext as extXdr; the
# devnet has no sponsorships, so each one is the empty v0 extension.
_EMPTY_ENTRY_EXT = xdr.LedgerEntryExt(0).to_xdr()


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


def check_xdr_format(params: dict, code: int = INVALID_PARAMS) -> None:
    """go-stellar-sdk protocols/rpc/format.go IsValidFormat; the code is the calling handler's (-32600
    where stellar-rpc folds it into the request's Validate, -32602 elsewhere). `json` is valid there but
    not served by the devnet: always -32602."""
    fmt = opt_str(params, "xdrFormat")
    if fmt not in (None, "", "base64"):
        if fmt == "json":
            raise invalid_params("xdrFormat json is not supported by the devnet; use base64")
        raise RpcError(code, f"got '{fmt}': expected base64, json for optional 'xdrFormat'")


def _strconv_error(fn: str, text: str) -> str:
    """The message Go's strconv gives for an unparsable number (stellar-rpc returns it verbatim)."""
    return f'strconv.{fn}: parsing "{text}": invalid syntax'


def rfc3339(ts: int) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Methods:
    def __init__(self, dev: Devnet, faults: Faults) -> None:
        self.dev = dev
        self.faults = faults
        self.friendbot_url: str | None = None  # set by the server once it knows its address
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
        out: dict[str, Any] = {"passphrase": self.dev.passphrase, "protocolVersion": PROTOCOL_VERSION}
        if self.friendbot_url:
            out["friendbotUrl"] = self.friendbot_url  # get_network.go; omitted when not configured
        return out

    def get_version_info(self, params: dict) -> dict:
        return {"version": VERSION, "commitHash": "0" * 40, "buildTimestamp": "2026-11-30T00:00:00Z",
                "captiveCoreVersion": "paygate-devnet (no stellar-core)", "protocolVersion": PROTOCOL_VERSION}

    def _ledger_obj(self, seq: int) -> dict:
        info = self.dev.ledgers[seq]
        # stellar-rpc get_ledgers.go parseLedgerInfo: headerXdr is the LedgerHeaderHistoryEntry,
        # metadataXdr the stored LedgerCloseMeta.
        return {"hash": info.hash.hex(), "sequence": seq, "ledgerCloseTime": str(info.close_time),
                "headerXdr": self.dev.header_entry(seq).to_xdr(), "metadataXdr": self.dev.close_meta_xdr(seq)}

    def get_latest_ledger(self, params: dict) -> dict:
        d = self.dev
        latest = self._window()[0]  # a lagging node (node_lag) answers as of its own latest ledger
        info = d.ledgers[latest]
        return {"id": info.hash.hex(), "protocolVersion": PROTOCOL_VERSION, "sequence": latest,
                # get_latest_ledger.go: here headerXdr is the bare LedgerHeader (unlike getLedgers).
                "closeTime": str(info.close_time), "headerXdr": info.header.to_xdr(),
                "metadataXdr": d.close_meta_xdr(latest)}

    def get_ledgers(self, params: dict) -> dict:
        """Validation as stellar-rpc: cmd/stellar-rpc/internal/methods/get_ledgers.go and
        go-stellar-sdk protocols/rpc/get_ledgers.go (ValidatePagination). Request validation
        (start/cursor, range, limit, format) is -32600; a cursor that does not parse as uint32 or points
        outside the retained range is -32602."""
        start = opt_int(params, "startLedger") or 0
        pag_raw = params.get("pagination")
        pag = opt_obj(params, "pagination")
        cursor = opt_str(pag, "cursor") or ""
        limit = opt_int(pag, "limit") or 0
        latest, latest_ct, oldest, oldest_ct = self._window()
        bad_page = RpcError(INVALID_REQUEST, f"start ledger ({start}) must be between the oldest ledger: {oldest} "
                            f"and the latest ledger: {latest} for this rpc instance")
        if pag_raw is not None and cursor:
            if start:
                raise RpcError(INVALID_REQUEST, f"startLedger ({start}) and cursor ({cursor}) cannot both be set")
        elif not oldest <= start <= latest:
            raise bad_page
        if limit > LEDGERS_MAX_LIMIT:
            raise RpcError(INVALID_REQUEST, f"limit must not exceed {LEDGERS_MAX_LIMIT}")
        check_xdr_format(params, INVALID_REQUEST)
        if cursor:
            if not cursor.isdigit() or int(cursor) >= 1 << 32:
                raise invalid_params(_strconv_error("ParseUint", cursor))
            start = int(cursor) + 1
            if not oldest <= start <= latest:
                raise invalid_params(f"cursor ('{cursor}') must be between the oldest ledger: {oldest} "
                                     f"and the latest ledger: {latest} for this rpc instance")
        limit = limit or LEDGERS_DEFAULT_LIMIT
        seqs = list(range(start, min(latest, start + limit - 1) + 1))
        ledgers = [self._ledger_obj(s) for s in seqs]
        return {"ledgers": ledgers, "latestLedger": latest, "latestLedgerCloseTime": latest_ct,
                "oldestLedger": oldest, "oldestLedgerCloseTime": oldest_ct,
                "cursor": str(seqs[-1]) if seqs else (cursor or str(start - 1))}

    def get_fee_stats(self, params: dict) -> dict:
        """stellar-rpc's fee windows (feewindow/feewindow.go): the inclusion fees CHARGED in the last
        `fee_window_soroban` / `fee_window_classic` ledgers, as stellar-rpc counts them: a Soroban
        transaction's whole inclusion fee (so a fee bump of a one-operation call shows twice its rate), a
        classic one's per operation; the surge fault's phantoms (one-operation, not fee-bumped) counted at
        what they were charged (docs/devnet.md "Fee market")."""
        d = self.dev
        soroban: list[int] = []
        classic: list[int] = []
        soroban_ledgers = classic_ledgers = 0
        for seq in range(d.latest, max(0, d.latest - max(d.fee_window_soroban, d.fee_window_classic)), -1):
            in_soroban, in_classic = d.latest - seq < d.fee_window_soroban, d.latest - seq < d.fee_window_classic
            soroban_ledgers += in_soroban
            classic_ledgers += in_classic
            for r in d.txs_by_ledger.get(seq, []):
                if r.soroban and in_soroban:
                    soroban.append(r.fee_stat)
                elif not r.soroban and in_classic:
                    classic.append(r.fee_stat)
            phantom = d.phantom_fees.get(seq)
            if phantom is not None and in_soroban:
                soroban += [phantom[0]] * phantom[1]
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
                raise invalid_params(f"cannot unmarshal key value {b64} at index {i}") from exc  # get_ledger_entries.go
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
                                "lastModifiedLedgerSeq": acct.last_modified, "extXdr": _EMPTY_ENTRY_EXT})
                continue
            if key.type not in (xdr.LedgerEntryType.CONTRACT_DATA, xdr.LedgerEntryType.CONTRACT_CODE,
                                xdr.LedgerEntryType.TRUSTLINE):
                continue  # offers, claimable balances, … never exist on the devnet
            found = d.host.get_ledger_entry(key, d.latest)
            if found is None:
                continue
            entry, live_until = found
            item: dict[str, Any] = {"key": key.to_xdr(), "xdr": entry.data.to_xdr(),
                                    "lastModifiedLedgerSeq": entry.last_modified_ledger_seq.uint32,
                                    "extXdr": entry.ext.to_xdr()}
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

    def send_transaction(self, params: dict, p: Parsed | None = None, *, forced_status: str | None = None,
                         forced_error: xdr.TransactionResultCode | None = None) -> tuple[dict, Parsed | None]:
        if p is None:
            p = self.parse_tx_param(params)
        d = self.dev
        if forced_status is not None:
            status, err = forced_status, None
        elif forced_error is not None:  # the reject_send fault: refused as stellar-core refuses bytes
            status = "ERROR"
            err = (fee_bump_result(p.fee, p.inner_hash, forced_error) if p.fee_bump
                   else tx_result(p.fee, forced_error))
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
                # get_transaction.go BuildEventsXDRFromTransaction: TransactionMetaV4's transaction-level
                # events (CAP-67 fees) and each operation's contract events.
                "events": {"transactionEventsXdr": r.transaction_events, "contractEventsXdr": r.contract_events},
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
        """Validation as stellar-rpc: cmd/stellar-rpc/internal/methods/get_transactions.go and
        go-stellar-sdk protocols/rpc/get_transactions.go (IsValid). IsValid failures (start/cursor,
        range, limit, format) are -32600; a cursor that does not parse as int64, or whose ledger the
        node does not hold, is -32602."""
        start = opt_int(params, "startLedger") or 0
        pag_raw = params.get("pagination")
        pag = opt_obj(params, "pagination")
        cursor = opt_str(pag, "cursor") or ""
        limit = opt_int(pag, "limit") or 0
        latest, latest_ct, oldest, oldest_ct = self._window()
        if pag_raw is not None and cursor:
            if start:
                raise RpcError(INVALID_REQUEST, "startLedger and cursor cannot both be set")
        elif not oldest <= start <= latest:
            raise RpcError(INVALID_REQUEST, f"start ledger must be between the oldest ledger: {oldest} "
                           f"and the latest ledger: {latest} for this rpc instance")
        if limit > TXS_MAX_LIMIT:
            raise RpcError(INVALID_REQUEST, f"limit must not exceed {TXS_MAX_LIMIT}")
        check_xdr_format(params, INVALID_REQUEST)
        limit = limit or TXS_DEFAULT_LIMIT
        after = (0, 0)
        if cursor:
            body = cursor[1:] if cursor[:1] in "+-" else cursor
            if not body.isdigit() or not -(1 << 63) <= int(cursor) < 1 << 63:
                raise invalid_params(_strconv_error("ParseInt", cursor))
            c = int(cursor)
            if c < 0:
                raise invalid_params("cursor ledger sequence cannot be negative")
            after = (c >> 32, (c >> 12) & 0xFFFFF)
            start = after[0]
            if start > latest:
                # Nothing to scan: stellar-rpc answers an empty page with the zero cursor.
                return {"transactions": [], "latestLedger": latest, "latestLedgerCloseTimestamp": latest_ct,
                        "oldestLedger": oldest, "oldestLedgerCloseTimestamp": oldest_ct, "cursor": "0"}
            if start < oldest:
                raise invalid_params(f"database does not contain metadata for ledger: {start}")
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
        """Validation as stellar-rpc: cmd/stellar-rpc/internal/methods/get_events.go and go-stellar-sdk
        protocols/rpc/get_events.go (GetEventsRequest.Valid). Everything Valid checks (format, cursor vs
        ledger range, startLedger, limit, filters) and an unparsable cursor are -32602; only a start
        outside the retained range is -32600. endLedger <= startLedger is not an error: the scan window
        is empty, so is the page."""
        start = opt_int(params, "startLedger") or 0
        end = opt_int(params, "endLedger") or 0
        pag = opt_obj(params, "pagination")
        cursor = opt_str(pag, "cursor")
        limit = opt_int(pag, "limit") or 0
        after: tuple[int, int, int, int] | None = None
        if cursor is not None:
            try:
                after = parse_event_id(cursor)
            except ValueError as exc:
                raise invalid_params(str(exc)) from exc  # the request does not decode
        check_xdr_format(params)
        if after is not None:
            if start or end:
                raise invalid_params("ledger ranges and cursor cannot both be set")
        elif not start:
            raise invalid_params("startLedger must be positive")
        if limit > EVENTS_MAX_LIMIT:
            raise invalid_params(f"limit must not exceed {EVENTS_MAX_LIMIT}")
        limit = limit or EVENTS_DEFAULT_LIMIT
        filters = _parse_filters(params.get("filters"))
        latest, latest_ct, oldest, oldest_ct = self._window()
        if after is not None:
            start = after[0]
        if not oldest <= start <= latest:
            raise RpcError(INVALID_REQUEST,
                           f"startLedger must be within the ledger range: {oldest} - {latest}")
        stop = min(start + LEDGER_SCAN_LIMIT, latest + 1)
        if end:
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
                              "inSuccessfulContractCall": e.successful, "topic": e.topics, "value": e.value})
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
        """Input problems are answered in `result.error` with HTTP 200 and `latestLedger: 0`, in
        stellar-rpc's order and words (cmd/stellar-rpc/internal/methods/simulate_transaction.go):
        xdrFormat, undecodable or missing transaction, operation count, memo, then authMode against the
        operation. Only a param of the wrong JSON type is a -32602 (jrpc2 fails to decode the request)."""
        from paygate_cli.sandbox.devnet.simulate import simulate, simulate_input_error

        fmt = opt_str(params, "xdrFormat")
        auth_mode = opt_str(params, "authMode") or ""
        tx_b64 = opt_str(params, "transaction")
        upgraded = params.get("useUpgradedAuth")
        if upgraded is not None and not isinstance(upgraded, bool):
            raise invalid_params("useUpgradedAuth: expected a boolean")
        rc = opt_obj(params, "resourceConfig")
        leeway = opt_int(rc, "instructionLeeway") or 0
        if fmt not in (None, "", "base64", "json"):
            return {"error": f"got '{fmt}': expected base64, json for optional 'xdrFormat'", "latestLedger": 0}
        if fmt == "json":
            return {"error": "xdrFormat json is not supported by the devnet; use base64", "latestLedger": 0}
        try:
            p = parse_envelope(tx_b64 or "", self.dev.net_id)
        except InvalidXdr:
            return {"error": "Could not unmarshal transaction", "latestLedger": 0}
        err = simulate_input_error(p, auth_mode)
        if err is not None:
            return {"error": err, "latestLedger": 0}
        # stellar-rpc (validateAuthMode): absent authMode is enforce when the op carries auth, else record;
        # useUpgradedAuth is a plain bool there, so absent means false: legacy ADDRESS credentials.
        return simulate(self.dev, p, auth_mode or None, bool(upgraded), leeway)


def _distribution(rates: list[int], ledger_count: int) -> dict:
    """FeeDistribution: all int64 fields are strings. stellar-rpc's computeFeeDistribution: nearest-rank
    percentiles (the ceil(p * n / 100)-th smallest), the mode the most frequent value (the smallest of
    equally frequent ones). With no transactions, every figure is 0 (as stellar-rpc answers)."""
    s = sorted(rates) or [0]

    def pct(n: int) -> str:
        return str(s[min(len(s) - 1, max(0, -(-n * len(s) // 100) - 1))])

    counts = Counter(s)
    mode = max(counts, key=lambda v: (counts[v], -v))
    out = {"max": str(s[-1]), "min": str(s[0]), "mode": str(mode)}
    for n in (10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99):
        out[f"p{n}"] = pct(n)
    out["transactionCount"] = str(len(rates))
    out["ledgerCount"] = ledger_count
    return out


# ----- event filters --------------------------------------------------------------------------------

class _Filter:
    def __init__(self, types: set[str] | None, contracts: set[str] | None,
                 topics: list[list[str | bytes]], contract_list: list[str]) -> None:
        self.types = types
        self.contracts = contracts
        self.topics = topics
        self.contract_list = contract_list


def _parse_filters(raw: object) -> list[_Filter]:
    """Decode and validate `filters` with go-stellar-sdk protocols/rpc/get_events.go's rules and words
    (GetEventsRequest.Valid, EventFilter.Valid, TopicFilter.Valid). All failures are -32602."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid_params("filters: expected a list")
    decoded = [_decode_filter(f) for f in raw]  # JSON decoding precedes validation in stellar-rpc
    if len(decoded) > 5:
        raise invalid_params("maximum 5 filters per request")
    for i, f in enumerate(decoded, 1):
        err = _filter_error(f)
        if err:
            raise invalid_params(f"filter {i} invalid: {err}")
    return decoded


def _decode_filter(f: object) -> _Filter:
    if not isinstance(f, dict):
        raise invalid_params("filter: expected an object")
    t = f.get("type")
    if t is not None and not isinstance(t, str):
        raise invalid_params("filter type: expected a string")
    types = set(t.split(",")) if t else None  # EventTypeSet.UnmarshalJSON: split on ",", no trimming
    cids = f.get("contractIds")
    if cids is not None and (not isinstance(cids, list) or not all(isinstance(c, str) for c in cids)):
        raise invalid_params("filter contractIds: expected a list of strings")
    tf = f.get("topics")
    if tf is not None and (not isinstance(tf, list) or not all(isinstance(x, list) for x in tf)):
        raise invalid_params("filter topics: expected a list of lists")
    topics: list[list[str | bytes]] = []
    for segs in tf or []:
        out: list[str | bytes] = []
        for seg in segs:
            if not isinstance(seg, str):
                raise invalid_params("topic segment: expected a string")
            if seg in ("*", "**"):
                out.append(seg)
                continue
            try:
                val = decode_b64(seg, xdr.SCVal)
            except InvalidXdr as exc:
                raise invalid_params(f"topic segment {seg!r}: invalid_xdr") from exc
            assert isinstance(val, xdr.SCVal)
            out.append(val.to_xdr_bytes())  # canonical bytes, compared against the event's topics
        topics.append(out)
    return _Filter(types, set(cids) if cids else None, topics, list(cids or []))


def _filter_error(f: _Filter) -> str | None:
    if f.types and f.types - {"system", "contract"}:
        return "filter type invalid: if set, type must be either 'system' or 'contract'"
    if len(f.contract_list) > 5:
        return "maximum 5 contract IDs per filter"
    if len(f.topics) > 5:
        return "maximum 5 topics per filter"
    for j, c in enumerate(f.contract_list, 1):
        if not StrKey.is_valid_contract(c):
            return f"contract ID {j} invalid"
    for k, segs in enumerate(f.topics, 1):
        if not segs:
            return f"topic {k} invalid: topic must have at least 1 segment"
        body = segs[:-1] if segs[-1] == "**" else segs
        for m, seg in enumerate(body, 1):
            if seg == "**":
                return f"topic {k} invalid: segment {m} invalid: wildcard '**' is only allowed as the last segment"
        if len(body) > 4:
            return f"topic {k} invalid: topic cannot have more than 4 segments"
    return None


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
