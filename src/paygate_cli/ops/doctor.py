"""`paygate doctor`: a preflight of everything a tick will need, each check with a stable id, a
verdict (ok / warn / fail), the evidence and the fix, in groups that are never green while one of
their checks fails (docs/commands.md "doctor").

Read-only: nothing is written to the database or sent to the chain. Every check works as the
read-only role (the grants are compared with has_table_privilege, which any role may call; the
pooling probe opens short transactions and writes nothing). The secret files it reads are the
ones a tick would: lane seeds and the fee seed only for their public addresses, journal keys only
to prove each live envelope's key loads and decrypts (the plaintext is dropped, never shown).

A failure has a kind, which the exit code follows (the worst kind wins, in this order): `config`
(78: a setting, a secret file, a deployment fact retrying never fixes), `human` (3: a state that
needs someone: a lane gap, the fee account running dry, a kept ledger entry archived), `unavailable`
(69: a dependency that did not answer). Warnings alone end in 1; all ok in 0."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from paygate_cli.errors import ConfigError, ExitCode, NeedsHuman, PaygateError, Unavailable, UsageError

if TYPE_CHECKING:
    import psycopg

    from paygate_cli.chain.deployment import EndpointFacts
    from paygate_cli.chain.rpc import ChainClient
    from paygate_cli.settings import Settings

GROUPS = ("config", "schema", "rpc", "lanes", "fee_account", "journal", "ttl", "clock", "db", "metrics")
# The exit code of each kind of failure, the worst first (docs/commands.md "doctor").
FAILURE_EXIT = {"config": ExitCode.CONFIG, "human": ExitCode.NEEDS_HUMAN, "unavailable": ExitCode.UNAVAILABLE}

# An endpoint this many ledgers behind the furthest one is stale for reads (warn), or out of the
# quorum's use (fail: about a minute of ledgers).
LAG_WARN_LEDGERS = 3
LAG_FAIL_LEDGERS = 12
# The host clock against the latest ledger's close time (ledgers close about every 5 s). Leases and
# expiry never use the host clock (docs/architecture.md §1 rule 9): skew only misleads logs, metrics
# and people, so it warns early and fails only when it is plainly broken.
SKEW_WARN_S = 60.0
SKEW_FAIL_S = 600.0
# The fee account's runway at the last week's burn rate.
RUNWAY_WINDOW_DAYS = 7
RUNWAY_WARN_DAYS = 30.0
RUNWAY_FAIL_DAYS = 7.0
# A probe is one request per method, bounded: doctor answers in seconds even with an endpoint down.
PROBE_TIMEOUT_S = 5.0
# The pooling probe's connections that hold a transaction open (writing nothing, taking no lock)
# while the probed connection runs its second statement: enough to pin every idle server of a pool
# whose idle servers are handed out oldest first, not only the one just used.
POOL_PINS = 3
STROOPS_PER_XLM = 10_000_000


@dataclass
class Check:
    id: str
    group: str
    verdict: str  # ok | warn | fail
    evidence: str
    fix: str = ""
    kind: str | None = None  # a failure's kind: config | human | unavailable

    def public(self) -> dict[str, Any]:
        return asdict(self)


def ok(check_id: str, group: str, evidence: str) -> Check:
    return Check(check_id, group, "ok", evidence)


def warn(check_id: str, group: str, evidence: str, fix: str) -> Check:
    return Check(check_id, group, "warn", evidence, fix)


def fail(check_id: str, group: str, kind: str, evidence: str, fix: str) -> Check:
    assert kind in FAILURE_EXIT, kind
    return Check(check_id, group, "fail", evidence, fix, kind)


def parse_groups(only: str | None) -> tuple[str, ...]:
    """`--only rpc,lanes`: the groups to run (all by default); an unknown one is a usage error (2)."""
    if only is None:
        return GROUPS
    asked = [part.strip() for part in only.split(",") if part.strip()]
    unknown = [g for g in asked if g not in GROUPS]
    if unknown or not asked:
        raise UsageError(f"--only: unknown group(s) {', '.join(unknown) or '(none given)'}; the groups are "
                         f"{', '.join(GROUPS)}", msgid="usage.doctor_group")
    return tuple(g for g in GROUPS if g in asked)


def _shown(exc: BaseException) -> str:
    """An exception's text as evidence: secrets this process read, seeds and URLs beyond their host removed."""
    from paygate_cli.ops.status import redact

    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return redact(text) or type(exc).__name__


def _kind_of(exc: BaseException) -> str:
    if isinstance(exc, NeedsHuman):
        return "human"
    if isinstance(exc, ConfigError):
        return "config"
    if isinstance(exc, Unavailable):
        return "unavailable"
    import psycopg

    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return "config"
    return "unavailable"


def _xlm(stroops: int | None) -> str:
    return "?" if stroops is None else f"{stroops / STROOPS_PER_XLM:,.7f}".rstrip("0").rstrip(".") + " XLM"


# -- config ---------------------------------------------------------------------------------------


def _secret_path(name: str, settings: Settings, environ: dict[str, str]) -> str | None:
    """The file a secret (or a URL file) came from, as load_settings found it."""
    from paygate_cli.settings import URL_FILES, env_var

    secret = settings.secrets.get(name)
    if secret is not None:
        return secret.source
    source = settings.sources.get(name, "")
    if name not in URL_FILES or not source.startswith(("file via", "credential")):
        return None
    if source.startswith("credential "):
        return source.removeprefix("credential ")
    if source == f"file via {env_var(name)}_FILE":
        return environ.get(f"{env_var(name)}_FILE")
    if settings.config_file:
        import tomllib

        with open(settings.config_file, "rb") as handle:
            value = tomllib.load(handle).get(f"{name}_file")
        return str(value) if value else None
    return None


