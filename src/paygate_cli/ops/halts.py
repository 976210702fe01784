"""The operator's own halt (admission pause), separate from the gas monitor's halt. Reading every
halt is the read model's (state.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from paygate_cli.errors import UsageError
from paygate_cli.ops.audit import record
from paygate_cli.state import list_halts

if TYPE_CHECKING:
    import psycopg

# A second halt never silently replaces the first: the insert takes an empty slot only; an
# existing halt is read under a row lock and replaced only when the operator asked to (--replace).
INSERT_HALT_SQL = """
INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('operator', %s, %s)
ON CONFLICT (kind) DO NOTHING
RETURNING kind, reason, set_by, set_at
"""
LOCK_HALT_SQL = "SELECT reason, set_by, set_at FROM paygate.halts WHERE kind = 'operator' FOR UPDATE"
REPLACE_HALT_SQL = """
UPDATE paygate.halts SET reason = %s, set_by = %s, set_at = now() WHERE kind = 'operator'
RETURNING kind, reason, set_by, set_at
"""
CURRENT_HALT_SQL = "SELECT reason, set_by, set_at FROM paygate.halts WHERE kind = 'operator'"
CLEAR_HALT_SQL = "DELETE FROM paygate.halts WHERE kind = 'operator' RETURNING reason, set_by, set_at"


def operator_halt(conn: psycopg.Connection) -> dict[str, Any] | None:
    """The operator halt in place (who, when, why), or None."""
    row = conn.execute(CURRENT_HALT_SQL).fetchone()
    return None if row is None else {"reason": row[0], "set_by": row[1], "set_at": row[2]}


def describe_halt(current: dict[str, Any]) -> str:
    set_at = current["set_at"]
    when = set_at.isoformat(timespec="seconds") if hasattr(set_at, "isoformat") else str(set_at)
    return f"halted by {current['set_by']} at {when} ({current['reason']!r})"


def refuse_second_halt(current: dict[str, Any] | None, *, replace: bool) -> None:
    if current is not None and not replace:
        raise UsageError(f"already {describe_halt(current)}; pass --replace to replace it",
                         msgid="usage.already_halted")


def halt(conn: psycopg.Connection, *, reason: str, actor: str, dry_run: bool,
         replace: bool = False) -> dict[str, Any]:
    if not reason.strip():
        raise UsageError("--reason must say why (it is shown to everyone who looks)")
    if dry_run:
        current = operator_halt(conn)
        return {"would_halt": current is None or replace, "would_replace": current is not None and replace,
                "reason": reason, "current_operator_halt": current, "current": list_halts(conn)}
    with conn.transaction():
        row = conn.execute(INSERT_HALT_SQL, (reason, actor)).fetchone()
        replaced = None
        if row is None:
            locked = conn.execute(LOCK_HALT_SQL).fetchone()
            replaced = {"reason": locked[0], "set_by": locked[1], "set_at": locked[2]}
            refuse_second_halt(replaced, replace=replace)  # rolls the transaction back
            row = conn.execute(REPLACE_HALT_SQL, (reason, actor)).fetchone()
            record(conn, actor, "halt_replace", "operator",
                   {"reason": reason, "old_reason": replaced["reason"], "old_set_by": replaced["set_by"],
                    "old_set_at": replaced["set_at"].isoformat()})
        else:
            record(conn, actor, "halt", "operator", {"reason": reason})
    return {"halted": True, "kind": row[0], "reason": row[1], "set_by": row[2], "set_at": row[3],
            "replaced": replaced}


def resume(conn: psycopg.Connection, *, actor: str, dry_run: bool) -> dict[str, Any]:
    """Clears only the operator halt; the gas halt belongs to the gas monitor (its hysteresis), the
    restore halt to a clean recovery pass (journal/restore_gate.py)."""
    if dry_run:
        current = [h for h in list_halts(conn) if h["kind"] == "operator"]
        return {"would_resume": bool(current), "current": current}
    with conn.transaction():
        row = conn.execute(CLEAR_HALT_SQL).fetchone()
        if row is not None:
            record(conn, actor, "resume", "operator", {"cleared_reason": row[0], "was_set_by": row[1]})
    remaining = list_halts(conn)
    return {"resumed": row is not None, "was_halted": row is not None, "remaining_halts": remaining}
