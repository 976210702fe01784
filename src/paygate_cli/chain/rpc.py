"""Stellar RPC client: one write endpoint, a list of read endpoints, bounded transport retries,
per-endpoint probes for the reads that decide money, and the rule-2 guard on every call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import requests
from stellar_sdk import SorobanServer, xdr
from stellar_sdk.client.requests_client import RequestsClient
from stellar_sdk.exceptions import BadResponseError, SorobanRpcErrorResponse
from stellar_sdk.exceptions import ConnectionError as SdkConnectionError
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

from paygate_cli.chain.accounts import (
    AccountView,
    Endpoint,
    MalformedAnswer,
    NoAnswer,
    RpcErrorAnswer,
    decode_account_seq,
    read_account_sequence,
    read_account_views,
    request_body,
    result_of,
)
from paygate_cli.chain.accounts import LaneMissing as LaneMissing  # re-exported: callers catch it from here
from paygate_cli.chain.accounts import LaneNotVisible as LaneNotVisible
from paygate_cli.chain.health import quorum_need
from paygate_cli.db.connect import assert_not_in_transaction
from paygate_cli.endpoints import endpoint_name, redact_urls
from paygate_cli.errors import ConfigError, Unavailable

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.settings import Settings

T = TypeVar("T")


# The answer never came or came garbled: the request may or may not have taken effect.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    SdkConnectionError, BadResponseError, requests.RequestException, ValueError,
)
# What the SDK lets escape when an answer's JSON has an unexpected shape (it asserts `result is not
# None`, indexes dicts, ...). Caught only around the one SDK call in _retrying and reported as a
# malformed answer naming the exception type (a bug in what we hand the SDK would show there too).
_SDK_SHAPE_ERRORS = (AssertionError, KeyError, TypeError, AttributeError, IndexError)


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, SorobanRpcErrorResponse):
        return exc.code in (-32603, -32001)  # internal error / over the processing limit
    return isinstance(exc, TRANSPORT_ERRORS)


def _pin_sdk_models() -> list[Any]:
    """The SDK builds `Request[GetLedgerEntriesRequest]`, `Response[Any]` … on every call, and pydantic
    caches parametrised models only weakly: once the garbage collector drops one, the next call
    builds the model class again (~1-3 ms each, several per tick). Holding them for the life of the
    process makes every later call a cache hit."""
    from stellar_sdk import soroban_rpc as m

    requests_ = [m.GetLedgerEntriesRequest, m.GetTransactionRequest, m.SimulateTransactionRequest,
                 m.SendTransactionRequest, m.GetEventsRequest]
    return [m.Response[Any], *(m.Request[r] for r in requests_)]


_SDK_MODELS = _pin_sdk_models()


@dataclass(frozen=True)
class LatestLedger:
    sequence: int
    close_time: int


@dataclass(frozen=True)
class QuorumLedger(LatestLedger):
    """A latest ledger a majority of the distinct read hosts have each reached (`sequence`), with the
    highest any host claimed: a wide gap means a host lags or lies."""

    highest: int = 0
    answered: int = 0
    hosts: int = 0


@dataclass(frozen=True)
class SendOutcome:
    """What one sendTransaction said. `status` is PENDING/DUPLICATE/TRY_AGAIN_LATER/ERROR, or
    UNKNOWN when no answer arrived (the envelope may or may not be queued)."""

    status: str
    code: str | None = None  # ERROR: the transaction result code (inner code for fee bumps)
    detail: str | None = None

    @property
    def label(self) -> str:
        return f"ERROR {self.code}" if self.status == "ERROR" else self.status


# The fields of stellar-rpc's FeeDistribution that are string-encoded uint64s (ledgerCount is a number).
FEE_DISTRIBUTION_FIELDS = ("max", "min", "mode", "p10", "p20", "p30", "p40", "p50", "p60", "p70", "p80", "p90",
                           "p95", "p99", "transactionCount")


@dataclass(frozen=True)
class LedgerTransaction:
    """One transaction of a ledger as getTransactions shows it (ChainClient.ledger_transactions)."""
    inner_hash: bytes  # computed from the envelope: a fee bump's inner transaction's hash
    transaction: Any  # the inner stellar_sdk Transaction
    fee_source: str | None  # a fee bump's fee account, else None
    status: str
    ledger: int


@dataclass(frozen=True)
class FeeDistribution:
    """One of getFeeStats' distributions: inclusion fees charged per operation (stroops) over the
    node's recent ledgers, by percentile (`p10`..`p99`, `max`, `min`, `mode`)."""

    values: dict[str, int]  # every FEE_DISTRIBUTION_FIELDS name but transactionCount
    transaction_count: int
    ledger_count: int

    def percentile(self, name: str) -> int:
        return self.values[name]


