"""Settings: flags > environment > TOML file > defaults, with the source of every value kept.

Secrets come only from `PAYGATE_<NAME>_FILE` or `$CREDENTIALS_DIRECTORY/<name>`; a plain
`PAYGATE_<NAME>` variable (or a plain key in the TOML file) holding a secret is refused, because
environment variables leak through `systemctl show`, /proc and child processes."""

from __future__ import annotations

import getpass
import math
import os
import re
import socket
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paygate_cli.errors import ConfigError
from paygate_cli.secrets import Secret, read_secret_file, remember

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|m|min|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


# Longest duration any setting or flag may take (a million hours). Beyond it a value is a typo (or
# 400 nines, which float() turns into infinity), and infinity breaks every consumer: waits, timeouts.
MAX_DURATION_S = 3600.0 * 10**6
# Largest integer setting: every one ends in a Postgres integer or an XDR uint32 field.
MAX_INT = 2**31 - 1


def parse_duration(text: str | float | int, *, name: str = "duration") -> float:
    """'2s', '500ms', '10min', '1h', '30d' or a bare number of seconds -> seconds."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
        if seconds < 0:
            raise ConfigError(f"{name}: must not be negative")
    else:
        match = _DURATION.match(str(text))
        if not match:
            raise ConfigError(f"{name}: {str(text)[:80]!r} is not a duration (examples: 500ms, 2s, 10min, 1h, 30d)")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:  # NaN fails every comparison: named first
        raise ConfigError(f"{name}: {str(text)[:80]!r} is longer than a million hours")
    return seconds


def _parse_bool(text: str | bool, name: str) -> bool:
    if isinstance(text, bool):
        return text
    lowered = str(text).strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ConfigError(f"{name}: {text!r} is not a boolean (true/false)")


def _parse_int(text: str | int, name: str) -> int:
    # bool is an int and float truncates silently (1.5 -> 1, inf -> OverflowError): only whole numbers.
    if isinstance(text, bool) or (isinstance(text, float) and not (math.isfinite(text) and text.is_integer())):
        raise ConfigError(f"{name}: {str(text)[:80]!r} is not an integer")
    try:
        value = int(text)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{name}: {str(text)[:80]!r} is not an integer") from None
    if value < 0:
        raise ConfigError(f"{name}: must not be negative")
    if value > MAX_INT:
        raise ConfigError(f"{name}: must be at most {MAX_INT}")
    return value


def _parse_list(text: str | list[str], name: str) -> list[str]:
    if isinstance(text, list):
        return [str(item).strip() for item in text if str(item).strip()]
    return [part.strip() for part in str(text).split(",") if part.strip()]


# The workers that sign on lanes: the ones a lane share (`lane_shares`) may name.
LANE_WORKERS = frozenset({"funding", "settlement", "relay", "relay_drainer", "ttl"})


def _parse_lane_shares(text: str | Mapping[str, Any] | list[str], name: str) -> dict[str, int]:
    """`funding=3,settlement=2,relay=3` (or a TOML table): lanes reserved for each named worker."""
    if isinstance(text, Mapping):
        pairs = [(str(k), v) for k, v in text.items()]
    else:
        pairs = []
        for part in _parse_list(text, name):
            worker, sep, count = part.partition("=")
            if not sep:
                raise ConfigError(f"{name}: {part[:80]!r} is not WORKER=COUNT")
            pairs.append((worker.strip(), count.strip()))
    shares: dict[str, int] = {}
    for worker, count in pairs:
        if worker not in LANE_WORKERS:
            raise ConfigError(f"{name}: {worker[:40]!r} is not a worker that signs on lanes "
                              f"({', '.join(sorted(LANE_WORKERS))})")
        if worker in shares:
            raise ConfigError(f"{name}: {worker} is named twice")
        shares[worker] = _parse_int(count, f"{name} {worker}")
        if shares[worker] == 0:
            raise ConfigError(f"{name} {worker}: a share is at least one lane (leave the worker out instead)")
    return shares


def _parse_urls(text: str | list[str], name: str) -> list[str]:
    """A list of RPC endpoints, each normalised; exact duplicates (after normalisation) dropped."""
    out: list[str] = []
    for url in _parse_list(text, name):
        normal = normalise_rpc_url(url, name)
        if normal not in out:
            out.append(normal)
    return out


# A ledger closes about every 5 s: the one conversion of durations (the TTL settings) into ledgers. Here,
# not in chain/, so status and an idle tick convert without loading stellar_sdk.
LEDGER_SECONDS = 5


def ledgers(seconds: float) -> int:
    """A duration in ledgers, rounded down (a threshold or an extension never overshoots)."""
    return int(seconds // LEDGER_SECONDS)


# getFeeStats' FeeDistribution fields a bid may follow.
FEE_PERCENTILES = ("p10", "p20", "p30", "p40", "p50", "p60", "p70", "p80", "p90", "p95", "p99", "max", "mode")


def _parse_choice(choices: tuple[str, ...]) -> Callable[[Any, str], str]:
    def parse(text: Any, name: str) -> str:
        value = str(text).strip().lower()
        if value not in choices:
            raise ConfigError(f"{name}: {text!r} is not one of {', '.join(choices)}")
        return value

    return parse


@dataclass(frozen=True)
class Field:
    name: str
    default: Any
    parse: Callable[[Any, str], Any]
    help: str


# -- RPC endpoints (docs/architecture.md §4 "RPC") ------------------------------------------------------------------
# Decisions that declare a transaction dead need a majority of read endpoints, counted over distinct
# hosts: two URLs of one node (`url`, `url/`, `HTTP://Host:80/`) are one vote, not two, and a
# "majority" of one node is no quorum at all. These workers act on such decisions (a dead lineage is
# re-prepared or its work handed back and paid again), so they refuse to start without enough hosts.
MIN_READ_HOSTS = 3
MONEY_MOVERS = frozenset({"funding", "settlement", "relay", "relay_drainer", "relay_expiry", "recovery", "ttl"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalise_rpc_url(url: str, name: str = "RPC URL") -> str:
    """scheme://host[:port]/path with scheme and host lower-cased, the default port and trailing
    slashes dropped (query kept: providers put API keys there). Raises ConfigError when it is not
    an http(s) URL with a host. Never echoes the URL: it may carry a credential."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        raise ConfigError(f"{name}: an endpoint is not a valid URL") from None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".")
    if scheme not in _DEFAULT_PORTS or not host:
        raise ConfigError(f"{name}: every endpoint must be an http:// or https:// URL with a host")
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        netloc += f":{port}"
    userinfo = parts.netloc.rpartition("@")[0]
    if userinfo:
        netloc = f"{userinfo}@{netloc}"
    return urlunsplit((scheme, netloc, parts.path.rstrip("/"), parts.query, ""))


