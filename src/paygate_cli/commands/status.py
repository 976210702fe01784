"""`paygate status`: readiness at a glance; exit 1 when not ready, 69 when the DB is unreachable."""

from __future__ import annotations

import typer

from paygate_cli.commands._common import JsonFlag, PlainFlag, get_env, output_mode
from paygate_cli.db.connect import connect
from paygate_cli.errors import DatabaseAuthFailed, ExitCode, Unavailable
from paygate_cli.ops.status import ago, readiness, unreachable
from paygate_cli.output import Mode, emit


def status_command(ctx: typer.Context, json_flag: JsonFlag = False, plain_flag: PlainFlag = False) -> int:
    """Readiness: DB, schema, RPC and network, halts, lock holders, queue depths, each worker's liveness.

    Example: `paygate status --json | jq .status.problems` (exit 1 when not ready)."""
    env = get_env(ctx)
    mode = output_mode(json_flag, plain_flag)
    try:
        with connect(env.settings, "status", attempts=2) as conn:
            report = readiness(conn, env.settings)
    except (Unavailable, DatabaseAuthFailed) as exc:
        # Still print the document (not ready, with the reason), then end with the error's own code.
        report = unreachable(str(exc), env.settings)
        emit(env, mode, {"status": report}, rows=[{"check": "ready", "value": False,
                                                   "detail": "; ".join(report["problems"])}],
             columns=["check", "value", "detail"],
             lines=[] if mode is not Mode.HUMAN else ["NOT READY: " + "; ".join(report["problems"])])
        raise
    rows = [{"check": "ready", "value": report["ready"], "detail": "; ".join(report["problems"])},
            {"check": "schema", "value": report["schema"]["schema_version"],
             "detail": f"expected {report['schema']['expected_version']}"}]
    rows += [{"check": f"halt:{h['kind']}", "value": "set", "detail": f"{h['reason']} (by {h['set_by']})"}
             for h in report["halts"]]
    rows += [{"check": f"drained:{d['kind']}", "value": d["target"],
              "detail": f"{d['reason'] or ''} (by {d['drained_by']})"} for d in report.get("drains", [])]
    rows += [{"check": f"findings:{f['kind']}", "value": f["count"], "detail": f"oldest {f['oldest']}"}
             for f in report.get("findings", [])]
    rows += [{"check": f"queue:{q['queue']}", "value": q["depth"],
              "detail": f"oldest {q['oldest_age_s']}s" if q["oldest_age_s"] is not None else ""}
             for q in report["queues"]]
    if report.get("gas", {}).get("level"):
        g = report["gas"]
        rows.append({"check": "gas", "value": g["level"], "detail": f"headroom {g['headroom']} stroops, "
                     f"fees reserved {g['fees_reserved']}, settled {g['fees_settled']}"
                     + (f", {len(g['low_lanes'])} lane(s) low" if g["low_lanes"] else "")})
    rows += [{"check": f"rpc:{e['role']}", "value": e["status"],
              "detail": f"{e['url']} ledger {e.get('latest_ledger')} lag {e.get('lag_ledgers')}"}
             for e in report.get("rpc", {}).get("endpoints", [])]
    rows += [{"check": f"lock:{lock['lock']}", "value": f"{lock['instance'] or '?'} pid {lock['os_pid'] or '?'}",
              "detail": f"slot {lock['slot']}, backend pid {lock['backend_pid']}, held "
                        f"{lock['held_for'] or '(hidden from this role)'}, {lock['application_name']}"}
             for lock in report["locks"]]
    rows += [{"check": f"cannot_work:{w['worker']}", "value": "missing", "detail": ", ".join(w["missing"])}
             for w in report.get("cannot_work", [])]
    rows += [{"check": f"worker:{w['worker']}", "value": w.get("liveness") or w["last_outcome"] or "never run",
              "detail": f"last run {w['last_run_ago']}, last success {ago(w['last_success_age_s'])}"
                        f" (cadence {w.get('cadence_s', '?')}s)"
                        + (f"; {w['last_finished_outcome']}: {w['last_error']}"
                           if w["last_error"] and w["last_finished_outcome"] != "ok" else "")}
             for w in report["workers"]]
    lines = [] if mode is not Mode.HUMAN else [
        "READY" if report["ready"] else "NOT READY: " + "; ".join(report["problems"])]
    emit(env, mode, {"status": report}, rows=rows, columns=["check", "value", "detail"], lines=lines)
    return ExitCode.OK if report["ready"] else ExitCode.FAILED


def register(app: typer.Typer) -> None:
    app.command("status")(status_command)
