"""Readiness: DB, schema version, halts, advisory-lock holders, queue depths, and each worker's
liveness against its cadence (last run, last success, last outcome and its error)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from paygate_cli.catalogue import RESERVED_WORKER_IDS, WORKERS
from paygate_cli.db.connect import connection_target, no_writer_reason, server_role
from paygate_cli.db.locks import LOCK_NAMESPACE, MIGRATE_KEY, describe_key
from paygate_cli.db.migrate import schema_state
from paygate_cli.state import fee_market_state, list_halts, open_findings_summary, queue_depths, ttl_state
from paygate_cli.state import gas_state as gas

if TYPE_CHECKING:
    import psycopg

LOCK_HOLDERS_SQL = """
SELECT l.objid::bigint, a.pid, a.application_name, a.client_addr::text,
       extract(epoch FROM now() - a.backend_start)::float8
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.classid::bigint = %s AND l.objsubid = 2 AND l.granted
  -- advisory locks are server-wide in pg_locks: only this database's are ours
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY l.objid
"""
LAST_RUNS_SQL = """
SELECT w.worker,
       (SELECT max(finished_at) FROM paygate.worker_runs r WHERE r.worker = w.worker AND r.outcome = 'ok'),
       (SELECT outcome FROM paygate.worker_runs r WHERE r.worker = w.worker
        ORDER BY started_at DESC LIMIT 1),
       (SELECT max(started_at) FROM paygate.worker_runs r WHERE r.worker = w.worker),
       last_finished.outcome, last_finished.error, last_finished.finished_at,
       -- ages in DB time (rule 9): the host running `status` may not share the workers' clock
       extract(epoch FROM now() - (SELECT max(started_at) FROM paygate.worker_runs r
                                   WHERE r.worker = w.worker))::float8,
       extract(epoch FROM now() - (SELECT max(finished_at) FROM paygate.worker_runs r
                                   WHERE r.worker = w.worker AND r.outcome = 'ok'))::float8
FROM unnest(%s::text[]) AS w(worker)
LEFT JOIN LATERAL (
    SELECT outcome, error, finished_at FROM paygate.worker_runs r
    WHERE r.worker = w.worker AND r.finished_at IS NOT NULL
    ORDER BY r.finished_at DESC LIMIT 1
) AS last_finished ON true
"""

# Outcomes of a finished run that mean the worker is not doing its job ('stalled' has its own text).
_FAILING = ("error", "failed", "needs_human")
_SEED = re.compile(r"\bS[A-Z2-7]{55}\b")


# A lane whose resends are all refused (journal/rejections.py) is named with its evidence: its lag
# reads 0 and its ticks exit 0, so this line is what says the lane moves nothing.
REJECTION_FINDINGS_SQL = """
SELECT subject, details->>'code', details->>'consecutive_rejections', details->>'lineage_id'
FROM paygate.findings WHERE kind = 'repeated_rejection' AND resolved_at IS NULL ORDER BY subject
"""


def _rejection_problems(conn: psycopg.Connection, findings: list[dict[str, Any]]) -> list[str]:
    if not any(f["kind"] == "repeated_rejection" for f in findings):
        return []
    return [f"lane {lane}: sends rejected (ERROR {code} on {count} consecutive resends of lineage {lineage}; "
            f"see `paygate nonce-inspect --lane {lane}`)"
            for lane, code, count, lineage in conn.execute(REJECTION_FINDINGS_SQL)]


def redact(text: str | None) -> str | None:
    """A heartbeat's error as `status` may show it: every secret this process read, anything shaped
    like a Stellar seed, and every URL beyond its host removed (an RPC URL can carry an API key)."""
    if text is None:
        return None
    from paygate_cli.endpoints import redact_urls
    from paygate_cli.secrets import scrub

    return _SEED.sub("S***", redact_urls(scrub(text)))[:500]


def ago(seconds: float | None) -> str:
    """`12m ago`: a last run relative to now, as an operator reads it."""
    if seconds is None:
        return "never"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


# The runner names its lock connection `<prefix>:lock:<worker> pid=<OS pid> @<instance>`
# (ticks/runner.py); application_name is visible to every role, unlike backend_start.
_LOCK_APP = re.compile(r":lock:(?P<worker>\S+) pid=(?P<pid>\d+) @(?P<instance>.*)$")
# The holder's full instance id from its latest heartbeat (application_name is cut at 63 bytes).
HOLDER_INSTANCE_SQL = """
SELECT instance_id FROM paygate.worker_runs
WHERE worker = %s AND pid = %s AND slot = %s AND started_at > now() - interval '1 hour'
ORDER BY started_at DESC LIMIT 1
"""


def lock_holders(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Each advisory lock of this database's paygate namespace: the worker and slot, the instance and
    OS pid of the process holding it, the Postgres backend pid, and for how long (since the holder's
    lock connection opened: the runner takes the lock at once, waiting at most --lock-wait)."""
    names = {worker_id: name for name, worker_id in RESERVED_WORKER_IDS.items()}
    holders = []
    for objid, pid, app, client, age in conn.execute(LOCK_HOLDERS_SQL, (LOCK_NAMESPACE,)).fetchall():
        worker_id, slot = describe_key(int(objid))
        holder = "migrate" if objid == MIGRATE_KEY else names.get(worker_id, f"unknown:{objid}")
        named = _LOCK_APP.search(app or "")
        os_pid = int(named["pid"]) if named else None
        instance = named["instance"] if named else None
        if named and holder in WORKERS:
            row = conn.execute(HOLDER_INSTANCE_SQL, (holder, os_pid, slot)).fetchone()
            instance = row[0] if row else instance
        holders.append({"lock": holder, "slot": slot, "instance": instance, "os_pid": os_pid,
                        "backend_pid": pid, "pid": pid, "application_name": app, "client": client,
                        "held_for_s": round(age, 1) if age is not None else None,
                        "held_for": ago(age).removesuffix(" ago") if age is not None else None})
    return holders


