"""Fault injection for the devnet: the failure modes of a real RPC node that paygate must survive.

Faults are set and cleared over JSON-RPC admin methods (`devnet_setFault`, `devnet_clearFaults`)
on the same port; admin methods are never subject to faults, so a "down" devnet can be revived.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

KINDS = {
    "http_503": "answer HTTP 503 (global backlog full) instead of processing",
    "http_504": "answer HTTP 504 (request exceeded its execution limit) instead of processing",
    "slow": "sleep `ms` milliseconds before answering",
    "lose_send_answer": "sendTransaction is processed (queued) but the connection is closed unanswered",
    "try_again_later": "sendTransaction answers TRY_AGAIN_LATER without queuing",
    "account_lag": "getLedgerEntries serves ACCOUNT entries as of `ledgers` ledgers ago",
    "node_lag": "the whole node answers as a node `ledgers` ledgers behind: latest ledger (getHealth, "
                "getLatestLedger, every latestLedger), transactions and events past it unknown, ACCOUNT "
                "entries as of then (contract data stays current: the devnet keeps no history of it)",
    "hold_next": "the next accepted transaction stays queued `ledgers` ledgers before it lands",
    "drop_next": "the next accepted transaction is never included: dropped after 4 ledgers and banned",
    "down": "every non-admin request has its connection closed without an answer",
    "reject_send": "sendTransaction answers ERROR with `code` (default txBAD_SEQ) without queuing, for "
                   "transactions whose (inner) source is `account` (default: every one); a chain behind "
                   "the journal answers a lane's sends this way",
    "surge": "competing demand: each ledger close, `txs` phantom Soroban transactions bidding `rate` stroops "
             "per operation compete for the ledger's capacity (for `ledgers` closes, or until cleared)",
}
COUNTED = {"http_503", "http_504", "slow", "lose_send_answer", "try_again_later", "hold_next", "drop_next",
           "reject_send"}
# What reject_send may answer: the codes a node gives for bytes it will not queue.
REJECT_CODES = ("txBAD_SEQ", "txTOO_LATE", "txTOO_EARLY", "txBAD_AUTH", "txINSUFFICIENT_BALANCE", "txNO_ACCOUNT")
MIN_SURGE_RATE = 100  # a phantom bids at least the base fee per operation, like any transaction


class FaultError(ValueError):
    pass


@dataclass
class Fault:
    kind: str
    count: int | None = None  # remaining uses; None = until cleared
    ms: int = 0
    ledgers: int = 0
    methods: list[str] | None = None  # only these RPC methods (None = every affected method)
    account: str | None = None  # reject_send: only transactions from this source (None = every one)
    code: str = "txBAD_SEQ"  # reject_send: the transaction result code answered
    rate: int = 0  # surge: each phantom's bid, stroops per operation
    txs: int = 0  # surge: phantoms per ledger

    def applies_to(self, method: str, account: str | None = None) -> bool:
        return (self.methods is None or method in self.methods) and (
            self.account is None or account is None or account == self.account)


class Faults:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def set(self, kind: object, count: object = None, ms: object = 0, ledgers: object = 0,
            methods: object = None, account: object = None, code: object = None, rate: object = None,
            txs: object = None) -> Fault:
        if kind not in KINDS:
            raise FaultError(f"unknown fault kind {kind!r}; known: {', '.join(sorted(KINDS))}")
        for name, v in (("count", count), ("ms", ms), ("ledgers", ledgers)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise FaultError(f"{name} must be a non-negative integer")
        if methods is not None and (not isinstance(methods, list) or not all(isinstance(m, str) for m in methods)):
            raise FaultError("methods must be a list of method names")
        if account is not None and (kind != "reject_send" or not isinstance(account, str)):
            raise FaultError("account is a source account (G…), for reject_send only")
        if code is not None and (kind != "reject_send" or code not in REJECT_CODES):
            raise FaultError(f"code is for reject_send only, one of {', '.join(REJECT_CODES)}")
        if kind == "surge":
            _check_surge(count, rate, txs)
        elif rate is not None or txs is not None:
            raise FaultError("rate and txs are for surge only")
        if kind == "slow" and not ms:
            raise FaultError("slow needs ms > 0")
        if kind in ("account_lag", "node_lag", "hold_next") and not ledgers:
            raise FaultError(f"{kind} needs ledgers > 0")
        assert isinstance(kind, str)
        if count is None and kind in ("hold_next", "drop_next"):
            count = 1  # "the next" transaction
        fault = Fault(kind=kind, count=count, ms=int(ms or 0), ledgers=int(ledgers or 0),  # type: ignore[arg-type]
                      methods=methods, account=account, code=code or "txBAD_SEQ",  # type: ignore[arg-type]
                      rate=int(rate or 0), txs=int(txs or 0))  # type: ignore[call-overload]
        with self._lock:
            if kind in ("down", "account_lag", "node_lag", "surge"):  # one at a time: a new one replaces
                self._faults = [f for f in self._faults if f.kind != kind]
            self._faults.append(fault)
        return fault

    def clear(self, kind: str | None = None) -> None:
        with self._lock:
            self._faults = [f for f in self._faults if kind is not None and f.kind != kind]

    def take(self, kind: str, method: str, account: str | None = None) -> Fault | None:
        """The active fault of `kind` for `method` (and a transaction from `account`), consuming one
        use of a counted fault."""
        with self._lock:
            for f in self._faults:
                if f.kind == kind and f.applies_to(method, account):
                    if f.count is not None:
                        f.count -= 1
                        if f.count <= 0:
                            self._faults.remove(f)
                    return f
        return None

    def peek(self, kind: str, method: str = "") -> Fault | None:
        with self._lock:
            for f in self._faults:
                if f.kind == kind and (not method or f.applies_to(method)):
                    return f
        return None

    def surge_demand(self) -> tuple[int, int] | None:
        """(rate, txs) of the active surge: the phantoms competing in the ledger being built."""
        f = self.peek("surge")
        return None if f is None else (f.rate, f.txs)

    def ledger_closed(self) -> None:
        """A ledger closed: a surge with `ledgers` left counts one down and clears itself at zero
        (ledgers 0 = until cleared)."""
        with self._lock:
            for f in list(self._faults):
                if f.kind == "surge" and f.ledgers:
                    f.ledgers -= 1
                    if f.ledgers <= 0:
                        self._faults.remove(f)

    def lagged_latest(self, latest: int, oldest: int) -> int:
        """The latest ledger this node admits to under `node_lag` (never before its oldest)."""
        lag = self.peek("node_lag")
        return latest if lag is None else max(oldest, latest - lag.ledgers)

    def describe(self) -> list[dict]:
        with self._lock:
            return [asdict(f) for f in self._faults]


def _check_surge(count: object, rate: object, txs: object) -> None:
    if count is not None:
        raise FaultError("surge lasts `ledgers` ledger closes (or until cleared), not a count of uses")
    if isinstance(rate, bool) or not isinstance(rate, int) or rate < MIN_SURGE_RATE:
        raise FaultError(f"surge needs rate >= {MIN_SURGE_RATE} (stroops per operation)")
    if isinstance(txs, bool) or not isinstance(txs, int) or txs < 1:
        raise FaultError("surge needs txs >= 1 (phantom transactions per ledger)")
