"""Changing a space's embedding model: the one intent, written once per runtime.

A Dify-served space replaces its embedding selection while nothing was indexed with it
(:func:`set_embedding_profile`, ``PUT …/embedding-profile``); a local space re-indexes onto
another registered model beside the live index (:func:`update_space_and_model` with
``embedding_model_id``, ``PATCH``; :func:`retrieval.index_versions.change_embedding_model`). Both
retire index versions under their locks: the space's row, then its profile's, then the live
index versions (the order of every writer; spaces/profiles.py). The spaces views and ``kfs``
call these (the roof); spaces itself never imports retrieval.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ingestion.models import KnowledgeNode
from knowledgefs.auth.principal import Principal
from knowledgefs.errors import Conflict
from knowledgefs.runtime import runtime_name
from spaces.models import KnowledgeSpace, Readiness, SpaceProfile
from spaces.profiles import locked_profile
from spaces.selection import (
    check_revision,
    embedding_selection,
    local_identity,
    parse_revision,
    parse_selection,
    vector_space_id,
)
from spaces.services import apply_space_update, get_space, space_fields

from .index_versions import change_embedding_model, model_change_needed, resolve_model
from .models import DenseVector, IndexState, IndexVersion

logger = logging.getLogger("knowledgefs.profiles")


def update_space_and_model(
    principal: Principal,
    space_id: uuid.UUID | str,
    *,
    changes: dict,
    expected_revision: int | None = None,
) -> KnowledgeSpace:
    """Apply ``changes`` (``name``, ``description``, ``slug``, ``embedding_model_id``) by
    compare-and-set on ``revision`` (:func:`spaces.services.apply_space_update`).

    ``embedding_model_id`` (registered, local runtime only: :func:`resolve_model`) starts a new
    index version built beside the live one (:func:`change_embedding_model`), inside the
    transaction that bumps the revision; the space's ``embedding_model_id`` changes when that
    version takes over. Asking for the model already in use changes nothing.
    """
    space = get_space(principal, space_id)
    fields = space_fields(changes)
    model_id = changes.get("embedding_model_id")
    model_change = False
    if model_id is not None:
        model_change = model_change_needed(space, model_id)
        if model_change:
            resolve_model(model_id, space.id)
    return apply_space_update(
        space,
        fields,
        expected_revision,
        also=(
            (lambda space: change_embedding_model(space, model_id))
            if model_id is not None and model_change
            else None
        ),
    )


def set_embedding_profile(
    principal: Principal,
    space_id: uuid.UUID | str,
    selection: Any,
    *,
    expected_revision: int | None = None,
) -> KnowledgeSpace:
    """Choose the space's embedding model ``{plugin_id, provider, model}``; returns the space.

    The same selection again changes nothing (also once frozen). Another selection is accepted
    while nothing was indexed with the current one: before the first document is admitted, and
    also after (the profile is frozen) as long as no node is published and no index version
    holds a vector (a mistyped model whose validation failed every document). It bumps the
    embedding profile's ``revision`` and clears what validation observed; under the local
    runtime the space is ``ready`` at once, under Dify ``pending-validation``; the space's empty
    index versions are retired (409 ``embedding_profile_frozen`` once the index holds vectors).
    """
    space = get_space(principal, space_id)
    expected_revision = parse_revision(expected_revision)
    chosen = parse_selection(selection, "embedding")
    now = timezone.now()
    with transaction.atomic():
        profile = locked_profile(space.id)
        check_revision(profile.embedding_revision, expected_revision, "embedding profile")
        if embedding_selection(profile) == chosen:
            return space  # the same selection again (frozen or not) changes nothing
        if profile.embedding_frozen_at is not None and _holds_vectors(space.id):
            raise _frozen(profile, space.id)
        fields: dict[str, Any] = {
            "embedding_plugin_id": chosen.plugin_id,
            "embedding_provider": chosen.provider,
            "embedding_model": chosen.model,
            "embedding_identity": "",
            "embedding_dimension": None,
            "vector_space_id": "",
            "embedding_revision": profile.embedding_revision + 1,
            "failure": None,
            "updated_at": now,
        }
        if chosen.is_local:
            fields.update(
                embedding_identity=chosen.model,
                vector_space_id=vector_space_id(chosen, local_identity(chosen.model)),
                state=Readiness.READY,
                validated_at=now,
            )
        else:
            fields.update(state=Readiness.PENDING_VALIDATION, validated_at=None, capabilities={})
        SpaceProfile.objects.filter(space_id=space.id).update(**fields)
        # Nothing was indexed with the previous selection: no index version holds a vector.
        IndexVersion.objects.filter(
            space_id=space.id, state__in=(IndexState.ACTIVE, IndexState.BUILDING)
        ).update(state=IndexState.RETIRED, retired_at=now, vectors_purged_at=now)
        KnowledgeSpace.objects.filter(id=space.id).update(
            embedding_model_id="", embedding_dimension=None, updated_at=now
        )
    logger.info("space %s: embedding profile set to %s", space.id, chosen)
    space.refresh_from_db()
    return space


def _holds_vectors(space_id: uuid.UUID) -> bool:
    """Whether anything was indexed with the space's embedding model: a published node, or a
    vector in any index version (a running compilation projected it). Locks the live index
    versions first (the rows a compilation's projection and a cutover lock), so a projection
    either committed before this check or finds its versions retired. Call inside the
    transaction, with the profile locked."""
    list(
        IndexVersion.objects.select_for_update()
        .filter(space_id=space_id, state__in=(IndexState.ACTIVE, IndexState.BUILDING))
        .values_list("id", flat=True)
    )
    published = KnowledgeNode.objects.filter(
        space_id=space_id, generation=F("document__active_generation")
    )
    return published.exists() or DenseVector.objects.filter(space_id=space_id).exists()


def _frozen(profile: SpaceProfile, space_id) -> Conflict:
    """409 ``embedding_profile_frozen`` for another selection of a space that holds vectors; the
    message names what works on this runtime."""
    assert profile.embedding_frozen_at is not None  # the caller checked the latch
    since = profile.embedding_frozen_at.isoformat()
    if runtime_name() == "local":
        way = (
            "to use another registered model, re-index the space with PATCH "
            f'/v1/knowledge-spaces/{space_id} {{"embedding_model_id": …}} (or kfs space '
            "set-model), which builds a new index version beside the live one and switches at "
            "its cutover"
        )
    else:
        way = (
            "re-indexing a space onto another Dify model is not supported yet: create a new "
            "space with that embedding profile and upload the documents there (while no node "
            "of this space is published, for instance when every document failed, the "
            "selection can still be replaced here)"
        )
    return Conflict(
        f"the embedding profile was frozen when the first document was admitted ({since}) and "
        f"the space's index holds vectors of this model; {way}",
        code="embedding_profile_frozen",
        details={"frozen_at": since},
    )
