"""The primitives every retrieval mode shares: the request's validation, the result shapes, the
two legs and their fusion, the snapshot a retrieval reads, query embedding, one rerank call and
hydration into cited items.

:func:`recall` runs the dense and keyword legs of one query against one :class:`Snapshot`;
:func:`fuse` min-max normalises each leg's scores to [0, 1] over that leg's candidates (a single
candidate, or equal scores, normalise to 1) and averages them, a missing leg counting 0;
:func:`rerank` asks the profile's reranker once, its score (within 0..1) becoming the final
score; :func:`hydrate` turns ``(node_id, score, per_leg)`` triples into
:class:`RetrievalItem` values with citations. Fast and Deep (:mod:`retrieval.fast_deep`) and
Research (:mod:`retrieval.research`) build on these; :mod:`retrieval.modes` dispatches.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
from django.conf import settings

from ingestion.models import KnowledgeNode
from knowledgefs.dify.errors import DifyError
from knowledgefs.errors import InvalidInput, Unavailable
from knowledgefs.runtime import UnknownEmbeddingModel, get_embedding_model
from spaces.models import KnowledgeSpace, PublicationHead, RetrievalMode

from .backends import ScoredNode, get_search_backend
from .backends.base import uuid_of_hex
from .models import IndexState, IndexVersion
from .planner import LEG_FLOOR
from .text import is_blank

MODES = RetrievalMode.all()  # ("fast", "deep", "research", "auto")
CONCRETE_MODES = RetrievalMode.concrete()  # ("fast", "deep", "research")
LEGS = ("dense", "keyword")
# Each leg fetches at least this many candidates (capped at 100): min-max normalisation over a
# handful of hits is unstable, and an exact keyword match missing from a short dense list would
# otherwise tie with an unrelated dense hit (docs/benchmarks.md). The planner's ``leg_floor``.
MIN_LEG_CANDIDATES = LEG_FLOOR


@dataclass
class RetrievalItem:
    """One hit. ``scores`` holds ``final`` and the per-stage scores: ``dense``/``keyword``
    (min-max normalised per leg), ``dense_raw`` (the dense leg's raw cosine, when it found the
    node; not part of the fused score), ``rerank``, Research's ``rrf``."""

    node_id: uuid.UUID
    score: float
    text: str
    citation: dict
    scores: dict
    # Deep's expansions: {"relation": "neighbour"|"section", "source_node_id", "source_score"}.
    context: dict | None = None


@dataclass
class RetrievalResult:
    mode: str
    items: list[RetrievalItem]
    metrics: dict = field(default_factory=dict)
    # The planner's figures (dense/fts top_k, fusion/rerank limits, query language).
    plan: dict = field(default_factory=dict)
    # Per stage: {name, status executed|skipped, candidate_count, filtered_count, duration_ms}.
    stages: list[dict] = field(default_factory=list)
    # Auto mode's routing record: {requested_mode, resolved_mode, resolver, degraded, error}.
    route: dict | None = None
    # The query images of this run (retrieval.query_images.ImagePlan, bytes included): read by a
    # vision answer, never serialised.
    image_plan: object = field(default=None, repr=False)

    def as_dict(self) -> dict:
        return {
            "mode": self.mode,
            "items": [
                {
                    "node_id": str(i.node_id),
                    "score": round(i.score, 6),
                    "scores": {k: round(v, 6) for k, v in i.scores.items()},
                    "text": i.text,
                    "citation": i.citation,
                    **({"context": i.context} if i.context is not None else {}),
                }
                for i in self.items
            ],
            "metrics": self.metrics,
            "plan": self.plan,
            "stages": self.stages,
            **({"route": self.route} if self.route is not None else {}),
        }


def validate_top_k(top_k) -> int:
    """Return ``top_k`` if it is an int from 1 to ``RETRIEVAL_MAX_TOP_K`` (100, reference
    inventory §5.2), else raise 400 ``invalid_top_k`` naming the range."""
    if (
        isinstance(top_k, bool)
        or not isinstance(top_k, int)
        or not (1 <= top_k <= settings.RETRIEVAL_MAX_TOP_K)
    ):
        raise InvalidInput(
            f"top_k must be an integer from 1 to {settings.RETRIEVAL_MAX_TOP_K}",
            code="invalid_top_k",
        )
    return top_k


BLANK_QUERY = "query must be a string with visible text (it is empty or only whitespace)"


