"""`paygate trace`: one unit of money's story, the database and the chain side by side, with a verdict."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from paygate_cli.commands._common import CHAIN_READ_SECRETS, JsonFlag, PlainFlag, get_env, open_db, output_mode
from paygate_cli.errors import ExitCode
from paygate_cli.output import emit, human_text

# The verdict's regime -> the exit code (docs/commands.md): explained differences are not failures.
EXIT_BY_REGIME = {"match": ExitCode.OK, "in_flight": ExitCode.OK, "lagging": ExitCode.OK,
                  "unreadable": ExitCode.FAILED, "unexplained": ExitCode.NEEDS_HUMAN}


def _complete_kinds(incomplete: str) -> list[str]:
    from paygate_cli.ops.trace import KINDS

    return [k for k in KINDS if k.startswith(incomplete)]


def _summary(details: dict[str, Any]) -> str:
    return " ".join(f"{key}={human_text(value)}" for key, value in details.items())


def trace_command(
    ctx: typer.Context,
    kind: Annotated[str, typer.Argument(help="deposit | charge | relay | bot-job | tx | account",
                                        autocompletion=_complete_kinds, show_default=False)],
    ref: Annotated[str, typer.Argument(help="The unit's id, a transaction's inner or outer hash, or an account (G…).",
                                       show_default=False)],
    json_flag: JsonFlag = False, plain_flag: PlainFlag = False,
) -> int:
    """One unit's whole story: admission, claims and leases, every lineage with its hashes, the chain's
    receipts and events re-read now, webhooks, audit entries and findings; then a verdict: where the
    money is and whether the database and the chain agree. Read-only. Exit 0 when they agree (or the
    difference is work in flight or a lagging worker), 3 when nothing explains it, 1 when the chain
    could not be read, 2 for an unknown unit.

    Example: `paygate trace deposit 42`, `paygate trace tx 3f…e1 --json`"""
    from paygate_cli.ops.trace import check_request, trace

    env = get_env(ctx)
    env.use_only_secrets(*CHAIN_READ_SECRETS)
    mode = output_mode(json_flag, plain_flag)
    check_request(kind, ref)
    with open_db(env, "trace") as conn:
        document = trace(conn, env.settings, kind, ref)
    verdict = document["verdict"]
    rows = [{"at": event["at"], "source": event["source"], "kind": event["kind"], "ledger": event["ledger"],
             "details": _summary(event["details"])} for event in document["timeline"]]
    rows.append({"at": None, "source": "verdict", "kind": verdict["regime"], "ledger": None,
                 "details": f"where={verdict['where']} agree={'yes' if verdict['agree'] else 'no'} "
                            f"explanation={verdict['explanation']}"})
    unit = document["unit"]
    lines = [f"{unit['kind']} {unit['id']}: {verdict['regime']} — {verdict['explanation']}",
             f"where the money is: {verdict['where']}"]
    emit(env, mode, document, rows=rows, columns=["at", "source", "kind", "ledger", "details"], lines=lines)
    return EXIT_BY_REGIME[verdict["regime"]]


def register(app: typer.Typer) -> None:
    app.command("trace")(trace_command)
