"""An HNSW graph over a large dense matrix's rows, so that a search reads a few thousand rows
instead of all of them (faiss-cpu ``IndexHNSWSQ``: vectors as 8-bit scalar codes, ``M`` 32;
Malkov & Yashunin, "Efficient and robust approximate nearest neighbor search using Hierarchical
Navigable Small World graphs", arXiv:1603.09320).

- **When.** A matrix of at least ``KNOWLEDGE_DENSE_GRAPH_MIN_ROWS`` rows (0: never) builds its
  graph in a background thread; until the graph is ready, and after a compaction moved the rows
  (a new epoch) until it is rebuilt, searches scan the matrix exactly.
- **Ids** are matrix positions of one epoch. A refresh adds its appended rows under the graph's
  write lock (searches hold its read side), so the graph covers every row of its epoch.
- **Search.** The graph's best ``k`` positions (``efSearch`` =
  max(``KNOWLEDGE_DENSE_GRAPH_EF_SEARCH``, ``k``)), masked rows left out by a bitmap selector
  inside the graph walk; the caller rescores them exactly from the float32 matrix, checks
  visibility and widens ``k`` fourfold while visible hits are short
  (:func:`~.dense_topk.search`). Not exact: recall@10 against the exact scan is measured in
  docs/scaling.md.
- **Memory** per row on top of the matrix's 1,593 bytes: ``dimension`` bytes of codes and
  about ``2 × M × 4`` bytes of level-0 links (640 bytes at 384 dimensions).
"""

from __future__ import annotations

import importlib
import logging
import threading
from contextlib import contextmanager
from typing import Any

import numpy as np

logger = logging.getLogger("knowledgefs.retrieval")

#: Links per node (level 0 has twice as many); faiss's HNSW default is 32.
M = 32
#: Candidate list while inserting (faiss's default 40): build time against graph quality.
EF_CONSTRUCTION = 40
#: Rows added per call while building (bounded memory for the float32 copy faiss reads).
ADD_BATCH = 65536
#: Rows sampled to train the scalar quantiser's per-dimension ranges.
TRAIN_ROWS = 100_000


def _faiss() -> Any:
    """The faiss module, imported on first use (its stubs do not cover the HNSW parameters)."""
    return importlib.import_module("faiss")


class ReadWriteLock:
    """Many readers or one writer (writers wait for the readers in flight)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False

    @contextmanager
    def reading(self):
        with self._cond:
            while self._writing:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def writing(self):
        with self._cond:
            while self._writing or self._readers:
                self._cond.wait()
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


class DenseGraph:
    """The HNSW graph of one matrix epoch's rows ``[0, size)``."""

    def __init__(self, dimension: int, epoch: int) -> None:
        faiss = _faiss()
        self.epoch = epoch
        self.size = 0
        self.lock = ReadWriteLock()
        self.index = faiss.IndexHNSWSQ(
            dimension, faiss.ScalarQuantizer.QT_8bit, M, faiss.METRIC_INNER_PRODUCT
        )
        self.index.hnsw.efConstruction = EF_CONSTRUCTION

    @classmethod
    def build(cls, matrix: np.ndarray, count: int, epoch: int) -> DenseGraph:
        """A graph of ``matrix[:count]`` (rows below ``count`` are never rewritten, so this
        runs outside the matrix's lock)."""
        graph = cls(matrix.shape[1], epoch)
        step = max(1, count // TRAIN_ROWS)
        graph.index.train(np.ascontiguousarray(matrix[:count:step]))
        graph.extend(matrix, count)
        return graph

    def extend(self, matrix: np.ndarray, count: int) -> None:
        """Add ``matrix[size:count]`` (positions ``size``… in order)."""
        with self.lock.writing():
            for start in range(self.size, count, ADD_BATCH):
                end = min(count, start + ADD_BATCH)
                self.index.add(np.ascontiguousarray(matrix[start:end]))
                self.size = end

    def candidates(
        self, query: np.ndarray, k: int, mask: np.ndarray | None, ef: int, masked: int = 0
    ) -> np.ndarray:
        """The graph's best ``k`` positions for ``query`` (int64, best first), leaving out the
        positions where ``mask`` (uint8 over the matrix's rows, ``None``: none) is set.

        ``masked`` (how many rows are masked, an upper bound) picks how: at most ``k`` masked
        rows, the walk returns ``k + masked`` and the masked ones are dropped after it; more,
        and a bitmap selector (one bit a row, built per search) keeps them out of the walk."""
        faiss = _faiss()
        with self.lock.reading():
            size = self.size
            params = faiss.SearchParametersHNSW()
            want = k
            keep = None
            if mask is not None and masked > k:  # bytes of bits; rows past the mask: out
                keep = np.packbits(mask[:size] == 0, bitorder="little")
                params.sel = faiss.IDSelectorBitmap(len(keep), faiss.swig_ptr(keep))
            elif mask is not None:
                want = k + masked
            params.efSearch = max(ef, want)
            _, ids = self.index.search(query.reshape(1, -1), min(want, size), params=params)
        found = ids[0]
        found = found[found >= 0].astype(np.int64)
        if mask is not None and keep is None:
            found = found[found < len(mask)]
            found = found[mask[found] == 0][:k]
        return found

    def info(self) -> dict:
        return {"graph_rows": self.size, "graph_epoch": self.epoch}


def due(matrix, view) -> bool:
    """Whether ``matrix`` (a :class:`~.dense_matrix.DenseMatrix`) should start building a graph
    of ``view``: enabled, large enough, none of this epoch held or being built, and no build of
    this epoch failed unless the rows doubled since (call with the matrix's lock held)."""
    if not matrix.graph_min_rows or view.count < matrix.graph_min_rows or matrix.graph_building:
        return False
    failed = matrix.graph_failed  # (epoch, rows) of the last failed build, or None
    if failed is not None and failed[0] == view.epoch and view.count < 2 * failed[1]:
        return False
    return matrix.graph is None or matrix.graph.epoch != view.epoch


def after_refresh(matrix, view) -> None:
    """Keep ``matrix``'s graph on ``view`` (called with the matrix's lock held): add the rows a
    refresh appended, drop a graph of an older epoch, start a build when one is due."""
    graph = matrix.graph
    if graph is not None and graph.epoch != view.epoch:
        matrix.graph = graph = None
    if graph is not None and view.count > graph.size:
        graph.extend(view.matrix, view.count)
    if due(matrix, view):
        start_build(matrix)


def start_build(matrix) -> None:
    """Build a graph of the matrix's current view (a background thread unless the matrix builds
    inline, as its compactions do)."""
    matrix.graph_building = True
    if matrix.compact_in_background:
        threading.Thread(target=_build, args=(matrix,), name="dense-graph", daemon=True).start()
    else:
        _build(matrix)


def _build(matrix) -> None:
    base = matrix.view
    try:
        graph = DenseGraph.build(base.matrix, base.count, base.epoch)
    except Exception:
        logger.exception("dense graph of space %s: build failed", matrix.space_id)
        graph = None
    with matrix.lock:  # the install and the restart decision, as after_refresh's, under it
        current = matrix.view
        try:
            if graph is not None and current.epoch == base.epoch:  # else compacted meanwhile
                graph.extend(current.matrix, current.count)
                matrix.graph = graph
                matrix.stats["graph_builds"] += 1
        except Exception:
            logger.exception("dense graph of space %s: build failed", matrix.space_id)
            graph = None
        finally:
            matrix.graph_building = False
        if graph is None:
            matrix.graph_failed = (base.epoch, base.count)
        if due(matrix, matrix.view):
            start_build(matrix)
