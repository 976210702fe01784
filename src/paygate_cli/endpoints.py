"""How paygate names an RPC endpoint wherever it shows one: by its host (and port) only.

Providers put API keys in an endpoint URL's userinfo, path or query, so none of those is ever
printed, logged, or stored as evidence; and the HTTP libraries quote the URL they failed on in
their exception texts, so a text that may hold one goes through `redact_urls` first. No
stellar_sdk here: cold commands (`status`, `nonce-inspect --lane`) use it."""

from __future__ import annotations

import base64
import re
from urllib.parse import unquote, urlsplit, urlunsplit

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()]+")
# urllib3/requests: "Max retries exceeded with url: /path?query (Caused by …)".
_URL_PATH = re.compile(r"(\burl: )/[^\s'\"<>()]*")


def endpoint_name(url: str) -> str:
    """`https://user:pw@rpc.example:8443/v1/KEY?apikey=K` -> `rpc.example:8443`."""
    try:
        netloc = urlsplit(url.strip()).netloc
    except ValueError:
        return "(unparsable endpoint)"
    return netloc.rpartition("@")[2] or "(no host)"


def shown_url(url: str) -> str:
    """An endpoint URL as configuration shows it: scheme and host, and `/<redacted>` standing for
    whatever else it carries (userinfo, path, query), so an operator sees that there is more."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return "(unparsable endpoint)"
    more = "@" in parts.netloc or parts.path.strip("/") or parts.query or parts.fragment
    return f"{parts.scheme}://{endpoint_name(url)}" + ("/<redacted>" if more else "")


def redact_urls(text: str) -> str:
    """Every URL in `text` cut to its scheme and host, and every quoted request path dropped."""
    text = _URL.sub(lambda m: f"{m.group(0).split(':', 1)[0]}://{endpoint_name(m.group(0))}", text)
    return _URL_PATH.sub(r"\1<path>", text)


def split_credentials(url: str) -> tuple[str, dict[str, str]]:
    """The URL without its userinfo, and the HTTP headers of a JSON-RPC POST to it: credentials in
    the URL become basic auth, as requests sends them."""
    parts = urlsplit(url)
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if parts.username is None and parts.password is None:
        return url, headers
    credentials = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
    headers["Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])), headers