def _plain_password_check(settings: Settings) -> Check | None:
    """A database URL given in plain form (allowed: peer or certificate logins carry no password) that
    holds a password anyway: in the environment it leaks through /proc and `systemctl show`; in a
    config file every user may read, to every user."""
    from paygate_cli.settings import redact_dsn

    dsn, source = settings.values.get("database_url"), settings.sources.get("database_url", "")
    if not dsn or redact_dsn(str(dsn)) == str(dsn):
        return None
    if source.startswith("env "):
        return warn("config.settings", "config", f"the database URL in {source.removeprefix('env ')} holds a "
                                                 "password: the environment leaks it (/proc, systemctl show)",
                    "put the URL in a file and set PAYGATE_DATABASE_URL_FILE instead")
    if settings.config_file and os.stat(settings.config_file).st_mode & stat.S_IROTH:
        return fail("config.settings", "config", "config", f"the config file {settings.config_file} holds a database "
                                                           "password and is readable by every user",
                    f"chmod o-rwx {settings.config_file}, or move the URL to database_url_file")
    return None


def config_checks(environ: dict[str, str], overrides: dict[str, Any], config_path: str | None
                  ) -> tuple[list[Check], Settings | None]:
    """The settings, and every configured secret file: present, readable, parseable by the settings
    loader, not readable or writable by every user. Returns the settings loaded with the secrets
    that load (None when the settings themselves do not)."""
    from paygate_cli.settings import SECRETS, URL_FILES, load_settings

    def load(only: tuple[str, ...]) -> Settings:
        return load_settings(environ, overrides=overrides, config_path=config_path, only_secrets=only)

    try:
        plain = load(())
    except ConfigError as exc:
        return [fail("config.settings", "config", "config", _shown(exc),
                     "fix the setting it names (`paygate config show --sources` shows where each comes from)"),
                fail("config.secret_files", "config", "config", "not checked: the settings do not load",
                     "fix config.settings first")], None
    env_count = sum(1 for s in plain.sources.values() if s.startswith("env "))
    checks = [_plain_password_check(plain) or ok(
        "config.settings", "config",
        f"config file {plain.config_file or '(none)'}; {env_count} setting(s) from the environment")]
    loaded: list[str] = []
    shown: list[str] = []
    problems: list[str] = []
    fixes: list[str] = []
    for name in (*SECRETS, *URL_FILES):
        try:
            one = load((name,))
        except ConfigError as exc:
            problems.append(f"{name}: {_shown(exc)}")
            fixes.append(f"{name}: create the file, or point its setting at the right one")
            continue
        path = _secret_path(name, one, environ)
        if path is None:
            continue
        loaded.append(name)
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except OSError as exc:
            problems.append(f"{name}: {path}: {exc.strerror}")
            continue
        if mode & (stat.S_IROTH | stat.S_IWOTH):
            problems.append(f"{name}: {path} is {'readable' if mode & stat.S_IROTH else 'writable'} by every "
                            f"user (mode {mode:04o})")
            fixes.append(f"chmod o-rwx {path} (0600, or 0640 with the service's group)")
        else:
            shown.append(f"{name} {path} ({mode:04o})")
    if problems:
        checks.append(fail("config.secret_files", "config", "config", "; ".join(problems), "; ".join(fixes)))
    else:
        checks.append(ok("config.secret_files", "config",
                         f"{len(shown)} secret file(s), none readable by every user: " + (", ".join(shown) or
                                                                                          "none configured")))
    try:
        settings = load(tuple(loaded))
    except ConfigError as exc:  # a file changed between the two reads
        checks.append(fail("config.settings", "config", "config", _shown(exc), "run doctor again"))
        return checks, None
    return checks, settings


# -- db ---------------------------------------------------------------------------------------------

PIN_SQL = "SELECT pg_backend_pid()"


def writer_check(conn: psycopg.Connection) -> Check:
    """The database reached takes writes: a tick refuses a standby or a read-only database (69)."""
    from paygate_cli.db.connect import no_writer_reason

    reason = no_writer_reason(conn)
    if reason is not None:
        return fail("db.writer", "db", "unavailable", reason,
                    "point the database URL at the primary, or list every host with "
                    "target_session_attrs=read-write (docs/configuration.md)")
    return ok("db.writer", "db", "the database takes writes (not a standby, not read-only)")


def restore_gate_check(conn: psycopg.Connection) -> Check:
    """No restore halt (docs/architecture.md §8): while one is set, no tick signs anything new."""
    from paygate_cli.state import list_halts

    halt = next((h for h in list_halts(conn) if h["kind"] == "restore"), None)
    if halt is not None:
        return fail("db.restore_gate", "db", "human",
                    f"submissions are closed by the restore halt set by {halt['set_by']} at {halt['set_at']}: "
                    f"{halt['reason']}",
                    "let the recovery worker's pass clear it, or run `paygate recover-check --yes` "
                    "(runbooks/postgres-failover-restore.md)")
    return ok("db.restore_gate", "db", "no restore halt: the database's identity is the one the journal recorded")


def pooling_check(conn: psycopg.Connection, open_conn: Callable[[str], AbstractContextManager[Any]]) -> Check:
    """Advisory locks are session state: they need the connection's server session to stay its own
    (direct, or PgBouncer in session mode). Transaction pooling hands a client's next statement to
    whichever server is idle. The probe: the connection's backend pid; then other connections each
    hold a transaction open (pinning the idle servers of a pool, the one just used included); then
    the connection's backend pid again. Unchanged, and never seen on another connection: session
    pooled or direct. Statement pooling refuses the pins' transactions outright."""
    import psycopg

    first = conn.execute(PIN_SQL).fetchone()[0]
    seen: list[int] = []
    with _pins(open_conn) as pins:
        try:
            for pin in pins:
                pin.execute("BEGIN")
                seen.append(pin.execute(PIN_SQL).fetchone()[0])
            second = conn.execute(PIN_SQL).fetchone()[0]
        except psycopg.Error as exc:
            return fail("db.pooling", "db", "config",
                        f"a transaction on a second connection was refused ({_shown(exc)}): statement pooling?",
                        "connect paygate directly or through PgBouncer with pool_mode = session")
        finally:
            for pin in pins:
                if not pin.closed:
                    pin.rollback()
    if second != first or first in seen:
        how = (f"the connection's statements ran on backend {first}, then {second}" if second != first
               else f"backend {first} served another client's open transaction between two of its statements")
        return fail("db.pooling", "db", "config",
                    f"{how}: the connection shares its server session (PgBouncer transaction pooling?); "
                    "advisory locks would be taken by one statement and lost to the next",
                    "connect paygate directly or through PgBouncer with pool_mode = session")
    return ok("db.pooling", "db", f"backend {first} kept across statements while {len(seen)} other connection(s) "
                                   "held transactions open: a session of its own (direct or session-pooled)")


