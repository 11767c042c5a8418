"""The in-process matrix of one ``(space, index version)``'s dense vectors, kept current by
appending rows instead of rebuilding it after each publication.

Rows are :class:`~retrieval.models.DenseVector` rows in primary-key order, each with its node,
document and generation. The matrix holds every row of the version, visible or not; a search
(:mod:`.dense_topk`) scores them all (numpy), or the candidates of the matrix's HNSW graph past
``graph_min_rows`` rows (:mod:`.dense_graph`), and checks visibility for its best candidates only
(:meth:`DenseMatrix.verdicts`: the row's document exists, is enabled and has the row's generation
as its active one).

- **Refresh.** A search whose snapshot's publication head is newer than the matrix's reads the
  rows whose id is above the last one read (one query on the ``(space, index_version)`` index;
  vectors are written before the publication that makes them visible, and SQLite writers are
  serialised, so ids are given in commit order) and appends them. ``rows_read`` counts rows read
  from ``DenseVector``: a refresh reads the new rows only.
- **Documents.** A search reads the state (active generation, enabled) of its candidates'
  documents in one statement on their primary key; every change of that state moves the head
  (publish, enable/disable, delete), so states read at the matrix's revision are kept until the
  next refresh and a steady search mostly reads none.
- **Masks.** ``DEAD`` marks a row that is gone for good: its document deleted, its node
  re-embedded (a newer row of the same node came: the database keeps one per node and version),
  or found missing by a re-check. ``HIDDEN`` marks a row seen invisible at the matrix's revision
  (a staged or replaced generation, a disabled document); every refresh re-checks the hidden
  rows in SQL (:func:`~.dense_sql.visibility`), so a row made visible again is found, and
  replaced generations' rows (deleted by their publication) turn dead. Masked rows are left out
  of the scores before the top-k; a search's own verdicts are what make it exact, the marks only
  save work.
- **Compaction.** When dead rows pass :attr:`DenseMatrix.compact_fraction` of the rows (and
  :attr:`DenseMatrix.compact_min_rows`), a background thread copies the live rows into new
  arrays (no database read) and swaps them in; searches meanwhile read the old arrays.
- **Readers** take :attr:`DenseMatrix.view`, an immutable :class:`View` of arrays and a row
  count; writers append beyond the count (or into new arrays) and then publish a new view, so a
  reader never sees a half-appended matrix. One writer at a time per matrix (its ``lock``).

Memory per row: ``4 × dimension`` bytes of float32 plus :data:`ROW_OVERHEAD_BYTES` (57: row id,
node id as 32 hex bytes, document and generation codes, node key, mask); 1,593 bytes at 384
dimensions, with :data:`HEADROOM` spare rows allocated ahead, plus small per-document and
per-generation maps. The matrix is one contiguous array (one matrix-vector product per search:
blocks cost a BLAS call each, measured 2× slower at 100k rows on two cores); when the spare rows
run low a background thread copies it into a larger array (:meth:`DenseMatrix.grow`), so a
refresh rarely has to.
"""

from __future__ import annotations

import gc
import logging
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from . import dense_graph
from .dense_sql import count_rows, document_states, read_rows, visibility

logger = logging.getLogger("knowledgefs.retrieval")

DEAD = np.uint8(1)
HIDDEN = np.uint8(2)
#: Spare rows allocated past the rows read: a fraction of them (and at least 1,024 rows);
#: the arrays grow by ``1 + HEADROOM`` when the spare rows fall under half of that.
HEADROOM = 0.25
#: The fewest spare rows allocated ahead.
MIN_SPARE_ROWS = 1024
#: Bytes per row besides the vector: row id (int64), node id (32 hex bytes), document code
#: (int32), generation code (int32), node key (uint64: the node id's first 64 bits), mask.
ROW_OVERHEAD_BYTES = 8 + 32 + 4 + 4 + 8 + 1

_HEX_VALUES = np.zeros(256, dtype=np.uint64)
_HEX_VALUES[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint64)


def _node_keys(node_hex: np.ndarray) -> np.ndarray:
    """The first 16 hex digits of each node id as a uint64 (vectorised)."""
    digits = _HEX_VALUES[np.frombuffer(node_hex.tobytes(), np.uint8).reshape(-1, 32)[:, :16]]
    shifts = np.arange(60, -4, -4, dtype=np.uint64)
    return np.bitwise_or.reduce(digits << shifts, axis=1)


