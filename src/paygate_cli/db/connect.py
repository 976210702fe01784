"""Connections: every one sets application_name and the three timeouts (docs/architecture.md §2)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from paygate_cli.errors import (
    ConfigError,
    DatabaseAuthFailed,
    DatabaseConfigInvalid,
    ExitCode,
    PaygateError,
    Unavailable,
)

if TYPE_CHECKING:
    import psycopg

    # What a caller above db/ holds: a connection it hands on, never runs SQL on (docs/architecture.md §2).
    Connection = psycopg.Connection

    from paygate_cli.settings import Settings


def _ms(seconds: float) -> int:
    return max(0, int(seconds * 1000))


# Worth retrying: no answer at all (no SQLSTATE), or the server saying "not now". A missing
# database or a wrong password will not fix itself in 200 ms.
_TRANSIENT_SQLSTATES = {None, "57P03", "53300", "08000", "08001", "08006"}


# libpq reports a refused login without a SQLSTATE (psycopg's sqlstate is None for every connection
# failure), so a refusal is recognised by the server's FATAL text. None of these fixes itself.
_REFUSED = re.compile(
    r"authentication failed|no password supplied|password is required|pg_hba\.conf|"
    r"FATAL:\s+(role|database) \"[^\"]*\" does not exist|certificate", re.IGNORECASE)


def _is_refused(exc: BaseException) -> bool:
    return bool(_REFUSED.search(str(exc)))


# libpq rejecting the connection settings themselves, before any network I/O (`sslmode=bogus`, a port
# that is not a number, an SSL mode this libpq cannot do): configuration (78), never an outage (69).
_INVALID_SETTING = re.compile(
    r"invalid [a-z_]+ value|invalid integer value|invalid port number|could not match \d+ port numbers|"
    r"could not match \d+ host names|not compiled in|invalid SSL protocol version range", re.IGNORECASE)
# The OS refusing the Unix socket path: a socket directory this OS user may not enter, or a socket it
# may not write. 78, not 77 and not 69: 77 is the database refusing a privilege to paygate's *role*
# (a GRANT fixes it), while this is the filesystem refusing the *OS user* before Postgres is asked,
# fixed only in the deployment (the DSN's host=, the user the unit runs as, its groups). No retry
# fixes it, and calling it "unavailable" sends on-call looking for a server that is up.
_SOCKET_DENIED = re.compile(r'on socket "[^"]*" failed: Permission denied', re.IGNORECASE)


# libpq (psycopg, for a multi-host DSN) refusing a host for target_session_attrs=read-write/primary:
# it answered, but it is a standby or read-only. "No writer", not "unreachable".
_NOT_A_WRITER = re.compile(r"session is read-only|server is in hot standby mode", re.IGNORECASE)


def _is_misconfigured(exc: BaseException) -> bool:
    return bool(_INVALID_SETTING.search(str(exc)) or _SOCKET_DENIED.search(str(exc)))


def _is_transient(exc: BaseException) -> bool:
    import psycopg

    return (isinstance(exc, psycopg.OperationalError) and exc.sqlstate in _TRANSIENT_SQLSTATES
            and not _is_refused(exc) and not _is_misconfigured(exc))


def describe_connect_error(exc: BaseException) -> str:
    """libpq's whole message on one line: it names the socket or host and port tried (never the
    password), and its hint; the last line alone ("Is the server running…") loses where."""
    text = " ".join(part.strip() for part in str(exc).strip().splitlines() if part.strip())
    return re.sub(r"^connection (failed|is bad): ", "", text) or type(exc).__name__


# -- the target: which database a command is about to read or write -------------------------------
# Only these connection keys are ever shown: never the password, passfile, sslpassword or options.
_TARGET_KEYS = ("host", "hostaddr", "port", "dbname", "user", "service")


def _target(host: str | None, port: str | None, dbname: str | None, user: str | None,
            service: str | None = None) -> dict[str, Any]:
    return {"host": host or None, "port": port or None, "database": dbname or user or None, "role": user or None,
            "socket": (host or "/").startswith(("/", "@")), "service": service or None}


def dsn_target(dsn: str) -> dict[str, Any]:
    """The target a DSN names, with libpq's own defaults filled in the way libpq fills them (PG*
    variables, the OS user; no host is the compiled-in socket directory, shown as None)."""
    import psycopg
    from psycopg import pq

    try:
        given = {o.keyword.decode(): o.val.decode() for o in pq.Conninfo.parse(dsn.encode())
                 if o.val is not None and o.keyword.decode() in _TARGET_KEYS}
    except (psycopg.Error, UnicodeError):
        raise ConfigError("the database URL is not a valid libpq connection string") from None
    defaults = {o.keyword.decode(): o.val.decode() for o in pq.Conninfo.get_defaults()
                if o.val is not None and o.keyword.decode() in _TARGET_KEYS}
    value = {key: given.get(key) or defaults.get(key) for key in _TARGET_KEYS}
    return _target(value["host"] or value["hostaddr"], value["port"], value["dbname"], value["user"],
                   value["service"])


def connection_target(conn: psycopg.Connection) -> dict[str, Any]:
    """What a live connection reached: for a multi-host DSN, the host that answered."""
    info = conn.info
    return _target(info.host, str(info.port) if info.port else None, info.dbname, info.user)


def database_target(settings: Settings, conn: psycopg.Connection | None = None) -> dict[str, Any]:
    """The database and named context a command acts on (docs/configuration.md, "Which database am I on?"): from
    the live connection when there is one, else from the configured DSN."""
    target = connection_target(conn) if conn is not None else dsn_target(settings.dsn())
    context = settings.values.get("context")
    production = bool(settings.values.get("context_production"))
    if production and not context:
        raise ConfigError("PAYGATE_CONTEXT_PRODUCTION is set but PAYGATE_CONTEXT names no context: a write "
                          "against production is confirmed by typing the context's name",
                          msgid="config.context")
    return {**target, "context": context, "production": production}


def describe_target(target: dict[str, Any]) -> str:
    """One line: `database paygate on host db1:5432 as role paygate_runtime, context prod-eu (production)`."""
    where = target.get("host")
    port = target.get("port") or "5432"
    if target.get("service") and not where:
        place = f"service {target['service']}"
    elif "," in (where or ""):  # a multi-host DSN: every host listed, in libpq's order
        place = f"hosts {where} ports {port}"
    elif target.get("socket"):
        place = f"socket {where or '(libpq default directory)'} port {port}"
    else:
        place = f"host {where}:{port}"
    line = f"database {target.get('database') or '?'} on {place} as role {target.get('role') or '?'}"
    if target.get("context"):
        line += f", context {target['context']}" + (" (production)" if target.get("production") else "")
    return line


def connect(settings: Settings, purpose: str, *, autocommit: bool = True,
            attempts: int = 3, writer: bool = False) -> psycopg.Connection:
    """Open a connection for `purpose` (shown in pg_stat_activity as paygate:<purpose>).

    Connection failures are retried a bounded number of times with jitter, then surface as
    Unavailable (exit 69). Authentication failures are not retried. With `writer`, a connection that
    reached a standby or a read-only database raises NoWriter (69) instead of being returned: the
    tick runner asks this, the read-only commands (status, nonce-inspect) do not."""
    conn = _connect(settings, purpose, autocommit=autocommit, attempts=attempts)
    if writer:
        try:
            require_writer(conn)
        except BaseException:
            conn.close()
            raise
    return conn


def _connect(settings: Settings, purpose: str, *, autocommit: bool, attempts: int) -> psycopg.Connection:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    dsn = settings.dsn()
    try:
        given_options = str(conninfo_to_dict(dsn).get("options") or "")
    except psycopg.ProgrammingError:
        raise ConfigError("the database URL is not a valid libpq connection string") from None
    # Ours come after the DSN's own options, so an operator's -c role=… still applies.
    options = " ".join([given_options,
        f"-c statement_timeout={_ms(settings.statement_timeout)}",
        f"-c lock_timeout={_ms(settings.lock_timeout)}",
        f"-c idle_in_transaction_session_timeout={_ms(settings.idle_in_transaction_timeout)}",
        # Schedules are computed in SQL (anchor + k * period): one time zone for every session, so
        # day and month arithmetic never depends on which host's settings opened the connection.
        "-c TimeZone=UTC",
    ]).strip()
    conninfo = make_conninfo(
        dsn,
        application_name=f"{settings.application_name}:{purpose}"[:63],
        connect_timeout=max(1, int(settings.connect_timeout)),
        options=options,
    )

    def _open() -> psycopg.Connection:
        return psycopg.connect(conninfo, autocommit=autocommit)

    try:
        try:
            return _open()  # the common case, without loading tenacity (it costs ~20 ms per cold start)
        except psycopg.OperationalError as exc:
            if attempts <= 1 or not _is_transient(exc):
                raise
        from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

        retrying = retry(stop=stop_after_attempt(attempts - 1), reraise=True, retry=retry_if_exception(_is_transient),
                         wait=wait_random_exponential(multiplier=0.2, max=2))
        return retrying(_open)()
    except psycopg.OperationalError as exc:
        detail = describe_connect_error(exc)
        if _is_refused(exc):
            raise DatabaseAuthFailed(f"Postgres refused the login (fix the database URL, role or password; "
                                     f"retrying will not help): {detail}") from None
        if _SOCKET_DENIED.search(str(exc)):
            raise DatabaseConfigInvalid(
                f"this OS user may not reach the Postgres socket (fix the database URL's host= socket "
                f"directory, or run as a user allowed into it; retrying will not help): {detail}",
                msgid="db.socket_denied") from None
        if _INVALID_SETTING.search(str(exc)):
            raise DatabaseConfigInvalid(f"the database URL has an invalid setting (retrying will not help): "
                                        f"{detail}") from None
        if _NOT_A_WRITER.search(str(exc)):
            raise NoWriter(f"no writer: no host of the database URL accepts writes (those that answered are "
                           f"standbys or read-only; a failover not finished yet?): {detail}") from None
        raise Unavailable(f"cannot connect to Postgres: {detail}", msgid="db.unavailable") from None


# -- no writer: a hot standby, or a database whose sessions default to read-only ------------------------
class NoWriter(Unavailable):
    """The database reached cannot be written (a standby in recovery, default_transaction_read_only):
    a dependency unavailable (69) until a writer is back (a promotion), never a bug (70)."""

    msgid = "db.no_writer"


NO_WRITER_HINT = "with a multi-host DSN add target_session_attrs=read-write, docs/configuration.md"


def server_role(conn: psycopg.Connection) -> dict[str, bool]:
    """Whether the server is in recovery and whether this session defaults to read-only. PG14+ reports
    both at login (in_hot_standby, default_transaction_read_only: no round trip); older servers are asked."""
    in_hot_standby = conn.info.parameter_status("in_hot_standby")
    read_only = conn.info.parameter_status("default_transaction_read_only")
    if in_hot_standby is None or read_only is None:
        row = conn.execute("SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only')").fetchone()
        assert row is not None
        in_recovery, read_only_text = bool(row[0]), str(row[1])
    else:
        in_recovery, read_only_text = in_hot_standby == "on", read_only
    read_only_on = read_only_text == "on"
    return {"in_recovery": in_recovery, "read_only": read_only_on, "writer": not (in_recovery or read_only_on)}


def _where(conn: psycopg.Connection) -> str:
    target = connection_target(conn)
    return f"{target['host'] or '(libpq default socket directory)'} port {target['port'] or '5432'}"


def no_writer_reason(conn: psycopg.Connection, role: dict[str, bool] | None = None) -> str | None:
    """"no writer: the database at host X is a standby in recovery (read-only); …", or None for a writer."""
    role = role or server_role(conn)
    if role["writer"]:
        return None
    why = ("a standby in recovery (read-only)" if role["in_recovery"]
           else "read-only (default_transaction_read_only = on)")
    return f"no writer: the database at host {_where(conn)} is {why}; {NO_WRITER_HINT}"


def require_writer(conn: psycopg.Connection) -> None:
    reason = no_writer_reason(conn)
    if reason is not None:
        raise NoWriter(reason)


def is_read_only_error(exc: BaseException) -> bool:
    """A write refused because the session is read-only (SQLSTATE 25006), e.g. a primary demoted or
    fenced read-only under a running tick: no writer (69), never a bug (70)."""
    import psycopg

    return isinstance(exc, psycopg.Error) and (
        exc.sqlstate == "25006" or "in a read-only transaction" in str(exc))


def no_writer_error(exc: BaseException, conn: psycopg.Connection | None) -> NoWriter:
    """The NoWriter for a write refused mid-run, naming the host when the connection still tells."""
    at = f" at host {_where(conn)}" if conn is not None and not conn.closed else ""
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return NoWriter(f"no writer: the database{at} refused a write ({first_line}): it is read-only (a standby, "
                    f"a primary demoted, or default_transaction_read_only = on); {NO_WRITER_HINT}")


# Server shutting down / crashed / not accepting connections (class 57P0x), and connection errors.
_GONE_SQLSTATES = {"57P01", "57P02", "57P03"}


def is_connection_lost(exc: BaseException, conn: psycopg.Connection | None = None) -> bool:
    """The database is gone (exit 69), as opposed to a statement that failed on a live connection
    (a deadlock, a lock or statement timeout: the tick failed and the next one retries)."""
    import psycopg

    if not isinstance(exc, psycopg.OperationalError):
        return False
    if conn is not None and conn.closed:
        return True
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _GONE_SQLSTATES


@contextmanager
def relaxed_transaction(conn: psycopg.Connection) -> Iterator[None]:
    """A transaction that does not wait for its WAL flush (synchronous_commit off for it alone).
    Only for writes the system can re-derive after a database crash (a claim, a 'sent' mark, a
    receipt recorded from the chain). Ordering still holds: a later synchronous commit (an anchor,
    a settle) flushes everything before it."""
    with conn.transaction():
        conn.execute("SET LOCAL synchronous_commit = off")
        yield


def assert_not_in_transaction(conn: psycopg.Connection, what: str) -> None:
    """docs/architecture.md §1 rule 2: no database transaction may be open across a network call."""
    from psycopg.pq import TransactionStatus

    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise TransactionOpenAcrossNetworkCall(
            f"refusing {what}: the caller's database connection is inside a transaction"
        )


class TransactionOpenAcrossNetworkCall(PaygateError):
    """A bug: code tried a network call with a transaction open (docs/architecture.md §1 rule 2)."""

    exit_code = ExitCode.SOFTWARE
    msgid = "bug.transaction_open_across_network_call"
