from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.support.pg import PgServer


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    server = PgServer()
    yield server
    server.close()


@pytest.fixture
def dsn(pg_server: PgServer) -> Iterator[str]:
    """A fresh, migrated database for this test."""
    database = pg_server.create_database()
    yield database
    pg_server.drop_database(database)


@pytest.fixture
def empty_dsn(pg_server: PgServer) -> Iterator[str]:
    """A fresh database with no schema at all."""
    database = pg_server.create_database(migrated=False)
    yield database
    pg_server.drop_database(database)


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn
