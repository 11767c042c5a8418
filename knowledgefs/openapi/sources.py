"""Annotations of the datasource source routes (``ingestion.api.sources``) for the OpenAPI
document (:mod:`knowledgefs.openapi.common`; docs/datasources.md)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema

from .common import BOOLEAN, INTEGER, OBJECT, STRING, annotate, body, error, page, page_parameters
from .common import shape as _shape

SOURCE = _shape(
    "A source: `id`, `space_id`, `name`, `kind`, `provider`, `datasource`, `credential_id`, "
    "`parameters`, `last_synced_at`, `created_at`, `updated_at`."
)
RUN = _shape(
    "A source run: `id`, `source_id`, `kind` (import, sync, crawl-preview, crawl-import), "
    "`trigger`, `state` (queued, running, completed, failed, canceled), `checkpoint`, "
    "`progress_total`, "
    "`progress_completed`, `progress_skipped`, `progress_failed`, `execution_attempts`, "
    "`max_execution_attempts`, `retry_at`, `error_code`, `error_message`, timestamps."
)
POLICY = _shape(
    "A sync policy: `mode`, `enabled`, `custom_interval_seconds`, `interval_seconds`, "
    "`next_run_at`, `last_synced_at`, `revision`."
)
KEY = OpenApiParameter(
    "Idempotency-Key", str, OpenApiParameter.HEADER,
    description="The same key and request answer the first response again.",
)  # fmt: skip
DIFY = "`datasource_unavailable` (retry later), `datasources_unavailable` (not configured)."


def _query(name: str, description: str, kind: type = str) -> OpenApiParameter:
    return OpenApiParameter(name, kind, OpenApiParameter.QUERY, description=description)


def register() -> None:
    """Register the annotations of these routes (once: :func:`knowledgefs.openapi.register`)."""
    p = "ingestion.api.sources."
    annotate(
        p + "SourceListView",
        get=extend_schema(
            summary="The space's sources", parameters=page_parameters(50),
            responses={200: page("SourcePage", "Sources.")},
        ),
        post=extend_schema(
            summary="Create a source",
            request=body(
                "A Dify datasource connection, by `credential_id` only (never a secret).",
                {"name": STRING, "kind": {"type": "string",
                 "enum": ["website", "online_document", "online_drive"]},
                 "provider": STRING, "datasource": STRING, "credential_id": STRING,
                 "parameters": OBJECT},
                ("name", "kind", "provider", "datasource", "credential_id"),
            ),
            responses={201: SOURCE, 400: error(
                "`invalid_source`, `invalid_provider`, `invalid_credential_id`, "
                "`credential_in_parameters`, `source_target_refused`."
            )},
        ),
    )  # fmt: skip
    annotate(
        p + "SourceDetailView",
        get=extend_schema(summary="Read a source", responses={200: SOURCE}),
        delete=extend_schema(
            summary="Delete a source",
            parameters=[_query("documents", "`keep` (default) or `cascade`.")],
            responses={204: None, 409: error("`source_run_active`.")},
        ),
    )
    annotate(
        p + "SourceTestView",
        post=extend_schema(
            summary="Validate the source's connection through Dify",
            request=None,
            responses={
                200: _shape("`{valid, code?, error?}`.", {"valid": BOOLEAN}),
                403: error("`source_credential_forbidden`."),
                503: error(DIFY),
            },
        ),
    )
    annotate(
        p + "SourcePagesView",
        get=extend_schema(
            summary="Online-document pages (a website: POST …/crawl-preview)",
            parameters=[_query("cursor", "From the previous page's `next_cursor`."),
                        _query("limit", "1-200 (50).", int)],
            responses={200: _shape("`{workspaces|pages, total, next_cursor}`."),
                       400: error("`source_kind_mismatch`, `invalid_limit`, `invalid_cursor`."),
                       403: error("`source_credential_forbidden`."), 503: error(DIFY)},
        ),
    )  # fmt: skip
    annotate(
        p + "SourceFilesView",
        get=extend_schema(
            summary="A drive listing",
            parameters=[_query("bucket", "The bucket."), _query("prefix", "A key prefix."),
                        _query("max_keys", "1-1000 (100).", int),
                        _query("continuation_token", "From a truncated page.")],
            responses={200: _shape("`{buckets: [{bucket, files, is_truncated, "
                                   "continuation_token}]}`."),
                       400: error("`source_kind_mismatch`, `invalid_limit`, `invalid_cursor`."),
                       403: error("`source_credential_forbidden`."), 503: error(DIFY)},
        ),
    )  # fmt: skip
    annotate(
        p + "SourceImportView",
        post=extend_schema(
            summary="Import 1-200 provider items (a website: a crawl preview's selection)",
            parameters=[KEY],
            request=body("The items, by the source's kind; a website `{preview_run_id, urls}`.",
                         {"items": {"type": "array", "items": OBJECT},
                          "preview_run_id": STRING,
                          "urls": {"type": "array", "items": STRING}}, ()),
            responses={202: RUN, 400: error("`invalid_items`, `too_many_items`, "
                                            "`crawl_preview_required`, "
                                            "`source_selection_not_in_preview`."),
                       404: error("`source_run_not_found`."),
                       409: error("`source_run_active`, `source_preview_not_completed`.")},
        ),
    )  # fmt: skip
    annotate(
        p + "SourceCrawlPreviewView",
        post=extend_schema(
            summary="Crawl a website source as a durable crawl-preview run",
            parameters=[KEY], request=None,
            responses={202: RUN, 400: error("`source_kind_mismatch`."),
                       409: error("`source_run_active`.")},
        ),
    )  # fmt: skip
    annotate(
        p + "SourceSyncView",
        post=extend_schema(
            summary="Sync the source now", parameters=[KEY], request=None,
            responses={202: RUN, 409: error("`source_run_active`.")},
        ),
    )  # fmt: skip
    annotate(
        p + "SourceRunListView",
        get=extend_schema(
            summary="The space's source runs",
            parameters=[_query("source_id", "Only this source's runs."), *page_parameters(50)],
            responses={200: page("SourceRunPage", "Source runs.")},
        ),
    )
    annotate(
        p + "SourceRunDetailView",
        get=extend_schema(
            summary="Read a source run (a crawl preview: its listed pages)",
            parameters=[_query("cursor", "A crawl preview's `next_cursor`."),
                        _query("limit", "1-200 (50).", int)],
            responses={200: RUN},
        ),
    )  # fmt: skip
    annotate(
        p + "SourceRunCancelView",
        post=extend_schema(summary="Cancel a source run", request=None,
                           responses={200: RUN, 409: error("`source_run_finished`.")}),
    )  # fmt: skip
    annotate(
        p + "SourceRunRetryView",
        post=extend_schema(summary="Retry a failed or canceled source run", request=None,
                           responses={202: RUN, 409: error("`source_run_not_retryable`, "
                                                           "`source_run_active`.")}),
    )  # fmt: skip
    annotate(
        p + "SourceSyncPolicyView",
        get=extend_schema(summary="Read the sync policy", responses={200: POLICY}),
        put=extend_schema(
            summary="Replace the sync policy (compare-and-set)",
            request=body("The policy.", {"mode": {"type": "string",
                         "enum": ["manual", "interval", "custom"]}, "enabled": BOOLEAN,
                         "custom_interval_seconds": {"type": "integer", "minimum": 3600,
                                                     "maximum": 2592000},
                         "expected_revision": INTEGER}, ("mode", "enabled", "expected_revision")),
            responses={200: POLICY, 400: error("`invalid_sync_policy`."),
                       409: error("`revision_conflict`.")},
        ),
    )  # fmt: skip
    annotate(
        p + "SourceBulkView",
        post=extend_schema(
            summary="One action over up to 200 sources, as a durable bulk run",
            parameters=[KEY],
            request=body("The action and the sources.", {"action": {"type": "string",
                         "enum": ["sync", "disable", "remove"]},
                         "source_ids": {"type": "array", "items": STRING}},
                         ("action", "source_ids")),
            responses={202: _shape("A bulk run with `results: [{source_id, state, run_id?, "
                                   "code?, message?}]`."),
                       400: error("`invalid_request`, `too_many_items`.")},
        ),
    )  # fmt: skip
    annotate(
        p + "SpaceSourceRunDetailView",
        get=extend_schema(summary="Read any source run of the space (a bulk run: its results)",
                          responses={200: RUN}),
    )  # fmt: skip
    annotate(
        p + "SpaceSourceRunCancelView",
        post=extend_schema(summary="Cancel a source run of the space", request=None,
                           responses={200: RUN, 409: error("`source_run_finished`.")}),
    )  # fmt: skip
    annotate(
        p + "SpaceSourceRunRetryView",
        post=extend_schema(summary="Retry a failed or canceled source run of the space",
                           request=None,
                           responses={202: RUN, 409: error("`source_run_not_retryable`, "
                                                           "`source_run_active`.")}),
    )  # fmt: skip
