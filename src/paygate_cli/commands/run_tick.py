"""`paygate run-tick WORKER`: one worker, once or on a bounded fixed-rate loop."""

from __future__ import annotations

from typing import Annotated

import typer

from paygate_cli.catalogue import WORKERS, get_worker
from paygate_cli.commands._common import JsonFlag, get_env, output_mode
from paygate_cli.env import Env
from paygate_cli.errors import ConfigError, PaygateError, UsageError
from paygate_cli.output import emit
from paygate_cli.settings import parse_duration
from paygate_cli.ticks.runner import RunOptions, run_worker


def _worker_names(incomplete: str) -> list[str]:
    return [name for name in sorted(WORKERS) if name.startswith(incomplete)]


# The most a worker's path can use per tick, and why: more is refused (exit 2), never silently cut.
BATCH_CEILINGS: dict[str, tuple[int, str]] = {
    "settlement": (100, "the billing contract's charge_batch takes at most 100 charges"),
    "observer": (10_000, "RPC getEvents returns at most 10000 events per request"),
}


def _check_batch(worker: str, default: int | None, batch: int | None) -> None:
    if batch is None:
        return
    if default is None:
        raise UsageError(f"--batch: {worker} does not work in batches", msgid="usage.batch")
    ceiling = BATCH_CEILINGS.get(worker)
    if ceiling and batch > ceiling[0]:
        raise UsageError(f"--batch {batch}: {worker} can use at most {ceiling[0]} per tick ({ceiling[1]})",
                         msgid="usage.batch")


def _check_metrics_dir(env: Env, flag_value: str | None) -> None:
    """A metrics directory whose parent is missing is a typo: 78 before anything runs, never created.
    Without the flag the setting is checked when it loads; a bad configuration is left for the
    runner to report (it records the failed start)."""
    from paygate_cli.metrics import require_parent

    if flag_value:
        require_parent(flag_value, "--metrics-dir")
        return
    try:
        settings = env.settings
    except PaygateError:
        return
    if settings.metrics_dir:
        require_parent(settings.metrics_dir, f"metrics_dir ({settings.sources.get('metrics_dir', 'setting')})")


def _duration(value: str | None, flag: str) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value, name=flag)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def run_tick_command(
    ctx: typer.Context,
    worker: Annotated[str, typer.Argument(help="Worker name (see `paygate workers`).",
                                          autocompletion=_worker_names)],
    once: Annotated[bool, typer.Option("--once", help="Run one tick (the default).")] = False,
    every: Annotated[str | None, typer.Option("--every", metavar="DURATION",
                                                           help="Tick on a fixed-rate schedule, e.g. 2s.")] = None,
    for_: Annotated[str | None, typer.Option("--for", metavar="DURATION",
                                                          help="Stop looping this long after the start "
                                                               "(the lock wait included), e.g. 65s.")] = None,
    lock_wait: Annotated[str, typer.Option("--lock-wait", metavar="DURATION",
                                             help="Wait this long for the worker lock; 0 = try once.")]
    = "10s",
    batch: Annotated[int | None, typer.Option("--batch", help="Items per tick (default: the worker's; more than "
                                                              "its path can use is refused).")] = None,
    metrics_dir: Annotated[str | None, typer.Option("--metrics-dir", metavar="DIR",
                                                  help="Write paygate_<worker>_slot<N>.prom here.")]
    = None,
    json_flag: JsonFlag = False,
) -> int:
    """Run a background worker. Exit 75 when another process holds its lock (skipped), 78 when it
    lacks what it needs (RPC, keys, contracts, a migrated schema, a writable --metrics-dir).

    Example: `paygate run-tick settlement --every 2s --for 65s --metrics-dir /var/lib/node_exporter`"""
    env = get_env(ctx)
    spec = get_worker(worker)
    every_s = _duration(every, "--every")
    opts = RunOptions(
        once=once or every_s is None,
        every=every_s,
        for_seconds=_duration(for_, "--for"),
        lock_wait=_duration(lock_wait, "--lock-wait") or 0.0,
        batch=batch,
        metrics_dir=metrics_dir,  # the runner falls back to the setting (after a bad config too)
    )
    if once and every_s is not None:
        raise UsageError("--once and --every are mutually exclusive")
    _check_batch(spec.name, spec.batch, batch)
    _check_metrics_dir(env, metrics_dir)
    summary = run_worker(env, spec, opts)
    document = summary.as_dict()
    emit(env, output_mode(json_flag), {"run_tick": document},
         lines=[f"{spec.name}: {summary.ticks} tick(s), processed {summary.processed}, failed {summary.failed}, "
                f"exit {summary.exit_code}"])
    return summary.exit_code


def register(app: typer.Typer) -> None:
    app.command("run-tick")(run_tick_command)
