"""Off a terminal, output.emit draws simple tables itself (rich's import and layout are most of a
cold operator command's cost): the text must be exactly what rich draws, and anything rich would
interpret (markup, :emoji: codes, wide characters, a title) must still go through rich."""

from __future__ import annotations

import io
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from paygate_cli import output
from paygate_cli.env import Env
from paygate_cli.output import Mode, emit

ASCII = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30)
ANY_TEXT = st.text(max_size=20)


def _env() -> tuple[Env, io.StringIO]:
    out = io.StringIO()  # not a TTY
    return Env(stdout=out, stderr=io.StringIO(), environ={}), out


def _rich(rows: list[dict[str, Any]], columns: list[str], lines: list[str], title: str | None = None) -> str:
    """What emit printed before the fast path: rich, at an unbounded width, no colour."""
    from rich.console import Console
    from rich.table import Table

    out = io.StringIO()
    console = Console(file=out, no_color=False, highlight=False, soft_wrap=False, width=output._UNBOUNDED_WIDTH)
    for line in lines:
        console.print(line, markup=False, soft_wrap=True)
    table = Table(title=title, show_lines=False)
    for column in columns:
        table.add_column(column, overflow="fold")  # as output.emit asks rich: never an ellipsis
    for row in rows:
        table.add_row(*[output.cell_text(row.get(c)) for c in columns])
    console.print(table)
    return out.getvalue()


def _emit(rows: list[dict[str, Any]], columns: list[str], lines: list[str], title: str | None = None) -> str:
    env, out = _env()
    emit(env, Mode.HUMAN, {}, rows=rows, columns=columns, lines=lines, title=title)
    return out.getvalue()


@settings(max_examples=150, deadline=None)
@given(columns=st.lists(ASCII.filter(bool), min_size=1, max_size=5, unique=True),
       cells=st.lists(st.lists(st.one_of(ASCII, st.none(), st.integers(), st.booleans()), min_size=5, max_size=5),
                      min_size=1, max_size=6),  # no rows: test_operator_output.py
       lines=st.lists(ASCII, max_size=2))
def test_plain_tables_are_drawn_exactly_as_rich_draws_them(columns: list[str], cells: list[list[Any]],
                                                           lines: list[str]) -> None:
    rows = [dict(zip(columns, values, strict=False)) for values in cells]
    assert _emit(rows, columns, lines) == _rich(rows, columns, lines)


@settings(max_examples=100, deadline=None)
@given(columns=st.lists(ANY_TEXT.filter(bool), min_size=1, max_size=3, unique=True),
       cells=st.lists(st.lists(ANY_TEXT, min_size=3, max_size=3), min_size=1, max_size=4))
def test_any_text_still_matches_rich(columns: list[str], cells: list[list[str]]) -> None:
    rows = [dict(zip(columns, values, strict=False)) for values in cells]
    assert _emit(rows, columns, []) == _rich(rows, columns, [])


def test_the_fast_path_really_draws_the_common_case_and_defers_the_rest() -> None:
    env, out = _env()
    rows = [{"check": "queue:deposits.pending", "value": 0, "detail": "last success 2026-11-30T22:00:01+00:00"}]
    assert output._render_box_table(env, rows, ["check", "value", "detail"], None, ["READY"])
    assert out.getvalue().startswith("READY\n┏") and "│ queue:deposits.pending │" in out.getvalue()
    for awkward in ("[bold]x[/bold]", "a :smile: b", "wide 字", "tab\there", "back\\slash"):
        env, out = _env()
        assert not output._render_box_table(env, [{"c": awkward}], ["c"], None, [])
        assert out.getvalue() == ""
    env, _ = _env()
    assert not output._render_box_table(env, rows, ["check"], "a title", [])
    env = Env(stdout=io.StringIO(), stderr=io.StringIO(), environ={"FORCE_COLOR": "1"})
    assert not output._render_box_table(env, rows, ["check"], None, [])


def test_titles_and_markup_still_render_through_rich() -> None:
    rows = [{"a": "[bold]x[/bold]", "b": ":smile:"}]
    assert _emit(rows, ["a", "b"], [], title="t") == _rich(rows, ["a", "b"], [], title="t")