@dataclass(frozen=True)
class View:
    """What a search reads: the first ``count`` rows of the arrays (never written below
    ``count`` except the mask), the revision they were refreshed at and the compaction
    ``epoch`` (row positions change only when it does)."""

    count: int
    revision: int
    epoch: int
    matrix: np.ndarray  # (capacity, dimension) float32; rows ≥ count are not yet written
    row_ids: np.ndarray  # int64 DenseVector.id
    node_hex: np.ndarray  # S32 node id, 32 hex characters
    documents: np.ndarray  # int32 document code
    generations: np.ndarray  # int32 generation code
    node_keys: np.ndarray  # uint64, the node id's first 16 hex digits (finds re-embeddings)
    mask: np.ndarray  # uint8 DEAD | HIDDEN
    document_codes: dict[uuid.UUID, int]  # document id → code

    def scores(self, query: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Dot products of ``query`` with every row (or with ``rows``, positions), float32."""
        if rows is None:
            return self.matrix[: self.count] @ query
        if 4 * len(rows) < self.count:  # a few rows: gather them
            return self.matrix[rows] @ query
        return (self.matrix[: self.count] @ query)[rows]

    @property
    def capacity(self) -> int:
        return len(self.row_ids)


def _empty_view(dimension: int, revision: int) -> View:
    return _resized(View(0, revision, 0, np.empty((0, dimension), "<f4"), *_EMPTY, {}), 0)


_EMPTY = (
    np.empty(0, np.int64),
    np.empty(0, "S32"),
    np.empty(0, np.int32),
    np.empty(0, np.int32),
    np.empty(0, np.uint64),
    np.empty(0, np.uint8),
)


def _resized(view: View, capacity: int, upto: int | None = None) -> View:
    """``view`` with arrays of ``capacity`` rows holding its first ``upto`` (default
    ``count``) rows."""
    upto = view.count if upto is None else upto
    arrays = []
    for array in _arrays(view)[:-1]:
        out = np.empty((capacity, *array.shape[1:]), dtype=array.dtype)
        out[:upto] = array[:upto]
        arrays.append(out)
    return _view(view.count, view.revision, view.epoch, arrays, view.document_codes)


def _view(
    count: int,
    revision: int,
    epoch: int,
    arrays: Sequence[np.ndarray],
    document_codes: dict[uuid.UUID, int],
) -> View:
    """A :class:`View` of the per-row ``arrays`` in :class:`View` order (:func:`_arrays`)."""
    matrix, row_ids, node_hex, documents, generations, node_keys, mask = arrays
    return View(
        count, revision, epoch, matrix, row_ids, node_hex, documents, generations, node_keys,
        mask, document_codes,
    )  # fmt: skip


def _target(rows: int) -> int:
    return rows + max(int(rows * HEADROOM), MIN_SPARE_ROWS)


@dataclass
class DenseMatrix:
    """One ``(space, index version)``'s rows and masks (module docstring)."""

    space_id: uuid.UUID
    index_version: int
    dimension: int
    incremental: bool = True
    compact_fraction: float = 0.25
    compact_min_rows: int = 1024
    compact_in_background: bool = True
    graph_min_rows: int = 0  # a graph past this many rows (0: never; :mod:`.dense_graph`)
    graph_ef_search: int = 2000
    view: View = field(init=False)  # set by __post_init__
    lock: threading.RLock = field(default_factory=threading.RLock)
    last_id: int = 0
    by_raw_document: dict = field(default_factory=dict)  # document id as the database gives it
    document_raw: list = field(default_factory=list)  # code → document id as the database gives it
    by_raw_generation: dict = field(default_factory=dict)  # generation → code
    documents_read: dict = field(default_factory=dict)  # code → (active code, enabled) | None
    hidden: set = field(default_factory=set)  # positions marked HIDDEN
    dead_count: int = 0
    stats: dict = field(default_factory=dict)
    graph: dense_graph.DenseGraph | None = None  # of one epoch's rows, when built
    graph_building: bool = False
    graph_failed: tuple | None = None  # (epoch, rows) of the last failed graph build
    _compacting: bool = False
    _growing: bool = False

    def __post_init__(self) -> None:
        self.view = _empty_view(self.dimension, -1)
        self.stats = {
            "rows_read": 0,
            "last_refresh_rows": 0,
            "rechecked": 0,
            "builds": 0,
            "refreshes": 0,
            "compactions": 0,
            "growths": 0,
            "inline_growths": 0,
            "graph_builds": 0,
        }

    # --- writes (under ``lock``) -------------------------------------------------------------
    def refresh(self, revision: int) -> None:
        """Bring the matrix to ``revision``: append the rows written since the last read and
        re-check the hidden rows (call with ``lock`` held). A non-incremental matrix (other
        engines than SQLite: ids are not given in commit order) is read again whole."""
        if self.view.revision >= revision:
            return
        view = self.view
        first = view.revision < 0 or not self.incremental
        if first:  # a cold read: room for the rows there are, and the spare rows
            self.last_id, self.by_raw_document, self.hidden, self.dead_count = 0, {}, set(), 0
            self.document_raw, self.by_raw_generation = [], {}
            rows = count_rows(self.space_id, self.index_version)
            view = _resized(_empty_view(self.dimension, -1), _target(rows))
            # a new epoch: positions of the previous read (a graph being built of it, a
            # search's verdicts on it) must not be taken for this one's
            view = replace(view, epoch=self.view.epoch + 1)
        read = 0
        collecting = gc.isenabled()
        if first and collecting:  # a cold read makes ~6 objects a row: no collection passes
            gc.disable()
        try:
            for rows in read_rows(self.space_id, self.index_version, self.dimension, self.last_id):
                read += len(rows)
                view = self._append(view, rows)  # published once complete, below
        finally:
            if first and collecting:
                gc.enable()
        view = View(view.count, revision, view.epoch, *_arrays(view))
        self.stats["rows_read"] += read
        self.stats["last_refresh_rows"] = read
        self.stats["builds" if first else "refreshes"] += 1
        if self.hidden and not first:
            view = self._recheck(view)
        self.documents_read = {}  # read at the old revision
        self.view = view
        dense_graph.after_refresh(self, view)
        if self._growth_due(view):
            self.grow()

    def _append(self, old: View, rows: list) -> View:
        """``old`` with ``rows`` (:func:`read_rows`) written after its last row (in place when
        the spare rows suffice: nothing below ``old.count`` is written)."""
        if rows:
            self.last_id = rows[-1][0]
            foreign = sum(1 for r in rows if not r[3])
            if foreign:
                logger.error(
                    "index v%s of space %s: left out %d vectors whose dimension is not %d",
                    self.index_version,
                    self.space_id,
                    foreign,
                    self.dimension,
                )
                rows = [r for r in rows if r[3]]
        if not rows:
            return old
        ids, nodes, documents, _, visible, generations, vectors = zip(*rows, strict=True)
        n, start = len(rows), old.count
        if start + n > old.capacity:  # the spare rows ran out before a background growth
            old = _resized(old, _target(start + n))
            self.stats["inline_growths"] += 1
        codes = self.by_raw_document
        # New documents only name rows beyond ``old.count``: an older view never looks them up.
        document_codes = old.document_codes
        for raw in set(documents).difference(codes):
            codes[raw] = len(codes)
            self.document_raw.append(raw)
            document_codes[raw if isinstance(raw, uuid.UUID) else uuid.UUID(raw)] = codes[raw]
        end = start + n
        old.row_ids[start:end] = np.fromiter(ids, dtype=np.int64, count=n)
        old.node_hex[start:end] = _hex_array(nodes)
        old.documents[start:end] = np.fromiter(
            (codes[d] for d in documents), dtype=np.int32, count=n
        )
        gens = self.by_raw_generation
        for raw in set(generations).difference(gens):
            gens[raw] = len(gens)
        old.generations[start:end] = np.fromiter(
            (gens[g] for g in generations), dtype=np.int32, count=n
        )
        keys = _node_keys(old.node_hex[start:end])
        old.node_keys[start:end] = keys
        hidden = np.fromiter(visible, dtype=np.uint8, count=n) == 0
        old.mask[start:end] = np.where(hidden, HIDDEN, 0)
        self.hidden.update((start + np.flatnonzero(hidden)).tolist())
        if start:  # a node with a row already: re-embedded, its old row was deleted
            self._supersede(old, start, end)
        old.matrix[start:end] = np.frombuffer(b"".join(vectors), dtype="<f4").reshape(
            n, self.dimension
        )
        return View(end, old.revision, old.epoch, *_arrays(old))

    def _supersede(self, view: View, start: int, end: int) -> None:
        """Mark dead the rows before ``start`` whose node has one of the rows ``start:end``
        (the database keeps one row per node and version: the older one is gone)."""
        older = np.flatnonzero(np.isin(view.node_keys[:start], view.node_keys[start:end]))
        if not len(older):
            return
        fresh = set(view.node_hex[start:end].tolist())
        for position in older.tolist():
            if view.node_hex[position] in fresh and not view.mask[position] & DEAD:
                view.mask[position] = DEAD
                self.dead_count += 1
                self.hidden.discard(position)

    def verdicts(self, view: View, rows: list[int], revision: int) -> dict[int, bool | None]:
        """``{row: visible}`` (``None``: gone for good) for matrix rows of ``view``, decided by
        their documents: gone when the document is, visible when it is enabled and its active
        generation is the row's. One statement reads the documents not yet read at this
        revision (every change of a document's state moves the head, so a state read at the
        matrix's revision holds until the next refresh)."""
        codes = view.documents[rows].tolist()
        cache = self.documents_read if view.revision == revision == self.view.revision else {}
        states = {c: cache[c] for c in set(codes) if c in cache}
        missing = [c for c in set(codes) if c not in states]
        if missing:
            read = document_states([self.document_raw[c] for c in missing])
            gens = self.by_raw_generation
            for c in missing:
                state = read.get(self.document_raw[c])
                states[c] = None if state is None else (gens.get(state[0], -1), state[1])
            if cache is self.documents_read:
                with self.lock:
                    if self.view.revision == revision:
                        self.documents_read.update({c: states[c] for c in missing})
        generations = view.generations[rows].tolist()
        out: dict[int, bool | None] = {}
        for row, code, generation in zip(rows, codes, generations, strict=True):
            state = states[code]
            out[row] = None if state is None else bool(state[1]) and state[0] == generation
        return out

    def _recheck(self, view: View) -> View:
        """Re-check the hidden rows: a gone row turns dead, a visible one is unmasked."""
        positions = sorted(self.hidden)
        verdicts = visibility(view.row_ids[positions].tolist())
        self.stats["rechecked"] += len(positions)
        for position in positions:
            verdict = verdicts.get(int(view.row_ids[position]))
            if verdict is None:
                view.mask[position] = DEAD
                self.dead_count += 1
                self.hidden.discard(position)
            elif verdict:
                view.mask[position] = 0
                self.hidden.discard(position)
        return view

    def mark(self, view: View, verdicts: dict[int, bool | None], revision: int) -> None:
        """Record a search's verdicts (``{position: visible, or None when the row is gone}``)
        made on ``view`` for a snapshot at ``revision``: gone rows turn dead; invisible ones
        are hidden only while the matrix is still at that revision (a newer head may have made
        them visible). Ignored after a compaction moved the positions."""
        with self.lock:
            current = self.view
            if current.epoch != view.epoch:
                return
            for position, visible in verdicts.items():
                if visible is None:
                    if not current.mask[position] & DEAD:
                        current.mask[position] = DEAD
                        self.dead_count += 1
                        self.hidden.discard(position)
                elif not visible and current.revision == revision:
                    current.mask[position] |= HIDDEN
                    self.hidden.add(position)
            due = self._compaction_due(current)
        if due:
            self.compact()

    # --- compaction ---------------------------------------------------------------------------
    def _compaction_due(self, view: View) -> bool:
        return (
            not self._compacting
            and self.dead_count >= self.compact_min_rows
            and self.dead_count > self.compact_fraction * max(view.count, 1)
        )

    def compact(self) -> None:
        """Drop the dead rows (a background thread unless :attr:`compact_in_background` is
        false); searches keep reading the old view until the new one is published."""
        self._compacting = True
        if self.compact_in_background:
            threading.Thread(target=self._compact, name="dense-compaction", daemon=True).start()
        else:
            self._compact()

    def _compact(self) -> None:
        try:
            base = self.view
            keep = np.flatnonzero((base.mask[: base.count] & DEAD) == 0)
            capacity = _target(len(keep))
            matrix = np.empty((capacity, self.dimension), "<f4")
            matrix[: len(keep)] = base.matrix[keep]  # the large copy, outside the lock
            with self.lock:
                current = self.view
                if current.epoch != base.epoch or current.count - base.count > capacity - len(keep):
                    return  # compacted meanwhile, or too many rows came: the next time
                kept = np.concatenate([keep, np.arange(base.count, current.count)])
                matrix[len(keep) : len(kept)] = current.matrix[base.count : current.count]
                arrays = []
                for array in _arrays(current)[1:-1]:
                    out = np.empty(capacity, dtype=array.dtype)
                    out[: len(kept)] = array[kept]
                    arrays.append(out)
                self.view = _view(
                    len(kept),
                    current.revision,
                    current.epoch + 1,
                    [matrix, *arrays],
                    current.document_codes,
                )
                self.hidden = set(np.flatnonzero(arrays[-1][: len(kept)] & HIDDEN).tolist())
                self.dead_count = 0
                self.stats["compactions"] += 1
                dense_graph.after_refresh(self, self.view)  # positions moved: a new graph
        finally:
            self._compacting = False

    # --- growth -------------------------------------------------------------------------------
    def _growth_due(self, view: View) -> bool:
        spare = view.capacity - view.count
        return not self._growing and spare < max(int(view.count * HEADROOM), MIN_SPARE_ROWS) // 2

    def grow(self) -> None:
        """Copy the arrays into larger ones ahead of need (a background thread unless
        :attr:`compact_in_background` is false); searches keep reading the old arrays."""
        self._growing = True
        if self.compact_in_background:
            threading.Thread(target=self._grow, name="dense-growth", daemon=True).start()
        else:
            self._grow()

    def _grow(self) -> None:
        try:
            base = self.view
            larger = _resized(base, _target(base.capacity))  # the copy, outside the lock
            with self.lock:
                current = self.view
                if current.epoch != base.epoch or current.matrix is not base.matrix:
                    return  # compacted or grown inline meanwhile
                for new, old in zip(_arrays(larger)[:-1], _arrays(current)[:-1], strict=True):
                    new[base.count : current.count] = old[base.count : current.count]
                self.view = View(
                    current.count, current.revision, current.epoch, *_arrays(larger)[:-1],
                    current.document_codes,
                )  # fmt: skip
                self.stats["growths"] += 1
        finally:
            self._growing = False

    def info(self) -> dict:
        """Counters and sizes: ``rows``, ``dead``, ``hidden``, ``bytes_per_row`` and the
        ``stats`` (``rows_read``, ``last_refresh_rows``, ``rechecked``, ``builds``,
        ``refreshes``, ``compactions``)."""
        view = self.view
        return {
            **self.stats,
            "rows": view.count,
            "dead": self.dead_count,
            "hidden": len(self.hidden),
            "revision": view.revision,
            "bytes_per_row": 4 * self.dimension + ROW_OVERHEAD_BYTES,
            "graph_building": self.graph_building,
            **(self.graph.info() if self.graph is not None else {"graph_rows": 0}),
        }


_Arrays = tuple[
    np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
    dict[uuid.UUID, int],
]  # fmt: skip


def _arrays(view: View) -> _Arrays:
    """The per-row arrays in :class:`View` order, then the document codes."""
    return (
        view.matrix,
        view.row_ids,
        view.node_hex,
        view.documents,
        view.generations,
        view.node_keys,
        view.mask,
        view.document_codes,
    )


def _hex_array(nodes: tuple) -> np.ndarray:
    """Node ids (32 hex characters, as bytes or str) as one ``S32`` array (one join)."""
    first = nodes[0]
    joined = b"".join(nodes) if isinstance(first, bytes | memoryview) else "".join(nodes).encode()
    return np.frombuffer(joined, dtype="S32")
