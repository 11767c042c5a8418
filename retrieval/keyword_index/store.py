"""The per-space keyword indexes on disk: layout, opening, the writer lock, reloads and the swap.

Layout under ``KNOWLEDGE_VAR_DIR/search/keyword/<space id>/``: one tantivy index per directory
``index-<token>/`` (its ``meta.json``, segment files, the writer's lock file and ``kfs.json``
with :data:`~.analysis.SCHEMA_VERSION`), and ``current``, a relative symbolic link naming the
live one. A rebuild writes a new ``index-<token>/`` and replaces ``current`` with one
``rename(2)``, so a reader sees the old index or the new one, never a half-built directory.

Each process keeps one open :class:`tantivy.Index` per space (manual reload: no file watcher
threads) with the publication head revision its searcher reflects; a query that knows a newer
head reloads first, and a query finding ``current`` pointing elsewhere reopens. Tantivy allows
one writer per index (a lock file, exclusive across processes): :func:`writer` retries for
:data:`WRITER_WAIT_SECONDS` with backoff, then raises 503 ``keyword_index_busy`` (retryable).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import tantivy
from django.conf import settings

from retrieval.backends.base import SearchBackendError

from . import analysis

logger = logging.getLogger("knowledgefs.retrieval")

CURRENT = "current"
MARKER = "kfs.json"
WRITER_HEAP_BYTES = 15_000_000  # tantivy's minimum per indexing thread
WRITER_WAIT_SECONDS = 5.0
_BACKOFF = (0.01, 0.25)  # first and largest pause between writer attempts, seconds


class KeywordIndexUnavailable(SearchBackendError):
    """503 ``search_backend_unavailable``: a space's keyword index is missing or cannot be
    opened; ``details`` ``{"space", "problem"}``. Queries on that space answer this (never a
    partial result) until ``kfs reindex --space`` or the recovery sweep rebuilds it."""

    def __init__(self, space_id: uuid.UUID, problem: str) -> None:
        super().__init__(
            f"the keyword index of space {space_id} is unusable ({problem}); "
            f"rebuild it with `kfs reindex --space {space_id}`",
            code="search_backend_unavailable",
            details={"space": str(space_id), "problem": problem},
        )
        self.problem = problem


def root() -> Path:
    """``KNOWLEDGE_VAR_DIR/search/keyword``."""
    return Path(settings.VAR_DIR) / "search" / "keyword"


def space_dir(space_id: uuid.UUID) -> Path:
    """The space's folder (``current`` and its ``index-<token>/`` directories)."""
    return root() / str(space_id)


def current_path(space_id: uuid.UUID) -> Path | None:
    """The live index directory of the space, ``None`` when ``current`` is absent or names no
    directory."""
    link = space_dir(space_id) / CURRENT
    try:
        target = os.readlink(link)
    except OSError:
        return None
    path = link.parent / target
    return path if path.is_dir() else None


@dataclass
class _Open:
    path: Path
    index: tantivy.Index
    head: int | None  # the publication head the searcher reflects (None: unknown)


_cache: dict[uuid.UUID, _Open] = {}
_cache_lock = threading.Lock()
_write_locks: dict[uuid.UUID, threading.Lock] = {}


def _open_index(space_id: uuid.UUID, path: Path) -> tantivy.Index:
    """Open one index directory, checking its marker, or raise :class:`KeywordIndexUnavailable`."""
    try:
        marker = json.loads((path / MARKER).read_text())
        if marker.get("schema_version") != analysis.SCHEMA_VERSION:
            raise KeywordIndexUnavailable(
                space_id, f"schema version {marker.get('schema_version')!r} is not current"
            )
        json.loads((path / "meta.json").read_text())
        index = tantivy.Index.open(str(path))
    except KeywordIndexUnavailable:
        raise
    except (OSError, ValueError) as exc:
        raise KeywordIndexUnavailable(space_id, f"{type(exc).__name__}: {exc}"[:300]) from None
    analysis.register(index)
    index.config_reader("manual")
    return index


def create_index(path: Path) -> tantivy.Index:
    """A new, empty index in ``path`` (created), with its marker."""
    path.mkdir(parents=True)
    index = tantivy.Index(analysis.SCHEMA, str(path))
    analysis.register(index)
    index.config_reader("manual")
    (path / MARKER).write_text(json.dumps({"schema_version": analysis.SCHEMA_VERSION}))
    return index


def _new_dir(space_id: uuid.UUID) -> Path:
    return space_dir(space_id) / f"index-{secrets.token_hex(6)}"


