"""`paygate reconcile-report`: drift by regime, unresolved lineages, quarantined events, stuck rows,
lane gaps, findings. Exit 3 on any unexplained drift."""

from __future__ import annotations

import csv
import io
import os
import tempfile
from typing import Annotated, Any

import typer

from paygate_cli.commands._common import DATABASE_SECRETS, get_env, open_db, parse_since
from paygate_cli.commands.completion import complete_report_formats
from paygate_cli.errors import ConfigError, ExitCode, UsageError
from paygate_cli.output import Mode, amount, cell_text, duration, emit, human_text, progress, to_json, tsv_field
from paygate_cli.settings import parse_duration

FORMATS = ("table", "json", "csv", "markdown")
# Section -> columns shown by the tabular formats (json carries every field).
SECTIONS: dict[str, list[str]] = {
    "totals": ["regime", "accounts", "drift", "in_flight", "lagging", "newest_check"],
    "drift": ["address", "regime", "chain_balance", "cached_balance", "drift", "in_flight", "lagging", "unexplained",
              "checked_at"],
    "unresolved_lineages": ["id", "purpose", "entitlement", "lane", "state", "send_count", "age_s"],
    "quarantined_events": ["event_id", "ledger", "kind", "quarantine_reason", "observed_at"],
    "stuck": ["queue", "count", "oldest"],
    "findings": ["id", "kind", "subject", "summary", "first_seen", "seen_count", "resolved_at"],
    # Ledger entries the TTL keeper keeps alive that are archived or need a human (their key in --json).
    "ttl_entries": ["kind", "account", "state", "live_until", "read_ledger", "reason"],
}
# Columns holding USDC units (the token's 7-decimal units): a person also reads them in USDC.
USDC_COLUMNS = frozenset({"chain_balance", "cached_balance", "drift", "in_flight", "lagging", "unexplained"})


