"""Space profiles: the row that says which models a space uses, and the writes to it.

Every space has one :class:`~spaces.models.SpaceProfile` row (created with the space):

- the **embedding profile**: a selection ``{plugin_id, provider, model}`` (:mod:`spaces.selection`)
  and what validation observed (the install identity, the dimension, the vector space id). It is
  frozen by the first document admitted (:func:`freeze_for_admission`); while nothing was
  indexed with it the selection can still be replaced, after that a local space needs a new
  index version (:mod:`retrieval.embedding_profile`) and a Dify space cannot change its model
  yet (docs/architecture.md, "Space profiles");
- the **retrieval profile**: default mode, reasoning model, rerank, score threshold, top_k;
- the **readiness** ``setup-required | pending-validation | validation-failed | ready``, set by
  the preflight (:mod:`spaces.preflight`) and checked by :mod:`spaces.readiness`.

Under ``KNOWLEDGE_MODEL_RUNTIME=local`` (the embedded default) a new space gets the local profile
(``plugin_id`` and ``provider`` ``"local"``, ``model`` a registered model id, by default
:func:`~knowledgefs.runtime.default_model_id`: bge-small-en-v1.5 unless
``KNOWLEDGE_DEFAULT_EMBEDDING_MODEL`` names another) and is ``ready`` at once; under ``dify`` it is
``setup-required`` until an embedding selection is set, then ``pending-validation``. Index
bookkeeping calls in from retrieval (:func:`index_model_for`, :func:`adopt_registered_model`,
:func:`follow_cutover`); where the index must follow the profile, spaces sends
``spaces.signals.embedding_profile_ready``.

Writers take the space's row lock, then the profile's (the same order everywhere).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone

from knowledgefs.auth.principal import Principal
from knowledgefs.db import lock_for_update
from knowledgefs.errors import Conflict
from knowledgefs.runtime import (
    LOCAL_PLUGIN_ID,
    EmbeddingModel,
    UnknownEmbeddingModel,
    dify_embedding_model,
    get_embedding_model,
    runtime_name,
    uses_dify,
)

from . import signals
from .models import KnowledgeSpace, Readiness, SpaceProfile
from .selection import (
    Selection,
    check_revision,
    embedding_selection,
    local_identity,
    local_selection,
    parse_retrieval_profile,
    parse_revision,
    vector_space_id,
)

logger = logging.getLogger("knowledgefs.profiles")


class SpaceNotReady(Conflict):
    """409: the space's readiness does not allow this (``code`` names the state, or the
    recorded failure for a job); ``retryable`` says whether waiting may help."""

    def __init__(self, message: str, *, code: str, retryable: bool = False, details=None) -> None:
        super().__init__(message, code=code, details=details)
        self.retryable = retryable


# --- creation and reading -------------------------------------------------------------------


def initial_fields() -> dict:
    """The profile of a new space: local and ``ready`` under the local runtime, else empty and
    ``setup-required``."""
    if runtime_name() == "local":
        selection = local_selection()
        return {
            "embedding_plugin_id": selection.plugin_id,
            "embedding_provider": selection.provider,
            "embedding_model": selection.model,
            "embedding_identity": selection.model,
            "vector_space_id": vector_space_id(selection, local_identity(selection.model)),
            "state": Readiness.READY,
            "validated_at": timezone.now(),
        }
    return {"state": Readiness.SETUP_REQUIRED}


def create_profile(space: KnowledgeSpace) -> SpaceProfile:
    """Create the profile row of a new space (called when the space row is inserted)."""
    return SpaceProfile.objects.create(space=space, **initial_fields())


def profile_of(space: KnowledgeSpace | uuid.UUID | str) -> SpaceProfile:
    """The space's profile (one created with the initial fields if the row is missing)."""
    space_id = uuid.UUID(str(getattr(space, "pk", space)))
    profile = SpaceProfile.objects.filter(space_id=space_id).first()
    if profile is None:
        profile, _ = SpaceProfile.objects.get_or_create(
            space_id=space_id, defaults=initial_fields()
        )
    return profile


def locked_profile(space_id: uuid.UUID) -> SpaceProfile:
    """Lock the space row, then its profile row; call inside a transaction."""
    if not lock_for_update(KnowledgeSpace.objects.filter(id=space_id)).exists():
        raise KnowledgeSpace.DoesNotExist(f"knowledge space {space_id} is gone")
    profile = lock_for_update(SpaceProfile.objects.filter(space_id=space_id)).first()
    if profile is None:
        profile, _ = SpaceProfile.objects.get_or_create(
            space_id=space_id, defaults=initial_fields()
        )
    return profile


