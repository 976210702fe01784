"""What an operator sees is never cut or ambiguous: money and ids whole on a narrow terminal (folded or
one record per block, `--wide` for the full table), amounts also in USDC/XLM, durations as `7d`, no
Python `None`, "no rows" instead of an empty box; and the papercuts: `--out -`, `--out` never
overwriting without `--force`, `--since 2h30m`, output flags on either side of the command,
`reconcile-report --plain`, TOML errors blamed on the file, a mistyped `--metrics-dir`, Ctrl-C in
`drain --wait`, `--batch` over the path's ceiling, completion candidates."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from paygate_cli.__main__ import main
from paygate_cli.env import Env
from paygate_cli.errors import ExitCode, UsageError
from tests.support.cli import Result, base_environ, run_cli
from tests.support.webhooks import held_webhook, seen

ACCOUNT = "G" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567" + "A" * 23  # 56 characters, as every Stellar address
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def on_terminal(*args: str, columns: int, dsn: str | None = None, **extra: str) -> Result:
    """The CLI with stdout on a terminal `columns` wide (rich reads the width from COLUMNS)."""
    out, err = _Terminal(), io.StringIO()
    environ = base_environ(dsn, COLUMNS=str(columns), NO_COLOR="1", **extra)
    code = main(list(args), env=Env(stdout=out, stderr=err, stdin=io.StringIO(), environ=environ))
    return Result(int(code), ANSI.sub("", out.getvalue()), err.getvalue())


def drifted_account(db: psycopg.Connection, drift: int = -630000) -> None:
    db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 1000630000)", (ACCOUNT,))
    db.execute("INSERT INTO paygate.account_checks (address, chain_balance, cached_balance, regime, drift) "
               "VALUES (%s, %s, 1000630000, 'unexplained', %s)", (ACCOUNT, 1000630000 + drift, drift))


# -- 1. money and ids are never cut -------------------------------------------------------------------

def test_a_drift_on_a_narrow_terminal_shows_every_address_and_amount_whole_and_in_usdc(
        dsn: str, db: psycopg.Connection) -> None:
    drifted_account(db)
    for columns in (60, 30):
        result = on_terminal("reconcile-report", columns=columns, dsn=dsn)
        assert result.code == ExitCode.NEEDS_HUMAN, result.err
        assert "…" not in result.out, result.out  # an ellipsis makes -630000… another amount
        headline, *table = result.out.splitlines()  # a sentence is not cut either: the terminal wraps it
        assert headline.startswith("UNEXPLAINED DRIFT") and max(len(line) for line in table) <= columns, result.out
        squeezed = "".join(result.out.split())
        assert ACCOUNT in squeezed and "-630000(-0.063USDC)" in squeezed, result.out
    # Scripts keep the raw number.
    document = json.loads(run_cli("reconcile-report", "--json", dsn=dsn).out)["reconcile_report"]
    assert [row["drift"] for row in document["drift"]] == ["-630000"]


def test_wide_draws_the_whole_table_on_a_terminal_before_or_after_the_command() -> None:
    for args in (["workers", "--offline", "--wide"], ["--wide", "workers", "--offline"]):
        result = on_terminal(*args, columns=40)
        assert result.code == 0, result.err
        settlement = [line for line in result.out.splitlines() if "settlement" in line]
        assert len(settlement) == 1 and "(1885436263, 200..203)" in settlement[0], result.out
        assert result.out.startswith("┏")
    folded = on_terminal("workers", "--offline", columns=40)  # no --wide: one record per block
    assert folded.code == 0 and "…" not in folded.out
    assert max(len(line) for line in folded.out.splitlines()) <= 40


def test_amounts_durations_and_ages_are_formatted_for_people_and_raw_for_scripts() -> None:
    from paygate_cli.output import Mode, amount, duration_text, emit

    assert amount(-630000, "USDC").text == "-630000 (-0.063 USDC)"
    assert amount(12_345_678_901_234, "USDC").text == "12345678901234 (1,234,567.8901234 USDC)"
    assert amount(100, "XLM").text == "100 (0.00001 XLM)"
    assert [duration_text(s) for s in (604800.0, 9000, 61, 45, 2.5, 0.25, None)] == [
        "7d", "2h30m", "1m1s", "45s", "2.5s", "250ms", "-"]
    rows = [{"drift": amount(-630000, "USDC"), "seen": None}]
    out = io.StringIO()
    emit(Env(stdout=out, stderr=io.StringIO(), environ={}), Mode.PLAIN, {}, rows=rows)
    assert out.getvalue() == "drift\tseen\n-630000\t\n"
    out = io.StringIO()
    emit(Env(stdout=out, stderr=io.StringIO(), environ={}), Mode.JSON, {"rows": rows})
    assert json.loads(out.getvalue())["rows"] == [{"drift": -630000, "seen": None}]


def test_status_shows_queue_ages_as_durations_never_seconds_or_none(dsn: str, db: psycopg.Connection) -> None:
    db.execute("INSERT INTO paygate.webhook_outbox (event_type, payload, status, dead_at, created_at) "
               "VALUES ('deposit.settled', '{}', 'dead', now() - interval '7 days', now() - interval '7 days')")
    result = run_cli("status", dsn=dsn)
    dead = [line for line in result.out.splitlines() if "queue:webhooks.dead" in line]
    assert len(dead) == 1 and "oldest waiting 7d" in dead[0], result.out
    assert "None" not in result.out and "604800" not in result.out, result.out
    document = json.loads(run_cli("status", "--json", dsn=dsn).out)["status"]
    ages = {q["queue"]: q["oldest_age_s"] for q in document["queues"]}
    assert ages["webhooks.dead"] >= 604800  # --json keeps the number of seconds


def test_an_empty_table_says_no_rows_instead_of_an_empty_box(dsn: str) -> None:
    result = run_cli("replay", "webhooks", "--all-dead", "--dry-run", dsn=dsn)
    assert result.code == 0, result.err
    assert "no rows" in result.out and "┏" not in result.out, result.out
    plain = run_cli("replay", "webhooks", "--all-dead", "--dry-run", "--plain", dsn=dsn)
    assert plain.out == "id\toutcome\treason\n"  # scripts still get the header


# -- 2. papercuts ---------------------------------------------------------------------------------

def test_out_dash_is_stdout_and_an_existing_file_is_kept_without_force(dsn: str, tmp_path: Path) -> None:
    stdout = run_cli("reconcile-report", "--format", "csv", "--out", "-", dsn=dsn)
    assert stdout.code == 0 and stdout.out.startswith("section,"), stdout.err
    assert not Path("-").exists()
    report = tmp_path / "report.csv"
    report.write_text("yesterday's report\n")
    refused = run_cli("reconcile-report", "--format", "csv", "--out", str(report), dsn=dsn)
    assert refused.code == ExitCode.USAGE and "--force" in refused.err
    assert report.read_text() == "yesterday's report\n"
    forced = run_cli("reconcile-report", "--format", "csv", "--out", str(report), "--force", dsn=dsn)
    assert forced.code == 0 and report.read_text().startswith("section,")


def test_since_takes_compound_durations_from_one_shared_parser() -> None:
    from paygate_cli.commands import _common, replay
    from paygate_cli.commands import reconcile_report as reconcile

    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert _common.parse_since("2h30m", now=now) == now - timedelta(hours=2, minutes=30)
    assert _common.parse_since("1d 6h", now=now) == now - timedelta(days=1, hours=6)
    assert _common.parse_since("30min", now=now) == now - timedelta(minutes=30)
    assert _common.parse_since("2026-11-30T10:00:00", now=now) == datetime(2026, 11, 30, 10, tzinfo=UTC)
    with pytest.raises(UsageError):
        _common.parse_since("2 fortnights", now=now)
    assert not hasattr(reconcile, "_since") and replay.parse_since is _common.parse_since


def test_since_2h30m_on_the_command_line(dsn: str) -> None:
    result = run_cli("replay", "webhooks", "--all-dead", "--since", "2h30m", "--dry-run", "--json", dsn=dsn)
    assert result.code == 0, result.err
    assert run_cli("reconcile-report", "--since", "2h30m", "--json", dsn=dsn).code == 0


def test_json_and_plain_work_before_and_after_the_command_name() -> None:
    before = run_cli("--json", "workers", "--offline")
    after = run_cli("workers", "--offline", "--json")
    assert before.code == after.code == 0
    assert json.loads(before.out)["workers"] == json.loads(after.out)["workers"]
    plain = run_cli("--plain", "workers", "--offline")
    assert plain.code == 0 and plain.out.startswith("worker\tlock\t")
    assert run_cli("--json", "config", "show").code == 0 and "schema_version" in run_cli("--json", "config", "show").out


def test_reconcile_report_plain_is_tab_separated_raw_numbers(dsn: str, db: psycopg.Connection) -> None:
    drifted_account(db)
    result = run_cli("reconcile-report", "--plain", dsn=dsn)
    assert result.code == ExitCode.NEEDS_HUMAN, result.err
    lines = result.out.splitlines()
    header = lines[0].split("\t")
    assert header[0] == "section" and "drift" in header
    drift = [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:] if line.startswith("drift\t")]
    assert [(row["address"], row["drift"]) for row in drift] == [(ACCOUNT, "-630000")]
    assert run_cli("reconcile-report", "--plain", "--json", dsn=dsn).code == ExitCode.USAGE


def test_a_bad_toml_value_is_blamed_on_the_file_and_key(tmp_path: Path, dsn: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text('statement_timeout = "soon"\n')
    result = run_cli("--config", str(config), "status", dsn=dsn)
    assert result.code == ExitCode.CONFIG
    assert f"config file {config}: statement_timeout" in result.err, result.err
    assert "PAYGATE_STATEMENT_TIMEOUT" not in result.err
    from_env = run_cli("status", dsn=dsn, PAYGATE_STATEMENT_TIMEOUT="soon")
    assert from_env.code == ExitCode.CONFIG and "PAYGATE_STATEMENT_TIMEOUT" in from_env.err


def test_a_mistyped_metrics_dir_is_a_config_error_and_nothing_is_created(tmp_path: Path, dsn: str) -> None:
    typo = tmp_path / "node_exportr" / "textfile"
    result = run_cli("run-tick", "idempotency_sweep", "--metrics-dir", str(typo), dsn=dsn)
    assert result.code == ExitCode.CONFIG and "does not exist" in result.err, result.err
    assert not (tmp_path / "node_exportr").exists()
    from_setting = run_cli("run-tick", "idempotency_sweep", dsn=dsn, PAYGATE_METRICS_DIR=str(typo))
    assert from_setting.code == ExitCode.CONFIG and "PAYGATE_METRICS_DIR" in from_setting.err
    assert not (tmp_path / "node_exportr").exists()
    # The directory itself may still be created, inside one that exists.
    fresh = tmp_path / "textfile"
    assert run_cli("run-tick", "idempotency_sweep", "--metrics-dir", str(fresh), dsn=dsn).code == 0
    assert (fresh / "paygate_idempotency_sweep_slot0.prom").exists()


def test_ctrl_c_during_drain_wait_says_the_drain_stays_and_exits_130(dsn: str, db: psycopg.Connection) -> None:
    held_webhook(db, "host-a:0")
    seen(db, "host-a")

    def interrupted(_seconds: float) -> None:
        raise KeyboardInterrupt  # what Python raises when Ctrl-C arrives during the wait's sleep

    out, err = io.StringIO(), io.StringIO()
    env = Env(stdout=out, stderr=err, stdin=io.StringIO(), environ=base_environ(dsn), sleep=interrupted)
    code = main(["drain", "--instance", "host-a", "--wait", "30s", "--yes"], env=env)
    assert code == ExitCode.SIGINT == 130
    assert "host-a stays drained" in err.getvalue() and "paygate undrain --instance host-a" in err.getvalue()
    assert db.execute("SELECT drained_at IS NOT NULL FROM paygate.instances WHERE instance_id = 'host-a'"
                      ).fetchone()[0] is True


def test_a_batch_over_the_paths_ceiling_is_refused(dsn: str) -> None:
    result = run_cli("run-tick", "settlement", "--batch", "500", dsn=dsn)
    assert result.code == ExitCode.USAGE and "at most 100" in result.err, result.err
    gas = run_cli("run-tick", "gas", "--batch", "5", dsn=dsn)
    assert gas.code == ExitCode.USAGE and "does not work in batches" in gas.err


def test_completion_offers_queues_formats_lanes_and_instances(dsn: str, db: psycopg.Connection) -> None:
    from paygate_cli.commands import completion
    from paygate_cli.commands import reconcile_report as reconcile
    from paygate_cli.ops.replay import QUEUES

    assert set(completion.REPLAY_QUEUES) == set(QUEUES) and completion.REPORT_FORMATS == reconcile.FORMATS
    lane = "G" + "L" * 55
    db.execute("INSERT INTO paygate.lanes (address) VALUES (%s)", (lane,))
    seen(db, "host-a", "host-b")
    paygate = os.path.join(os.path.dirname(sys.executable), "paygate")
    script = (f'source <("{paygate}" completion bash)\n'
              "for words in 'replay we' 'reconcile-report --format m' 'nonce-inspect --lane GL' "
              "'drain --instance host-' 'undrain --lane G' '--log-format j'; do\n"
              "  COMP_WORDS=(paygate $words); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))\n"
              "  _paygate_completion paygate; echo \"replies: ${COMPREPLY[*]}\"\n"
              "done\n")
    environ = {**base_environ(dsn), "PATH": os.path.dirname(paygate) + os.pathsep + os.environ.get("PATH", "")}
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=environ, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.splitlines() == ["replies: webhooks", "replies: markdown", f"replies: {lane}",
                                        "replies: host-a host-b", f"replies: {lane}", "replies: json"]
    # The database down: no candidates and not a word on the terminal.
    down = {**environ, "PAYGATE_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none"}
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=down, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.splitlines()[2:] == ["replies: ", "replies: ", "replies: ", "replies: json"]
