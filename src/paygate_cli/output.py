"""Render a command's result as human (rich) / --json / --plain (TSV).

Every --json document carries `schema_version`. Human output goes to stdout through rich; logs
never go to stdout."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from enum import Enum, StrEnum
from typing import Any

from paygate_cli.env import Env

SCHEMA_VERSION = 1
_UNBOUNDED_WIDTH = 100_000


class Mode(StrEnum):
    HUMAN = "human"
    JSON = "json"
    PLAIN = "plain"


def mode_from_flags(json_flag: bool, plain_flag: bool = False) -> Mode:
    return Mode.JSON if json_flag else Mode.PLAIN if plain_flag else Mode.HUMAN


def _default(value: Any) -> Any:
    if isinstance(value, Shown):
        return value.raw
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Enum):
        return value.value
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def to_json(document: dict[str, Any]) -> str:
    return json.dumps({"schema_version": SCHEMA_VERSION, **document}, default=_default, sort_keys=False)


# -- what a person reads: money, ages and durations -------------------------------------------------
#
# Amounts are stored as integer units of the asset's smallest unit (numeric(39,0)): USDC through its
# Stellar Asset Contract and XLM fees both have 7 decimals (1 USDC = 10_000_000 units, 1 XLM =
# 10_000_000 stroops). Human output shows the raw units *and* the asset amount; --json, --plain and
# csv keep the raw number (a `Shown` cell carries both).
ASSET_DECIMALS = {"USDC": 7, "XLM": 7}


class Shown:
    """A cell with a raw value (for --json/--plain/csv) and the text a person reads."""

    __slots__ = ("raw", "text")

    def __init__(self, raw: Any, text: str) -> None:
        self.raw, self.text = raw, text

    def __str__(self) -> str:  # f-strings in human sentences read the person's form
        return self.text

    def __repr__(self) -> str:
        return f"Shown({self.raw!r}, {self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shown) and (self.raw, self.text) == (other.raw, other.text)

    def __hash__(self) -> int:
        return hash((self.raw, self.text))


def asset_amount(units: Any, asset: str) -> str:
    """`-630000` USDC units -> `-0.063 USDC`; exact (Decimal), trailing zeros dropped."""
    decimals = ASSET_DECIMALS[asset]
    value = Decimal(str(units)).scaleb(-decimals)
    text = f"{value:,.{decimals}f}".rstrip("0").rstrip(".")
    return f"{'0' if text in ('-0', '') else text} {asset}"


def amount(units: Any, asset: str) -> Shown | None:
    """A money cell: `-630000 (-0.063 USDC)` for a person, the raw units for scripts."""
    if units is None:
        return None
    try:
        return Shown(units, f"{units} ({asset_amount(units, asset)})")
    except (ArithmeticError, ValueError):  # not a number (never expected): shown as it is
        return Shown(units, str(units))


def duration_text(seconds: float | None) -> str:
    """`7d`, `2h30m`, `5m3s`, `45s`, `1.5s`, `250ms`: at most two units, never `604800.0`."""
    if seconds is None:
        return "-"
    seconds = max(0.0, float(seconds))
    if seconds < 1:
        return f"{round(seconds * 1000)}ms" if seconds else "0s"
    if seconds < 10 and not float(seconds).is_integer():
        return f"{seconds:.1f}".rstrip("0").rstrip(".") + "s"
    whole = round(seconds)
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, whole = divmod(whole, size)
        if count or (parts and len(parts) < 2 and whole):
            parts.append(f"{count}{unit}")
        if len(parts) == 2 or (parts and not whole):
            break
    return "".join(parts) or "0s"


def duration(seconds: float | None) -> Shown | None:
    return None if seconds is None else Shown(seconds, duration_text(seconds))


def ago_text(seconds: float | None) -> str:
    """`12m ago` (or `never`): how long since something happened."""
    return "never" if seconds is None else f"{duration_text(seconds)} ago"


def ago(seconds: float | None) -> Shown:
    return Shown(seconds, ago_text(seconds))


def human_text(value: Any) -> str:
    """A cell as a person reads it: a `Shown`'s text; no Python `None`."""
    if isinstance(value, Shown):
        return value.text
    if isinstance(value, list | tuple):
        return ",".join(human_text(v) for v in value)
    return cell_text(value)