def rpc_host(url: str) -> str:
    """The host an endpoint runs on: what a vote is counted by (never resolved: DNS aliases of one
    machine are the operator's to avoid)."""
    from urllib.parse import urlsplit

    return (urlsplit(normalise_rpc_url(url)).hostname or "").rstrip(".")


def distinct_read_urls(read_urls: list[str], write_url: str | None) -> list[str]:
    """The read endpoints that vote: normalised, the first URL of each host (the write endpoint
    when none are configured)."""
    urls = [normalise_rpc_url(u, "PAYGATE_RPC_READ_URLS") for u in read_urls]
    if not urls and write_url:
        urls = [normalise_rpc_url(write_url, "PAYGATE_RPC_URL")]
    hosts: dict[str, str] = {}
    for url in urls:
        hosts.setdefault(rpc_host(url), url)
    return list(hosts.values())


def check_read_quorum(settings: Settings, worker: str) -> None:
    """A money mover refuses to start (78) unless its read quorum spans MIN_READ_HOSTS distinct
    hosts, or the development override is set."""
    if worker in MONEY_MOVERS:
        require_read_quorum(settings, f"{worker} refuses to start",
                            "it declares transactions dead by a majority of them")


def require_read_quorum(settings: Settings, who: str, why: str) -> None:
    """The money movers' rule for every decision that re-verifies the chain (a worker's, `replay`'s,
    `key-retire-check`'s): a majority of one configured endpoint is that one node's word, so fewer
    than MIN_READ_HOSTS distinct read hosts is a configuration error (78) unless overridden."""
    if settings.values.get("rpc_allow_single_endpoint"):
        return
    if not settings.values.get("rpc_url"):
        return  # the chain client says what is missing when it is first needed
    hosts = [rpc_host(u) for u in distinct_read_urls(settings.values.get("rpc_read_urls") or [],
                                                     settings.values.get("rpc_url"))]
    if len(hosts) < MIN_READ_HOSTS:
        raise ConfigError(
            f"{who}: PAYGATE_RPC_READ_URLS must name read endpoints on at least "
            f"{MIN_READ_HOSTS} distinct hosts ({why}); it has "
            f"{len(hosts)} ({', '.join(hosts)}). Add endpoints, or set PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT=1 "
            f"for development against one node (never in production)", msgid="config.rpc_quorum")


