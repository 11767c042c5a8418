"""A real ``manage.py qcluster`` child for the tests whose subject is the worker cluster.

The child runs with ``knowledgefs.testing.cluster_settings`` on the test database of this process
(its name in ``KFS_TEST_DB_NAME``) and the object storage folder ``objects``, in a process group of
its own so a test can kill the sentinel, its workers and its monitor at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from django.db import connection, connections

ROOT = Path(__file__).resolve().parents[2]


class QClusterProcess:
    """``manage.py qcluster`` with ``env`` over this process's environment; output to ``log``."""

    def __init__(self, objects: Path, log: Path, **env: str) -> None:
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "knowledgefs.testing.cluster_settings",
            "KFS_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
            "KFS_TEST_OBJECTS": str(objects),
            "LOG_LEVEL": "WARNING",
            **env,
        }
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> QClusterProcess:
        """Start the child (this process's database connections are closed first, so the
        child never inherits a socket)."""
        connections.close_all()
        handle = open(self.log, "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=self.env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def kill(self) -> None:
        """SIGKILL the whole cluster (sentinel, workers, monitor): nothing runs its cleanup."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM (django-q2's graceful stop), SIGKILL after 20 s."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
