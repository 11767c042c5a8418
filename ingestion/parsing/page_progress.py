"""Pages parsed so far, published by the isolated parser child to a file its parent reads
(case BC-43: a large PDF's job shows its progress by page range while it is parsed).

The child calls :func:`track` with the path, the PDF parser :func:`report` after each page (the
file is rewritten at most every :data:`MIN_INTERVAL_S` seconds, and at the last page); the
parent polls :func:`read`. Without :func:`track` (a parse in the same process) nothing is
written.
"""

from __future__ import annotations

import os
import time

#: The file is rewritten at most this often (a page can take milliseconds).
MIN_INTERVAL_S = 0.5

_path: str | None = None
_written_at = 0.0


def track(path: str | None) -> None:
    """Publish this process's page progress to ``path`` (the parser child calls it)."""
    global _path, _written_at
    _path, _written_at = path or None, 0.0


def report(done: int, total: int) -> None:
    """``done`` of ``total`` pages parsed; written when due (or at the last page)."""
    global _written_at
    if _path is None:
        return
    now = time.monotonic()
    if done < total and now - _written_at < MIN_INTERVAL_S:
        return
    _written_at = now
    partial = _path + ".part"
    with open(partial, "w") as handle:
        handle.write(f"{int(done)} {int(total)}")
    os.replace(partial, _path)


def read(path: str) -> tuple[int, int] | None:
    """``(done, total)`` last published to ``path``; ``None`` before the first report."""
    try:
        with open(path) as handle:
            done, total = (int(x) for x in handle.read().split())
    except (OSError, ValueError):
        return None
    return done, total
