"""Connections: every one sets application_name and the three timeouts (DESIGN §8)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from paygate_cli.errors import ConfigError, DatabaseAuthFailed, ExitCode, PaygateError, Unavailable

if TYPE_CHECKING:
    import psycopg

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


def _is_transient(exc: BaseException) -> bool:
    import psycopg

    return (isinstance(exc, psycopg.OperationalError) and exc.sqlstate in _TRANSIENT_SQLSTATES
            and not _is_refused(exc))


def describe_connect_error(exc: BaseException) -> str:
    """libpq's whole message on one line: it names the socket or host and port tried (never the
    password), and its hint; the last line alone ("Is the server running…") loses where."""
    text = " ".join(part.strip() for part in str(exc).strip().splitlines() if part.strip())
    return re.sub(r"^connection (failed|is bad): ", "", text) or type(exc).__name__


def connect(settings: Settings, purpose: str, *, autocommit: bool = True,
            attempts: int = 3) -> psycopg.Connection:
    """Open a connection for `purpose` (shown in pg_stat_activity as paygate:<purpose>).

    Connection failures are retried a bounded number of times with jitter, then surface as
    Unavailable (exit 69). Authentication failures are not retried."""
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
        raise Unavailable(f"cannot connect to Postgres: {detail}", msgid="db.unavailable") from None


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
    """DESIGN rule 2: no database transaction may be open across a network call."""
    from psycopg.pq import TransactionStatus

    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise TransactionOpenAcrossNetworkCall(
            f"refusing {what}: the caller's database connection is inside a transaction"
        )


class TransactionOpenAcrossNetworkCall(PaygateError):
    """A bug: code tried a network call with a transaction open (DESIGN rule 2)."""

    exit_code = ExitCode.SOFTWARE
    msgid = "bug.transaction_open_across_network_call"