@contextmanager
def _pins(open_conn: Callable[[str], AbstractContextManager[Any]]) -> Iterator[list[Any]]:
    from contextlib import ExitStack

    with ExitStack() as stack:
        yield [stack.enter_context(open_conn("doctor:pooling")) for _ in range(POOL_PINS)]


# -- schema -----------------------------------------------------------------------------------------

PRIVILEGES_SQL = """
SELECT t.tbl, p.priv, has_table_privilege(%(role)s, t.tbl, p.priv)
FROM unnest(%(tables)s::text[]) AS t(tbl), unnest(%(privs)s::text[]) AS p(priv)
"""
ROLES_SQL = "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)"


def schema_checks(conn: psycopg.Connection) -> list[Check]:
    from paygate_cli.db.migrate import schema_state

    state = schema_state(conn)
    current, expected = state["schema_version"], state["expected_version"]
    if current > expected:
        version = fail("schema.version", "schema", "config",
                       f"the database is at schema version {current}, ahead of this build's {expected}",
                       "upgrade paygate on this host to the build that migrated the database")
    elif state["message"]:
        version = fail("schema.version", "schema", "config", str(state["message"]), "run `paygate migrate`")
    else:
        version = ok("schema.version", "schema", f"schema version {current}, as this build needs; SQL functions "
                                                 "current")
    return [version, grants_check(conn)]


def grants_check(conn: psycopg.Connection) -> Check:
    """The runtime and read-only roles hold exactly what db/privileges.py grants (what `migrate --roles`
    grants from), table by table."""
    from paygate_cli.db.privileges import BY_TABLE, READONLY_ROLE, RUNTIME_ROLE, TABLE_PRIVILEGES, USER_TABLES_SQL

    present = [row[0] for row in conn.execute(USER_TABLES_SQL)]
    classified = [t for t in present if t in BY_TABLE]
    roles = {row[0] for row in conn.execute(ROLES_SQL, ([RUNTIME_ROLE, READONLY_ROLE],))}
    missing_roles = [r for r in (RUNTIME_ROLE, READONLY_ROLE) if r not in roles]
    if missing_roles:
        return fail("roles.grants", "schema", "config", f"role(s) {', '.join(missing_roles)} do not exist",
                    "run `paygate migrate --roles`")
    wrong: list[str] = []
    for role in (RUNTIME_ROLE, READONLY_ROLE):
        for table, privilege, held in conn.execute(PRIVILEGES_SQL, {"role": role, "tables": classified,
                                                                     "privs": list(TABLE_PRIVILEGES)}):
            grant = BY_TABLE[table]
            wanted = privilege in grant.runtime if role == RUNTIME_ROLE else (privilege == "SELECT" and grant.readonly)
            if held != wanted:
                wrong.append(f"{role} {'holds' if held else 'lacks'} {privilege} on {table}")
    unclassified = [t for t in present if t not in BY_TABLE]
    if wrong:
        return fail("roles.grants", "schema", "config",
                    f"{len(wrong)} grant(s) differ from db/privileges.py: " + "; ".join(wrong[:8])
                    + ("; …" if len(wrong) > 8 else ""), "run `paygate migrate --roles`")
    if unclassified:
        return warn("roles.grants", "schema", f"tables no grant decision covers (neither role may use them): "
                                              f"{', '.join(unclassified[:8])}",
                    "classify them in db/privileges.py, or drop them")
    return ok("roles.grants", "schema", f"{RUNTIME_ROLE} and {READONLY_ROLE} hold exactly their grants on "
                                        f"{len(classified)} tables")


# -- rpc ----------------------------------------------------------------------------------------------


@dataclass
class Endpoint:
    number: int
    url: str  # never shown: `host` is
    host: str
    roles: list[str]
    facts: EndpointFacts | None = None
    error: str | None = None

    def usable(self, settings: Settings) -> bool:
        """Healthy and on the configured network: what doctor's own chain reads may use."""
        return (self.facts is not None and self.facts.status == "healthy"
                and self.facts.passphrase == settings.network_passphrase)


def endpoints_of(settings: Settings) -> list[Endpoint]:
    """The write endpoint and the distinct read endpoints, each once, numbered in that order (the
    `<n>` of `rpc.<n>.*`)."""
    from paygate_cli.endpoints import endpoint_name
    from paygate_cli.ops.status import distinct_rpc_urls, rpc_endpoints
    from paygate_cli.settings import normalise_rpc_url

    pairs = [(role, normalise_rpc_url(url)) for role, url in rpc_endpoints(settings)]
    return [Endpoint(n, url, endpoint_name(url), [role for role, u in pairs if u == url])
            for n, url in enumerate(distinct_rpc_urls(settings), start=1)]


def probe_endpoints(endpoints: list[Endpoint], timeout: float) -> None:
    """getHealth and getNetwork of every endpoint at once (threads), each bounded by `timeout`; a
    Ctrl-C leaves at once (chain/threads.py ask_at_once)."""
    from paygate_cli.chain.deployment import endpoint_facts
    from paygate_cli.chain.threads import ask_at_once

    def ask(endpoint: Endpoint) -> None:
        try:
            endpoint.facts = endpoint_facts(endpoint.url, timeout)
        except Exception as exc:  # any failure of one endpoint is its finding
            endpoint.error = _shown(exc)

    ask_at_once({index: lambda endpoint=endpoint: ask(endpoint) for index, endpoint in enumerate(endpoints)})


def required_retention_ledgers(settings: Settings) -> tuple[int, str]:
    """What the read endpoints must keep: resolve proves a lineage's fate only from an endpoint whose
    oldest ledger is at or before the lineage's signing ledger (journal/resolve.py), for as long as
    it may stay in flight (recovery_alarm_age; tx_validity + recovery_grace at least); the observer
    reads events from its cursor, which falls behind by the time it may go without a tick
    (its overdue_after) before it is noticed."""
    from paygate_cli.catalogue import WORKERS
    from paygate_cli.settings import ledgers

    resolve_s = max(float(settings.recovery_alarm_age), float(settings.tx_validity) + float(settings.recovery_grace))
    observer_s = WORKERS["observer"].overdue_after
    seconds = max(resolve_s, observer_s)
    return ledgers(seconds), (f"resolve needs {ledgers(resolve_s)} ledgers (recovery_alarm_age, tx_validity + "
                              f"recovery_grace), the observer {ledgers(observer_s)} (its overdue_after)")


