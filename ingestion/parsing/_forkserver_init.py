"""Imported only by the parser forkserver (:mod:`ingestion.parsing.isolation`), never elsewhere.

Makes the forkserver a child subreaper: descendants orphaned when a parser child is killed
(``pdftoppm``, ``tesseract``) are re-parented to it, and its SIGCHLD loop reaps them, so none
is left as a zombie where PID 1 does not reap. Its warning about such "unexpected" pids is
silenced, as they are expected here.
"""

from __future__ import annotations

import contextlib
import warnings

warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")

with contextlib.suppress(Exception):
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