@dataclass(frozen=True)
class FeeStats:
    """getFeeStats as one read endpoint answered it (`endpoint`: host only, a URL may carry a key)."""

    soroban_inclusion_fee: FeeDistribution
    inclusion_fee: FeeDistribution
    latest_ledger: int
    endpoint: str


@dataclass(frozen=True)
class Probe:
    """One read endpoint's view of one lineage: the source account's sequence first, then the
    transaction by hash (docs/architecture.md §4: in that order, so a NOT_FOUND can be checked for coverage)."""

    endpoint: str
    error: str | None = None
    account_seq: int | None = None
    seq_ledger: int | None = None  # the latest ledger of the sequence read
    tx_status: str | None = None  # SUCCESS / FAILED / NOT_FOUND
    tx_ledger: int | None = None
    fee_charged: int | None = None
    result_code: str | None = None
    latest_ledger: int | None = None
    latest_close_time: int | None = None
    oldest_ledger: int | None = None


class ChainClient:
    def __init__(self, settings: Settings, guard_conn: psycopg.Connection | None = None) -> None:
        if not settings.rpc_url:
            raise ConfigError("no Stellar RPC configured: set PAYGATE_RPC_URL")
        timeout = settings.rpc_timeout

        def server(url: str) -> SorobanServer:
            # No silent SDK retries: we decide what is retried (sends only with the same bytes).
            client = RequestsClient(num_retries=0, request_timeout=int(max(1, timeout)), post_timeout=timeout)
            # RPC endpoints are configured explicitly; without this, requests scans the environment for
            # proxy settings on every call (~1 ms each).
            client._session.trust_env = False
            return SorobanServer(url, client=client)

        from paygate_cli.settings import distinct_read_urls

        self.write_url = settings.rpc_url
        # One vote per distinct host (docs/architecture.md §4): `url` and `url/` are one node, not a majority of two.
        self.read_urls = distinct_read_urls(list(settings.rpc_read_urls), settings.rpc_url)
        self.write = server(self.write_url)
        self.readers = [server(url) for url in self.read_urls]
        self.passphrase = settings.network_passphrase
        self.guard_conn = guard_conn
        self._sequence_endpoints: tuple[Endpoint, list[Endpoint]] | None = None

    def close(self) -> None:
        for srv in {id(s): s for s in [self.write, *self.readers]}.values():
            srv.close()

    # -- plumbing -------------------------------------------------------------------------------

    def _guard(self, what: str) -> None:
        """docs/architecture.md §1 rule 2: refuse to talk to the chain while the caller holds a transaction open."""
        if self.guard_conn is not None:
            assert_not_in_transaction(self.guard_conn, what)

    def _retrying(self, what: str, fn: Callable[[], T], attempts: int = 3) -> T:
        @retry(stop=stop_after_attempt(attempts), wait=wait_random_exponential(multiplier=0.1, max=1.0),
               retry=retry_if_exception(_transient), reraise=True)
        def call() -> T:
            try:
                return fn()
            except _SDK_SHAPE_ERRORS as exc:
                raise MalformedAnswer(f"{what}: malformed answer ({type(exc).__name__})") from None

        try:
            return call()
        except TRANSPORT_ERRORS as exc:
            # The library's text quotes the URL it failed on: host only (a path or query may hold a key).
            raise Unavailable(f"Stellar RPC unavailable for {what}: {type(exc).__name__}: {redact_urls(str(exc))}"
                              [:500], msgid="rpc.unavailable") from None

    def _first_healthy(self, what: str, fn: Callable[[SorobanServer], T]) -> T:
        last: Exception | None = None
        for srv in self.readers:
            try:
                return self._retrying(what, lambda srv=srv: fn(srv), attempts=3)
            except Unavailable as exc:
                last = exc
        assert last is not None
        raise last

    # -- ordinary reads -------------------------------------------------------------------------

    def latest_ledger(self) -> LatestLedger:
        self._guard("getLatestLedger")
        answer = self._first_healthy("getLatestLedger", lambda s: s.get_latest_ledger())
        return LatestLedger(int(answer.sequence), int(answer.close_time))

    def latest_ledger_quorum(self) -> QuorumLedger:
        """The latest ledger for a terminal decision (an authorisation's expiry): the highest ledger
        that a majority of the distinct read hosts have each reached. One node's word is not enough:
        a lagging node only delays the decision, but a lying, forked or wrong-network node can claim
        any future ledger, and an expiry taken from it would end a user's item that can still land.
        Unavailable when fewer than a majority answer."""
        self._guard("getLatestLedger")
        heads: list[LatestLedger] = []
        said: list[str] = []  # what each host said, in order: the evidence when no decision can be taken
        for url, srv in zip(self.read_urls, self.readers, strict=True):
            try:
                answer = self._retrying("getLatestLedger", lambda srv=srv: srv.get_latest_ledger(), attempts=2)
                heads.append(LatestLedger(_ledger_number(answer.sequence, "getLatestLedger sequence"),
                                          _timestamp(int(answer.close_time), "getLatestLedger closeTime")))
                said.append(f"{endpoint_name(url)}: ledger {heads[-1].sequence}")
            except (Unavailable, SorobanRpcErrorResponse, MalformedAnswer, TypeError, ValueError) as exc:
                said.append(f"{endpoint_name(url)}: {str(exc)[:120]}")
        need = quorum_need(len(self.readers))
        if len(heads) < need:
            raise Unavailable(f"getLatestLedger: {len(heads)} of {len(self.readers)} read hosts answered, a "
                              f"decision needs {need} ({'; '.join(said)})"[:500], msgid="rpc.no_quorum")
        heads.sort(key=lambda h: h.sequence, reverse=True)
        proven = heads[need - 1]
        return QuorumLedger(proven.sequence, proven.close_time, highest=heads[0].sequence,
                            answered=len(heads), hosts=len(self.readers))

    def fee_stats(self) -> FeeStats:
        """Ordinary read (the fee market's price: journal/fee_market.py), first healthy read
        endpoint. An answer that does not parse is no answer (Unavailable after the retries), never
        a price of zero."""
        self._guard("getFeeStats")

        def read(url: str, srv: SorobanServer) -> FeeStats:
            answer = srv._client.post(srv.server_url, json_data=request_body("getFeeStats", {}))
            try:
                result = result_of(answer.status_code, answer.text)
            except (NoAnswer, RpcErrorAnswer) as exc:
                # ValueError (MalformedAnswer): retried, then Unavailable, like a lost answer.
                raise MalformedAnswer(f"getFeeStats: {exc}") from None
            return fee_stats_of(result, endpoint_name(url))

        last: Exception | None = None
        for url, srv in zip(self.read_urls, self.readers, strict=True):
            try:
                return self._retrying("getFeeStats", lambda url=url, srv=srv: read(url, srv), attempts=2)
            except Unavailable as exc:
                last = exc
        assert last is not None
        raise last

    def ledger_entries(self, keys: list[xdr.LedgerKey]) -> Any:
        self._guard("getLedgerEntries")
        return self._first_healthy("getLedgerEntries", lambda s: s.get_ledger_entries(keys))

    def account_sequence(self, address: str) -> int:
        """Ordinary read (allocation). Decisions use probe() instead. The policy and the decode are
        chain/accounts.py's (shared with the SDK-free `nonce-inspect --lane`); here they run over
        this client's pooled sessions, so an allocation pays no new connection."""
        if self._sequence_endpoints is None:
            self._sequence_endpoints = (_session_endpoint(self.write_url, self.write),
                                        [_session_endpoint(u, s) for u, s in zip(self.read_urls, self.readers,
                                                                                  strict=True)])
        write, readers = self._sequence_endpoints
        return read_account_sequence(address, write=write, readers=readers, guard=self._guard)

    def account_views(self, address: str) -> list[AccountView]:
        """The account as each distinct read host sees it: for a decision a majority must agree on
        (a lane's sequence against the journal's). One getLedgerEntries per host."""
        if self._sequence_endpoints is None:
            self._sequence_endpoints = (_session_endpoint(self.write_url, self.write),
                                        [_session_endpoint(u, s) for u, s in zip(self.read_urls, self.readers,
                                                                                  strict=True)])
        return read_account_views(address, readers=self._sequence_endpoints[1], guard=self._guard)

    def ledger_transactions(self, ledger: int, *, page_limit: int = 200, max_pages: int = 10
                            ) -> list[LedgerTransaction]:
        """Evidence, never a decision: the transactions of `ledger` as the first healthy read endpoint
        pages them (getTransactions from that ledger, by cursor until a page passes it or `max_pages`
        pages), each envelope decoded and its inner hash computed here, never taken from the answer.
        Foreign bytes that do not decode are no evidence either way and are skipped."""
        from stellar_sdk import FeeBumpTransactionEnvelope, TransactionEnvelope

        self._guard("getTransactions")

        def page(params: dict[str, Any]) -> Callable[[SorobanServer], Any]:
            def one(srv: SorobanServer) -> Any:
                answer = srv._client.post(srv.server_url, json_data=request_body("getTransactions", params))
                return result_of(answer.status_code, answer.text)
            return one

        found: list[LedgerTransaction] = []
        params: dict[str, Any] = {"startLedger": ledger, "pagination": {"limit": page_limit}}
        for _ in range(max_pages):
            answer = self._first_healthy("getTransactions", page(params))
            items = answer.get("transactions") or []
            for item in items:
                if item.get("ledger") != ledger:
                    continue
                try:
                    envelope = xdr.TransactionEnvelope.from_xdr(item["envelopeXdr"])
                    if envelope.type == xdr.EnvelopeType.ENVELOPE_TYPE_TX_FEE_BUMP:
                        bump = FeeBumpTransactionEnvelope.from_xdr(item["envelopeXdr"], self.passphrase)
                        inner, fee_source = bump.transaction.inner_transaction_envelope, \
                            bump.transaction.fee_source.account_id
                    else:
                        inner, fee_source = TransactionEnvelope.from_xdr(item["envelopeXdr"], self.passphrase), None
                except Exception:  # foreign bytes we cannot read are no evidence either way
                    continue
                found.append(LedgerTransaction(inner_hash=inner.hash(), transaction=inner.transaction,
                                               fee_source=fee_source, status=str(item.get("status")), ledger=ledger))
            last = items[-1].get("ledger") if items else None
            if len(items) < page_limit or not isinstance(last, int) or last > ledger or not answer.get("cursor"):
                break
            params = {"pagination": {"cursor": answer["cursor"], "limit": page_limit}}
        return found

    def source_transactions(self, source: str, ledger: int, *, above: int, through: int) -> list[dict[str, Any]]:
        """Evidence, never a decision: the transactions of `ledger` whose inner transaction has
        `source` as its source account and a sequence number in (above, through]. Hash, sequence,
        status and operation types only."""
        return [{"hash": t.inner_hash.hex(), "ledger": ledger, "seq": t.transaction.sequence, "status": t.status,
                 "operations": [type(op).__name__ for op in t.transaction.operations]}
                for t in self.ledger_transactions(ledger)
                if t.transaction.source.account_id == source and above < t.transaction.sequence <= through]

    def simulate(self, tx: Any) -> Any:
        self._guard("simulateTransaction")
        return self._retrying("simulateTransaction", lambda: self.write.simulate_transaction(tx))

    # -- the write ------------------------------------------------------------------------------

    def send(self, envelope_xdr: str) -> SendOutcome:
        """sendTransaction of exactly these bytes. A transport failure is UNKNOWN, never an error:
        the envelope may be queued, so the caller resends the same bytes or resolves by hash."""
        self._guard("sendTransaction")
        try:
            answer = self._retrying("sendTransaction", lambda: self.write.send_transaction(envelope_xdr))
        except Unavailable as exc:
            return SendOutcome("UNKNOWN", detail=str(exc))
        except SorobanRpcErrorResponse as exc:
            if exc.code == -32602:  # invalid params: these bytes will never be accepted
                return SendOutcome("ERROR", code="invalid_xdr", detail=exc.message)
            return SendOutcome("UNKNOWN", detail=f"RPC error {exc.code}: {exc.message}")
        status = answer.status.value if hasattr(answer.status, "value") else str(answer.status)
        if status != "ERROR":
            return SendOutcome(status)
        try:
            code = result_code_of(answer.error_result_xdr)
        except MalformedAnswer as exc:  # an ERROR we cannot read proves nothing: resend or resolve by hash
            return SendOutcome("UNKNOWN", detail=f"sendTransaction ERROR with {exc}")
        if code is None:
            return SendOutcome("UNKNOWN", detail="sendTransaction ERROR without errorResultXdr")
        return SendOutcome("ERROR", code=code)

    # -- reads that decide money ----------------------------------------------------------------

    def probe(self, lane: str, inner_hash_hex: str, *, receipt_first: bool = False) -> list[Probe]:
        """Per read endpoint: the lane's sequence, then getTransaction(inner hash).

        `receipt_first`: ask getTransaction first, and stop there when it has the receipt (a receipt
        proves inclusion whatever the order of reads; the order only matters for a NOT_FOUND, and
        that one is then read again after the sequence). One call instead of two per endpoint for a
        transaction that has landed, the common case for a worker resolving last tick's sends."""
        from stellar_sdk import Keypair

        self._guard("lineage probe")
        key = xdr.LedgerKey(type=xdr.LedgerEntryType.ACCOUNT, account=xdr.LedgerKeyAccount(
            account_id=Keypair.from_public_key(lane).xdr_account_id()))
        probes = []
        for url, srv in zip(self.read_urls, self.readers, strict=True):
            name = endpoint_name(url)  # what a probe is known by: the URL may carry an API key
            if receipt_first:
                try:
                    tx = self._retrying("getTransaction", lambda srv=srv: srv.get_transaction(inner_hash_hex), 2)
                except (Unavailable, SorobanRpcErrorResponse) as exc:
                    probes.append(Probe(name, error=str(exc)[:300]))
                    continue
                try:
                    receipt = probe_from_answers(name, lane, inner_hash_hex, None, tx)
                except MalformedAnswer as exc:  # validated like any answer: never proof
                    probes.append(Probe(name, error=f"malformed answer: {exc}"[:300]))
                    continue
                if receipt.tx_status in ("SUCCESS", "FAILED"):
                    probes.append(receipt)
                    continue
            try:
                entries = self._retrying("getLedgerEntries", lambda srv=srv: srv.get_ledger_entries([key]), 2)
                tx = self._retrying("getTransaction", lambda srv=srv: srv.get_transaction(inner_hash_hex), 2)
            except (Unavailable, SorobanRpcErrorResponse) as exc:
                probes.append(Probe(name, error=str(exc)[:300]))
                continue
            try:
                probes.append(probe_from_answers(name, lane, inner_hash_hex, entries, tx))
            except MalformedAnswer as exc:  # never proof of anything: this endpoint's view is "unknown"
                probes.append(Probe(name, error=f"malformed answer: {exc}"[:300]))
        return probes