def rpc_checks(settings: Settings, endpoints: list[Endpoint]) -> list[Check]:
    g = "rpc"
    checks: list[Check] = []
    furthest = max((e.facts.latest_ledger for e in endpoints if e.facts), default=None)
    newest_protocol = max((e.facts.protocol_version for e in endpoints if e.facts and e.facts.protocol_version),
                          default=None)
    needed, why = required_retention_ledgers(settings)
    for e in endpoints:
        prefix, name = f"rpc.{e.number}", f"{e.host} ({'/'.join(e.roles)})"
        facts = e.facts
        if facts is None:
            checks.append(fail(f"{prefix}.reachable", g, "unavailable", f"{name}: {e.error}",
                               "check the provider (runbooks/rpc-provider-outage.md), or replace the endpoint"))
            for what in ("network", "protocol", "lag", "retention"):
                checks.append(fail(f"{prefix}.{what}", g, "unavailable", f"not checked: {name} did not answer",
                                   f"fix {prefix}.reachable first"))
            continue
        if facts.status != "healthy":
            checks.append(fail(f"{prefix}.reachable", g, "unavailable",
                               f"{name}: getHealth status {facts.status!r} at ledger {facts.latest_ledger}",
                               "check the provider (runbooks/rpc-provider-outage.md), or replace the endpoint"))
        else:
            checks.append(ok(f"{prefix}.reachable", g, f"{name}: healthy at ledger {facts.latest_ledger}"))
        if facts.passphrase == settings.network_passphrase:
            checks.append(ok(f"{prefix}.network", g, f"{name} serves {facts.passphrase!r}"))
        else:
            checks.append(fail(f"{prefix}.network", g, "config",
                               f"{name} serves {facts.passphrase!r}, not the configured "
                               f"{settings.network_passphrase!r}",
                               "point the endpoint at the configured network (or fix PAYGATE_NETWORK_PASSPHRASE)"))
        if facts.protocol_version is None:
            checks.append(warn(f"{prefix}.protocol", g, f"{name}: getNetwork names no protocolVersion",
                               "upgrade the RPC node to one that reports it"))
        elif newest_protocol is not None and facts.protocol_version < newest_protocol:
            checks.append(warn(f"{prefix}.protocol", g, f"{name} speaks protocol {facts.protocol_version}, another "
                                                        f"endpoint {newest_protocol}",
                               "upgrade this RPC node: it is behind the network's protocol"))
        else:
            checks.append(ok(f"{prefix}.protocol", g, f"{name}: protocol {facts.protocol_version}"))
        lag = (furthest or facts.latest_ledger) - facts.latest_ledger
        evidence = f"{name} at ledger {facts.latest_ledger}, {lag} behind the furthest endpoint ({furthest})"
        if lag >= LAG_FAIL_LEDGERS:
            checks.append(fail(f"{prefix}.lag", g, "unavailable", evidence,
                               "the node is not keeping up: fix or replace it (its reads are stale)"))
        elif lag >= LAG_WARN_LEDGERS:
            checks.append(warn(f"{prefix}.lag", g, evidence, "watch the node: it lags the others"))
        else:
            checks.append(ok(f"{prefix}.lag", g, evidence))
        window = facts.retention_window
        held = facts.latest_ledger - facts.oldest_ledger + 1
        if window is None:
            checks.append(warn(f"{prefix}.retention", g, f"{name}: getHealth names no ledgerRetentionWindow (holds "
                                                         f"{held} ledgers now); {why}",
                               "confirm the provider's retention covers it"))
        elif window < needed:
            checks.append(fail(f"{prefix}.retention", g, "config",
                               f"{name} keeps {window} ledgers; {needed} are needed: {why}",
                               "raise the node's history retention window (or use a provider keeping more)"))
        else:
            checks.append(ok(f"{prefix}.retention", g, f"{name} keeps {window} ledgers (holds {held} now); "
                                                       f"{needed} needed: {why}"))
    checks.append(distinct_hosts_check(settings))
    return checks


def distinct_hosts_check(settings: Settings) -> Check:
    """The money movers' quorum rule (settings.require_read_quorum)."""
    from paygate_cli.settings import MIN_READ_HOSTS, distinct_read_urls, require_read_quorum, rpc_host

    hosts = [rpc_host(u) for u in distinct_read_urls(list(settings.rpc_read_urls), settings.rpc_url)]
    evidence = f"read endpoints on {len(hosts)} distinct host(s): {', '.join(hosts)}"
    if len(hosts) >= MIN_READ_HOSTS:
        return ok("rpc.distinct_hosts", "rpc", f"{evidence} (the money movers need {MIN_READ_HOSTS})")
    if settings.rpc_allow_single_endpoint:
        return warn("rpc.distinct_hosts", "rpc", f"{evidence}; PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT lets the money "
                                                 f"movers run without a quorum of {MIN_READ_HOSTS}",
                    f"development only: add read endpoints on {MIN_READ_HOSTS} distinct hosts in production")
    try:
        require_read_quorum(settings, "the money movers refuse to start", "they declare transactions dead by a "
                                                                          "majority of them")
    except ConfigError as exc:
        return fail("rpc.distinct_hosts", "rpc", "config", f"{evidence}: {_shown(exc)}",
                    f"add read endpoints on {MIN_READ_HOSTS} distinct hosts to PAYGATE_RPC_READ_URLS")
    return ok("rpc.distinct_hosts", "rpc", evidence)