def describe(profile: SpaceProfile) -> dict:
    """``{"readiness", "embedding_profile", "retrieval_profile"}`` for the API and the CLI:

    - ``readiness``: ``{state, failure: {code, message, field, retryable, failed_at} | null,
      validated_at}``;
    - ``embedding_profile``: ``{plugin_id, provider, model, model_identity, dimension,
      vector_space_id, revision, frozen_at}`` (selection fields null while setup is required);
    - ``retrieval_profile``: ``{default_mode, reasoning_model, rerank: {enabled, model},
      score_threshold, top_k, revision}``;
    - ``capabilities``: what the frozen profiles allow with images
      (:func:`spaces.capabilities.describe_capabilities`).
    """
    from .capabilities import describe_capabilities

    def iso(value):
        return value.isoformat() if value else None

    selected = bool(profile.embedding_plugin_id)
    return {
        "readiness": {
            "state": profile.state,
            "failure": profile.failure,
            "validated_at": iso(profile.validated_at),
        },
        "embedding_profile": {
            "plugin_id": profile.embedding_plugin_id if selected else None,
            "provider": profile.embedding_provider if selected else None,
            "model": profile.embedding_model if selected else None,
            "model_identity": profile.embedding_identity or None,
            "dimension": profile.embedding_dimension,
            "vector_space_id": profile.vector_space_id or None,
            "revision": profile.embedding_revision,
            "frozen_at": iso(profile.embedding_frozen_at),
        },
        "retrieval_profile": {
            "default_mode": profile.retrieval_default_mode,
            "reasoning_model": profile.retrieval_reasoning_model,
            "rerank": {
                "enabled": profile.retrieval_rerank_enabled,
                "model": profile.retrieval_rerank_model,
            },
            "score_threshold": profile.retrieval_score_threshold,
            "top_k": profile.retrieval_top_k,
            "revision": profile.retrieval_revision,
        },
        "capabilities": describe_capabilities(profile),
    }


# --- changing profiles ----------------------------------------------------------------------


def _required_models(fields: dict) -> dict[str, Selection | None]:
    """The models the retrieval fields require (``None``: a value that is not a selection)."""
    required: dict[str, Selection | None] = {}
    if fields.get("retrieval_rerank_enabled") and fields.get("retrieval_rerank_model"):
        required["rerank"] = Selection.of(fields["retrieval_rerank_model"])
    if fields.get("retrieval_reasoning_model"):
        required["reasoning"] = Selection.of(fields["retrieval_reasoning_model"])
    return required


def set_retrieval_profile(
    principal: Principal,
    space_id: uuid.UUID | str,
    body: Any,
    *,
    expected_revision: int | None = None,
) -> KnowledgeSpace:
    """Replace the space's retrieval profile (see :func:`parse_retrieval_profile` for members,
    defaults and rules); returns the space.

    A change bumps the retrieval profile's ``revision``; the same profile again changes
    nothing. Selecting a rerank or reasoning model that was not validated yet makes a space that
    has its embedding selection ``pending-validation`` (run the preflight: ``POST
    …/profile-validation``); removing the model whose validation failed does the same. With
    ``expected_revision`` the write applies only at that revision (compare-and-set).
    """
    from .services import get_space

    space = get_space(principal, space_id)
    expected_revision = parse_revision(expected_revision)
    fields = parse_retrieval_profile(body)
    with transaction.atomic():
        profile = locked_profile(space.id)
        check_revision(profile.retrieval_revision, expected_revision, "retrieval profile")
        current = {name: getattr(profile, name) for name in fields}
        if current == fields:
            return space
        before, after = _required_models(current), _required_models(fields)
        changes: dict[str, Any] = {
            **fields,
            "retrieval_revision": profile.retrieval_revision + 1,
            "updated_at": timezone.now(),
        }
        added = {k for k, v in after.items() if before.get(k) != v}
        removed = set(before) - set(after)
        failed_field = (profile.failure or {}).get("field")
        if profile.state != Readiness.SETUP_REQUIRED and (
            added or (profile.state == Readiness.VALIDATION_FAILED and failed_field in removed)
        ):
            changes.update(state=Readiness.PENDING_VALIDATION, failure=None)
        SpaceProfile.objects.filter(space_id=space.id).update(**changes)
    space.refresh_from_db()
    return space


