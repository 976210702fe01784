"""Stellar address check without stellar_sdk (a cold command must not pay its import): the StrKey
of an account (G…) or a contract (C…): base32, a version byte, 32 bytes, a CRC16-XModem checksum."""

from __future__ import annotations

import base64
import binascii
import struct

_VERSIONS = {"G": 6 << 3, "C": 2 << 3}


def is_address(text: str) -> bool:
    """True only for a canonical G… or C… address (a lowercased or mistyped one is False)."""
    if len(text) != 56 or text[:1] not in _VERSIONS or not text.isascii() or text != text.upper():
        return False
    try:
        raw = base64.b32decode(text.encode("ascii"))  # 56 characters: 35 bytes, no padding
    except (binascii.Error, ValueError):
        return False
    return (len(raw) == 35 and raw[0] == _VERSIONS[text[0]]
            and struct.pack("<H", binascii.crc_hqx(raw[:33], 0)) == raw[33:])