# -- reading answers: an RPC node is outside paygate, so its answers are validated, not trusted ------
# The SDK's models check JSON types (a wrong type or a missing field is a ValueError, i.e. "no
# answer"); what they cannot see is checked here: XDR that does not decode, an answer about another
# transaction or another account, ledgers that contradict each other, a status its own result
# contradicts. Any of these makes the endpoint's view "unknown" (MalformedAnswer), never a verdict.

MAX_LEDGER = 2**31 - 1  # ledger numbers are stored as integer columns; beyond that is not a real chain
SUCCESS_CODES = ("txSUCCESS", "txFEE_BUMP_INNER_SUCCESS")


def _ledger_number(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LEDGER:
        raise MalformedAnswer(f"{what} {str(value)[:40]!r} is not a ledger number")
    return value


def _timestamp(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise MalformedAnswer(f"{what} {str(value)[:40]!r} is not a unix time")
    return value


def probe_from_answers(url: str, lane: str, inner_hash_hex: str, entries: Any, tx: Any) -> Probe:
    """One endpoint's Probe from its getLedgerEntries (the lane's account) and getTransaction answers,
    or MalformedAnswer when they do not hold together. `entries` None: a receipt-only probe (no
    sequence read), which can prove inclusion but never a NOT_FOUND verdict."""
    seq = seq_ledger = None
    if entries is not None:
        seq_ledger = _ledger_number(entries.latest_ledger, "getLedgerEntries latestLedger")
        listed = entries.entries or []
        if not isinstance(listed, list) or len(listed) > 1:
            raise MalformedAnswer("getLedgerEntries returned more entries than the one key asked for")
        seq = decode_account_seq(listed[0].xdr, lane) if listed else None
    if str(tx.transaction_hash).lower() != inner_hash_hex.lower():
        raise MalformedAnswer(f"getTransaction answered for another hash ({str(tx.transaction_hash)[:70]!r})")
    latest = _ledger_number(tx.latest_ledger, "getTransaction latestLedger")
    oldest = _ledger_number(tx.oldest_ledger, "getTransaction oldestLedger")
    if oldest > latest:
        raise MalformedAnswer(f"getTransaction oldestLedger {oldest} is past its latestLedger {latest}")
    close_time = _timestamp(tx.latest_ledger_close_time, "getTransaction latestLedgerCloseTime")
    status = tx.status.value if hasattr(tx.status, "value") else str(tx.status)
    if status not in ("SUCCESS", "FAILED", "NOT_FOUND"):
        raise MalformedAnswer(f"getTransaction status {status[:40]!r}")
    ledger = fee = code = None
    if status != "NOT_FOUND":
        ledger = _ledger_number(tx.ledger, "getTransaction ledger")
        if not oldest <= ledger <= latest or ledger == 0:
            raise MalformedAnswer(f"transaction ledger {ledger} is outside the answer's window {oldest}..{latest}")
        if not tx.result_xdr:
            raise MalformedAnswer(f"getTransaction {status} without resultXdr")
        code, fee = result_code_of(tx.result_xdr), fee_charged_of(tx.result_xdr)
        if (code in SUCCESS_CODES) != (status == "SUCCESS"):
            raise MalformedAnswer(f"getTransaction status {status} contradicts its result {code}")
        if fee is None or fee < 0:
            raise MalformedAnswer(f"getTransaction fee charged {fee} is not a fee")
    return Probe(url, account_seq=seq, seq_ledger=seq_ledger, tx_status=status, tx_ledger=ledger,
                 fee_charged=fee, result_code=code, latest_ledger=latest, latest_close_time=close_time,
                 oldest_ledger=oldest)


def _fee_number(value: Any, what: str) -> int:
    """A uint64 as stellar-rpc sends it (a decimal string; a plain number accepted too)."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise MalformedAnswer(f"getFeeStats {what} {str(value)[:40]!r} is not a fee")
    if not 0 <= number < 2**63:
        raise MalformedAnswer(f"getFeeStats {what} {number} is out of range")
    return number


def fee_distribution_of(raw: Any, what: str) -> FeeDistribution:
    if not isinstance(raw, dict):
        raise MalformedAnswer(f"getFeeStats {what} is not a FeeDistribution")
    values = {name: _fee_number(raw.get(name), f"{what}.{name}") for name in FEE_DISTRIBUTION_FIELDS}
    ledgers = _ledger_number(raw.get("ledgerCount"), f"getFeeStats {what}.ledgerCount")
    count = values.pop("transactionCount")
    return FeeDistribution(values, count, ledgers)


def fee_stats_of(result: Any, endpoint: str) -> FeeStats:
    """A getFeeStats result, checked (MalformedAnswer when it does not hold together)."""
    if not isinstance(result, dict):
        raise MalformedAnswer("getFeeStats answered no object")
    soroban = fee_distribution_of(result.get("sorobanInclusionFee"), "sorobanInclusionFee")
    classic = fee_distribution_of(result.get("inclusionFee"), "inclusionFee")
    latest = _ledger_number(result.get("latestLedger"), "getFeeStats latestLedger")
    return FeeStats(soroban, classic, latest, endpoint)


def _session_endpoint(url: str, srv: SorobanServer) -> Endpoint:
    """A JSON-RPC endpoint for chain/accounts.py over the SDK client's session (its timeouts, no
    proxies from the environment, no silent retries)."""

    def post(method: str, params: dict[str, Any]) -> Any:
        try:
            answer = srv._client.post(srv.server_url, json_data=request_body(method, params))
        except (SdkConnectionError, requests.RequestException) as exc:
            raise NoAnswer(f"{type(exc).__name__}: {redact_urls(str(exc))}"[:300]) from None
        return result_of(answer.status_code, answer.text)

    return Endpoint(url, post)


def result_code_of(result_xdr: str | None) -> str | None:
    """The transaction result code; for a fee bump, the inner transaction's code (what matters).
    MalformedAnswer when the bytes are not a TransactionResult."""
    if not result_xdr:
        return None
    try:
        return _result_code(result_xdr)
    except Exception as exc:  # any decode failure of foreign bytes
        raise MalformedAnswer(f"result XDR does not decode ({type(exc).__name__})") from None


def _result_code(result_xdr: str) -> str:
    result = xdr.TransactionResult.from_xdr(result_xdr).result
    code = result.code
    if code in (xdr.TransactionResultCode.txFEE_BUMP_INNER_SUCCESS, xdr.TransactionResultCode.txFEE_BUMP_INNER_FAILED):
        inner = result.inner_result_pair.result.result
        inner_code = inner.code.name
        if inner.code == xdr.TransactionResultCode.txFAILED and inner.results:
            op = inner.results[0]
            if op.tr is not None and op.tr.invoke_host_function_result is not None:
                inner_code += f"/{op.tr.invoke_host_function_result.code.name}"
        return inner_code
    return code.name


def fee_charged_of(result_xdr: str | None) -> int | None:
    if not result_xdr:
        return None
    try:
        return int(xdr.TransactionResult.from_xdr(result_xdr).fee_charged.int64)
    except Exception as exc:  # any decode failure of foreign bytes
        raise MalformedAnswer(f"result XDR does not decode ({type(exc).__name__})") from None