def last_runs(conn: psycopg.Connection) -> list[dict[str, Any]]:
    rows = conn.execute(LAST_RUNS_SQL, (sorted(WORKERS),)).fetchall()
    return [{"worker": w, "last_success": s, "last_outcome": o, "last_started": st,
             "last_finished_outcome": fo, "stalled_reason": redact(err) if fo == "stalled" else None,
             "last_error": redact(err), "last_finished": ft,
             "last_run_age_s": round(age, 1) if age is not None else None,
             "last_success_age_s": round(sage, 1) if sage is not None else None,
             "last_run_ago": ago(age)}
            for w, s, o, st, fo, err, ft, age, sage in rows]


def liveness(runs: list[dict[str, Any]], depths: list[dict[str, Any]]) -> list[str]:
    """Judge each worker against its cadence (the registry's catalogue) and sets on each run its
    `liveness` and `cadence_s`; returns the problems. A worker is live when its last heartbeat
    started within `overdue_after` of now (a tick stuck that long is overdue too) and its last
    finished run did not fail; its last success is shown beside. A worker that never ran blocks only
    when work waits in one of its queues: with nothing waiting it is taken as not deployed here
    (shown, not a problem)."""
    waiting = {q["queue"]: q["depth"] for q in depths}
    problems: list[str] = []
    for run in runs:
        spec = WORKERS[run["worker"]]
        run["cadence_s"], grace = spec.cadence, spec.overdue_after
        fo, error = run["last_finished_outcome"], run["last_error"]
        if run["last_started"] is None:
            backlog = {q: waiting[q] for q in spec.queues if waiting.get(q)}
            run["liveness"] = "never run, work waiting" if backlog else "never run"
            if backlog:
                problems.append(f"{spec.name} has never run while work waits ("
                                + ", ".join(f"{n} in {q}" for q, n in backlog.items()) + ")")
            continue
        if fo in _FAILING:
            run["liveness"] = "cannot start" if (error or "").startswith("cannot start") else fo
            problems.append(f"{spec.name} last run {fo}: {error or 'no error recorded'}")
        elif fo == "stalled":
            run["liveness"] = "stalled"  # its problem is stated by readiness()
        elif run["last_run_age_s"] is not None and run["last_run_age_s"] > grace:
            run["liveness"] = "overdue"
            problems.append(f"{spec.name} overdue: last run {run['last_run_ago']} "
                            f"(cadence {spec.cadence:g}s, overdue after {grace:g}s)")
        else:
            run["liveness"] = "live"
    return problems


