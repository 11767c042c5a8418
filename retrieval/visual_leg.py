"""The visual leg: query-image vectors searched against the space's visual projections.

Only projections of the profile's own vector space, of each document's published generation and
of enabled (and, with filters, allowed) documents are scored; a text vector never meets them.
Each image is searched on its own (cosine, best ``depth``), a hit stands for the first chunk of
its page (for a picture without a page, the document's first chunk), and the per-image lists
are fused by reciprocal rank with equal weight (:func:`retrieval.recall.reciprocal_rank_fusion`)
— vectors are never averaged. :func:`image_citations` tells which asset each hit came from.
"""

from __future__ import annotations

import uuid

import numpy as np
from django.db.models import F

from ingestion.models import KnowledgeNode, VisualProjection

from .backends.base import ScoredNode
from .recall import reciprocal_rank_fusion


def visual_search(
    space, vector_space_id: str, vectors: list[np.ndarray], *, depth: int, documents=None
) -> tuple[list[ScoredNode], dict[uuid.UUID, dict]]:
    """``(fused visual hits, {node_id: image citation})`` (module docstring)."""
    projections = VisualProjection.objects.filter(
        space_id=space.pk,
        vector_space_id=vector_space_id,
        document__enabled=True,
        generation=F("document__active_generation"),
    )
    if documents is not None:
        projections = projections.filter(document_id__in=documents)
    rows = list(
        projections.values_list(
            "document_id", "generation", "asset_index", "page_number", "kind", "vector", "dimension"
        )
    )
    if not rows or not vectors:
        return [], {}
    dimension = rows[0][6]
    rows = [r for r in rows if r[6] == dimension]
    matrix = np.stack([np.frombuffer(r[5], dtype=np.float32) for r in rows])
    nodes = _page_nodes(rows)
    lists: dict[str, list[ScoredNode]] = {}
    best_asset: dict[uuid.UUID, tuple[float, tuple]] = {}
    for number, vector in enumerate(vectors):
        query = np.asarray(vector, dtype=np.float32)
        if query.shape[0] != matrix.shape[1]:
            continue
        scores = matrix @ query
        hits: list[ScoredNode] = []
        seen: set[uuid.UUID] = set()
        for index in np.argsort(-scores):
            row = rows[int(index)]
            node_id = nodes.get((row[0], row[1], row[3]))
            if node_id is None or node_id in seen:
                continue
            seen.add(node_id)
            score = float(scores[int(index)])
            hits.append(ScoredNode(node_id, score))
            if score > best_asset.get(node_id, (-2.0, ()))[0]:
                best_asset[node_id] = (score, row)
            if len(hits) >= depth:
                break
        lists[f"image_{number}"] = hits
    fused = reciprocal_rank_fusion(lists)
    citations = {
        node_id: {
            "document_id": str(row[0]),
            "asset_index": row[2],
            "page_number": row[3],
            "kind": row[4],
            "asset_url": f"/v1/knowledge-spaces/{space.pk}/documents/{row[0]}/assets/{row[2]}",
            "score": round(score, 6),
        }
        for node_id, (score, row) in best_asset.items()
    }
    return [ScoredNode(node_id, score) for node_id, score, _ in fused], citations


def _page_nodes(rows) -> dict[tuple, uuid.UUID | None]:
    """``{(document, generation, page): node id}``: the first chunk of each page (``page``
    ``None``: of the document; ``None`` when the generation has no chunk)."""
    documents = {r[0] for r in rows}
    generations = {r[1] for r in rows}
    found: dict[tuple, uuid.UUID] = {}
    first: dict[tuple, uuid.UUID] = {}
    for node_id, document_id, generation, page in (
        KnowledgeNode.objects.filter(document_id__in=documents, generation__in=generations)
        .order_by("document_id", "chunk_index")
        .values_list("id", "document_id", "generation", "page_number")
    ):
        first.setdefault((document_id, generation), node_id)
        if page is not None:
            found.setdefault((document_id, generation, page), node_id)
    out: dict[tuple, uuid.UUID | None] = {}
    for document_id, generation, _asset, page, *_ in rows:
        key = (document_id, generation, page)
        on_page = found.get(key) if page is not None else None
        out[key] = on_page or first.get((document_id, generation))
    return out
