"""`paygate status`: readiness at a glance; exit 1 when not ready, 69 when the DB is unreachable."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from typing import Any

import typer

from paygate_cli.commands._common import (
    CHAIN_READ_SECRETS,
    JsonFlag,
    PlainFlag,
    get_env,
    open_db,
    output_mode,
    target_detail,
    target_line,
    target_of,
)
from paygate_cli.env import Env
from paygate_cli.errors import DatabaseAuthFailed, DatabaseConfigInvalid, ExitCode, Unavailable
from paygate_cli.ops.status import ago, distinct_rpc_urls, readiness, unreachable
from paygate_cli.output import Mode, asset_amount, duration_text, emit


def status_command(ctx: typer.Context, json_flag: JsonFlag = False, plain_flag: PlainFlag = False) -> int:
    """Readiness: DB, schema, RPC and network, halts, lock holders, queue depths, each worker's liveness,
    gas, the fee market (the last price read, the cap, fee-capped units per path; each unit with --wide), and
    state archival (the nearest expiry of what the TTL keeper keeps alive, rent, restores waiting).

    Example: `paygate status --json | jq .status.problems` (exit 1 when not ready)."""
    env = get_env(ctx)
    env.use_only_secrets(*CHAIN_READ_SECRETS)
    mode = output_mode(json_flag, plain_flag)
    try:
        with open_db(env, "status", attempts=2) as conn, _progress(env, mode):
            report = readiness(conn, env.settings)
            report["target"] = target_of(env, conn)  # which database this is: never a reassuring answer from another
    except (Unavailable, DatabaseAuthFailed, DatabaseConfigInvalid) as exc:
        # Still print the document (not ready, with the reason), then end with the error's own code.
        report = unreachable(str(exc))
        report["target"] = target_of(env)
        emit(env, mode, {"status": report}, rows=[{"check": "ready", "value": False,
                                                   "detail": "; ".join(report["problems"])},
                                                  _target_row(report["target"])],
             columns=["check", "value", "detail"],
             lines=[] if mode is not Mode.HUMAN else ["NOT READY: " + "; ".join(report["problems"]),
                                                      target_line(report["target"])])
        raise
    database_row = _database_row(report["database"])
    rows = [{"check": "ready", "value": report["ready"], "detail": "; ".join(report["problems"])},
            _target_row(report["target"]), database_row,
            {"check": "schema", "value": report["schema"]["schema_version"],
             "detail": f"expected {report['schema']['expected_version']}"}]
    rows += [{"check": f"halt:{h['kind']}", "value": "set", "detail": f"{h['reason']} (by {h['set_by']})"}
             for h in report["halts"]]
    rows += [{"check": f"drained:{d['kind']}", "value": d["target"],
              "detail": f"{d['reason'] or ''} (by {d['drained_by']})"} for d in report.get("drains", [])]
    rows += [{"check": f"findings:{f['kind']}", "value": f["count"], "detail": f"oldest {_when(f['oldest'])}"}
             for f in report.get("findings", [])]
    rows += [{"check": f"queue:{q['queue']}", "value": q["depth"],
              "detail": f"oldest waiting {duration_text(q['oldest_age_s'])}" if q["oldest_age_s"] is not None else ""}
             for q in report["queues"]]
    if report.get("gas", {}).get("level"):
        g = report["gas"]
        rows.append({"check": "gas", "value": g["level"], "detail": f"headroom {_xlm(g['headroom'])}, "
                     f"fees reserved {_xlm(g['fees_reserved'])}, committed by in-flight lineages at their cap "
                     f"{_xlm(g['committed_fees'])}, settled {_xlm(g['fees_settled'])}"
                     + (f", {len(g['low_lanes'])} lane(s) low" if g["low_lanes"] else "")})
    if "fee_market" in report:
        rows += _fee_market_rows(report["fee_market"], wide=env.wide)
    if "ttl" in report:
        rows += _ttl_rows(report["ttl"], wide=env.wide)
    rows += [{"check": f"rpc:{e['role']}", "value": e["status"],
              "detail": f"{e['url']} " + (f"ledger {e['latest_ledger']} lag {e.get('lag_ledgers', 0)}"
                                          if e.get("latest_ledger") is not None else "no ledger")}
             for e in report.get("rpc", {}).get("endpoints", [])]
    if report.get("rpc", {}).get("quorum", {}).get("read_hosts"):
        rows.append(_quorum_row(report["rpc"]["quorum"]))
    rows += [{"check": f"lock:{lock['lock']}", "value": f"{lock['instance'] or '?'} pid {lock['os_pid'] or '?'}",
              "detail": f"slot {lock['slot']}, backend pid {lock['backend_pid']}, held "
                        f"{lock['held_for'] or '(hidden from this role)'}, {lock['application_name']}"}
             for lock in report["locks"]]
    rows += [{"check": f"cannot_start:{w['worker']}", "value": "cannot start", "detail": w["error"]}
             for w in report.get("cannot_work", [])]
    rows += [{"check": f"worker:{w['worker']}", "value": w.get("liveness") or w["last_outcome"] or "never run",
              "detail": f"last run {w['last_run_ago']}, last success {ago(w['last_success_age_s'])}"
                        f" (cadence {duration_text(w['cadence_s']) if w.get('cadence_s') else '?'})"
                        + (f"; {w['last_finished_outcome']}: {w['last_error']}"
                           if w["last_error"] and w["last_finished_outcome"] != "ok" else "")}
             for w in report["workers"]]
    lines = [] if mode is not Mode.HUMAN else [
        "READY" if report["ready"] else "NOT READY: " + "; ".join(report["problems"]), target_line(report["target"]),
        f"database: {database_row['value']}, {database_row['detail']}"]
    emit(env, mode, {"status": report}, rows=rows, columns=["check", "value", "detail"], lines=lines)
    return ExitCode.OK if report["ready"] else ExitCode.FAILED


def _progress(env: Env, mode: Mode) -> AbstractContextManager[object]:
    """A spinner on stderr while the endpoints answer (each may take up to PAYGATE_RPC_TIMEOUT), for
    a person at a terminal only: never with --json or --plain, never into a pipe or a log."""
    if mode is not Mode.HUMAN or not env.stderr_isatty:
        return nullcontext()
    from rich.console import Console

    count = len(distinct_rpc_urls(env.settings))
    what = (f"asking {count} RPC endpoint{'s' if count != 1 else ''} and the database" if count
            else "asking the database")
    return Console(file=env.stderr).status(f"{what}…", spinner="dots")


def _quorum_row(quorum: dict[str, Any]) -> dict[str, object]:
    """What the money movers' quorum read of the latest ledger decides from these answers; when it
    cannot decide, or a host disagrees with the majority, what each read host said."""
    counted = f"{quorum['answered']} of {quorum['read_hosts']} read hosts answered, a decision needs {quorum['need']}"
    if not quorum["decided"]:
        return {"check": "rpc:quorum", "value": "no decision",
                "detail": f"{counted}: " + "; ".join(f"{a['url']}: {a['said']}" for a in quorum["answers"])}
    detail = f"{counted}, highest claimed {quorum['highest']}"
    if quorum["disagreeing"]:
        detail += "; disagreeing: " + "; ".join(f"{d['url']} says {d['latest_ledger']} ({d['by_ledgers']} "
                                                f"{d['side']})" for d in quorum["disagreeing"])
    return {"check": "rpc:quorum", "value": f"ledger {quorum['ledger']}", "detail": detail}


def _database_row(database: dict[str, Any]) -> dict[str, object]:
    """Which host and port answered (of a multi-host DSN, the one reached) and whether it is the writer."""
    role = ("writer" if database["writer"] else "standby in recovery (read-only, no writer)"
            if database["in_recovery"] else "read-only (no writer)")
    return {"check": "database", "value": role,
            "detail": f"host {database['host'] or '(libpq default)'} port {database['port'] or '5432'}, "
                      f"PostgreSQL {database['server_version']}"}


def _target_row(target: dict[str, object]) -> dict[str, object]:
    return {"check": "target", "value": target.get("context") or target.get("database"),
            "detail": target_detail(target)}


def _fee_market_rows(fee: dict[str, Any], *, wide: bool) -> list[dict[str, object]]:
    """The last price read and the cap; per path its fee-capped units (count, highest rate needed vs
    allowed, since when); with --wide each unit too (its --json has them always)."""
    cap = f"cap {_rate(fee['cap'])}" if fee["cap"] is not None else "cap unknown"
    if fee["price"] is None:
        rows: list[dict[str, object]] = [{"check": "fee_market", "value": "not read yet",
                                          "detail": f"no getFeeStats price read yet ({fee['percentile']}); {cap}"}]
    else:
        rows = [{"check": "fee_market", "value": f"{fee['percentile']} {fee['price']}",
                 # getFeeStats' figure is a Soroban transaction's whole inclusion fee (docs/architecture.md §4)
                 "detail": f"{_xlm(fee['price'])} a transaction, read {ago(fee['age_s'])} at ledger "
                           f"{fee['ledger']} from {fee['endpoint']}; {cap}"}]
    for path in fee["paths"]:
        if path["fee_capped"]:
            rows.append({"check": f"fee_capped:{path['path']}", "value": path["fee_capped"],
                         "detail": f"needs up to {_rate(path['highest_required'])}, allowed "
                                   f"{_rate(path['allowed'])}, since {ago(path['since_age_s'])}"
                                   + ("" if wide else " (--wide: each unit)")})
        if wide:
            rows += [{"check": f"fee_capped:{path['path']}:{unit['lineage_id']}", "value": unit["entitlement"],
                      "detail": f"lineage {unit['lineage_id']}: bid {_rate(unit['bid_rate'])}, needs "
                                f"{_rate(unit['fee_required'])}, allowed {_rate(unit['cap_rate'])}, since "
                                f"{ago(unit['fee_capped_age_s'])}"}
                     for unit in path["units"]]
    return rows


def _ttl_rows(ttl: dict[str, Any], *, wide: bool) -> list[dict[str, object]]:
    """State archival: the nearest expiry (what, whose, in ledgers and days), entries per state,
    today's rent against the budget, the restores money waits on (who asked), each entry asking a
    human with its key; every open job with --wide (its --json has them always)."""
    nearest, entries, rent = ttl["nearest"], ttl["entries"], ttl["rent"]
    threshold = f"threshold {ttl['threshold_ledgers']} ledgers" if ttl.get("threshold_ledgers") else "threshold ?"
    if nearest is None:
        rows: list[dict[str, object]] = [{"check": "ttl:nearest", "value": "none read",
                                          "detail": f"no kept ledger entry read live yet; {threshold}"}]
    else:
        whose = f" of {nearest['account']}" if nearest["account"] else ""
        days = f" (~{nearest['days_left']} days)" if nearest.get("days_left") is not None else ""
        rows = [{"check": "ttl:nearest", "value": f"{nearest['ledgers_left']} ledgers",
                 "detail": f"{nearest['kind']}{whose} live until ledger {nearest['live_until']}{days}; {threshold}"}]
    rows.append({"check": "ttl:entries", "value": f"{entries['live']} live",
                 "detail": ", ".join(f"{n} {state}" for state, n in entries.items() if state != "live")})
    budget = _xlm(ttl["rent_budget"]) if ttl.get("rent_budget") is not None else "unknown"
    rows.append({"check": "ttl:rent", "value": _xlm(rent["spent"]),
                 "detail": f"today (UTC) in {rent['transactions']} transaction(s), budget {budget}"
                           + (f"; {rent['left_unextended']} entries left unextended" if rent["left_unextended"]
                              else "")})
    for job in ttl["jobs"]:
        if not (wide or job["kind"] == "restore" or job["status"] == "needs_human"):
            continue
        rows.append({"check": f"ttl_job:{job['id']}", "value": f"{job['kind']} {job['status']}",
                     "detail": f"{job['keys']} key(s), asked by {job['requested_by']} {ago(job['age_s'])}, "
                               f"{job['attempts']} attempt(s)"
                               + (f", lineage {job['lineage_id']} {job['lineage_state']}" if job["lineage_id"] else "")
                               + (f": {job['reason']}" if job["reason"] else "")})
    extends = sum(1 for job in ttl["jobs"] if job["kind"] == "extend" and job["status"] == "pending")
    if extends and not wide:
        rows.append({"check": "ttl_jobs:extend", "value": extends, "detail": "open extend jobs (--wide: each)"})
    rows += [{"check": f"ttl_needs_human:{entry['kind']}", "value": entry["account"] or entry["kind"],
              "detail": entry["reason"]} for entry in ttl["needs_human"]]
    return rows


def _rate(stroops: object) -> str:
    """A bid rate: stroops per operation, with its XLM value."""
    return "unknown" if stroops is None else f"{_xlm(stroops)}/op"


def _xlm(stroops: object) -> str:
    """Fee amounts are XLM stroops: both forms, or "unknown" (never Python's None)."""
    return "unknown" if stroops is None else f"{stroops} stroops ({asset_amount(stroops, 'XLM')})"


def _when(moment: object) -> str:
    return "unknown" if moment is None else moment.isoformat(timespec="seconds") if isinstance(moment, datetime) \
        else str(moment)


def register(app: typer.Typer) -> None:
    app.command("status")(status_command)
