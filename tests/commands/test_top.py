"""`paygate top`: one frame (`--once`, plain text off a terminal; `--json`) against a real Postgres
with work queued, a lane in flight (a real funding tick killed after its anchor: the lineage is
signed, never sent) and a halt, as the read-only role; and the live view under a real
pseudo-terminal, left with q or Ctrl-C (exit 0, the terminal restored)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Iterator

import psycopg
import pytest

from paygate_cli.db.privileges import READONLY_ROLE
from paygate_cli.errors import ExitCode
from tests.support.chain_env import admit_deposit, chain_environ, sign_deposit
from tests.support.cli import paygate_cmd, run_cli, run_proc
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.drill_support import crash_tick
from tests.support.pg import PgServer
from tests.support.roles import as_role


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path_factory.mktemp("devnet"), lanes=1, users=2)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def fleet_dsn(pg_server: PgServer) -> Iterator[str]:
    """One database for the module: every test here only reads it (as the read-only role)."""
    database = pg_server.create_database()
    yield database
    pg_server.drop_database(database)


@pytest.fixture(scope="module")
def operator(devnet: DevnetHandle, fleet_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The fleet's state: one deposit's lineage in flight on the only lane, one deposit waiting, the
    operator's halt; -> the read-only operator's environment (no seeds or keys)."""
    dsn, tmp_path = fleet_dsn, tmp_path_factory.mktemp("fleet")
    db = psycopg.connect(dsn, autocommit=True)
    assert run_cli("migrate", "--roles", dsn=dsn).code == 0
    fleet = chain_environ(devnet, dsn, tmp_path / "keys") | {"PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT": "1"}
    first, second = devnet.genesis["users"][:2]
    entry, nonce, expiration = sign_deposit(devnet, first["secret"], 1_000_000)
    admit_deposit(db, first["public"], 1_000_000, entry, nonce, expiration, "top-1")
    crash_tick(fleet, "funding", "funding.after_anchor")  # anchored, never broadcast: the lane is in flight
    entry, nonce, expiration = sign_deposit(devnet, second["secret"], 2_000_000)
    admit_deposit(db, second["public"], 2_000_000, entry, nonce, expiration, "top-2")
    db.close()
    assert run_cli("halt", "--reason", "top drill", "--yes", dsn=dsn).code == 0
    secrets = ("PAYGATE_LANE_SECRETS_FILE", "PAYGATE_FEE_SECRET_FILE", "PAYGATE_JOURNAL_KEYS_FILE")
    return {k: v for k, v in fleet.items() if k not in secrets} | {"PAYGATE_DATABASE_URL": as_role(dsn, READONLY_ROLE)}


def test_one_frame_shows_queued_work_the_lane_in_flight_and_the_halt(operator: dict[str, str],
                                                                     devnet: DevnetHandle, fleet_dsn: str) -> None:
    lane = devnet.genesis["lanes"][0]["public"]
    with psycopg.connect(fleet_dsn) as db:
        lineage_id, bid = db.execute("SELECT id, bid_rate FROM paygate.lineages WHERE state = 'signed'").fetchone()
    document = run_proc("top", "--once", "--json", environ=operator)
    assert document.code == ExitCode.OK, document.err
    parsed = json.loads(document.out)
    assert parsed["schema_version"] == 1 and set(parsed) == {"schema_version", "top"}
    frame = parsed["top"]
    assert set(frame) == {"at", "queues", "lanes", "halts", "chain", "fee_market", "workers", "findings"}
    queues = {q["queue"]: q for q in frame["queues"]}
    assert queues["deposits.pending"]["depth"] == 2 and queues["deposits.pending"]["rate_per_min"] is None
    assert queues["lineages.live"]["depth"] == 1  # the claimed deposit stays pending under its lease
    [in_flight] = frame["lanes"]
    assert (in_flight["lane"], in_flight["lineage"]["id"], in_flight["lineage"]["state"]) == (lane, lineage_id,
                                                                                              "signed")
    assert in_flight["lineage"]["bid_rate"] == bid
    assert isinstance(in_flight["lineage"]["age_ledgers"], int) and in_flight["lineage"]["age_ledgers"] >= 0
    assert [(h["kind"], h["reason"]) for h in frame["halts"]] == [("operator", "top drill")]
    assert frame["chain"]["latest_ledger"] >= devnet.latest_ledger() - 1
    assert [e["status"] for e in frame["chain"]["endpoints"]] == ["healthy", "healthy"]
    funding = next(w for w in frame["workers"] if w["worker"] == "funding")
    assert funding["last_outcome"] is not None  # the killed tick's heartbeat

    text = run_proc("top", "--once", environ=operator)  # off a terminal: plain text, no escapes
    assert text.code == ExitCode.OK, text.err
    assert "\x1b[" not in text.out and text.err == ""
    assert "HALTED: operator" in text.out and "top drill" in text.out
    assert lane in text.out and "signed" in text.out and "deposits.pending" in text.out
    plain = run_proc("top", "--once", "--plain", environ=operator)
    assert f"lane\t{lane}\tsigned\tlineage {lineage_id} " in plain.out
    assert "halt\toperator\tset\ttop drill (by " in plain.out


