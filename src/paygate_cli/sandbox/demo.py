"""`paygate demo`: the system end to end on a private Postgres and the devnet, so anyone can watch
it work in a minute with no setup: deposits, one-off charges and a subscription settling on chain,
with a quarantined deposit and a charge the chain refuses among them.

It plays the API service's part (admitting deposits through `paygate.admit_deposit`, registering
webhook endpoints, writing idempotency keys) and the users' wallets (signing deposit
authorisations with the devnet's throwaway sample keys), runs the workers' ticks, and reports what
happened. A local receiver on 127.0.0.1 stands in for a customer's webhook endpoint and checks
every signature."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from paygate_cli.catalogue import get_worker
from paygate_cli.db.connect import connect
from paygate_cli.db.migrate import migrate
from paygate_cli.env import Env
from paygate_cli.errors import Unavailable
from paygate_cli.sandbox.pg_cluster import Cluster
from paygate_cli.ticks.runner import RunOptions, run_worker

DEMO_SECRET = "whsec_demo_0123456789abcdef"  # the demo receiver's own HMAC key, not a real secret
DEMO_DATABASE = "paygate_demo"
DEPOSIT = 25_000_000  # 2.5 USDC at 7 decimals

INSERT_ENDPOINT_SQL = """
INSERT INTO paygate.webhook_endpoints (url, secret, description) VALUES (%s, %s, %s) RETURNING id
"""
INSERT_EVENT_SQL = """
INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload, max_attempts) VALUES (%s, %s, %s, %s)
"""
INSERT_KEY_SQL = """
INSERT INTO paygate.idempotency_keys (scope, key, request_hash, expires_at)
VALUES ('demo', %s, %s, now() + make_interval(secs => %s))
ON CONFLICT DO NOTHING
"""
ADMIT_DEPOSIT_SQL = "SELECT deposit_id FROM paygate.admit_deposit(%s, %s, %s, %s, %s, %s)"
OPEN_DEPOSITS_SQL = "SELECT count(*) FROM paygate.deposits WHERE status = 'pending'"
DEPOSITS_REPORT_SQL = """
SELECT p.id, left(p.account, 8) || '…', p.amount::text, p.status, coalesce(p.settled_by, ''),
       coalesce(p.reason, ''), (SELECT count(*) FROM paygate.lineages l
                                WHERE l.entitlement LIKE 'deposit:' || p.id || ':%%')
FROM paygate.deposits p ORDER BY p.id
"""
BALANCES_SQL = "SELECT address, cached_balance FROM paygate.accounts ORDER BY address"
OUTBOX_REPORT_SQL = """
SELECT o.event_type, count(*) FILTER (WHERE o.status = 'delivered'), count(*) FILTER (WHERE o.status = 'pending'),
       count(*) FILTER (WHERE o.status = 'dead'), max(o.attempts),
       left(max(coalesce(o.dead_reason, '')), 60)
FROM paygate.webhook_outbox o GROUP BY o.event_type ORDER BY min(o.id)
"""
DISABLE_ENDPOINT_SQL = "UPDATE paygate.webhook_endpoints SET enabled = false WHERE id = %s"
ADMIT_CHARGE_SQL = "SELECT charge_row_id FROM paygate.admit_charge(%s, %s, %s, %s)"
CREATE_SUBSCRIPTION_SQL = """
SELECT subscription_id FROM paygate.create_subscription(%s, %s, interval '1 minute',
                                                       now() - interval '150 seconds', %s, 'demo plan')
"""
# An account whose cached balance was imported from a legacy system with no funds behind it on
# chain: the chain refuses its charge (charge_failed) and the observer gives the money back.
IMPORT_BALANCE_SQL = "UPDATE paygate.accounts SET cached_balance = cached_balance + %s WHERE address = %s"
OPEN_CHARGES_SQL = "SELECT count(*) FROM paygate.charges WHERE status NOT IN ('settled', 'failed')"
CHARGES_REPORT_SQL = """
SELECT c.id, left(c.account, 8) || '…', c.amount::text, c.status,
       CASE WHEN c.subscription_id IS NULL THEN 'one-off'
            ELSE 'subscription ' || c.subscription_id || ' @ ' || to_char(c.period_start, 'HH24:MI:SS') END,
       coalesce(c.reason, '')
