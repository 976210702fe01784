"""`paygate completion bash|zsh|fish`: print the completion script (never edits rc files)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from paygate_cli.commands._common import get_env


class Shell(StrEnum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


# -- candidates for the completion script (typer `autocompletion=` callbacks) ----------------------
#
# Called on every Tab with what is typed so far. Static lists answer at once; the database ones go
# through ops.completion with a 1 s budget, and any failure at all (no configuration, database down,
# a schema without the table) offers nothing rather than an error in the middle of a prompt.
REPLAY_QUEUES = ("webhooks", "deposits", "relays", "bot_jobs")  # ops/replay.py QUEUES (a test keeps them equal)
REPORT_FORMATS = ("table", "json", "csv", "markdown")  # commands/reconcile_report.py FORMATS


def complete_replay_queues(incomplete: str) -> list[str]:
    return [q for q in REPLAY_QUEUES if q.startswith(incomplete)]


def complete_report_formats(incomplete: str) -> list[str]:
    return [f for f in REPORT_FORMATS if f.startswith(incomplete)]


def complete_log_formats(incomplete: str) -> list[str]:
    return [f for f in ("auto", "text", "json") if f.startswith(incomplete)]


def complete_log_levels(incomplete: str) -> list[str]:
    return [level for level in ("debug", "info", "warning", "error") if level.startswith(incomplete)]


def _from_database(ctx: typer.Context, lookup: str, incomplete: str) -> list[str]:
    import logging

    try:
        from paygate_cli.ops import completion

        logging.disable(logging.CRITICAL)  # no log line may reach the terminal mid-prompt
        return list(getattr(completion, lookup)(get_env(ctx).settings, incomplete))
    except Exception:
        return []
    finally:
        logging.disable(logging.NOTSET)


def complete_lanes(ctx: typer.Context, incomplete: str) -> list[str]:
    return _from_database(ctx, "lane_addresses", incomplete)


def complete_instances(ctx: typer.Context, incomplete: str) -> list[str]:
    return _from_database(ctx, "instance_ids", incomplete)


def completion_command(ctx: typer.Context, shell: Annotated[Shell, typer.Argument(help="bash, zsh or fish")]) -> int:
    """Print a shell completion script (it calls paygate back for the candidates).

    Example: `paygate completion bash > /etc/bash_completion.d/paygate`, or `source <(paygate completion bash)`"""
    from typer._completion_shared import get_completion_script

    env = get_env(ctx)
    script = get_completion_script(prog_name="paygate", complete_var="_PAYGATE_COMPLETE", shell=shell.value)
    env.stdout.write(script.rstrip("\n") + "\n")
    return 0


def register(app: typer.Typer) -> None:
    app.command("completion")(completion_command)
