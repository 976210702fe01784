"""every command and every worker runs with all five secret files present (a database URL
with a password, the fee seed, the lane seeds, the journal keys, a heartbeat URL), at debug log
level, with a metrics directory, through their ordinary and their error paths (bad config, a
traceback, the database or the RPC down, a missing secret file, a real kill at a crash point), and
no secret value, nor the hex or base64 of a raw key, appears in any stdout, stderr, `.prom` file
or report file.

`paygate demo` is not run: it takes minutes and never reads the operator's secrets (it generates
its own keys for a private Postgres and devnet); its output is covered by the demo tests."""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from paygate_cli.catalogue import WORKERS
from paygate_cli.errors import ExitCode
from tests.support.chain_env import JOURNAL_KEY_ID, admit_deposit, sign_deposit
from tests.support.charges_support import admit_charge
from tests.support.cli import Result, base_environ, run_cli, run_proc
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.drill_support import crash_tick
from tests.support.pg import PgServer

pytestmark = pytest.mark.slow

DEPOSIT = 20_000_000


def raw_encodings(raw: bytes) -> list[str]:
    b64 = base64.b64encode(raw).decode()
    return [raw.hex(), raw.hex().upper(), b64, b64.rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("=")]


class Secrets:
    """The five secret files for one test, and every form of every value that must never show."""

    def __init__(self, directory: Path, devnet: DevnetHandle, dsn: str) -> None:
        from stellar_sdk import Keypair

        directory.mkdir(parents=True, exist_ok=True)
        g = devnet.genesis
        self.password = "pw-" + secrets.token_hex(12)  # trust auth on the test cluster: sent, not needed
        self.database_url = make_conninfo(dsn, password=self.password)
        self.heartbeat_url = f"https://hc-ping.example/{secrets.token_hex(16)}"
        journal_key = secrets.token_bytes(32)
        lane_seeds = [p["secret"] for p in g["lanes"]]
        fee_seed = g["fee_account"]["secret"]
        self.files = {
            "database-url": self.database_url + "\n",
            "fee-secret": fee_seed + "\n",
            "lane-secrets": "".join(s + "\n" for s in lane_seeds),
            "journal-keys": json.dumps({JOURNAL_KEY_ID: journal_key.hex()}),
            "heartbeat-url": self.heartbeat_url + "\n",
        }
        self.paths = {}
        for name, text in self.files.items():
            path = directory / name
            path.write_text(text)
            path.chmod(0o600)
            self.paths[name] = str(path)
        forms = [self.password, self.database_url, self.heartbeat_url, self.heartbeat_url.rsplit("/", 1)[1],
                 self.files["lane-secrets"].strip(), self.files["journal-keys"], *raw_encodings(journal_key)]
        for seed in [fee_seed, *lane_seeds]:
            forms += [seed, *raw_encodings(Keypair.from_secret(seed).raw_secret_key())]
        self.forms = sorted(set(forms), key=len, reverse=True)

    def environ(self, devnet: DevnetHandle, **extra: str) -> dict[str, str]:
        g = devnet.genesis
        environ = base_environ(
            None,
            PAYGATE_DATABASE_URL_FILE=self.paths["database-url"],
            PAYGATE_FEE_SECRET_FILE=self.paths["fee-secret"],
            PAYGATE_LANE_SECRETS_FILE=self.paths["lane-secrets"],
            PAYGATE_JOURNAL_KEYS_FILE=self.paths["journal-keys"],
            PAYGATE_HEARTBEAT_URL_FILE=self.paths["heartbeat-url"],
            PAYGATE_JOURNAL_ACTIVE_KEY_ID=JOURNAL_KEY_ID,
            PAYGATE_RPC_URL=devnet.url,
            PAYGATE_NETWORK_PASSPHRASE=g["passphrase"],
            PAYGATE_BILLING_CONTRACT=g["contracts"]["billing"],
            PAYGATE_USDC_CONTRACT=g["contracts"]["usdc"],
            PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT="1",
            PAYGATE_RPC_TIMEOUT="3s",
            PAYGATE_FUNDING_LEASE="1s",
            PAYGATE_OBSERVER_START_LEDGER="1",
        )
        environ.update(extra)
        return environ