FROM paygate.charges c ORDER BY c.id
"""
KEYS_LEFT_SQL = "SELECT count(*) FROM paygate.idempotency_keys WHERE scope = 'demo'"
# Relays: the operator's allow-list (configuration), the API service's admission.
ALLOW_MARKET_SQL = "INSERT INTO paygate.relay_allowlist (contract, function, note) VALUES (%s, 'buy', 'demo market')"
ADMIT_RELAY_SQL = "SELECT relay_id FROM paygate.admit_relay(%s, %s, 'buy', %s, %s, %s, %s)"
OPEN_RELAYS_SQL = "SELECT count(*) FROM paygate.relays WHERE status = 'queued'"
LIVE_LINEAGES_SQL = "SELECT count(*) FROM paygate.lineages WHERE state IN ('allocated', 'signed', 'sent')"
RELAYS_REPORT_SQL = """
SELECT r.id, left(r.account, 8) || '…', r.function, r.status, r.max_fee, f.status, coalesce(f.fee_charged, 0),
       coalesce(r.reason, '')
FROM paygate.relays r JOIN paygate.fee_reservations f ON f.relay_id = r.id ORDER BY r.id
"""
RELAY_FEES_SQL = "SELECT reserved, settled, released FROM paygate.relay_fee_totals"
RELAY_FEE = 2_000_000  # stroops each demo relay reserves


@dataclass
class Receiver:
    """A customer endpoint on loopback: /ok answers 200, /flaky fails twice then answers 200."""

    received: list[dict[str, Any]] = field(default_factory=list)
    flaky_failures: int = 2

    def verify(self, headers: Any, body: bytes) -> bool:
        parts = dict(p.split("=", 1) for p in headers.get("Paygate-Signature", "").split(","))
        mac = hmac.new(DEMO_SECRET.encode(), f"{parts.get('t')}.".encode() + body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(mac, parts.get("v1", ""))

    def serve(self) -> ThreadingHTTPServer:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                failing = self.path == "/flaky" and receiver.flaky_failures > 0
                if failing:
                    receiver.flaky_failures -= 1
                receiver.received.append({"path": self.path, "signature_ok": receiver.verify(self.headers, body),
                                          "event": json.loads(body)["type"], "answered": 500 if failing else 200})
                self.send_response(500 if failing else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


def _fresh_database(cluster: Cluster) -> None:
    """Each demo run starts from an empty database, so its report shows only this run."""
    import psycopg

    with psycopg.connect(cluster.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DEMO_DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DEMO_DATABASE}")


def _start_devnet(log_path: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """The devnet as a child process closing a ledger every second; its genesis is its first line."""
    command = [sys.executable, "-m", "paygate_cli", "devnet", "start", "--port", "0", "--ledger-interval", "1s",
               "--seed", "demo", "--lanes", "4", "--users", "4"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    line, deadline = b"", time.monotonic() + 30
    while not line.endswith(b"\n"):
        if time.monotonic() > deadline or not selector.select(max(0.0, deadline - time.monotonic())):
            proc.kill()
            raise Unavailable(f"the devnet did not start (log: {log_path})")
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            raise Unavailable(f"the devnet exited before its genesis (log: {log_path})")
        line += chunk
    return proc, json.loads(line)


def _write_keys(directory: Path, genesis: dict[str, Any]) -> dict[str, str]:
    """The devnet's throwaway keys as secret files, the way production keys are given to paygate."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "PAYGATE_LANE_SECRETS_FILE": ("lane-secrets", "".join(p["secret"] + "\n" for p in genesis["lanes"])),
        "PAYGATE_FEE_SECRET_FILE": ("fee-secret", genesis["fee_account"]["secret"] + "\n"),
        "PAYGATE_JOURNAL_KEYS_FILE": ("journal-keys", json.dumps({"demo-1": os.urandom(32).hex()})),
    }
    environ = {}
    for variable, (name, content) in files.items():
        path = directory / name
        path.write_text(content)
        path.chmod(0o600)
        environ[variable] = str(path)
    return environ


def _tick(env: Env, worker: str) -> None:
    run_worker(env, get_worker(worker), RunOptions(once=True, lock_wait=5))


def _tick_until_done(env: Env, conn: Any, open_sql: str, workers: tuple[str, ...]) -> int:
    """One tick of each worker per round, while `open_sql` counts open work (at most 90 s)."""
    deadline, rounds = time.monotonic() + 90, 0
    while conn.execute(open_sql).fetchone()[0] and time.monotonic() < deadline:
        for worker in workers:
            _tick(env, worker)
        rounds += 1
        time.sleep(0.5)
    return rounds


