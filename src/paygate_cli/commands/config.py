"""`paygate config show [--sources]`: every effective value, secrets redacted."""

from __future__ import annotations

from typing import Annotated

import typer

from paygate_cli.commands._common import JsonFlag, PlainFlag, get_env, output_mode
from paygate_cli.output import emit
from paygate_cli.settings import describe

app = typer.Typer(help="Inspect configuration.\n\nExample: `paygate config show --sources`", no_args_is_help=True)


@app.command("show")
def show(ctx: typer.Context,
         sources: Annotated[bool, typer.Option("--sources", help="Also say where each value came from.")] = False,
         json_flag: JsonFlag = False, plain_flag: PlainFlag = False) -> int:
    """Print every effective setting (flags > env > file > defaults); secrets are never shown.

    Example: `paygate --config /etc/paygate/config.toml config show --sources`"""
    env = get_env(ctx)
    settings = env.settings
    rows = describe(settings)
    columns = ["name", "value", "source"] if sources else ["name", "value"]
    document = {"config_file": settings.config_file,
                "settings": [{k: r[k] for k in columns} for r in rows]}
    emit(env, output_mode(json_flag, plain_flag), document, rows=rows, columns=columns)
    return 0
