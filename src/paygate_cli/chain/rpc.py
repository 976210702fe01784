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
from stellar_sdk.soroban_rpc import GetTransactionStatus
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

from paygate_cli.db.connect import assert_not_in_transaction
from paygate_cli.errors import ConfigError, Unavailable

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.settings import Settings

T = TypeVar("T")

# The answer never came or came garbled: the request may or may not have taken effect.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    SdkConnectionError, BadResponseError, requests.RequestException, ValueError,
)


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, SorobanRpcErrorResponse):
        return exc.code in (-32603, -32001)  # internal error / over the processing limit
    return isinstance(exc, TRANSPORT_ERRORS)


def _pin_sdk_models() -> list[Any]:
    """The SDK builds `Request[GetLedgerEntriesRequest]`, `Response[Any]` … on every call, and pydantic
    caches parametrised models only weakly: once the garbage collector drops one, the next call
    builds the model class again (~1-3 ms each, several per tick). Holding them for the life of the
    process makes every later call a cache hit (issue 14: no work repeated that can be done once)."""
    from stellar_sdk import soroban_rpc as m

    requests_ = [m.GetLedgerEntriesRequest, m.GetTransactionRequest, m.SimulateTransactionRequest,
                 m.SendTransactionRequest, m.GetEventsRequest]
    return [m.Response[Any], *(m.Request[r] for r in requests_)]


_SDK_MODELS = _pin_sdk_models()


class LaneMissing(ConfigError):
    """A lane's account is proven absent (a quorum of caught-up read hosts): the lane, not the run,
    is broken. The engine fences it and moves the work to another lane."""

    msgid = "rpc.lane_missing"


class LaneNotVisible(Unavailable):
    """A lane account was "not found" by read nodes that are not proven caught up: a lagging read
    ("not there yet"), never a configuration error. Retry later (exit 69 if it ends the run)."""

    msgid = "rpc.lane_not_visible"


@dataclass(frozen=True)
class LatestLedger:
    sequence: int
    close_time: int


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


