"""Internal routes of the upgrade bridge, for Dify only (``X-Inner-Api-Key``; docs/api.md).

The tenant is named by ``namespace_id`` (body for POST, query for GET): another tenant's
upgrade is 404 ``upgrade_not_found``, exactly like one that does not exist.
"""

from __future__ import annotations

from rest_framework import serializers, status
from rest_framework.response import Response

from knowledgefs.api import InternalView, internal
from knowledgefs.pagination import NewestFirstPagination
from upgrades.services import leases, snapshot

from .serializers import (
    ListQuerySerializer,
    NamespaceQuerySerializer,
    SnapshotSerializer,
    UpgradeJobSerializer,
)

LIST_LIMIT = 100
"""The list route's default and largest page (``?limit=``), newest first."""


def _valid(serializer_class, data) -> dict:
    body = serializer_class(data=data)
    body.is_valid(raise_exception=True)
    return body.validated_data


class UpgradeListView(InternalView):
    operations = {
        "POST": internal("internal.dataset_upgrades.create"),
        "GET": internal("internal.dataset_upgrades.list"),
    }

    def post(self, request):
        """Snapshot a Dataset: 201 with the new job, 200 with the same job on a replay."""
        job, created = snapshot.create_upgrade(_valid(SnapshotSerializer, request.data))
        return Response(
            UpgradeJobSerializer(job).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    def get(self, request):
        """A page of the tenant's upgrades (``?limit=`` 1..100, default 100; ``next``), newest
        first; with ``dataset_id`` also the discovery state of that Dataset."""
        query = _valid(ListQuerySerializer, request.query_params)
        jobs = snapshot.list_upgrades(
            query["namespace_id"], dataset_id=query.get("dataset_id"), status=query.get("status")
        )
        paginator = NewestFirstPagination(page_size=LIST_LIMIT)
        page = paginator.paginate_queryset(jobs, request, view=self)
        body = paginator.get_paginated_response(UpgradeJobSerializer(page, many=True).data).data
        if query.get("dataset_id"):
            body["discovery"] = snapshot.discovery(query["namespace_id"], query["dataset_id"])
        return Response(body)


class UpgradeDetailView(InternalView):
    operations = {"GET": internal("internal.dataset_upgrades.read")}

    def get(self, request, upgrade_id):
        """One upgrade: status, stage, counts, errors, space id."""
        query = _valid(NamespaceQuerySerializer, request.query_params)
        job = snapshot.get_upgrade(query["namespace_id"], upgrade_id)
        return Response(UpgradeJobSerializer(job).data)


class UpgradeRetryView(InternalView):
    operations = {"POST": internal("internal.dataset_upgrades.retry")}

    def post(self, request, upgrade_id):
        """Retry a failed upgrade (202 when re-queued, 200 when it was active and is returned
        unchanged); 409 ``upgrade_already_succeeded``."""
        body = _valid(NamespaceQuerySerializer, request.data)
        job, retried = snapshot.retry_upgrade(upgrade_id, tenant_id=body["namespace_id"])
        return Response(
            UpgradeJobSerializer(job).data,
            status=status.HTTP_202_ACCEPTED if retried else status.HTTP_200_OK,
        )


class UpgradeAbandonView(InternalView):
    operations = {"POST": internal("internal.dataset_upgrades.abandon")}

    def post(self, request, upgrade_id):
        """Abandon a failed upgrade (200 with the job, ``last_error_code`` ``upgrade_abandoned``)
        so the Dataset can be snapshotted again; 409 ``upgrade_in_progress`` /
        ``upgrade_already_succeeded``."""
        body = _valid(NamespaceQuerySerializer, request.data)
        job, _ = snapshot.abandon_upgrade(upgrade_id, tenant_id=body["namespace_id"])
        return Response(UpgradeJobSerializer(job).data)


class FileLeaseView(InternalView):
    operations = {"GET": internal("internal.upgrade_file_leases.read")}

    def get(self, request, upload_file_id):
        """Whether a live upgrade lease blocks deleting the legacy file's bytes."""
        query = _valid(NamespaceQuerySerializer, request.query_params)
        # printable: a NUL or another control character is no file id (and PostgreSQL text
        # cannot hold U+0000: it was a 500)
        if not 1 <= len(upload_file_id) <= 64 or not upload_file_id.isprintable():
            raise serializers.ValidationError(
                {"upload_file_id": ["must be 1-64 printable characters"]}
            )
        from spaces.services import validate_tenant_id

        tenant = validate_tenant_id(query["namespace_id"])
        return Response(leases.reserve_file_cleanup(tenant, upload_file_id))