def validate_request(query, top_k, score_threshold, mode) -> tuple[str, int, float | None, str]:
    """Check a retrieval request; raises :class:`InvalidInput` naming the field and the limit."""
    if not isinstance(query, str) or is_blank(query):
        raise InvalidInput(BLANK_QUERY, code="invalid_query", details={"field": "query"})
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            "query contains an unpaired surrogate (invalid Unicode)", code="invalid_query"
        ) from None
    if len(query) > settings.RETRIEVAL_MAX_QUERY_CHARS:
        raise InvalidInput(
            f"query is {len(query)} characters; the limit is {settings.RETRIEVAL_MAX_QUERY_CHARS}",
            code="invalid_query",
        )
    validate_top_k(top_k)
    if score_threshold is not None:
        if (
            isinstance(score_threshold, bool)
            or not isinstance(score_threshold, int | float)
            or not (0 <= score_threshold <= 1)
        ):
            raise InvalidInput(
                "score_threshold must be null (off) or a number from 0 to 1",
                code="invalid_score_threshold",
            )
        score_threshold = float(score_threshold)
    if mode not in MODES:
        raise InvalidInput(f"mode must be one of: {', '.join(MODES)}", code="invalid_mode")
    return query, top_k, score_threshold, mode


def min_max(hits: list[ScoredNode]) -> dict[uuid.UUID, float]:
    """Normalise a leg's scores to [0, 1]; equal scores (or one hit) all become 1."""
    if not hits:
        return {}
    scores = np.array([h.score for h in hits], dtype=np.float64)
    low, high = scores.min(), scores.max()
    if high - low <= 1e-12:
        return {h.node_id: 1.0 for h in hits}
    return {h.node_id: float((h.score - low) / (high - low)) for h in hits}


def fuse(legs: dict[str, list[ScoredNode]]) -> list[tuple[uuid.UUID, float, dict]]:
    """Equal-weight fusion of min-max normalised legs; returns ``(node_id, score, per_leg)``."""
    normalised = {name: min_max(hits) for name, hits in legs.items()}
    weight = 1.0 / max(len(legs), 1)
    fused: dict[uuid.UUID, dict] = {}
    for name, scores in normalised.items():
        for node_id, value in scores.items():
            fused.setdefault(node_id, {})[name] = value
    ranked = [
        (node_id, sum(per_leg.values()) * weight, per_leg) for node_id, per_leg in fused.items()
    ]
    # Ties by node id: a UUID's integer orders as its text does (fixed-width hex).
    ranked.sort(key=lambda r: (-r[1], r[0].int))
    return _with_dense_raw(ranked, legs)


def _with_dense_raw(ranked: list, legs: dict[str, list[ScoredNode]]) -> list:
    """Add ``dense_raw`` (the dense leg's raw cosine, -1..1, for the vectors are unit length)
    to the ``per_leg`` of the nodes the dense leg found, after the fused scores are summed, so
    the ranking is unchanged. The answerability rule reads it: min-max scores are relative to
    the query's candidates, the cosine is not (docs/retrieval.md, "Answerability")."""
    raw = {hit.node_id: hit.score for hit in legs.get("dense") or []}
    for node_id, _, per_leg in ranked:
        if node_id in raw:
            per_leg["dense_raw"] = raw[node_id]
    return ranked


RRF_K = 60


def reciprocal_rank_fusion(
    legs: dict[str, list[ScoredNode]], k: int = RRF_K
) -> list[tuple[uuid.UUID, float, dict]]:
    """Reciprocal rank fusion (Cormack, Clarke & Büttcher, SIGIR 2009): ``Σ 1 / (k + rank)``.

    Kept for comparison (``kfs eval --fusion rrf``). Each leg's ``1 / (k + rank)`` is divided by
    its best value ``1 / (k + 1)`` and the legs are averaged, so scores stay in [0, 1] and the
    order is exactly RRF's.
    """
    best = 1.0 / (k + 1)
    fused: dict[uuid.UUID, dict] = {}
    for name, hits in legs.items():
        for rank, hit in enumerate(hits, 1):
            fused.setdefault(hit.node_id, {})[name] = (1.0 / (k + rank)) / best
    count = max(len(legs), 1)
    ranked = [
        (node_id, sum(per_leg.values()) / count, per_leg) for node_id, per_leg in fused.items()
    ]
    ranked.sort(key=lambda r: (-r[1], r[0].int))
    return _with_dense_raw(ranked, legs)


FUSIONS = {"minmax": fuse, "rrf": reciprocal_rank_fusion}


