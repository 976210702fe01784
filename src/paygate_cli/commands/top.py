"""`paygate top`: a live view of the fleet's work that refreshes in place on a terminal (rich Live);
`--once` prints one frame (plain text off a terminal, for a runbook or a ticket), `--json` that
frame as a document. Reads only (ops/top.py): it works as the read-only role."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from paygate_cli.commands._common import CHAIN_READ_SECRETS, JsonFlag, PlainFlag, get_env, open_db, output_mode
from paygate_cli.env import Env
from paygate_cli.errors import ExitCode, UsageError
from paygate_cli.ops.top import frame
from paygate_cli.output import Mode, ago_text, duration_text, emit

OnceFlag = Annotated[bool, typer.Option("--once", help="Print one frame and exit (plain text off a terminal).")]
IntervalOption = Annotated[float, typer.Option("--interval", help="Seconds between frames (live view).",
                                               min=0.2, max=3600.0)]

_QUIT_KEYS = (b"q", b"Q")


def top_command(ctx: typer.Context, once: OnceFlag = False, interval: IntervalOption = 2.0,
                json_flag: JsonFlag = False, plain_flag: PlainFlag = False) -> int:
    """A live view: queues (depth, oldest, rate), lanes with their in-flight lineage (state, age in
    ledgers, bid vs market), halts, the latest ledger and each RPC endpoint's lag, workers' last
    ticks, open findings. q or Ctrl-C quits. Reads only.

    Example: `paygate top`, or `paygate top --once > frame.txt` for a ticket."""
    env = get_env(ctx)
    env.use_only_secrets(*CHAIN_READ_SECRETS)
    mode = output_mode(json_flag, plain_flag)
    if mode is not Mode.HUMAN and not once:
        raise UsageError(f"--{mode.value} prints one frame: add --once", msgid="usage.top_needs_once")
    if not once and not env.stdout_isatty:
        raise UsageError("top refreshes in place on a terminal and stdout is not one: use --once for one frame",
                         msgid="usage.top_needs_tty")
    with open_db(env, "top", attempts=2) as conn:
        if once:
            _print_once(env, mode, frame(conn, env.settings))
            return ExitCode.OK
        return _live(env, conn, interval)


def _print_once(env: Env, mode: Mode, current: dict[str, Any]) -> None:
    if mode is Mode.HUMAN:
        console = _console(env)
        console.print(_view(current, live_interval=None))
        return
    emit(env, mode, {"top": current}, rows=_plain_rows(current), columns=["section", "name", "value", "detail"])


def _console(env: Env) -> Any:
    from rich.console import Console

    no_color = bool(env.environ.get("NO_COLOR") or env.environ.get("PAYGATE_NO_COLOR"))
    # Off a terminal (a ticket, a runbook's paste) there is no width to fit: never cut a lane's address.
    width = None if env.stdout_isatty else 200
    return Console(file=env.stdout, no_color=no_color, highlight=False, width=width)


def _live(env: Env, conn: Any, interval: float) -> int:
    """Frames every `interval` seconds until q or Ctrl-C (exit 0, the terminal as it was)."""
    import signal

    from rich.live import Live

    previous: dict[str, Any] | None = None
    taken_at: float | None = None
    # Ctrl-C leaves the view even when this process was started with SIGINT ignored (as a shell
    # script's background jobs are): Python then installs no KeyboardInterrupt handler of its own.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with _keys(env) as quit_pressed, Live(console=_console(env), screen=True, auto_refresh=False,
                                              redirect_stderr=False) as live:
            while True:
                started = env.monotonic()
                current = frame(conn, env.settings, previous, started - taken_at if taken_at is not None else None)
                live.update(_view(current, live_interval=interval), refresh=True)
                previous, taken_at = current, started
                if quit_pressed(max(0.0, interval - (env.monotonic() - started))):
                    return ExitCode.OK
    except KeyboardInterrupt:  # Ctrl-C is how a person leaves a live view: not an interruption
        # It may land between sending a query and reading its answer: the connection is then
        # mid-statement, and the commit on leaving open_db's block would fail ("another command is
        # already in progress": exit 69). A view has nothing to commit: close it as it stands.
        conn.close()
        return ExitCode.OK
    finally:
        signal.signal(signal.SIGINT, inherited)


@contextlib.contextmanager
def _keys(env: Env) -> Iterator[Any]:
    """A wait that returns True as soon as q is pressed: stdin in cbreak mode (keys one at a time,
    not echoed; Ctrl-C still signals), restored on the way out whatever happens. Without a TTY on
    stdin only Ctrl-C quits."""
    if not env.stdin_isatty:
        def sleep_only(seconds: float) -> bool:
            env.sleep(seconds)
            return False

        yield sleep_only
        return
    import select
    import termios
    import tty

    fd = env.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def quit_pressed(seconds: float) -> bool:
        ready, _, _ = select.select([fd], [], [], seconds)
        return bool(ready) and any(key in os.read(fd, 64) for key in _QUIT_KEYS)

    try:
        yield quit_pressed
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


# -- the frame as a person reads it -------------------------------------------------------------------

def _view(current: dict[str, Any], *, live_interval: float | None) -> Any:
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def table(title: str, *columns: str) -> Table:
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for column in columns:
            t.add_column(column, overflow="fold")
        return t

    chain = current["chain"]
    halts = current["halts"]
    heading = (f"paygate top  {current['at'].isoformat(timespec='seconds')}  latest ledger "
               f"{chain['latest_ledger'] if chain['latest_ledger'] is not None else 'unknown'}"
               + (f" (a majority reached {chain['quorum_ledger']})"
                  if chain.get("quorum_ledger") not in (None, chain["latest_ledger"]) else "")
               + ("  HALTED: " + ", ".join(h["kind"] for h in halts) if halts else "  no halt")
               + (f"  every {duration_text(live_interval)}, q quits" if live_interval else ""))
    parts: list[Any] = [Text(heading)]
    parts += [Text(f"halt {h['kind']} set by {h['set_by']}: {h['reason']}") for h in halts]
    parts += [Text(f"rpc: {problem}") for problem in chain["problems"]]

    queues = table("queues", "queue", "depth", "oldest", "rate/min")
    empty = 0
    for q in current["queues"]:
        if not q["depth"]:
            empty += 1
            continue
        rate = q["rate_per_min"]
        queues.add_row(q["queue"], str(q["depth"]), duration_text(q["oldest_age_s"]),
                       "-" if rate is None else f"{rate:+g}")
    parts.append(queues if queues.row_count else Text("queues: nothing waiting"))
    if empty and queues.row_count:
        parts.append(Text(f"({empty} empty queues not shown)"))

    market = current["fee_market"]
    lanes = table("lanes" + (f" (market {market['percentile']} {market['price']} stroops)" if market
                             else " (market price not read yet)"),
                  "lane", "status", "lineage", "state", "age", "bid vs market")
    for lane in current["lanes"]:
        lineage = lane["lineage"]
        if lineage is None:
            lanes.add_row(lane["lane"], lane["status"], "free", "", "", "")
            continue
        state = lineage["state"] + (" parked" if lineage["parked"] else "") + (" fee-capped" if lineage["fee_capped"]
                                                                               else "")
        age = (f"{lineage['age_ledgers']} ledgers" if lineage["age_ledgers"] is not None
               else duration_text(lineage["age_s"]))
        bid = ("-" if lineage["bid_rate"] is None else f"{lineage['bid_rate']}/op"
               + (f" ({lineage['bid_over_market']:+d})" if lineage["bid_over_market"] is not None else ""))
        lanes.add_row(lane["lane"], lane["status"], f"{lineage['id']} {lineage['entitlement']}", state, age, bid)
    parts.append(lanes if lanes.row_count else Text("lanes: none registered"))

    endpoints = table("rpc", "endpoint", "role", "status", "ledger", "lag")
    for e in chain["endpoints"]:
        endpoints.add_row(e["url"], e["role"], e["status"],
                          str(e["latest_ledger"]) if e.get("latest_ledger") is not None else "-",
                          str(e["lag_ledgers"]) if e.get("lag_ledgers") is not None else "-")
    parts.append(endpoints if endpoints.row_count else Text("rpc: not configured"))

    workers = table("workers", "worker", "liveness", "last tick", "outcome", "last success")
    for w in current["workers"]:
        if w["last_run_age_s"] is None and w["liveness"] == "never run":
            continue  # not deployed here (nothing waits for it): listed by `paygate workers`
        workers.add_row(w["worker"], w["liveness"] or "", ago_text(w["last_run_age_s"]),
                        (w["last_outcome"] or "") + (f": {w['last_error']}" if w["last_error"] else ""),
                        ago_text(w["last_success_age_s"]))
    parts.append(workers if workers.row_count else Text("workers: none has ticked"))

    findings = current["findings"]
    parts.append(Text("findings: " + (", ".join(f"{f['count']} {f['kind']}" for f in findings) if findings
                                      else "none open")))
    return Group(*parts)


def _plain_rows(current: dict[str, Any]) -> list[dict[str, Any]]:
    """--plain: one line per fact, `section name value detail`, for grep and awk."""
    chain = current["chain"]
    rows: list[dict[str, Any]] = [{"section": "chain", "name": "latest_ledger", "value": chain["latest_ledger"],
                                   "detail": f"majority reached {chain['quorum_ledger']}"
                                   if chain.get("quorum_ledger") is not None else ""}]
    rows += [{"section": "halt", "name": h["kind"], "value": "set", "detail": f"{h['reason']} (by {h['set_by']})"}
             for h in current["halts"]]
    rows += [{"section": "queue", "name": q["queue"], "value": q["depth"],
              "detail": f"oldest {q['oldest_age_s']}s" if q["oldest_age_s"] is not None else ""}
             for q in current["queues"]]
    for lane in current["lanes"]:
        lineage = lane["lineage"]
        rows.append({"section": "lane", "name": lane["lane"], "value": lineage["state"] if lineage else "free",
                     "detail": "" if lineage is None else
                     f"lineage {lineage['id']} {lineage['entitlement']} age {lineage['age_ledgers']} ledgers "
                     f"bid {lineage['bid_rate']} market {lineage['market_price']}"})
    rows += [{"section": "rpc", "name": e["url"], "value": e["status"],
              "detail": f"{e['role']} ledger {e.get('latest_ledger')} lag {e.get('lag_ledgers')}"}
             for e in chain["endpoints"]]
    rows += [{"section": "worker", "name": w["worker"], "value": w["liveness"],
              "detail": f"last tick {w['last_run_age_s']}s ago {w['last_outcome'] or ''}".rstrip()}
             for w in current["workers"]]
    rows += [{"section": "finding", "name": f["kind"], "value": f["count"], "detail": ""} for f in current["findings"]]
    return rows


def register(app: typer.Typer) -> None:
    app.command("top")(top_command)
