"""Wiring paygate to a real devnet for money-path tests: key files written from the devnet's
genesis, a user's signed deposit authorisation, admission through the SQL function, chain reads
through SorobanServer only."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from stellar_sdk import Keypair, SorobanServer, TransactionBuilder, scval, xdr
from stellar_sdk.auth import authorize_entry, authorize_invocation
from stellar_sdk.client.requests_client import RequestsClient

from tests.support.cli import Result, base_environ, run_cli
from tests.support.devnet_support import DevnetHandle

JOURNAL_KEY_ID = "k2026"


@dataclass
class ChainEnv:
    devnet: DevnetHandle
    dsn: str
    environ: dict[str, str]

    @property
    def genesis(self) -> dict[str, Any]:
        return self.devnet.genesis

    def tick(self, worker: str = "funding", *args: str, **extra: str) -> Result:
        return run_cli("run-tick", worker, "--json", *args, environ={**self.environ, **extra})

    def server(self) -> SorobanServer:
        return SorobanServer(self.devnet.url, client=RequestsClient(num_retries=0))


def chain_environ(devnet: DevnetHandle, dsn: str, directory: Path, *, lanes: int | None = None) -> dict[str, str]:
    directory.mkdir(parents=True, exist_ok=True)
    g = devnet.genesis
    lane_pairs = g["lanes"][:lanes] if lanes else g["lanes"]
    (directory / "lanes").write_text("".join(p["secret"] + "\n" for p in lane_pairs))
    (directory / "fee").write_text(g["fee_account"]["secret"] + "\n")
    (directory / "journal-keys").write_text(json.dumps({JOURNAL_KEY_ID: os.urandom(32).hex()}))
    for name in ("lanes", "fee", "journal-keys"):
        (directory / name).chmod(0o600)
    return base_environ(
        dsn,
        PAYGATE_RPC_URL=devnet.url,
        PAYGATE_NETWORK_PASSPHRASE=g["passphrase"],
        PAYGATE_LANE_SECRETS_FILE=str(directory / "lanes"),
        PAYGATE_FEE_SECRET_FILE=str(directory / "fee"),
        PAYGATE_JOURNAL_KEYS_FILE=str(directory / "journal-keys"),
        PAYGATE_JOURNAL_ACTIVE_KEY_ID=JOURNAL_KEY_ID,
        PAYGATE_BILLING_CONTRACT=g["contracts"]["billing"],
        PAYGATE_USDC_CONTRACT=g["contracts"]["usdc"],
        PAYGATE_FUNDING_LEASE="1s",
        PAYGATE_RPC_TIMEOUT="3s",
        PAYGATE_RPC_ALLOW_SINGLE_ENDPOINT="1",  # one devnet: a development quorum of one host
    )


# What only the workers that start transactions are given. Recovery gets none of it (jobs/: its
# systemd drop-in and CronJob mount the database URL and the journal keys): it resends journaled
# bytes and never signs or builds a call.
FOR_SIGNERS_ONLY = ("PAYGATE_LANE_SECRETS_FILE", "PAYGATE_FEE_SECRET_FILE", "PAYGATE_BILLING_CONTRACT",
                    "PAYGATE_USDC_CONTRACT", "CREDENTIALS_DIRECTORY")


def recovery_environ(environ: dict[str, str]) -> dict[str, str]:
    """`environ` as recovery is deployed: the database, RPC and the journal keys; no lane or fee seed."""
    least = {k: v for k, v in environ.items() if k not in FOR_SIGNERS_ONLY}
    assert "PAYGATE_JOURNAL_KEYS_FILE" in least and not [k for k in least if "SECRET" in k]
    return least


def credentials_type(upgraded: bool) -> xdr.SorobanCredentialsType:
    """The address-credential version a wallet signs with: ADDRESS_V2 (CAP-71, current SDKs) or the
    legacy ADDRESS (v1) that stellar-rpc records without `useUpgradedAuth` and older SDKs produce."""
    ct = xdr.SorobanCredentialsType
    return ct.SOROBAN_CREDENTIALS_ADDRESS_V2 if upgraded else ct.SOROBAN_CREDENTIALS_ADDRESS


def sign_deposit(devnet: DevnetHandle, user_secret: str, amount: int, *, valid_ledgers: int = 100,
                 to: str | None = None, contract: str | None = None, passphrase: str | None = None,
                 nonce: int | None = None, upgraded: bool = True) -> tuple[str, int, int]:
    """The user's wallet: authorise USDC.transfer(user, billing, amount). -> (entry b64, nonce, expiration).
    `upgraded=False` signs legacy ADDRESS (v1) credentials instead of ADDRESS_V2."""
    g = devnet.genesis
    user = Keypair.from_secret(user_secret)
    invocation = xdr.SorobanAuthorizedInvocation(
        function=xdr.SorobanAuthorizedFunction(
            type=xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN,
            contract_fn=xdr.InvokeContractArgs(
                contract_address=scval.to_address(contract or g["contracts"]["usdc"]).address,
                function_name=xdr.SCSymbol(b"transfer"),
                args=[scval.to_address(user.public_key), scval.to_address(to or g["contracts"]["billing"]),
                      scval.to_int128(amount)])),
        sub_invocations=[])
    expiration = devnet.latest_ledger() + valid_ledgers
    entry = authorize_invocation(user, None, expiration, invocation, passphrase or g["passphrase"],
                                 credentials_type=credentials_type(upgraded))
    if nonce is not None:  # a chosen nonce: set it, then sign the entry again (the signature covers it)
        creds = entry.credentials.address_v2 or entry.credentials.address
        creds.nonce = xdr.Int64(nonce)
        entry = authorize_entry(entry, user, expiration, passphrase or g["passphrase"])
    creds = entry.credentials.address_v2 or entry.credentials.address
    return entry.to_xdr(), int(creds.nonce.int64), expiration


def admit_deposit(conn: psycopg.Connection, account: str, amount: int, entry: str, nonce: int, expiration: int,
                  key: str) -> int:
    row = conn.execute("SELECT deposit_id FROM paygate.admit_deposit(%s, %s, %s, %s, %s, %s)",
                       (account, amount, entry, nonce, expiration, key)).fetchone()
    return int(row[0])


def billing_balance(chain: ChainEnv, account: str) -> int:
    """balance(account) on the billing contract, read by simulation (no transaction sent)."""
    g = chain.genesis
    reader = Keypair.from_secret(g["users"][-1]["secret"])
    with chain.server() as server:
        source = server.load_account(reader.public_key)
        tx = (TransactionBuilder(source, g["passphrase"], base_fee=100)
              .append_invoke_contract_function_op(g["contracts"]["billing"], "balance", [scval.to_address(account)])
              .set_timeout(300).build())
        sim = server.simulate_transaction(tx)
        assert sim.error is None, sim.error
        return int(scval.to_native(xdr.SCVal.from_xdr(sim.results[0].xdr)))


def contract_events(chain: ChainEnv, topic: str) -> list[dict[str, Any]]:
    """Every event of the billing/USDC contracts with this first topic, from ledger 1 on."""
    from stellar_sdk.soroban_rpc import EventFilter, EventFilterType

    g = chain.genesis
    found = []
    with chain.server() as server:
        cursor = None
        while True:
            kwargs: dict[str, Any] = {"cursor": cursor} if cursor else {"start_ledger": 1}
            page = server.get_events(filters=[EventFilter(event_type=EventFilterType.CONTRACT, contract_ids=[
                g["contracts"]["billing"], g["contracts"]["usdc"]])], limit=1000, **kwargs)
            for event in page.events:
                topics = [scval.to_native(t) for t in event.topic]
                if topics and topics[0] == topic:
                    found.append({"id": event.id, "topics": topics, "value": scval.to_native(event.value),
                                  "tx": event.transaction_hash})
            if not page.events:
                break
            cursor = page.cursor
    return found


def landed_auth_types(chain: ChainEnv, inner_hash: bytes) -> list[xdr.SorobanCredentialsType]:
    """The credential types of the auth entries in the transaction that landed under this inner hash,
    read from the chain (fee-bumped or not): what the network verified, not what paygate stored."""
    with chain.server() as server:
        landed = server.get_transaction(inner_hash.hex())
    assert landed.envelope_xdr, f"{inner_hash.hex()} is not on chain ({landed.status})"
    env = xdr.TransactionEnvelope.from_xdr(landed.envelope_xdr)
    inner = env.fee_bump.tx.inner_tx.v1.tx if env.fee_bump is not None else env.v1.tx
    return [a.credentials.type for op in inner.operations if op.body.invoke_host_function_op
            for a in op.body.invoke_host_function_op.auth]