def _str(text: Any, name: str) -> str:
    return str(text)


def _opt_str(text: Any, name: str) -> str | None:
    return str(text) if text not in (None, "") else None


def _opt_int(text: Any, name: str) -> int | None:
    return None if text is None or text == "" else _parse_int(text, name)


def _dur(text: Any, name: str) -> float:
    return parse_duration(text, name=name)


def _pg_timeout(text: Any, name: str) -> float:
    """A Postgres timeout: sent in milliseconds, which Postgres holds in an int (about 24.8 days);
    beyond it the server refuses the connection, which would look like an outage (69), not a typo."""
    seconds = parse_duration(text, name=name)
    if seconds * 1000 > MAX_INT:
        raise ConfigError(f"{name}: {str(text)[:80]!r} is longer than Postgres allows ({MAX_INT} ms, about 24 days)")
    return seconds


_CONTEXT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def _context_name(text: Any, name: str) -> str | None:
    """A context is typed back to confirm a production write: one short word, nothing to misread."""
    value = str(text).strip()
    if not value:
        return None
    if not _CONTEXT_NAME.fullmatch(value):
        raise ConfigError(f"{name}: {value[:80]!r} is not a context name (letters, digits, '.', '_', '-'; "
                          "at most 63)")
    return value


FIELDS: tuple[Field, ...] = (
    Field("database_url", None, _opt_str, "libpq DSN (may also come from PAYGATE_DATABASE_URL_FILE)"),
    Field("instance_id", None, _opt_str, "this host's instance id (default: hostname)"),
    Field("operator", None, _opt_str, "actor recorded in audit_log (default: OS user)"),
    Field("context", None, _context_name,
          "a name for the deployment this configuration points at (prod-eu, staging): shown with the database "
          "by status, migrate, every --dry-run and confirmation; `--context NAME` on a write must match it"),
    Field("context_production", False, _parse_bool,
          "the context is production: a write is confirmed by typing the context's name, and without a TTY "
          "needs `--yes --context NAME`"),
    Field("application_name", "paygate", _str, "libpq application_name prefix"),
    Field("connect_timeout", 5.0, _dur, "Postgres connect timeout"),
    Field("statement_timeout", 30.0, _pg_timeout, "Postgres statement_timeout"),
    Field("lock_timeout", 5.0, _pg_timeout, "Postgres lock_timeout for work connections"),
    Field("idle_in_transaction_timeout", 60.0, _pg_timeout, "Postgres idle_in_transaction_session_timeout"),
    Field("log_format", "auto", _parse_choice(("auto", "text", "json")), "stderr log format"),
    Field("log_level", "info", _parse_choice(("debug", "info", "warning", "error")), "log level"),
    Field("metrics_dir", None, _opt_str, "Prometheus textfile collector directory"),
    Field("rpc_url", None, _opt_str, "Stellar RPC write endpoint"),
    Field("rpc_read_urls", [], _parse_urls, "Stellar RPC read endpoints (comma-separated; one vote per distinct host)"),
    Field("rpc_allow_single_endpoint", False, _parse_bool,
          "development/devnet only: let the money movers run with read endpoints on fewer than "
          f"{MIN_READ_HOSTS} distinct hosts (a quorum of one node can declare a transaction dead)"),
    Field("network_passphrase", "Standalone Network ; February 2017", _str, "Stellar network passphrase"),
    Field("billing_contract", None, _opt_str, "billing contract id (C…)"),
    Field("usdc_contract", None, _opt_str, "USDC Stellar Asset Contract id (C…)"),
    Field("fee_account", None, _opt_str,
          "the fee account's public address (G…): lets the gas monitor and the reconciler run without the "
          "fee seed; checked against the seed wherever the seed is loaded"),
    Field("journal_active_key_id", None, _opt_str, "key id new envelopes are encrypted with"),
    Field("tx_validity", 60.0, _dur, "maxTime = latest ledger close time + this"),
    Field("base_fee", 100, _parse_int, "inclusion fee per operation of inner transactions (stroops)"),
    Field("fee_bump_base_fee", 200, _parse_int,
          "the lowest inclusion bid per operation of a fee bump (stroops): the market bid is never below it"),
    Field("fee_percentile", "p90", _parse_choice(FEE_PERCENTILES),
          "which percentile of getFeeStats' sorobanInclusionFee a new envelope bids"),
    Field("max_inclusion_fee", 100_000, _parse_int,
          "the highest inclusion bid per operation any envelope may make (stroops; funding, settlement, bot "
          "jobs, the TTL keeper; a relay is also bounded by its fee reservation): above it, work is fee-capped"),
    Field("rebump_after_ledgers", 2, _parse_int,
          "a sent lineage not included after this many ledgers while the market is at or above its bid gets a "
          "replacement fee bump (less than the network's 4-ledger drop)"),
    Field("max_replacements", 3, _parse_int, "replacement fee-bump envelopes one lineage may have"),
    Field("ttl_threshold", 30 * 86400.0, _dur,
          "the TTL keeper extends an entry paygate keeps alive once it would expire within this (ledgers at 5 s)"),
    Field("ttl_extend_to", 120 * 86400.0, _dur,
          "how far ahead the TTL keeper extends an entry (ledgers at 5 s; the network caps it at ~6 months)"),
    Field("ttl_rent_budget", 100_000_000, _parse_int,
          "stroops of rent (extend and restore transactions' fees) the TTL keeper may spend per UTC day"),
    Field("ttl_reads_per_tick", 200, _parse_int, "ledger entries the TTL keeper reads per tick (rotating)"),
    Field("ttl_keys_per_tx", 20, _parse_int, "entries one ExtendFootprintTTL transaction extends at most"),
    Field("fee_stats_cache", 5.0, _dur, "how long one getFeeStats answer is reused (within and across ticks)"),
    Field("rpc_timeout", 10.0, _dur, "per-request RPC timeout"),
    Field("repeated_rejection_threshold", 5, _parse_int,
          "consecutive resends of one lineage rejected with the same ERROR code (txBAD_SEQ on a chain behind "
          "the journal) that open a repeated_rejection finding on its lane (the tick exits 3 once)"),
    Field("funding_lease", 30.0, _dur, "lease on a claimed deposit"),
    Field("webhook_timeout", 5.0, _dur, "per-delivery HTTP timeout"),
    Field("webhook_max_attempts", 8, _parse_int, "attempts before an outbox row is dead"),
    Field("webhook_backoff_base", 2.0, _dur, "first retry delay; doubles per attempt, with jitter"),
    Field("webhook_backoff_max", 3600.0, _dur, "cap on the retry delay"),
    Field("webhook_allow_hosts", [], _parse_list, "hosts/CIDRs allowed despite being private/loopback"),
    Field("webhook_lease", 60.0, _dur, "lease on a claimed outbox row"),
    Field("settlement_lease", 30.0, _dur, "lease on a charge batch being prepared or driven"),
    Field("settlement_max_attempts", 5, _parse_int, "charge_batch lineages proven dead before a charge fails"),
    Field("settlement_batches_per_tick", 0, _parse_int,
          "new charge_batch transactions one tick may start (0: one per lane the process holds keys for)"),
    Field("lane_shares", {}, _parse_lane_shares,
          "lanes reserved for a worker (funding=3,settlement=2,relay=3): each named worker signs only on "
          "its own lanes and the unreserved ones; the others sign on every lane"),
    Field("observer_start_ledger", None, _opt_int, "first ledger the observer reads when it has no cursor"),
    Field("observer_max_pages", 20, _parse_int, "getEvents pages one observer tick may apply"),
    Field("recovery_grace", 180.0, _dur, "a claim this far past its lease is recovery's (> receipt timeout + a tick)"),
    Field("recovery_alarm_age", 3600.0, _dur, "items in flight longer than this become findings"),
    Field("key_retention", 604800.0, _dur, "time since a journal key's or lane's last use before it may be retired"),
    Field("retention_window", 2592000.0, _dur,
          "terminal rows older than this (DB time) are archived to paygate_archive (at least key_retention)"),
)

