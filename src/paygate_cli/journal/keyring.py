"""Journal encryption: envelopes are stored AES-GCM encrypted.

The associated data binds a ciphertext to its lineage id, key id, source account and sequence, so
bytes copied from one row to another (or an altered row) fail to decrypt instead of yielding a
valid transaction for the wrong entitlement. Old keys stay loadable until `key-retire-check`
proves them unused."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from paygate_cli.errors import ConfigError, NeedsHuman
from paygate_cli.settings import Settings

_NONCE_BYTES = 12


class EnvelopeTampered(NeedsHuman):
    msgid = "journal.envelope_tampered"


def associated_data(lineage_id: int, key_id: str, source: str, seq: int) -> bytes:
    return f"paygate-lineage-v1|{lineage_id}|{key_id}|{source}|{seq}".encode()


@dataclass
class Keyring:
    keys: dict[str, bytes]
    active_key_id: str

    @classmethod
    def from_settings(cls, settings: Settings) -> Keyring:
        secret = settings.secret("journal_keys")
        if secret is None:
            raise ConfigError("journal keys are not configured: set PAYGATE_JOURNAL_KEYS_FILE "
                              '(JSON {"key_id": "64 hex chars"})')
        try:
            raw = json.loads(secret.reveal())
        except ValueError:
            raise ConfigError(f"journal keys file {secret.source} is not valid JSON") from None
        if not isinstance(raw, dict) or not raw:
            raise ConfigError(f"journal keys file {secret.source} must be a non-empty JSON object")
        keys: dict[str, bytes] = {}
        for key_id, value in raw.items():
            try:
                key = bytes.fromhex(str(value))
            except ValueError:
                raise ConfigError(f"journal key {key_id!r} is not hex") from None
            if len(key) != 32:
                raise ConfigError(f"journal key {key_id!r} must be 32 bytes (64 hex chars), got {len(key)}")
            keys[str(key_id)] = key
        active = settings.journal_active_key_id
        if not active:
            raise ConfigError("PAYGATE_JOURNAL_ACTIVE_KEY_ID is not set")
        if active not in keys:
            raise ConfigError(f"journal key {active!r} (PAYGATE_JOURNAL_ACTIVE_KEY_ID) is not in the keys file")
        return cls(keys, active)

    def encrypt(self, plaintext: bytes, *, lineage_id: int, source: str, seq: int) -> tuple[str, bytes]:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = os.urandom(_NONCE_BYTES)
        aad = associated_data(lineage_id, self.active_key_id, source, seq)
        return self.active_key_id, nonce + AESGCM(self.keys[self.active_key_id]).encrypt(nonce, plaintext, aad)

    def decrypt(self, blob: bytes, *, key_id: str, lineage_id: int, source: str, seq: int) -> bytes:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        key = self.keys.get(key_id)
        if key is None:
            raise ConfigError(f"journal key {key_id!r} is needed for lineage {lineage_id} but is not in the keys file")
        try:
            return AESGCM(key).decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:],
                                       associated_data(lineage_id, key_id, source, seq))
        except InvalidTag:
            raise EnvelopeTampered(f"lineage {lineage_id}: the stored envelope does not decrypt under key "
                                   f"{key_id!r} for its own lineage/source/sequence (altered or swapped)") from None
