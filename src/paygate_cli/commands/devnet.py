"""`paygate devnet …`: the local Stellar RPC stand-in. Parses and renders; the logic lives in
`paygate_cli.sandbox.devnet` (imported lazily so `paygate --help` stays fast)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from paygate_cli.commands._common import JsonFlag, PlainFlag, get_env, output_mode
from paygate_cli.errors import UsageError
from paygate_cli.output import emit

app = typer.Typer(help="Run and steer the local Stellar RPC stand-in.\n\n"
                       "Example: `paygate devnet start --port 8000 --ledger-interval 5s`", no_args_is_help=True)

UrlOpt = Annotated[str, typer.Option("--url", help="URL of a running devnet (from its genesis line).",
                                     envvar="PAYGATE_DEVNET_URL")]


@app.command("start")
def start(
    ctx: typer.Context,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port; 0 picks a free one.")] = 8000,
    ledger_interval: Annotated[str, typer.Option(
        "--ledger-interval", metavar="DURATION",
        help="Close a ledger every DURATION (5s, 500ms) or only on devnet_closeLedger (manual).")
    ] = "5s",
    state: Annotated[Path | None, typer.Option("--state", help="Keep state in FILE across restarts.")] = None,
    retention: Annotated[int, typer.Option("--retention", help="Ledgers of transactions/events kept.")] = 120_960,
    seed: Annotated[str, typer.Option("--seed", help="Seed of the deterministic genesis keys.")] = "paygate",
    lanes: Annotated[int, typer.Option("--lanes", help="Lane accounts (billing operators).")] = 8,
    users: Annotated[int, typer.Option("--users", help="Sample users funded with XLM and USDC.")] = 4,
    ledger_max_soroban_txs: Annotated[int, typer.Option(
        "--ledger-max-soroban-txs", help="Soroban transactions a ledger includes at most (mainnet: ~100).")] = 100,
    ledger_max_classic_ops: Annotated[int, typer.Option(
        "--ledger-max-classic-ops", help="Classic operations a ledger includes at most.")] = 1000,
    fee_stats_window_soroban: Annotated[int, typer.Option(
        "--fee-stats-window-soroban", help="Ledgers getFeeStats' sorobanInclusionFee covers.")] = 50,
    fee_stats_window_classic: Annotated[int, typer.Option(
        "--fee-stats-window-classic", help="Ledgers getFeeStats' inclusionFee covers.")] = 10,
    min_persistent_ttl: Annotated[int, typer.Option(
        "--min-persistent-ttl", metavar="LEDGERS", help="TTL of a new persistent entry (120 days).")] = 2_073_600,
    min_temporary_ttl: Annotated[int, typer.Option(
        "--min-temporary-ttl", metavar="LEDGERS", help="TTL of a new temporary entry (1 day).")] = 17_280,
    max_entry_ttl: Annotated[int, typer.Option(
        "--max-entry-ttl", metavar="LEDGERS", help="Longest TTL an entry can have (180 days).")] = 3_110_400,
) -> None:
    """Serve a devnet: prints the genesis as one JSON line on stdout, logs to stderr, runs until
    SIGTERM/SIGINT. The keys it prints are throwaway devnet keys.

    Example: `paygate devnet start --port 0 --ledger-interval manual --seed demo`"""
    from paygate_cli.sandbox.devnet.runner import start as run

    if not 0 <= port <= 65535:
        raise UsageError("--port must be between 0 and 65535")
    run(host=host, port=port, ledger_interval=ledger_interval, state=state, retention=retention, seed=seed,
        lanes=lanes, users=users, ledger_max_soroban_txs=ledger_max_soroban_txs,
        ledger_max_classic_ops=ledger_max_classic_ops, fee_stats_window_soroban=fee_stats_window_soroban,
        fee_stats_window_classic=fee_stats_window_classic, min_persistent_ttl=min_persistent_ttl,
        min_temporary_ttl=min_temporary_ttl, max_entry_ttl=max_entry_ttl, out=get_env(ctx).stdout)


def _show(ctx: typer.Context, result: dict[str, Any], json_flag: bool, plain_flag: bool) -> None:
    env = get_env(ctx)
    emit(env, output_mode(json_flag, plain_flag), result)


def _call(url: str, method: str, params: dict[str, Any]) -> Any:
    from paygate_cli.errors import ConfigError
    from paygate_cli.sandbox.devnet.runner import call
    from paygate_cli.settings import normalise_rpc_url

    try:  # a malformed --url is the caller's mistake (2), not an unreachable devnet and not a bug
        normalise_rpc_url(url, "--url")
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return call(url, method, params)


@app.command("fund")
def fund(
    ctx: typer.Context,
    account: Annotated[str, typer.Argument(help="G… account (created if missing) or C… contract.")],
    url: UrlOpt = "http://127.0.0.1:8000",
    xlm: Annotated[int, typer.Option("--xlm", help="Stroops of XLM to add.")] = 0,
    usdc: Annotated[int, typer.Option("--usdc", help="USDC base units (7 decimals) to mint.")] = 0,
    json_flag: JsonFlag = False,
    plain_flag: PlainFlag = False,
) -> None:
    """Give an account XLM and/or USDC.

    Example: `paygate devnet fund GABC… --usdc 100000000 --url http://127.0.0.1:8000`"""
    if xlm < 0 or usdc < 0:
        raise UsageError("--xlm and --usdc must be >= 0")
    _show(ctx, _call(url, "devnet_fund", {"account": account, "xlm": xlm, "usdc": usdc}), json_flag, plain_flag)


@app.command("close")
def close(
    ctx: typer.Context,
    url: UrlOpt = "http://127.0.0.1:8000",
    n: Annotated[int, typer.Option("-n", "--count", help="Ledgers to close.")] = 1,
    advance: Annotated[int | None, typer.Option("--advance-seconds", help="Close time step per ledger.")] = None,
    json_flag: JsonFlag = False,
    plain_flag: PlainFlag = False,
) -> None:
    """Close ledgers now (applies the queued transactions).

    Example: `paygate devnet close -n 3 --advance-seconds 5`"""
    if n < 1:
        raise UsageError("--count must be >= 1")
    params: dict[str, Any] = {"n": n}
    if advance is not None:
        params["advanceSeconds"] = advance
    _show(ctx, _call(url, "devnet_closeLedger", params), json_flag, plain_flag)


@app.command("advance")
def advance(
    ctx: typer.Context,
    ledgers: Annotated[int, typer.Argument(help="Ledgers to close (empty ones in bulk).")],
    url: UrlOpt = "http://127.0.0.1:8000",
    advance_seconds: Annotated[int | None, typer.Option("--advance-seconds", help="Close time step per ledger.")]
    = None,
    json_flag: JsonFlag = False,
    plain_flag: PlainFlag = False,
) -> None:
    """Close many ledgers at once, so entries' TTLs run out (state archival): queued transactions
    land in the first ledgers, the rest are empty; expiry applies as of the last one.

    Example: `paygate devnet advance 100000`"""
    if ledgers < 1:
        raise UsageError("LEDGERS must be >= 1")
    params: dict[str, Any] = {"ledgers": ledgers}
    if advance_seconds is not None:
        params["advanceSeconds"] = advance_seconds
    _show(ctx, _call(url, "devnet_advance", params), json_flag, plain_flag)


@app.command("fault")
def fault(
    ctx: typer.Context,
    kind: Annotated[str, typer.Argument(help="Fault kind (see docs/devnet.md), or 'clear'.")],
    url: UrlOpt = "http://127.0.0.1:8000",
    count: Annotated[int | None, typer.Option("--count", help="Uses before it clears itself.")] = None,
    ms: Annotated[int, typer.Option("--ms", help="Delay for 'slow'.")] = 0,
    ledgers: Annotated[int, typer.Option(
        "--ledgers", help="Ledgers for account_lag / node_lag / hold_next; surge: closes it lasts (0 = until cleared).")
    ] = 0,
    method: Annotated[list[str] | None, typer.Option("--method", help="Limit to this RPC method (repeatable).")]
    = None,
    account: Annotated[str | None, typer.Option("--account", help="reject_send: only sends from this source (G…).")]
    = None,
    code: Annotated[str | None, typer.Option("--code", help="reject_send: the ERROR code (default txBAD_SEQ).")]
    = None,
    rate: Annotated[int | None, typer.Option("--rate", help="surge: each phantom's bid, stroops per operation.")]
    = None,
    txs: Annotated[int | None, typer.Option("--txs", help="surge: phantom Soroban transactions per ledger.")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Clear the faults of this kind instead.")] = False,
    json_flag: JsonFlag = False,
    plain_flag: PlainFlag = False,
) -> None:
    """Inject a fault (or `clear` them all; `KIND --clear` clears that kind).

    Example: `paygate devnet fault slow --ms 2000 --count 3`, then `paygate devnet fault clear`;
    `paygate devnet fault surge --rate 2000 --txs 150 --ledgers 10`"""
    if kind == "clear":
        result = _call(url, "devnet_clearFaults", {})
    elif clear:
        result = _call(url, "devnet_clearFaults", {"kind": kind})
    else:
        params: dict[str, Any] = {"kind": kind, "ms": ms, "ledgers": ledgers}
        if count is not None:
            params["count"] = count
        if method:
            params["methods"] = method
        if account is not None:
            params["account"] = account
        if code is not None:
            params["code"] = code
        if rate is not None:
            params["rate"] = rate
        if txs is not None:
            params["txs"] = txs
        result = _call(url, "devnet_setFault", params)
    _show(ctx, result, json_flag, plain_flag)


@app.command("limits")
def limits(
    ctx: typer.Context,
    url: UrlOpt = "http://127.0.0.1:8000",
    soroban_txs: Annotated[int | None, typer.Option(
        "--ledger-max-soroban-txs", help="Soroban transactions a ledger includes at most.")] = None,
    classic_ops: Annotated[int | None, typer.Option(
        "--ledger-max-classic-ops", help="Classic operations a ledger includes at most.")] = None,
    json_flag: JsonFlag = False,
    plain_flag: PlainFlag = False,
) -> None:
    """Show or change a running devnet's ledger capacity (from the next close on).

    Example: `paygate devnet limits --ledger-max-soroban-txs 2`"""
    params: dict[str, Any] = {}
    if soroban_txs is not None:
        params["ledgerMaxSorobanTxs"] = soroban_txs
    if classic_ops is not None:
        params["ledgerMaxClassicOps"] = classic_ops
    if any(v < 1 for v in params.values()):
        raise UsageError("--ledger-max-soroban-txs and --ledger-max-classic-ops must be >= 1")
    _show(ctx, _call(url, "devnet_setLimits", params), json_flag, plain_flag)


@app.command("state")
def state(
    ctx: typer.Context,
    url: UrlOpt = "http://127.0.0.1:8000",
    json_flag: JsonFlag = False,
    plain_flag: PlainFlag = False,
) -> None:
    """Summary of a running devnet: ledger, queue, bans, faults.

    Example: `paygate devnet state --json`"""
    _show(ctx, _call(url, "devnet_state", {}), json_flag, plain_flag)