# --- admission and the first index ------------------------------------------------------------


def not_ready(profile: SpaceProfile, space_id) -> SpaceNotReady:
    """The 409 for a profile that is not ``ready``, its ``code`` naming the state."""
    state = profile.state
    failure = profile.failure or {}
    if state == Readiness.SETUP_REQUIRED:
        return SpaceNotReady(
            "the knowledge space has no embedding profile yet (setup-required): choose its "
            f"embedding model with PUT /v1/knowledge-spaces/{space_id}/embedding-profile",
            code="space_setup_required",
            details={"state": state},
        )
    if state == Readiness.VALIDATION_FAILED:
        return SpaceNotReady(
            f"the knowledge space's profile failed validation ({failure.get('code')}: "
            f"{failure.get('message')}); fix the {failure.get('field') or 'profile'} model and "
            f"validate again with POST /v1/knowledge-spaces/{space_id}/profile-validation",
            code="space_validation_failed",
            details={"state": state, "failure": profile.failure},
        )
    return SpaceNotReady(
        "the knowledge space's profile is not validated yet (pending-validation): its first "
        "compilation validates it, or validate it now with POST "
        f"/v1/knowledge-spaces/{space_id}/profile-validation",
        code="space_pending_validation",
        retryable=True,
        details={"state": state, "failure": profile.failure},
    )


def freeze_for_admission(space: KnowledgeSpace) -> SpaceProfile:
    """Admission's check and latch; call before a document is stored.

    Refuses (409 :class:`SpaceNotReady`) a space that is ``setup-required`` or
    ``validation-failed``. Otherwise sets
    ``embedding_frozen_at`` if it is not set yet (a latch in its own commit: it stays set even
    if this upload then fails) and, when the profile is ``ready``, makes sure the space has its
    active index version. A ``pending-validation`` space is admitted too: its first compilation
    runs the preflight and creates the index version.
    """
    profile = profile_of(space)
    if profile.state in (Readiness.SETUP_REQUIRED, Readiness.VALIDATION_FAILED):
        raise not_ready(profile, space.id)
    if profile.embedding_frozen_at is None:
        # Under the profile's row lock, so a concurrent PUT of the embedding profile either
        # committed first (and is checked here) or sees the latch.
        with transaction.atomic():
            locked = lock_for_update(SpaceProfile.objects.filter(space_id=space.id)).first()
            assert locked is not None  # profile_of created it; it goes only with its space
            profile = locked
            if profile.state in (Readiness.SETUP_REQUIRED, Readiness.VALIDATION_FAILED):
                raise not_ready(profile, space.id)
            if profile.embedding_frozen_at is None:
                profile.embedding_frozen_at = timezone.now()
                SpaceProfile.objects.filter(space_id=space.id).update(
                    embedding_frozen_at=profile.embedding_frozen_at
                )
    if profile.state == Readiness.READY:
        # retrieval: the space's active index version (created by the first admission)
        signals.embedding_profile_ready.send(sender=KnowledgeSpace, space=space)
    return profile


def index_model_for(space: KnowledgeSpace) -> tuple[str, int]:
    """``(model_id, dimension)`` of the first index version of ``space``, from its profile.

    A local profile's dimension is the registered model's (recorded on the profile the first
    time); a Dify profile's is the one its preflight observed. Raises :class:`SpaceNotReady`
    unless the profile is ``ready``. Call inside the transaction that creates the version.
    """
    profile = lock_for_update(SpaceProfile.objects.filter(space_id=space.pk)).first()
    if profile is None:
        profile = profile_of(space)
    if profile.state != Readiness.READY:
        raise not_ready(profile, space.pk)
    if profile.embedding_plugin_id == LOCAL_PLUGIN_ID:
        dimension = get_embedding_model(profile.embedding_model).dimension
        if profile.embedding_dimension != dimension:
            SpaceProfile.objects.filter(space_id=space.pk).update(embedding_dimension=dimension)
        return profile.embedding_model, dimension
    # A ready Dify profile has the dimension its preflight observed.
    assert profile.embedding_dimension is not None
    return profile.vector_space_id, profile.embedding_dimension


