"""REST views for knowledge spaces: thin wrappers over :mod:`spaces.services`."""

from __future__ import annotations

import json

from rest_framework import status
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from knowledgefs.idempotency import fingerprint, idempotent

from . import services
from .serializers import KnowledgeSpaceSerializer, SpaceCreateSerializer, SpaceUpdateSerializer


class NewestFirstPagination(CursorPagination):
    """Keyset pagination, newest first; ``?limit=`` up to 100 (default 20)."""

    page_size = 20
    page_size_query_param = "limit"
    max_page_size = 100
    ordering = ("-created_at", "-id")


class KnowledgeSpaceListView(APIView):
    def get(self, request):
        paginator = NewestFirstPagination()
        page = paginator.paginate_queryset(services.spaces_for(request.user), request, view=self)
        return paginator.get_paginated_response(KnowledgeSpaceSerializer(page, many=True).data)

    def post(self, request):
        body = SpaceCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)

        def create() -> Response:
            space = services.create_space(request.user, **body.validated_data)
            return Response(KnowledgeSpaceSerializer(space).data, status=status.HTTP_201_CREATED)

        request_fingerprint = fingerprint(
            "spaces.create", json.dumps(body.validated_data, sort_keys=True)
        )
        return idempotent(request, request_fingerprint, create)


class KnowledgeSpaceDetailView(APIView):
    def get(self, request, space_id):
        return Response(KnowledgeSpaceSerializer(services.get_space(request.user, space_id)).data)

    def patch(self, request, space_id):
        body = SpaceUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        changes = dict(body.validated_data)
        revision = changes.pop("revision", None)
        space = services.update_space(
            request.user, space_id, changes=changes, expected_revision=revision
        )
        return Response(KnowledgeSpaceSerializer(space).data)

    def delete(self, request, space_id):
        services.delete_space(request.user, space_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