def _shown(section: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as a person reads them: amounts also in USDC, ages as `12m`."""
    shown = []
    for row in rows:
        row = dict(row)
        for column in USDC_COLUMNS & row.keys():
            row[column] = amount(row[column], "USDC")
        if "age_s" in row:
            row["age_s"] = duration(row["age_s"])
        shown.append(row)
    return shown


def _csv(document: dict[str, Any]) -> str:
    """One CSV: a `section` column, then the union of the sections' columns."""
    columns = ["section", *sorted({c for cols in SECTIONS.values() for c in cols})]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for section in SECTIONS:
        for row in document[section]:
            writer.writerow([section] + [cell_text(row.get(c)) for c in columns[1:]])
    return buffer.getvalue()


def _plain(document: dict[str, Any]) -> str:
    """--plain: the csv's columns as tab-separated lines (raw numbers) for grep/awk/cut."""
    columns = ["section", *sorted({c for cols in SECTIONS.values() for c in cols})]
    lines = ["\t".join(columns)]
    for section in SECTIONS:
        for row in document[section]:
            lines.append("\t".join([section] + [tsv_field(cell_text(row.get(c))) for c in columns[1:]]))
    return "\n".join(lines) + "\n"


def _markdown(document: dict[str, Any], headline: str) -> str:
    from tabulate import tabulate

    parts = [f"## Reconcile report\n\n{headline}\n"]
    for section, columns in SECTIONS.items():
        rows = [[human_text(row.get(c)) for c in columns] for row in _shown(section, document[section])]
        parts.append(f"### {section.replace('_', ' ')}\n")
        parts.append(tabulate(rows, headers=columns, tablefmt="github") + "\n" if rows else "_none_\n")
    return "\n".join(parts)


def _text_tables(document: dict[str, Any], headline: str) -> str:
    from tabulate import tabulate

    parts = [headline]
    for section, columns in SECTIONS.items():
        rows = [[human_text(row.get(c)) for c in columns] for row in _shown(section, document[section])]
        parts.append(f"\n{section.replace('_', ' ')}:")
        parts.append(tabulate(rows, headers=columns, tablefmt="simple") if rows else "  none")
    return "\n".join(parts) + "\n"


def _write_atomically(path: str, text: str, *, force: bool = False) -> None:
    if not force and os.path.lexists(path):  # a report never silently replaces someone's file
        raise UsageError(f"--out {path[:200]}: the file exists; pass --force to replace it",
                         msgid="usage.out_exists")
    try:
        _replace_file(path, text)
    except OSError as exc:  # an unwritable --out (a directory, /proc, a missing parent) is the caller's to fix
        raise UsageError(f"--out {path[:200]}: cannot write the report: {exc.strerror or type(exc).__name__}",
                         msgid="usage.out_unwritable") from None


def _replace_file(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".reconcile-report.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def reconcile_report_command(
    ctx: typer.Context,
    since: Annotated[str | None, typer.Option("--since", help="Only checks/events since (1h, or ISO time).",
                                              show_default=False)] = None,
    account: Annotated[str | None, typer.Option("--account", help="One account (G…).", show_default=False)] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | json | csv | markdown (for an incident ticket).",
                                     autocompletion=complete_report_formats)]
    = "table",
    out: Annotated[str | None, typer.Option("--out", help="Write the report to FILE instead of stdout ('-' is "
                                                         "stdout); an existing FILE needs --force.",
                                            show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Let --out replace an existing file.")] = False,
    older_than: Annotated[str, typer.Option("--older-than", help="Lineages/rows waiting longer are listed.")]
    = "10min",
    json_flag: Annotated[bool, typer.Option("--json", help="Same as --format json.")] = False,
    plain_flag: Annotated[bool, typer.Option("--plain", help="Tab-separated lines (the csv's columns, raw numbers) "
                                                             "for grep/awk.")] = False,
) -> int:
    """Totals and per-account drift by regime, unresolved lineages, quarantined events, stuck rows,
    lane gaps, open findings, archived ledger entries. Exit 3 on any unexplained drift (or lane gap,
    or a kept ledger entry that needs a human), 1 when an account was never checked by the
    reconciler or a kept entry is archived, 0 otherwise (also for a database with no accounts).

    Example: `paygate reconcile-report --since 24h --format markdown --out drift.md`"""
    from paygate_cli.ops.reconcile import report

    env = get_env(ctx)
    env.use_only_secrets(*DATABASE_SECRETS)
    if json_flag and plain_flag:
        raise UsageError("--json and --plain are mutually exclusive")
    fmt = "json" if json_flag else "plain" if plain_flag else fmt.lower()
    if fmt not in (*FORMATS, "plain"):
        raise UsageError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if out == "-":  # the usual spelling of "stdout"
        out = None
    try:
        older = parse_duration(older_than, name="--older-than")
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    # One read-only snapshot of aggregate statements (no per-account loop to count): a spinner with
    # its elapsed time for a person at a terminal, nothing for the machine formats or off a terminal.
    with open_db(env, "reconcile-report") as conn, progress(env, "reconcile-report: reading one snapshot",
                                                            show=fmt in ("table", "markdown")) as reading:
        reading(0, None, None)
        document = report(conn, since=parse_since(since), account=account, older_than=older)
    # A lane gap is a nonce gap (the exit-code contract's other "needs a human" of this report). An
    # account the reconciler never checked is not known to be right: 1 (not verified yet), never 0.
    never = document["accounts_never_checked"]
    # An archived entry the keeper keeps alive holds money no transaction moves until it is
    # restored (1: not verified yet); one a restore could not bring back needs a human (3).
    archived = len(document["ttl_entries"]) - document["ttl_needs_human"]
    if document["unexplained"] or document["lane_gaps"] or document["ttl_needs_human"]:
        code = ExitCode.NEEDS_HUMAN
    else:
        code = ExitCode.FAILED if never or archived else ExitCode.OK
    if document["unexplained"]:
        headline = f"UNEXPLAINED DRIFT: {document['unexplained']} item(s) need a human"
        headline += f"; {never} account(s) never checked" if never else ""
    elif never:
        headline = (f"NEVER CHECKED: {never} of {document['accounts']} account(s) never compared with the chain "
                    "(is the reconciler running?)")
    elif not document["accounts"]:
        headline = "nothing to reconcile: no accounts"
    else:
        headline = "no unexplained drift"
    if document["lane_gaps"]:
        headline += f"; LANE GAPS: {len(document['lane_gaps'])} lane(s) used outside the journal"
    if document["ttl_entries"]:
        if headline == "no unexplained drift":
            headline = "no unexplained drift in the balances checked"  # never "no drift" over archived entries
        parts = [f"{n} {what}" for n, what in ((document["ttl_needs_human"], "need a human"),
                                              (archived, "archived, a restore due")) if n]
        headline += f"; LEDGER ENTRIES paygate keeps alive: {', '.join(parts)} (runbooks/contract-ttl.md)"
    if fmt == "json":
        text = to_json({"reconcile_report": document}) + "\n"
    elif fmt == "csv":
        text = _csv(document)
    elif fmt == "plain":
        text = _plain(document)
    elif fmt == "markdown":
        text = _markdown(document, headline)
    elif out:
        text = _text_tables(document, headline)
    else:
        lines = [headline]
        emit(env, Mode.HUMAN, {}, rows=_shown("totals", document["totals"]), columns=SECTIONS["totals"],
             lines=lines, title="accounts by regime")
        for section in list(SECTIONS)[1:]:
            if document[section]:
                emit(env, Mode.HUMAN, {}, rows=_shown(section, document[section]), columns=SECTIONS[section],
                     title=section.replace("_", " "))
        return code
    if out:
        _write_atomically(out, text, force=force)
        env.stderr.write(f"reconcile report written to {out} ({headline})\n")
    else:
        env.stdout.write(text)
        env.stdout.flush()
    return code


def register(app: typer.Typer) -> None:
    app.command("reconcile-report")(reconcile_report_command)
