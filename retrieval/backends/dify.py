"""The Dify bridge backend: the keyword and dense projections live in Dify's vector store.

Selected by ``KNOWLEDGE_SEARCH_BACKEND=dify``. Dify's ``VECTOR_STORE`` engine (Qdrant, TiDB on
Qdrant, Elasticsearch, Weaviate) holds the index, so it scales with that engine; KnowledgeFS keeps
every relational row and decides, in SQL, which nodes a search may return.

Writes (inside the compiler's transaction, like the database backends):

- keyword projection → ``POST /inner/api/knowledge-fs/texts`` ``upsert``, one text scope per
  space (``index_version`` :data:`TEXT_INDEX_VERSION`), the node's :func:`keyword_text`
  (CJK bigrams included) as the text;
- dense vectors → ``POST /inner/api/knowledge-fs/vectors`` ``upsert``, one vector scope per
  space and index version: kind ``dense``, ``vector_space_id`` :func:`vector_space_id`, the
  version's dimension. No text and no permission data goes with a vector.

Both are sent in requests of at most 64 points: indexing N nodes costs ``ceil(N/64)`` text
requests plus ``ceil(N/64)`` vector requests per index version being filled.

The ledger: a :class:`~retrieval.models.DenseVector` row is still written per node and version,
with an empty ``vector`` (the vector itself is only in Dify). :mod:`retrieval.index_versions` keeps
using these rows unchanged to find what a rebuild must embed, to check a cutover is complete and
to know which scopes a node's vectors are in when it is deleted or its version retired.

Reads: the authorized ids are computed in SQL for every search (the space's visible nodes: the
document's active generation, enabled, and the filter's documents; for the dense leg, those with
a ledger row in the version) and sent with the search, 2048 per request, up to
``KNOWLEDGE_SEARCH_BRIDGE_CONCURRENCY`` in flight, merged by score. Cost per leg and query:
``ceil(visible/2048)`` requests carrying about 39 bytes per id (at 1M visible chunks: 489
requests, ~38 MB of ids), plus the SQL read of the ids. Points of unpublished, superseded or
deleted generations may sit in Dify for a while (a rolled-back transaction, an interrupted
delete); they are never authorized, so never returned.

Deletes: a node's points are deleted from every scope its ledger names, and from the text scope;
Dify answers only after it verified the points are invisible, so an acknowledged delete is
final. Failures become :class:`SearchBackendError`: 503 ``dify_vector_store_unavailable`` (a
later attempt may succeed; ``Retry-After``) or ``dify_vector_store_failed`` (Dify refused the
request or answered something invalid), 413 ``vector_space_quota_exceeded`` on an upsert past the
tenant's quota. Never a 500.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from functools import partial
from typing import TypeVar

import numpy as np
from django.conf import settings
from django.db import connection

from ingestion.models import KnowledgeNode
from knowledgefs.dify.errors import DifyError, DifyNotConfigured
from knowledgefs.dify.text_store import DifyTextStore, TextPoint, TextScope
from knowledgefs.dify.transport import DifyTransport
from knowledgefs.dify.vector_store import DifyVectorStore, VectorPoint, VectorScope
from retrieval.models import DenseVector
from retrieval.text import keyword_terms, keyword_text
from spaces.models import KnowledgeSpace

from .base import (
    IndexedNode,
    ScoredNode,
    SearchBackend,
    SearchBackendError,
    SearchBackendUnavailable,
)

logger = logging.getLogger("knowledgefs.retrieval")

#: The text scope's ``index_version``: the keyword projection is one per space, whatever the
#: dense index versions (the database backends keep one keyword row per node too).
TEXT_INDEX_VERSION = "keywords-v1"
#: The contract's limit on a search's ``limit`` (inventory 7.2); the planner asks for ≤ 100.
MAX_LIMIT = 256
RETRY_AFTER_SECONDS = 5

_T = TypeVar("_T")


def vector_space_id(space_id: uuid.UUID, index_version: int) -> str:
    """The ``vector_space_id`` of a space's index version: ``knowledgefs-<space hex>-v<n>``.

    One index version holds one model and one dimension, so Dify's collection (per scope) never
    mixes models; a new version (an embedding model change) gets its own collection.
    """
    return f"knowledgefs-{uuid.UUID(str(space_id)).hex}-v{int(index_version)}"


def _failure(error: DifyError, operation: str) -> SearchBackendError:
    """The service error for a failed bridge call (see the module docstring)."""
    details = {"dify_code": error.code, "route": error.route, "operation": operation}
    if error.code == "VECTOR_SPACE_QUOTA_EXCEEDED":
        return SearchBackendError(
            f"Dify refused to index more vectors: the tenant's vector-space quota is exhausted "
            f"({operation})",
            code="vector_space_quota_exceeded",
            status=413,
            retryable=False,
            details=details,
        )
    if error.retryable:
        return SearchBackendError(
            f"Dify's vector store is unavailable ({operation}): {error.message}",
            code="dify_vector_store_unavailable",
            status=503,
            retryable=True,
            details=details,
            retry_after=RETRY_AFTER_SECONDS,
        )
    return SearchBackendError(
        f"Dify's vector store failed ({operation}): {error.message}",
        code="dify_vector_store_failed",
        status=503,
        retryable=False,
        details=details,
    )


def _call(operation: str, fn: Callable[[], _T]) -> _T:
    try:
        return fn()
    except DifyError as exc:
        raise _failure(exc, operation) from None


class DifyBridgeBackend(SearchBackend):
    """A :class:`SearchBackend` whose projections live in Dify (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._tenants: dict[uuid.UUID, str] = {}
        self._tenant_lock = threading.Lock()

    # --- clients ------------------------------------------------------------------------------
    def _transport(self) -> DifyTransport:
        try:
            return DifyTransport()
        except DifyNotConfigured as exc:
            raise SearchBackendUnavailable(
                f"KNOWLEDGE_SEARCH_BACKEND=dify but {exc}", details={"backend": "dify"}
            ) from None

    def vectors(self, timeout_ms: int | None = None) -> DifyVectorStore:
        """A vector client on the configured inner API (per call: settings may change);
        ``timeout_ms`` defaults to ``DIFY_VECTOR_STORE_REQUEST_TIMEOUT_MS``."""
        return DifyVectorStore(
            transport=self._transport(),
            timeout_ms=timeout_ms or settings.DIFY_VECTOR_STORE_REQUEST_TIMEOUT_MS,
            concurrency=settings.KNOWLEDGE_SEARCH_BRIDGE_CONCURRENCY,
        )

    def texts(self, timeout_ms: int | None = None) -> DifyTextStore:
        """A text client on the configured inner API."""
        return DifyTextStore(
            transport=self._transport(),
            timeout_ms=timeout_ms or settings.DIFY_VECTOR_STORE_REQUEST_TIMEOUT_MS,
            concurrency=settings.KNOWLEDGE_SEARCH_BRIDGE_CONCURRENCY,
        )

    def _tenant_of(self, space_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str]:
        """Space → tenant id (a space never changes tenant, so this process remembers it)."""
        wanted = {uuid.UUID(str(s)) for s in space_ids}
        with self._tenant_lock:
            missing = [s for s in wanted if s not in self._tenants]
        if missing:
            rows = KnowledgeSpace.objects.filter(id__in=missing).values_list("id", "tenant_id")
            with self._tenant_lock:
                self._tenants.update(dict(rows))
        with self._tenant_lock:
            return {s: self._tenants[s] for s in wanted if s in self._tenants}

    def text_scope(self, space_id: uuid.UUID) -> TextScope:
        """The text scope of a space."""
        tenant = self._tenant_of([space_id]).get(uuid.UUID(str(space_id)), "")
        return TextScope(tenant, str(space_id), TEXT_INDEX_VERSION)

    def vector_scope(self, space_id: uuid.UUID, index_version: int, dimension: int) -> VectorScope:
        """The vector scope of a space's index version."""
        tenant = self._tenant_of([space_id]).get(uuid.UUID(str(space_id)), "")
        return VectorScope(
            tenant, str(space_id), vector_space_id(space_id, index_version), "dense", dimension
        )

    @staticmethod
    def _generations(node_ids: list[uuid.UUID]) -> dict[uuid.UUID, uuid.UUID]:
        return dict(KnowledgeNode.objects.filter(id__in=node_ids).values_list("id", "generation"))

    # --- writes -------------------------------------------------------------------------------
    def _index_keywords(self, nodes: list[IndexedNode]) -> None:
        generations = self._generations([n.id for n in nodes])
        by_space: dict[uuid.UUID, list[TextPoint]] = defaultdict(list)
        for n in nodes:
            text = keyword_text(n.text)
            if text.strip():  # a blank node has no keyword to find
                generation = generations.get(n.id, n.id)
                by_space[n.space_id].append(TextPoint(str(n.id), str(generation), text))
        client = self.texts()
        for space_id, points in by_space.items():
            scope = self.text_scope(space_id)
            _call("texts upsert", partial(client.upsert, scope, points))

    def index_dense(
        self,
        nodes: list[IndexedNode],
        vectors: np.ndarray,
        *,
        index_version: int,
        model_id: str,
        ignore_conflicts: bool = False,
    ) -> None:
        """Upsert one index version's vectors to Dify (64 per request), then write the ledger
        rows (empty ``vector``). All-zero vectors are not sent (no cosine; the route refuses
        them) but get their ledger row, so a rebuild or cutover does not embed them again."""
        if not nodes:
            return
        if vectors.ndim != 2 or vectors.shape[0] != len(nodes):
            raise ValueError(f"{len(nodes)} nodes but vectors of shape {vectors.shape}")
        vectors = np.ascontiguousarray(vectors, dtype="<f4")
        dimension = int(vectors.shape[1])
        generations = self._generations([n.id for n in nodes])
        by_space: dict[uuid.UUID, list[VectorPoint]] = defaultdict(list)
        for i, n in enumerate(nodes):
            if not vectors[i].any():
                logger.warning("node %s: an all-zero vector is not sent to Dify", n.id)
                continue
            by_space[n.space_id].append(
                VectorPoint(
                    str(n.id),
                    str(generations.get(n.id, n.id)),
                    hashlib.sha256(n.text.encode()).hexdigest(),
                    vectors[i].tolist(),
                )
            )
        client = self.vectors()
        for space_id, points in by_space.items():
            scope = self.vector_scope(space_id, index_version, dimension)
            _call("vectors upsert", partial(client.upsert, scope, points))
        DenseVector.objects.bulk_create(
            [
                DenseVector(
                    node_id=n.id,
                    space_id=n.space_id,
                    index_version=index_version,
                    model_id=model_id,
                    dimension=dimension,
                    vector=b"",
                )
                for n in nodes
            ],
            batch_size=500,
            ignore_conflicts=ignore_conflicts,
        )

    def delete_nodes(self, node_ids: list[uuid.UUID]) -> None:
        """Delete the nodes' points from every vector scope their ledger rows name and from the
        text scope (each delete verified invisible by Dify), then the ledger rows. A failure
        raises before any row is deleted, so the caller's transaction keeps everything."""
        if not node_ids:
            return
        scopes: dict[tuple, list[uuid.UUID]] = defaultdict(list)
        for space_id, number, dimension, node_id in DenseVector.objects.filter(
            node_id__in=node_ids
        ).values_list("space_id", "index_version", "dimension", "node_id"):
            scopes[(space_id, number, dimension)].append(node_id)
        vectors = self.vectors()
        for (space_id, number, dimension), ids in scopes.items():
            scope = self.vector_scope(space_id, number, dimension)
            _call("vectors delete", partial(vectors.delete, scope, ids))
        self._delete_keywords(node_ids)
        DenseVector.objects.filter(node_id__in=node_ids).delete()

    def _delete_keywords(self, node_ids: list[uuid.UUID]) -> None:
        by_space: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
        for node_id, space_id in KnowledgeNode.objects.filter(id__in=node_ids).values_list(
            "id", "space_id"
        ):
            by_space[space_id].append(node_id)
        client = self.texts()
        for space_id, ids in by_space.items():
            scope = self.text_scope(space_id)
            _call("texts delete", partial(client.delete, scope, ids))

    def delete_version_vectors(
        self, space_id: uuid.UUID, index_version: int, rows: list[tuple[uuid.UUID, int]]
    ) -> None:
        """Delete a retired version's points (``rows``: ``(node id, dimension)``) from Dify
        before :func:`retrieval.index_versions.purge_retired_vectors` deletes their ledger rows."""
        by_dimension: dict[int, list[uuid.UUID]] = defaultdict(list)
        for node_id, dimension in rows:
            by_dimension[dimension].append(node_id)
        client = self.vectors()
        for dimension, ids in by_dimension.items():
            scope = self.vector_scope(space_id, index_version, dimension)
            _call("vectors delete", partial(client.delete, scope, ids))

    def _keyword_row_count(self, space_id: uuid.UUID) -> int:
        """Text points stored for the space's nodes: a ``get`` per 64 nodes (diagnostics)."""
        ids = list(KnowledgeNode.objects.filter(space_id=space_id).values_list("id", flat=True))
        if not ids:
            return 0
        client = self.texts()
        scope = self.text_scope(space_id)
        return len(_call("texts get", lambda: client.get(scope, ids)))

    # --- reads --------------------------------------------------------------------------------
    @staticmethod
    def authorized_node_ids(space_id: uuid.UUID, documents: frozenset | None = None) -> list[str]:
        """The space's visible nodes (active generation, enabled document, and one of
        ``documents`` unless ``None``), as canonical UUID strings in id order: what a keyword
        search may return."""
        return _authorized(space_id, documents)

    @staticmethod
    def authorized_vector_ids(
        space_id: uuid.UUID, index_version: int, dimension: int, documents: frozenset | None
    ) -> list[str]:
        """The visible nodes with a ledger row of ``dimension`` in the index version, as
        canonical UUID strings in id order: what a dense search may return."""
        return _authorized(space_id, documents, (index_version, dimension))

    def keyword_search(
        self,
        space_id: uuid.UUID,
        query: str,
        limit: int,
        *,
        documents: frozenset | None = None,
        language: str | None = None,
        head_revision: int | None = None,
    ) -> list[ScoredNode]:
        """The text store's top ``limit`` among the authorized ids; the query is its keyword
        terms (:func:`keyword_terms`, CJK as bigrams) joined by spaces (``head_revision`` is
        unused: nothing is cached here)."""
        terms = keyword_terms(query, language)
        if not terms or (documents is not None and not documents):
            return []
        ids = self.authorized_node_ids(space_id, documents)
        if not ids:
            return []
        client = self.texts()
        scope = self.text_scope(space_id)
        text = " ".join(terms)[:8192]
        found = _call(
            "texts search", lambda: client.search(scope, text, ids, min(limit, MAX_LIMIT))
        )
        return [ScoredNode(uuid.UUID(m.id), m.score) for m in found]

    def dense_search(
        self,
        space_id: uuid.UUID,
        query_vector: np.ndarray,
        *,
        index_version: int,
        head_revision: int,
        limit: int,
        dimension: int | None = None,
        documents: frozenset | None = None,
        model_id: str | None = None,
    ) -> list[ScoredNode]:
        """Cosine top-``limit`` from Dify among the authorized ids of the index version
        (``head_revision`` is unused: nothing is cached here)."""
        dimension = dimension or int(query_vector.shape[0])
        if query_vector.shape[0] != dimension:
            raise ValueError(
                f"query vector has {query_vector.shape[0]} dimensions, index has {dimension}"
            )
        if (documents is not None and not documents) or not np.any(query_vector):
            return []
        ids = self.authorized_vector_ids(space_id, index_version, dimension, documents)
        if not ids:
            return []
        client = self.vectors()
        scope = self.vector_scope(space_id, index_version, dimension)
        vector = np.asarray(query_vector, dtype=np.float32).tolist()
        found = _call(
            "vectors search", lambda: client.search(scope, vector, ids, min(limit, MAX_LIMIT))
        )
        return [ScoredNode(uuid.UUID(m.id), m.score) for m in found]

    # --- readiness ----------------------------------------------------------------------------
    def probe(self, timeout_ms: int) -> tuple[bool, str]:
        """``(ok, detail)``: one ``get`` of a probe id on each route, each within
        ``timeout_ms`` (no collection is created; Dify answers an empty list for a scope that
        holds nothing)."""
        probe_space = uuid.UUID(int=0)
        probe_id = str(uuid.UUID(int=1))
        try:
            vectors, texts = self.vectors(timeout_ms), self.texts(timeout_ms)
            vectors.get(VectorScope("probe", str(probe_space), "probe", "dense", 1), [probe_id])
            texts.get(TextScope("probe", str(probe_space), TEXT_INDEX_VERSION), [probe_id])
        except DifyError as exc:
            return False, f"Dify vector/text bridge: {exc.code} ({exc.message})"
        except SearchBackendError as exc:
            return False, exc.message
        return True, "dify: vector and text bridge answered"


def _authorized(space_id: uuid.UUID, documents: frozenset | None, vectors=None) -> list[str]:
    """Visible node ids of the space as canonical (hyphenated, lower-case) UUID strings, made by
    the database in one statement (no UUID object per id: at 100k ids that was 1.3 s of CPU a
    query); ``vectors`` ``(index_version, dimension)`` keeps those with such a ledger row."""
    from ingestion.models import Document

    q = connection.ops.quote_name
    sqlite = connection.vendor == "sqlite"
    if sqlite:  # 32 hex characters stored: hyphens put in by the database
        ident = (
            "substr(n.id, 1, 8) || '-' || substr(n.id, 9, 4) || '-' || substr(n.id, 13, 4) "
            "|| '-' || substr(n.id, 17, 4) || '-' || substr(n.id, 21, 12)"
        )
    else:
        ident = "CAST(n.id AS text)"
    sql = (
        f"SELECT {ident} FROM {q(KnowledgeNode._meta.db_table)} n "
        f"JOIN {q(Document._meta.db_table)} d ON d.id = n.document_id "
        "WHERE n.space_id = %s AND n.generation = d.active_generation AND d.enabled"
    )
    params: list = [space_id.hex if sqlite else space_id]
    if documents is not None:
        if sqlite:
            sql += " AND n.document_id IN (SELECT value FROM json_each(%s))"
            params.append("[" + ",".join(f'"{d.hex}"' for d in documents) + "]")
        else:
            sql += " AND n.document_id = ANY(%s)"
            params.append(list(documents))
    if vectors is not None:
        sql += (
            f" AND EXISTS (SELECT 1 FROM {q(DenseVector._meta.db_table)} dv WHERE "
            "dv.node_id = n.id AND dv.index_version = %s AND dv.dimension = %s)"
        )
        params += list(vectors)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        ids = [row[0] for row in cursor.fetchall()]
    # Id order (canonical strings sort as the ids do); sorted here, for an ORDER BY n.id makes
    # SQLite walk every node of the table by its primary key (2× the statement's time at 100k).
    ids.sort()
    return ids
