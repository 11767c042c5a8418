"""Imported only by the parser forkserver (:mod:`ingestion.parsing.isolation`), never elsewhere.

Makes the forkserver a child subreaper: descendants orphaned when a parser child is killed
(``pdftoppm``, ``tesseract``) are re-parented to it, and its SIGCHLD loop reaps them, so none
is left as a zombie where PID 1 does not reap. Its warning about such "unexpected" pids is
silenced, as they are expected here.

It also watches its parent, the worker process that started it: multiprocessing ends a
forkserver only when every copy of its liveness pipe is closed, and each parser child holds one
(multiprocessing passes it to every child), so a worker killed from outside (``kill -9``, the
OOM killer) could leave the forkserver behind as long as a child lived. When the parent is gone
(this process was re-parented), the forkserver gives its children :data:`CHILD_GRACE_S` to end
(their own watchdogs kill them and remove their files within half a second) and exits; a child
still there then dies with it (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings

warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")

with contextlib.suppress(Exception):
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER

#: How often the forkserver looks at its parent (our choice: about the children's watchdogs).
PARENT_POLL_S = 0.5
#: How long the forkserver waits for its children once its parent is gone (our choice).
CHILD_GRACE_S = 3.0


def _live_children(me: int) -> list[int]:
    """Children of ``me`` that are not zombies (from ``/proc``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == me and fields[0] not in ("Z", "X"):
            found.append(int(entry))
    return found


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    deadline = time.monotonic() + CHILD_GRACE_S
    while time.monotonic() < deadline and _live_children(os.getpid()):
        time.sleep(0.1)
    os._exit(0)


# Only in the forkserver itself: its children (forked from its main thread) have no copy of
# this thread.
threading.Thread(
    target=_watch_parent, args=(os.getppid(),), name="kfs-forkserver-parent", daemon=True
).start()
