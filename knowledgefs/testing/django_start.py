"""Start Django in a child process with chosen settings (start-up validation tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BOUNDED = {
    # name: (default, low, high)
    "KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY": (2, 1, 8),
    "KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_CONCURRENCY": (4, 1, 32),
    "KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES": (134217728, 1048576, 1073741824),
    "KNOWLEDGE_JOB_LEASE_SECONDS": (120, 10, 3600),
    "KNOWLEDGE_JOB_SWEEP_INTERVAL_SECONDS": (60, 60, 3600),
    "KNOWLEDGE_JOB_STALL_SECONDS": (1800, 60, 86400),
    "KNOWLEDGE_JOB_DISPATCH_GRACE_SECONDS": (300, 10, 86400),
    "KNOWLEDGE_JOB_MAX_ATTEMPTS": (3, 1, 10),
    "KNOWLEDGE_JOB_RETRY_BACKOFF_SECONDS": (10, 1, 3600),
}


def setup_django(code: str = "", **overrides: str) -> subprocess.CompletedProcess[str]:
    """Run ``django.setup()`` then ``code`` in a child with the bounded settings unset and
    ``overrides`` set; returns the finished process (60 s at most)."""
    env = {k: v for k, v in os.environ.items() if k not in BOUNDED}
    env.update(DJANGO_SETTINGS_MODULE="knowledgefs.settings", **overrides)
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
