"""Every `sh` block in runbooks/ runs, in order, against a private Postgres and a devnet, after the
page's scenario produced its symptom (`<!-- scenario: NAME -->`). A block's info string says what it
must exit with (`expect=N` or `expect=N,M`, default 0) and which not-yet-landed commands it needs (`requires=replay`,
`requires=worker:gas`): those blocks are skipped with a printed reason until the CLI has them, then
they run like the rest. `<!-- test: HOOK -->` before a block lets the scenario change the world the
way the action above it would (the provider recovers, the fee account is topped up)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
import typer
from psycopg.conninfo import conninfo_to_dict

from paygate_cli.app import app
from paygate_cli.catalogue import WORKERS
from tests.support.chain_env import ChainEnv, admit_deposit, chain_environ, sign_deposit
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.pg import PgServer

ROOT = Path(__file__).resolve().parent.parent
RUNBOOKS = sorted(p for p in (ROOT / "runbooks").glob("*.md") if p.name != "README.md")
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
HOOK = re.compile(r"<!--\s*test:\s*([\w-]+)\s*-->")
SCENARIO = re.compile(r"<!--\s*scenario:\s*([\w-]+)\s*-->")
BLOCK_TIMEOUT = 60


@dataclass
class Block:
    runbook: str
    index: int
    body: str
    expect: tuple[int, ...] = (0,)  # `expect=3`, or `expect=0,3` where either outcome is right
    requires: list[str] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)  # scenario hooks to run before this block

    @property
    def id(self) -> str:
        return f"{self.runbook}#{self.index}"


def parse(path: Path) -> tuple[str, list[Block]]:
    text = path.read_text()
    scenario = SCENARIO.search(text)
    assert scenario, f"{path.name}: no <!-- scenario: NAME --> comment"
    blocks: list[Block] = []
    pending_hooks: list[str] = []
    position = 0
    for match in FENCE.finditer(text):
        pending_hooks += HOOK.findall(text, position, match.start())
        position = match.end()
        words = match.group("info").split()
        if not words or words[0] != "sh":
            continue  # text/console blocks are shown, never run
        options = dict(word.split("=", 1) for word in words[1:])
        assert set(options) <= {"expect", "requires"}, (path.name, options)
        body = "\n".join(line[len(match.group("indent")):] for line in match.group("body").splitlines())
        expect = tuple(int(code) for code in options.get("expect", "0").split(","))
        blocks.append(Block(path.stem, len(blocks), body, expect,
                            [r for r in options.get("requires", "").split(",") if r], pending_hooks))
        pending_hooks = []
    assert not pending_hooks or blocks, path.name
    return scenario.group(1), blocks


def cli_commands() -> set[str]:
    group = typer.main.get_command(app)
    ctx = group.make_context("paygate", ["status"], resilient_parsing=True)
    return set(group.list_commands(ctx))  # type: ignore[attr-defined]


def missing(block: Block) -> list[str]:
    have = cli_commands()
    return [r for r in block.requires
            if (r.startswith("worker:") and r.removeprefix("worker:") not in WORKERS)
            or (not r.startswith("worker:") and r not in have)]


# --- scenarios: each produces one page's symptom ---------------------------------------------------

@dataclass
class World:
    devnet: DevnetHandle
    dsn: str
    environ: dict[str, str]
    hooks: dict[str, Callable[[World], None]] = field(default_factory=dict)

    def db(self) -> psycopg.Connection:
        return psycopg.connect(self.dsn, autocommit=True)

    def chain(self) -> ChainEnv:
        return ChainEnv(self.devnet, self.dsn, self.environ)


def _idle(world: World) -> None:
    pass


def _running_host(world: World) -> None:
    """The host the blocks run on has ticked (its heartbeat is what `drain --instance` checks)."""
    assert world.chain().tick("webhooks", "--once", PAYGATE_INSTANCE_ID="runbook-host").code == 0


def _observer_behind_retention(world: World) -> None:
    # The devnet of this scenario keeps 8 ledgers: one observer page, then 20 ledgers pass unseen.
    world.environ["PAYGATE_OBSERVER_START_LEDGER"] = str(world.devnet.latest_ledger())
    assert world.chain().tick("observer", "--once").code == 0
    world.devnet.close_ledger(n=20)


def _deposit_needs_human(world: World) -> None:
    from tests.support.funding import submit_directly

    user = world.devnet.genesis["users"][0]
    entry, nonce, expiration = sign_deposit(world.devnet, user["secret"], 7_000_000)
    submit_directly(world.chain(), entry, user["public"], 7_000_000)  # someone else spends the nonce
    with world.db() as db:
        admit_deposit(db, user["public"], 7_000_000, entry, nonce, expiration, "runbook-spent")
    result = world.chain().tick("funding", "--once")
    assert result.code == 3, result.err


def _settled_deposit(world: World, user: int = 1, key: str = "runbook-ok") -> None:
    """A deposit that went all the way through: lanes and lineages exist for the journal checks."""
    user_keys = world.devnet.genesis["users"][user]
    entry, nonce, expiration = sign_deposit(world.devnet, user_keys["secret"], 5_000_000)
    with world.db() as db:
        pending = admit_deposit(db, user_keys["public"], 5_000_000, entry, nonce, expiration, key)
        for _ in range(20):
            assert world.chain().tick("funding", "--once").code in (0, 1)
            if db.execute("SELECT status FROM paygate.deposits WHERE id = %s", (pending,)).fetchone()[0] \
                    == "settled":
                break
            world.devnet.close_ledger()
        else:
            raise AssertionError("the deposit did not settle")


def _restore_lost_a_commit(world: World) -> None:
    """A real restore that lost commits: a deposit settles (its ticks record the database's
    identity), `pg_dump -Fc` is taken, a second deposit settles (its transfer and credit land on
    chain: the commits the backup will not have), and the dump is restored over the database
    (a new database under the same name: the identity the dump carried no longer matches). The
    lanes the second deposit used are ahead of the restored journal on chain."""
    from tests.support.pg_backup import restore_over, take_dump

    _settled_deposit(world)
    dump = take_dump(world.dsn, Path(world.environ["PAYGATE_JOURNAL_KEYS_FILE"]).parent / "backup.dump")
    _settled_deposit(world, user=0, key="runbook-after-backup")
    restore_over(world.dsn, dump.path)
    world.chain().tick("webhooks", "--once")  # the first tick on the restored database sees it
    with world.db() as db:
        assert db.execute("SELECT reason FROM paygate.halts WHERE kind = 'restore'").fetchone(), \
            "the first tick after the restore set no restore halt"

    def workers_ran(w: World) -> None:  # the timers started again: recovery and the observer ticked
        for worker in ("recovery", "observer"):
            assert w.chain().tick(worker, "--once").code in (0, 1, 3)
    world.hooks["workers-ran"] = workers_ran


def _lane_fenced_chain_ahead(world: World) -> None:
    """While a lane is idle, a transaction paygate never journaled takes its next sequence; the next
    allocation on that lane fences it (a deposit waiting for a lane makes one happen)."""
    _settled_deposit(world)
    with world.db() as db:
        lane = db.execute("SELECT address FROM paygate.lanes WHERE status = 'active'"
                          " ORDER BY last_allocated_at NULLS FIRST, address LIMIT 1").fetchone()[0]
    world.devnet.rpc("devnet_consumeSequence", {"account": lane})
    world.devnet.close_ledger()
    user = world.devnet.genesis["users"][2]
    entry, nonce, expiration = sign_deposit(world.devnet, user["secret"], 3_000_000)
    with world.db() as db:
        admit_deposit(db, user["public"], 3_000_000, entry, nonce, expiration, "runbook-fenced")
    result = world.chain().tick("funding", "--once")
    assert result.code == 3, result.err


def _lanes(world: World) -> None:
    """The lanes of lane-secrets registered, as the journal does at its first allocation."""
    with world.db() as db:
        db.execute("INSERT INTO paygate.lanes (address) SELECT unnest(%s::text[])",
                   ([lane["public"] for lane in world.devnet.genesis["lanes"]],))


def _gas_halt(world: World) -> None:
    # What the gas monitor writes below its critical floor (the same row; the worker lands separately).
    with world.db() as db:
        db.execute("INSERT INTO paygate.halts (kind, reason, set_by)"
                   " VALUES ('gas', 'fee account headroom 40 XLM below critical floor 50 XLM', 'gas')")

    def topped_up(w: World) -> None:  # the gas monitor clears it above the resume floor
        with w.db() as db:
            db.execute("DELETE FROM paygate.halts WHERE kind = 'gas'")
    world.hooks["headroom-restored"] = topped_up


def _drift(world: World) -> None:
    # The cached balance says 5 USDC, the billing contract holds nothing for this account.
    user = world.devnet.genesis["users"][2]["public"]
    with world.db() as db:
        db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 50000000)", (user,))


def _dead_webhooks(world: World) -> None:
    with world.db() as db:
        endpoint = db.execute("INSERT INTO paygate.webhook_endpoints (url, secret) VALUES"
                              " ('https://merchant.example/hooks', %s) RETURNING id", ("s" * 32,)).fetchone()[0]
        db.execute("INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload, status, attempts,"
                   " last_status_code, dead_at, dead_reason) VALUES (%s, 'deposit.settled', '{}', 'dead', 8, 503,"
                   " now(), 'HTTP 503 after 8 attempts')", (endpoint,))


def _rpc_outage(world: World) -> None:
    world.devnet.set_fault("http_503")
    world.hooks["provider-recovered"] = lambda w: w.devnet.clear_faults()


def _observer_unconfigured(world: World) -> None:
    world.environ.pop("PAYGATE_OBSERVER_START_LEDGER", None)

    def configured(w: World) -> None:
        # "the billing contract's deployment ledger": in this shared devnet, where this page starts
        # (earlier pages' events are not this database's).
        w.environ["PAYGATE_OBSERVER_START_LEDGER"] = str(w.devnet.close_ledger()["latestLedger"])
    world.hooks["configured"] = configured


def _fee_capped(world: World) -> None:
    """What the engine journals when the market asks more than the cap: the last price read, and a
    sent deposit lineage marked fee-capped (it waits, resending the same bytes)."""
    lane = world.devnet.genesis["lanes"][0]["public"]
    with world.db() as db:
        db.execute("INSERT INTO paygate.fee_market (percentile, price, max_fee, transactions, ledgers, ledger,"
                   " endpoint) VALUES ('p90', 250000, 400000, 90, 10, 50, '127.0.0.1')")
        db.execute("INSERT INTO paygate.lanes (address) VALUES (%s)", (lane,))
        db.execute("INSERT INTO paygate.lineages (purpose, entitlement, lane, state, source_seq, key_id, envelope,"
                   " inner_hash, outer_hash, max_time, signed_at_ledger, bid_rate, bid_ledger, fee_ops, resource_fee,"
                   " cap_rate, replacements, fee_required, fee_capped_at) VALUES ('deposit', 'deposit:1:deposit', %s,"
                   " 'sent', 7, 'k1', %s, %s, %s, 2000000000, 40, 20000, 40, 2, 50000, 100000, 1, 250000,"
                   " now() - interval '12 minutes')", (lane, b"\x01" * 40, os.urandom(32), os.urandom(32)))

    def market_fell(w: World) -> None:  # the market went under its bid: the engine clears the cap mark
        with w.db() as db:
            db.execute("UPDATE paygate.lineages SET fee_capped_at = NULL, fee_required = NULL")
    world.hooks["market-fell"] = market_fell


def _contract_ttl(world: World) -> None:
    """What the TTL keeper records when the billing contract's instance reads archived (one restore
    queued, as by paygate.request_restore) and an account's balance entry was archived again after
    its restore (a human is asked, with the key). The keys are the real ones of this devnet."""
    from stellar_sdk import Address, scval, xdr

    billing, user = world.devnet.genesis["contracts"]["billing"], world.devnet.genesis["users"][2]["public"]

    def data_key(key: xdr.SCVal) -> str:
        return xdr.LedgerKey(type=xdr.LedgerEntryType.CONTRACT_DATA, contract_data=xdr.LedgerKeyContractData(
            contract=Address(billing).to_xdr_sc_address(), key=key,
            durability=xdr.ContractDataDurability.PERSISTENT)).to_xdr()

    instance = data_key(xdr.SCVal(type=xdr.SCValType.SCV_LEDGER_KEY_CONTRACT_INSTANCE))
    balance = data_key(scval.to_vec([scval.to_symbol("Balance"), scval.to_address(user)]))
    with world.db() as db:
        db.execute("INSERT INTO paygate.accounts (address, cached_balance) VALUES (%s, 40000000)", (user,))
        db.execute("INSERT INTO paygate.ttl_entries (key_hash, key_xdr, kind, state, live_until, read_ledger, read_at)"
                   " VALUES (sha256(decode(%s, 'base64')), %s, 'instance', 'archived', 90, 120, now())",
                   (instance, instance))
        db.execute("SELECT paygate.request_restore(ARRAY[%s], 'ttl')", (instance,))
        db.execute("INSERT INTO paygate.ttl_entries (key_hash, key_xdr, kind, account, state, live_until, read_ledger,"
                   " read_at, restored_at, reason) VALUES (sha256(decode(%s, 'base64')), %s, 'account_balance', %s,"
                   " 'needs_human', 100, 120, now(), now() - interval '40 days', 'archived again after its restore: "
                   "the keeper did not keep it alive; restore it by hand (runbooks/contract-ttl.md), key ' || %s)",
                   (balance, balance, user, balance))

    def restored(w: World) -> None:  # restored by hand: the keeper's next reads see both live again
        with w.db() as db:
            db.execute("UPDATE paygate.ttl_entries SET state = 'live', reason = NULL, live_until = 2000000,"
                       " restored_at = now()")
            db.execute("UPDATE paygate.ttl_jobs SET status = 'applied', finished_at = now() WHERE status = 'pending'")
    world.hooks["restored-by-hand"] = restored


SCENARIOS: dict[str, Callable[[World], None]] = {
    "idle": _idle, "running-host": _running_host, "observer-behind-retention": _observer_behind_retention,
    "deposit-needs-human": _deposit_needs_human, "gas-halt": _gas_halt,
    "lanes": _lanes, "restore-lost-a-commit": _restore_lost_a_commit,
    "lane-fenced-chain-ahead": _lane_fenced_chain_ahead,
    "drift": _drift, "dead-webhooks": _dead_webhooks, "rpc-outage": _rpc_outage,
    "observer-unconfigured": _observer_unconfigured, "fee-capped": _fee_capped, "contract-ttl": _contract_ttl,
}
SHORT_RETENTION = {"observer-behind-retention"}


@pytest.fixture(scope="module")
def shared_devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path_factory.mktemp("devnet"), lanes=2, users=3)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def short_devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetHandle]:
    """Keeps 8 ledgers of events: an observer that misses 20 is behind retention."""
    handle = start_devnet(tmp_path_factory.mktemp("short-devnet"), lanes=2, users=1, retention=8)
    yield handle
    handle.stop()


def block_environ(world: World) -> dict[str, str]:
    info = conninfo_to_dict(world.dsn)
    pg = {f"PG{k.upper()}": str(info[v]) for k, v in (("host", "host"), ("port", "port"), ("database", "dbname"),
                                                       ("user", "user")) if info.get(v)}
    return {**world.environ, **pg, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PAYGATE_DEVNET_URL": world.devnet.url, "PAYGATE_INSTANCE_ID": "runbook-host",
            "PAYGATE_OPERATOR": "runbook-test", "PAYGATE_LOG_FORMAT": "text", "COLUMNS": "200",
            "PSQL_PAGER": "", "PAGER": "cat"}


def run_block(block: Block, world: World) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.body], env=block_environ(world),
                          capture_output=True, text=True, timeout=BLOCK_TIMEOUT, stdin=subprocess.DEVNULL)


PAGES = [(path, *parse(path)) for path in RUNBOOKS]


def test_the_runbooks_named_by_the_design_exist() -> None:
    names = {p.stem for p in RUNBOOKS}
    assert {"worker-exit-3", "deposit-needs-human", "observer-behind-retention", "gas-halt",
            "reconciliation-drift", "journal-key-rotation", "lane-rotation-and-drain", "replay-dead-work",
            "deploy-upgrade", "postgres-failover-restore", "rpc-provider-outage"} <= names
    for path in RUNBOOKS:
        text = path.read_text()
        for heading in ("## Symptom", "## Diagnose", "## Act", "## Verify", "## Escalate"):
            assert heading in text, (path.name, heading)


def test_every_alert_links_an_existing_runbook() -> None:
    import yaml

    rules = yaml.safe_load((ROOT / "jobs" / "prometheus" / "paygate.rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert (ROOT / rule["annotations"]["runbook_url"]).is_file(), rule["alert"]


def test_executed_blocks_use_only_existing_commands_unless_marked() -> None:
    """A block that calls a command this CLI lacks must say so (requires=…), or it would fail."""
    have = cli_commands()
    for _, _, blocks in PAGES:
        for block in blocks:
            used = set(re.findall(r"(?:^|[|;&(]\s*|\$\()\s*paygate\s+([a-z][a-z-]*)", block.body, re.M))
            assert used <= have | set(block.requires), (block.id, used - have)


@pytest.mark.parametrize(("path", "scenario", "blocks"), PAGES, ids=[p.stem for p, _, _ in PAGES])
def test_runbook_commands_run_against_the_symptom(path: Path, scenario: str, blocks: list[Block],
                                                  pg_server: PgServer, request: pytest.FixtureRequest,
                                                  tmp_path: Path) -> None:
    assert scenario in SCENARIOS, f"{path.name}: unknown scenario {scenario!r}"
    devnet: DevnetHandle = request.getfixturevalue("short_devnet" if scenario in SHORT_RETENTION
                                                   else "shared_devnet")
    dsn = pg_server.create_database()
    try:
        environ = chain_environ(devnet, dsn, tmp_path / "keys")
        environ["PAYGATE_OBSERVER_START_LEDGER"] = "1"
        world = World(devnet, dsn, environ)
        SCENARIOS[scenario](world)
        ran = 0
        for block in blocks:
            for hook in block.hooks:
                world.hooks[hook](world)
            if missing(block):
                continue  # reported by test_blocks_waiting_for_a_command
            result = run_block(block, world)
            assert result.returncode in block.expect, (
                f"{block.id} exited {result.returncode}, expected {block.expect}\n--- block\n{block.body}\n"
                f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}")
            ran += 1
        assert ran, f"{path.name}: no block ran"
    finally:
        devnet.clear_faults()
        pg_server.drop_database(dsn)


WAITING = [block for _, _, blocks in PAGES for block in blocks if block.requires]


@pytest.mark.parametrize("block", WAITING, ids=[b.id for b in WAITING])
def test_blocks_waiting_for_a_command(block: Block) -> None:
    """Visible in the summary (-ra) while a block waits for its command; passes once it ran above."""
    lacking = missing(block)
    if lacking:
        pytest.skip(f"{block.id} needs {', '.join(lacking)}: not in this CLI yet, skipped until it lands")
