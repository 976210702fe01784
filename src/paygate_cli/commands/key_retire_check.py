"""`paygate key-retire-check KEY_ID | --lane ADDRESS`: exit 0 only when it is safe to retire."""

from __future__ import annotations

from typing import Annotated

import typer

from paygate_cli.commands._common import JsonFlag, PlainFlag, get_env, open_db, output_mode
from paygate_cli.errors import ExitCode
from paygate_cli.output import emit


def key_retire_check_command(
    ctx: typer.Context,
    key_id: Annotated[str | None, typer.Argument(help="A journal key id.", show_default=False)] = None,
    lane: Annotated[str | None, typer.Option("--lane", help="A lane address (G…) instead of a key.",
                                             show_default=False)] = None,
    json_flag: JsonFlag = False, plain_flag: PlainFlag = False,
) -> int:
    """May this journal key (or lane) be retired? Read-only; verifies receipts with a majority of read
    endpoints. Exit 0 when retirable, 3 listing the blockers (first 20 and a count).

    Example: `paygate key-retire-check k2025 --json` or `paygate key-retire-check --lane GABC…`"""
    from paygate_cli.ops.key_retire import check_request, key_retire_check

    env = get_env(ctx)
    mode = output_mode(json_flag, plain_flag)
    check_request(env.settings, key_id=key_id, lane=lane)
    with open_db(env, "key-retire-check") as conn:
        report = key_retire_check(conn, env.settings, key_id=key_id, lane=lane)
    rows = [{"lineage": b.get("lineage_id"), "state": b.get("state"), "reason": b["reason"]}
            for b in report["blockers"]]
    what = f"{report['kind']} {report['target']}"
    if report["retirable"]:
        lines = [f"{what} is retirable ({report['checked']['lineages']} lineage(s) checked)"]
        emit(env, mode, {"key_retire_check": report}, lines=lines)
        return ExitCode.OK
    more = report["blocker_count"] - len(report["blockers"])
    lines = [f"{what} is NOT retirable: {report['blocker_count']} blocker(s)" + (f" ({more} more not listed)"
                                                                                   if more else "")]
    emit(env, mode, {"key_retire_check": report}, rows=rows, columns=["lineage", "state", "reason"], lines=lines)
    return ExitCode.NEEDS_HUMAN


def register(app: typer.Typer) -> None:
    app.command("key-retire-check")(key_retire_check_command)
