"""Database roles in the tests: a DSN that connects as a given role."""

from __future__ import annotations

from psycopg.conninfo import make_conninfo


def as_role(dsn: str, role: str) -> str:
    """The DSN connecting as `role` (SET ROLE through the startup options: privileges are checked
    against it exactly as for a login as that role)."""
    return make_conninfo(dsn, options=f"-c role={role}")
