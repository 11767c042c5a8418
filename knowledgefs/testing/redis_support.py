"""A real Redis server on loopback for the tests that exercise ``REDIS_URL``.

``redis-server`` comes from Debian (``make redis``). Without it these tests skip, unless
``KFS_REQUIRE_REDIS=1`` (set by CI), which makes its absence a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start ``redis-server`` on 127.0.0.1 (no persistence) for the session; yield its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("KFS_REQUIRE_REDIS") == "1":
            pytest.fail("redis-server is required (KFS_REQUIRE_REDIS=1); run 'make redis'")
        pytest.skip("redis-server is not installed (make redis installs Debian's)")
    folder: Path = tmp_path_factory.mktemp("redis")
    port = free_port()
    server = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            pytest.fail(f"redis-server did not start on port {port}")
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    server.terminate()
    server.wait(timeout=10)
