"""Envelopes carrying an authorisation their path may not are refused (chain/authority.py, run by
the engine after signing and before anchoring): real devnet, real Postgres, real ticks.

Where a forbidden entry can come from:
- a compromised or buggy RPC provider: a call that carries no entries of its own (credit, a bot
  job) is simulated in recording mode and the recorded entries are spliced into the transaction.
  The provider stands outside paygate, so it is the one thing played here: a forwarding proxy in
  front of the devnet that adds an entry to the simulation's answer;
- a row naming one of our own accounts as its user: a deposit signed by a lane, a relay whose
  account is the billing contract.
In every case nothing is anchored (no envelope journaled), so nothing can be broadcast. Settlement's
charge_batch carries the operator entry paygate builds (the recording is not used), so a forbidden
entry there could only come from our own code: tests/chain/test_authority_policy.py covers its policy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from stellar_sdk import TransactionEnvelope, scval, xdr

from tests.support.chain_env import ChainEnv, admit_deposit, chain_environ, contract_events, sign_deposit
from tests.support.devnet_support import DevnetHandle, start_devnet
from tests.support.relay_support import MAX_FEE, admit_close, allow_market
from tests.support.rpc_proxy import RpcProxy


class RecordingRpc(RpcProxy):
    """A provider that forwards every request to the devnet and, while `inject` holds
    (function, entry), adds the entry to the recorded auth of that function's simulations."""

    def __init__(self, upstream: str) -> None:
        self.inject: tuple[str, xdr.SorobanAuthorizationEntry] | None = None
        self.injected = 0
        super().__init__(upstream)

    def rewrite(self, request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        if self.inject is None or request.get("method") != "simulateTransaction":
            return answer
        tx = TransactionEnvelope.from_xdr(request["params"]["transaction"], "unused").transaction
        invoked = tx.operations[0].host_function.invoke_contract.function_name.sc_symbol.decode()
        function, entry = self.inject
        result = answer.get("result") or {}
        if invoked != function or not result.get("results"):
            return answer
        result["results"][0]["auth"] = [*(result["results"][0].get("auth") or []), entry.to_xdr()]
        self.injected += 1
        return answer


def root(contract: str, function: str, args: list[xdr.SCVal] | None = None) -> xdr.SorobanAuthorizedInvocation:
    return xdr.SorobanAuthorizedInvocation(
        function=xdr.SorobanAuthorizedFunction(
            type=xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN,
            contract_fn=xdr.InvokeContractArgs(contract_address=scval.to_address(contract).address,
                                               function_name=xdr.SCSymbol(function.encode()), args=args or [])),
        sub_invocations=[])


def as_address(address: str, contract: str, function: str) -> xdr.SorobanAuthorizationEntry:
    """A recorded ADDRESS_V2 entry (unsigned, as recording mode returns it) authorising as `address`."""
    creds = xdr.SorobanAddressCredentials(address=scval.to_address(address).address, nonce=xdr.Int64(99),
                                          signature_expiration_ledger=xdr.Uint32(0),
                                          signature=xdr.SCVal(xdr.SCValType.SCV_VOID))
    return xdr.SorobanAuthorizationEntry(
        credentials=xdr.SorobanCredentials(xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_ADDRESS_V2,
                                           address_v2=creds),
        root_invocation=root(contract, function))


def as_source(contract: str, function: str, args: list[xdr.SCVal] | None = None) -> xdr.SorobanAuthorizationEntry:
    """A SOURCE_ACCOUNT entry: the lane's own authority over `contract.function`."""
    return xdr.SorobanAuthorizationEntry(
        credentials=xdr.SorobanCredentials(xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_SOURCE_ACCOUNT),
        root_invocation=root(contract, function, args))


@pytest.fixture
def devnet(tmp_path: Path) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path / "devnet", lanes=2, users=2)
    yield handle
    handle.stop()


@pytest.fixture
def rpc(devnet: DevnetHandle) -> Iterator[RecordingRpc]:
    proxy = RecordingRpc(devnet.url)
    yield proxy
    proxy.close()


@pytest.fixture
def chain(devnet: DevnetHandle, rpc: RecordingRpc, dsn: str, tmp_path: Path) -> ChainEnv:
    environ = chain_environ(devnet, dsn, tmp_path / "keys")
    environ.update(PAYGATE_RPC_URL=rpc.url, PAYGATE_OBSERVER_START_LEDGER="1", PAYGATE_SETTLEMENT_LEASE="1s")
    return ChainEnv(devnet, dsn, environ)


def forbidden(g: dict[str, Any], function: str) -> list[tuple[str, xdr.SorobanAuthorizationEntry, str]]:
    """(what, entry, the refusal's words) for a call of billing.`function` or market.`function`:
    entries authorising as a lane, the fee account and the billing contract, and the lane's own
    authority over another call (the USDC it holds)."""
    billing, usdc = g["contracts"]["billing"], g["contracts"]["usdc"]
    contract = billing if function in ("charge_batch", "credit") else g["contracts"]["market"]
    lane = g["lanes"][0]["public"]
    steal = [scval.to_address(lane), scval.to_address(g["users"][0]["public"]), scval.to_int128(1)]
    return [("lane", as_address(lane, contract, function), "one of the gateway's own accounts"),
            ("other lane", as_address(g["lanes"][1]["public"], contract, function), "one of the gateway's own"),
            ("fee account", as_address(g["fee_account"]["public"], contract, function), "one of the gateway's own"),
            ("billing", as_address(billing, contract, function), "one of the gateway's own accounts"),
            ("lane's transfer", as_source(usdc, "transfer", steal), "other than the invoked")]