def _relays(env: Env, conn: Any, chain: Any, genesis: dict[str, Any],
            say: Callable[[str], None]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Users' signed market.buy calls relayed with the gateway paying the fees: one plain buy, two
    users racing for the one-of-a-kind item (one applies, the other fails on chain and its fee is
    burned and settled all the same), and one whose authorisation expires before it can be used."""
    from paygate_cli.sandbox.devnet.contracts.market import sign_buy
    from paygate_cli.sandbox.devnet.runner import call as devnet_admin

    market, users = genesis["contracts"]["market"], genesis["users"]
    conn.execute(ALLOW_MARKET_SQL, (market,))

    def admit(n: int, item: str, valid_ledgers: int) -> None:
        latest = chain.latest_ledger().sequence
        args, entry = sign_buy(user_secret=users[n]["secret"], market=market, item=item, price=5 + n,
                               passphrase=genesis["passphrase"], expiration_ledger=latest + valid_ledgers)
        conn.execute(ADMIT_RELAY_SQL, (users[n]["public"], market, args, [entry], RELAY_FEE, f"demo-relay-{n}"))

    admit(0, "book", 100)
    ticks = _tick_until_done(env, conn, OPEN_RELAYS_SQL, ("relay",))
    # Every lane free before the race (earlier phases' last lineages resolved by their own workers):
    # both racers must be simulated in one tick, before either can land.
    ticks += _tick_until_done(env, conn, LIVE_LINEAGES_SQL, ("funding", "settlement", "relay"))
    admit(1, "limited", 100)
    admit(2, "limited", 100)
    admit(3, "book", 1)
    time.sleep(2.5)  # two ledgers close: the last authorisation is past its expiration ledger
    # A busy network holds the first racer back six ledgers: both simulate with the item in stock,
    # the second lands first and gets it, the first then fails on chain (its fee burned all the same).
    devnet_admin(genesis["url"], "devnet_setFault", {"kind": "hold_next", "ledgers": 6})
    ticks += _tick_until_done(env, conn, OPEN_RELAYS_SQL, ("relay", "relay_expiry"))
    devnet_admin(genesis["url"], "devnet_clearFaults", {})
    say(f"8. relayed 4 market.buy calls (two racing for one item, one with an authorisation that expired) "
        f"in {ticks} rounds of ticks")
    relays = [dict(zip(("id", "account", "function", "status", "fee_reserved", "reservation", "fee_settled",
                        "reason"), row, strict=True)) for row in conn.execute(RELAYS_REPORT_SQL)]
    reserved, settled, released = conn.execute(RELAY_FEES_SQL).fetchone()
    return relays, {"open_reserved": int(reserved), "settled": int(settled), "released": int(released)}


def run_demo(env: Env, data_dir: Path, say: Callable[[str], None]) -> dict[str, Any]:
    from psycopg.types.json import Jsonb

    from paygate_cli.chain.contracts import billing_balance
    from paygate_cli.chain.rpc import ChainClient
    from paygate_cli.sandbox.devnet.wallet import sign_deposit

    cluster = Cluster.at(data_dir)
    say(f"1. private Postgres in {cluster.datadir} (Unix socket only)")
    cluster.up()
    _fresh_database(cluster)
    devnet, genesis = _start_devnet(data_dir.parent / "devnet.log")
    say(f"2. devnet (local Stellar RPC) at {genesis['url']}, a ledger every second")
    contracts = genesis["contracts"]
    env.environ = {**env.environ, **_write_keys(data_dir.parent / "keys", genesis)}
    env.override(database_url=cluster.dsn(DEMO_DATABASE), webhook_allow_hosts=["127.0.0.1/32"],
                 webhook_backoff_base=0.2, rpc_url=genesis["url"], network_passphrase=genesis["passphrase"],
                 billing_contract=contracts["billing"], usdc_contract=contracts["usdc"],
                 journal_active_key_id="demo-1", funding_lease=2.0, settlement_lease=2.0,
                 observer_start_ledger=1, rpc_allow_single_endpoint=True)  # one devnet node
    receiver = Receiver()
    server = receiver.serve()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with connect(env.settings, "demo") as conn:
            result = migrate(conn)
            say(f"3. schema migrated to version {result['schema_version']}")
            chain = ChainClient(env.settings, guard_conn=conn)
            latest = chain.latest_ledger().sequence
            signed = []
            for i, user in enumerate(genesis["users"][:3]):
                entry, nonce = sign_deposit(user_secret=user["secret"], amount=DEPOSIT * (i + 1),
                                            usdc=contracts["usdc"], billing=contracts["billing"],
                                            passphrase=genesis["passphrase"], expiration_ledger=latest + 200)
                signed.append((user["public"], DEPOSIT * (i + 1), entry, nonce))
            # A tampered request: the wallet signed 2.5 USDC, the request claims 5.
            bad_user = genesis["users"][3]
            entry, nonce = sign_deposit(user_secret=bad_user["secret"], amount=DEPOSIT, usdc=contracts["usdc"],
                                        billing=contracts["billing"], passphrase=genesis["passphrase"],
                                        expiration_ledger=latest + 200)
            signed.append((bad_user["public"], DEPOSIT * 2, entry, nonce))
            with conn.transaction():
                def endpoint(url: str, description: str) -> int:
                    return conn.execute(INSERT_ENDPOINT_SQL, (url, DEMO_SECRET, description)).fetchone()[0]

                endpoint(f"{base}/ok", "shop (healthy)")
                flaky_id = endpoint(f"{base}/flaky", "shop (flaky)")
                private_id = endpoint("http://[::1]:9/hook", "internal address (refused)")
                conn.execute(INSERT_EVENT_SQL, (flaky_id, "demo.hello", Jsonb({"demo": True}), 5))
                conn.execute(INSERT_EVENT_SQL, (private_id, "demo.hello", Jsonb({"demo": True}), None))
                for i in range(5):
                    conn.execute(INSERT_KEY_SQL, (f"expired-{i}", b"\x00" * 32, -60))
                    conn.execute(INSERT_KEY_SQL, (f"live-{i}", b"\x00" * 32, 3600))
            _tick(env, "webhooks")  # the refused endpoint shows its refusal once, then is switched off
            conn.execute(DISABLE_ENDPOINT_SQL, (private_id,))
            with conn.transaction():
                for n, (account, amount, entry, nonce) in enumerate(signed):
                    conn.execute(ADMIT_DEPOSIT_SQL, (account, amount, entry, nonce, latest + 200, f"demo-deposit-{n}"))
            say("4. admitted 4 deposits (one with a tampered amount), 3 webhook endpoints, 10 idempotency keys")
            ticks = _tick_until_done(env, conn, OPEN_DEPOSITS_SQL, ("funding", "observer", "webhooks"))
            say(f"5. funding settled the deposits in {ticks} rounds of ticks")
            users = [u["public"] for u in genesis["users"]]
            with conn.transaction():
                conn.execute(ADMIT_CHARGE_SQL, (users[0], 3_000_000, "demo-charge-1", "api call bundle"))
                conn.execute(ADMIT_CHARGE_SQL, (users[1], 1_500_000, "demo-charge-2", "api call bundle"))
                conn.execute(ADMIT_CHARGE_SQL, (users[1], 2_500_000, "demo-charge-3", "storage"))
                conn.execute(CREATE_SUBSCRIPTION_SQL, (users[2], 4_000_000, "demo-subscription-1"))
                conn.execute(IMPORT_BALANCE_SQL, (1_000_000, users[3]))
                conn.execute(ADMIT_CHARGE_SQL, (users[3], 700_000, "demo-charge-4", "legacy balance"))
            _tick(env, "subscriptions")
            say("6. admitted 4 one-off charges (one on a balance with nothing behind it on chain) and a "
                "per-minute subscription started 2.5 minutes ago (3 periods due)")
            ticks = _tick_until_done(env, conn, OPEN_CHARGES_SQL, ("settlement", "observer", "webhooks"))
            for _ in range(6):  # let the last webhook retries run out
                _tick(env, "webhooks")
                time.sleep(0.3)
            _tick(env, "idempotency_sweep")
            say(f"7. settlement and the observer took the charges to settled/failed in {ticks} rounds; "
                "then the idempotency sweep")
            relays, relay_fees = _relays(env, conn, chain, genesis, say)
            charges = [dict(zip(("id", "account", "amount", "status", "kind", "reason"), row, strict=True))
                       for row in conn.execute(CHARGES_REPORT_SQL)]
            deposits = [dict(zip(("id", "account", "amount", "status", "settled_by", "reason", "lineages"), row,
                                 strict=True)) for row in conn.execute(DEPOSITS_REPORT_SQL)]
            lane = genesis["lanes"][0]["public"]
            balances = [{"account": address, "cached": int(cached),
                         "on_chain": billing_balance(chain, billing=contracts["billing"], account=address, source=lane)}
                        for address, cached in conn.execute(BALANCES_SQL)]
            chain.close()
            outbox = [dict(zip(("event", "delivered", "retrying", "dead", "max_attempts", "dead_reason"), row,
                               strict=True))
                      for row in conn.execute(OUTBOX_REPORT_SQL)]
            keys_left = conn.execute(KEYS_LEFT_SQL).fetchone()[0]
    finally:
        server.shutdown()
        devnet.terminate()
        devnet.wait(10)
    return {"dsn": cluster.dsn(DEMO_DATABASE), "devnet": genesis["url"], "deposits": deposits, "charges": charges,
            "balances": balances, "outbox": outbox, "relays": relays, "relay_fees": relay_fees,
            "received": receiver.received, "idempotency_keys_left": keys_left}