def workers_that_cannot_start(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Workers whose last finished run is the tick runner's "cannot start" record (its preflight
    found a setting or secret missing where the worker runs). Read from the heartbeats: the shell
    running `status` holds none of the fleet's secrets, and needs none."""
    return [{"worker": run["worker"], "error": run["last_error"], "since": run["last_finished"]}
            for run in runs
            if run["last_finished_outcome"] == "error" and (run["last_error"] or "").startswith("cannot start")]


def fee_market(conn: psycopg.Connection, settings: Any = None) -> tuple[dict[str, Any], list[str]]:
    """The fee market block of `status` and its problems. Fee-capped work is stalled work (its
    paths' ticks exit 1 with the stall reason), so, like a stalled worker, it makes `status` not
    ready: one problem per path, naming the rate it needs and the cap. A price never read is "not
    read yet", never a price of 0; an old price is shown with its age, not a problem of its own
    (the signing ticks fall back to it, never lower; PaygateFeeMarketStale alerts on it)."""
    state = fee_market_state(conn)
    market = state["market"]
    cap = getattr(settings, "max_inclusion_fee", None) if settings is not None else None
    block: dict[str, Any] = {
        "status": "read" if market else "not read yet",
        "percentile": market["percentile"] if market else getattr(settings, "fee_percentile", None),
        "price": market["price"] if market else None,
        "max_fee": market["max_fee"] if market else None,
        "ledger": market["ledger"] if market else None,
        "endpoint": market["endpoint"] if market else None,
        "read_at": market["read_at"] if market else None,
        "age_s": market["age_s"] if market else None,
        "cap": cap,  # PAYGATE_MAX_INCLUSION_FEE: stroops per operation (a relay is also bounded by its reservation)
        "fee_capped": sum(p["fee_capped"] for p in state["paths"]),
        "paths": state["paths"],
    }
    problems = []
    for path in state["paths"]:
        if not path["fee_capped"]:
            continue
        market_text = (f"market {block['percentile']} {block['price']}" if market
                       else "market price not read yet")
        problems.append(f"{path['fee_capped']} {path['path']} unit(s) fee-capped for "
                        f"{ago(path['since_age_s']).removesuffix(' ago')}: {market_text}, needs up to "
                        f"{path['highest_required']} > cap {path['allowed']} stroops/op (waiting, nothing "
                        f"failed; see runbooks/fee-capped.md)")
    return block, problems


def ttl(conn: psycopg.Connection, settings: Any = None) -> tuple[dict[str, Any], list[str]]:
    """The state archival block of `status` (workers/ttl.py, docs/architecture.md §6 "TTL keeper"):
    the nearest expiry of what the keeper keeps alive (what, whose, in ledgers and days), the entries
    per state, today's rent against the budget and what it left unextended, the open extend/restore
    jobs (a restore a money path waits on names who asked), and the entries that need a human, each
    with its key. Those and the jobs asking a human make `status` not ready; a keeper that left
    entries unextended says so as its stall."""
    from paygate_cli.settings import LEDGER_SECONDS, ledgers

    state = ttl_state(conn)
    nearest = state["nearest"]
    if nearest is not None and nearest["ledgers_left"] is not None:
        nearest["days_left"] = round(nearest["ledgers_left"] * LEDGER_SECONDS / 86400, 1)
    threshold = getattr(settings, "ttl_threshold", None) if settings is not None else None
    block: dict[str, Any] = {
        **state,
        "threshold_ledgers": ledgers(float(threshold)) if threshold is not None else None,
        "rent_budget": getattr(settings, "ttl_rent_budget", None) if settings is not None else None,
        "restores_pending": [j for j in state["jobs"] if j["kind"] == "restore" and j["status"] == "pending"],
    }
    problems = []
    if state["needs_human"]:
        first, count = state["needs_human"][0], len(state["needs_human"])
        whose = f" of {first['account']}" if first["account"] else ""
        problems.append(f"{count} kept ledger entr{'y needs' if count == 1 else 'ies need'} a human (the first: "
                        f"{first['kind']}{whose}: {first['reason']}; see runbooks/contract-ttl.md)")
    problems += [f"ttl job {j['id']} ({j['kind']}, asked by {j['requested_by']}) needs a human: {j['reason']}"
                 for j in state["jobs"] if j["status"] == "needs_human"]
    return block, problems