@dataclass(frozen=True)
class Probe:
    """One read endpoint's view of one lineage: the source account's sequence first, then the
    transaction by hash (DESIGN §4: in that order, so a NOT_FOUND can be checked for coverage)."""

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
        # One vote per distinct host (DESIGN §4): `url` and `url/` are one node, not a majority of two.
        self.read_urls = distinct_read_urls(list(settings.rpc_read_urls), settings.rpc_url)
        self.write = server(self.write_url)
        self.readers = [server(url) for url in self.read_urls]
        self.passphrase = settings.network_passphrase
        self.guard_conn = guard_conn

    def close(self) -> None:
        for srv in {id(s): s for s in [self.write, *self.readers]}.values():
            srv.close()

    # -- plumbing -------------------------------------------------------------------------------

    def _guard(self, what: str) -> None:
        """DESIGN rule 2: refuse to talk to the chain while the caller holds a transaction open."""
        if self.guard_conn is not None:
            assert_not_in_transaction(self.guard_conn, what)

    def _retrying(self, what: str, fn: Callable[[], T], attempts: int = 3) -> T:
        @retry(stop=stop_after_attempt(attempts), wait=wait_random_exponential(multiplier=0.1, max=1.0),
               retry=retry_if_exception(_transient), reraise=True)
        def call() -> T:
            return fn()

        try:
            return call()
        except TRANSPORT_ERRORS as exc:
            raise Unavailable(f"Stellar RPC unavailable for {what}: {type(exc).__name__}: {exc}"[:500],
                              msgid="rpc.unavailable") from None

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

    def ledger_entries(self, keys: list[xdr.LedgerKey]) -> Any:
        self._guard("getLedgerEntries")
        return self._first_healthy("getLedgerEntries", lambda s: s.get_ledger_entries(keys))

    def account_sequence(self, address: str) -> int:
        """Ordinary read (allocation). Decisions use probe() instead."""
        from stellar_sdk import Keypair

        key = xdr.LedgerKey(type=xdr.LedgerEntryType.ACCOUNT, account=xdr.LedgerKeyAccount(
            account_id=Keypair.from_public_key(address).xdr_account_id()))
        answer = self.ledger_entries([key])
        if not answer.entries:
            return self._account_not_found(address, key)
        return _account_seq(answer.entries[0].xdr)

    def _account_not_found(self, address: str, key: xdr.LedgerKey) -> int:
        """One node said "no such account". A lagging node says that about a brand-new lane (issue 11),
        so it proves nothing by itself: the lane is missing (78) only when a majority of the distinct
        read hosts say so from at least the highest ledger any endpoint admits to — read before the
        entries, and vouched for by two hosts or more (one node cannot tell that it lags, so under the
        single-endpoint development override a lane is never proven missing). Otherwise the read is
        "not visible yet" (LaneNotVisible, transient)."""
        from paygate_cli.settings import rpc_host

        reference, hosts = 0, set()
        for url, srv in [(self.write_url, self.write), *zip(self.read_urls, self.readers, strict=True)]:
            try:
                seen = self._retrying("getLatestLedger", lambda srv=srv: srv.get_latest_ledger(), attempts=2)
            except (Unavailable, SorobanRpcErrorResponse):
                continue
            reference = max(reference, int(seen.sequence))
            hosts.add(rpc_host(url))
        absent, views = 0, []
        for url, srv in zip(self.read_urls, self.readers, strict=True):
            try:
                answer = self._retrying("getLedgerEntries", lambda srv=srv: srv.get_ledger_entries([key]), attempts=2)
            except (Unavailable, SorobanRpcErrorResponse):
                views.append(f"{rpc_host(url)} did not answer")
                continue
            if answer.entries:
                return _account_seq(answer.entries[0].xdr)  # it exists: this node has caught up
            if int(answer.latest_ledger) >= reference:
                absent += 1
                views.append(f"{rpc_host(url)} at ledger {answer.latest_ledger}: not found")
            else:
                views.append(f"{rpc_host(url)} at ledger {answer.latest_ledger}: behind ledger {reference}")
        seen_by = f"({'; '.join(views)})"
        if len(hosts) >= 2 and absent >= len(self.read_urls) // 2 + 1:
            raise LaneMissing(f"lane {address} does not exist on chain: not found by {absent} of "
                              f"{len(self.read_urls)} read endpoints caught up to ledger {reference} {seen_by}")
        raise LaneNotVisible(f"lane {address} is not visible on chain yet {seen_by}: the read nodes may lag; "
                             f"retrying later (if it persists, create the account or remove the lane)"[:500])

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
        return SendOutcome("ERROR", code=result_code_of(answer.error_result_xdr))

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
            if receipt_first:
                try:
                    tx = self._retrying("getTransaction", lambda srv=srv: srv.get_transaction(inner_hash_hex), 2)
                except (Unavailable, SorobanRpcErrorResponse) as exc:
                    probes.append(Probe(url, error=str(exc)[:300]))
                    continue
                if tx.status in (GetTransactionStatus.SUCCESS, GetTransactionStatus.FAILED):
                    probes.append(Probe(
                        url, tx_status=tx.status.value, tx_ledger=int(tx.ledger) if tx.ledger else None,
                        fee_charged=fee_charged_of(tx.result_xdr), result_code=result_code_of(tx.result_xdr),
                        latest_ledger=int(tx.latest_ledger), latest_close_time=int(tx.latest_ledger_close_time),
                        oldest_ledger=int(tx.oldest_ledger)))
                    continue
            try:
                entries = self._retrying("getLedgerEntries", lambda srv=srv: srv.get_ledger_entries([key]), 2)
                seq = None
                if entries.entries:
                    data = xdr.LedgerEntryData.from_xdr(entries.entries[0].xdr)
                    seq = int(data.account.seq_num.sequence_number.int64)
                tx = self._retrying("getTransaction", lambda srv=srv: srv.get_transaction(inner_hash_hex), 2)
            except (Unavailable, SorobanRpcErrorResponse) as exc:
                probes.append(Probe(url, error=str(exc)[:300]))
                continue
            found = tx.status in (GetTransactionStatus.SUCCESS, GetTransactionStatus.FAILED)
            probes.append(Probe(
                url, account_seq=seq, seq_ledger=int(entries.latest_ledger),
                tx_status=tx.status.value, tx_ledger=int(tx.ledger) if found and tx.ledger else None,
                fee_charged=fee_charged_of(tx.result_xdr) if found else None,
                result_code=result_code_of(tx.result_xdr) if found else None,
                latest_ledger=int(tx.latest_ledger), latest_close_time=int(tx.latest_ledger_close_time),
                oldest_ledger=int(tx.oldest_ledger)))
        return probes


def _account_seq(entry_xdr: str) -> int:
    data = xdr.LedgerEntryData.from_xdr(entry_xdr)
    return int(data.account.seq_num.sequence_number.int64)


def result_code_of(result_xdr: str | None) -> str | None:
    """The transaction result code; for a fee bump, the inner transaction's code (what matters)."""
    if not result_xdr:
        return None
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
    return int(xdr.TransactionResult.from_xdr(result_xdr).fee_charged.int64)