def _local_fields(profile: SpaceProfile, model_id: str, dimension: int) -> dict:
    """The fields that make ``profile`` the local profile of the registered ``model_id``.

    A local model needs no validation, so the state is ``ready`` unless a rerank or reasoning
    model still waits for one (then ``pending-validation``)."""
    retrieval = {
        name: getattr(profile, name)
        for name in ("retrieval_rerank_enabled", "retrieval_rerank_model")
    }
    retrieval["retrieval_reasoning_model"] = profile.retrieval_reasoning_model
    if not _required_models(retrieval) or profile.state == Readiness.READY:
        state = Readiness.READY
    else:
        state = Readiness.PENDING_VALIDATION
    selection = local_selection(model_id)
    now = timezone.now()
    return {
        "embedding_plugin_id": selection.plugin_id,
        "embedding_provider": selection.provider,
        "embedding_model": selection.model,
        "embedding_identity": selection.model,
        "embedding_dimension": dimension,
        "vector_space_id": vector_space_id(selection, local_identity(model_id)),
        "embedding_revision": profile.embedding_revision + 1,
        "state": state,
        "failure": None,
        "validated_at": now if state == Readiness.READY else profile.validated_at,
        "updated_at": now,
    }


def adopt_registered_model(space: KnowledgeSpace, model_id: str, dimension: int) -> None:
    """The space's index version 1 is being created for the registered model ``model_id``
    (``PATCH`` with ``embedding_model_id`` before any upload): the embedding profile follows,
    as the local profile of that model. Refused with 409 ``embedding_profile_frozen`` once a
    document was admitted (a frozen space without an index is waiting for its validation).
    Call inside that transaction, with the space's row locked."""
    profile = locked_profile(space.pk)
    selection = local_selection(model_id)
    same = embedding_selection(profile) == selection and profile.embedding_dimension == dimension
    if profile.embedding_frozen_at is not None and not same:
        raise Conflict(
            "the embedding profile was frozen when the first document was admitted and the "
            "space has no index yet (it waits for its validation: POST /v1/knowledge-spaces/"
            f"{space.pk}/profile-validation); its model cannot change",
            code="embedding_profile_frozen",
        )
    if not same:
        SpaceProfile.objects.filter(space_id=space.pk).update(
            **_local_fields(profile, model_id, dimension)
        )


def follow_cutover(space_id: uuid.UUID, model_id: str, dimension: int) -> None:
    """An index version of ``model_id`` became the space's active one: the embedding profile
    describes it from now on (for a registered model, its local profile; the frozen latch
    stays). Call inside the cutover's transaction, with the space's row locked."""
    from knowledgefs.runtime import is_vector_space_id

    if is_vector_space_id(model_id):
        return  # a version of this very profile (other models arrive by registered id)
    profile = locked_profile(space_id)
    if (
        embedding_selection(profile) == local_selection(model_id)
        and profile.embedding_dimension == dimension
    ):
        return
    SpaceProfile.objects.filter(space_id=space_id).update(
        **_local_fields(profile, model_id, dimension)
    )
    logger.info("space %s: the embedding profile follows index model %s", space_id, model_id)


def embedding_model(model_id: str, space: Any) -> EmbeddingModel:
    """The Dify embedding model of ``space``'s profile (a ``KnowledgeSpace`` or its id) for its
    vector space id ``model_id`` (:func:`knowledgefs.runtime.register_space_models`); raises
    :class:`UnknownEmbeddingModel` when it is not the space's profile or the runtime is not
    ``dify``."""
    space_id = getattr(space, "pk", space)
    row = (
        SpaceProfile.objects.filter(space_id=uuid.UUID(str(space_id)), vector_space_id=model_id)
        .values_list(
            "space__tenant_id",
            "embedding_plugin_id",
            "embedding_provider",
            "embedding_model",
            "embedding_dimension",
        )
        .first()
    )
    if row is None:
        raise UnknownEmbeddingModel(
            model_id, f"{model_id!r} is not the embedding profile of knowledge space {space_id}"
        )
    tenant_id, plugin_id, provider, model, dimension = row
    if not uses_dify():
        raise UnknownEmbeddingModel(
            model_id,
            f"{model_id!r} ({plugin_id}/{provider}/{model}) is served through Dify, and this "
            f"server runs KNOWLEDGE_MODEL_RUNTIME={runtime_name()!r}",
        )
    return dify_embedding_model(
        tenant_id=tenant_id,
        plugin_id=plugin_id,
        provider=provider,
        model=model,
        model_id=model_id,
        dimension=dimension,
    )
