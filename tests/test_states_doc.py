"""docs/states.md draws every status a queue table can hold: for each table, the statuses listed in
its diagram and the states its arrows reach both equal the table's CHECK constraint in a freshly
migrated database."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
STATES_DOC = (ROOT / "docs" / "states.md").read_text(encoding="utf-8")

# The queue tables the document must draw (docs/states.md), each with its status column.
QUEUE_TABLES = {
    "deposits": "status", "charges": "status", "charge_batches": "outcome", "subscriptions": "status",
    "relays": "status", "bot_jobs": "status", "webhook_outbox": "status", "lineages": "state",
    "fee_reservations": "status", "lanes": "status", "ttl_jobs": "status", "ttl_entries": "state",
}

_DIAGRAM = re.compile(r"```mermaid\n(stateDiagram-v2\n.*?)```", re.DOTALL)
_LISTED = re.compile(r"^\s*%% paygate\.(\w+)\.(\w+): (.+)$", re.MULTILINE)
_ARROW = re.compile(r"^\s*(\S+)\s+-->\s+(\S+?)(?:\s*:.*)?$", re.MULTILINE)
# The one constraint that is just the column's list: CHECK ((status = ANY (ARRAY['a'::text, ...])))
_CHECK = re.compile(r"^CHECK \(\((\w+) = ANY \(ARRAY\[(.*)\]\)\)\)$")


def _diagrams() -> dict[str, tuple[str, set[str], set[str]]]:
    """table -> (column, statuses listed, states the arrows touch)."""
    found: dict[str, tuple[str, set[str], set[str]]] = {}
    for body in _DIAGRAM.findall(STATES_DOC):
        listed = _LISTED.search(body)
        assert listed, f"a diagram without its `%% paygate.<table>.<column>: ...` line:\n{body}"
        table, column, names = listed.groups()
        assert table not in found, f"{table} drawn twice"
        drawn = {end for arrow in _ARROW.findall(body) for end in arrow} - {"[*]"}
        found[table] = (column, {name.strip() for name in names.split(",")}, drawn)
    return found


def _check_lists(db: psycopg.Connection) -> dict[tuple[str, str], set[str]]:
    """(table, column) -> the values its CHECK (column IN (...)) constraint allows."""
    rows = db.execute(
        """SELECT c.conrelid::regclass::text, pg_get_constraintdef(c.oid)
           FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
           WHERE c.contype = 'c' AND n.nspname = 'paygate'""").fetchall()
    lists: dict[tuple[str, str], set[str]] = {}
    for relation, definition in rows:
        match = _CHECK.match(definition)
        if match:
            table = relation.removeprefix("paygate.")
            values = set(re.findall(r"'([^']*)'::text", match.group(2)))
            assert (table, match.group(1)) not in lists, (table, match.group(1))
            lists[(table, match.group(1))] = values
    return lists


def test_the_states_doc_draws_every_queue_table() -> None:
    diagrams = _diagrams()
    assert set(diagrams) == set(QUEUE_TABLES)
    for table, (column, _, _) in diagrams.items():
        assert column == QUEUE_TABLES[table], table


def test_each_diagram_holds_exactly_the_statuses_of_its_check_constraint(db: psycopg.Connection) -> None:
    allowed = _check_lists(db)
    for table, (column, listed, drawn) in _diagrams().items():
        assert (table, column) in allowed, f"no CHECK ({column} IN (...)) on paygate.{table}"
        assert listed == allowed[(table, column)], (table, listed ^ allowed[(table, column)])
        assert drawn == listed, (table, drawn ^ listed)
