"""The typer root. Registers one command module per group; each module parses and renders only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

from paygate_cli import __version__
from paygate_cli.commands import (
    completion,
    config,
    demo,
    dev,
    devnet,
    drain,
    halts,
    key_retire,
    migrate,
    nonce,
    reconcile,
    replay,
    run_tick,
    status,
    workers,
)
from paygate_cli.commands._common import get_env
from paygate_cli.logs import configure_logging


def _version(value: bool) -> None:
    if value:
        typer.echo(f"paygate {__version__}")
        raise typer.Exit(0)


def root(
    ctx: typer.Context,
    config_path: Annotated[str | None, typer.Option("--config", help="TOML config file.",
                                                    show_default=False)] = None,
    log_format: Annotated[str | None, typer.Option("--log-format", help="auto | text | json")] = None,
    log_level: Annotated[str | None, typer.Option("--log-level", help="debug | info | warning | error")] = None,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """paygate: see `paygate COMMAND --help`. Exit codes: 0 ok, 1 failed items, 2 usage, 3 needs a
    human, 69 dependency unavailable, 70 bug, 75 skipped (lock held), 77 permission, 78 config."""
    env = get_env(ctx)
    env.config_path = config_path
    env.override(log_format=log_format, log_level=log_level)
    # Logging must work before settings load (a bad config still logs its error), so it reads only
    # the flags and the two plain variables here.
    fmt = log_format or env.environ.get("PAYGATE_LOG_FORMAT") or "auto"
    level = log_level or env.environ.get("PAYGATE_LOG_LEVEL") or "info"
    if fmt not in ("auto", "text", "json"):
        raise typer.BadParameter(f"{fmt!r} is not one of auto, text, json", param_hint="--log-format")
    if level not in ("debug", "info", "warning", "error"):
        raise typer.BadParameter(f"{level!r} is not a log level", param_hint="--log-level")
    env.log_format, env.log_level = fmt, level
    configure_logging(env, fmt=fmt, level=level)


# Top-level commands and groups, in the order `paygate --help` lists them.
COMMANDS: dict[str, Callable[[typer.Typer], None]] = {
    "run-tick": run_tick.register,
    "migrate": migrate.register,
    "status": status.register,
    "workers": workers.register,
    "halt": halts.register,
    "resume": halts.register,
    "nonce-inspect": nonce.register,
    "drain": drain.register,
    "undrain": drain.register,
    "key-retire-check": key_retire.register,
    "reconcile-report": reconcile.register,
    "replay": replay.register,
    "config": lambda app: app.add_typer(config.app, name="config"),
    "dev": lambda app: app.add_typer(dev.app, name="dev"),
    "devnet": lambda app: app.add_typer(devnet.app, name="devnet"),
    "completion": completion.register,
    "demo": demo.register,
}


def make_app(only: str | None = None) -> typer.Typer:
    """The root app with every command, or with just `only`: typer inspects every registered
    command's signature on each invocation (~30 ms for all of them), and a cron-started
    `run-tick` pays that on every start for commands it never runs."""
    app = typer.Typer(
        name="paygate",
        help="Operator toolkit and batch workers of the paygate Stellar payment gateway.\n\n"
             "Example: `paygate status`, `paygate run-tick funding --every 2s --for 55s`",
        add_completion=False,  # `paygate completion SHELL` prints scripts instead of editing rc files
        pretty_exceptions_enable=False,  # __main__ maps every exception; locals could hold secrets
        no_args_is_help=True,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every subcommand
    )
    app.callback()(root)
    registered: set[Callable[[typer.Typer], None]] = set()
    for name, register in COMMANDS.items():
        if (only is None or name == only) and register not in registered:
            register(app)
            registered.add(register)
    return app


app = make_app()
