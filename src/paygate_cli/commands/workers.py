"""`paygate workers`: the registered workers with lock ids, cadences and last runs."""

from __future__ import annotations

import typer

from paygate_cli.catalogue import WORKERS
from paygate_cli.commands._common import JsonFlag, PlainFlag, get_env, open_db, output_mode
from paygate_cli.db.locks import LOCK_NAMESPACE
from paygate_cli.ops.status import last_runs
from paygate_cli.output import duration, emit


def workers_command(ctx: typer.Context, json_flag: JsonFlag = False, plain_flag: PlainFlag = False,
                    offline: bool = typer.Option(False, "--offline", help="Skip the database (no last runs).")) -> int:
    """List the workers: lock ids, cadence, batch, concurrency and their last runs.

    Example: `paygate workers --plain | grep settlement`"""
    env = get_env(ctx)
    runs: dict[str, dict] = {}
    if not offline:
        with open_db(env, "workers", attempts=2) as conn:
            runs = {r["worker"]: r for r in last_runs(conn)}
    rows = []
    for spec in WORKERS.values():
        run = runs.get(spec.name, {})
        rows.append({
            "worker": spec.name,
            "lock": f"({LOCK_NAMESPACE}, {spec.lock_keys()[0]}"
                    + (f"..{spec.lock_keys()[-1]})" if spec.concurrency > 1 else ")"),
            "cadence_s": duration(spec.cadence), "batch": spec.batch, "concurrency": spec.concurrency,
            "single_writer": spec.single_writer, "last_outcome": run.get("last_outcome"),
            "last_run": run.get("last_run_ago") if not offline else None,
            "last_success": run.get("last_success"), "last_error": run.get("last_error"),
            "description": spec.description,
        })
    emit(env, output_mode(json_flag, plain_flag), {"lock_namespace": LOCK_NAMESPACE, "workers": rows},
         rows=rows, columns=["worker", "lock", "cadence_s", "batch", "concurrency", "last_outcome", "last_run",
                             "last_success"])
    return 0


def register(app: typer.Typer) -> None:
    app.command("workers")(workers_command)
