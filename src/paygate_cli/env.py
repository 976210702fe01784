"""Env: everything process-global a command touches, injectable for tests (httpie-style)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from paygate_cli.settings import Settings, load_settings


@dataclass
class Env:
    stdin: TextIO = field(default_factory=lambda: sys.stdin)
    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    config_path: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    json_errors: bool = False  # set by --json: a fatal error also becomes a JSON object on stderr
    wide: bool = False  # set by --wide: tables at their full width on a terminal, never folded
    # Resolved by the root callback (flags > PAYGATE_LOG_*); the final error line uses them too.
    log_format: str | None = None
    log_level: str | None = None
    # The secret files the running command uses (None: all). Set by the read-only commands, which
    # must work from a shell that holds none of the fleet's seeds and keys.
    secrets_used: frozenset[str] | None = None
    _settings: Settings | None = None

    @property
    def stdin_isatty(self) -> bool:
        return bool(self.stdin) and _isatty(self.stdin)

    @property
    def stdout_isatty(self) -> bool:
        return _isatty(self.stdout)

    @property
    def stderr_isatty(self) -> bool:
        return _isatty(self.stderr)

    @property
    def settings(self) -> Settings:
        """Loaded on first use, so `--help` and `completion` never read config or secrets."""
        if self._settings is None:
            self._settings = load_settings(self.environ, overrides=self.overrides, config_path=self.config_path,
                                           only_secrets=self.secrets_used)
        return self._settings

    def use_only_secrets(self, *names: str) -> None:
        """Read only these secret files when settings load (drops any settings already loaded)."""
        self.secrets_used = frozenset(names)
        self._settings = None

    def override(self, **values: Any) -> None:
        """Apply command-line flags (highest precedence); drops any settings already loaded."""
        self.overrides.update({k: v for k, v in values.items() if v is not None})
        self._settings = None


def _isatty(stream: TextIO | None) -> bool:
    try:
        return bool(stream) and stream.isatty()
    except (ValueError, AttributeError):
        return False