def stage(name: str, executed: bool, candidates: int = 0, filtered: int = 0, ms: float = 0.0):
    """One ``stages`` entry: ``{name, status executed|skipped, candidate_count, filtered_count,
    duration_ms}``."""
    return {
        "name": name,
        "status": "executed" if executed else "skipped",
        "candidate_count": candidates,
        "filtered_count": filtered,
        "duration_ms": round(ms, 2),
    }


@dataclass(frozen=True)
class Snapshot:
    """What one retrieval reads, resolved once: the publication head revision and the active
    index version ``(number, model_id, dimension)`` (``None``: the space has no dense index)."""

    head_revision: int
    version: tuple[int, str, int] | None


def resolve_snapshot(space: KnowledgeSpace) -> Snapshot:
    """One read resolves the snapshot; a cutover changes both parts in one commit."""
    head_revision, version = _snapshot(space.id)
    return Snapshot(head_revision, version)


def embed_queries(space: KnowledgeSpace, snapshot: Snapshot, texts: list[str]) -> np.ndarray:
    """Embed ``texts`` (one batch) with the model of the snapshot's index version.

    Several texts go to the model in one call when it has the optional ``embed_queries(texts)``
    (the local ONNX model, Dify models: one request of up to 16 texts); else one by one.

    Returns a ``(len(texts), dimension)`` float32 array of unit vectors. Raises 503
    ``embedding_model_unavailable`` when the model is not served, makes vectors of another
    dimension, or Dify refuses the call. ``snapshot.version`` must not be ``None``.
    """
    assert snapshot.version is not None  # every caller checks it (the docstring's contract)
    number, model_id, dimension = snapshot.version
    try:
        model = get_embedding_model(model_id, space=space)
    except UnknownEmbeddingModel as exc:
        raise Unavailable(
            f"this space is indexed with {model_id!r}, which this server does not serve ({exc})",
            code="embedding_model_unavailable",
        ) from None
    if model.dimension != dimension:
        raise Unavailable(
            f"this space's index holds {dimension}-d vectors but {model_id!r} now makes "
            f"{model.dimension}-d ones",
            code="embedding_model_unavailable",
        )
    try:
        if len(texts) == 1:
            return np.asarray(model.embed_query(texts[0]), dtype=np.float32).reshape(1, -1)
        batch = getattr(model, "embed_queries", None)  # optional: one model call for all
        if batch is not None:
            return np.asarray(batch(list(texts)), dtype=np.float32)
        return np.asarray(np.stack([model.embed_query(t) for t in texts]), dtype=np.float32)
    except DifyError as exc:
        raise Unavailable(
            f"the query could not be embedded ({exc.code}): {exc.message}",
            code="embedding_model_unavailable",
        ) from None


def recall(
    space: KnowledgeSpace,
    snapshot: Snapshot,
    query: str,
    *,
    depth: int,
    legs: tuple[str, ...] = LEGS,
    filters=None,
    vector: np.ndarray | None = None,
    language: str | None = None,
) -> tuple[dict[str, list[ScoredNode]], dict[str, float]]:
    """Run the enabled legs for one query; returns ``({leg: hits}, {"<leg>_ms": ms})``.

    ``depth`` candidates per leg (best first); ``vector`` is the query's embedding when the
    caller already has it (a batched embedding), else the query is embedded here. ``filters``
    (``None`` = none; a raw filter object, :class:`retrieval.filters.Filters`, or an
    :class:`~retrieval.filters.Allowed` already resolved, which saves its query when one
    request recalls several queries) restrict both legs to the allowed documents before their
    limit; a filter that allows no document returns ``({}, {})`` without embedding or
    searching. ``language`` is the planner's query language (detected here when ``None``).
    Only visible nodes of enabled documents are returned. Raises the filter errors of
    :mod:`retrieval.filters` (400) for a raw filter that is not valid.
    """
    from . import filters as filtering
    from .planner import detect_language

    backend = get_search_backend()
    results: dict[str, list[ScoredNode]] = {}
    timings: dict[str, float] = {}
    allowed = filtering.resolve(space, filters)
    documents = None if allowed is None else allowed.document_ids
    if documents is not None and not documents:
        return results, timings
    if "dense" in legs and snapshot.version is not None:
        number, model_id, dimension = snapshot.version
        if vector is None:
            t0 = time.perf_counter()
            vector = embed_queries(space, snapshot, [query])[0]
            timings["embed_ms"] = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        results["dense"] = backend.dense_search(
            space.id,
            vector,
            index_version=number,
            head_revision=snapshot.head_revision,
            limit=depth,
            dimension=dimension,
            documents=documents,
            model_id=model_id,
        )
        timings["dense_ms"] = (time.perf_counter() - t0) * 1000
        if getattr(results["dense"], "exact_fallback", ""):
            # Reported in the result's metrics as dense_exact_fallback: 1 (the figures are logged).
            timings["dense_exact_fallback"] = 1
    if "keyword" in legs:
        t0 = time.perf_counter()
        results["keyword"] = backend.keyword_search(
            space.id,
            query,
            depth,
            documents=documents,
            language=language or detect_language(query),
            head_revision=snapshot.head_revision,
        )
        timings["keyword_ms"] = (time.perf_counter() - t0) * 1000
    return results, timings