def clock_check(endpoints: list[Endpoint], now: float) -> Check:
    reached = [e for e in endpoints if e.facts is not None and e.facts.latest_close_time is not None]
    if not reached:
        return fail("clock.skew", "clock", "unavailable", "not checked: no RPC endpoint gave a ledger close time",
                    "fix the rpc checks first")
    head = max(reached, key=lambda e: e.facts.latest_ledger if e.facts else 0)
    assert head.facts is not None and head.facts.latest_close_time is not None
    skew = now - head.facts.latest_close_time
    evidence = (f"host clock {abs(skew):.0f}s {'ahead of' if skew >= 0 else 'behind'} the close time of ledger "
                f"{head.facts.latest_ledger} ({head.host}); ledgers close about every 5 s")
    if abs(skew) > SKEW_FAIL_S:
        return fail("clock.skew", "clock", "config", evidence, "fix the host's time synchronisation (NTP), or the "
                                                               "RPC node is stuck")
    if abs(skew) > SKEW_WARN_S:
        return warn("clock.skew", "clock", evidence, "check the host's time synchronisation (NTP)")
    return ok("clock.skew", "clock", evidence)


# -- lanes ---------------------------------------------------------------------------------------------

LANES_SQL = "SELECT address FROM paygate.lanes WHERE status <> 'retired' ORDER BY address"
RELAY_CONFIG_SQL = "SELECT gas_warning_floor, gas_critical_floor, lane_min_balance FROM paygate.relay_config"


def lane_checks(conn: psycopg.Connection, settings: Settings, chain: ChainClient) -> list[Check]:
    """Each lane (the seeds' addresses and the journal's registered lanes): on chain, an operator of
    the billing contract, above its reserve, and its sequence where the journal left it."""
    from paygate_cli.chain.deployment import billing_operators, lane_addresses
    from paygate_cli.chain.relay import xlm_balances

    g = "lanes"
    seeded = lane_addresses(settings)
    registered = [row[0] for row in conn.execute(LANES_SQL)]
    lanes = sorted({*seeded, *registered})
    source = (f"{len(seeded)} from {settings.secret('lane_secrets').source}" if settings.secret("lane_secrets")
              else "no PAYGATE_LANE_SECRETS_FILE here")
    if not lanes:
        return [warn("lanes.known", g, f"no lane: {source}, none registered in the journal",
                     "configure PAYGATE_LANE_SECRETS_FILE (one lane seed a line)")]
    checks = [ok("lanes.known", g, f"{len(lanes)} lane(s): {source}, {len(registered)} registered in the journal")]
    _, _, lane_min = conn.execute(RELAY_CONFIG_SQL).fetchone()
    balances = xlm_balances(chain, lanes)
    operators: frozenset[str] = frozenset()
    unknown: tuple[str, str, str] | None = None  # why the operators are not known: (kind, evidence, fix)
    if not settings.billing_contract:
        unknown = ("config", "PAYGATE_BILLING_CONTRACT is not set", "set PAYGATE_BILLING_CONTRACT")
    else:
        try:
            operators = billing_operators(chain, settings.billing_contract)
        except PaygateError as exc:
            unknown = (_kind_of(exc), _shown(exc), "check PAYGATE_BILLING_CONTRACT and the RPC")
    for lane in lanes:
        prefix, balance = f"lane.{lane}", balances[lane]
        if not balance.exists:
            checks.append(fail(f"{prefix}.exists", g, "config", f"no account {lane} on chain (ledger {balance.ledger})",
                               "create and fund the account, or remove its seed from the lane secrets"))
        else:
            checks.append(ok(f"{prefix}.exists", g, f"account on chain (ledger {balance.ledger})"))
        if unknown is not None:
            kind, evidence, fix = unknown
            checks.append(fail(f"{prefix}.operator", g, kind, f"not checked: {evidence}", fix))
        elif lane in operators:
            checks.append(ok(f"{prefix}.operator", g,
                             f"an operator of the billing contract {settings.billing_contract}"))
        else:
            checks.append(fail(f"{prefix}.operator", g, "config",
                               f"not among the {len(operators)} operator(s) of the billing contract "
                               f"{settings.billing_contract}: its charge_batch and credit would trap",
                               "have the billing admin add it (add_operator), or drain and remove the lane"))
        checks.append(_lane_xlm(prefix, balance, int(lane_min)))
        checks.append(_lane_sequence(conn, settings, chain, prefix, lane, balance.exists, lane in registered))
    return checks


def _lane_xlm(prefix: str, balance: Any, lane_min: int) -> Check:
    g = "lanes"
    if not balance.exists:
        return fail(f"{prefix}.xlm", g, "config", "no account: no XLM", "create and fund the account")
    evidence = (f"{_xlm(balance.balance)}, reserve {_xlm(balance.reserve)}, spendable {_xlm(balance.spendable)} "
                f"(lane_min_balance {_xlm(lane_min)})")
    if balance.spendable < 0:
        return fail(f"{prefix}.xlm", g, "config", f"below its reserve: {evidence}", "send the lane XLM")
    if balance.spendable < lane_min:
        return warn(f"{prefix}.xlm", g, f"below lane_min_balance: {evidence}", "send the lane XLM")
    return ok(f"{prefix}.xlm", g, evidence)


def _lane_sequence(conn: psycopg.Connection, settings: Settings, chain: ChainClient, prefix: str, lane: str,
                   exists: bool, registered: bool) -> Check:
    """The chain's sequence against the journal's last consumed one: nonce-inspect's judgement
    (ops/nonce_inspect.py inspect_lanes), lane by lane."""
    from paygate_cli.ops.nonce_inspect import inspect_lanes

    g = "lanes"
    if not exists:
        return fail(f"{prefix}.sequence", g, "config", "not checked: no account on chain", f"fix {prefix}.exists first")
    if not registered:
        return ok(f"{prefix}.sequence", g, f"chain sequence {chain.account_sequence(lane)}; not in the journal yet "
                                           "(registered at its first allocation)")
    report = inspect_lanes(conn, lambda: chain, lane, chain.account_sequence)[0]
    evidence = (f"chain sequence {report['chain_seq']}, journal's last consumed "
                f"{report['journal_last_consumed_seq'] if report['journal_last_consumed_seq'] is not None else 'none'}"
                f"; {report['finding']}")
    if report["needs_human"]:
        return fail(f"{prefix}.sequence", g, "human", evidence,
                    f"see `paygate nonce-inspect --lane {lane}` and runbooks/lane-fenced-chain-ahead.md")
    if report["finding"].startswith("chain behind"):
        return warn(f"{prefix}.sequence", g, evidence, "a read endpoint may lag: see the rpc checks")
    return ok(f"{prefix}.sequence", g, evidence)


