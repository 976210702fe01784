"""Directories in the tests: one every user can enter, for commands that run as another user."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="pgd-", dir="/tmp"))
    path.chmod(0o755)  # the postgres OS user must traverse it when we run as root
    yield path
    shutil.rmtree(path, ignore_errors=True)
