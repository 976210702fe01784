"""`drain` / `undrain`: drained lanes get no allocations, a drained instance's ticks claim nothing
new, `--wait` returns 0 when in-flight work finishes and 75 on timeout, audited, shown in status."""

from __future__ import annotations

import json
import threading
import time

import psycopg

from paygate_cli.journal import lineage as lineages
from tests.support.cli import run_cli, run_proc, spawn
from tests.support.webhooks import held_webhook, seen

LANE_A = "G" + "A" * 55
LANE_B = "G" + "B" * 55


def lanes(db: psycopg.Connection) -> None:
    db.execute("INSERT INTO paygate.lanes (address) VALUES (%s), (%s)", (LANE_A, LANE_B))


def held_relay(db: psycopg.Connection, owner: str) -> int:
    return db.execute(
        "INSERT INTO paygate.relays (account, contract, function, args_xdr, auth_entries, auth_nonces, "
        "auth_expiration_ledger, max_fee, idempotency_key, lease_token, lease_expires_at, claimed_by, attempts) "
        "VALUES (%s, %s, 'f', 'AAAAEAAAAAEAAAAA', ARRAY['e'], ARRAY[1::bigint], 100, 1000, 'relay-held', "
        "gen_random_uuid(), now() + interval '30 seconds', %s, 1) RETURNING id",
        ("G" + "D" * 55, "C" + "D" * 55, owner)).fetchone()[0]


def held_bot_job(db: psycopg.Connection, owner: str) -> int:
    return db.execute(
        "INSERT INTO paygate.bot_jobs (job_key, request_hash, contract, function, args_xdr, lease_token, "
        "lease_expires_at, claimed_by) VALUES ('job-held', '\\x00', %s, 'close_expired', 'AAAAEAAAAAEAAAAA', "
        "gen_random_uuid(), now() + interval '30 seconds', %s) RETURNING id", ("C" + "E" * 55, owner)).fetchone()[0]


def test_a_drained_lane_gets_no_allocations_until_undrained(dsn: str, db: psycopg.Connection) -> None:
    lanes(db)
    result = run_cli("drain", "--lane", LANE_A, "--reason", "rotating its key", "--yes", "--json", dsn=dsn)
    assert result.code == 0, result.err
    assert json.loads(result.out)["drain"]["changed"] is True
    with db.transaction():
        for n in range(2):
            got = lineages.allocate(db, purpose="deposit", entitlement=f"e{n}", lanes=[LANE_A, LANE_B])
            assert got is None or got[1] == LANE_B
    assert db.execute("SELECT count(*) FROM paygate.lineages WHERE lane = %s", (LANE_A,)).fetchone()[0] == 0
    audit = db.execute("SELECT action, target, details FROM paygate.audit_log ORDER BY id").fetchall()
    assert audit == [("drain.lane", LANE_A, {"reason": "rotating its key"})]
    status = json.loads(run_cli("status", "--json", dsn=dsn).out)["status"]
    assert {"kind": "lane", "target": LANE_A} in [{k: d[k] for k in ("kind", "target")} for d in status["drains"]]

    assert run_cli("undrain", "--lane", LANE_A, "--yes", dsn=dsn).code == 0
    with db.transaction():
        got = lineages.allocate(db, purpose="deposit", entitlement="e9", lanes=[LANE_A])
    assert got is not None and got[1] == LANE_A
    assert db.execute("SELECT action FROM paygate.audit_log ORDER BY id DESC LIMIT 1").fetchone()[0] == "undrain.lane"


def test_without_a_tty_it_refuses_and_names_yes_and_dry_run_changes_nothing(dsn: str, db: psycopg.Connection) -> None:
    lanes(db)
    refused = run_cli("drain", "--lane", LANE_A, dsn=dsn)
    assert refused.code == 2 and "--yes" in refused.err
    dry = run_cli("drain", "--lane", LANE_A, "--dry-run", "--json", dsn=dsn)
    assert dry.code == 0 and json.loads(dry.out)["drain"]["would_drain"] is True
    assert db.execute("SELECT status FROM paygate.lanes WHERE address = %s", (LANE_A,)).fetchone()[0] == "active"
    assert run_cli("drain", "--yes", dsn=dsn).code == 2  # neither --instance nor --lane
    assert run_cli("drain", "--lane", "G" + "C" * 55, "--yes", dsn=dsn).code == 2  # unknown lane


def test_a_drained_instance_ticks_but_claims_nothing_new(dsn: str, db: psycopg.Connection) -> None:
    endpoint = db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES ('http://127.0.0.1:9/h', "
                          "'0123456789abcdef0123') RETURNING id").fetchone()[0]
    db.execute("INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload) VALUES (%s, 't', '{}')",
               (endpoint,))
    seen(db, "host-a")
    assert run_cli("drain", "--instance", "host-a", "--reason", "kernel upgrade", "--yes", dsn=dsn).code == 0
    result = run_cli("run-tick", "webhooks", "--json", dsn=dsn, PAYGATE_INSTANCE_ID="host-a")
    summary = json.loads(result.out)["run_tick"]
    assert result.code == 0 and summary["drained_ticks"] == 1 and summary["last_details"] == {"draining": True}
    assert db.execute("SELECT status, attempts FROM paygate.webhook_outbox").fetchone() == ("pending", 0)
    # It ticked (a heartbeat row), it did not skip: the worker itself declined to claim.
    assert db.execute("SELECT count(*) FROM paygate.worker_runs WHERE instance_id = 'host-a'").fetchone()[0] == 1
    status = json.loads(run_cli("status", "--json", dsn=dsn).out)["status"]
    assert [(d["kind"], d["target"], d["reason"]) for d in status["drains"]] == [
        ("instance", "host-a", "kernel upgrade")]
    assert run_cli("undrain", "--instance", "host-a", "--yes", dsn=dsn).code == 0
    run_cli("run-tick", "webhooks", dsn=dsn, PAYGATE_INSTANCE_ID="host-a", PAYGATE_WEBHOOK_TIMEOUT="1s")
    assert db.execute("SELECT attempts FROM paygate.webhook_outbox").fetchone()[0] == 1  # claimed again


