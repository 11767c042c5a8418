"""Annotations of the internal upgrade and cutover routes (``upgrades.api.views``,
``upgrades.api.cutover``) for the OpenAPI document (:mod:`knowledgefs.openapi.common`)."""

from __future__ import annotations

from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers

from .common import (
    BOOLEAN,
    INTEGER,
    NAMESPACE_BODY,
    OBJECT,
    STRING,
    annotate,
    error,
    page_parameters,
    shape,
)

NAMESPACE = OpenApiParameter(
    "namespace_id", str, OpenApiParameter.QUERY, required=True, description="The tenant."
)
LEDGER = shape(
    "The workspace's cutover ledger with its `gate` (`open`, `code`, `reason`).",
    {"tenant_id": STRING, "phase": STRING, "cas_version": INTEGER, "gate": OBJECT},
)


def register() -> None:
    """Register the annotations of these routes (once: :func:`knowledgefs.openapi.register`)."""
    from upgrades.api.cutover import AdvanceSerializer, RecutoverSerializer, RollbackSerializer
    from upgrades.api.serializers import SnapshotSerializer, UpgradeJobSerializer

    upgrades = "upgrades.api.views."
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
            summary="A page of the tenant's upgrades, newest first (default and at most 100)",
            parameters=[
                NAMESPACE,
                OpenApiParameter("dataset_id", str, OpenApiParameter.QUERY),
                OpenApiParameter("status", str, OpenApiParameter.QUERY),
                *page_parameters(100),
            ],
            responses={
                200: inline_serializer(
                    name="UpgradeList",
                    fields={
                        "next": serializers.URLField(
                            allow_null=True, help_text="The next page, or null."
                        ),
                        "previous": serializers.URLField(
                            allow_null=True, help_text="The previous page, or null."
                        ),
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
                request=NAMESPACE_BODY,
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
    cutover = "upgrades.api.cutover."
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