def _snapshot(space_id: uuid.UUID) -> tuple[int, tuple[int, str, int] | None]:
    """``(head revision, (version number, model_id, dimension) | None)`` in one plain SQL
    statement (the ORM's query building was most of its time)."""
    from django.db import connection

    q = connection.ops.quote_name
    sql = (
        "SELECT h.revision, v.number, v.model_id, v.dimension FROM (SELECT %s AS space_id) s "
        f"LEFT JOIN {q(PublicationHead._meta.db_table)} h ON h.space_id = s.space_id "
        f"LEFT JOIN {q(IndexVersion._meta.db_table)} v "
        "ON v.space_id = s.space_id AND v.state = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [db_uuid(space_id), IndexState.ACTIVE.value])
        revision, number, model_id, dimension = cursor.fetchone()
    version = (number, model_id, dimension) if number is not None else None
    return revision or 0, version


def rerank_selection(profile):
    """The profile's reranker as a :class:`spaces.profiles.Selection`, ``None`` when disabled."""
    from spaces.profiles import Selection

    if not profile.retrieval_rerank_enabled:
        return None
    return Selection.of(profile.retrieval_rerank_model)


def rerank(space, selection, query: str, pool, nodes) -> list[tuple[uuid.UUID, float, dict]]:
    """One rerank call over ``pool`` (fused ``(node_id, score, per_leg)``); returns them ranked
    by the reranker's score, which becomes the final score (``per_leg`` gains ``rerank``).
    Candidates the reranker does not return are dropped. 503 ``rerank_unavailable`` when the
    call fails or a score is outside 0..1."""
    from knowledgefs.runtime import model_runtime

    if not pool:
        return []
    try:
        hits = model_runtime().rerank(
            tenant_id=space.tenant_id,
            provider=selection.canonical_provider,
            model=selection.model,
            query=query,
            docs=[nodes[node_id].text for node_id, _, _ in pool],
        )
    except DifyError as exc:
        raise Unavailable(
            f"reranking with {selection} failed ({exc.code}): {exc.message}",
            code="rerank_unavailable",
        ) from None
    bad = next((h.score for h in hits if not 0 <= h.score <= 1), None)
    if bad is not None:
        raise Unavailable(
            f"reranking with {selection} answered the score {bad}, outside 0..1",
            code="rerank_unavailable",
        )
    ranked = []
    for hit in hits:
        node_id, _, per_leg = pool[hit.index]
        ranked.append((node_id, hit.score, {**per_leg, "rerank": hit.score}))
    ranked.sort(key=lambda r: (-r[1], r[0]))  # ties by id: UUIDs order as their text does
    return ranked


@dataclass(slots=True)
class NodeRecord:
    """What retrieval reads of a node and its document: the text, the citation fields and the
    place (Deep's expansion). ``id`` and ``document_id`` are UUIDs; ``generation`` is kept as
    the database gives it (compared and sent back in queries only)."""

    id: uuid.UUID
    document_id: uuid.UUID
    generation: uuid.UUID | str
    chunk_index: int
    text: str
    page_number: int | None
    section_path: list
    start_offset: int
    end_offset: int
    filename: str
    enabled: bool
    revision: int | None = None
    # An image-description node's asset (ingestion.enrichment): {asset_index, page_number, kind,
    # mime_type}; None for every other node.
    image: dict | None = None
    space_id: object = None


def select_nodes(where: str, params: list) -> list[NodeRecord]:
    """Nodes matching ``where`` (SQL over ``n`` the nodes and ``d`` their documents), with their
    citation fields, in one statement; no model instances (the rows of a query are few, but
    Django's per-row conversion and query compilation were a visible share of it at 10k)."""
    from django.db import connection

    from ingestion.models import Document, DocumentRevision

    nodes = connection.ops.quote_name(KnowledgeNode._meta.db_table)
    documents = connection.ops.quote_name(Document._meta.db_table)
    revisions = connection.ops.quote_name(DocumentRevision._meta.db_table)
    sql = (
        "SELECT n.id, n.document_id, n.generation, n.chunk_index, n.text, n.page_number, "
        "n.section_path, n.start_offset, n.end_offset, d.filename, d.enabled, "
        # the revision a node was built from (ingestion.revisions): its job is the generation
        f"(SELECT r.number FROM {revisions} r WHERE r.job_id = n.generation), "
        # an image description is cited to its image (its metadata names the asset)
        "CASE WHEN n.kind = 'image' THEN n.metadata END, n.space_id "
        f"FROM {nodes} n JOIN {documents} d ON d.id = n.document_id WHERE {where}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [
        NodeRecord(
            as_uuid(r[0]),
            as_uuid(r[1]),
            r[2],
            r[3],
            r[4],
            r[5],
            json.loads(r[6]) if isinstance(r[6], str) else list(r[6] or []),
            r[7],
            r[8],
            r[9],
            bool(r[10]),
            r[11],
            _image_of(r[12]),
            r[13],
        )  # fmt: skip
        for r in rows
    ]


def _image_of(metadata) -> dict | None:
    if metadata is None:
        return None
    if isinstance(metadata, str | bytes):
        metadata = json.loads(metadata)
    image = metadata.get("image") if isinstance(metadata, dict) else None
    return image if isinstance(image, dict) else None


def db_uuid(value: uuid.UUID | str) -> uuid.UUID | str:
    """A UUID as the database stores it (SQLite: 32 hex characters); a value read back from the
    database is returned unchanged."""
    from django.db import connection

    if isinstance(value, str) or connection.vendor != "sqlite":
        return value
    return value.hex


def as_uuid(value) -> uuid.UUID:
    """A node id as read from the database (SQLite: 32 hex characters) as a UUID."""
    return value if isinstance(value, uuid.UUID) else uuid_of_hex(value)


def load_nodes(ids: list[uuid.UUID]) -> dict[uuid.UUID, NodeRecord]:
    """``{id: node}`` with each node's citation fields (one statement); missing ids are
    absent."""
    if not ids:
        return {}
    where, param = ids_condition("n.id", ids)
    return {n.id: n for n in select_nodes(where, [param])}


def ids_condition(column: str, ids: list[uuid.UUID]) -> tuple[str, str | list]:
    """``(where, param)``: ``column`` is one of ``ids`` (SQLite: a JSON array; else ``ANY``)."""
    from django.db import connection

    if connection.vendor == "sqlite":  # db_uuid's conversion, the vendor checked once
        return f"{column} IN (SELECT value FROM json_each(%s))", json.dumps(
            [i if isinstance(i, str) else i.hex for i in ids]
        )
    return f"{column} = ANY(%s)", list(ids)


def hydrate(
    ranked: list[tuple[uuid.UUID, float, dict]], nodes: dict | None = None
) -> list[RetrievalItem]:
    """Cited :class:`RetrievalItem` values for ``ranked`` (``(node_id, score, per_leg)``), in
    order; nodes removed or whose document was disabled since the legs ran are dropped."""
    if not ranked:
        return []
    if nodes is None:
        nodes = load_nodes([r[0] for r in ranked])
    items = []
    for node_id, score, per_leg in ranked:
        node = nodes.get(node_id)
        if node is None or not node.enabled:  # removed or disabled since the legs
            continue
        items.append(
            RetrievalItem(
                node_id=node_id,
                score=score,
                text=node.text,
                scores={"final": score, **per_leg},
                citation={
                    "document_id": str(node.document_id),
                    "filename": node.filename,
                    "revision": node.revision,
                    "page_number": node.page_number,
                    "section_path": list(node.section_path),
                    "start_offset": node.start_offset,
                    "end_offset": node.end_offset,
                },
            )
        )
        if node.image is not None:
            items[-1].citation["image"] = image_citation(node)
    return items


def image_citation(node: NodeRecord) -> dict:
    """The ``citation.image`` of an image-description node: the asset it describes (the same
    shape as a visual hit's, with ``source: "description"``)."""
    assert node.image is not None  # called for image-description nodes only
    index = node.image.get("asset_index")
    space_id = as_uuid(node.space_id)
    return {
        "document_id": str(node.document_id),
        "asset_index": index,
        "page_number": node.image.get("page_number"),
        "kind": node.image.get("kind") or "",
        "asset_url": f"/v1/knowledge-spaces/{space_id}/documents/{node.document_id}/assets/{index}",
        "source": "description",
    }
