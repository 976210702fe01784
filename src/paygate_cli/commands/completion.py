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
