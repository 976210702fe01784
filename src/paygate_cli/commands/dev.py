"""`paygate dev db up|down|url`: a private Postgres for development and the demo."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from paygate_cli.commands._common import JsonFlag, get_env, output_mode
from paygate_cli.errors import UsageError
from paygate_cli.output import emit
from paygate_cli.sandbox.pg_cluster import Cluster, default_datadir

app = typer.Typer(help="Developer conveniences.\n\nExample: `paygate dev db up`", no_args_is_help=True)
db_app = typer.Typer(help="A private PostgreSQL from the system binaries (Unix socket only).\n\n"
                          "Example: `paygate dev db up && export PAYGATE_DATABASE_URL=\"$(paygate dev db url)\"`",
                     no_args_is_help=True)
app.add_typer(db_app, name="db")

DataDir = Annotated[str | None, typer.Option("--data-dir", help="Default: $XDG_DATA_HOME/paygate/pg.")]


def _cluster(ctx: typer.Context, data_dir: str | None) -> Cluster:
    env = get_env(ctx)
    try:
        return Cluster.at(Path(data_dir) if data_dir else default_datadir(dict(env.environ)))
    except OSError as exc:  # a name too long, a pointer file we may not read: the flag's to fix, not a bug
        raise UsageError(f"--data-dir {str(data_dir)[:200]}: {exc.strerror or type(exc).__name__}") from None


@db_app.command("up")
def up(ctx: typer.Context, data_dir: DataDir = None, json_flag: JsonFlag = False) -> int:
    """Create (first time) and start the private cluster; prints its DSN.

    Example: `paygate dev db up --data-dir /tmp/pg`"""
    cluster = _cluster(ctx, data_dir)
    started = cluster.up()
    document = {"started": started, "dsn": cluster.dsn(), "data_dir": str(cluster.datadir),
                "requested_data_dir": str(cluster.requested or cluster.datadir)}
    lines = [("started" if started else "already running") + f": export PAYGATE_DATABASE_URL='{cluster.dsn()}'"]
    if cluster.requested:
        lines.append(f"(data in {cluster.datadir}: the postgres user cannot reach {cluster.requested}; "
                     "the pointer file there lets `down` and `url` find it)")
    emit(get_env(ctx), output_mode(json_flag), document, lines=lines)
    return 0


@db_app.command("down")
def down(ctx: typer.Context, data_dir: DataDir = None, json_flag: JsonFlag = False) -> int:
    """Stop the private cluster (data is kept).

    Example: `paygate dev db down --data-dir /tmp/pg`"""
    cluster = _cluster(ctx, data_dir)
    running = cluster.is_running()
    cluster.stop()
    emit(get_env(ctx), output_mode(json_flag), {"stopped": running, "data_dir": str(cluster.datadir)},
         lines=["stopped" if running else "was not running"])
    return 0


@db_app.command("url")
def url(ctx: typer.Context, data_dir: DataDir = None) -> int:
    """Print the DSN of the private cluster.

    Example: `export PAYGATE_DATABASE_URL="$(paygate dev db url)"`"""
    get_env(ctx).stdout.write(_cluster(ctx, data_dir).dsn() + "\n")
    return 0
