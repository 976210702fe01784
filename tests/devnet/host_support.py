"""Shared by the host tests: deterministic keys and a host with the three contracts deployed."""

from __future__ import annotations

from dataclasses import dataclass

from stellar_sdk import Keypair, Network

from paygate_cli.sandbox.devnet.host import ContractHost

PASS = Network.STANDALONE_NETWORK_PASSPHRASE


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