# -- fee account --------------------------------------------------------------------------------------

# Fees the fee account paid over the window: every resolved lineage's fee_charged (the TTL keeper's
# extend and restore transactions are lineages too), and when the window's first one resolved.
BURN_SQL = """
SELECT coalesce(sum(fee_charged), 0)::bigint, extract(epoch FROM now() - min(resolved_at))::float8
FROM paygate.lineages WHERE resolved_at > now() - make_interval(days => %s) AND fee_charged IS NOT NULL
"""


def fee_account_checks(conn: psycopg.Connection, settings: Settings, chain: ChainClient) -> list[Check]:
    from paygate_cli.chain.keys import fee_account_address
    from paygate_cli.chain.relay import xlm_balances

    g = "fee_account"
    try:
        address = fee_account_address(settings)
    except ConfigError as exc:
        return [fail("fee_account.balance", g, "config", _shown(exc), "set PAYGATE_FEE_ACCOUNT (its G… address)"),
                fail("fee_account.runway", g, "config", "not checked: no fee account", "fix fee_account.balance")]
    warning, critical, _ = conn.execute(RELAY_CONFIG_SQL).fetchone()
    fee = xlm_balances(chain, [address])[address]
    if not fee.exists:
        return [fail("fee_account.balance", g, "config", f"no account {address} on chain", "create and fund it"),
                fail("fee_account.runway", g, "config", "not checked: no account", "fix fee_account.balance")]
    spendable = fee.spendable
    evidence = (f"{address}: {_xlm(fee.balance)}, spendable {_xlm(spendable)} (gas floors: warning {_xlm(warning)}, "
                f"critical {_xlm(critical)}; the gas monitor also subtracts fees reserved and committed)")
    if spendable < critical:
        balance = fail("fee_account.balance", g, "human", evidence, "top up the fee account (runbooks/gas-halt.md)")
    elif spendable < warning:
        balance = warn("fee_account.balance", g, evidence, "top up the fee account soon (runbooks/gas-halt.md)")
    else:
        balance = ok("fee_account.balance", g, evidence)
    burned, span_s = conn.execute(BURN_SQL, (RUNWAY_WINDOW_DAYS,)).fetchone()
    if not burned:
        runway = ok("fee_account.runway", g, f"no fee charged in the last {RUNWAY_WINDOW_DAYS} days: no burn rate "
                                             "to project")
    else:
        days_seen = min(float(RUNWAY_WINDOW_DAYS), max(1.0, (span_s or 0.0) / 86400))
        per_day = burned / days_seen
        days = max(0, spendable) / per_day
        text = (f"{_xlm(int(burned))} of fees over the last {days_seen:g} day(s) ({_xlm(int(per_day))} a day): "
                f"{days:.1f} days of runway")
        if days < RUNWAY_FAIL_DAYS:
            runway = fail("fee_account.runway", g, "human", text, "top up the fee account (runbooks/gas-halt.md)")
        elif days < RUNWAY_WARN_DAYS:
            runway = warn("fee_account.runway", g, text, "plan a top-up of the fee account")
        else:
            runway = ok("fee_account.runway", g, text)
    return [balance, runway]


# -- journal -------------------------------------------------------------------------------------------

LIVE_KEYS_SQL = """
SELECT key_id, count(*), max(id) FROM paygate.lineages
WHERE paygate.lineage_is_live(state) AND key_id IS NOT NULL AND envelope IS NOT NULL
GROUP BY key_id ORDER BY key_id
"""


def journal_checks(conn: psycopg.Connection, settings: Settings) -> list[Check]:
    """The active key loads; every live envelope's key is in the keys file, and the newest envelope
    of each key decrypts under it (the plaintext is dropped at once)."""
    from paygate_cli.journal import lineage as lineages
    from paygate_cli.journal.keyring import EnvelopeTampered, Keyring

    g = "journal"
    live = conn.execute(LIVE_KEYS_SQL).fetchall()
    in_use = ", ".join(f"{key_id} ({count})" for key_id, count, _ in live) or "none"
    try:
        keyring = Keyring.from_settings(settings)
    except ConfigError as exc:
        return [fail("journal.active_key", g, "config", _shown(exc),
                     "configure PAYGATE_JOURNAL_KEYS_FILE and PAYGATE_JOURNAL_ACTIVE_KEY_ID"),
                fail("journal.envelope_keys", g, "config",
                     f"not checked: no keyring here; live envelopes by key: {in_use}", "fix journal.active_key")]
    checks = [ok("journal.active_key", g, f"active key {keyring.active_key_id} loads; keys: "
                                          f"{', '.join(sorted(keyring.keys))}")]
    missing = [(key_id, count) for key_id, count, _ in live if key_id not in keyring.keys]
    if missing:
        checks.append(fail("journal.envelope_keys", g, "config",
                           "live envelopes need key(s) missing from the keys file: "
                           + ", ".join(f"{k} ({n} envelope(s))" for k, n in missing),
                           "put the key(s) back in the journal keys file: recovery cannot resend those envelopes "
                           "(runbooks/journal-key-rotation.md)"))
        return checks
    for key_id, _, newest in live:
        lineage = lineages.load(conn, newest)
        try:
            keyring.decrypt(lineage.envelope or b"", key_id=key_id, lineage_id=lineage.id, source=lineage.lane,
                            seq=lineage.source_seq or 0)
        except EnvelopeTampered:
            checks.append(fail("journal.envelope_keys", g, "human",
                               f"lineage {lineage.id}'s envelope does not decrypt under key {key_id!r} (a different "
                               "key under the same id, or an altered row)",
                               f"see `paygate nonce-inspect --lane {lineage.lane}`; restore the original key"))
            return checks
    checks.append(ok("journal.envelope_keys", g, f"live envelopes by key: {in_use}; each key's newest decrypts"
                     if live else "no live envelope in the journal"))
    return checks


# -- ttl -------------------------------------------------------------------------------------------------


