"""getHealth over plain HTTP, for `paygate status`: one small JSON-RPC call per endpoint does not need
stellar-sdk, whose import (~300 ms of CPU) would be most of a cold `status` with RPC configured.

Same request and the same reading of the answer as SorobanServer.get_health: a JSON-RPC 2.0 POST,
`result.status`, `latestLedger`, `oldestLedger`; an HTTP error status, an `error` member or a body
that is not that shape raises. Proxies from the environment are ignored (as ChainClient's sessions
ignore them: endpoints are configured explicitly); credentials in the URL become basic auth, as
requests would send them."""

from __future__ import annotations

import json
from dataclasses import dataclass

from paygate_cli.chain.endpoints import split_credentials


@dataclass(frozen=True)
class Health:
    status: str
    latest_ledger: int
    oldest_ledger: int


class HealthError(Exception):
    """The endpoint answered, but not with a getHealth result."""


def get_health(url: str, timeout: float) -> Health:
    import urllib.request

    url, headers = split_credentials(url)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "getHealth"}).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with opener.open(request, timeout=max(0.1, timeout)) as answer:  # HTTP >= 400 raises HTTPError
        document = json.loads(answer.read())
    if not isinstance(document, dict):
        raise HealthError("getHealth answer is not a JSON-RPC object")
    if document.get("error") is not None:
        error = document["error"]
        detail = error.get("message") if isinstance(error, dict) else error
        raise HealthError(f"getHealth error: {detail}")
    result = document.get("result")
    if not isinstance(result, dict) or not isinstance(result.get("status"), str):
        raise HealthError("getHealth answer has no result.status")
    try:
        return Health(result["status"], int(result["latestLedger"]), int(result["oldestLedger"]))
    except (KeyError, TypeError, ValueError):
        raise HealthError("getHealth result lacks latestLedger/oldestLedger") from None