def rpc_endpoints(settings: Any) -> list[tuple[str, str]]:
    """(role, URL) of the write endpoint and the distinct read endpoints, as the chain client counts
    them; [] without RPC configured."""
    if not settings.rpc_url:
        return []
    from paygate_cli.settings import distinct_read_urls

    return [("write", settings.rpc_url),
            *[("read", u) for u in distinct_read_urls(list(settings.rpc_read_urls), settings.rpc_url)]]


def distinct_rpc_urls(settings: Any) -> list[str]:
    """The URLs `status` asks: each once, though the write URL is often a read URL as well."""
    return list(dict.fromkeys(_url_key(url) for _, url in rpc_endpoints(settings)))


def _url_key(url: str) -> str:
    from paygate_cli.errors import ConfigError
    from paygate_cli.settings import normalise_rpc_url

    try:
        return normalise_rpc_url(url)
    except ConfigError:
        return url  # asked as it is: the failure is then that endpoint's finding


def _probe_failure(exc: Exception) -> str:
    from paygate_cli.chain.health import RpcTimeout
    from paygate_cli.endpoints import redact_urls

    if isinstance(exc, RpcTimeout):
        return str(exc)  # "getHealth timed out after 10s": the endpoint is named beside it, by host
    return f"{type(exc).__name__}: {redact_urls(str(exc))}"[:200]


def rpc_health(settings: Any) -> dict[str, Any]:
    """Each RPC endpoint's getHealth, latest ledger and network; lag is measured against the
    furthest one. Every distinct URL is asked once per method, all of them at once (threads): a slow
    or dead endpoint costs `status` one RPC timeout, not one per endpoint and method, and never
    holds a Ctrl-C."""
    endpoints_of = rpc_endpoints(settings)
    if not endpoints_of:
        return {"configured": False, "endpoints": [], "problems": []}
    from paygate_cli.chain.health import get_health, get_network_passphrase
    from paygate_cli.chain.threads import ask_at_once
    from paygate_cli.endpoints import endpoint_name

    urls = {_url_key(url): url for _, url in reversed(endpoints_of)}  # each key -> its first spelling
    calls = {"health": get_health, "network": get_network_passphrase}

    def ask(key: str, call: str) -> tuple[Any, str | None]:
        try:
            return calls[call](urls[key], settings.rpc_timeout), None
        except Exception as exc:  # any failure of one endpoint is a finding, not a crash of status
            return None, _probe_failure(exc)

    answers = ask_at_once({(key, call): lambda key=key, call=call: ask(key, call) for key in urls for call in calls})
    endpoints: list[dict[str, Any]] = []
    for role, url in endpoints_of:
        key, name = _url_key(url), endpoint_name(url)  # shown by host only: a URL may carry a provider's API key
        (health, health_error), (network, network_error) = answers[(key, "health")], answers[(key, "network")]
        error = health_error or network_error
        if error is not None:
            endpoints.append({"role": role, "url": name, "status": "unreachable", "error": error})
            continue
        endpoints.append({"role": role, "url": name, "status": health.status, "latest_ledger": health.latest_ledger,
                          "oldest_ledger": health.oldest_ledger, "network_passphrase": network})
        # A healthy node of another network (mainnet vs a local one) answers everything: compare.
        if network != settings.network_passphrase:
            endpoints[-1]["status"] = "wrong network"
    furthest = max((e["latest_ledger"] for e in endpoints if e.get("latest_ledger")), default=None)
    problems = []
    for endpoint in endpoints:
        if endpoint.get("latest_ledger") is not None and furthest is not None:
            endpoint["lag_ledgers"] = furthest - endpoint["latest_ledger"]
        if endpoint["status"] == "wrong network":
            problems.append(f"RPC {endpoint['role']} endpoint {endpoint['url']} serves "
                            f"{endpoint['network_passphrase']!r}, not the configured network "
                            f"{settings.network_passphrase!r} (PAYGATE_NETWORK_PASSPHRASE)")
        elif endpoint["status"] == "unreachable":
            problems.append(f"RPC {endpoint['role']} endpoint {endpoint['url']} is unreachable: {endpoint['error']}")
        elif endpoint["status"] != "healthy":
            problems.append(f"RPC {endpoint['role']} endpoint {endpoint['url']} is {endpoint['status']}")
    quorum, quorum_problems = read_quorum(endpoints)
    return {"configured": True, "endpoints": endpoints, "quorum": quorum, "problems": problems + quorum_problems}


