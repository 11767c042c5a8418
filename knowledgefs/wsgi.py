"""WSGI entry point (gunicorn ``knowledgefs.wsgi``).

Before Django loads, large allocations are pinned to ``mmap`` (glibc ``M_MMAP_THRESHOLD`` of
1 MiB), so a buffered upload's body (up to 15 MiB, in the upload gates) goes back to the
system when it is freed. Without it glibc raises its threshold after the first large free and
serves later bodies from per-thread arenas that keep them: 50 concurrent 15 MiB upload sessions
held 386 MiB over the baseline instead of 83 MiB (docs/benchmarks.md, "Upload sessions"). An
operator's own ``MALLOC_MMAP_THRESHOLD_`` wins; other C libraries are left alone.
"""

import ctypes
import ctypes.util
import os

from django.core.wsgi import get_wsgi_application

#: glibc's ``mallopt`` parameter number of ``M_MMAP_THRESHOLD``.
M_MMAP_THRESHOLD = -3
#: Allocations of at least this many bytes are served by ``mmap`` and unmapped when freed.
MMAP_THRESHOLD_BYTES = 1024 * 1024


def pin_mmap_threshold() -> bool:
    """Set glibc's mmap threshold (unless the environment sets it); True when it was set."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):  # not glibc (no mallopt), or no C library found
        return False


MMAP_THRESHOLD_PINNED = pin_mmap_threshold()
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")
application = get_wsgi_application()
