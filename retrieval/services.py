"""Fast and Deep retrieval: dense and keyword legs, per-leg min-max normalisation, equal-weight
fusion, Deep's context expansion, one rerank; plus the seams every mode uses.

The planner (:mod:`retrieval.planner`) sets the figures: each leg retrieves ``dense_top_k =
fts_top_k = min(max(top_k × recall, 50), 100)`` candidates and ``fusion_limit = rerank_limit =
min(top_k × fusion, 100)`` fused candidates go on (Fast 1/1, Deep 5/3). Filters
(:mod:`retrieval.filters`) restrict both legs to the allowed documents before their limit.
Scores of each leg are min-max normalised to [0, 1] over that leg's candidates (a single
candidate, or equal scores, normalise to 1); the fused score of a node is the mean of its two
normalised scores, a missing leg counting 0 (with one leg enabled it carries full weight).

Deep adds context expansion to the first ``fusion_limit`` fused hits (:func:`_expand`): their
neighbouring chunks and the nearest chunks of their section. With the profile's reranker the
hits and their expansions go to it together in one call and its score (which must be within
0..1) becomes the final score; without one an expansion scores its source hit's score × 0.5
(:data:`DEEP_EXPANSION_FACTOR`), so it ranks strictly below the hit it came from and the base
hits keep Fast's order. Fast reranks the first ``fusion_limit`` fused candidates the same way.

The threshold, when not ``None``, keeps items whose final score (the reranked one when rerank
is on) is ``>= threshold`` (``0`` is a real threshold); then the list is cut to ``top_k``.
Without a reranker scores are relative to the query's candidates, so a threshold ranks within
a result set; it does not measure absolute relevance. The space's retrieval profile
(``spaces.profiles``) supplies ``top_k``, ``score_threshold`` and ``mode`` when a request
leaves them out. A space whose profile is not ``ready`` is refused.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import numpy as np
from django.conf import settings
from django.db.models import F, OuterRef, Q, Subquery

from ingestion.models import KnowledgeNode
from knowledgefs.dify.errors import DifyError
from knowledgefs.errors import InvalidInput, Unavailable
from knowledgefs.runtime import UnknownEmbeddingModel, get_embedding_model
from spaces.models import KnowledgeSpace, PublicationHead, RetrievalMode

from .backends import ScoredNode, get_search_backend
from .models import IndexState, IndexVersion
from .planner import LEG_FLOOR

MODES = RetrievalMode.all()  # ("fast", "deep", "research", "auto")
CONCRETE_MODES = RetrievalMode.concrete()  # ("fast", "deep", "research")
LEGS = ("dense", "keyword")
RECALL_MULTIPLIER = {"fast": 1, "deep": 5, "research": 10}
# Rerank candidates: min(top_k × FUSION_MULTIPLIER, RETRIEVAL_MAX_TOP_K).
FUSION_MULTIPLIER = {"fast": 1, "deep": 3, "research": 5}
PROFILE = object()  # a ``score_threshold`` left to the space's retrieval profile
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


def validate_request(query, top_k, score_threshold, mode) -> tuple[str, int, float | None, str]:
    """Check a retrieval request; raises :class:`InvalidInput` naming the field and the limit."""
    if not isinstance(query, str) or not query.strip():
        raise InvalidInput("query must be a non-empty string", code="invalid_query")
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
    ranked.sort(key=lambda r: (-r[1], str(r[0])))
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
    ranked.sort(key=lambda r: (-r[1], str(r[0])))
    return _with_dense_raw(ranked, legs)


FUSIONS = {"minmax": fuse, "rrf": reciprocal_rank_fusion}


def retrieve(
    space: KnowledgeSpace,
    query: str,
    *,
    top_k: int | None = None,
    score_threshold: float | None | object = PROFILE,
    mode: str | None = None,
    legs: tuple[str, ...] = LEGS,
    fusion: str = "minmax",
    filters=None,
) -> RetrievalResult:
    """Run a retrieval over the space's published nodes; items carry citations.

    ``top_k`` (``None``), ``mode`` (``None``) and ``score_threshold`` (left out) come from the
    space's retrieval profile; ``score_threshold=None`` turns the threshold off. ``filters`` is
    the request's filter object (:mod:`retrieval.filters`; ``None``: none), checked before any
    work. ``legs`` and ``fusion`` are for evaluation (``("keyword",)``, ``("dense",)`` or both;
    ``"minmax"`` or ``"rrf"``). Errors: 400 ``invalid_query``, ``invalid_top_k``,
    ``invalid_score_threshold``, ``invalid_mode``, ``invalid_filter``,
    ``too_many_filter_conditions``, ``too_many_filter_values``; 409 ``space_setup_required``,
    ``space_pending_validation``, ``space_validation_failed`` (the space's profile is not
    ``ready``), ``space_reconciliation_pending`` (the space is the target of an upgrade whose
    documents' availability is not applied yet: :mod:`upgrades.services.reconciliation`); 503
    ``embedding_model_unavailable``, ``rerank_unavailable`` (the reranker failed or answered a
    score outside 0..1; nothing falls back silently), ``search_backend_unavailable`` (checked
    first: the database engine has no search backend, i.e. MySQL/MariaDB).
    """
    from spaces.readiness import require_servable

    from . import filters as filtering

    get_search_backend()  # 503 search_backend_unavailable first (MySQL/MariaDB)
    profile = require_servable(space)
    if top_k is None:
        top_k = profile.retrieval_top_k
    if mode is None:
        mode = profile.retrieval_default_mode
    if score_threshold is PROFILE:
        score_threshold = profile.retrieval_score_threshold
    query, top_k, score_threshold, mode = validate_request(query, top_k, score_threshold, mode)
    filters = filtering.parse(filters)
    started = time.perf_counter()
    route = None
    if mode == "auto":
        from .auto import resolve_mode

        mode, route = resolve_mode(space, profile, query)
    route_ms = (time.perf_counter() - started) * 1000 if route is not None else None
    if mode == "research":
        from .research import run_research

        result = run_research(
            space, query, top_k=top_k, score_threshold=score_threshold, filters=filters
        )
        result.stages.insert(0, _stage("route", route_ms is not None, 0, 0, route_ms or 0.0))
        result.route = route
        return result
    request = _Request(query, top_k, score_threshold, mode, legs, fusion, filters)
    result = _fast_or_deep(space, profile, request, started, route_ms=route_ms)
    result.route = route
    return result


# --- Fast and Deep ------------------------------------------------------------------------------

#: Deep without a reranker: an expanded chunk scores its source hit's score times this factor,
#: so it ranks strictly below the hit it came from and never reorders the base hits.
DEEP_EXPANSION_FACTOR = 0.5
#: Deep: chunks added per base hit (neighbours first, then the nearest of its section).
DEEP_EXPANSION_PER_HIT = 3
#: Deep: same-section chunks are looked for within this many chunks either side of the hit.
DEEP_SECTION_WINDOW = 8


@dataclass(frozen=True)
class _Request:
    query: str
    top_k: int
    score_threshold: float | None
    mode: str
    legs: tuple[str, ...]
    fusion: str
    filters: object


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 2)


def _stage(name: str, executed: bool, candidates: int = 0, filtered: int = 0, ms: float = 0.0):
    """One ``stages`` entry: ``{name, status executed|skipped, candidate_count, filtered_count,
    duration_ms}``."""
    return {
        "name": name,
        "status": "executed" if executed else "skipped",
        "candidate_count": candidates,
        "filtered_count": filtered,
        "duration_ms": round(ms, 2),
    }


def _fast_or_deep(space, profile, request: _Request, started: float, route_ms: float | None):
    """Fast and Deep (module docstring); stages: route (executed when ``auto`` was resolved,
    ``route_ms`` its time), filter, embed, dense, keyword, fusion, expansion, rerank,
    threshold, each reported whether it ran or not."""
    from . import filters as filtering
    from .planner import plan as make_plan

    plan = make_plan(request.mode, request.top_k, request.query)
    stages = [_stage("route", route_ms is not None, 0, 0, route_ms or 0.0)]
    snapshot = resolve_snapshot(space)
    allowed = filtering.resolve(space, request.filters)
    stages.append(
        _stage("filter", True, allowed.considered, allowed.filtered, allowed.duration_ms)
        if allowed is not None
        else _stage("filter", False)
    )
    results, timings = recall(
        space,
        snapshot,
        request.query,
        depth=plan.dense_top_k,
        legs=request.legs,
        filters=allowed,
        language=plan.query_language,
    )
    stages.extend(_leg_stages(results, timings))
    t0 = time.perf_counter()
    candidates = FUSIONS[request.fusion](results) if results else []
    base = candidates[: plan.fusion_limit]
    stages.append(_stage("fusion", bool(results), len(candidates), len(candidates) - len(base),
                         (time.perf_counter() - t0) * 1000))  # fmt: skip
    nodes = _nodes([r[0] for r in base]) if base else {}
    t0 = time.perf_counter()
    expanded, contexts = [], {}
    if request.mode == "deep" and base:
        expanded, contexts = _expand(base, nodes, allowed, limit=2 * plan.rerank_limit)
    stages.append(_stage("expansion", request.mode == "deep" and bool(base), len(expanded), 0,
                         (time.perf_counter() - t0) * 1000))  # fmt: skip
    pool = base + expanded
    ranked, rerank_stage = _final_order(space, profile, request.query, pool, nodes, contexts)
    stages.append(rerank_stage)
    threshold = request.score_threshold
    kept = ranked if threshold is None else [r for r in ranked if r[1] >= threshold]
    stages.append(_stage("threshold", threshold is not None, len(ranked), len(ranked) - len(kept)))
    items = _hydrate(kept[: request.top_k], nodes)
    for item in items:
        item.context = contexts.get(item.node_id)
    counts = {
        "dense_candidates": len(results.get("dense", [])),
        "keyword_candidates": len(results.get("keyword", [])),
        "fused_candidates": len(candidates),
        "expansion_candidates": len(expanded),
        "threshold_filtered_candidates": len(ranked) - len(kept),
    }
    metrics = _metrics(counts, rerank_stage, allowed, snapshot, timings, started)
    return RetrievalResult(
        mode=request.mode, items=items, metrics=metrics, plan=plan.as_dict(), stages=stages
    )


def _leg_stages(results: dict, timings: dict) -> list[dict]:
    """The ``embed``, ``dense`` and ``keyword`` stages of one :func:`recall`."""
    embedded = "embed_ms" in timings
    stages = [_stage("embed", embedded, int(embedded), 0, timings.get("embed_ms", 0.0))]
    for leg in LEGS:
        hits = results.get(leg)
        ms = timings.get(f"{leg}_ms", 0.0)
        stages.append(_stage(leg, hits is not None, len(hits or []), 0, ms))
    return stages


def _metrics(counts: dict, rerank_stage: dict, allowed, snapshot, timings: dict, started):
    """``metrics`` of a Fast or Deep result: candidate counts, filter and rerank figures,
    the snapshot read, per-leg timings (ms) and ``total_ms``."""
    metrics = dict(counts)
    if rerank_stage["status"] == "executed":
        metrics["rerank_candidates"] = rerank_stage["candidate_count"]
    if allowed is not None:
        metrics["filter_allowed_documents"] = len(allowed.document_ids)
        metrics["metadata_filtered_documents"] = allowed.filtered
    metrics["publication_revision"] = snapshot.head_revision
    metrics["index_version"] = snapshot.version[0] if snapshot.version is not None else None
    metrics.update({k: round(v, 2) for k, v in timings.items()})
    if rerank_stage["status"] == "executed":
        metrics["rerank_ms"] = rerank_stage["duration_ms"]
    metrics["total_ms"] = _ms(started)
    return metrics


def _final_order(space, profile, query: str, pool, nodes, contexts):
    """Rank the pool (base hits + Deep's expansions): one rerank over all of it when the profile
    enables one, else the fused order with each expansion just below its source hit.
    Returns ``(ranked, rerank stage)``."""
    rerank = _rerank_selection(profile)
    if rerank is None or not pool:
        # Ties: base hits first (by id, like Fast), then expansions in the order they were made.
        order = {r[0]: n for n, r in enumerate(pool)}
        ranked = sorted(
            pool,
            key=lambda r: (-r[1], r[0] in contexts, order[r[0]] if r[0] in contexts else str(r[0])),
        )
        return ranked, _stage("rerank", False)
    t0 = time.perf_counter()
    present = [r for r in pool if r[0] in nodes]
    ranked = _rerank(space, rerank, query, present, nodes)
    ms = (time.perf_counter() - t0) * 1000
    return ranked, _stage("rerank", True, len(present), len(present) - len(ranked), ms)


def _expand(base, nodes: dict, allowed, *, limit: int):
    """Deep's context expansion of ``base`` (fused ``(node_id, score, per_leg)``, best first).

    For each hit, in order: its neighbours (same document and generation, chunk_index ± 1),
    then the nearest chunks of the same non-empty ``section_path`` within
    :data:`DEEP_SECTION_WINDOW` chunks; at most :data:`DEEP_EXPANSION_PER_HIT` per hit and
    ``limit`` in all; each chunk once, never a base hit. Only visible nodes of enabled documents
    the filter allows (one query). Returns ``(expanded, contexts)``: expanded candidates scored
    ``source score × DEEP_EXPANSION_FACTOR`` (the reranker rescores them when enabled) and
    ``{node_id: {"relation": "neighbour"|"section", "source_node_id", "source_score"}}``;
    ``nodes`` gains the expanded nodes.
    """
    anchors = [nodes[node_id] for node_id, _, _ in base if node_id in nodes]
    if not anchors or limit <= 0:
        return [], {}
    near = Q()
    for a in anchors:
        near |= Q(
            document_id=a.document_id,
            generation=a.generation,
            chunk_index__gte=max(a.chunk_index - DEEP_SECTION_WINDOW, 0),
            chunk_index__lte=a.chunk_index + DEEP_SECTION_WINDOW,
        )
    rows = KnowledgeNode.objects.filter(
        near, generation=F("document__active_generation"), document__enabled=True
    ).select_related("document")
    groups: dict[tuple, dict[int, KnowledgeNode]] = {}
    for node in rows:
        if allowed is None or node.document_id in allowed.document_ids:
            groups.setdefault((node.document_id, node.generation), {})[node.chunk_index] = node
    taken = {node_id for node_id, _, _ in base}
    expanded, contexts = [], {}
    for node_id, score, _ in base:
        anchor = nodes.get(node_id)
        if anchor is None:
            continue
        for node, relation in _context_of(
            anchor, groups.get((anchor.document_id, anchor.generation), {}), taken
        ):
            taken.add(node.id)
            nodes[node.id] = node
            expanded.append((node.id, score * DEEP_EXPANSION_FACTOR, {}))
            contexts[node.id] = {
                "relation": relation,
                "source_node_id": str(node_id),
                "source_score": round(score, 6),
            }
            if len(expanded) >= limit:
                return expanded, contexts
    return expanded, contexts


def _context_of(anchor: KnowledgeNode, group: dict[int, KnowledgeNode], taken: set):
    """The chunks one hit expands to: neighbours, then the nearest of its section."""
    picks = []
    for index in (anchor.chunk_index - 1, anchor.chunk_index + 1):
        node = group.get(index)
        if node is not None and node.id not in taken:
            picks.append((node, "neighbour"))
    if anchor.section_path:
        section = sorted(
            (
                n
                for n in group.values()
                if abs(n.chunk_index - anchor.chunk_index) > 1
                and n.section_path == anchor.section_path
                and n.id not in taken
            ),
            key=lambda n: (abs(n.chunk_index - anchor.chunk_index), n.chunk_index),
        )
        picks.extend((n, "section") for n in section)
    return picks[:DEEP_EXPANSION_PER_HIT]


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
    if "keyword" in legs:
        t0 = time.perf_counter()
        results["keyword"] = backend.keyword_search(
            space.id,
            query,
            depth,
            documents=documents,
            language=language or detect_language(query),
        )
        timings["keyword_ms"] = (time.perf_counter() - t0) * 1000
    return results, timings


def _snapshot(space_id: uuid.UUID) -> tuple[int, tuple[int, str, int] | None]:
    """``(head revision, (version number, model_id, dimension) | None)`` in one statement."""
    head = PublicationHead.objects.filter(space_id=OuterRef("space_id")).values("revision")[:1]
    row = (
        IndexVersion.objects.filter(space_id=space_id, state=IndexState.ACTIVE)
        .annotate(head=Subquery(head))
        .values_list("head", "number", "model_id", "dimension")
        .first()
    )
    if row is not None:
        return row[0] or 0, (row[1], row[2], row[3])
    revision = (
        PublicationHead.objects.filter(space_id=space_id).values_list("revision", flat=True)
    ).first()
    return revision or 0, None


def _rerank_selection(profile):
    from spaces.profiles import Selection

    if not profile.retrieval_rerank_enabled:
        return None
    return Selection.of(profile.retrieval_rerank_model)


def _rerank(space, selection, query: str, pool, nodes) -> list[tuple[uuid.UUID, float, dict]]:
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
    ranked.sort(key=lambda r: (-r[1], str(r[0])))
    return ranked


def _nodes(ids: list[uuid.UUID]) -> dict[uuid.UUID, KnowledgeNode]:
    return {n.id: n for n in KnowledgeNode.objects.filter(id__in=ids).select_related("document")}


def _hydrate(
    ranked: list[tuple[uuid.UUID, float, dict]], nodes: dict | None = None
) -> list[RetrievalItem]:
    if not ranked:
        return []
    if nodes is None:
        nodes = _nodes([r[0] for r in ranked])
    items = []
    for node_id, score, per_leg in ranked:
        node = nodes.get(node_id)
        if node is None or not node.document.enabled:  # removed or disabled since the legs
            continue
        items.append(
            RetrievalItem(
                node_id=node_id,
                score=score,
                text=node.text,
                scores={"final": score, **per_leg},
                citation={
                    "document_id": str(node.document_id),
                    "filename": node.document.filename,
                    "page_number": node.page_number,
                    "section_path": list(node.section_path),
                    "start_offset": node.start_offset,
                    "end_offset": node.end_offset,
                },
            )
        )
    return items
