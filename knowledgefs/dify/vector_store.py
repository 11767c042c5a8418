"""Dense vectors in Dify's vector store (``POST /inner/api/knowledge-fs/vectors``, inventory 7.2).

Dify keeps the vectors in whatever engine its ``VECTOR_STORE`` names (Qdrant, TiDB on Qdrant,
Elasticsearch, Weaviate), one collection per scope, cosine distance. KnowledgeFS sends only what
the engine needs: a point is its node id, the node's generation id, a content hash and the vector;
no text, no permission data. Which ids a search may return is decided by SQL in KnowledgeFS and
sent with every search (``ids``); the engine never widens it.

Limits of the route (Dify's request model) and how this client keeps them:

- ``upsert``: at most 64 points per request; :meth:`DifyVectorStore.upsert` sends ``ceil(n/64)``
  requests, each also under the 32 MiB body limit.
- ``get``: at most 64 ids; ``search`` and ``delete``: at most 2048 ids per request. A search over
  more ids is sent in chunks of 2048, up to ``concurrency`` in flight, and the answers merged by
  score (cost: ``ceil(ids/2048)`` requests per search).
- ``limit`` 1..256; vectors of exactly ``scope.dimension`` finite floats, not all zero.
- ``delete`` succeeds only once Dify has verified that the points are no longer readable.

Every answer is validated before use: a search returns at most ``limit`` matches, only ids it was
given, each once, with finite scores; a ``get`` only requested ids. Anything else is
``VECTOR_STORE_RESPONSE_INVALID``. Failures are :class:`~knowledgefs.dify.errors.VectorStoreError`
(413 is ``VECTOR_SPACE_QUOTA_EXCEEDED``, terminal; 503, sent with ``Retry-After`` while Dify
provisions a tenant's store, and other 5xx are retryable and retried inline by the transport).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import config
from .bridge_store import (
    Match,
    _BridgeStore,
    _by_size,
    chunks,
    identifier,
    tenant_identifier,
    unique_ids,
)
from .errors import DifyError, VectorStoreError

VECTORS = "/inner/api/knowledge-fs/vectors"
KINDS = ("dense", "visual", "graph-entity", "graph-relation")
_HEX64 = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class VectorScope:
    """One collection of Dify's vector store: a tenant's knowledge space, a vector space (here:
    one index version of the space), the kind of vectors and their dimension (1..16384)."""

    tenant_id: str
    knowledge_space_id: str
    vector_space_id: str
    kind: str
    dimension: int

    def as_json(self) -> dict[str, Any]:
        """The ``scope`` object of a request; raises ``VECTOR_STORE_INPUT_INVALID``."""
        errors = VectorStoreError
        if self.kind not in KINDS:
            raise errors.of("input", f"scope.kind must be one of {', '.join(KINDS)}")
        if not isinstance(self.dimension, int) or not (
            1 <= self.dimension <= config.BRIDGE_MAX_DIMENSION
        ):
            raise errors.of("input", f"scope.dimension must be 1..{config.BRIDGE_MAX_DIMENSION}")
        if not 1 <= len(self.vector_space_id) <= config.BRIDGE_MAX_SCOPE_ID_CHARS:
            raise errors.of(
                "input",
                f"scope.vector_space_id must be 1..{config.BRIDGE_MAX_SCOPE_ID_CHARS} characters",
            )
        return {
            "tenant_id": tenant_identifier(self.tenant_id),
            "knowledge_space_id": identifier(
                self.knowledge_space_id, "scope.knowledge_space_id", errors
            ),
            "vector_space_id": self.vector_space_id,
            "kind": self.kind,
            "dimension": self.dimension,
        }


@dataclass(frozen=True)
class VectorPoint:
    """A point: node id, generation id (UUIDs), ``content_hash`` (64 lower-case hex
    characters, the SHA-256 of the node's text) and the vector (``dimension`` floats)."""

    id: str
    generation_id: str
    content_hash: str
    vector: Sequence[float]


def checked_vector(values: Sequence[float], dimension: int, name: str) -> list[float]:
    """``values`` as a list of floats, refused (``VECTOR_STORE_INPUT_INVALID``) unless it has
    ``dimension`` finite values, not all zero (the route's rule: a zero vector has no cosine)."""
    out = [float(v) for v in values]
    if len(out) != dimension:
        raise VectorStoreError.of(
            "input", f"{name} has {len(out)} dimensions, the scope {dimension}"
        )
    if not all(math.isfinite(v) for v in out):
        raise VectorStoreError.of("input", f"{name} holds a value that is not finite")
    if not any(out):
        raise VectorStoreError.of("input", f"{name} is all zeros")
    return out


class DifyVectorStore(_BridgeStore):
    """Client of ``POST /inner/api/knowledge-fs/vectors`` (see the module docstring)."""

    route = VECTORS
    errors: type[DifyError] = VectorStoreError

    def upsert(self, scope: VectorScope, points: Sequence[VectorPoint]) -> int:
        """Write ``points`` (ids unique) in requests of at most 64 points and 32 MiB; returns
        the requests sent. 413 raises ``VECTOR_SPACE_QUOTA_EXCEEDED``."""
        body_scope = scope.as_json()
        payload = [self._point(p, scope.dimension) for p in points]
        if len({p["id"] for p in payload}) != len(payload):
            raise VectorStoreError.of("input", "points must have unique ids")
        sent = 0
        for piece in _by_size(payload, self._encoded_size):
            self._post({"operation": "upsert", "scope": body_scope, "points": piece})
            sent += 1
        return sent

    @staticmethod
    def _point(point: VectorPoint, dimension: int) -> dict[str, Any]:
        content_hash = str(point.content_hash)
        if len(content_hash) != 64 or not set(content_hash) <= _HEX64:
            raise VectorStoreError.of("input", "content_hash must be 64 lower-case hex digits")
        return {
            "id": identifier(point.id, "points[].id", VectorStoreError),
            "generation_id": identifier(
                point.generation_id, "points[].generation_id", VectorStoreError
            ),
            "content_hash": content_hash,
            "vector": checked_vector(point.vector, dimension, "points[].vector"),
        }

    def get(self, scope: VectorScope, ids: Sequence[Any]) -> list[VectorPoint]:
        """The stored points among ``ids`` (missing ones are absent), 64 ids per request."""
        body_scope = scope.as_json()
        found: list[VectorPoint] = []
        for piece in chunks(unique_ids(ids, VectorStoreError), config.BRIDGE_MAX_GET_IDS):
            answer = self._post(
                {"operation": "get", "scope": body_scope, "ids": list(piece)},
                max_bytes=config.BRIDGE_GET_RESPONSE_MAX_BYTES,
            )
            asked = set(piece)
            for item in answer["points"]:
                point = self._read_point(item, scope.dimension)
                if point.id not in asked:
                    raise self._invalid("get returned a point that was not asked for")
                asked.discard(point.id)
                found.append(point)
        return found

    def _read_point(self, item: Any, dimension: int) -> VectorPoint:
        try:
            return VectorPoint(
                str(uuid.UUID(str(item["id"]))),
                str(uuid.UUID(str(item["generation_id"]))),
                str(item["content_hash"]),
                checked_vector(item["vector"], dimension, "a returned vector"),
            )
        except (KeyError, TypeError, ValueError, DifyError):
            raise self._invalid("get returned a malformed point") from None

    def search(
        self, scope: VectorScope, query_vector: Sequence[float], ids: Sequence[Any], limit: int
    ) -> list[Match]:
        """Cosine top-``limit`` among ``ids`` (the authorized ids; none: no request, ``[]``).

        More than 2048 ids are searched in chunks, ``concurrency`` at a time, and merged.
        """
        self._check_limit(limit)
        return self._search(
            scope,
            ids,
            limit,
            lambda: {"query_vector": checked_vector(query_vector, scope.dimension, "query_vector")},
        )
