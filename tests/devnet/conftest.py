"""Fixtures for the devnet conformance tests: one real devnet subprocess per test module (tests in
a module share it and must not depend on each other's ledger position), plus SDK and raw clients."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from stellar_sdk import SorobanServer
from stellar_sdk.client.requests_client import RequestsClient

from tests.support.devnet_support import DevnetHandle, start_devnet


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevnetHandle]:
    handle = start_devnet(tmp_path_factory.mktemp("devnet"))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def server(devnet: DevnetHandle) -> Iterator[SorobanServer]:
    # No silent retries: the tests must see exactly what the devnet answered.
    with SorobanServer(devnet.url, client=RequestsClient(num_retries=0)) as s:
        yield s