# name -> help. Each is read from PAYGATE_<NAME>_FILE or $CREDENTIALS_DIRECTORY/<name with dashes>.
SECRETS: dict[str, str] = {
    "database_url": "libpq DSN holding a password",
    "fee_secret": "fee account seed (S…)",
    "lane_secrets": "lane seeds, one per line",
    "journal_keys": 'journal AES keys, JSON {"key_id": "64 hex chars"}',
    "heartbeat_url": "dead-man switch URL (healthchecks.io style)",
}
# These may also be given in plain form: a DSN often carries no password (peer/cert auth, PGPASSFILE).
_PLAIN_ALLOWED = {"database_url"}
# Settings that may come from a secret file instead (PAYGATE_<NAME>_FILE, `<name>_file` in the config
# file, or $CREDENTIALS_DIRECTORY/<name with dashes>): providers put API keys in RPC URLs. Either the
# plain form or the file, never both; the value is then an ordinary setting (shown by host only).
URL_FILES: dict[str, str] = {
    "rpc_url": "Stellar RPC write endpoint URL",
    "rpc_read_urls": "Stellar RPC read endpoint URLs, one a line (or comma-separated)",
}

FIELD_BY_NAME = {field.name: field for field in FIELDS}


def env_var(name: str) -> str:
    return f"PAYGATE_{name.upper()}"


