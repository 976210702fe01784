"""The operator's own halt (admission pause), separate from the gas monitor's halt."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paygate_cli.errors import UsageError
from paygate_cli.ops.audit import record

if TYPE_CHECKING:
    import psycopg

SET_HALT_SQL = """
INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('operator', %s, %s)
ON CONFLICT (kind) DO UPDATE SET reason = EXCLUDED.reason, set_by = EXCLUDED.set_by, set_at = now()
RETURNING kind, reason, set_by, set_at
"""
CLEAR_HALT_SQL = "DELETE FROM paygate.halts WHERE kind = 'operator' RETURNING reason, set_by, set_at"
LIST_HALTS_SQL = "SELECT kind, reason, set_by, set_at FROM paygate.halts ORDER BY kind"


def list_halts(conn: psycopg.Connection) -> list[dict[str, Any]]:
    cursor = conn.execute(LIST_HALTS_SQL)
    return [dict(zip(("kind", "reason", "set_by", "set_at"), row, strict=True)) for row in cursor]


def halt(conn: psycopg.Connection, *, reason: str, actor: str, dry_run: bool) -> dict[str, Any]:
    if not reason.strip():
        raise UsageError("--reason must say why (it is shown to everyone who looks)")
    if dry_run:
        return {"would_halt": True, "reason": reason, "current": list_halts(conn)}
    with conn.transaction():
        row = conn.execute(SET_HALT_SQL, (reason, actor)).fetchone()
        record(conn, actor, "halt", "operator", {"reason": reason})
    return {"halted": True, "kind": row[0], "reason": row[1], "set_by": row[2], "set_at": row[3]}


def resume(conn: psycopg.Connection, *, actor: str, dry_run: bool) -> dict[str, Any]:
    """Clears only the operator halt; the gas halt belongs to the gas monitor (its hysteresis)."""
    if dry_run:
        current = [h for h in list_halts(conn) if h["kind"] == "operator"]
        return {"would_resume": bool(current), "current": current}
    with conn.transaction():
        row = conn.execute(CLEAR_HALT_SQL).fetchone()
        if row is not None:
            record(conn, actor, "resume", "operator", {"cleared_reason": row[0], "was_set_by": row[1]})
    remaining = list_halts(conn)
    return {"resumed": row is not None, "was_halted": row is not None, "remaining_halts": remaining}
