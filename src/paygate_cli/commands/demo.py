"""`paygate demo`: run the system on a private Postgres and the devnet, and show what happened."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from paygate_cli.commands._common import JsonFlag, get_env, output_mode
from paygate_cli.output import Mode, emit


def demo_command(ctx: typer.Context,
                 data_dir: Annotated[str, typer.Option("--data-dir", help="Where the demo's Postgres lives.")]
                 = ".demo/pg",
                 json_flag: JsonFlag = False) -> int:
    """Start a private Postgres and the devnet; deposits, charges and a subscription settle; report.

    Example: `paygate demo --data-dir /tmp/paygate-demo` (what `make demo` runs)"""
    from paygate_cli.sandbox.demo import run_demo

    env = get_env(ctx)
    mode = output_mode(json_flag)

    def say(line: str) -> None:
        if mode is Mode.HUMAN:
            env.stdout.write(line + "\n")
            env.stdout.flush()

    report = run_demo(env, Path(data_dir), say)
    if mode is Mode.JSON:
        emit(env, mode, {"demo": report})
        return 0
    emit(env, mode, {}, rows=report["deposits"], title="deposits (admitted -> settled on the devnet)")
    emit(env, mode, {}, rows=report["charges"], title="charges (admitted -> settled or failed, from chain events)")
    emit(env, mode, {}, rows=report["balances"], title="billing balances: paygate's cache vs the chain",
         lines=["(the imported balance with nothing behind it on chain is the drift the reconciler will flag)"])
    fees = report["relay_fees"]
    emit(env, mode, {}, rows=report["relays"], title="relays (the gateway pays the fees)",
         lines=[f"fees: settled {fees['settled']} (exact feeCharged of applied + failed-on-chain relays), "
                f"released {fees['released']}, still reserved {fees['open_reserved']} (stroops)"])
    emit(env, mode, {}, rows=report["outbox"], title="webhook outbox (every event to each enabled endpoint)")
    received = report["received"]
    emit(env, mode, {}, lines=[
        f"receiver got {len(received)} POST(s); all signatures valid: {all(r['signature_ok'] for r in received)}; "
        f"idempotency keys left: {report['idempotency_keys_left']} (the 5 live ones)",
        f"database: {report['dsn']}"])
    return 0


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_command)