def ttl_check(conn: psycopg.Connection, settings: Settings, chain: ChainClient | None,
              latest_ledger: int | None) -> Check:
    """The nearest expiry of what the TTL keeper keeps alive, against ttl_threshold: the kept
    entries as last read (ttl_entries), and the billing contract's instance and code read now."""
    from paygate_cli.settings import LEDGER_SECONDS, ledgers
    from paygate_cli.state import ttl_state

    g = "ttl"
    state = ttl_state(conn)
    threshold = ledgers(float(settings.ttl_threshold))
    if state["needs_human"]:
        first = state["needs_human"][0]
        return fail("ttl.horizon", g, "human", f"{len(state['needs_human'])} kept entr(ies) need a human (the first: "
                                               f"{first['kind']}: {first['reason']})", "see runbooks/contract-ttl.md")
    horizons: list[tuple[int, str]] = []  # (ledgers left, what)
    nearest = state["nearest"]
    if nearest is not None and nearest["ledgers_left"] is not None:
        horizons.append((nearest["ledgers_left"], f"{nearest['kind']} as last read"))
    archived = state["entries"].get("archived", 0)
    if chain is not None and settings.billing_contract and latest_ledger is not None:
        from paygate_cli.chain.ttl import code_key, instance_key, read_ttls

        keys = {"the billing contract's instance": instance_key(settings.billing_contract)}
        keys["its code"] = code_key(chain, settings.billing_contract)
        read = read_ttls(chain, list(keys.values()))
        for what, key in keys.items():
            entry = read[key.to_xdr()]
            if entry.archived or entry.absent:
                return fail("ttl.horizon", g, "human", f"{what} reads {'archived' if entry.archived else 'absent'} "
                                                       "on chain", "see runbooks/contract-ttl.md")
            horizons.append(((entry.live_until or 0) - latest_ledger, f"{what} on chain"))
    if archived:
        return fail("ttl.horizon", g, "human", f"{archived} kept entr(ies) read archived (a restore is due)",
                    "run the TTL keeper (`paygate run-tick ttl`); see runbooks/contract-ttl.md")
    if not horizons:
        return warn("ttl.horizon", g, "nothing kept alive is known: no billing contract configured and the TTL "
                                      "keeper has read nothing", "set PAYGATE_BILLING_CONTRACT; run the TTL keeper")
    left, what = min(horizons)
    evidence = (f"nearest expiry: {what}, {left} ledgers (~{left * LEDGER_SECONDS / 86400:.1f} days); the keeper "
                f"extends at {threshold} (ttl_threshold)")
    if left < threshold:
        return warn("ttl.horizon", g, evidence, "run the TTL keeper (`paygate run-tick ttl`): it is due to extend")
    return ok("ttl.horizon", g, evidence)


# -- metrics ---------------------------------------------------------------------------------------------


def metrics_check(settings: Settings) -> Check:
    g = "metrics"
    directory = settings.metrics_dir
    if not directory:
        return ok("metrics.dir", g, "PAYGATE_METRICS_DIR is not set: ticks write no textfiles")
    path = os.path.abspath(directory)
    if os.path.isdir(path):
        if os.access(path, os.W_OK | os.X_OK):
            return ok("metrics.dir", g, f"{path} is a writable directory")
        return fail("metrics.dir", g, "config", f"{path} is not writable by this user",
                    f"let the user running paygate write {path} (chown/chmod), or point PAYGATE_METRICS_DIR elsewhere")
    if os.path.exists(path):
        return fail("metrics.dir", g, "config", f"{path} exists and is not a directory",
                    "point PAYGATE_METRICS_DIR at the textfile collector's directory")
    parent = os.path.dirname(path)
    if os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK):
        return ok("metrics.dir", g, f"{path} does not exist yet; the first tick creates it in {parent}")
    return fail("metrics.dir", g, "config", f"{path} does not exist and {parent} "
                                            f"{'is not writable' if os.path.isdir(parent) else 'does not exist'}",
                "create the directory (writable by the user running paygate), or fix PAYGATE_METRICS_DIR")


# -- the whole run ----------------------------------------------------------------------------------------

# The checks a group always has (ids that do not depend on endpoints or lanes): what a group that
# could not run reports, each as "not checked".
FIXED_IDS = {
    "schema": ("schema.version", "roles.grants"),
    "rpc": ("rpc.distinct_hosts",),
    "lanes": ("lanes.known",),
    "fee_account": ("fee_account.balance", "fee_account.runway"),
    "journal": ("journal.active_key", "journal.envelope_keys"),
    "ttl": ("ttl.horizon",),
    "clock": ("clock.skew",),
    "db": ("db.reachable", "db.pooling"),
    "metrics": ("metrics.dir",),
}


# The groups that read the database.
DATABASE_GROUPS = ("schema", "lanes", "fee_account", "journal", "ttl", "db")


def blocked(group: str, kind: str, why: str, fix: str, done: set[str]) -> list[Check]:
    return [fail(check_id, group, kind, f"not checked: {why}", fix) for check_id in FIXED_IDS.get(group, ())
            if check_id not in done]


@dataclass
class DoctorInput:
    environ: dict[str, str]
    overrides: dict[str, Any]
    config_path: str | None
    # A new database connection for a purpose, as a context manager (commands/_common.py open_db).
    open_conn: Callable[[Settings, str], AbstractContextManager[Any]]
    now: Callable[[], float] = time.time


