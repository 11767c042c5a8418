"""Which node ids are visible, remembered per space for one publication head revision (the
keyword leg's visibility check on SQLite).

Every change of a document's state (publish, replace, delete, enable/disable, a metadata
patch) moves the space's publication head, so a verdict read while the head is at revision R
holds for every query whose snapshot is at R: within one revision a node's visibility is read
once per process, not once per query (the dense matrix keeps its documents' states the same
way, :meth:`.dense_matrix.DenseMatrix.verdicts`).
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable

#: Verdicts kept per space (about 120 bytes each, and never more than the space's chunks);
#: past it the space's verdicts start over.
MAX_VERDICTS = 200_000
#: Spaces whose verdicts a process keeps (the least recently queried are dropped).
MAX_SPACES = 64


class HeadVerdicts:
    """``visible(space, head, ids)``: the ids of ``ids`` that are visible at ``head``, read by
    ``read`` (``ids → visible ids``, one statement) only for the ids not yet known at that head.

    A query at a newer head than the one held drops the space's verdicts and starts the new
    head's; a query at an older head (its snapshot was read before a publication) reads
    everything and keeps nothing. At most ``spaces`` spaces are kept, least recently queried
    dropped first. Safe under threads: the dictionaries are replaced or updated
    whole under a lock; a reader sees a verdict either before or after an update.
    """

    def __init__(
        self,
        read: Callable[[list[str]], set[str]],
        *,
        limit: int = MAX_VERDICTS,
        spaces: int = MAX_SPACES,
    ):
        self._read = read
        self._limit = limit
        self._max_spaces = max(1, spaces)
        self._lock = threading.Lock()
        self._spaces: OrderedDict[uuid.UUID, tuple[int, dict[str, bool]]] = OrderedDict()

    def visible(self, space_id: uuid.UUID, head: int | None, ids: list[str]) -> set[str]:
        if head is None:
            return self._read(ids)
        with self._lock:
            held = self._spaces.get(space_id)
            if held is None or held[0] < head:
                held = (head, {})
                self._spaces[space_id] = held
                while len(self._spaces) > self._max_spaces:
                    self._spaces.popitem(last=False)
            self._spaces.move_to_end(space_id)
        if held[0] > head:
            return self._read(ids)
        verdicts = held[1]
        known: dict[str, bool] = {}
        for i in ids:  # (another thread may clear the dictionary meanwhile: get, never [])
            verdict = verdicts.get(i)
            if verdict is not None:
                known[i] = verdict
        missing = [i for i in ids if i not in known]
        if missing:
            seen = self._read(missing)
            fresh = {i: i in seen for i in missing}
            known.update(fresh)
            with self._lock:
                if len(verdicts) + len(fresh) > self._limit:
                    verdicts.clear()
                verdicts.update(fresh)
        return {i for i in ids if known[i]}

    def forget(self, space_id: uuid.UUID | None = None) -> None:
        """Drop the verdicts of one space (``None``: of every space)."""
        with self._lock:
            if space_id is None:
                self._spaces.clear()
            else:
                self._spaces.pop(space_id, None)
