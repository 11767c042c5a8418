"""Fast and Deep retrieval: dense and keyword legs, per-leg min-max normalisation, equal-weight
fusion, Deep's context expansion, one rerank (over the primitives of :mod:`retrieval.recall`).

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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .calibration import effective_fusion, fuse_legs
from .recall import (
    LEGS,
    NodeRecord,
    RetrievalResult,
    db_uuid,
    hydrate,
    load_nodes,
    recall,
    rerank,
    rerank_selection,
    resolve_snapshot,
    select_nodes,
    stage,
)
from .reranking import local_rerank_applies, rerank_locally

if TYPE_CHECKING:
    from .filters import Allowed, Filters
    from .query_images import ImagePlan

#: Deep without a reranker: an expanded chunk scores its source hit's score times this factor,
#: so it ranks strictly below the hit it came from and never reorders the base hits.
DEEP_EXPANSION_FACTOR = 0.5
#: Deep: chunks added per base hit (neighbours first, then the nearest of its section).
DEEP_EXPANSION_PER_HIT = 3
#: Deep: same-section chunks are looked for within this many chunks either side of the hit.
DEEP_SECTION_WINDOW = 8


@dataclass(frozen=True)
class FastDeepRequest:
    query: str
    top_k: int
    score_threshold: float | None
    mode: str
    legs: tuple[str, ...]
    fusion: str
    filters: Filters | Allowed | None
    images: ImagePlan | None = None


#: Reads of the legs and their nodes when a publication removed nodes in between.
SNAPSHOT_ATTEMPTS = 3


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 2)


def fast_or_deep(space, profile, request: FastDeepRequest, started: float, route_ms: float | None):
    """Fast and Deep (module docstring); stages: route (executed when ``auto`` was resolved,
    ``route_ms`` its time), filter, embed, dense, keyword, fusion, expansion, rerank,
    threshold, each reported whether it ran or not."""
    from . import filters as filtering
    from .planner import plan as make_plan

    plan = make_plan(request.mode, request.top_k, request.query)
    stages = [stage("route", route_ms is not None, 0, 0, route_ms or 0.0)]
    snapshot = resolve_snapshot(space)
    allowed = filtering.resolve(space, request.filters, head_revision=snapshot.head_revision)
    stages.append(
        stage("filter", True, allowed.considered, allowed.filtered, allowed.duration_ms)
        if allowed is not None
        else stage("filter", False)
    )
    images = request.images
    image_citations: dict = {}
    visual_stage = None
    for attempt in range(SNAPSHOT_ATTEMPTS):
        if attempt:
            snapshot = resolve_snapshot(space)
        if request.query:
            results, timings = recall(
                space,
                snapshot,
                request.query,
                depth=plan.dense_top_k,
                legs=request.legs,
                filters=allowed,
                language=plan.query_language,
            )
        else:  # an image-only query: the visual leg is the whole query
            results, timings = {}, {}
        if (
            images is not None
            and images.visual
            and not (allowed is not None and not allowed.document_ids)
        ):
            from .visual_leg import visual_search

            t0 = time.perf_counter()
            results["visual"], image_citations = visual_search(
                space,
                images.vector_space_id,
                images.vectors,
                depth=plan.dense_top_k,
                documents=None if allowed is None else allowed.document_ids,
            )
            visual_stage = stage("visual", True, len(results["visual"]), 0, _ms(t0))
        elif images is not None and (images.images or images.degradations):
            visual_stage = stage("visual", False)  # only reported when the request held images
        t0 = time.perf_counter()
        candidates = fuse_legs(request.fusion, results, request.query, snapshot, plan.dense_top_k)
        base = candidates[: plan.fusion_limit]
        fusion_ms = (time.perf_counter() - t0) * 1000
        nodes = load_nodes([r[0] for r in base]) if base else {}
        # A publication committed between the legs and this read removed the nodes they found
        # (a document's previous generation): read again from the new snapshot, so a query
        # during a swap answers from the old or the new version, never from neither.
        if len(nodes) == len(base) or resolve_snapshot(space).head_revision == (
            snapshot.head_revision
        ):
            break
    stages.extend(_leg_stages(results, timings))
    if visual_stage is not None:
        stages.append(visual_stage)
    stages.append(stage("fusion", bool(results), len(candidates), len(candidates) - len(base),
                         fusion_ms))  # fmt: skip
    t0 = time.perf_counter()
    expanded, contexts = [], {}
    if request.mode == "deep" and base:
        expanded, contexts = _expand(base, nodes, allowed, limit=2 * plan.rerank_limit)
    stages.append(stage("expansion", request.mode == "deep" and bool(base), len(expanded), 0,
                         (time.perf_counter() - t0) * 1000))  # fmt: skip
    pool = base + expanded
    ranked, rerank_stage = _final_order(
        space,
        profile if request.query else None,
        request.query,
        pool,
        nodes,
        contexts,
        mode=request.mode,
        fusion=effective_fusion(request.fusion, snapshot),
    )
    stages.append(rerank_stage)
    threshold = request.score_threshold
    kept = ranked if threshold is None else [r for r in ranked if r[1] >= threshold]
    stages.append(stage("threshold", threshold is not None, len(ranked), len(ranked) - len(kept)))
    items = hydrate(kept[: request.top_k], nodes)
    for item in items:
        item.context = contexts.get(item.node_id)
        if item.node_id in image_citations:
            item.citation["image"] = image_citations[item.node_id]
    counts = {
        "dense_candidates": len(results.get("dense", [])),
        "keyword_candidates": len(results.get("keyword", [])),
        "fused_candidates": len(candidates),
        "expansion_candidates": len(expanded),
        "threshold_filtered_candidates": len(ranked) - len(kept),
    }
    if images is not None and (images.images or images.degradations):
        counts["visual_candidates"] = len(results.get("visual", []))
    metrics = _metrics(counts, rerank_stage, allowed, snapshot, timings, started)
    if images is not None and (images.images or images.degradations):
        metrics["query_images"] = images.describe()
        metrics["degradations"] = list(images.degradations)
    return RetrievalResult(
        mode=request.mode,
        items=items,
        metrics=metrics,
        plan=plan.as_dict(),
        stages=stages,
        image_plan=images,
    )


def _leg_stages(results: dict, timings: dict) -> list[dict]:
    """The ``embed``, ``dense`` and ``keyword`` stages of one :func:`recall`."""
    embedded = "embed_ms" in timings
    stages = [stage("embed", embedded, int(embedded), 0, timings.get("embed_ms", 0.0))]
    for leg in LEGS:
        hits = results.get(leg)
        ms = timings.get(f"{leg}_ms", 0.0)
        stages.append(stage(leg, hits is not None, len(hits or []), 0, ms))
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


def _final_order(
    space, profile, query: str, pool, nodes, contexts, *, mode: str = "fast", fusion: str
):
    """Rank the pool (base hits + Deep's expansions): the local reranker's mix over its first
    candidates (:mod:`retrieval.reranking`: Deep always, Fast when the profile enables rerank,
    under the local runtime), else one Dify rerank over all of it when the profile enables one,
    else the fused order with each expansion just below its source hit.
    Returns ``(ranked, rerank stage)``."""
    # Ties: base hits first (by id, like Fast), then expansions in the order they were made.
    order = {r[0]: n for n, r in enumerate(pool)}
    fused_order = sorted(
        pool,
        key=lambda r: (-r[1], r[0] in contexts, order[r[0]] if r[0] in contexts else str(r[0])),
    )
    if pool and query and local_rerank_applies(profile, mode):
        texts = {node_id: nodes[node_id].text for node_id, _, _ in pool if node_id in nodes}
        ranked, info = rerank_locally(query, fused_order, texts, fusion=fusion)
        entry = stage("rerank", True, info["candidates"], 0, info["duration_ms"])
        if info["degraded"]:
            entry["degraded"] = info["degraded"]
        return ranked, entry
    selection = rerank_selection(profile) if profile is not None else None
    if selection is None or not pool:
        return fused_order, stage("rerank", False)
    t0 = time.perf_counter()
    present = [r for r in pool if r[0] in nodes]
    ranked = rerank(space, selection, query, present, nodes)
    ms = (time.perf_counter() - t0) * 1000
    return ranked, stage("rerank", True, len(present), len(present) - len(ranked), ms)


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
    near, params = [], []
    for a in anchors:
        near.append(
            "(n.document_id = %s AND n.generation = %s AND n.chunk_index BETWEEN %s AND %s)"
        )
        params += [
            db_uuid(a.document_id),
            db_uuid(a.generation),
            max(a.chunk_index - DEEP_SECTION_WINDOW, 0),
            a.chunk_index + DEEP_SECTION_WINDOW,
        ]
    where = f"({' OR '.join(near)}) AND n.generation = d.active_generation AND d.enabled"
    groups: dict[tuple, dict[int, NodeRecord]] = {}
    for node in select_nodes(where, params):
        if allowed is None or node.document_id in allowed.document_ids:
            groups.setdefault((node.document_id, node.generation), {})[node.chunk_index] = node
    taken = {node_id for node_id, _, _ in base}
    expanded: list[tuple[uuid.UUID, float, dict]] = []
    contexts: dict[uuid.UUID, dict] = {}
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


def _context_of(anchor: NodeRecord, group: dict[int, NodeRecord], taken: set):
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
