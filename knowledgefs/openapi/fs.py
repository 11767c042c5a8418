"""Annotations of the knowledge filesystem routes (``retrieval.api.fs``; docs/filesystem.md)
for the OpenAPI document (:mod:`knowledgefs.openapi.common`)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema

from .common import BOOLEAN, INTEGER, OBJECT, STRING, annotate, body, error, shape

ITEMS = {"type": "array", "items": OBJECT}
PAGE = {"path": STRING, "items": ITEMS, "truncated": BOOLEAN, "nextCursor": STRING}
BAD = error(
    "`invalid_path`, `path_too_long`, `invalid_limit`, `invalid_cursor`, `invalid_depth`, "
    "`invalid_query`, `query_too_long`, `invalid_timeout`, `invalid_metadata_filter`, "
    "`invalid_filter_value`, `invalid_resource_type`, `fs_is_directory`, `invalid_diff_mode`, "
    "`diff_too_large`, `invalid_node_id`, `invalid_request`."
)
MISSING = error("`space_not_found`, `fs_path_not_found`, `node_not_found`.")
BUDGET = error("`fs_scan_budget_exhausted` (find), `fs_grep_deadline_exceeded` (grep).")


def q(name: str, description: str, kind: type | OpenApiTypes = str) -> OpenApiParameter:
    return OpenApiParameter(name, kind, OpenApiParameter.QUERY, description=description)


PATH = q("path", "A path under /knowledge (at most 384 characters, no `.`/`..`/`//`).")
LIMIT = q("limit", "Required page size, 1..100.", OpenApiTypes.INT)
CURSOR = q("cursor", "The `nextCursor` of the same listing; any other: 400 `invalid_cursor`.")

ROUTES: dict[str, tuple[str, list[OpenApiParameter], dict[str, Any] | None]] = {
    "FsLsView": ("List a directory of the knowledge filesystem", [PATH, LIMIT, CURSOR], PAGE),
    "FsTreeView": (
        "Entries below a path, depth first",
        [PATH, LIMIT, CURSOR, q("depth", "1..8 (default 2).", OpenApiTypes.INT)],
        {**PAGE, "root": OBJECT, "depth": INTEGER},
    ),
    "FsCatView": (
        "A file's rendered content, paged by characters",
        [PATH, q("limit", "Characters per page, 1..65536 (default 16384).", OpenApiTypes.INT),
         CURSOR],
        {"path": STRING, "contentType": STRING, "text": STRING, "offset": INTEGER,
         "totalChars": INTEGER, "truncated": BOOLEAN, "nextCursor": STRING},
    ),
    "FsStatView": (
        "Metadata of a path",
        [PATH],
        {"path": STRING, "kind": STRING, "resourceType": STRING, "targetId": STRING,
         "version": STRING, "sha256": STRING, "sizeBytes": INTEGER, "contentType": STRING,
         "parserStatus": OBJECT, "metadata": OBJECT},
    ),
    "FsGrepView": (
        "Case-insensitive substring search with snippets and offsets",
        [q("q", "1..4000 characters."), PATH, LIMIT, CURSOR,
         q("timeoutMs", "Deadline, 1..10000 ms (default 10000).", OpenApiTypes.INT)],
        {"path": STRING, "matches": ITEMS, "truncated": BOOLEAN, "nextCursor": STRING,
         "scan": OBJECT, "tookMs": {"type": "number"}},
    ),
    "FsFindView": (
        "Entries below a path by name, document metadata and resource type",
        [PATH, LIMIT, CURSOR, q("nameContains", "At most 240 characters."),
         q("metadataKey", "At most 120 characters; with metadataValue."),
         q("metadataValue", "At most 4000 characters; with metadataKey."),
         q("resourceType", "document, folder, outline, section, table, figure, page, ...")],
        PAGE,
    ),
    "FsDiffView": (
        "Line or word differences between two files",
        [q("oldPath", "A file path."), q("newPath", "A file path."),
         q("mode", "line (default) or word.")],
        {"mode": STRING, "oldPath": STRING, "newPath": STRING, "operations": ITEMS,
         "stats": OBJECT, "truncated": BOOLEAN},
    ),
    "FsOpenNodeView": (
        "A node and its citation as retrieval gives it",
        [q("node_id", "The node id (also `nodeId`)."), q("nodeId", "Alias of node_id.")],
        {"citation": OBJECT, "node": OBJECT},
    ),
}  # fmt: skip
COMMAND = body(
    "A safe shell command: one filesystem command, then up to four of head, tail, wc, jq.",
    {"command": {"type": "string", "minLength": 1, "maxLength": 4000}},
    ("command",),
)
SHELL_BAD = error(
    "`shell_syntax_refused`, `shell_unterminated_quote`, `shell_empty_step`, "
    "`shell_too_many_steps`, `shell_command_not_allowed`, `shell_invalid_argument`, "
    "`invalid_command`, `command_too_long`, and the filesystem codes of the first step."
)


def register() -> None:
    """Register the annotations of these routes (once: :func:`knowledgefs.openapi.register`)."""
    for name, (summary, parameters, members) in ROUTES.items():
        annotate(
            f"retrieval.api.fs.{name}",
            get=extend_schema(
                summary=summary,
                parameters=parameters,
                responses={
                    200: shape(summary + ".", members),
                    400: BAD,
                    404: MISSING,
                    503: BUDGET,
                },
            ),
        )
    annotate(
        "retrieval.api.fs.ShellPlanView",
        post=extend_schema(
            summary="Plan a safe shell command",
            request=COMMAND,
            responses={
                200: shape("The steps.", {"command": STRING, "steps": ITEMS}),
                400: SHELL_BAD,
            },
        ),
    )
    annotate(
        "retrieval.api.fs.ShellExecuteView",
        post=extend_schema(
            summary="Run a safe shell command",
            request=COMMAND,
            responses={
                200: shape(
                    "The output (at most 128 KiB).",
                    {"output": STRING, "plan": OBJECT, "truncated": BOOLEAN},
                ),
                400: SHELL_BAD,
                404: MISSING,
                503: BUDGET,
            },
        ),
    )