def test_wait_returns_0_when_the_held_work_finishes(dsn: str, db: psycopg.Connection) -> None:
    outbox_id = held_webhook(db, "host-a:0")
    seen(db, "host-a")
    proc = spawn("drain", "--instance", "host-a", "--wait", "30s", "--yes", "--json", dsn=dsn)

    def finish() -> None:
        time.sleep(1.5)
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("UPDATE paygate.webhook_outbox SET status = 'delivered', delivered_at = now(), "
                          "lease_token = NULL, lease_expires_at = NULL WHERE id = %s", (outbox_id,))

    thread = threading.Thread(target=finish)
    started = time.monotonic()
    thread.start()
    out, err = proc.communicate(timeout=60)
    thread.join()
    assert proc.returncode == 0, err
    assert time.monotonic() - started >= 1.5  # it really waited for the work
    document = json.loads(out)["drain"]
    assert document["wait"]["idle"] is True and document["in_flight"]["webhooks"] == 0
    assert err == ""  # no TTY: silent


def test_wait_times_out_with_75_naming_what_is_still_in_flight(dsn: str, db: psycopg.Connection) -> None:
    held_webhook(db, "host-a:1")
    held_webhook(db, "host-b:0")  # another instance's work does not count
    seen(db, "host-a", "host-b")
    result = run_proc("drain", "--instance", "host-a", "--wait", "1s", "--yes", dsn=dsn)
    assert result.code == 75, result.err
    assert "webhooks 1" in result.err
    # The drain itself committed before the wait.
    assert db.execute("SELECT drained_at IS NOT NULL FROM paygate.instances WHERE instance_id = 'host-a'"
                      ).fetchone()[0]
    assert run_cli("drain", "--instance", "host-b", "--wait", "1s", "--yes", dsn=dsn).code == 75
    lanes(db)
    assert run_cli("drain", "--lane", LANE_A, "--wait", "1s", "--yes", dsn=dsn).code == 0  # nothing on the lane


def test_wait_counts_relays_and_bot_jobs_an_instance_holds(dsn: str, db: psycopg.Connection) -> None:
    """Every queue claimed under a lease counts as in flight, not only deposits, batches and webhooks."""
    held_relay(db, "host-a:0")
    held_bot_job(db, "host-a:0")
    seen(db, "host-a")
    result = run_proc("drain", "--instance", "host-a", "--wait", "2", "--yes", dsn=dsn)
    assert result.code == 75, result.err
    assert "relays 1" in result.err and "bot_jobs 1" in result.err
    dry = json.loads(run_cli("drain", "--instance", "host-a", "--dry-run", "--json", dsn=dsn).out)["drain"]
    assert dry["in_flight"]["relays"] == 1 and dry["in_flight"]["bot_jobs"] == 1


def test_every_table_with_a_lease_is_counted(dsn: str, db: psycopg.Connection) -> None:
    """The queues come from the schema: a table with lease columns added later is counted too."""
    from paygate_cli.ops.drain import Target, in_flight, leased_queues

    assert {"deposits", "charge_batches", "webhook_outbox", "relays", "bot_jobs"} <= set(leased_queues(db))
    db.execute("CREATE TABLE paygate.future_queue (id int, lease_expires_at timestamptz, claimed_by text)")
    db.execute("INSERT INTO paygate.future_queue VALUES (1, now() + interval '1 minute', 'host-a:3')")
    assert in_flight(db, Target("instance", "host-a"))["future_queue"] == 1


def test_an_instance_never_seen_is_refused_unless_forced(dsn: str, db: psycopg.Connection) -> None:
    seen(db, "host-a")
    typo = run_cli("drain", "--instance", "hots-a", "--yes", dsn=dsn)
    assert typo.code == 2 and "hots-a" in typo.err and "host-a" in typo.err and "--force" in typo.err, typo.err
    assert db.execute("SELECT count(*) FROM paygate.instances WHERE instance_id = 'hots-a'").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM paygate.audit_log").fetchone()[0] == 0
    assert run_cli("drain", "--instance", "hots-a", "--dry-run", dsn=dsn).code == 2
    forced = run_cli("drain", "--instance", "new-host", "--force", "--yes", dsn=dsn)
    assert forced.code == 0, forced.err
    assert db.execute("SELECT drained_at IS NOT NULL FROM paygate.instances WHERE instance_id = 'new-host'"
                      ).fetchone()[0]
    lanes(db)
    unknown = run_cli("drain", "--lane", "G" + "C" * 55, "--yes", dsn=dsn)
    assert unknown.code == 2 and LANE_A in unknown.err, unknown.err


def test_a_drained_instance_runs_only_the_ticks_that_obey_draining() -> None:
    """The others (they could take new claims) are skipped on a drained instance, as before."""
    from paygate_cli.catalogue import WORKERS
    from paygate_cli.ticks.runner import honours_drain

    assert {name for name, spec in WORKERS.items() if honours_drain(spec)} == {
        "funding", "settlement", "subscriptions", "webhooks", "idempotency_sweep", "recovery", "reconciler",
        "relay", "relay_drainer", "retention", "ttl"}
