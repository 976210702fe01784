"""`paygate drain` / `paygate undrain`: an instance or a lane stops taking new work."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from paygate_cli.commands._common import (
    ContextFlag,
    DryRunFlag,
    JsonFlag,
    YesFlag,
    confirm,
    get_env,
    open_db,
    output_mode,
    target_line,
    target_of,
)
from paygate_cli.commands.completion import complete_instances, complete_lanes
from paygate_cli.env import Env
from paygate_cli.errors import ConfigError, UsageError
from paygate_cli.output import emit, progress
from paygate_cli.settings import parse_duration

InstanceOpt = Annotated[str | None, typer.Option("--instance", help="An instance id (PAYGATE_INSTANCE_ID of a host).",
                                                 show_default=False, autocompletion=complete_instances)]
LaneOpt = Annotated[str | None, typer.Option("--lane", help="A lane address (G…).", show_default=False,
                                             autocompletion=complete_lanes)]
WaitOpt = Annotated[str | None, typer.Option(
    "--wait", help="Block until nothing is in flight (e.g. 120s): exit 0, or 75 when the time runs out.",
    show_default=False)]


def _seconds(text: str) -> float:
    try:
        return parse_duration(text, name="--wait")
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _describe(counts: dict[str, int]) -> str:
    busy = [f"{queue} {n}" for queue, n in counts.items() if n]
    return ", ".join(busy) if busy else "nothing"


def _wait(env: Env, conn: Any, target: Any, wait: str, *, show: bool) -> dict[str, Any]:
    from paygate_cli.ops.drain import wait_idle

    # A live count for a person at a terminal; silence for scripts and logs.
    with progress(env, "waiting for in-flight work", show=show) as waiting:
        return wait_idle(conn, target, timeout=_seconds(wait), monotonic=env.monotonic, sleep=env.sleep,
                         progress=lambda counts: waiting(0, None, _describe(counts)))


def drain_command(
    ctx: typer.Context, instance: InstanceOpt = None, lane: LaneOpt = None,
    reason: Annotated[str | None, typer.Option("--reason", help="Why; shown by `status`, kept in audit_log.")] = None,
    wait: WaitOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Drain an instance that has never run a tick here "
                                                        "(a host not started yet).")] = False,
    yes: YesFlag = False, dry_run: DryRunFlag = False, json_flag: JsonFlag = False, context: ContextFlag = None,
) -> int:
    """Stop an instance's ticks from taking new claims (they finish what they hold), or stop
    allocating a lane. Audited.

    Example: `paygate drain --instance host-a --reason "deploy 1.4" --wait 120s --yes`"""
    from paygate_cli.ops.drain import Target, drain

    env = get_env(ctx)
    target = Target.of(instance, lane)
    if wait is not None:
        _seconds(wait)  # a bad --wait is a usage error before anything changes
    where = target_of(env)
    confirm(env, f"drain {target.kind} {target.name}", yes=yes, context=context, dry_run=dry_run, target=where)
    with open_db(env, "drain") as conn:
        result = drain(conn, target, reason=reason, actor=env.settings.effective_operator(), dry_run=dry_run,
                       force=force)
        if wait is not None and not dry_run:
            try:
                result["wait"] = _wait(env, conn, target, wait, show=not json_flag)
            except KeyboardInterrupt:
                # Only the waiting stops: the drain is committed and stays until `undrain` (exit 130).
                flag = "--instance" if target.kind == "instance" else "--lane"
                env.stderr.write(f"interrupted: stopped waiting; {target.kind} {target.name} stays drained "
                                 f"(`paygate undrain {flag} {target.name}` to undo)\n")
                env.stderr.flush()
                raise
            result["in_flight"] = {k: 0 for k in result["in_flight"]}
    if dry_run:
        line = (f"would drain {target.kind} {target.name}" if result["would_drain"]
                else f"{target.kind} {target.name} is already drained")
    else:
        line = f"{target.kind} {target.name} drained" + ("" if result["changed"] else " (already)")
    line += f"; in flight: {_describe(result['in_flight'])}"
    emit(env, output_mode(json_flag), {"drain": result, "target": where},
         lines=[line, target_line(where)] if dry_run else [line])
    return 0


def undrain_command(ctx: typer.Context, instance: InstanceOpt = None, lane: LaneOpt = None, yes: YesFlag = False,
                    dry_run: DryRunFlag = False, json_flag: JsonFlag = False, context: ContextFlag = None) -> int:
    """Let a drained instance or lane take new work again. Audited.

    Example: `paygate undrain --instance host-a --yes`"""
    from paygate_cli.ops.drain import Target, undrain

    env = get_env(ctx)
    target = Target.of(instance, lane)
    where = target_of(env)
    confirm(env, f"undrain {target.kind} {target.name}", yes=yes, context=context, dry_run=dry_run, target=where)
    with open_db(env, "undrain") as conn:
        result = undrain(conn, target, actor=env.settings.effective_operator(), dry_run=dry_run)
    if dry_run:
        line = f"would undrain {target.kind} {target.name}" if result["would_undrain"] else "not drained"
    else:
        line = f"{target.kind} {target.name} " + ("undrained" if result["undrained"] else "was not drained")
    emit(env, output_mode(json_flag), {"undrain": result, "target": where},
         lines=[line, target_line(where)] if dry_run else [line])
    return 0


def register(app: typer.Typer) -> None:
    app.command("drain")(drain_command)
    app.command("undrain")(undrain_command)
