"""`paygate devnet …`: the local Stellar RPC stand-in (owned by the devnet work)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Run and steer the local Stellar RPC stand-in.", no_args_is_help=True)