# Read hosts asked at once answer within a ledger or two of each other; one further than this from
# what a majority reached disagrees with it (a stuck, lying, forked or other network's node).
DISAGREE_AFTER_LEDGERS = 10


def read_quorum(endpoints: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """What the money movers' quorum read of the latest ledger would decide from these answers
    (chain/health.py ledger_quorum, the rule ChainClient.latest_ledger_quorum applies): the ledger a
    majority of the distinct read hosts reached, the highest claimed, what each host said, and which
    hosts disagree with the majority (further than DISAGREE_AFTER_LEDGERS from it, `ahead` or
    `behind`). No decision (fewer than a majority answered with a ledger) is a problem naming what
    each said (with several read hosts); a host ahead of the majority is one too (a lagging host only
    delays decisions: shown).
    An endpoint on another network counts as no answer (its ledgers are another chain's)."""
    from paygate_cli.chain.health import ledger_quorum

    reads = [e for e in endpoints if e["role"] == "read"]
    counted = [e for e in reads if e["status"] not in ("unreachable", "wrong network") and e.get("latest_ledger")]
    decision = ledger_quorum([e["latest_ledger"] for e in counted], len(reads))
    said = [{"url": e["url"], "latest_ledger": e.get("latest_ledger") if e in counted else None,
             "said": (f"ledger {e['latest_ledger']}" if e in counted
                      else e.get("error") or f"{e['status']} (ledger {e.get('latest_ledger')})")} for e in reads]
    disagreeing = []
    for answer in said:
        if decision.ledger is None or answer["latest_ledger"] is None:
            continue
        apart = answer["latest_ledger"] - decision.ledger
        if abs(apart) > DISAGREE_AFTER_LEDGERS:
            disagreeing.append({**answer, "side": "ahead" if apart > 0 else "behind", "by_ledgers": abs(apart)})
    quorum = {"read_hosts": decision.hosts, "need": decision.need, "answered": decision.answered,
              "decided": decision.ledger is not None, "ledger": decision.ledger, "highest": decision.highest,
              "answers": said, "disagreeing": disagreeing}
    problems = []
    # With one read host its own problem (unreachable, wrong network) says it all; with several the
    # consequence is news: the money movers cannot decide anything.
    if len(reads) > 1 and decision.ledger is None:
        problems.append(f"RPC read quorum cannot decide the latest ledger: {decision.answered} of {decision.hosts} "
                        f"read hosts answered, a decision needs {decision.need} ("
                        + "; ".join(f"{a['url']}: {a['said']}" for a in said) + ")")
    problems += [f"RPC read endpoint {d['url']} says ledger {d['latest_ledger']}, {d['by_ledgers']} ahead of "
                 f"ledger {decision.ledger} that {decision.need} of {decision.hosts} read hosts reached (a lying, "
                 f"forked or misconfigured node; decisions follow the majority)"
                 for d in disagreeing if d["side"] == "ahead"]
    return quorum, problems


def readiness(conn: psycopg.Connection, settings: Any = None) -> dict[str, Any]:
    schema = schema_state(conn)
    problems: list[str] = []
    if schema["message"]:
        problems.append(f"schema behind: {schema['message']}")
    elif schema["pending"]:
        problems.append(f"schema behind: {len(schema['pending'])} migration(s) pending (run `paygate migrate`)")
    # Reported by the server at login: no round trip (the same text as SHOW server_version).
    server_version = conn.info.parameter_status("server_version") or conn.execute("SHOW server_version").fetchone()[0]
    # Which host of a (multi-host) DSN answered, and whether it can be written: a standby answers
    # `status` (it only reads) but no tick can run on it.
    target, role = connection_target(conn), server_role(conn)
    no_writer = no_writer_reason(conn, role)
    if no_writer:
        problems.append(no_writer)
    report: dict[str, Any] = {
        "ready": False,
        "problems": problems,
        "database": {"reachable": True, "server_version": server_version, "host": target["host"],
                     "port": target["port"], "writer": role["writer"], "in_recovery": role["in_recovery"],
                     "read_only": role["read_only"],
                     "note": "advisory locks need a direct or session-pooled connection "
                             "(not PgBouncer transaction pooling)"},
        "schema": schema,
        "halts": [], "locks": lock_holders(conn), "queues": [], "workers": [], "drains": [], "findings": [],
        "cannot_work": [],
    }
    if schema["schema_version"] == 0:
        return report  # nothing else exists to look at yet
    if settings is not None:
        report["rpc"] = rpc_health(settings)
        problems += report["rpc"]["problems"]
    tolerated = _missing_object_errors() if schema["message"] else ()
    try:
        report["halts"] = list_halts(conn)
        problems += [f"{h['kind']} halt set by {h['set_by']}: {h['reason']}" for h in report["halts"]]
        from paygate_cli.ops.drain import drained

        report["drains"] = drained(conn)  # one drained instance or lane is deliberate: shown, not a problem
        problems += capacity_problems(conn)  # but none left to take new work is
        report["findings"] = open_findings_summary(conn)
        problems += [f"{f['count']} open {f['kind']} finding(s) (see `paygate reconcile-report`)"
                     for f in report["findings"] if f["kind"] != "repeated_rejection"]
        problems += _rejection_problems(conn, report["findings"])
        report.update(queues=queue_depths(conn), workers=last_runs(conn), gas=gas(conn))
        report["fee_market"], fee_problems = fee_market(conn, settings)
        problems += fee_problems
        report["ttl"], ttl_problems = ttl(conn, settings)
        problems += ttl_problems
        report["cannot_work"] = workers_that_cannot_start(report["workers"])  # liveness() names their problem
    except tolerated as exc:
        # A schema behind this build may lack what these read; the report already says why (not ready).
        report["incomplete"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
        return report
    problems += [f"{w['worker']} stalled: {w['stalled_reason'] or 'no reason recorded'}"
                 for w in report["workers"] if w["last_finished_outcome"] == "stalled"]
    problems += liveness(report["workers"], report["queues"])
    report["ready"] = not problems
    return report


# The lanes the signing workers registered, and the hosts that ticked in the last hour (an instance
# gone for longer is a host taken out of service, not capacity).
CAPACITY_SQL = """
SELECT (SELECT count(*) FROM paygate.lanes WHERE status <> 'retired'),
       (SELECT count(*) FROM paygate.lanes WHERE status = 'active'),
       (SELECT count(*) FROM paygate.instances WHERE last_seen > now() - interval '1 hour'),
       (SELECT count(*) FROM paygate.instances WHERE last_seen > now() - interval '1 hour' AND drained_at IS NULL)
"""


def capacity_problems(conn: psycopg.Connection) -> list[str]:
    """What leaves new work with nowhere to go: no lane that can be allocated (every registered lane
    drained or fenced), or every host that ticks here drained. Before any worker registered a lane
    or ticked there is nothing to judge (a new deployment)."""
    lanes, active, instances, undrained = conn.execute(CAPACITY_SQL).fetchone()
    problems = []
    if lanes and not active:
        problems.append(f"no lane can be allocated: all {lanes} registered lane(s) are drained or fenced "
                        "(see `paygate nonce-inspect`)")
    if instances and not undrained:
        problems.append(f"every instance is drained: none of the {instances} host(s) that ticked in the last "
                        "hour takes new work (`paygate undrain --instance ID`)")
    return problems


def _missing_object_errors() -> tuple[type[Exception], ...]:
    import psycopg

    return (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn, psycopg.errors.UndefinedFunction)


def unreachable(error: str) -> dict[str, Any]:
    """The report when the database cannot be reached: still a document (a probe parsing `--json`
    must get one), not ready, with the reason."""
    # libpq refusing every listed host as read-only is no writer, not an unreachable server.
    problem = error if error.startswith("no writer:") else f"database unreachable: {error}"
    report: dict[str, Any] = {
        "ready": False, "problems": [problem],
        "database": {"reachable": False, "error": error},
        "schema": None, "halts": [], "locks": [], "queues": [], "workers": [], "cannot_work": [],
    }
    return report
