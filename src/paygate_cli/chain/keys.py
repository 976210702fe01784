"""Signer keys: lanes (sequence sources and billing operators) and the fee account (pays every
transaction through a fee bump). Read from secret files; never printed (Keypair's repr shows only
the public key)."""

from __future__ import annotations

from dataclasses import dataclass

from stellar_sdk import Keypair
from stellar_sdk.exceptions import Ed25519SecretSeedInvalidError

from paygate_cli.errors import ConfigError
from paygate_cli.secrets import remember
from paygate_cli.settings import Settings


def _keypair(seed: str, where: str) -> Keypair:
    try:
        return Keypair.from_secret(seed.strip())
    except (Ed25519SecretSeedInvalidError, ValueError):
        raise ConfigError(f"{where}: not a valid Stellar secret seed (S…)") from None


@dataclass
class Signer:
    lanes: dict[str, Keypair]
    fee: Keypair

    @classmethod
    def from_settings(cls, settings: Settings) -> Signer:
        lanes_secret = settings.secret("lane_secrets")
        fee_secret = settings.secret("fee_secret")
        if lanes_secret is None:
            raise ConfigError("lane keys are not configured: set PAYGATE_LANE_SECRETS_FILE (one seed per line)")
        if fee_secret is None:
            raise ConfigError("the fee account key is not configured: set PAYGATE_FEE_SECRET_FILE")
        lanes: dict[str, Keypair] = {}
        for number, line in enumerate(lanes_secret.reveal().splitlines(), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            remember(line)
            keypair = _keypair(line, f"{lanes_secret.source} line {number}")
            lanes[keypair.public_key] = keypair
        if not lanes:
            raise ConfigError(f"{lanes_secret.source} holds no lane seeds")
        fee = _keypair(fee_secret.reveal(), fee_secret.source)
        if settings.fee_account and settings.fee_account != fee.public_key:
            # Two places name the fee account: they must agree, or the gas monitor would watch an
            # account that pays nothing while the real one runs dry.
            raise ConfigError(f"PAYGATE_FEE_ACCOUNT {settings.fee_account} is not the account of the fee seed "
                              f"({fee_secret.source}): {fee.public_key}")
        return cls(lanes, fee)


def fee_account_address(settings: Settings) -> str:
    """The fee account's public address: `fee_account` when set (so a worker that only watches the
    account needs no seed), else derived from the fee seed."""
    if settings.fee_account:
        try:
            return Keypair.from_public_key(settings.fee_account).public_key
        except Exception:  # the SDK's own checksum check; any failure is a bad setting
            raise ConfigError(f"PAYGATE_FEE_ACCOUNT {settings.fee_account[:60]!r} is not a Stellar account "
                              "address (G…)") from None
    fee_secret = settings.secret("fee_secret")
    if fee_secret is None:
        raise ConfigError("the fee account is not configured: set PAYGATE_FEE_ACCOUNT (or PAYGATE_FEE_SECRET_FILE)")
    return _keypair(fee_secret.reveal(), fee_secret.source).public_key
