"""The typer root. Registers one command module per group; each module parses and renders only."""

from __future__ import annotations

import typer

from paygate_cli.commands import devnet

app = typer.Typer(
    name="paygate",
    help="Operator toolkit and batch workers of the paygate Stellar payment gateway.",
    add_completion=False,  # `paygate completion SHELL` prints scripts instead of editing rc files
    pretty_exceptions_enable=False,  # __main__ maps every exception; locals could hold secrets
    no_args_is_help=True,
)

app.add_typer(devnet.app, name="devnet")