@dataclass
class Settings:
    values: dict[str, Any]
    sources: dict[str, str]
    secrets: dict[str, Secret]
    config_file: str | None

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def secret(self, name: str) -> Secret | None:
        return self.secrets.get(name)

    def dsn(self) -> str:
        secret = self.secrets.get("database_url")
        if secret is not None:
            return secret.reveal()
        if self.values.get("database_url"):
            return str(self.values["database_url"])
        raise ConfigError(
            "no database configured: set PAYGATE_DATABASE_URL or PAYGATE_DATABASE_URL_FILE "
            "(or database_url in the config file)"
        )

    def effective_instance_id(self) -> str:
        return self.values.get("instance_id") or socket.gethostname()

    def effective_operator(self) -> str:
        if self.values.get("operator"):
            return str(self.values["operator"])
        try:
            return getpass.getuser()
        except (KeyError, OSError):
            return f"uid:{os.getuid()}"


def find_config_file(explicit: str | None, environ: Mapping[str, str]) -> Path | None:
    """--config, then $PAYGATE_CONFIG, then $XDG_CONFIG_HOME/paygate/config.toml, then /etc."""
    if explicit:
        return Path(explicit)
    if environ.get("PAYGATE_CONFIG"):
        return Path(environ["PAYGATE_CONFIG"])
    xdg = environ.get("XDG_CONFIG_HOME") or (
        str(Path(environ["HOME"]) / ".config") if environ.get("HOME") else None
    )
    candidates = [Path(xdg) / "paygate" / "config.toml"] if xdg else []
    candidates.append(Path("/etc/paygate/config.toml"))
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    return None


def _load_toml(path: Path, explicit: bool) -> dict[str, Any]:
    import tomllib  # only when a config file exists: every cold tick pays for its imports

    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"config file {path} does not exist") from None
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8; tomllib lets the codec's error through
        raise ConfigError(f"config file {path}: invalid TOML: not UTF-8 (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read: {exc.strerror}") from None


def _dsn_password(dsn: str) -> str | None:
    match = re.search(r"://[^:/@]*:([^@]*)@", dsn) or re.search(r"\bpassword\s*=\s*'?([^'\s]+)", dsn)
    return match.group(1) if match else None


