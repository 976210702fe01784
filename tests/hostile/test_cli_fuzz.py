"""Hostile command lines, environments and config files, property-based.

Every command and flag of `paygate` (apart from the ones that start long-lived servers or clusters:
`demo`, `devnet start`, `dev db up|down`) is run in-process through `main()` against a real,
migrated database, with hypothesis-generated argv (fuzzed flag values, durations, integers, paths,
URLs, junk tokens), PAYGATE_* variables and TOML config files (wrong types, NaN/inf, NUL escapes,
invalid TOML, non-UTF-8 bytes). The contract: an exit code from the documented table but never 70
(a bug), never a traceback, and a usage or configuration error is exactly one line on stderr.
The Env's clock is fake (a sleep advances it), so `--every 1s --for 1h` ends at once."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from stellar_sdk import Keypair

from paygate_cli.__main__ import main
from paygate_cli.env import Env
from paygate_cli.errors import ExitCode
from paygate_cli.settings import FIELDS, SECRETS
from tests.support.cli import Result, base_environ

FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

LEGITIMATE = {ExitCode.OK, ExitCode.FAILED, ExitCode.USAGE, ExitCode.NEEDS_HUMAN, ExitCode.UNAVAILABLE,
              ExitCode.SKIPPED, ExitCode.NOPERM, ExitCode.CONFIG}
ONE_LINE = {ExitCode.USAGE, ExitCode.CONFIG, ExitCode.NOPERM}

DURATIONS = ["", " ", "-1s", "1e9", "9" * 400, "nan", "inf", "infinity", "1.5.2s", "2 s", "\u0663s", "10ms", "0",
             "0s", "1h", "5min", "2", "1e-9s", "0.0000001ms", "99999999999999999999h", "\u00a0", "s", "2fortnights",
             "--json", "1s\n2s", "\u202e5s", "600h", "1000000h", "1000001h"]
LONG_DURATIONS = {"1e9", "1h", "5min", "2", "2 s", "600h", "1000000h", "99999999999999999999h", "\u0663s"}
INTS = ["0", "-1", "1", "3", "99999999999999999999999", "2147483648", "9223372036854775808", "1.5", "0x10", "", "abc",
        "\u0663", "-0", "+5"]
STRINGS = ["", "x", "a" * 5000, "\u202e\u200b", "../../etc/passwd", "-", "--", "G" + "A" * 55,
           Keypair.from_raw_ed25519_seed(bytes(32)).public_key, "C" + "A" * 55, "'; DROP TABLE x; --", "%s%n{0}",
           "deposits", "relays", "webhooks", "charges", "bot_jobs", "k2026", "\u00e9\u6f22\U0001f642"]
URLS = ["", "ftp://x", "http://127.0.0.1:9", "http://[::1", "http://user:pw@127.0.0.1:9", "not a url",
        "http://127.0.0.1:99999", "http://127.0.0.1:9/" + "a" * 3000, "https://"]
CHOICES = {"--format": ["table", "json", "csv", "xml", ""], "--log-format": ["json", "text", "auto", "xml", ""],
           "--log-level": ["debug", "INFO", "trace", "", "error"]}
JUNK = ["--nope", "-x", "--json=1", "--", "---", "-", "\u2014json", "--once=yes", "extra", "--help=no", "-hh"]
EXCLUDED = {("demo",), ("devnet", "start"), ("dev", "db", "up"), ("dev", "db", "down")}
DURATION_FLAGS = {"--every", "--for", "--lock-wait", "--wait", "--since", "--older-than", "--ledger-interval"}
PATH_FLAGS = {"--out", "--metrics-dir", "--data-dir", "--state", "--config"}


def _commands() -> list[tuple[tuple[str, ...], Any]]:
    import typer.main

    from paygate_cli.app import make_app

    found: list[tuple[tuple[str, ...], Any]] = []

    def walk(command: Any, path: tuple[str, ...]) -> None:
        subs = getattr(command, "commands", None)
        if subs:
            for name, sub in sorted(subs.items()):
                walk(sub, (*path, name))
        elif path not in EXCLUDED:
            found.append((path, command))

    walk(typer.main.get_command(make_app()), ())
    return found


COMMANDS = _commands()


class FakeClock:
    """monotonic() that only moves when slept on (and a little per look, so no loop can spin)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        self.now += 0.01
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