def test_usage_without_a_terminal_or_once(dsn: str) -> None:
    assert run_cli("top", "--json", dsn=dsn).code == ExitCode.USAGE  # --json is one frame: needs --once
    live = run_cli("top", dsn=dsn)  # stdout is not a terminal: no live view
    assert live.code == ExitCode.USAGE and "--once" in live.err
    assert run_cli("top", "--once", "--interval", "0", dsn=dsn).code == ExitCode.USAGE


def _live(environ: dict[str, str], leave: bytes, until: bytes) -> tuple[int, bytes, float, list]:
    """The live view in a real pty: read until a frame is drawn, press `leave`; -> exit code, what
    was drawn (until `until` shows), seconds from the key to the exit, and the terminal's modes after."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))  # rows, columns
    before = termios.tcgetattr(terminal)

    def controlled_by_the_pty() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # the pty controls it: ^C signals
        # Started with SIGINT ignored, as a script's background jobs (and some CI runners' children)
        # are: Python then installs no Ctrl-C handler, so the view must install its own.
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(paygate_cmd("top", "--interval", "0.5"), env={**environ, "COLUMNS": "200"},
                            stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True,
                            preexec_fn=controlled_by_the_pty)
    drawn = b""
    try:
        deadline = time.monotonic() + 30
        while until not in drawn and time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.5)
            if ready:
                drawn += os.read(controller, 65536)
        assert until in drawn, drawn[-2000:]
        pressed = time.monotonic()
        os.write(controller, leave)
        code = proc.wait(timeout=5)
        took = time.monotonic() - pressed
        while select.select([controller], [], [], 0.2)[0]:  # what it wrote on the way out (an error?)
            try:
                drawn += os.read(controller, 65536)
            except OSError:  # the pty's other side is gone
                break
        after = termios.tcgetattr(terminal)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(controller)
        os.close(terminal)
    assert after[3] == before[3]  # lflag (echo, canonical mode) as it was
    return code, drawn, took, after


@pytest.mark.parametrize("leave", [b"q", b"\x03"], ids=["q", "ctrl-c"])
def test_the_live_view_refreshes_in_a_terminal_and_quits(operator: dict[str, str], devnet: DevnetHandle,
                                                         leave: bytes) -> None:
    lane = devnet.genesis["lanes"][0]["public"].encode()
    code, drawn, took, _ = _live(operator, leave, until=lane)
    assert code == ExitCode.OK, drawn[-3000:]
    assert took < 1.0, took
    assert b"HALTED: operator" in drawn and b"latest ledger" in drawn


def test_ctrl_c_while_a_slow_endpoint_is_asked_leaves_at_once(operator: dict[str, str],
                                                              devnet: DevnetHandle) -> None:
    """The devnet's getHealth answers after 6 s (a slow RPC node): every frame waits on it, so the
    Ctrl-C lands while a probe thread is in flight. The process leaves at once, not when that
    probe's answer comes (an executor's threads would be joined on the way out)."""
    lane = devnet.genesis["lanes"][0]["public"].encode()
    devnet.set_fault("slow", ms=6000, methods=["getHealth"])
    try:
        code, drawn, took, _ = _live(operator, b"\x03", until=lane)
    finally:
        devnet.clear_faults()
    assert code == ExitCode.OK, drawn[-3000:]
    assert took < 1.0, took


def test_ctrl_c_between_a_query_and_its_answer_still_leaves_with_0(operator: dict[str, str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The Ctrl-C the pty tests press lands wherever the frame is; here it lands at the worst place,
    made certain: the second frame has sent its query and not read the answer. The frame is
    replaced for that (the interrupt's timing is the one thing a real terminal cannot pin down);
    the connection, the database and the exit path are the real ones."""
    import io

    from paygate_cli import __main__ as entry
    from paygate_cli.commands import top
    from paygate_cli.env import Env
    from paygate_cli.ops.top import frame as real_frame

    frames = []

    def frame_then_ctrl_c(conn: psycopg.Connection, *args: object) -> dict:
        if frames:
            conn.pgconn.send_query(b"SELECT pg_sleep(0.5)")  # sent; its answer never read
            raise KeyboardInterrupt
        frames.append(real_frame(conn, *args))
        return frames[-1]

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(top, "frame", frame_then_ctrl_c)
    err = io.StringIO()
    code = entry.main(["top", "--interval", "0.2"],
                      env=Env(stdout=Terminal(), stderr=err, stdin=io.StringIO(), environ=operator))
    assert len(frames) == 1
    assert code == ExitCode.OK, err.getvalue()


def test_a_queue_rate_is_its_depth_change_per_minute_between_frames() -> None:
    from paygate_cli.ops.top import with_rates

    before = [{"queue": "deposits.pending", "depth": 10}, {"queue": "webhooks.pending", "depth": 4}]
    now = [{"queue": "deposits.pending", "depth": 4}, {"queue": "webhooks.pending", "depth": 5},
           {"queue": "relays.pending", "depth": 1}]
    rates = {q["queue"]: q["rate_per_min"] for q in with_rates(now, before, 30.0)}
    assert rates == {"deposits.pending": -12.0, "webhooks.pending": 2.0, "relays.pending": None}
    assert {q["rate_per_min"] for q in with_rates(now, None, None)} == {None}  # one frame has no rate