def _check_text(raw: Any, where: str) -> None:
    """Text a setting carries on to Postgres, HTTP headers and logs: no NUL (Postgres text cannot hold
    it) and valid UTF-8 (a non-UTF-8 environment value arrives as lone surrogates, which no encoder
    accepts later, far from where it came in)."""
    for item in raw if isinstance(raw, list) else [raw]:
        if not isinstance(item, str):
            continue
        if "\x00" in item:
            raise ConfigError(f"{where}: contains a NUL character")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"{where}: is not valid UTF-8") from None


def load_settings(
    environ: Mapping[str, str],
    *,
    overrides: Mapping[str, Any] | None = None,
    config_path: str | None = None,
    only_secrets: Collection[str] | None = None,
) -> Settings:
    """Resolve every setting and secret. `overrides` are command-line flags (highest precedence).
    `only_secrets`: the secret files (SECRETS and URL_FILES names) a command uses; the others are
    not read at all, so a read-only command never fails on a seed or key it has no use for (a plain
    secret in the environment or the config file is refused all the same)."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    path = find_config_file(config_path, environ)
    explicit = bool(config_path or environ.get("PAYGATE_CONFIG"))
    file_values = _load_toml(path, explicit) if path else {}

    unknown = sorted(set(file_values) - set(FIELD_BY_NAME) - {f"{s}_file" for s in (*SECRETS, *URL_FILES)}
                     - set(SECRETS))
    if unknown:
        raise ConfigError(f"config file {path}: unknown setting(s): {', '.join(unknown)}")

    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for field in FIELDS:
        variable = env_var(field.name)
        if field.name in overrides:
            raw, source = overrides[field.name], "flag"
        elif environ.get(variable) not in (None, ""):
            raw, source = environ[variable], f"env {variable}"
        elif field.name in file_values:
            raw, source = file_values[field.name], f"file {path}"
        else:
            raw, source = field.default, "default"
        # A bad value is blamed on where it came from: the file and its key, or the variable.
        where = f"config file {path}: {field.name}" if source == f"file {path}" else variable
        if source != "default":
            _check_text(raw, where)
        values[field.name] = field.parse(raw, where) if source != "default" else raw
        sources[field.name] = source

    secrets: dict[str, Secret] = {}
    credentials_dir = environ.get("CREDENTIALS_DIRECTORY")
    for name in SECRETS:
        file_var = env_var(name) + "_FILE"
        plain_var = env_var(name)
        if name not in _PLAIN_ALLOWED:
            if environ.get(plain_var):
                raise ConfigError(
                    f"{plain_var} holds a secret in a plain environment variable; "
                    f"put it in a file and set {file_var} instead"
                )
            if name in file_values:
                raise ConfigError(
                    f"config file {path}: '{name}' must not hold a secret; set '{name}_file' to a file path"
                )
        elif environ.get(file_var) and environ.get(plain_var):
            raise ConfigError(f"set either {plain_var} or {file_var}, not both")
        if only_secrets is not None and name not in only_secrets:
            continue
        if environ.get(file_var):
            secrets[name] = read_secret_file(environ[file_var], variable=file_var)
            sources[name] = f"file via {file_var}"
        elif f"{name}_file" in file_values:
            file_value = file_values[f"{name}_file"]
            if not isinstance(file_value, str) or not file_value:
                raise ConfigError(f"config file {path}: '{name}_file' must be a file path (a string)")
            secrets[name] = read_secret_file(file_value, variable=f"{path}: {name}_file")
            sources[name] = f"file via {path}"
        elif credentials_dir and (Path(credentials_dir) / name.replace("_", "-")).is_file():
            cred = Path(credentials_dir) / name.replace("_", "-")
            secrets[name] = read_secret_file(cred, variable="CREDENTIALS_DIRECTORY")
            sources[name] = f"credential {cred}"

    _url_files(environ, file_values, path, credentials_dir, values, sources, only_secrets)

    if "database_url" in secrets:
        values["database_url"] = None
    for dsn in (values.get("database_url"), secrets["database_url"].reveal() if "database_url" in secrets else None):
        password = _dsn_password(dsn) if dsn else None
        if password:
            remember(password)
    return Settings(values=values, sources=sources, secrets=secrets, config_file=str(path) if path else None)


def _url_files(environ: Mapping[str, str], file_values: Mapping[str, Any], path: Path | None,
               credentials_dir: str | None, values: dict[str, Any], sources: dict[str, str],
               only_secrets: Collection[str] | None = None) -> None:
    """RPC URLs read from secret files (URL_FILES), replacing the plain setting they stand for.
    Errors name the variables and the file, never the URL."""
    from urllib.parse import urlsplit

    for name in URL_FILES:
        if only_secrets is not None and name not in only_secrets:
            continue
        file_var, plain_var = env_var(name) + "_FILE", env_var(name)
        field = FIELD_BY_NAME[name]
        secret: Secret | None = None
        if environ.get(file_var):
            if environ.get(plain_var):
                raise ConfigError(f"set either {plain_var} or {file_var}, not both")
            if sources[name] == "flag":
                continue
            secret, source, where = read_secret_file(environ[file_var], variable=file_var), f"file via {file_var}", \
                file_var
        elif environ.get(plain_var) or sources[name] == "flag":
            continue
        elif f"{name}_file" in file_values:
            if name in file_values:
                raise ConfigError(f"config file {path}: set either '{name}' or '{name}_file', not both")
            file_value = file_values[f"{name}_file"]
            if not isinstance(file_value, str) or not file_value:
                raise ConfigError(f"config file {path}: '{name}_file' must be a file path (a string)")
            where = f"{path}: {name}_file"
            secret, source = read_secret_file(file_value, variable=where), f"file via {path}"
        elif credentials_dir and name not in file_values \
                and (Path(credentials_dir) / name.replace("_", "-")).is_file():
            cred = Path(credentials_dir) / name.replace("_", "-")
            secret, source, where = read_secret_file(cred, variable="CREDENTIALS_DIRECTORY"), f"credential {cred}", \
                f"CREDENTIALS_DIRECTORY {name.replace('_', '-')}"
        if secret is None:
            continue
        text = secret.reveal()
        lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
        if name == "rpc_url" and len(lines) != 1:
            raise ConfigError(f"{where}: must hold exactly one URL (it holds {len(lines)} lines)")
        raw = ",".join(lines)
        _check_text(raw, where)
        if name == "rpc_url":
            normalise_rpc_url(raw, where)  # refuses a non-URL without echoing it
        values[name] = field.parse(raw, where)
        sources[name] = source
        for url in raw.split(","):  # the key-bearing parts on their own too, for the log scrubber
            try:
                parts = urlsplit(url.strip())
            except ValueError:
                continue
            for piece in (parts.query, parts.password):
                if piece:
                    remember(piece)


def redact_dsn(dsn: str) -> str:
    """A DSN safe to show: the password replaced."""
    dsn = re.sub(r"(://[^:/@]*:)([^@]*)@", r"\1***@", dsn)
    return re.sub(r"(\bpassword\s*=\s*)('[^']*'|\S+)", r"\1***", dsn)


def describe(settings: Settings) -> list[dict[str, str]]:
    """Every effective value and its source, secrets redacted (for `config show`)."""
    rows: list[dict[str, str]] = []
    for field in FIELDS:
        value = settings.values[field.name]
        if field.name == "database_url" and value:
            value = redact_dsn(str(value))
        if field.name in ("rpc_url", "rpc_read_urls") and value:
            from paygate_cli.endpoints import shown_url  # a provider's API key rides in the URL

            value = [shown_url(u) for u in value] if isinstance(value, list) else shown_url(str(value))
        if field.name == "instance_id" and not value:
            value = settings.effective_instance_id()
        if field.name == "operator" and not value:
            value = settings.effective_operator()
        if isinstance(value, list):
            value = ",".join(value)
        rows.append({"name": field.name, "value": "" if value is None else str(value),
                     "source": settings.sources[field.name]})
    for name in SECRETS:
        secret = settings.secrets.get(name)
        if name in FIELD_BY_NAME:  # the DSN: one row, whichever way it was given
            if secret:
                row = next(r for r in rows if r["name"] == name)
                row.update(value="<redacted>", source=settings.sources[name])
            continue
        rows.append({"name": name, "value": "<redacted>" if secret else "(unset)",
                     "source": settings.sources.get(name, "unset")})
    return rows