def run(args: list[str], environ: dict[str, str]) -> Result:
    clock = FakeClock()
    out, err = io.StringIO(), io.StringIO()
    env = Env(stdin=io.StringIO(""), stdout=out, stderr=err, environ=environ, monotonic=clock.monotonic,
              sleep=clock.sleep)
    code = main(args, env=env)
    return Result(int(code), out.getvalue(), err.getvalue())


def check(result: Result, args: list[str]) -> None:
    event(f"exit {result.code}")  # --hypothesis-show-statistics: how far the corpus got
    where = f"argv={args!r:.600}\nstderr={result.err[-1500:]!r}"
    assert result.code != ExitCode.SOFTWARE, where
    assert result.code in LEGITIMATE, where
    assert "Traceback" not in result.err + result.out, where
    if result.code in ONE_LINE:
        assert len(result.err.strip().splitlines()) == 1, where


def values_for(option: Any, paths: list[str]) -> st.SearchStrategy[str]:
    name = option.opts[0]
    if name == "--for":  # every malformed value, but no long valid one (the tick loop waits in real time)
        return st.sampled_from([d for d in DURATIONS if d not in LONG_DURATIONS])
    if name in DURATION_FLAGS:
        return st.sampled_from(DURATIONS)
    if name in PATH_FLAGS:
        return st.sampled_from(paths)
    if name == "--url":
        return st.sampled_from(URLS)
    if name in CHOICES:
        return st.sampled_from(CHOICES[name])
    if str(option.type) == "INT":
        return st.sampled_from(INTS)
    return st.one_of(st.sampled_from(STRINGS), st.text(max_size=30).filter(lambda t: "\x00" not in t))


@st.composite
def argv(draw: st.DrawFn, paths: list[str]) -> list[str]:
    path, command = draw(st.sampled_from(COMMANDS))
    args: list[str] = []
    if draw(st.booleans()):
        root = draw(st.sampled_from(["--log-format", "--log-level", "--config"]))
        args += [root, draw(st.sampled_from(paths if root == "--config" else CHOICES[root]))]
    args += list(path)
    for param in command.params:
        if not draw(st.integers(0, 2)):
            continue
        if param.param_type_name == "argument":
            if param.name == "worker":
                from paygate_cli.catalogue import WORKERS

                args.append(draw(st.sampled_from([*sorted(WORKERS), "nope", "", "run-tick"])))
            elif param.name == "shell":
                args.append(draw(st.sampled_from(["bash", "zsh", "fish", "tcsh"])))
            else:
                args += draw(st.lists(st.one_of(st.sampled_from(STRINGS + INTS)), min_size=1, max_size=3))
        elif getattr(param, "is_flag", False):
            args.append(draw(st.sampled_from(param.opts)))
        else:
            args += [draw(st.sampled_from(param.opts)), draw(values_for(param, paths))]
    if path == ("run-tick",) and "--once" not in args and "--for" not in args:
        args += ["--for", "50ms"]  # the loop waits in real time between ticks: keep every run short
    if draw(st.integers(0, 3)) == 0:
        args.insert(draw(st.integers(0, len(args))), draw(st.sampled_from(JUNK)))
    return args


@pytest.fixture
def paths(tmp_path: Path) -> list[str]:
    (tmp_path / "file").write_text("not a directory\n")
    (tmp_path / "dir").mkdir()
    return ["", "/", "/proc", "/dev/null/x", "/nonexistent/dir/x", str(tmp_path / "file"), str(tmp_path / "dir"),
            str(tmp_path / "dir" / "new.csv"), "a" * 5000, "\u202e"]


def test_fuzzed_command_lines_never_crash(dsn: str, paths: list[str]) -> None:
    environ = base_environ(dsn)

    @FUZZ
    @given(args=argv(paths))
    # Found by this corpus once (70 before the fix); pinned so a change in the command set, which
    # reshuffles what hypothesis draws, cannot drop them.
    @example(args=["dev", "db", "url", "--data-dir", "a" * 5000])
    @example(args=["reconcile-report", "--out", "/"])
    @example(args=["devnet", "state", "--url", ""])
    @example(args=["--log-format", "--nope", "json", "completion"])
    def fuzz(args: list[str]) -> None:
        check(run(args, environ), args)

    fuzz()