class Transcript:
    """Everything paygate printed or wrote, labelled by the command that did it."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, str]] = []

    def add(self, label: str, result: Result) -> Result:
        self.texts += [(f"{label} stdout", result.out), (f"{label} stderr", result.err)]
        return result

    def add_files(self, directory: Path) -> int:
        files = [p for p in sorted(directory.rglob("*")) if p.is_file()]
        self.texts += [(str(p), p.read_text(errors="replace")) for p in files]
        return len(files)

    def leaks(self, forms: list[str]) -> list[str]:
        return [f"{label}: a secret of {len(form)} chars" for label, text in self.texts for form in forms
                if form in text]


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=2)
    yield handle
    handle.stop()


@pytest.fixture
def world(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> Secrets:
    return Secrets(tmp_path / "secrets", devnet, dsn)


def run(transcript: Transcript, environ: dict[str, str], *args: str, process: bool = False) -> Result:
    argv = ("--log-level", "debug", *args)
    result = run_proc(*argv, environ=environ) if process else run_cli(*argv, environ=environ)
    return transcript.add(" ".join(args), result)


def test_every_command_and_worker_keeps_the_secrets_out_of_its_output(
        world: Secrets, devnet: DevnetHandle, db: psycopg.Connection, tmp_path: Path) -> None:
    metrics, reports = tmp_path / "metrics", tmp_path / "reports"
    metrics.mkdir()
    reports.mkdir()
    environ = world.environ(devnet)
    transcript = Transcript()
    user = devnet.genesis["users"][0]
    assert run(transcript, environ, "migrate", "--roles").code == 0
    db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES ('http://127.0.0.1:9/h', "
               "'0123456789abcdef0123')")
    entry, nonce, expiration = sign_deposit(devnet, user["secret"], DEPOSIT, valid_ledgers=300)
    credit_id = admit_deposit(db, user["public"], DEPOSIT, entry, nonce, expiration, "grep-deposit")

    # the money movers first, so the keys are really used (signing, journal encryption)
    for _ in range(8):
        result = run(transcript, environ, "run-tick", "funding", "--once", "--metrics-dir", str(metrics))
        assert result.code == 0, result.err
        devnet.close_ledger()
    assert db.execute("SELECT status FROM paygate.deposits").fetchone()[0] == "settled"
    admit_charge(db, user["public"], 1_000, "grep-charge")
    for worker in WORKERS:
        result = run(transcript, environ, "run-tick", worker, "--once", "--json", "--metrics-dir", str(metrics))
        assert result.code in (0, 1), f"{worker}: {result.err}"
        devnet.close_ledger()
    assert db.execute("SELECT count(*) FROM paygate.lineages WHERE envelope IS NOT NULL"
                      ).fetchone()[0] >= 3  # deposit, credit, charge_batch: signed and journaled

    commands: list[tuple[str, ...]] = [
        ("status",), ("status", "--json"), ("workers",), ("workers", "--json"),
        ("config", "show", "--sources"), ("config", "show", "--sources", "--json"),
        ("nonce-inspect",), ("nonce-inspect", "--deposit", str(credit_id), "--json"),
        ("trace", "deposit", str(credit_id)), ("trace", "deposit", str(credit_id), "--json"),
        ("trace", "account", user["public"], "--plain"),
        ("reconcile-report",), ("reconcile-report", "--format", "json", "--out", str(reports / "r.json")),
        ("drain", "--instance", "grep-host", "--force", "--reason", "probe", "--dry-run"),
        ("undrain", "--instance", "grep-host", "--dry-run"),
        ("halt", "--reason", "probe", "--yes"), ("resume", "--yes"),
        ("replay", "webhooks", "--all-dead", "--dry-run"), ("replay", "deposits", str(credit_id), "--dry-run"),
        ("key-retire-check", JOURNAL_KEY_ID), ("key-retire-check", JOURNAL_KEY_ID, "--json"),
        ("recover-check", "--dry-run"), ("recover-check", "--yes", "--json"),
        ("devnet", "state", "--url", devnet.url, "--json"),
        ("migrate", "--dry-run"),
    ]
    for args in commands:
        result = run(transcript, environ, *args)
        assert result.code not in (ExitCode.SOFTWARE, ExitCode.CONFIG, ExitCode.NOPERM), f"{args}: {result.err}"
    # one real process too: what __main__ prints outside the in-process harness
    assert run(transcript, environ, "status", "--json", process=True).code in (0, 1)

    assert transcript.add_files(metrics) >= len(WORKERS)
    assert transcript.add_files(reports) == 1
    assert transcript.leaks(world.forms) == []


def test_error_paths_keep_the_secrets_out_too(world: Secrets, devnet: DevnetHandle, db: psycopg.Connection,
                                              pg_server: PgServer, tmp_path: Path) -> None:
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    transcript = Transcript()
    environ = world.environ(devnet)
    user = devnet.genesis["users"][0]
    entry, nonce, expiration = sign_deposit(devnet, user["secret"], DEPOSIT, valid_ledgers=300)
    admit_deposit(db, user["public"], DEPOSIT, entry, nonce, expiration, "grep-crash")

    # killed at crash points (SIGKILL after signing and anchoring: the keys were in use)
    for point in ("funding.after_claim", "funding.after_anchor"):
        result = crash_tick({**environ, "PAYGATE_LOG_LEVEL": "debug"}, "funding", point,
                            "--metrics-dir", str(metrics))
        transcript.add(f"crash at {point}", result)
        time.sleep(1.5)  # the dead worker's 1s lease lapses: the next tick takes the row over

    # a bad setting (78), a missing secret file (78), the RPC down mid-tick (69)
    bad = run(transcript, {**environ, "PAYGATE_WEBHOOK_TIMEOUT": "banana"}, "status", "--json")
    assert bad.code == ExitCode.CONFIG
    missing = run(transcript, {**environ, "PAYGATE_FEE_SECRET_FILE": str(tmp_path / "nope")},
                  "run-tick", "funding", "--once")
    assert missing.code == ExitCode.CONFIG
    other = devnet.genesis["users"][1]  # fresh work, so the tick must reach the (unreachable) RPC
    entry, nonce, expiration = sign_deposit(devnet, other["secret"], DEPOSIT, valid_ledgers=300)
    admit_deposit(db, other["public"], DEPOSIT, entry, nonce, expiration, "grep-rpc-down")
    rpc_down = run(transcript, {**environ, "PAYGATE_RPC_URL": "http://127.0.0.1:9/", "PAYGATE_RPC_TIMEOUT": "1s"},
                   "run-tick", "funding", "--once", "--metrics-dir", str(metrics), process=True)
    assert rpc_down.code in (ExitCode.UNAVAILABLE, 1), rpc_down.err

    # the database down: the URL (with its password) names a socket nobody listens on (69)
    down_dir = tmp_path / "down"
    down = Secrets(down_dir, devnet, f"postgresql:///postgres?host={tmp_path}&port=1&user=postgres")
    down_env = down.environ(devnet)
    for args in (("status",), ("status", "--json"), ("run-tick", "webhooks", "--once", "--metrics-dir", str(metrics))):
        result = run(transcript, down_env, *args, process=True)
        assert result.code in (ExitCode.UNAVAILABLE, 1), result.err

    # a bug (70) with PAYGATE_DEBUG=1: the traceback is printed
    broken = pg_server.create_database()
    try:
        with psycopg.connect(broken, autocommit=True) as conn:
            conn.execute("DROP TABLE paygate.webhook_outbox")
        bug = Secrets(tmp_path / "bug", devnet, broken)
        result = run(transcript, {**bug.environ(devnet), "PAYGATE_DEBUG": "1"}, "run-tick", "webhooks", "--once",
                     "--metrics-dir", str(metrics), process=True)
        assert result.code == ExitCode.SOFTWARE and "Traceback" in result.err, result.err
    finally:
        pg_server.drop_database(broken)

    transcript.add_files(metrics)
    forms = sorted({*world.forms, *down.forms, *bug.forms}, key=len, reverse=True)
    assert transcript.leaks(forms) == []


def test_the_grep_finds_each_form_of_a_secret(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> None:
    """The check above can fail: a transcript holding any one form of any secret is reported."""
    from stellar_sdk import Keypair

    world = Secrets(tmp_path / "s", devnet, dsn)
    seed = devnet.genesis["lanes"][1]["secret"]
    raw = Keypair.from_secret(seed).raw_secret_key()
    journal_hex = json.loads(world.files["journal-keys"])[JOURNAL_KEY_ID]
    for leaked in (seed, raw.hex(), base64.b64encode(raw).decode(), world.password, journal_hex,
                   base64.b64encode(bytes.fromhex(journal_hex)).decode(), world.heartbeat_url.rsplit("/", 1)[1]):
        transcript = Transcript()
        transcript.add("probe", Result(0, f"line with {leaked} inside", ""))
        assert transcript.leaks(world.forms), leaked


def test_every_form_is_scrubbed_from_log_lines(devnet: DevnetHandle, dsn: str, tmp_path: Path) -> None:
    """The second line of defence: once a secret file is read, each line, JSON value, raw-key
    encoding and URL token of it is scrubbed from any log text, not only the whole file's text."""
    from paygate_cli.secrets import read_secret_file, scrub

    world = Secrets(tmp_path / "s", devnet, dsn)
    for name in ("lane-secrets", "fee-secret", "journal-keys", "heartbeat-url"):
        read_secret_file(world.paths[name], variable=name)
    for form in world.forms:
        if form in (world.password, world.database_url):
            continue  # the DSN's password is registered when settings parse the URL
        assert form not in scrub(f"... {form} ..."), f"a {len(form)}-char form is not scrubbed"