def run_doctor(given: DoctorInput, groups: tuple[str, ...]) -> dict[str, Any]:
    """Every check of `groups`; the document `doctor --json` prints (without schema_version)."""
    checks: list[Check] = []
    config, settings = config_checks(given.environ, given.overrides, given.config_path)
    if "config" in groups:
        checks += config
    if settings is None:
        for group in groups:
            if group != "config":
                checks += blocked(group, "config", "the settings do not load", "fix the config checks", set())
        return report(checks, groups)
    assert settings is not None
    wanted = set(groups)
    needs_db = wanted & set(DATABASE_GROUPS)
    needs_rpc = wanted & {"rpc", "clock", "lanes", "fee_account", "ttl"}
    endpoints: list[Endpoint] = []
    rpc_problem = None if settings.rpc_url else "PAYGATE_RPC_URL is not set"
    if needs_rpc and rpc_problem is None:
        try:
            endpoints = endpoints_of(settings)
        except ConfigError as exc:  # PAYGATE_RPC_URL given in plain form is checked only here
            rpc_problem = _shown(exc)
        probe_endpoints(endpoints, min(PROBE_TIMEOUT_S, float(settings.rpc_timeout)))
    if "rpc" in wanted:
        checks += (rpc_checks(settings, endpoints) if rpc_problem is None else
                   [fail("rpc.configured", "rpc", "config", rpc_problem, "set PAYGATE_RPC_URL to the write endpoint"),
                    *blocked("rpc", "config", "no usable RPC configuration", "fix rpc.configured first", set())])
    if "clock" in wanted:
        checks.append(clock_check(endpoints, given.now()) if rpc_problem is None else
                      fail("clock.skew", "clock", "config", "not checked: no usable RPC configuration",
                           "fix rpc.configured first"))
    if "metrics" in wanted:
        checks.append(metrics_check(settings))
    if needs_db:
        checks += _database_groups(given, settings, groups, endpoints, rpc_problem)
    return report(checks, groups)


def _database_groups(given: DoctorInput, settings: Settings, groups: tuple[str, ...],
                     endpoints: list[Endpoint], rpc_problem: str | None) -> list[Check]:
    """The groups that read the database (and, for lanes, the fee account and TTL, the chain)."""
    from contextlib import ExitStack

    from paygate_cli.db.connect import connection_target, describe_target

    checks: list[Check] = []
    with ExitStack() as stack:
        try:
            conn = stack.enter_context(given.open_conn(settings, "doctor"))
        except PaygateError as exc:
            kind, why = _kind_of(exc), "the database is not reachable (see db.reachable)"
            if "db" in groups:
                checks.append(fail("db.reachable", "db", kind, _shown(exc), "fix the database URL, or the database"))
            for group in groups:
                if group in DATABASE_GROUPS:
                    checks += blocked(group, kind, why, "fix db.reachable first",
                                      {"db.reachable"})
            return checks
        if "db" in groups:
            version = conn.info.parameter_status("server_version") or "?"
            checks.append(ok("db.reachable", "db", f"{describe_target(connection_target(conn))}, PostgreSQL {version}"))
            checks += _guarded("db", {"db.reachable"}, lambda: [
                writer_check(conn), restore_gate_check(conn),
                pooling_check(conn, lambda purpose: given.open_conn(settings, purpose))])
        if "schema" in groups:
            checks += _guarded("schema", set(), lambda: schema_checks(conn))
        if "journal" in groups:
            checks += _guarded("journal", set(), lambda: journal_checks(conn, settings))
        chain = _chain(settings, conn, endpoints) if set(groups) & {"lanes", "fee_account", "ttl"} else None
        if chain is not None:
            stack.callback(chain.close)
        latest = max((e.facts.latest_ledger for e in endpoints if e.facts and e.usable(settings)), default=None)
        if chain is None:
            why = rpc_problem or "no RPC endpoint answered healthy on the configured network"
            for group in ("lanes", "fee_account"):
                if group in groups:
                    checks += blocked(group, "config" if rpc_problem else "unavailable", why,
                                      "fix the rpc checks first", set())
        else:
            if "lanes" in groups:
                checks += _guarded("lanes", set(), lambda: lane_checks(conn, settings, chain))
            if "fee_account" in groups:
                checks += _guarded("fee_account", set(), lambda: fee_account_checks(conn, settings, chain))
        if "ttl" in groups:  # without a chain client, from what the keeper recorded
            checks += _guarded("ttl", set(), lambda: [ttl_check(conn, settings, chain, latest)])
    return checks


def _chain(settings: Settings, conn: psycopg.Connection, endpoints: list[Endpoint]) -> ChainClient | None:
    """A chain client over the read endpoints that answered the probe healthy and on the configured
    network, with the probe's timeout: an endpoint that is down or slow costs doctor one probe, not a
    retried read per lane, and one on another network is never read (None when no endpoint is usable)."""
    from dataclasses import replace

    from paygate_cli.chain.rpc import ChainClient

    answered = [e.url for e in endpoints if e.usable(settings) and "read" in e.roles]
    if not answered:
        return None
    values = {**settings.values, "rpc_read_urls": answered,
              "rpc_timeout": min(PROBE_TIMEOUT_S, float(settings.rpc_timeout))}
    return ChainClient(replace(settings, values=values), guard_conn=conn)


def _guarded(group: str, done: set[str], run: Callable[[], list[Check]]) -> list[Check]:
    """A group's checks; a failure that stops the group midway is one failed check saying what it
    was, and the group's other checks are reported not checked."""
    import psycopg

    try:
        return run()
    except (PaygateError, psycopg.Error) as exc:
        kind = _kind_of(exc)
        first = fail(f"{group}.error", group, kind, f"the checks stopped: {_shown(exc)}",
                     "fix what it names, then run doctor again")
        return [first, *blocked(group, kind, "the group's checks stopped", f"fix {group}.error first", done)]


def report(checks: list[Check], groups: tuple[str, ...]) -> dict[str, Any]:
    """The document: every check, each group's verdict (the worst of its checks: never ok while one
    fails), the counts and the exit code."""
    rank = {"ok": 0, "warn": 1, "fail": 2}
    checks = sorted(checks, key=lambda c: GROUPS.index(c.group))  # stable: each group's own order kept
    verdicts = {group: max((c.verdict for c in checks if c.group == group), key=rank.__getitem__, default="ok")
                for group in groups}
    failed_kinds = {c.kind for c in checks if c.verdict == "fail"}
    exit_code = next((FAILURE_EXIT[kind] for kind in FAILURE_EXIT if kind in failed_kinds),
                     ExitCode.FAILED if any(c.verdict == "warn" for c in checks) else ExitCode.OK)
    summary = {verdict: sum(1 for c in checks if c.verdict == verdict) for verdict in ("ok", "warn", "fail")}
    return {"checks": [c.public() for c in checks], "groups": verdicts,
            "summary": {**summary, "exit_code": int(exit_code)}}