def point_current(space_id: uuid.UUID, path: Path) -> None:
    """Make ``current`` name ``path`` (a directory of the space's folder) in one rename."""
    folder = space_dir(space_id)
    tmp = folder / f".current-{secrets.token_hex(6)}"
    os.symlink(path.name, tmp)
    os.replace(tmp, folder / CURRENT)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_index(space_id: uuid.UUID, *, head: int | None = None) -> tantivy.Index | None:
    """The space's open index, ``None`` when it has none on disk.

    ``head`` (the publication head revision of the query's snapshot): when it differs from the
    one the cached searcher reflects, the searcher is reloaded first; ``None`` reloads always.
    Raises :class:`KeywordIndexUnavailable` when the index cannot be opened.
    """
    path = current_path(space_id)
    if path is None:
        with _cache_lock:
            _cache.pop(space_id, None)
        return None
    with _cache_lock:
        entry = _cache.get(space_id)
    if entry is None or entry.path != path:
        entry = _Open(path, _open_index(space_id, path), head)
        entry.index.reload()
        with _cache_lock:
            _cache[space_id] = entry
        return entry.index
    if head is None or entry.head != head:
        try:
            entry.index.reload()
        except ValueError as exc:
            with _cache_lock:
                _cache.pop(space_id, None)
            raise KeywordIndexUnavailable(space_id, f"reload failed: {exc}"[:300]) from None
        entry.head = head
    return entry.index


def forget(space_id: uuid.UUID) -> None:
    """Drop this process's open index of the space (the next use reopens it)."""
    with _cache_lock:
        _cache.pop(space_id, None)


def _acquire(space_id: uuid.UUID, index: tantivy.Index):
    """A writer of ``index``, retried with backoff for :data:`WRITER_WAIT_SECONDS`."""
    deadline = time.monotonic() + WRITER_WAIT_SECONDS
    pause = _BACKOFF[0]
    while True:
        try:
            return index.writer(WRITER_HEAP_BYTES, 1)
        except ValueError as exc:
            if "lock" not in str(exc).lower() or time.monotonic() >= deadline:
                if "lock" not in str(exc).lower():
                    raise KeywordIndexUnavailable(space_id, f"writer: {exc}"[:300]) from None
                raise SearchBackendError(
                    f"the keyword index of space {space_id} is being written by another "
                    f"process; gave up after {WRITER_WAIT_SECONDS:g} s",
                    code="keyword_index_busy",
                    retryable=True,
                    details={"space": str(space_id)},
                    retry_after=1,
                ) from None
        time.sleep(pause)
        pause = min(pause * 2, _BACKOFF[1])


@contextmanager
def writer(space_id: uuid.UUID, *, create: bool = True):
    """``with writer(space) as w:`` a tantivy writer of the space's live index; committed when
    the block ends without an exception (merges waited for), rolled back otherwise.

    The index is created when the space has none and ``create``. After the lock is taken,
    ``current`` is read again: a rebuild that swapped the index meanwhile is followed, so no
    write lands in a retired directory. A failed commit raises :class:`SearchBackendError`
    (503 ``keyword_index_write_failed``, retryable).
    """
    local = _write_locks.setdefault(space_id, threading.Lock())
    with local:
        while True:
            path = current_path(space_id)
            if path is None:
                if not create:
                    yield None
                    return
                path = _new_dir(space_id)
                index = create_index(path)
                point_current(space_id, path)
            else:
                index = _open_index(space_id, path)
            w = _acquire(space_id, index)
            if current_path(space_id) == path:
                break
            w.rollback()
            del w
        try:
            yield w
        except BaseException:
            w.rollback()
            raise
        try:
            w.commit()
            w.wait_merging_threads()
        except ValueError as exc:
            raise SearchBackendError(
                f"the keyword index of space {space_id} could not commit: {exc}",
                code="keyword_index_write_failed",
                retryable=True,
                details={"space": str(space_id)},
            ) from None


@contextmanager
def rebuilding(space_id: uuid.UUID):
    """``with rebuilding(space) as fresh:`` a new, empty index to fill; when the block ends
    without an exception its writer is committed and ``current`` is swapped to it, and the
    directories it replaced are removed. While the block runs the live index's writer lock is
    held, so other writers wait (and give up with ``keyword_index_busy`` after a few seconds)
    rather than write into an index about to be retired. A live index that cannot be opened is
    replaced without its lock."""
    local = _write_locks.setdefault(space_id, threading.Lock())
    with local:
        old = current_path(space_id)
        held = None
        if old is not None:
            try:
                held = _acquire(space_id, _open_index(space_id, old))
            except KeywordIndexUnavailable:
                held = None  # corrupt: nothing to protect
        path = _new_dir(space_id)
        try:
            index = create_index(path)
            w = index.writer(WRITER_HEAP_BYTES * 4, 1)
            yield w
            w.commit()
            w.wait_merging_threads()
            point_current(space_id, path)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        finally:
            if held is not None:
                held.rollback()
                del held
        forget(space_id)
        for stale in space_dir(space_id).glob("index-*"):
            if stale.name != path.name:
                shutil.rmtree(stale, ignore_errors=True)


def remove(space_id: uuid.UUID) -> None:
    """Remove the space's folder and this process's open index (space deleted)."""
    forget(space_id)
    shutil.rmtree(space_dir(space_id), ignore_errors=True)


def num_docs(space_id: uuid.UUID) -> int:
    """Live documents in the space's index, freshly reloaded (0 without an index)."""
    index = open_index(space_id)
    return 0 if index is None else index.searcher().num_docs
