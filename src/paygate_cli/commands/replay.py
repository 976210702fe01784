"""`paygate replay QUEUE [IDS… | --all-dead] [--since …]`: dead rows back to pending."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Annotated, Any

import typer

from paygate_cli.commands._common import DryRunFlag, JsonFlag, PlainFlag, YesFlag, confirm, get_env, output_mode
from paygate_cli.commands.reconcile import _since
from paygate_cli.errors import ExitCode
from paygate_cli.output import emit


def replay_command(
    ctx: typer.Context,
    queue: Annotated[str, typer.Argument(help="webhooks | deposits | relays | bot_jobs")],
    ids: Annotated[list[int] | None, typer.Argument(help="Row ids (or --all-dead).", show_default=False)] = None,
    all_dead: Annotated[bool, typer.Option("--all-dead", help="Every dead row of the queue.")] = False,
    since: Annotated[str | None, typer.Option("--since", help="With --all-dead: died since (1h, or ISO time).",
                                              show_default=False)] = None,
    yes: YesFlag = False, dry_run: DryRunFlag = False, json_flag: JsonFlag = False, plain_flag: PlainFlag = False,
) -> int:
    """Dead rows back to pending, keeping their idempotency key and history, attempts reset; audited.
    Refuses per row, with the reason: not dead, lineage not terminal, effect already on chain
    (re-verified by a majority of read endpoints), authorisation expired. Exit 1 if any row was refused.

    Example: `paygate replay webhooks --all-dead --since 2h --dry-run`"""
    from paygate_cli.ops.replay import run

    env = get_env(ctx)
    mode = output_mode(json_flag, plain_flag)
    with ExitStack() as stack:
        progress = None
        if env.stderr_isatty and not json_flag:
            bars: list[Any] = []

            def progress(done: int, total: int) -> None:
                # Started on the first row, i.e. after the confirmation prompt: never drawn over it.
                if not bars:
                    from rich.console import Console
                    from rich.progress import Progress

                    bar = stack.enter_context(Progress(console=Console(file=env.stderr), transient=True))
                    bars.append((bar, bar.add_task(f"replay {queue}", total=total)))
                bar, task = bars[0]
                bar.update(task, completed=done, total=total)

        def ask(count: int) -> None:
            confirm(env, f"replay {count} {queue} row(s)", yes=yes)

        result = run(env.settings, queue, ids=ids or None, all_dead=all_dead, since=_since(since),
                     actor=env.settings.effective_operator(), dry_run=dry_run, confirm=ask, progress=progress)
    rows: list[dict[str, Any]] = [{"id": r["id"], "outcome": r["outcome"], "reason": r.get("reason") or ""}
                                  for r in result["rows"]]
    summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(result["counts"].items())) or "no rows"
    emit(env, mode, {"replay": result}, rows=rows, columns=["id", "outcome", "reason"],
         lines=[f"replay {result['queue']}{' (dry run)' if dry_run else ''}: {summary}"])
    return ExitCode.FAILED if result["counts"].get("refused") else ExitCode.OK


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_command)
