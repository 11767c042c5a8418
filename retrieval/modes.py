"""``retrieve``, the entry point of every retrieval mode: the space's retrieval profile fills what
the request leaves out, the request is validated, Auto resolves to a concrete mode
(:mod:`retrieval.auto`), then Research (:mod:`retrieval.research`) or Fast/Deep
(:mod:`retrieval.fast_deep`) runs. A space whose profile is not ``ready`` is refused.
"""

from __future__ import annotations

import time

from spaces.models import KnowledgeSpace

from .backends import get_search_backend
from .calibration import DEFAULT_FUSION
from .fast_deep import FastDeepRequest, fast_or_deep
from .recall import LEGS, RetrievalResult, stage, validate_request

PROFILE = object()  # a ``score_threshold`` left to the space's retrieval profile


def retrieve(
    space: KnowledgeSpace,
    query: str | None,
    *,
    top_k: int | None = None,
    score_threshold: float | None | object = PROFILE,
    mode: str | None = None,
    legs: tuple[str, ...] = LEGS,
    fusion: str = DEFAULT_FUSION,
    filters=None,
    query_images=None,
    subject: str = "",
) -> RetrievalResult:
    """Run a retrieval over the space's published nodes; items carry citations.

    ``top_k`` (``None``), ``mode`` (``None``) and ``score_threshold`` (left out) come from the
    space's retrieval profile; ``score_threshold=None`` turns the threshold off. ``filters`` is
    the request's filter object (:mod:`retrieval.filters`; ``None``: none), checked before any
    work. ``legs`` and ``fusion`` are for evaluation (``("keyword",)``, ``("dense",)`` or both;
    ``"calibrated"``, the default, ``"minmax"`` or ``"rrf"``). The search backend is checked
    first (503 on MySQL/MariaDB), then the space's servability
    (:func:`spaces.readiness.require_servable`); a failing reranker or embedding model is a 503,
    never a silent fallback. ``query_images`` is the
    request's ``[{"upload_file_id"}]`` (:mod:`retrieval.query_images`; ``subject`` the acting
    caller Dify checks ownership against): with images the query text may be empty.
    """
    from spaces.readiness import require_servable

    from . import filters as filtering
    from .query_images import parse_references, plan_images

    get_search_backend()  # 503 search_backend_unavailable first (MySQL/MariaDB)
    profile = require_servable(space)
    if top_k is None:
        top_k = profile.retrieval_top_k
    if mode is None:
        mode = profile.retrieval_default_mode
    if score_threshold is PROFILE:
        score_threshold = profile.retrieval_score_threshold
    references = parse_references(query_images)  # 413 for too many images, before any work
    image_only = bool(references) and (
        query is None or (isinstance(query, str) and not query.strip())
    )
    query, top_k, score_threshold, mode = validate_request(
        "image" if image_only else query, top_k, score_threshold, mode
    )
    if image_only:
        query = ""
        if mode == "auto":
            mode = "fast"  # nothing to route on: the image is the whole query
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
            space,
            query,
            top_k=top_k,
            score_threshold=score_threshold,
            filters=filters,
            query_images=references,
            subject=subject,
        )
        result.stages.insert(0, stage("route", route_ms is not None, 0, 0, route_ms or 0.0))
        result.route = route
        return result
    images = plan_images(space, profile, query, references, subject=subject, mode=mode)
    # the images' description is searched with the text (Deep) or as the query (image-only)
    text = " ".join(p for p in (query, images.expanded_query) if p)
    request = FastDeepRequest(text, top_k, score_threshold, mode, legs, fusion, filters, images)
    result = fast_or_deep(space, profile, request, started, route_ms=route_ms)
    result.route = route
    return result