# -- environment and config files ----------------------------------------------------------------------

def _field_values(field: Any) -> list[str]:
    default = field.default
    if isinstance(default, float):
        return DURATIONS
    if isinstance(default, bool):
        return ["yes", "maybe", "2", "", "TRUE", "\u0663"]
    if isinstance(default, int):
        return INTS
    if field.name.endswith("urls") or field.name == "rpc_url":
        return URLS
    return [*STRINGS, "\x01", "json", "xml"]


ENV_FIELDS = [f for f in FIELDS if f.name != "database_url"]
TOML_LITERALS = ['"2s"', "2", "-1", "1e400", "inf", "nan", "-inf", "[1, 2]", '["a", 3]', "{a = 1}", "true",
                 "1979-05-27T07:32:00Z", "07:32:00", '"\\u0000"', '"a\\u0000b"', "99999999999999999999999",
                 '"\\u202e"', '""', '"' + "x" * 3000 + '"', "0.5", '"-1s"', '"nan"', '"1e9h"']


@st.composite
def environment(draw: st.DrawFn) -> dict[str, str]:
    chosen = draw(st.lists(st.sampled_from(ENV_FIELDS), min_size=1, max_size=4, unique_by=lambda f: f.name))
    return {f"PAYGATE_{f.name.upper()}": draw(st.sampled_from(_field_values(f))) for f in chosen}


@st.composite
def toml_file(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["fields", "fields", "fields", "garbage", "bytes"]))
    if kind == "bytes":
        return draw(st.sampled_from([b"\xff\xfe\x00a", b"\xef\xbb\xbfstatement_timeout = \"5s\"\n",
                                     b"a = \"\xc3\x28\"\n", b"\x00", b""]))
    if kind == "garbage":
        return draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")
    names = [f.name for f in FIELDS] + [f"{s}_file" for s in SECRETS] + list(SECRETS) + ["nope", "[table]"]
    lines = [f"{draw(st.sampled_from(names))} = {draw(st.sampled_from(TOML_LITERALS))}"
             for _ in range(draw(st.integers(1, 4)))]
    return ("\n".join(lines) + "\n").encode()


COMMANDS_FOR_SETTINGS = [["status", "--json"], ["config", "show"], ["workers"], ["run-tick", "webhooks", "--once"],
                         ["run-tick", "idempotency_sweep", "--every", "10ms", "--for", "30ms"], ["reconcile-report"],
                         ["nonce-inspect", "--json"], ["halt", "--reason", "fuzz", "--dry-run"]]


def test_fuzzed_environment_and_config_files_never_crash(dsn: str, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"

    @FUZZ
    @given(extra=environment(), contents=toml_file(), use_file=st.booleans(),
           command=st.sampled_from(COMMANDS_FOR_SETTINGS))
    def fuzz(extra: dict[str, str], contents: bytes, use_file: bool, command: list[str]) -> None:
        config.write_bytes(contents)
        environ = base_environ(dsn, **(extra if not use_file else {}))
        args = (["--config", str(config)] if use_file else []) + command
        check(run(args, environ), args)

    fuzz()


# -- real processes: bytes that are not UTF-8 in argv and in the environment --------------------------

@pytest.mark.parametrize(("argv", "environ", "code"), [
    ([b"drain", b"--lane", b"\xff\xfe", b"--yes"], {}, ExitCode.USAGE),
    ([b"--log-format", b"\xc3\x28", b"status"], {}, ExitCode.USAGE),
    ([b"halt", b"--reason", b"x", b"--dry-run"], {b"PAYGATE_OPERATOR": b"\xff"}, ExitCode.CONFIG),
    ([b"status", b"--json"], {b"PAYGATE_RPC_URL": b"http://\xff/"}, ExitCode.CONFIG),
], ids=["argv-lane", "argv-root-option", "env-operator", "env-rpc-url"])
def test_non_utf8_bytes_from_the_os_are_refused_in_one_line(dsn: str, argv: list[bytes], environ: dict[bytes, bytes],
                                                            code: int) -> None:
    import subprocess
    import sys

    env = {k.encode(): v.encode() for k, v in base_environ(dsn).items()} | environ
    proc = subprocess.run([sys.executable.encode(), b"-m", b"paygate_cli", *argv], env=env, capture_output=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == code, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
