"""Pytest fixtures for the local Dify inner-API server (``knowledgefs/testing/dify_server.py``).

Bind them in a test module (``dify_server = dify_fixtures.dify_server``). ``dify_server`` is a
started :class:`DifyTestServer`, stopped after the test; ``dify_transport`` is a
:class:`DifyTransport` on it with fast retries (backoff 10 ms) so retry tests stay quick.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from knowledgefs.dify.transport import DifyTransport
from knowledgefs.testing.dify_server import TEST_INNER_KEY, DifyTestServer


@pytest.fixture
def dify_server() -> Iterator[DifyTestServer]:
    server = DifyTestServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def dify_transport(dify_server: DifyTestServer) -> DifyTransport:
    return DifyTransport(dify_server.url, TEST_INNER_KEY, backoff_base=0.01, backoff_max=0.05)
