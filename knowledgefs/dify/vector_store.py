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

import json
import math
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from . import config
from .errors import DifyError, VectorStoreError
from .http import DifyTransport, parse_json

VECTORS = "/inner/api/knowledge-fs/vectors"
KINDS = ("dense", "visual", "graph-entity", "graph-relation")
_HEX64 = frozenset("0123456789abcdef")


def identifier(value: Any, name: str, errors: type[DifyError]) -> str:
    """``value`` as the canonical lower-case UUID string the route requires, else ``input``."""
    try:
        return str(uuid.UUID(str(value)))
    except (ValueError, TypeError, AttributeError):
        raise errors.of("input", f"{name} must be a UUID") from None


def tenant_identifier(tenant_id: str) -> str:
    """The UUID a tenant is known by on the bridge.

    Dify's tenants are UUIDs and are sent as they are; any other tenant id (an embedded
    deployment's ``tenant-a``) is sent as its UUIDv5 in the URL namespace of
    ``knowledgefs:tenant:<id>``, so one tenant always maps to one UUID.
    """
    try:
        return str(uuid.UUID(tenant_id))
    except (ValueError, TypeError, AttributeError):
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"knowledgefs:tenant:{tenant_id}"))


def chunks(items: Sequence, size: int) -> list[Sequence]:
    """``items`` cut into consecutive pieces of at most ``size``."""
    return [items[i : i + size] for i in range(0, len(items), size)]


def unique_ids(ids: Sequence[Any], errors: type[DifyError]) -> list[str]:
    """Canonical UUID strings of ``ids``; a repeated id is ``input`` (the route refuses it)."""
    out = [identifier(i, "ids[]", errors) for i in ids]
    if len(set(out)) != len(out):
        raise errors.of("input", "ids must be unique")
    return out


@dataclass(frozen=True)
class Match:
    """One search hit: a point id (canonical UUID string) and its score (higher is better;
    cosine similarity for vectors, the engine's relevance for texts)."""

    id: str
    score: float


