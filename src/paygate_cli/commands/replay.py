"""`paygate replay QUEUE [IDS… | --all-dead] [--since …]`: dead rows back to pending."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from paygate_cli.commands._common import (
    ContextFlag,
    DryRunFlag,
    JsonFlag,
    PlainFlag,
    YesFlag,
    confirm,
    get_env,
    open_db,
    output_mode,
    parse_since,
    target_line,
    target_of,
)
from paygate_cli.commands.completion import complete_replay_queues
from paygate_cli.errors import ExitCode
from paygate_cli.output import emit, progress


def replay_command(
    ctx: typer.Context,
    queue: Annotated[str, typer.Argument(help="webhooks | deposits | relays | bot_jobs",
                                         autocompletion=complete_replay_queues)],
    ids: Annotated[list[int] | None, typer.Argument(help="Row ids (or --all-dead).", show_default=False)] = None,
    all_dead: Annotated[bool, typer.Option("--all-dead", help=(
        "Every dead row of the queue: webhooks `dead`; deposits `failed`, `expired` and `needs_human`; "
        "relays `expired`, `rejected` and `needs_human`; bot_jobs `dead` and `needs_human`."))] = False,
    since: Annotated[str | None, typer.Option("--since", help="With --all-dead: died since (1h, or ISO time).",
                                              show_default=False)] = None,
    yes: YesFlag = False, dry_run: DryRunFlag = False, json_flag: JsonFlag = False, plain_flag: PlainFlag = False,
    context: ContextFlag = None,
) -> int:
    """Dead rows back to pending, keeping their idempotency key and history, attempts reset; audited.
    Refuses per row, with the reason: not dead, lineage not terminal, effect already on chain
    (re-verified by a majority of read endpoints), authorisation expired, a call that would fail again
    (a relay that trapped on chain, a deposit whose authorisation fails validation). Exit 1 if any row
    was refused.

    Example: `paygate replay webhooks --all-dead --since 2h --dry-run`"""
    from paygate_cli.ops.replay import check_request, run

    env = get_env(ctx)
    mode = output_mode(json_flag, plain_flag)
    target = target_of(env)
    confirm(env, f"replay {queue} rows", yes=yes, context=context, dry_run=True, target=target)  # --context
    since_at = parse_since(since)
    check_request(env.settings, queue, ids=ids or None, all_dead=all_dead, since=since_at)
    # The bar starts on the first row, i.e. after the confirmation prompt: never drawn over it.
    with progress(env, f"replay {queue}", show=not (json_flag or plain_flag)) as rows_done:

        def ask(count: int) -> None:
            confirm(env, f"replay {count} {queue} row(s)", yes=yes, context=context, target=target)

        with open_db(env, "replay") as conn:
            result = run(conn, env.settings, queue, ids=ids or None, all_dead=all_dead, since=since_at,
                         actor=env.settings.effective_operator(), dry_run=dry_run, confirm=ask,
                         progress=lambda done, total: rows_done(done, total, None))
    rows: list[dict[str, Any]] = [{"id": r["id"], "outcome": r["outcome"], "reason": r.get("reason") or ""}
                                  for r in result["rows"]]
    summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(result["counts"].items())) or "no rows"
    taken = f" --all-dead ({', '.join(result['all_dead_statuses'])} rows)" if result.get("all_dead_statuses") else ""
    emit(env, mode, {"replay": result, "target": target}, rows=rows, columns=["id", "outcome", "reason"],
         lines=[f"replay {result['queue']}{' (dry run)' if dry_run else ''}{taken}: {summary}",
                *([target_line(target)] if dry_run else [])])
    return ExitCode.FAILED if result["counts"].get("refused") else ExitCode.OK


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_command)
