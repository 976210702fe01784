"""`paygate halt --reason …` / `paygate resume`: the operator's own admission pause."""

from __future__ import annotations

from typing import Annotated

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
from paygate_cli.ops.halts import describe_halt, halt, operator_halt, refuse_second_halt, resume
from paygate_cli.output import emit


def halt_command(
    ctx: typer.Context,
    reason: Annotated[str, typer.Option("--reason", help="Why; shown by `status` and recorded in audit_log.")],
    replace: Annotated[bool, typer.Option(
        "--replace", help="Replace an operator halt already in place (audited with the old and new reason).")] = False,
    yes: YesFlag = False, dry_run: DryRunFlag = False, json_flag: JsonFlag = False, context: ContextFlag = None,
) -> int:
    """Close admission (the operator halt). Workers keep draining committed work.

    A halt already in place is never replaced silently: pass --replace to change its reason.

    Example: `paygate halt --reason "incident 42: RPC provider degraded" --yes`"""
    env = get_env(ctx)
    with open_db(env, "halt") as conn:
        target = target_of(env, conn)
        confirm(env, "halt admission", yes=yes, context=context, dry_run=True, target=target)  # --context
        if not dry_run:
            # Refuse before asking: a confirmation for a halt that would be refused helps no one.
            current = operator_halt(conn)
            refuse_second_halt(current, replace=replace)
            confirm(env, "replace the operator halt" if current is not None else "halt admission", yes=yes,
                    context=context, target=target)
        result = halt(conn, reason=reason, actor=env.settings.effective_operator(), dry_run=dry_run,
                      replace=replace)
    if dry_run:
        current = result["current_operator_halt"]
        if current is None:
            line = "would halt: " + reason
        elif replace:
            line = f"would replace: {describe_halt(current)} -> {reason!r}"
        else:
            line = f"already {describe_halt(current)}; would refuse without --replace"
    elif result["replaced"] is not None:
        line = f"halted: {reason} (replaced: {describe_halt(result['replaced'])})"
    else:
        line = "halted: " + reason
    emit(env, output_mode(json_flag), {"halt": result, "target": target},
         lines=[line, target_line(target)] if dry_run else [line])
    return 0


def resume_command(ctx: typer.Context, yes: YesFlag = False, dry_run: DryRunFlag = False,
                   json_flag: JsonFlag = False, context: ContextFlag = None) -> int:
    """Clear the operator halt (the gas halt clears itself when headroom returns; the restore halt
    only by a clean `recover-check`).

    Example: `paygate resume --yes`"""
    env = get_env(ctx)
    target = target_of(env)
    confirm(env, "resume admission", yes=yes, context=context, dry_run=dry_run, target=target)
    with open_db(env, "resume") as conn:
        result = resume(conn, actor=env.settings.effective_operator(), dry_run=dry_run)
    if dry_run:
        line = ("would clear the operator halt: " + describe_halt(result["current"][0])
                if result["would_resume"] else "no operator halt is set")
    else:
        line = "operator halt cleared" if result["resumed"] else "no operator halt was set"
        if result["remaining_halts"]:
            line += "; still set: " + ", ".join(h["kind"] for h in result["remaining_halts"])
        if any(h["kind"] == "restore" for h in result["remaining_halts"]):
            line += ("\nthe restore halt remains (submissions closed): it clears only by a clean recovery pass, "
                     "`paygate recover-check` (docs/architecture.md §8)")
    emit(env, output_mode(json_flag), {"resume": result, "target": target},
         lines=[line, target_line(target)] if dry_run else [line])
    return 0


def register(app: typer.Typer) -> None:
    app.command("halt")(halt_command)
    app.command("resume")(resume_command)
