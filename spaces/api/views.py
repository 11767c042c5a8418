"""REST views for knowledge spaces: thin wrappers over :mod:`spaces.services`."""

from __future__ import annotations

import json

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from knowledgefs.auth.operations import ADMIN_CALLERS, Operation, namespace_wide, space_from
from knowledgefs.errors import InvalidInput
from knowledgefs.idempotency import fingerprint, idempotent
from knowledgefs.pagination import NewestFirstPagination
from retrieval import embedding_profile
from spaces import preflight, profiles, services

from .serializers import KnowledgeSpaceSerializer, SpaceCreateSerializer, SpaceUpdateSerializer


class KnowledgeSpaceListView(APIView):
    operations = {
        "GET": Operation("knowledge_spaces.list", namespace_wide()),
        "POST": Operation("knowledge_spaces.create", namespace_wide(), ADMIN_CALLERS),
    }

    def get(self, request):
        paginator = NewestFirstPagination()
        spaces = (
            services.spaces_for(request.user)
            .select_related("profile")
            .prefetch_related("index_versions")
        )
        page = paginator.paginate_queryset(spaces, request, view=self)
        return paginator.get_paginated_response(KnowledgeSpaceSerializer(page, many=True).data)

    def post(self, request):
        services.ensure_can_create_spaces(request.user)
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
    operations = {
        "GET": Operation("knowledge_spaces.read", space_from()),
        "PATCH": Operation("knowledge_spaces.update", space_from(), ADMIN_CALLERS),
        "DELETE": Operation("knowledge_spaces.delete", space_from(), ADMIN_CALLERS),
    }

    def get(self, request, space_id):
        return Response(KnowledgeSpaceSerializer(services.get_space(request.user, space_id)).data)

    def patch(self, request, space_id):
        body = SpaceUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        changes = dict(body.validated_data)
        revision = changes.pop("revision", None)
        space = embedding_profile.update_space_and_model(
            request.user, space_id, changes=changes, expected_revision=revision
        )
        data = KnowledgeSpaceSerializer(space).data
        # A model change is accepted, not done: the new index builds beside the live one.
        building = data["index"]["building"]
        accepted = building is not None and building["model_id"] == changes.get(
            "embedding_model_id"
        )
        return Response(data, status=status.HTTP_202_ACCEPTED if accepted else status.HTTP_200_OK)

    def delete(self, request, space_id):
        services.delete_space(request.user, space_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


def _body(request) -> dict:
    if not hasattr(request.data, "get"):
        raise InvalidInput("the body must be a JSON object", code="invalid_request")
    return dict(request.data)


class EmbeddingProfileView(APIView):
    """``PUT /v1/knowledge-spaces/{id}/embedding-profile`` ``{"plugin_id", "provider", "model",
    "revision"?}`` → 200 with the space (:func:`spaces.profiles.set_embedding_profile`)."""

    operations = {
        "PUT": Operation("knowledge_spaces.update_embedding_profile", space_from(), ADMIN_CALLERS),
    }

    def put(self, request, space_id):
        services.get_space(request.user, space_id)  # 404 before any 400
        body = _body(request)
        revision = body.pop("revision", None)
        space = embedding_profile.set_embedding_profile(
            request.user, space_id, body, expected_revision=revision
        )
        return Response(KnowledgeSpaceSerializer(space).data)


class RetrievalProfileView(APIView):
    """``PUT /v1/knowledge-spaces/{id}/retrieval-profile`` ``{"default_mode", "reasoning_model",
    "rerank", "score_threshold", "top_k", "revision"?}`` → 200 with the space
    (:func:`spaces.profiles.set_retrieval_profile`)."""

    operations = {
        "PUT": Operation("knowledge_spaces.update_retrieval_profile", space_from(), ADMIN_CALLERS),
    }

    def put(self, request, space_id):
        services.get_space(request.user, space_id)
        body = _body(request)
        revision = body.pop("revision", None)
        space = profiles.set_retrieval_profile(
            request.user, space_id, body, expected_revision=revision
        )
        return Response(KnowledgeSpaceSerializer(space).data)


class ProfileValidationView(APIView):
    """``POST /v1/knowledge-spaces/{id}/profile-validation`` → 200 with the space and its
    readiness as recorded by the preflight (:func:`spaces.profiles.validate_space`)."""

    operations = {
        "POST": Operation("knowledge_spaces.validate_profiles", space_from(), ADMIN_CALLERS),
    }

    def post(self, request, space_id):
        space = preflight.validate_space(request.user, space_id)
        return Response(KnowledgeSpaceSerializer(space).data)