def test_an_rpc_url_carrying_a_key_never_shows(world: Secrets, devnet: DevnetHandle, db: psycopg.Connection,
                                               tmp_path: Path) -> None:
    """Providers put API keys in the RPC URL (userinfo, path, query). Every command and the money
    movers' ticks, through their ordinary and their RPC-down paths, name an endpoint by its host only."""
    user_pw, path_key, query_key = (secrets.token_hex(10) for _ in range(3))
    keyed = f"http://rpcuser:{user_pw}@127.0.0.1:{devnet.url.rsplit(':', 1)[1]}/v1/{path_key}?apikey={query_key}"
    down = f"http://rpcuser:{user_pw}@127.0.0.1:9/v1/{path_key}?apikey={query_key}"
    environ = world.environ(devnet, PAYGATE_RPC_URL=keyed, PAYGATE_RPC_READ_URLS=keyed)
    transcript = Transcript()
    user = devnet.genesis["users"][0]
    entry, nonce, expiration = sign_deposit(devnet, user["secret"], DEPOSIT, valid_ledgers=300)
    credit_id = admit_deposit(db, user["public"], DEPOSIT, entry, nonce, expiration, "grep-keyed-rpc")
    for _ in range(6):
        result = run(transcript, environ, "run-tick", "funding", "--once")
        assert result.code == 0, result.err
        devnet.close_ledger()
    assert db.execute("SELECT status FROM paygate.deposits").fetchone()[0] == "settled"
    for worker in ("observer", "reconciler", "gas", "relay_expiry"):
        assert run(transcript, environ, "run-tick", worker, "--once", "--json").code in (0, 1)
    for args in (("status",), ("status", "--json"), ("config", "show", "--sources", "--json"), ("nonce-inspect",),
                 ("nonce-inspect", "--deposit", str(credit_id), "--json"), ("reconcile-report",),
                 ("key-retire-check", JOURNAL_KEY_ID, "--json"), ("trace", "deposit", str(credit_id), "--json")):
        result = run(transcript, environ, *args)
        assert result.code not in (ExitCode.SOFTWARE, ExitCode.CONFIG), f"{args}: {result.err}"
    dead = world.environ(devnet, PAYGATE_RPC_URL=down, PAYGATE_RPC_READ_URLS=down, PAYGATE_RPC_TIMEOUT="1s")
    other = devnet.genesis["users"][1]
    entry, nonce, expiration = sign_deposit(devnet, other["secret"], DEPOSIT, valid_ledgers=300)
    admit_deposit(db, other["public"], DEPOSIT, entry, nonce, expiration, "grep-keyed-rpc-down")
    for args in (("run-tick", "funding", "--once"), ("status", "--json"), ("key-retire-check", JOURNAL_KEY_ID),
                 ("replay", "deposits", str(credit_id), "--dry-run"), ("trace", "deposit", str(credit_id)),
                 ("recover-check", "--yes")):
        result = run(transcript, dead, *args, process=True)
        assert result.code not in (0, ExitCode.SOFTWARE), f"{args}: {result.err}"
    assert any("127.0.0.1:9" in text for _, text in transcript.texts), "the host is named"
    assert transcript.leaks([user_pw, path_key, query_key, keyed, down]) == []
