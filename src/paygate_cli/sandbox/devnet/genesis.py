"""Genesis: deterministic throwaway keys from a seed, funded accounts, the SAC, billing and market.

Keys are `Keypair.from_raw_ed25519_seed(sha256(f"{seed}:{name}"))`, so the same `--seed` always gives
the same accounts and contract ids. They protect nothing: this is a local test network.
"""

from __future__ import annotations

import hashlib
from typing import Any

from stellar_sdk import Keypair, Network

from paygate_cli.sandbox.devnet.host import ContractHost
from paygate_cli.sandbox.devnet.ledger import Devnet
from paygate_cli.sandbox.devnet.storage import DEFAULT_TTL, TtlConfig

PASSPHRASE = Network.STANDALONE_NETWORK_PASSPHRASE
XLM = 10_000_000  # stroops per XLM
USDC = 10_000_000  # 7 decimals, like every Stellar asset
FEE_ACCOUNT_XLM = 1_000_000 * XLM
LANE_XLM = 1_000 * XLM
USER_XLM = 1_000 * XLM
USER_USDC = 1_000 * USDC
ASSET_CODE = "USDC"


def keypair(seed: str, name: str) -> Keypair:
    return Keypair.from_raw_ed25519_seed(hashlib.sha256(f"{seed}:{name}".encode()).digest())


def _pair(kp: Keypair) -> dict[str, str]:
    return {"public": kp.public_key, "secret": kp.secret}


def build(seed: str, lanes: int, users: int, retention: int, close_time: int, ttl: TtlConfig = DEFAULT_TTL
          ) -> Devnet:
    """A fresh devnet at ledger 1 whose close time is `close_time` (the wall clock at first start);
    `ttl`: the state archival settings its entries are created with."""
    host = ContractHost(PASSPHRASE, ttl)
    dev = Devnet(PASSPHRASE, host, retention=retention)
    dev.start_genesis(close_time)
    fee = keypair(seed, "fee")
    issuer = keypair(seed, "issuer")
    admin = keypair(seed, "admin")
    lane_kps = [keypair(seed, f"lane:{i}") for i in range(lanes)]
    user_kps = [keypair(seed, f"user:{i}") for i in range(users)]
    dev.create_account(fee.public_key, FEE_ACCOUNT_XLM)
    dev.create_account(issuer.public_key, LANE_XLM)
    dev.create_account(admin.public_key, LANE_XLM)
    for kp in lane_kps:
        dev.create_account(kp.public_key, LANE_XLM)
    for kp in user_kps:
        dev.create_account(kp.public_key, USER_XLM)
    for kp in [fee, issuer, admin, *lane_kps, *user_kps]:
        dev.secrets[kp.public_key] = kp.secret
    sac = host.deploy_sac(ASSET_CODE, issuer.public_key)
    billing = host.deploy_billing(admin.public_key, sac, [kp.public_key for kp in lane_kps])
    market = host.deploy_market(sac)
    for kp in user_kps:
        host.mint(sac, kp.public_key, USER_USDC)
    dev.genesis = {
        "passphrase": PASSPHRASE,
        "seed": seed,
        "fee_account": _pair(fee),
        "lanes": [_pair(kp) for kp in lane_kps],
        "issuer": _pair(issuer),
        "admin": _pair(admin),
        "users": [_pair(kp) for kp in user_kps],
        "asset": f"{ASSET_CODE}:{issuer.public_key}",
        "contracts": {"usdc": sac, "billing": billing, "market": market},
    }
    return dev


def genesis_line(dev: Devnet, url: str, ledger_interval: str) -> dict[str, Any]:
    """The one JSON object `paygate devnet start` prints: everything a client needs to talk to it."""
    return {"url": url, **dev.genesis, "latest_ledger": dev.latest, "ledger_interval": ledger_interval,
            "protocol_version": dev.latest_info.header.ledger_version.uint32}
