"""Annotations of the knowledge-space routes (``spaces.api``: spaces and their embedding and
retrieval profiles) for the OpenAPI document (:mod:`knowledgefs.openapi.common`)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema

from .common import (
    BOOLEAN,
    IDEMPOTENCY_KEY,
    REPLAYED,
    SCORE_THRESHOLD,
    SELECTION,
    TOP_K,
    annotate,
    body,
    error,
    page,
    page_parameters,
)


def register() -> None:
    """Register the annotations of these routes (once: :func:`knowledgefs.openapi.register`)."""
    from spaces.api.serializers import (
        KnowledgeSpaceSerializer,
        SpaceCreateSerializer,
        SpaceUpdateSerializer,
    )

    not_ready = error(
        "`slug_taken`, `revision_conflict`, `embedding_profile_frozen`, or the cutover gate "
        "(`workspace_cutover_closed`)."
    )
    annotate(
        "spaces.api.views.KnowledgeSpaceListView",
        get=extend_schema(
            summary="List the caller's spaces, newest first",
            parameters=page_parameters(20),
            responses={200: page("KnowledgeSpacePage", KnowledgeSpaceSerializer)},
        ),
        post=extend_schema(
            summary="Create a space",
            request=SpaceCreateSerializer,
            parameters=[IDEMPOTENCY_KEY, REPLAYED],
            responses={
                201: KnowledgeSpaceSerializer,
                403: error("`key_scope_forbids_create` (a key with bindings), or a token's."),
                409: error("`slug_taken`, `idempotency_key_in_progress`."),
                422: error("`idempotency_key_reused`."),
            },
        ),
    )
    annotate(
        "spaces.api.views.KnowledgeSpaceDetailView",
        get=extend_schema(summary="Read a space", responses={200: KnowledgeSpaceSerializer}),
        patch=extend_schema(
            summary="Rename, describe or re-index a space",
            request=SpaceUpdateSerializer,
            responses={
                200: KnowledgeSpaceSerializer,
                202: OpenApiResponse(
                    KnowledgeSpaceSerializer,
                    description="`embedding_model_id` changed: the new index builds beside the "
                    "live one (`index.building`).",
                ),
                409: not_ready,
            },
        ),
        delete=extend_schema(
            summary="Delete a space and everything in it",
            responses={
                204: OpenApiResponse(description="Deleted."),
                503: error(
                    "`storage_unavailable`: Dify's object storage failed; nothing was deleted "
                    "that the same DELETE cannot finish."
                ),
            },
        ),
    )
    profile_errors = error("`revision_conflict` or `embedding_profile_frozen`.")
    annotate(
        "spaces.api.views.EmbeddingProfileView",
        put=extend_schema(
            summary="Choose the space's embedding model",
            request=body(
                "The embedding model; `revision` makes it a compare-and-set.",
                {**SELECTION["properties"], "revision": {"type": "integer", "minimum": 1}},
                ("plugin_id", "provider", "model"),
            ),
            responses={200: KnowledgeSpaceSerializer, 409: profile_errors},
        ),
    )
    annotate(
        "spaces.api.views.RetrievalProfileView",
        put=extend_schema(
            summary="Replace the space's retrieval profile",
            request=body(
                "Every member optional; one left out takes its default (docs/api.md, "
                '"Space profiles").',
                {
                    "default_mode": {"type": "string", "enum": ["fast", "deep", "research"]},
                    "reasoning_model": {**SELECTION, "nullable": True},
                    "rerank": {
                        "type": "object",
                        "properties": {
                            "enabled": BOOLEAN,
                            "model": {**SELECTION, "nullable": True},
                        },
                    },
                    "score_threshold": SCORE_THRESHOLD,
                    "top_k": TOP_K,
                    "revision": {"type": "integer", "minimum": 1},
                },
            ),
            responses={200: KnowledgeSpaceSerializer, 409: profile_errors},
        ),
    )
    annotate(
        "spaces.api.views.ProfileValidationView",
        post=extend_schema(
            summary="Check the space's models against the runtime (preflight)",
            request=None,
            responses={200: KnowledgeSpaceSerializer},
        ),
    )
