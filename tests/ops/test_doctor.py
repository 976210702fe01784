"""ops/doctor.py's judgements one by one, on a real Postgres: the exit code of a set of verdicts, the
groups, the grants against db/privileges.py, the TTL horizon from what the keeper recorded, the clock
against a ledger's close time."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from paygate_cli.chain.deployment import EndpointFacts
from paygate_cli.db.privileges import READONLY_ROLE, RUNTIME_ROLE
from paygate_cli.errors import UsageError
from paygate_cli.ops.doctor import (
    GROUPS,
    Endpoint,
    clock_check,
    config_checks,
    fail,
    grants_check,
    ok,
    parse_groups,
    report,
    restore_gate_check,
    ttl_check,
    warn,
    writer_check,
)
from paygate_cli.settings import load_settings
from tests.support.cli import base_environ, run_cli


def test_the_exit_code_is_the_worst_failure_kind() -> None:
    checks = [ok("a.one", "db", "e"), warn("a.two", "db", "e", "f")]
    assert report(checks, ("db",))["summary"]["exit_code"] == 1
    assert report([ok("a.one", "db", "e")], ("db",))["summary"]["exit_code"] == 0
    unavailable = fail("rpc.1.reachable", "rpc", "unavailable", "e", "f")
    human = fail("lane.G.sequence", "lanes", "human", "e", "f")
    config = fail("config.settings", "config", "config", "e", "f")
    groups = ("config", "rpc", "lanes")
    assert report([*checks, unavailable], groups)["summary"]["exit_code"] == 69
    assert report([unavailable, human], groups)["summary"]["exit_code"] == 3
    assert report([unavailable, human, config], groups)["summary"]["exit_code"] == 78
    document = report([ok("x.ok", "rpc", "e"), unavailable, warn("y", "lanes", "e", "f")], groups)
    assert document["groups"] == {"config": "ok", "rpc": "fail", "lanes": "warn"}  # never ok while one fails
    assert document["summary"] == {"ok": 1, "warn": 1, "fail": 1, "exit_code": 69}


def test_groups_are_known_and_kept_in_order() -> None:
    assert parse_groups(None) == GROUPS
    assert parse_groups(" lanes,rpc ") == ("rpc", "lanes")
    for bad in ("rpc,lanez", "", ","):
        with pytest.raises(UsageError):
            parse_groups(bad)


def test_grants_are_compared_table_by_table(dsn: str, db: psycopg.Connection) -> None:
    assert grants_check(db).verdict == "fail"  # before `migrate --roles` here: no grants at all
    assert run_cli("migrate", "--roles", environ=base_environ(dsn)).code == 0
    assert grants_check(db).verdict == "ok"
    db.execute(f"REVOKE SELECT ON paygate.lanes FROM {READONLY_ROLE}")
    db.execute(f"GRANT DELETE ON paygate.audit_log TO {RUNTIME_ROLE}")
    check = grants_check(db)
    assert check.verdict == "fail" and check.kind == "config" and "migrate --roles" in check.fix
    assert f"{READONLY_ROLE} lacks SELECT on paygate.lanes" in check.evidence
    assert f"{RUNTIME_ROLE} holds DELETE on paygate.audit_log" in check.evidence


def _ttl_entry(db: psycopg.Connection, state: str, live_until: int, reason: str | None = None) -> None:
    key = os.urandom(24).hex()
    db.execute("INSERT INTO paygate.ttl_entries (key_hash, key_xdr, kind, state, live_until, read_ledger, read_at,"
               " reason) VALUES (sha256(%s::bytea), %s, 'instance', %s, %s, 1000, now(), %s)",
               (key.encode(), key, state, live_until, reason))


def test_the_ttl_horizon_from_what_the_keeper_recorded(db: psycopg.Connection) -> None:
    settings = load_settings(base_environ(None), only_secrets=())
    assert ttl_check(db, settings, None, None).verdict == "warn"  # nothing known to be kept alive
    _ttl_entry(db, "live", 1000 + 10 * 86400 // 5)  # ten days left; the keeper extends at thirty
    check = ttl_check(db, settings, None, None)
    assert check.verdict == "warn" and "run-tick ttl" in check.fix
    _ttl_entry(db, "archived", 900)
    assert ttl_check(db, settings, None, None).kind == "human"
    _ttl_entry(db, "needs_human", 900, "archived again after its restore")
    check = ttl_check(db, settings, None, None)
    assert check.verdict == "fail" and "archived again" in check.evidence


def test_clock_skew_against_the_latest_close_time() -> None:
    def at(close_time: int) -> list[Endpoint]:
        facts = EndpointFacts("healthy", 100, 1, close_time, 17280, "net", 23)
        return [Endpoint(1, "http://a", "a", ["write"], facts)]

    assert clock_check(at(1_000_000), 1_000_004).verdict == "ok"
    assert clock_check(at(1_000_000), 1_000_000 - 120).verdict == "warn"
    assert clock_check(at(1_000_000), 1_000_000 + 3600).kind == "config"
    nothing = [Endpoint(1, "http://a", "a", ["write"], error="down")]
    assert clock_check(nothing, 0).evidence.startswith("not checked")


def test_a_database_password_in_plain_sight(tmp_path: Path) -> None:
    password = "hunter2-doctor-test"
    dsn = f"postgresql://paygate:{password}@db.example/paygate"
    checks, _ = config_checks(base_environ(dsn), {}, None)
    by_id = {c.id: c for c in checks}
    assert by_id["config.settings"].verdict == "warn" and "PAYGATE_DATABASE_URL_FILE" in by_id["config.settings"].fix
    config = tmp_path / "config.toml"
    config.write_text(f'database_url = "{dsn}"\n')
    config.chmod(0o644)
    checks, _ = config_checks(base_environ(None), {}, str(config))
    settings_check = next(c for c in checks if c.id == "config.settings")
    assert settings_check.verdict == "fail" and f"chmod o-rwx {config}" in settings_check.fix
    config.chmod(0o600)
    checks, _ = config_checks(base_environ(None), {}, str(config))
    assert next(c for c in checks if c.id == "config.settings").verdict == "ok"
    assert all(password not in c.evidence + c.fix for c in checks)


def test_a_restore_halt_and_a_read_only_database_fail_the_db_group(db: psycopg.Connection) -> None:
    assert restore_gate_check(db).verdict == "ok"
    db.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('restore', 'timeline 2, recorded 1', 't')")
    check = restore_gate_check(db)
    assert (check.verdict, check.kind) == ("fail", "human"), check
    assert "timeline 2, recorded 1" in check.evidence and "recover-check" in check.fix
    assert writer_check(db).verdict == "ok"
    db.execute("SET default_transaction_read_only = on")  # reported to the client: what a read-only primary says
    check = writer_check(db)
    assert (check.verdict, check.kind) == ("fail", "unavailable"), check
    assert "read-only" in check.evidence and "target_session_attrs=read-write" in check.fix
