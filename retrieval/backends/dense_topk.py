"""A dense search over a :class:`~.dense_matrix.DenseMatrix`: the top-``limit`` visible rows,
exact (every row scored) or from the matrix's HNSW graph (:mod:`.dense_graph`), visibility
checked for the best candidates only in windows that grow fourfold."""

from __future__ import annotations

import numpy as np

from .dense_matrix import DenseMatrix, View

#: Rows a search checks past its limit in its first window (invisible ones are dropped).
WINDOW_SLACK = 10


def search(
    matrix: DenseMatrix,
    query: np.ndarray,
    *,
    limit: int,
    revision: int,
    documents: frozenset | None = None,
) -> list[tuple[bytes, float]]:
    """The top-``limit`` visible rows for ``query`` as ``(node hex, score)``, best first (ties
    by node id): exact, or from the matrix's HNSW graph when it has one for this epoch and
    ``documents`` is ``None`` (:mod:`.dense_graph`; its candidates rescored exactly, ``k``
    widened fourfold while visible hits are short; the exact scan past a quarter of the rows or
    four times ``efSearch``, and when the score at the cut is tied, so ties go by node id).

    ``documents`` (``None``: all) restricts the rows before the top-k. The best unmasked rows
    are checked (:meth:`DenseMatrix.verdicts`) in a window of ``limit`` + :data:`WINDOW_SLACK`
    (rows already seen invisible are masked out of the scores) that grows fourfold
    until ``limit`` visible rows are found or every row was looked at; the verdicts go back to
    the matrix as masks (:meth:`DenseMatrix.mark`, ``revision`` the snapshot's).
    """
    view = matrix.view
    n = view.count
    if n == 0 or limit <= 0:
        return []
    query = np.ascontiguousarray(query, dtype=np.float32)
    graph = matrix.graph if documents is None else None
    if graph is not None and graph.epoch == view.epoch and graph.size >= n:
        masked = view.mask if matrix.dead_count or matrix.hidden else None
        count = matrix.dead_count + len(matrix.hidden)
        k = limit + WINDOW_SLACK
        # past 4 × efSearch the walk costs more than it saves: the exact scan instead
        while 4 * k <= n and k <= 4 * max(matrix.graph_ef_search, limit + WINDOW_SLACK):
            positions = graph.candidates(query, k, masked, matrix.graph_ef_search, count)
            positions = positions[positions < n]  # rows a later refresh added: not this view's
            scores = view.scores(query, positions)
            hits = _visible_top(matrix, view, scores, positions, len(positions), limit, revision)
            if len(hits) == limit:
                if np.count_nonzero(scores == hits[-1][1]) == 1:
                    return hits
                # a tie at the cut (duplicate chunks: the graph reaches few of a block of
                # identical vectors): the exact scan, which orders ties by node id
                break
            k *= 4
    if documents is not None:
        codes = view.document_codes
        wanted = np.fromiter((codes[d] for d in documents if d in codes), dtype=np.int32)
        positions = np.flatnonzero(np.isin(view.documents[:n], wanted) & (view.mask[:n] == 0))
        if not len(positions):
            return []
        scores = view.scores(query, positions)
        return _visible_top(matrix, view, scores, positions, len(positions), limit, revision)
    scores = view.scores(query)
    live = n
    if matrix.dead_count or matrix.hidden:  # else no row is masked: skip the pass
        masked = view.mask[:n] != 0
        scores[masked] = -np.inf
        live = n - int(np.count_nonzero(masked))
    return _visible_top(matrix, view, scores, None, live, limit, revision)


def _visible_top(
    matrix: DenseMatrix,
    view: View,
    scores: np.ndarray,
    positions: np.ndarray | None,
    live: int,
    limit: int,
    revision: int,
) -> list[tuple[bytes, float]]:
    """The best ``limit`` visible rows among ``scores`` (of ``positions``, or of every row;
    masked rows at -inf, ``live`` the others), checked in windows that grow fourfold
    (:func:`search`)."""
    if live == 0:
        return []
    verdicts: dict[int, bool | None] = {}  # matrix row → visible (None: the row is gone)
    window = min(limit + WINDOW_SLACK, live)
    while True:
        order = _best(scores, window, view, positions)  # score positions
        rows = _rows(order, positions).tolist()
        fresh = [r for r in rows if r not in verdicts]
        if fresh:
            verdicts.update(matrix.verdicts(view, fresh, revision))
        hits = [(r, p) for r, p in zip(rows, order, strict=True) if verdicts[r]][:limit]
        if len(hits) == limit or window >= live:
            break
        window = min(window * 4, live)
    learnt: dict[int, bool | None] = {r: v for r, v in verdicts.items() if v is not True}
    if learnt:
        matrix.mark(view, learnt, revision)
    return [(view.node_hex[r], float(scores[p])) for r, p in hits]


def _rows(picked: list[int], positions: np.ndarray | None) -> np.ndarray:
    """Matrix rows of score positions (the same unless the scores are of ``positions``)."""
    rows = np.asarray(picked, dtype=np.int64)
    return rows if positions is None else positions[rows]


def _best(scores: np.ndarray, window: int, view: View, positions: np.ndarray | None) -> list[int]:
    """The ``window`` best score positions (and every position tied with the last), ordered by
    score descending then node id."""
    if window >= len(scores):
        top = np.flatnonzero(np.isfinite(scores))
    else:
        top = np.argpartition(-scores, window - 1)[:window]
        floor = scores[top].min()
        ties = np.flatnonzero(scores == floor)
        if len(ties) > 1:
            top = np.union1d(top, ties)
    nodes = view.node_hex[_rows(top.tolist(), positions)]
    order = np.lexsort((nodes, -scores[top]))
    return top[order].tolist()