class BridgeClient:
    """What the vector and the text client share: the transport, the request loop, the chunked
    search with its merge, and the checks of an answer.

    ``timeout_ms`` bounds each request (retries included; default 30 000, setting
    ``DIFY_VECTOR_STORE_REQUEST_TIMEOUT_MS``); ``concurrency`` is how many chunk searches of one
    search are in flight (default 4). ``requests`` counts the requests this client sent.
    """

    route = VECTORS
    errors: type[DifyError] = VectorStoreError

    def __init__(
        self,
        *,
        transport: DifyTransport | None = None,
        timeout_ms: int = config.BRIDGE_TIMEOUT_MS,
        concurrency: int = config.BRIDGE_SEARCH_CONCURRENCY,
    ) -> None:
        self.transport = transport or DifyTransport()
        self.timeout = timeout_ms / 1000
        self.concurrency = max(1, concurrency)
        self.requests = 0
        self._count_lock = threading.Lock()

    def _post(self, body: dict, *, max_bytes: int = config.BRIDGE_RESPONSE_MAX_BYTES) -> dict:
        """Send one operation, return its ``{points, matches}`` answer (both lists)."""
        with self._count_lock:  # chunk searches run on several threads
            self.requests += 1
        reply = self.transport.request(
            "POST",
            self.route,
            errors=self.errors,
            timeout=self.timeout,
            max_bytes=max_bytes,
            idempotent=True,  # every operation is: upsert by id, delete, reads
            json_body=body,
        )
        value = parse_json(reply.body, errors=self.errors, route=self.route)
        if (
            not isinstance(value, dict)
            or not isinstance(value.get("points", []), list)
            or not isinstance(value.get("matches", []), list)
        ):
            raise self.errors.of(
                "invalid", f"{self.route}: the answer is not {{points, matches}}", route=self.route
            )
        return {"points": value.get("points", []), "matches": value.get("matches", [])}

    def _check_limit(self, limit: int) -> None:
        if not isinstance(limit, int) or not 1 <= limit <= config.BRIDGE_MAX_LIMIT:
            raise self.errors.of("input", f"limit must be 1..{config.BRIDGE_MAX_LIMIT}")

    def _matches(self, answer: dict, asked: Sequence[str], limit: int) -> list[Match]:
        """The answer's matches, refused unless each is one of ``asked``, once, with a finite
        score, and there are at most ``limit``."""
        raw = answer["matches"]
        if len(raw) > limit:
            raise self._invalid(f"{len(raw)} matches for a limit of {limit}")
        allowed = set(asked)
        seen: set[str] = set()
        out: list[Match] = []
        for item in raw:
            if not isinstance(item, dict):
                raise self._invalid("a match is not an object")
            try:
                point = str(uuid.UUID(str(item.get("id"))))
                score = float(item.get("score"))
            except (ValueError, TypeError):
                raise self._invalid("a match has no UUID id or no numeric score") from None
            if point not in allowed:
                raise self._invalid("a match is not one of the authorized ids")
            if point in seen:
                raise self._invalid("a match is repeated")
            if not math.isfinite(score):
                raise self._invalid("a match has a score that is not finite")
            seen.add(point)
            out.append(Match(point, score))
        return out

    def _invalid(self, detail: str) -> DifyError:
        return self.errors.of("invalid", f"{self.route}: {detail}", route=self.route)

    def _search_chunks(
        self, ids: list[str], limit: int, body_for: Callable[[list[str]], dict]
    ) -> list[Match]:
        """Search every chunk of at most 2048 ``ids`` and merge: the best ``limit`` by score
        (ties by id, so the merge is deterministic)."""
        pieces = chunks(ids, config.BRIDGE_MAX_IDS)

        def one(piece: Sequence[str]) -> list[Match]:
            return self._matches(self._post(body_for(list(piece))), piece, limit)

        if len(pieces) == 1 or self.concurrency == 1:
            found = [m for piece in pieces for m in one(piece)]
        else:
            with ThreadPoolExecutor(min(self.concurrency, len(pieces))) as pool:
                found = [m for result in pool.map(one, pieces) for m in result]
        found.sort(key=lambda m: (-m.score, m.id))
        return found[:limit]

    def _delete(self, scope: dict, ids: Sequence[Any]) -> int:
        """Delete ``ids`` in chunks of 2048; Dify answers only after it verified that they are
        no longer readable. Returns the requests sent."""
        canonical = unique_ids(ids, self.errors)
        sent = 0
        for piece in chunks(canonical, config.BRIDGE_MAX_IDS):
            self._post({"operation": "delete", "scope": scope, "ids": list(piece)})
            sent += 1
        return sent

    @staticmethod
    def _encoded_size(value: Any) -> int:
        return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


@dataclass(frozen=True)
class VectorScope:
    """One collection of Dify's vector store: a tenant's knowledge space, a vector space (here:
    one index version of the space), the kind of vectors and their dimension (1..16384)."""

    tenant_id: str
    knowledge_space_id: str
    vector_space_id: str
    kind: str
    dimension: int

    def as_json(self) -> dict:
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


class DifyVectorStore(BridgeClient):
    """Client of ``POST /inner/api/knowledge-fs/vectors`` (see the module docstring)."""

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
    def _point(point: VectorPoint, dimension: int) -> dict:
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
        canonical = unique_ids(ids, VectorStoreError)
        if not canonical:
            return []
        body_scope = scope.as_json()
        vector = checked_vector(query_vector, scope.dimension, "query_vector")
        return self._search_chunks(
            canonical,
            limit,
            lambda piece: {
                "operation": "search",
                "scope": body_scope,
                "ids": piece,
                "query_vector": vector,
                "limit": limit,
            },
        )

    def delete(self, scope: VectorScope, ids: Sequence[Any]) -> int:
        """Delete ``ids`` (2048 per request, each verified invisible by Dify); returns the
        requests sent."""
        return self._delete(scope.as_json(), ids)


def _by_size(payload: list[dict], size_of: Callable[[Any], int]) -> list[list[dict]]:
    """Consecutive batches of at most 64 points whose encoded size stays under the 32 MiB body
    limit (with 64 KiB left for the rest of the request)."""
    budget = config.BRIDGE_MAX_BODY_BYTES - 64 * 1024
    batches: list[list[dict]] = []
    current: list[dict] = []
    used = 0
    for point in payload:
        size = size_of(point) + 1
        if current and (len(current) == config.BRIDGE_MAX_POINTS or used + size > budget):
            batches.append(current)
            current, used = [], 0
        current.append(point)
        used += size
    if current:
        batches.append(current)
    return batches