def cell_text(value: Any) -> str:
    if isinstance(value, Shown):
        value = value.raw
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list | tuple):
        return ",".join(cell_text(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, default=_default)
    return str(value)


def tsv_field(text: str) -> str:
    return text.replace("\t", " ").replace("\n", " ")


class ClosedPipeSafe:
    """stdout for the real process: when its reader leaves (`paygate reconcile-report | head -1`),
    the rest of the output goes to /dev/null and the command runs on to its own verdict. A closed
    pipe may end the output; it never changes the exit code (3 stays 3, also under pipefail)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.reader_gone = False

    def _gone(self) -> None:
        import contextlib

        self.reader_gone = True
        with contextlib.suppress(OSError, ValueError):  # the interpreter's final flush must not fail either
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()
            import contextlib

            with contextlib.suppress(OSError, ValueError):  # BrokenPipeError is an OSError
                self._stream.flush()  # what was buffered now drains into /dev/null

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, … as the real stream has them
        return getattr(self._stream, name)


def _reader_gone() -> None:
    """The reader of stdout left (`| head -1`): let `__main__` end the run quietly with 0."""
    raise BrokenPipeError


def emit(
    env: Env,
    mode: Mode,
    document: dict[str, Any],
    *,
    rows: Sequence[dict[str, Any]] | None = None,
    columns: Sequence[str] | None = None,
    title: str | None = None,
    lines: Sequence[str] = (),
) -> None:
    """Print one result. `document` is the --json form; `rows`/`columns` the table for the others;
    `lines` are extra human-only sentences (a summary above the table)."""
    if mode is Mode.JSON:
        env.stdout.write(to_json(document) + "\n")
        env.stdout.flush()
        return
    if rows is not None and columns is None:
        columns = list(rows[0].keys()) if rows else []
    if mode is Mode.PLAIN:
        # Plain TSV written directly: tabulate's "tsv" pads cells to align them, which breaks `cut -f`.
        if rows is not None:
            env.stdout.write("\t".join(columns or []) + "\n")
            for row in rows:
                env.stdout.write("\t".join(tsv_field(cell_text(row.get(c))) for c in columns or []) + "\n")
        else:
            for key, value in document.items():
                env.stdout.write(f"{key}\t{tsv_field(cell_text(value))}\n")
        env.stdout.flush()
        return

    if rows is not None and not rows:  # an empty boxed table reads as "something is cut"
        lines = [*lines, f"{title}: no rows" if title else "no rows"]
        rows = None
    if rows is None and lines:  # plain sentences need no rich (and its ~70 ms import on every cron run)
        for line in lines:
            env.stdout.write(line + "\n")
        env.stdout.flush()
        return

    wide = env.wide
    if (not env.stdout_isatty or wide) and _render_box_table(env, rows, columns, title, lines):
        return

    from rich.console import Console
    from rich.table import Table

    no_color = bool(env.environ.get("NO_COLOR") or env.environ.get("PAYGATE_NO_COLOR"))
    # Off a terminal (or under --wide) there is no width to fit: rich's default of 80 columns would
    # cut and wrap cells so `paygate workers | grep settlement` finds nothing. Tables never pad.
    width = _terminal_width(env) if env.stdout_isatty and not wide else _UNBOUNDED_WIDTH
    console = Console(file=env.stdout, no_color=no_color, highlight=False, soft_wrap=False, width=width)
    console.on_broken_pipe = _reader_gone  # type: ignore[method-assign]  # rich would exit 1 on its own
    for line in lines:
        console.print(line, markup=False, soft_wrap=True)
    if rows is not None:
        table = Table(title=title, show_lines=False)
        for column in columns or []:
            # Never an ellipsis: `-630000…` is another amount. A cell too long for its column folds.
            table.add_column(column, overflow="fold")
        cells = [[human_text(row.get(c)) for c in columns or []] for row in rows]
        for row_cells in cells:
            table.add_row(*row_cells)
        if env.stdout_isatty and not wide and _narrowest_width(console, table) > console.width:
            _print_records(console, title, list(columns or []), cells)  # one record per block
        else:
            console.print(table)
    elif not lines:
        for key, value in document.items():
            console.print(f"{key}: {human_text(value)}", markup=False)


# update(done, total, detail): `done` of `total` steps (total None: a spinner), `detail` beside the label.
ProgressUpdate = Callable[[int, "int | None", "str | None"], None]


def _no_progress(done: int, total: int | None = None, detail: str | None = None) -> None:
    return None


@contextlib.contextmanager
def progress(env: Env, label: str, *, show: bool = True) -> Iterator[ProgressUpdate]:
    """A progress line on stderr for a person at a terminal (rich, transient: gone when the work
    is); off a terminal, or `show=False` (--json, --plain), nothing at all, so a script's or a log's
    stderr carries no progress noise. Drawn from the first update on, so never over a prompt asked
    before the work starts."""
    if not show or not env.stderr_isatty:
        yield _no_progress
        return
    with contextlib.ExitStack() as stack:
        drawn: list[tuple[Any, Any]] = []

        def update(done: int, total: int | None = None, detail: str | None = None) -> None:
            description = f"{label}: {detail}" if detail else label
            if not drawn:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    SpinnerColumn,
                    TextColumn,
                    TimeElapsedColumn,
                )

                no_color = bool(env.environ.get("NO_COLOR") or env.environ.get("PAYGATE_NO_COLOR"))
                counted = [BarColumn(), MofNCompleteColumn()] if total is not None else []  # else a spinner
                bar = stack.enter_context(Progress(
                    SpinnerColumn(), TextColumn("{task.description}"), *counted, TimeElapsedColumn(),
                    console=Console(file=env.stderr, no_color=no_color), transient=True))
                # the task is added with this update's state: adding it draws a frame, and a quick
                # first step (a migration file) would otherwise never be shown before the next one
                drawn.append((bar, bar.add_task(description, total=total, completed=done)))
            bar, task = drawn[0]
            bar.update(task, completed=done, total=total, description=description)

        yield update


def _narrowest_width(console: Any, table: Any) -> int:
    """The narrowest the table can be with every word whole (its longest word per column): wider
    than the terminal, an address or an amount would be split, so it is shown as records instead."""
    from rich.measure import Measurement

    return Measurement.get(console, console.options.update_width(_UNBOUNDED_WIDTH), table).minimum


def _terminal_width(env: Env) -> int | None:
    """The terminal's width: $COLUMNS of the command's environment, else rich asks the terminal."""
    text = env.environ.get("COLUMNS", "")
    return int(text) if text.isdigit() and int(text) > 0 else None


def _print_records(console: Any, title: str | None, columns: list[str], cells: list[list[str]]) -> None:
    """A table that cannot fit the terminal without splitting a word, as `column  value` blocks (a
    value longer than the line still folds onto the next one); `--wide` draws the table instead."""
    from rich.table import Table

    if title:
        console.print(title, markup=False)
    for index, row_cells in enumerate(cells, start=1):
        console.print(f"-- {index} of {len(cells)} --", markup=False)
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True)
        grid.add_column(overflow="fold")
        for column, text in zip(columns, row_cells, strict=True):
            grid.add_row(column, text)
        console.print(grid)


# -- rich's table, without rich, off a terminal ------------------------------------------------------
#
# Off a terminal rich has no width to fit and no colour to add: a table is its HEAVY_HEAD box at the
# cells' natural widths. Importing rich and laying the table out costs ~35 ms of CPU, most of a cold
# `paygate status | grep` beyond the Python + psycopg floor, so plain printable-ASCII text is drawn
# here, byte for byte as rich draws it (tests/commands/test_output_tables.py compares the two). Anything rich
# would interpret or measure differently (markup brackets, backslashes, :emoji: codes, tabs,
# non-ASCII widths, a title, forced colour) still goes through rich.
_PLAIN_ASCII = re.compile(r"[\x20-\x7e]*")
_EMOJI_CODE = re.compile(r":(\S*?)(?:-(?:emoji|text))?:")
_RICH_OVERRIDES = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")


def _rich_would_render_as_is(text: str) -> bool:
    if not _PLAIN_ASCII.fullmatch(text) or "[" in text or "\\" in text:
        return False
    if ":" in text and _EMOJI_CODE.search(text):
        from rich._emoji_codes import EMOJI  # only when something looks like a code (e.g. a time 22:00:01)

        return not any(m.group(1).lower() in EMOJI for m in _EMOJI_CODE.finditer(text))
    return True


def _forced_terminal(environ: Mapping[str, str]) -> bool:
    return any(environ.get(name) for name in _RICH_OVERRIDES)


def _render_box_table(env: Env, rows: Sequence[dict[str, Any]] | None, columns: Sequence[str] | None,
                      title: str | None, lines: Sequence[str]) -> bool:
    """Write `lines` and the table as rich would off a terminal; False (nothing written) when only
    rich can draw it exactly."""
    if rows is None or title is not None or not columns or _forced_terminal(env.environ) \
            or _forced_terminal(os.environ):
        return False
    header = [str(c) for c in columns]
    body = [[human_text(row.get(c)) for c in columns] for row in rows]
    if not all(_rich_would_render_as_is(text) for text in (*lines, *header, *(t for r in body for t in r))):
        return False
    widths = [max([len(header[i]), *(len(r[i]) for r in body)]) + 2 for i in range(len(header))]
    if sum(widths) + len(widths) + 1 > _UNBOUNDED_WIDTH:  # rich would wrap at its width
        return False

    def bar(left: str, fill: str, cross: str, right: str) -> str:
        return left + cross.join(fill * w for w in widths) + right + "\n"

    def line(edge: str, cells: list[str]) -> str:
        return edge + edge.join(f" {text.ljust(w - 2)} " for text, w in zip(cells, widths, strict=True)) + edge + "\n"

    out = [text + "\n" for text in lines]
    out += [bar("┏", "━", "┳", "┓"), line("┃", header), bar("┡", "━", "╇", "┩")]
    out += [line("│", r) for r in body]
    out.append(bar("└", "─", "┴", "┘"))
    env.stdout.write("".join(out))
    env.stdout.flush()
    return True
