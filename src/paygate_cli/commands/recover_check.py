"""`paygate recover-check`: the restore gate's recovery pass by hand (docs/architecture.md §8)."""

from __future__ import annotations

from typing import Any

import typer

from paygate_cli.commands._common import (
    CHAIN_READ_SECRETS,
    ContextFlag,
    DryRunFlag,
    JsonFlag,
    PlainFlag,
    YesFlag,
    confirm,
    get_env,
    open_db,
    output_mode,
    target_line,
    target_of,
)
from paygate_cli.errors import ExitCode
from paygate_cli.logs import get_logger
from paygate_cli.output import emit

# The database, RPC and the journal keys (the take-over engine decrypts journaled bytes to resend
# them), as recovery is deployed: never a lane or fee seed.
RECOVER_CHECK_SECRETS = (*CHAIN_READ_SECRETS, "journal_keys")


def recover_check_command(ctx: typer.Context, yes: YesFlag = False, dry_run: DryRunFlag = False,
                          json_flag: JsonFlag = False, plain_flag: PlainFlag = False,
                          context: ContextFlag = None) -> int:
    """Compare the journal with the chain after a restore or a failover: drive live lineages as
    recovery does, fence lanes the chain used past the journal, and clear the restore halt when
    nothing is left unresolved (exit 0); exit 3 with the blockers. Audited.

    Example: `paygate recover-check --yes`"""
    from paygate_cli.ops.recover_check import recover_check

    env = get_env(ctx)
    env.use_only_secrets(*RECOVER_CHECK_SECRETS)
    mode = output_mode(json_flag, plain_flag)
    where = target_of(env)
    confirm(env, "run the recovery pass (fence lanes ahead of the journal, clear the restore halt)", yes=yes,
            context=context, dry_run=dry_run, target=where)
    with open_db(env, "recover-check") as conn:
        report = recover_check(conn, env.settings, actor=env.settings.effective_operator(), dry_run=dry_run,
                               log=get_logger("recover-check"))
    rows = [{"lane": lane["lane"], "status": lane["status"], "journal_seq": lane["journal_seq"],
             "chain_seq": lane["chain_seq"], "verdict": lane["verdict"], "detail": lane["detail"]}
            for lane in report["lanes"]]
    rows += [{"lane": unit["lane"], "status": unit["state"], "journal_seq": unit["source_seq"], "chain_seq": None,
              "verdict": "blocked", "detail": f"lineage {unit['lineage_id']} ({unit['entitlement']}) live; lease until "
                                             f"{unit['lease_expires_at'] or 'no row holds it'}"}
             for unit in report["units"]]
    emit(env, mode, {"recover_check": report, "target": where}, rows=rows,
         columns=["lane", "status", "journal_seq", "chain_seq", "verdict", "detail"],
         lines=[_verdict_line(report), target_line(where)])
    kept = report["restore_halt"] is not None and not report["cleared"] and not dry_run
    if report["fenced_now"] or report["would_fence"] or not report["clean"] or kept:
        return ExitCode.NEEDS_HUMAN
    return ExitCode.OK


def _verdict_line(report: dict[str, Any]) -> str:
    halt = report["restore_halt"]
    head = f"restore halt: {halt['reason']}" if halt else "no restore halt set"
    if not halt and report["identity_changed"]:
        head += " (but the database's identity differs from the recorded one: the next tick sets it)"
    if report["cleared"]:
        return f"{head}\ncleared: every lane agrees with the chain and nothing is live; submissions are open again"
    if report["kept_because"]:
        return f"{head}\nkept: {report['kept_because']}"
    if report["clean"]:
        fenced_count = report["fenced_now"] or report["would_fence"]
        fenced = f"; {fenced_count} lane(s) ahead of the journal fenced: a human must look" if fenced_count else ""
        return f"{head}\nclean: nothing unresolved{' (dry run: nothing changed)' if report['dry_run'] else ''}{fenced}"
    blockers = report["blockers"]
    return f"{head}\n{len(blockers)} blocker(s), the halt stays:\n  " + "\n  ".join(blockers[:20])


def register(app: typer.Typer) -> None:
    app.command("recover-check")(recover_check_command)
