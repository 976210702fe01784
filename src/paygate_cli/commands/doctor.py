"""`paygate doctor`: a preflight of everything a tick will need, grouped, with the evidence and the fix."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from paygate_cli.commands._common import JsonFlag, PlainFlag, get_env, open_db, output_mode
from paygate_cli.errors import ExitCode
from paygate_cli.output import Mode, emit

_MARK = {"ok": "ok", "warn": "WARN", "fail": "FAIL"}
_EXIT_MEANING = {0: "every check passed", 1: "warnings only", 3: "a state needs a human",
                 69: "a dependency did not answer", 78: "configuration"}


def doctor_command(
    ctx: typer.Context,
    only: Annotated[str | None, typer.Option(
        "--only", metavar="GROUPS", help="Comma-separated groups: config, schema, rpc, lanes, fee_account, journal, "
                                         "ttl, clock, db, metrics (default: all).", show_default=False)] = None,
    json_flag: JsonFlag = False, plain_flag: PlainFlag = False,
) -> int:
    """A preflight of everything a tick will need: config and secret files, schema and grants, each
    RPC endpoint, each lane on chain, the fee account, journal keys, TTL horizons, clock skew, pooling,
    the metrics directory. Read-only. Exit 0 all ok, 1 warnings only, else the worst failure's kind:
    78 configuration, 3 needs a human, 69 a dependency unavailable.

    Example: `paygate doctor --only rpc,lanes --json | jq '.checks[] | select(.verdict != "ok")'`"""
    from paygate_cli.ops.doctor import DoctorInput, parse_groups, run_doctor

    env = get_env(ctx)
    mode = output_mode(json_flag, plain_flag)
    groups = parse_groups(only)
    given = DoctorInput(environ=dict(env.environ), overrides=dict(env.overrides), config_path=env.config_path,
                        open_conn=lambda settings, purpose: open_db(env, purpose, attempts=2, settings=settings))
    document = run_doctor(given, groups)
    rows = [{"group": c["group"], "check": c["id"], "verdict": c["verdict"], "evidence": c["evidence"],
             "fix": c["fix"]} for c in document["checks"]]
    emit(env, mode, document, rows=rows if mode is Mode.PLAIN else None,
         lines=_lines(document, groups) if mode is Mode.HUMAN else ())
    return ExitCode(document["summary"]["exit_code"])


def _lines(document: dict[str, Any], groups: tuple[str, ...]) -> list[str]:
    lines: list[str] = []
    for group in groups:
        lines.append(f"{group}: {_MARK[document['groups'][group]]}")
        for check in (c for c in document["checks"] if c["group"] == group):
            lines.append(f"  {_MARK[check['verdict']]:<4}  {check['id']}: {check['evidence']}")
            if check["verdict"] != "ok" and check["fix"]:
                lines.append(f"        fix: {check['fix']}")
    summary = document["summary"]
    lines.append(f"doctor: {summary['ok']} ok, {summary['warn']} warning(s), {summary['fail']} failed "
                 f"(exit {summary['exit_code']}: {_EXIT_MEANING.get(summary['exit_code'], '')})")
    return lines


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_command)
