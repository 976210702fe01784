"""Shared by the host tests: deterministic keys and a host with the three contracts deployed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from stellar_sdk import Address, Keypair, Network, StrKey, scval, xdr

from paygate_cli.sandbox.devnet.host import ContractHost, InvokeOutcome

PASS = Network.STANDALONE_NETWORK_PASSPHRASE
SRC_CREDS = xdr.SorobanCredentialsType.SOROBAN_CREDENTIALS_SOURCE_ACCOUNT


def kp(i: int) -> Keypair:
    return Keypair.from_raw_ed25519_seed(bytes([i]) * 32)


@dataclass
class Env:
    host: ContractHost
    usdc: str
    billing: str
    market: str


def deploy(issuer: Keypair, admin: Keypair, lane: Keypair) -> Env:
    """USDC issued by `issuer`, billing administered by `admin` with `lane` its operator, market."""
    host = ContractHost(PASS)
    usdc = host.deploy_sac("USDC", issuer.public_key)
    billing = host.deploy_billing(admin.public_key, usdc, [lane.public_key])
    return Env(host, usdc, billing, host.deploy_market(usdc))


def host_fn(contract: str, fn: str, args: list[xdr.SCVal]) -> xdr.HostFunction:
    return xdr.HostFunction(
        xdr.HostFunctionType.HOST_FUNCTION_TYPE_INVOKE_CONTRACT,
        invoke_contract=xdr.InvokeContractArgs(Address(contract).to_xdr_sc_address(), xdr.SCSymbol(fn.encode()), args),
    )


def source_auth(contract: str, fn: str, args: list[xdr.SCVal]) -> xdr.SorobanAuthorizationEntry:
    return xdr.SorobanAuthorizationEntry(
        credentials=xdr.SorobanCredentials(SRC_CREDS),
        root_invocation=xdr.SorobanAuthorizedInvocation(
            function=xdr.SorobanAuthorizedFunction(
                xdr.SorobanAuthorizedFunctionType.SOROBAN_AUTHORIZED_FUNCTION_TYPE_CONTRACT_FN,
                contract_fn=xdr.InvokeContractArgs(
                    Address(contract).to_xdr_sc_address(), xdr.SCSymbol(fn.encode()), args
                ),
            ),
            sub_invocations=[],
        ),
    )


def a(k: Keypair | str) -> xdr.SCVal:
    return scval.to_address(k if isinstance(k, str) else k.public_key)


def event(e: xdr.ContractEvent) -> tuple[str, list[object], object]:
    assert e.type == xdr.ContractEventType.CONTRACT and e.contract_id is not None
    body = e.body.v0
    assert body is not None
    topics = [scval.to_native(t) for t in body.topics]
    topics = [t.address if isinstance(t, Address) else t for t in topics]
    return StrKey.encode_contract(e.contract_id.contract_id.hash), topics, scval.to_native(body.data)


def contract_error(out: InvokeOutcome, n: int) -> bool:
    return not out.ok and out.error_kind == "trapped" and f"HostError: Error(Contract, #{n})" in (out.error or "")


LEDGER = 500


ISSUER, ALICE, BOB, LANE, ADMIN, STRANGER = kp(11), kp(12), kp(13), kp(14), kp(15), kp(16)


@pytest.fixture
def env() -> Env:
    e = deploy(ISSUER, ADMIN, LANE)
    e.host.mint(e.usdc, ALICE.public_key, 1_000)
    e.host.mint(e.usdc, BOB.public_key, 0)  # opens BOB's trustline
    return e


def call(
    env: Env,
    contract: str,
    fn: str,
    args: list[xdr.SCVal],
    *,
    source: Keypair = LANE,
    mode: str = "apply",
    signed_by_source: bool = True,
) -> InvokeOutcome:
    auth = [source_auth(contract, fn, args)] if signed_by_source else []
    return env.host.invoke(
        host_function=host_fn(contract, fn, args),
        auth=auth,
        source_account=source.public_key,
        ledger_seq=LEDGER,
        ledger_close_time=LEDGER * 5,
        mode=mode,
    )  # type: ignore[arg-type]


def view(env: Env, contract: str, fn: str, args: list[xdr.SCVal]) -> object:
    out = call(env, contract, fn, args, mode="enforce", signed_by_source=False)
    assert out.ok, out.error
    return scval.to_native(out.return_value)
