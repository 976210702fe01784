"""A second `halt` never silently replaces the first: it names the halt in place and exits 2;
`--replace` replaces it, audited with the old and the new reason; dry runs show the current halt."""

from __future__ import annotations

import json

import psycopg

from paygate_cli.errors import ExitCode
from tests.support.cli import run_cli, run_proc


def operator_halt(db: psycopg.Connection) -> tuple[str, str] | None:
    return db.execute("SELECT reason, set_by FROM paygate.halts WHERE kind = 'operator'").fetchone()


def test_second_halt_is_refused_naming_the_first_and_replace_replaces_it_audited(
        dsn: str, db: psycopg.Connection) -> None:
    db.execute("INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('gas', 'fee account low', 'gas')")
    assert run_cli("halt", "--reason", "incident 42", "--yes", dsn=dsn, PAYGATE_OPERATOR="alice").code == 0

    second = run_proc("halt", "--reason", "deploy window", "--yes", dsn=dsn, PAYGATE_OPERATOR="bob")
    assert second.code == ExitCode.USAGE, second.err
    assert "already halted by alice at " in second.err
    assert "('incident 42'); pass --replace" in second.err
    assert operator_halt(db) == ("incident 42", "alice")
    # without a TTY and without --yes the refusal still comes first: no confirmation for a halt refused
    unconfirmed = run_cli("halt", "--reason", "deploy window", dsn=dsn)
    assert unconfirmed.code == ExitCode.USAGE and "pass --replace" in unconfirmed.err

    replaced = run_cli("halt", "--reason", "deploy window", "--replace", "--yes", "--json", dsn=dsn,
                       PAYGATE_OPERATOR="bob")
    assert replaced.code == 0, replaced.err
    document = json.loads(replaced.out)["halt"]
    assert document["reason"] == "deploy window" and document["replaced"]["reason"] == "incident 42"
    assert operator_halt(db) == ("deploy window", "bob")
    audit = db.execute("SELECT actor, action, details->>'reason', details->>'old_reason', details->>'old_set_by'"
                       " FROM paygate.audit_log ORDER BY id").fetchall()
    assert audit == [("alice", "halt", "incident 42", None, None),
                     ("bob", "halt_replace", "deploy window", "incident 42", "alice")]
    # the gas monitor's halt is its own: neither counted as the operator's nor touched by --replace
    assert db.execute("SELECT reason FROM paygate.halts WHERE kind = 'gas'").fetchone() == ("fee account low",)


def test_dry_runs_show_the_halt_in_place(dsn: str, db: psycopg.Connection) -> None:
    assert run_cli("halt", "--reason", "incident 42", "--yes", dsn=dsn, PAYGATE_OPERATOR="alice").code == 0

    halt_dry = run_cli("halt", "--reason", "other", "--dry-run", dsn=dsn)
    assert halt_dry.code == 0
    assert "already halted by alice at " in halt_dry.out and "('incident 42')" in halt_dry.out
    assert "--replace" in halt_dry.out
    replace_dry = run_cli("halt", "--reason", "other", "--replace", "--dry-run", dsn=dsn)
    assert "would replace: halted by alice" in replace_dry.out and "'other'" in replace_dry.out

    resume_dry = run_cli("resume", "--dry-run", dsn=dsn)
    assert resume_dry.code == 0
    assert "would clear the operator halt: halted by alice at " in resume_dry.out
    assert "('incident 42')" in resume_dry.out
    assert operator_halt(db) == ("incident 42", "alice")
    assert db.execute("SELECT count(*) FROM paygate.audit_log").fetchone()[0] == 1
