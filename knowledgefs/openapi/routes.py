"""Request and response shapes of the API routes, for the OpenAPI document.

The views read most bodies by hand (services validate them and name the refused field), so
drf-spectacular cannot infer them. Each view is annotated here, by dotted path, with an
:class:`~drf_spectacular.extensions.OpenApiViewExtension`: the view modules stay free of schema
code and the document is described in one place. Shapes follow the services' docstrings and
docs/api.md; a route added to knowledgefs/urls.py without an entry here fails
``spectacular --fail-on-warn`` (tests/test_openapi.py).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiViewExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import serializers

from .schema import ErrorEnvelopeSerializer

# --- shared pieces ------------------------------------------------------------------------------

OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True}
NULLABLE_OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True, "nullable": True}

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    description=(
        "1-255 printable ASCII characters, kept 24 h per credential: a retry with the same key "
        "and request replays the first 2xx answer (`Idempotent-Replayed: true`); another "
        "request under the key is 422 `idempotency_key_reused`, a retry while the first runs "
        "409 `idempotency_key_in_progress`; a malformed key 400 `invalid_idempotency_key`."
    ),
)
REPLAYED = OpenApiParameter(
    "Idempotent-Replayed",
    str,
    OpenApiParameter.HEADER,
    response=True,
    description="`true` when the answer is the replay of an earlier request with the same key.",
)


def if_match(what: str, code: str) -> OpenApiParameter:
    """The ``If-Match: "N"`` header of a compare-and-set update of ``what``."""
    return OpenApiParameter(
        "If-Match",
        str,
        OpenApiParameter.HEADER,
        description=(
            f'The {what} read before (`"3"`; the `ETag` of the read): the update applies only '
            f"while it is still current, else 409 `{code}`."
        ),
    )


def etag(what: str) -> OpenApiParameter:
    """The ``ETag`` response header carrying ``what``."""
    return OpenApiParameter(
        "ETag", str, OpenApiParameter.HEADER, response=True, description=f'The {what}, `"N"`.'
    )


def page_parameters(default: int) -> list[OpenApiParameter]:
    """``?limit=`` and ``?cursor=`` of the keyset paginations (knowledgefs/pagination.py)."""
    return [
        OpenApiParameter(
            "limit",
            OpenApiTypes.INT,
            OpenApiParameter.QUERY,
            description=f"Page size, 1..100 (default {default}); outside: 400 `invalid_limit`.",
        ),
        OpenApiParameter(
            "cursor",
            str,
            OpenApiParameter.QUERY,
            description=(
                "The opaque cursor of a `next` or `previous` link; any other: 400 `invalid_cursor`."
            ),
        ),
    ]


def page(name: str, item: Any) -> serializers.Serializer:
    """A page ``{next, previous, results: [item]}`` (DRF's cursor pagination)."""
    results = (
        item(many=True)
        if isinstance(item, type)
        else serializers.ListField(child=serializers.JSONField(), help_text=item)
    )
    return inline_serializer(
        name=name,
        fields={
            "next": serializers.URLField(allow_null=True, help_text="The next page, or null."),
            "previous": serializers.URLField(
                allow_null=True, help_text="The previous page, or null."
            ),
            "results": results,
        },
    )


def error(description: str) -> OpenApiResponse:
    """An error response with the envelope and a description of its codes."""
    return OpenApiResponse(ErrorEnvelopeSerializer, description=description)


def body(description: str, properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict:
    """A JSON request body schema (raw OpenAPI), with ``description``."""
    schema: dict[str, Any] = {
        "type": "object",
        "description": description,
        "properties": properties,
    }
    if required:
        schema["required"] = list(required)
    return {"application/json": schema}


def shape(description: str, properties: dict[str, Any] | None = None) -> OpenApiResponse:
    """A JSON response whose object shape is described, open to more members."""
    schema: dict[str, Any] = {"type": "object", "additionalProperties": True}
    if properties:
        schema["properties"] = properties
    return OpenApiResponse(schema, description=description)


def annotate(target: str, **methods: Any) -> None:
    """Register the annotations ``methods`` (``get=extend_schema(...)``) for the view class at
    dotted path ``target``. The view itself is not changed: the schema sees a subclass."""

    def view_replacement(self):
        view = self.target_class
        members = {"__doc__": view.__doc__, "__module__": view.__module__}
        fixed = type(view.__name__, (view,), members)
        return extend_schema_view(**methods)(fixed)

    name = "Annotate" + target.replace(".", "_")
    members = {"target_class": target, "view_replacement": view_replacement}
    type(name, (OpenApiViewExtension,), members)


STRING = {"type": "string"}
INTEGER = {"type": "integer"}
NUMBER = {"type": "number"}
BOOLEAN = {"type": "boolean"}
SELECTION = {
    "type": "object",
    "description": "A model of a Dify plugin (or the local model): exactly these three members.",
    "properties": {"plugin_id": STRING, "provider": STRING, "model": STRING},
    "required": ["plugin_id", "provider", "model"],
}
MODE = {"type": "string", "enum": ["fast", "deep", "research", "auto"]}
FILTERS = {
    "type": "object",
    "nullable": True,
    "description": (
        'Retrieval filters (docs/retrieval.md, "Filters"): `logical_operator`, `conditions` '
        "(<= 50), `document_ids`, `document_types` (<= 100 each), `created_after`, "
        "`created_before`. 400 `invalid_filter`, `too_many_filter_conditions`, "
        "`too_many_filter_values`."
    ),
    "additionalProperties": True,
}
TOP_K = {"type": "integer", "minimum": 1, "maximum": 100}
SCORE_THRESHOLD = {"type": "number", "minimum": 0, "maximum": 1, "nullable": True}

# --- knowledge spaces ---------------------------------------------------------------------------


def _spaces() -> None:
    from spaces.serializers import (
        KnowledgeSpaceSerializer,
        SpaceCreateSerializer,
        SpaceUpdateSerializer,
    )

    not_ready = error(
        "`slug_taken`, `revision_conflict`, `embedding_profile_frozen`, or the cutover gate "
        "(`workspace_cutover_closed`)."
    )
    annotate(
        "spaces.api.KnowledgeSpaceListView",
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
        "spaces.api.KnowledgeSpaceDetailView",
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
        "spaces.api.EmbeddingProfileView",
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
        "spaces.api.RetrievalProfileView",
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
        "spaces.api.ProfileValidationView",
        post=extend_schema(
            summary="Check the space's models against the runtime (preflight)",
            request=None,
            responses={200: KnowledgeSpaceSerializer},
        ),
    )


# --- documents and jobs -------------------------------------------------------------------------


def _documents() -> None:
    from ingestion.api.serializers import DocumentSerializer, JobSerializer

    admitted = inline_serializer(
        name="DocumentAdmission",
        fields={
            "document": DocumentSerializer(),
            "job": JobSerializer(),
            "created": serializers.BooleanField(
                help_text="false when `on_duplicate=replace` replaced an earlier document."
            ),
        },
    )
    annotate(
        "ingestion.api.DocumentListView",
        get=extend_schema(
            summary="List the space's documents, newest first",
            parameters=page_parameters(20),
            responses={200: page("DocumentPage", DocumentSerializer)},
        ),
        post=extend_schema(
            summary="Upload one file",
            request={
                "multipart/form-data": {
                    "type": "object",
                    "properties": {"file": {"type": "string", "format": "binary"}},
                    "required": ["file"],
                }
            },
            parameters=[
                IDEMPOTENCY_KEY,
                REPLAYED,
                OpenApiParameter(
                    "on_duplicate",
                    str,
                    OpenApiParameter.QUERY,
                    enum=["reject", "replace"],
                    description="Same bytes already in the space: 409 `duplicate_document` "
                    "(`reject`, the default) or a new version (`replace`).",
                ),
            ],
            responses={
                202: admitted,
                408: error("`upload_timeout`: the body stopped arriving."),
                409: error(
                    "`duplicate_document`, `space_setup_required`, `space_pending_validation`, "
                    "`space_validation_failed`, `concurrent_change`, "
                    "`idempotency_key_in_progress`."
                ),
                411: error("`length_required`: no `Content-Length`."),
                413: error("`file_too_large`, `upload_reservation_too_large`."),
                415: error("`unsupported_media_type`, `content_mismatch`."),
                422: error("`idempotency_key_reused`."),
                429: error("`upload_admission_busy` (`Retry-After`), `rate_limited`."),
                503: error("`storage_unavailable`: Dify's object storage failed; nothing stored."),
            },
        ),
    )
    annotate(
        "ingestion.api.DocumentDetailView",
        get=extend_schema(
            summary="Read a document",
            parameters=[etag("document's `row_version`")],
            responses={200: DocumentSerializer},
        ),
        patch=extend_schema(
            summary="Enable, disable or annotate a document",
            parameters=[
                if_match("document's `row_version`", "document_version_conflict"),
                etag("document's new `row_version`"),
            ],
            request=body(
                "`metadata` merges (a `null` value removes the key); the expected version comes "
                "from `If-Match` or `row_version`.",
                {
                    "enabled": BOOLEAN,
                    "metadata": {"type": "object", "additionalProperties": True},
                    "row_version": {"type": "integer", "minimum": 1},
                },
            ),
            responses={
                200: DocumentSerializer,
                409: error("`document_version_conflict` (`details.expected`, `current`)."),
            },
        ),
        delete=extend_schema(
            summary="Delete a document",
            responses={
                204: OpenApiResponse(description="Deleted."),
                503: error("`storage_unavailable`: the document is kept; send it again."),
            },
        ),
    )
    annotate(
        "ingestion.api.DocumentTextView",
        get=extend_schema(
            summary="The document's published canonical text",
            parameters=[
                OpenApiParameter(
                    "start", OpenApiTypes.INT, OpenApiParameter.QUERY, description="Code point."
                ),
                OpenApiParameter(
                    "end", OpenApiTypes.INT, OpenApiParameter.QUERY, description="Code point."
                ),
            ],
            responses={
                200: shape(
                    "The text between `start` and `end` (code-point offsets, as in citations).",
                    {"document_id": STRING, "text": STRING, "start": INTEGER, "end": INTEGER},
                ),
                409: error("`document_disabled`, or no published text yet."),
            },
        ),
    )
    annotate(
        "ingestion.api.JobListView",
        get=extend_schema(
            summary="The space's compilation attempts, newest first",
            parameters=[
                *page_parameters(20),
                OpenApiParameter(
                    "state",
                    str,
                    OpenApiParameter.QUERY,
                    description="Only jobs in this public state (400 `invalid_state`).",
                ),
            ],
            responses={200: page("JobPage", JobSerializer)},
        ),
    )
    annotate(
        "ingestion.api.JobDetailView",
        get=extend_schema(summary="Read a compilation attempt", responses={200: JobSerializer}),
        delete=extend_schema(
            summary="Cancel a live attempt",
            responses={200: JobSerializer, 409: error("`job_finished`.")},
        ),
    )
    annotate(
        "ingestion.api.JobRetryView",
        post=extend_schema(
            summary="Retry a failed or canceled attempt",
            parameters=[IDEMPOTENCY_KEY, REPLAYED],
            request=body(
                "Where the new attempt starts.",
                {"from": {"type": "string", "enum": ["checkpoint", "start"]}},
            ),
            responses={
                202: JobSerializer,
                409: error("`job_live`, `job_succeeded`, `job_superseded`."),
                422: error("`idempotency_key_reused`."),
            },
        ),
    )


# --- retrieval, answers and research tasks ------------------------------------------------------

RETRIEVAL_RESULT = {
    "mode": STRING,
    "items": {"type": "array", "items": OBJECT},
    "metrics": OBJECT,
    "plan": NULLABLE_OBJECT,
    "stages": {"type": "array", "items": OBJECT},
}
NOT_QUERYABLE = (
    "`space_setup_required`, `space_pending_validation`, `space_validation_failed`, "
    "`space_reconciliation_pending`."
)
MODELS_DOWN = error(
    "`embedding_model_unavailable`, `rerank_unavailable`, `model_runtime_unavailable`, "
    "`search_backend_unavailable`."
)
GOLDEN = {
    "question": STRING,
    "expected_evidence": {"type": "array", "items": OBJECT},
    "tags": {"type": "array", "items": STRING},
    "metadata": OBJECT,
}
TASK_BODY = {
    "space_id": STRING,
    "query": STRING,
    "top_k": TOP_K,
    "filters": FILTERS,
    "limits": {**OBJECT, "description": "Budgets (model calls, time); see docs/retrieval.md."},
}
TASK = shape(
    "A research task: `id`, `space_id`, `status`, `stage`, `progress`, `error`, `result` "
    "(once completed).",
    {
        "id": STRING,
        "space_id": STRING,
        "query": STRING,
        "status": STRING,
        "stage": STRING,
        "progress": OBJECT,
        "error": NULLABLE_OBJECT,
        "result": NULLABLE_OBJECT,
    },
)


def _retrieval() -> None:
    annotate(
        "retrieval.api.RetrievalTestView",
        post=extend_schema(
            summary="Run one retrieval and show its stages",
            request=body(
                "Left-out `top_k`, `mode`, `score_threshold` take the space's profile.",
                {
                    "query": {"type": "string", "minLength": 1, "maxLength": 16000},
                    "mode": {"type": "string", "enum": ["fast", "deep", "research"]},
                    "top_k": TOP_K,
                    "score_threshold": SCORE_THRESHOLD,
                    "filters": FILTERS,
                    "include_text": BOOLEAN,
                },
                ("query",),
            ),
            responses={
                200: shape("Ranked items, metrics, the plan and the stages.", RETRIEVAL_RESULT),
                409: error(NOT_QUERYABLE),
                503: MODELS_DOWN,
            },
        ),
    )
    annotate(
        "retrieval.api.GoldenQuestionListView",
        get=extend_schema(
            summary="The space's golden questions, newest first",
            parameters=page_parameters(20),
            responses={200: page("GoldenQuestionPage", "Golden questions.")},
        ),
        post=extend_schema(
            summary="Add a golden question",
            request=body("A question and the evidence it must find.", GOLDEN, ("question",)),
            parameters=[etag("question's `revision`")],
            responses={
                201: shape("The question.", {"id": STRING, "revision": INTEGER, **GOLDEN}),
                409: error("`golden_question_limit`."),
            },
        ),
    )
    question = shape("The question.", {"id": STRING, "revision": INTEGER, **GOLDEN})
    annotate(
        "retrieval.api.GoldenQuestionDetailView",
        get=extend_schema(
            summary="Read a golden question",
            parameters=[etag("question's `revision`")],
            responses={200: question},
        ),
        patch=extend_schema(
            summary="Replace members of a golden question",
            parameters=[if_match("question's `revision`", "revision_conflict")],
            request=body(
                "Members named replace the stored ones.",
                {**GOLDEN, "revision": {"type": "integer", "minimum": 1}},
            ),
            responses={200: question, 409: error("`revision_conflict`.")},
        ),
        delete=extend_schema(
            summary="Delete a golden question",
            responses={204: OpenApiResponse(description="Deleted.")},
        ),
    )
    annotate(
        "retrieval.answer_api.QueryView",
        post=extend_schema(
            summary="A cited answer, streamed as server-sent events",
            request=body(
                "The space, the question and optional retrieval settings.",
                {
                    "space_id": STRING,
                    "query": {"type": "string", "minLength": 1, "maxLength": 16000},
                    "mode": MODE,
                    "top_k": TOP_K,
                    "score_threshold": SCORE_THRESHOLD,
                    "filters": FILTERS,
                },
                ("space_id", "query"),
            ),
            parameters=[
                OpenApiParameter(
                    "X-Query-Run-Id",
                    str,
                    OpenApiParameter.HEADER,
                    response=[200],
                    description="The answer trace id (`GET /v1/queries/{trace_id}`).",
                )
            ],
            responses={
                (200, "text/event-stream"): OpenApiResponse(
                    {"type": "string"},
                    description=(
                        "`text/event-stream`: `answer.delta` events, then `answer.done` (the "
                        "answer, citations, answerability) or `answer.error`."
                    ),
                ),
                406: error("`not_acceptable`: `Accept` rules out the stream and JSON."),
                409: error(NOT_QUERYABLE),
                503: MODELS_DOWN,
            },
        ),
    )
    annotate(
        "retrieval.answer_api.QueryTraceView",
        get=extend_schema(
            summary="An answer's trace",
            responses={
                200: shape(
                    "Steps, evidence ids and answerability; never the prompt or answer text.",
                    {"id": STRING, "space_id": STRING, "steps": {"type": "array", "items": OBJECT}},
                )
            },
        ),
    )
    _research_tasks()


def _research_tasks() -> None:
    prefix = "retrieval.research_tasks.api."
    annotate(
        prefix + "ResearchTaskPlanView",
        post=extend_schema(
            summary="Estimate a research task (nothing is created)",
            request=body("As for create.", TASK_BODY, ("space_id", "query")),
            responses={200: shape("The plan and its estimated cost."), 409: error(NOT_QUERYABLE)},
        ),
    )
    annotate(
        prefix + "ResearchTaskListView",
        post=extend_schema(
            summary="Queue a research task",
            request=body("The space, the question and budgets.", TASK_BODY, ("space_id", "query")),
            parameters=[IDEMPOTENCY_KEY, REPLAYED],
            responses={
                202: TASK,
                409: error(NOT_QUERYABLE),
                422: error("`research_limits_exceeded`, `idempotency_key_reused`."),
                429: error("`research_task_limit`, `rate_limited`."),
            },
        ),
    )
    annotate(
        prefix + "ResearchTaskDetailView",
        get=extend_schema(summary="Read a research task", responses={200: TASK}),
        delete=extend_schema(
            summary="Cancel a research task",
            responses={200: TASK, 409: error("`research_task_finished`.")},
        ),
    )
    annotate(
        prefix + "ResearchTaskPartialsView",
        get=extend_schema(
            summary="A task's partial evidence bundles, by sequence",
            parameters=page_parameters(25),
            responses={200: page("ResearchTaskPartialPage", "Partial evidence bundles.")},
        ),
    )
    annotate(
        prefix + "ResearchTaskResumeView",
        post=extend_schema(
            summary="Queue a failed or canceled task again from its checkpoint",
            request=None,
            responses={202: TASK, 409: error("The task is not failed or canceled.")},
        ),
    )
    annotate(
        prefix + "SpaceResearchTaskListView",
        get=extend_schema(
            summary="The space's research tasks, newest first",
            parameters=page_parameters(20),
            responses={200: page("ResearchTaskPage", "Research tasks (without results).")},
        ),
    )


# --- internal routes ----------------------------------------------------------------------------

NAMESPACE = OpenApiParameter(
    "namespace_id", str, OpenApiParameter.QUERY, required=True, description="The tenant."
)
LEDGER = shape(
    "The workspace's cutover ledger with its `gate` (`open`, `code`, `reason`).",
    {"tenant_id": STRING, "phase": STRING, "cas_version": INTEGER, "gate": OBJECT},
)


def _internal() -> None:
    from knowledgefs.internal import ProvisionSerializer
    from spaces.serializers import KnowledgeSpaceSerializer
    from upgrades.cutover_api import AdvanceSerializer, RecutoverSerializer, RollbackSerializer
    from upgrades.serializers import SnapshotSerializer, UpgradeJobSerializer

    namespace_body = body("The tenant.", {"namespace_id": STRING}, ("namespace_id",))
    annotate(
        "knowledgefs.internal.ProvisionSpaceView",
        post=extend_schema(
            summary="Create a tenant's space by slug, or return it",
            request=ProvisionSerializer,
            parameters=[IDEMPOTENCY_KEY],
            responses={200: KnowledgeSpaceSerializer, 201: KnowledgeSpaceSerializer},
        ),
    )
    annotate(
        "knowledgefs.internal.DeleteSpaceView",
        post=extend_schema(
            summary="Delete a tenant's space",
            request=namespace_body,
            responses={204: OpenApiResponse(description="Deleted.")},
        ),
    )
    annotate(
        "knowledgefs.internal.RevokeGrantView",
        post=extend_schema(
            summary="Revoke a capability grant",
            request=body("Why (kept with the grant).", {"reason": {"type": "string"}}),
            responses={
                200: shape(
                    "The grant and whether this call revoked it.",
                    {"grant_id": STRING, "revoked_at": STRING, "newly_revoked": BOOLEAN},
                )
            },
        ),
    )
    upgrades = "upgrades.api."
    annotate(
        upgrades + "UpgradeListView",
        post=extend_schema(
            summary="Snapshot a classic Dataset into an upgrade job",
            request=SnapshotSerializer,
            responses={
                200: OpenApiResponse(
                    UpgradeJobSerializer, description="The same job: the key was replayed."
                ),
                201: UpgradeJobSerializer,
                409: error(
                    "`idempotency_key_reused`, `upgrade_in_progress`, `retry_required`, "
                    "`already_upgraded`."
                ),
                422: error("`unsupported_data_source`: only `upload_file` documents."),
            },
        ),
        get=extend_schema(
            summary="The tenant's upgrades, newest first (at most 100)",
            parameters=[
                NAMESPACE,
                OpenApiParameter("dataset_id", str, OpenApiParameter.QUERY),
                OpenApiParameter("status", str, OpenApiParameter.QUERY),
            ],
            responses={
                200: inline_serializer(
                    name="UpgradeList",
                    fields={
                        "results": UpgradeJobSerializer(many=True),
                        "discovery": serializers.JSONField(required=False),
                    },
                )
            },
        ),
    )
    annotate(
        upgrades + "UpgradeDetailView",
        get=extend_schema(
            summary="Read an upgrade",
            parameters=[NAMESPACE],
            responses={200: UpgradeJobSerializer},
        ),
    )
    for view, summary, codes in (
        (
            "UpgradeRetryView",
            "Retry a failed upgrade",
            "`upgrade_already_succeeded`, `upgrade_abandoned`.",
        ),
        (
            "UpgradeAbandonView",
            "Abandon a failed upgrade",
            "`upgrade_in_progress`, `upgrade_already_succeeded`.",
        ),
    ):
        annotate(
            upgrades + view,
            post=extend_schema(
                summary=summary,
                request=namespace_body,
                responses={
                    200: UpgradeJobSerializer,
                    202: UpgradeJobSerializer,
                    409: error(codes),
                },
            ),
        )
    annotate(
        upgrades + "FileLeaseView",
        get=extend_schema(
            summary="Whether an upgrade lease blocks deleting a legacy file's bytes",
            parameters=[NAMESPACE],
            responses={
                200: shape(
                    "The lease state.",
                    {
                        "upload_file_id": STRING,
                        "leased": BOOLEAN,
                        "expires_at": {"type": "string", "nullable": True},
                    },
                )
            },
        ),
    )
    cutover = "upgrades.cutover_api."
    cas = error("A stale `expected_phase` / `expected_cas_version`, or a refused step.")
    annotate(
        cutover + "LedgerView",
        get=extend_schema(summary="Read the workspace's cutover ledger", responses={200: LEDGER}),
        post=extend_schema(
            summary="Create the workspace's cutover ledger, or return it",
            request=None,
            responses={200: LEDGER, 201: LEDGER},
        ),
    )
    for view, summary, serializer in (
        ("AdvanceView", "One forward step of the cutover", AdvanceSerializer),
        ("RollbackView", "Roll the cutover back to frozen", RollbackSerializer),
        ("RecutoverView", "Cut a rolled-back workspace over again", RecutoverSerializer),
    ):
        annotate(
            cutover + view,
            post=extend_schema(
                summary=summary, request=serializer, responses={200: LEDGER, 409: cas}
            ),
        )


_spaces()
_documents()
_retrieval()
_internal()
