"""getHealth and getNetwork over plain HTTP, for `paygate status` and the tick runner's preflight:
one small JSON-RPC call per endpoint does not need stellar-sdk, whose import (~300 ms of CPU) would
be most of a cold `status` with RPC configured.

Same request and the same reading of the answer as SorobanServer.get_health: a JSON-RPC 2.0 POST,
`result.status`, `latestLedger`, `oldestLedger`; an HTTP error status, an `error` member or a body
that is not that shape raises. Proxies from the environment are ignored (as ChainClient's sessions
ignore them: endpoints are configured explicitly); credentials in the URL become basic auth, as
requests would send them."""

from __future__ import annotations

import json
from dataclasses import dataclass

from paygate_cli.endpoints import split_credentials


@dataclass(frozen=True)
class Health:
    status: str
    latest_ledger: int
    oldest_ledger: int


class HealthError(Exception):
    """The endpoint answered, but not with a getHealth result."""


class RpcTimeout(Exception):
    """The endpoint did not answer within the timeout; said as `getHealth timed out after 10s`
    (never the URL: callers name the endpoint by its host)."""


def _call(url: str, method: str, timeout: float) -> dict:
    import urllib.error
    import urllib.request

    url, headers = split_credentials(url)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method}).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with opener.open(request, timeout=max(0.1, timeout)) as answer:  # HTTP >= 400 raises HTTPError
            document = json.loads(answer.read())
    except TimeoutError:  # reading the answer (socket.timeout is TimeoutError)
        raise RpcTimeout(f"{method} timed out after {timeout:g}s") from None
    except urllib.error.URLError as exc:  # connecting: urllib wraps the timeout
        if isinstance(exc.reason, TimeoutError):
            raise RpcTimeout(f"{method} timed out after {timeout:g}s") from None
        raise
    if not isinstance(document, dict):
        raise HealthError(f"{method} answer is not a JSON-RPC object")
    if document.get("error") is not None:
        error = document["error"]
        detail = error.get("message") if isinstance(error, dict) else error
        raise HealthError(f"{method} error: {detail}")
    result = document.get("result")
    if not isinstance(result, dict):
        raise HealthError(f"{method} answer has no result")
    return result


def get_health(url: str, timeout: float) -> Health:
    result = _call(url, "getHealth", timeout)
    if not isinstance(result.get("status"), str):
        raise HealthError("getHealth answer has no result.status")
    try:
        return Health(result["status"], int(result["latestLedger"]), int(result["oldestLedger"]))
    except (KeyError, TypeError, ValueError):
        raise HealthError("getHealth result lacks latestLedger/oldestLedger") from None


def get_network_passphrase(url: str, timeout: float) -> str:
    """The network this endpoint serves (getNetwork `passphrase`): a node of another network
    answers every call as well as the right one, and nothing else would tell."""
    passphrase = _call(url, "getNetwork", timeout).get("passphrase")
    if not isinstance(passphrase, str):
        raise HealthError("getNetwork result has no passphrase")
    return passphrase


def quorum_need(hosts: int) -> int:
    """How many distinct read hosts a decision needs (docs/architecture.md §4, §6): a strict majority.
    One rule for the chain client's quorum reads and `status`, which shows what they would decide."""
    return hosts // 2 + 1


@dataclass(frozen=True)
class LedgerQuorum:
    """The latest ledger a majority of the distinct read hosts have each reached (`ledger`; None when
    fewer than `need` answered: no decision), and the highest any of them claimed."""

    hosts: int
    need: int
    answered: int
    ledger: int | None
    highest: int | None


def ledger_quorum(heads: list[int], hosts: int) -> LedgerQuorum:
    """The quorum over each answering read host's latest ledger (`heads`), as
    ChainClient.latest_ledger_quorum decides it: the `need`-th highest."""
    need = quorum_need(hosts)
    ordered = sorted(heads, reverse=True)
    return LedgerQuorum(hosts, need, len(ordered), ordered[need - 1] if len(ordered) >= need else None,
                        ordered[0] if ordered else None)
