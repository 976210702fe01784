"""The typer root. Registers one command module per group; each module parses and renders only."""

from __future__ import annotations

import importlib
from typing import Annotated, Any

import typer

from paygate_cli import __version__
from paygate_cli.commands._common import get_env
from paygate_cli.commands.completion import complete_log_formats, complete_log_levels
from paygate_cli.logs import configure_logging


def _version(value: bool) -> None:
    if value:
        typer.echo(f"paygate {__version__}")
        raise typer.Exit(0)


def root(
    ctx: typer.Context,
    config_path: Annotated[str | None, typer.Option("--config", help="TOML config file.",
                                                    show_default=False)] = None,
    log_format: Annotated[str | None, typer.Option("--log-format", help="auto | text | json",
                                                   autocompletion=complete_log_formats)] = None,
    log_level: Annotated[str | None, typer.Option("--log-level", help="debug | info | warning | error",
                                                  autocompletion=complete_log_levels)] = None,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="Tables at full width on a terminal (no folding, no "
                                                      "one-record-per-block layout); also after the command.")]
    = False,
) -> None:
    """paygate: see `paygate COMMAND --help`. Exit codes: 0 ok, 1 failed items, 2 usage, 3 needs a
    human, 69 dependency unavailable, 70 bug, 75 skipped (lock held), 77 permission, 78 config.
    A command's --json and --plain may also come before its name (`paygate --json status`)."""
    env = get_env(ctx)
    env.config_path = config_path
    env.wide = wide
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


# Top-level commands and groups, in the order `paygate --help` lists them: the module under
# paygate_cli.commands that registers each, and whether it is a typer group (its `app`) or a
# `register(app)` function. Modules are imported only when their command is registered, so a cold
# `paygate status` does not import run-tick's runner, the dev cluster helpers or the devnet.
COMMANDS: dict[str, tuple[str, str]] = {
    "run-tick": ("run_tick", "register"),
    "migrate": ("migrate", "register"),
    "status": ("status", "register"),
    "top": ("top", "register"),
    "workers": ("workers", "register"),
    "halt": ("halts", "register"),
    "resume": ("halts", "register"),
    "nonce-inspect": ("nonce_inspect", "register"),
    "trace": ("trace", "register"),
    "recover-check": ("recover_check", "register"),
    "drain": ("drain", "register"),
    "undrain": ("drain", "register"),
    "key-retire-check": ("key_retire_check", "register"),
    "reconcile-report": ("reconcile_report", "register"),
    "replay": ("replay", "register"),
    "doctor": ("doctor", "register"),
    "config": ("config", "group"),
    "dev": ("dev", "group"),
    "devnet": ("devnet", "group"),
    "completion": ("completion", "register"),
    "demo": ("demo", "register"),
}


def make_app(only: str | None = None) -> typer.Typer:
    """The root app with every command, or with just `only`: typer inspects every registered
    command's signature on each invocation (~30 ms for all of them), and a cron-started
    `run-tick` pays that on every start for commands it never runs."""
    app = typer.Typer(
        name="paygate",
        help="Operator toolkit and batch workers of the paygate Stellar payment gateway.\n\n"
             "Example: `paygate status`, `paygate run-tick funding --every 2s --for 65s`",
        add_completion=False,  # `paygate completion SHELL` prints scripts instead of editing rc files
        pretty_exceptions_enable=False,  # __main__ maps every exception; locals could hold secrets
        no_args_is_help=True,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every subcommand
    )
    app.callback()(root)
    registered: set[str] = set()
    for name, (module_name, kind) in COMMANDS.items():
        if (only is None or name == only) and module_name not in registered:
            module = importlib.import_module(f"paygate_cli.commands.{module_name}")
            if kind == "group":
                app.add_typer(module.app, name=name)
            else:
                module.register(app)
            registered.add(module_name)
    return app


def __getattr__(name: str) -> Any:
    """`paygate_cli.app.app`: the full app, built on first use (tests and docs tooling walk it);
    the entry point builds only the command it runs."""
    if name == "app":
        full = make_app()
        globals()["app"] = full
        return full
    raise AttributeError(name)
