"""`paygate migrate [--roles]`: apply sql/ migrations; optionally (re)create the runtime role."""

from __future__ import annotations

from typing import Annotated

import typer

from paygate_cli.commands._common import DryRunFlag, JsonFlag, get_env, output_mode
from paygate_cli.db.connect import connect
from paygate_cli.db.migrate import create_runtime_role, migrate
from paygate_cli.output import emit


def migrate_command(
    ctx: typer.Context,
    roles: Annotated[bool, typer.Option("--roles", help="Also create/refresh the runtime role's grants.")] = False,
    role_name: Annotated[str, typer.Option("--role-name", help="Name of the runtime role.")] = "paygate_runtime",
    dry_run: DryRunFlag = False,
    json_flag: JsonFlag = False,
) -> int:
    """Apply pending migrations in order, under an advisory lock (safe from two hosts at once).

    Example: `paygate migrate --dry-run`, then `paygate migrate --roles`"""
    env = get_env(ctx)
    with connect(env.settings, "migrate") as conn:
        result = migrate(conn, dry_run=dry_run)
        if roles and not dry_run:
            create_runtime_role(conn, role_name)
            result["runtime_role"] = role_name
    if dry_run:
        line = f"pending: {', '.join(result['pending']) or 'none'}"
    else:
        line = (f"applied {len(result['applied'])} migration(s): {', '.join(result['applied'])}"
                if result["applied"] else "schema up to date") + f" (version {result['schema_version']})"
        if roles:
            line += f"; runtime role {role_name} granted"
    emit(env, output_mode(json_flag), {"migrate": result}, lines=[line])
    return 0


def register(app: typer.Typer) -> None:
    app.command("migrate")(migrate_command)
