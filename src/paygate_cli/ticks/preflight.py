"""The secrets half of a worker's preflight: every secret it will use parsed before its first tick,
so a bad one stops the process at once (78) instead of when the first unit of money arrives."""

from __future__ import annotations

from typing import TYPE_CHECKING

from paygate_cli.errors import ConfigError

if TYPE_CHECKING:
    from paygate_cli.catalogue import WorkerSpec
    from paygate_cli.settings import Settings


def _seed(text: str, where: str) -> bytes:
    from paygate_cli.secrets import decode_strkey

    raw = decode_strkey(text, "seed")
    if raw is None:
        raise ConfigError(f"{where}: not a valid Stellar secret seed (S…)")
    return raw


def _account(address: str) -> bytes:
    from paygate_cli.secrets import decode_strkey

    raw = decode_strkey(address.strip(), "account")
    if raw is None:
        raise ConfigError(f"PAYGATE_FEE_ACCOUNT {address[:60]!r} is not a Stellar account address (G…)")
    return raw


def _public_key(seed: bytes) -> bytes:
    from nacl.bindings import crypto_sign_seed_keypair  # ~6 ms to import, a fifth of cryptography's ed25519

    return crypto_sign_seed_keypair(seed)[0]


def check_secrets(spec: WorkerSpec, settings: Settings) -> None:
    """Parse every secret this worker will use, so a bad one stops the process before its first
    tick (78), not when the first unit arrives: each lane seed and the fee seed (strkey checks,
    no stellar_sdk), the fee account setting against the fee seed, and the journal keyring with
    its active key. Messages name files and lines, never values."""
    needs = set(spec.requires)
    if "lane_keys" in needs:
        lanes = settings.secret("lane_secrets")
        assert lanes is not None  # check_requirements ran first
        seeds = 0
        for number, line in enumerate(lanes.reveal().splitlines(), start=1):
            line = line.strip()
            if line and not line.startswith("#"):
                seeds += 1
                _seed(line, f"{lanes.source} line {number}")
        if not seeds:
            raise ConfigError(f"{lanes.source} holds no lane seeds")
        reserved = sum(settings.lane_shares.values())
        if reserved > seeds:
            raise ConfigError(f"lane_shares reserve {reserved} lanes but {lanes.source} holds {seeds} lane seeds")
    fee = settings.secret("fee_secret")
    if needs & {"fee_key", "fee_account"} and fee is not None:
        seed = _seed(fee.reveal().strip(), fee.source)
        # Two places name the fee account: they must agree, or the gas monitor would watch an
        # account that pays nothing while the real one runs dry.
        if settings.fee_account and _account(settings.fee_account) != _public_key(seed):
            raise ConfigError(f"PAYGATE_FEE_ACCOUNT {settings.fee_account} is not the account of the "
                              f"fee seed ({fee.source})")
    elif "fee_account" in needs and settings.fee_account:
        _account(settings.fee_account)
    if "journal_keys" in needs:
        from paygate_cli.journal.keyring import Keyring

        Keyring.from_settings(settings)  # valid JSON of 32-byte hex keys, the active one present
