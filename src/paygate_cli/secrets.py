"""Secret values: read only from files, never printable.

A `Secret` has no repr or str that shows its value, so rich, typer, logging and tracebacks cannot
leak it. Every revealed value is also remembered so the log and error paths can scrub it from any
text as a second line of defence (`scrub`)."""

from __future__ import annotations

import os
from pathlib import Path

from paygate_cli.errors import ConfigError, SecretMissing

_REVEALED: set[str] = set()


class Secret:
    __slots__ = ("_value", "source")

    def __init__(self, value: str, source: str) -> None:
        self._value = value
        self.source = source  # where it came from (a path), never the value
        if len(value) >= 6:  # very short strings would scrub innocent text
            _REVEALED.add(value)

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