def never_anchored(db: psycopg.Connection, purpose: str) -> None:
    rows = db.execute("SELECT state, envelope, inner_hash FROM paygate.lineages WHERE purpose = %s",
                      (purpose,)).fetchall()
    assert rows and all(r == ("abandoned", None, None) for r in rows), rows


def test_funding_refuses_a_credit_carrying_any_authority_but_its_operators(
        chain: ChainEnv, rpc: RecordingRpc, db: psycopg.Connection) -> None:
    user = chain.genesis["users"][0]
    cases = forbidden(chain.genesis, "credit")
    for n, (what, entry, words) in enumerate([*cases, ("none", None, "")]):
        signed, nonce, expiration = sign_deposit(chain.devnet, user["secret"], 100 + n, valid_ledgers=500)
        deposit = admit_deposit(db, user["public"], 100 + n, signed, nonce, expiration, f"d{n}")
        rpc.inject = None if entry is None else ("credit", entry)
        for _ in range(8):
            result = chain.tick("funding")
            status, reason = db.execute("SELECT status, reason FROM paygate.deposits WHERE id = %s",
                                        (deposit,)).fetchone()
            if status != "pending":
                break
            chain.devnet.close_ledger()
        if entry is None:
            assert status == "settled", (status, reason)  # the honest answer: credited
            continue
        # The transfer applied; the credit was refused before anything was journaled: a human decides.
        assert result.code == 3 and status == "needs_human", (what, status, result.err)
        assert "authority refused (credit)" in reason and words in reason, (what, reason)
    assert rpc.injected >= len(cases)
    states = db.execute("SELECT state, envelope IS NULL FROM paygate.lineages WHERE purpose = 'credit' "
                        "ORDER BY id").fetchall()
    assert states == [("abandoned", True)] * len(cases) + [("applied", False)], states
    assert [e["value"][0] for e in contract_events(chain, "credit")] == [100 + len(cases)]  # only the honest one


def test_a_bot_job_refuses_any_recorded_authority(chain: ChainEnv, rpc: RecordingRpc, db: psycopg.Connection) -> None:
    from paygate_cli.sandbox.devnet.contracts.market import ORDER_TTL_LEDGERS
    from tests.support.relay_support import admit_relay

    g = chain.genesis
    allow_market(db, g["contracts"]["market"])
    admit_relay(db, chain.devnet, g["users"][0], "order-1")
    for _ in range(5):
        chain.tick("relay")
        chain.devnet.close_ledger()
    chain.devnet.close_ledger(ORDER_TTL_LEDGERS + 1)
    cases = [("the lane's own", as_source(g["contracts"]["market"], "close_expired"), "SOURCE_ACCOUNT"),
             *forbidden(g, "close_expired")[:4]]
    for n, (what, entry, words) in enumerate(cases):
        job = admit_close(db, chain.devnet, g["users"][0]["public"], key=f"close:{n}")
        rpc.inject = ("close_expired", entry)
        assert chain.tick("relay_drainer").code in (0, 1)
        status, reason = db.execute("SELECT status, reason FROM paygate.bot_jobs WHERE id = %s", (job,)).fetchone()
        assert status == "failed" and "not a permissionless call" in reason and words in reason, (what, reason)
    # Relays share the lineage purpose: the jobs' own lineages.
    rows = db.execute("SELECT state, envelope FROM paygate.lineages WHERE entitlement LIKE 'bot_job:%%'").fetchall()
    assert len(rows) == len(cases) and all(r == ("abandoned", None) for r in rows), rows


def test_a_deposit_signed_by_a_lane_is_refused(chain: ChainEnv, rpc: RecordingRpc, db: psycopg.Connection) -> None:
    lane = chain.genesis["lanes"][0]
    chain.devnet.fund(lane["public"], usdc=1_000)  # it could pay: only the authority check stands in the way
    entry, nonce, expiration = sign_deposit(chain.devnet, lane["secret"], 300, valid_ledgers=500)
    deposit = admit_deposit(db, lane["public"], 300, entry, nonce, expiration, "lane-deposit")
    for _ in range(3):
        chain.tick("funding")
        chain.devnet.close_ledger()
    status, reason = db.execute("SELECT status, reason FROM paygate.deposits WHERE id = %s",
                                (deposit,)).fetchone()
    assert status == "failed" and "authority refused (deposit)" in reason, reason
    assert "one of the gateway's own accounts" in reason
    never_anchored(db, "deposit")
    assert not contract_events(chain, "transfer") or all(
        e["topics"][1] != lane["public"] for e in contract_events(chain, "transfer"))


def test_a_relay_authorised_as_the_billing_contract_is_rejected_before_anything_is_built(
        chain: ChainEnv, rpc: RecordingRpc, db: psycopg.Connection) -> None:
    g = chain.genesis
    billing, market = g["contracts"]["billing"], g["contracts"]["market"]
    allow_market(db, market)
    args = [scval.to_address(billing), scval.to_symbol("book"), scval.to_int128(7)]
    entry = as_address(billing, market, "buy")
    entry.root_invocation.function.contract_fn.args = args
    entry.credentials.address_v2.signature_expiration_ledger = xdr.Uint32(chain.devnet.latest_ledger() + 100)
    relay = db.execute("SELECT relay_id FROM paygate.admit_relay(%s, %s, 'buy', %s, %s, %s, 'as-billing')",
                       (billing, market, scval.to_vec(args).to_xdr(), [entry.to_xdr()], MAX_FEE)).fetchone()[0]
    assert chain.tick("relay").code in (0, 1)
    status, reason = db.execute("SELECT status, reason FROM paygate.relays WHERE id = %s", (relay,)).fetchone()
    assert status == "rejected" and f"authorises as {billing}, one of the gateway's own accounts" in reason, reason
    assert db.execute("SELECT count(*) FROM paygate.lineages").fetchone()[0] == 0
