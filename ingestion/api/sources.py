"""REST views of sources (docs/datasources.md): thin wrappers over ``ingestion.sources``.

Every route names its source in the path and is one registered operation on the capability
resource ``source`` (or the space, for the space-wide listings)."""

from __future__ import annotations

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from ingestion.sources import services
from ingestion.sources.models import Source
from knowledgefs.auth.operations import WRITE_CALLERS, Operation, child, space_from
from knowledgefs.pagination import NewestFirstPagination
from spaces.services import get_space


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def source_body(source: Source) -> dict:
    """The public source: its connection is named by ``credential_id`` only."""
    return {
        "id": str(source.id),
        "space_id": str(source.space_id),
        "name": source.name,
        "kind": source.kind,
        "provider": source.provider,
        "datasource": source.datasource,
        "credential_id": source.credential_id,
        "parameters": source.parameters,
        "last_synced_at": _iso(source.last_synced_at),
        "created_at": source.created_at.isoformat(),
        "updated_at": source.updated_at.isoformat(),
    }


def source_of(request, space_id, source_id) -> Source:
    return services.get_source(get_space(request.user, space_id), source_id)


def _on_source(action: str, callers=None) -> Operation:
    binding = child("source", "source_id")
    return Operation(action, binding, callers) if callers else Operation(action, binding)


class SourceListView(APIView):
    operations = {
        "GET": Operation("sources.list", space_from()),
        "POST": Operation("sources.create", space_from(), WRITE_CALLERS),
    }

    def get(self, request, space_id):
        """The space's sources, newest first (paginated)."""
        space = get_space(request.user, space_id)
        paginator = NewestFirstPagination()
        page = paginator.paginate_queryset(services.sources_in(space), request, view=self)
        return paginator.get_paginated_response([source_body(s) for s in page])

    def post(self, request, space_id):
        """Create a source ``{name, kind, provider, datasource, credential_id, parameters?}``;
        201 with the source."""
        space = get_space(request.user, space_id)
        source = services.create_source(space, request.data)
        return Response(source_body(source), status=status.HTTP_201_CREATED)


class SourceDetailView(APIView):
    operations = {
        "GET": _on_source("sources.read"),
        "DELETE": _on_source("sources.delete", WRITE_CALLERS),
    }

    def get(self, request, space_id, source_id):
        return Response(source_body(source_of(request, space_id, source_id)))

    def delete(self, request, space_id, source_id):
        """Delete the source (``?documents=keep`` default, or ``cascade``); 204."""
        source = source_of(request, space_id, source_id)
        services.delete_source(source, documents=request.query_params.get("documents", "keep"))
        return Response(status=status.HTTP_204_NO_CONTENT)


class SourceTestView(APIView):
    operations = {"POST": _on_source("sources.test", WRITE_CALLERS)}

    def post(self, request, space_id, source_id):
        """Validate the connection through Dify: 200 ``{valid, code?, error?}``."""
        return Response(services.test_source(source_of(request, space_id, source_id)))
