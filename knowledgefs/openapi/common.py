"""The shared pieces of the route annotations of the OpenAPI document: parameters (idempotency,
``If-Match``/``ETag``, pagination), response and body builders, raw schema fragments, and
:func:`annotate`, which registers one view's annotations by dotted path.

The views read most bodies by hand (services validate them and name the refused field), so
drf-spectacular cannot infer them. Each view is annotated by dotted path with an
:class:`~drf_spectacular.extensions.OpenApiViewExtension`, one module per route family
(``spaces``, ``documents``, ``retrieval``, ``research_tasks``, ``internal``, ``upgrades``): the view
modules stay free of schema code. Shapes follow the services' docstrings and docs/api.md; a route
added to knowledgefs/urls.py without an annotation fails ``spectacular --fail-on-warn``
(tests/system/test_openapi.py).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiViewExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import serializers

from .schema import ErrorEnvelopeSerializer

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
                "The opaque cursor of a `next` or `previous` link of this listing: a keyset "
                "position (`created_at`, `id`) signed by the server and bound to this route, "
                "its path, its other query parameters (filters) and the caller's tenant. Pass "
                "it back unchanged with the same filters (`limit` may change). A changed, "
                "forged or foreign cursor (another listing, space, filter or tenant): 400 "
                "`invalid_cursor`."
            ),
        ),
    ]


def page(name: str, item: Any) -> serializers.Serializer[Any]:
    """A page ``{next, previous, results: [item]}`` (knowledgefs.pagination)."""
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


def body(description: str, properties: dict[str, Any], required: tuple[str, ...] = ()) -> Schema:
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

    def view_replacement(self: OpenApiViewExtension) -> type:
        view = self.target_class
        assert isinstance(view, type)  # resolved from the dotted path by drf-spectacular
        members = {"__doc__": view.__doc__, "__module__": view.__module__}
        fixed = type(view.__name__, (view,), members)
        return extend_schema_view(**methods)(fixed)

    name = "Annotate" + target.replace(".", "_")
    members = {"target_class": target, "view_replacement": view_replacement}
    type(name, (OpenApiViewExtension,), members)


Schema = dict[str, Any]

STRING: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
NUMBER: Schema = {"type": "number"}
BOOLEAN: Schema = {"type": "boolean"}
SELECTION: Schema = {
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
NOT_QUERYABLE = (
    "`space_setup_required`, `space_pending_validation`, `space_validation_failed`, "
    "`space_reconciliation_pending`."
)
NAMESPACE_BODY = body("The tenant.", {"namespace_id": STRING}, ("namespace_id",))
