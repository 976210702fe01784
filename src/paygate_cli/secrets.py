"""Secret values: read only from files, never printable.

A `Secret` has no repr or str that shows its value, so rich, typer, logging and tracebacks cannot
leak it. Every revealed value is also remembered so the log and error paths can scrub it from any
text as a second line of defence (`scrub`)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from paygate_cli.errors import ConfigError, SecretMissing

_REVEALED: set[str] = set()


class Secret:
    __slots__ = ("_value", "source")

    def __init__(self, value: str, source: str) -> None:
        self._value = value
        self.source = source  # where it came from (a path), never the value
        for part in derived_forms(value):
            remember(part)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple:  # refuse pickling: a pickle would carry the value anywhere
        raise TypeError("Secret values cannot be pickled")


_STELLAR_SEED = re.compile(r"S[A-Z2-7]{55}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2}){16,}")


def _raw_encodings(raw: bytes) -> list[str]:
    b64, urlsafe = base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()
    return [raw.hex(), raw.hex().upper(), b64, b64.rstrip("="), urlsafe, urlsafe.rstrip("=")]


def derived_forms(value: str) -> list[str]:
    """The value, and the pieces and encodings of it that could be printed on their own: each line of
    a multi-line secret (lane seeds), each string in a JSON secret (journal keys), the hex and
    base64 of the raw key bytes behind a hex key or a Stellar seed, and a URL's path (its token).
    All are scrubbed from logs."""
    forms = [value]
    parts = [line.strip() for line in value.splitlines() if line.strip() and not line.strip().startswith("#")]
    try:
        document = json.loads(value)
    except ValueError:
        document = None
    if isinstance(document, dict):
        parts += [str(v) for v in document.values() if isinstance(v, str)]
    for part in parts:
        forms.append(part)
        if _HEX.fullmatch(part):
            forms += _raw_encodings(bytes.fromhex(part))
        elif _STELLAR_SEED.fullmatch(part):
            with contextlib.suppress(binascii.Error, ValueError):  # strkey: version, 32-byte seed, checksum
                forms += _raw_encodings(base64.b32decode(part + "=" * (-len(part) % 8))[1:33])
        elif "://" in part:  # a URL whose path is the token (a dead-man switch): the path alone too
            path = urlsplit(part).path.strip("/")
            if len(path) >= 12:
                forms.append(path)
    return forms


def scrub(text: str) -> str:
    """Replace every secret value this process has read with ***."""
    for value in _REVEALED:
        if value in text:
            text = text.replace(value, "***")
    return text


def remember(value: str) -> None:
    """Register a derived secret (a password parsed out of a DSN) for scrubbing."""
    if len(value) >= 6:
        _REVEALED.add(value)


def read_secret_file(path: str | os.PathLike[str], *, variable: str) -> Secret:
    """Read a secret file, stripping one trailing newline (the *_FILE convention)."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SecretMissing(f"{variable}: secret file {p} does not exist") from None
    except PermissionError:
        raise SecretMissing(f"{variable}: secret file {p} is not readable by this user") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretMissing(f"{variable}: cannot read secret file {p}: {type(exc).__name__}") from None
    value = raw[:-1] if raw.endswith("\n") else raw
    if value.endswith("\r"):
        value = value[:-1]
    if not value:
        raise ConfigError(f"{variable}: secret file {p} is empty")
    return Secret(value, str(p))


# Stellar strkeys (SEP-23) checked without stellar_sdk, whose import would cost an idle tick more than
# its whole work: base32 of version byte + 32-byte payload + CRC16-XModem (little-endian).
_STRKEY_VERSIONS = {"seed": 18 << 3, "account": 6 << 3}


def _crc16_xmodem(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def decode_strkey(text: str, kind: str) -> bytes | None:
    """The 32-byte payload of a Stellar seed (`kind="seed"`, S…) or account address (G…), or None
    when `text` is not one: wrong length, alphabet, version byte or checksum."""
    if len(text) != 56 or not re.fullmatch(r"[A-Z2-7]{56}", text):
        return None
    try:
        raw = base64.b32decode(text)
    except (binascii.Error, ValueError):
        return None
    version, payload, checksum = raw[0], raw[1:33], raw[33:]
    if version != _STRKEY_VERSIONS[kind] or int.from_bytes(checksum, "little") != _crc16_xmodem(raw[:33]):
        return None
    return payload
