"""Space profiles: which models a space uses, and whether it is ready to use them.

Every space has one :class:`~spaces.models.SpaceProfile` row (created with the space):

- the **embedding profile**: a selection ``{plugin_id, provider, model}`` and what validation
  observed (the install identity, the dimension, the vector space id). It is frozen by the first
  document admitted (:func:`freeze_for_admission`); while nothing was indexed with it the
  selection can still be replaced, after that a local space needs a new index version (``PATCH
  …{"embedding_model_id"}``, :mod:`retrieval.indexing`) and a Dify space cannot change its model
  yet (docs/architecture.md, "Space profiles");
- the **retrieval profile**: default mode, reasoning model, rerank, score threshold, top_k;
- the **readiness** ``setup-required | pending-validation | validation-failed | ready``.

Under ``KNOWLEDGE_MODEL_RUNTIME=local`` (the embedded default) a new space gets the local profile
(``plugin_id`` and ``provider`` ``"local"``, ``model`` a registered model id, by default
:data:`~knowledgefs.runtime.DEFAULT_MODEL_ID`) and is ``ready`` at once; rerank and reasoning
models cannot be selected. Under ``dify`` a new space is ``setup-required`` until an embedding
selection is set, then ``pending-validation`` until the **preflight** (:func:`run_preflight`)
passes: a catalog lookup of each selected model (it exists for the tenant, with the right model
type), and one real call to each (two probe embeddings, whose dimension is recorded; one rerank;
one tiny LLM answer when a reasoning model is set). Dify refusing a call with 401/403 is
``credential_invalid``. The first compilation of a space runs the preflight inside its job
(:func:`ensure_ready_for_compile`); ``POST …/profile-validation`` and ``kfs space validate`` run
it on demand.

Writers take the space's row lock, then the profile's (the same order everywhere).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
import unicodedata
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from knowledgefs.auth.principal import Principal
from knowledgefs.db import lock_for_update
from knowledgefs.errors import Conflict, InvalidInput
from knowledgefs.runtime import (
    DEFAULT_MODEL_ID,
    LOCAL_PLUGIN_ID,
    LOCAL_PROVIDER,
    VECTOR_SPACE_PREFIX,
    EmbeddingModel,
    UnknownEmbeddingModel,
    dify_embedding_model,
    get_embedding_model,
    is_registered,
    registered_model_ids,
    runtime_name,
    uses_dify,
)

from . import signals
from .models import KnowledgeSpace, Readiness, RetrievalMode, SpaceProfile

logger = logging.getLogger("knowledgefs.profiles")

FIELDS = ("embedding", "rerank", "reasoning")
MAX_TOP_K = 100
DEFAULT_TOP_K = 10
DISTANCE_METRIC = "cosine"
# Probes of the preflight: fixed, harmless texts (never a user's document or query).
PROBE_DOCUMENT = "KnowledgeFS validation probe: annual leave is 25 days per year."
PROBE_QUERY = "how many days of annual leave"
PROBE_OTHER = "KnowledgeFS validation probe: receipts are due within thirty days."
PROBE_PROMPT = "Reply with the single word OK."
CATALOG_MAX_PAGES = 10
"""Catalog pages one model lookup may read in all (its own model type and, when it is missing,
the other types that tell ``model_type_mismatch`` from ``model_not_found``)."""
PREFLIGHT_DEADLINE_SECONDS = 20.0
"""The preflight's overall budget. Validation runs inside the HTTP request of ``POST
…/profile-validation`` (and at the start of a first compilation); no further catalog page, probe
embedding, rerank or answer is started once this many seconds have passed since it began, and it
ends with the retryable failure ``model_runtime_timeout`` (the readiness state is left as it
was). A call already in flight is bounded by the runtime's own per-call timeout."""
MAX_EMBEDDING_DIMENSION = 16384
"""The largest embedding dimension a profile accepts (``1..16384``). Every stored vector of a
space is held as float32 bytes and every query scores the whole matrix, so a model answering
more (a 300,000-d probe froze a space) fails validation with ``embedding_dimension_out_of_range``.
The number is the dimension limit of Dify's inner vector API (``scope.dimension <= 16384`` on
``/inner/api/knowledge-fs/vectors``, the reference inventory §7.2), so a profile valid here can
also be indexed through Dify's vector store."""

_PLUGIN_ID = re.compile(r"[a-z0-9_-]+/[a-z0-9_-]+")
_PROVIDER = re.compile(r"[a-z0-9_-]+")
_MODEL_TYPE = {"embedding": "text-embedding", "rerank": "rerank", "reasoning": "llm"}
_SELECTION_KEYS = ("plugin_id", "provider", "model")
_RETRIEVAL_KEYS = {"default_mode", "reasoning_model", "rerank", "score_threshold", "top_k"}


# --- values ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """A model chosen by a client: ``plugin_id`` (``<org>/<plugin>``, or ``local``),
    ``provider`` and ``model``. Never a credential, a dimension or a vector space."""

    plugin_id: str
    provider: str
    model: str

    @classmethod
    def of(cls, value: Any) -> Selection | None:
        if not isinstance(value, dict):
            return None
        return cls(value["plugin_id"], value["provider"], value["model"])

    def as_dict(self) -> dict[str, str]:
        return {"plugin_id": self.plugin_id, "provider": self.provider, "model": self.model}

    @property
    def is_local(self) -> bool:
        return self.plugin_id == LOCAL_PLUGIN_ID

    @property
    def canonical_provider(self) -> str:
        """``<org>/<plugin>/<provider>``, the form Dify's invocations take."""
        return f"{self.plugin_id}/{self.provider}"

    def __str__(self) -> str:
        return f"{self.canonical_provider}/{self.model}"


class SpaceNotReady(Conflict):
    """409: the space's readiness does not allow this (``code`` names the state, or the
    recorded failure for a job); ``retryable`` says whether waiting may help."""

    def __init__(self, message: str, *, code: str, retryable: bool = False, details=None) -> None:
        super().__init__(message, code=code, details=details)
        self.retryable = retryable


class ProfileFailure(Exception):
    """A failed preflight check: ``code``, ``message``, ``field`` (``embedding``, ``rerank`` or
    ``reasoning``) and whether a later attempt may succeed unchanged (``retryable``)."""

    def __init__(self, code: str, message: str, *, field: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.code, self.message, self.field, self.retryable = code, message, field, retryable

    def as_dict(self) -> dict:
        return {
            "code": self.code,
            "message": self.message[:1000],
            "field": self.field,
            "retryable": self.retryable,
            "failed_at": timezone.now().isoformat(),
        }


class _Deadline:
    """The preflight's overall budget (:data:`PREFLIGHT_DEADLINE_SECONDS`), checked before each
    call to the runtime."""

    def __init__(self, seconds: float | None = None) -> None:
        self.seconds = PREFLIGHT_DEADLINE_SECONDS if seconds is None else seconds
        self.ends = time.monotonic() + self.seconds

    def check(self, field: str, selection: Selection, call: str) -> None:
        if time.monotonic() >= self.ends:
            raise ProfileFailure(
                "model_runtime_timeout",
                f"{field} model {selection}: validation ran out of its {self.seconds:g} s budget "
                f"before {call} (Dify answers too slowly); nothing was changed, validate again "
                "later",
                field=field,
                retryable=True,
            )


def local_selection(model_id: str = DEFAULT_MODEL_ID) -> Selection:
    return Selection(LOCAL_PLUGIN_ID, LOCAL_PROVIDER, model_id)


def vector_space_id(selection: Selection, identity: dict) -> str:
    """``embedding-space-sha256:<hex>``: SHA-256 of the stable JSON (sorted keys, no spaces,
    UTF-8) of ``{"selection": {plugin_id, provider, model}, "identity": identity}``.

    ``identity`` is what the runtime reports about the model it serves: for Dify
    ``{plugin_unique_identifier, dimension, distance_metric}`` (so a plugin upgraded in place, or
    another dimension, is another vector space); for a local model ``{model_id}`` (a registered
    id names the model and its revision).
    """
    payload = json.dumps(
        {"selection": selection.as_dict(), "identity": identity},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return VECTOR_SPACE_PREFIX + hashlib.sha256(payload.encode()).hexdigest()


def local_identity(model_id: str) -> dict:
    return {"model_id": model_id}


def embedding_selection(profile: SpaceProfile) -> Selection | None:
    if not profile.embedding_plugin_id:
        return None
    return Selection(
        profile.embedding_plugin_id, profile.embedding_provider, profile.embedding_model
    )


def index_model_id(profile: SpaceProfile) -> str:
    """The model id an index version filled by this profile carries: the registered id for a
    local model, the vector space id for a model served through Dify."""
    if profile.embedding_plugin_id == LOCAL_PLUGIN_ID:
        return profile.embedding_model
    return profile.vector_space_id


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
      score_threshold, top_k, revision}``.
    """

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
    }


# --- input ----------------------------------------------------------------------------------


def _capability_unavailable(field: str, message: str) -> InvalidInput:
    return InvalidInput(
        f"{field}: {message}", code="capability_unavailable", details={"field": field}
    )


def parse_selection(value: Any, field: str) -> Selection:
    """Check a selection ``{plugin_id, provider, model}`` (exactly these members) against the
    runtime; 400 ``invalid_model_selection`` naming the member, ``capability_unavailable`` when
    this runtime cannot serve it."""
    if not isinstance(value, dict):
        raise InvalidInput(
            f"{field} must be an object {{plugin_id, provider, model}}",
            code="invalid_model_selection",
            details={"field": field},
        )
    extra = sorted(set(value) - set(_SELECTION_KEYS))
    if extra:
        raise InvalidInput(
            f"{field}.{extra[0]}: a selection names only plugin_id, provider and model "
            "(credentials, dimensions and vector spaces are never set by clients)",
            code="invalid_model_selection",
            details={"field": f"{field}.{extra[0]}"},
        )
    for key in _SELECTION_KEYS:
        item = value.get(key)
        if not isinstance(item, str) or not item.strip():
            raise InvalidInput(
                f"{field}.{key} is required (a non-empty string)",
                code="invalid_model_selection",
                details={"field": f"{field}.{key}"},
            )
    plugin_id, provider, model = (value[k].strip() for k in _SELECTION_KEYS)
    if len(model) > 256 or any(unicodedata.category(c) in ("Cc", "Cf") for c in model):
        raise InvalidInput(
            f"{field}.model must be at most 256 characters without control characters",
            code="invalid_model_selection",
            details={"field": f"{field}.model"},
        )
    selection = Selection(plugin_id, provider, model)
    runtime = runtime_name()
    if selection.is_local:
        if runtime != "local":
            raise _capability_unavailable(
                f"{field}.plugin_id",
                f"local models are served only with KNOWLEDGE_MODEL_RUNTIME=local; this server "
                f"runs {runtime!r}: select a model of a Dify plugin",
            )
        if field != "embedding":
            raise _capability_unavailable(
                field, f"no local {_MODEL_TYPE[field]} model exists; leave {field} unset"
            )
        if provider != LOCAL_PROVIDER:
            raise InvalidInput(
                f"{field}.provider must be 'local' with plugin_id 'local'",
                code="invalid_model_selection",
                details={"field": f"{field}.provider"},
            )
        if not is_registered(model):
            raise InvalidInput(
                f"{field}.model: no local embedding model is registered as {model!r}",
                code="unknown_embedding_model",
                details={"field": f"{field}.model", "registered": sorted(registered_model_ids())},
            )
        return selection
    if runtime == "local":
        what = "embedding models" if field == "embedding" else f"{_MODEL_TYPE[field]} models"
        raise _capability_unavailable(
            f"{field}.plugin_id" if field == "embedding" else field,
            f"this server runs KNOWLEDGE_MODEL_RUNTIME=local, which serves no {what} of Dify "
            f"plugins"
            + (
                f" (use plugin_id 'local', provider 'local', model {DEFAULT_MODEL_ID!r})"
                if field == "embedding"
                else f"; leave {field} unset"
            ),
        )
    if len(plugin_id) > 128 or not _PLUGIN_ID.fullmatch(plugin_id):
        raise InvalidInput(
            f"{field}.plugin_id must be '<org>/<plugin>' in lower case (langgenius/openai)",
            code="invalid_model_selection",
            details={"field": f"{field}.plugin_id"},
        )
    if len(provider) > 128 or not _PROVIDER.fullmatch(provider):
        raise InvalidInput(
            f"{field}.provider must be a provider name in lower case (openai)",
            code="invalid_model_selection",
            details={"field": f"{field}.provider"},
        )
    return selection


def parse_retrieval_profile(body: Any) -> dict:
    """Check a retrieval profile and return the model fields to store.

    Members (each optional, a missing one takes its default — ``PUT`` replaces the profile):
    ``default_mode`` (``fast``, ``deep`` or ``research``; ``auto`` is refused with
    ``mode_unavailable``: it resolves to the default), ``reasoning_model`` (selection or null),
    ``rerank`` (``{enabled: false, model: null}``), ``score_threshold`` (null = off, else 0..1),
    ``top_k`` (10; 1..100). Rules, each a 400 naming the field: ``invalid_mode``,
    ``mode_unavailable``, ``invalid_top_k``, ``invalid_score_threshold``, ``invalid_rerank``,
    ``rerank_model_required`` (rerank enabled without a model),
    ``score_threshold_requires_rerank`` (a threshold without an enabled rerank, whatever
    ``default_mode``: the profile's threshold applies to requests in every mode, and without a
    reranker Fast's, Deep's and Research's scores are all relative to the query's candidates;
    a request's own ``score_threshold`` stays allowed), ``invalid_model_selection``,
    ``capability_unavailable`` (a rerank or reasoning model under the local runtime).
    """
    modes = RetrievalMode.concrete()
    if not isinstance(body, dict):
        raise InvalidInput("the body must be a JSON object", code="invalid_request")
    unknown = sorted(set(body) - _RETRIEVAL_KEYS - {"revision"})
    if unknown:
        raise InvalidInput(
            f"{unknown[0]}: not a retrieval profile member (members: "
            f"{', '.join(sorted(_RETRIEVAL_KEYS))})",
            code="invalid_request",
            details={"field": unknown[0]},
        )
    mode = body.get("default_mode", RetrievalMode.FAST.value)
    if not isinstance(mode, str) or mode not in RetrievalMode.values:
        raise InvalidInput(
            f"default_mode must be one of: {', '.join(modes)}",
            code="invalid_mode",
            details={"field": "default_mode"},
        )
    if mode not in modes:
        raise InvalidInput(
            f"default_mode: {mode!r} cannot be a default (auto resolves to the default); "
            f"supported: {', '.join(modes)}",
            code="mode_unavailable",
            details={"field": "default_mode", "supported": list(modes)},
        )
    top_k = body.get("top_k", DEFAULT_TOP_K)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
        raise InvalidInput(
            f"top_k must be an integer from 1 to {MAX_TOP_K}",
            code="invalid_top_k",
            details={"field": "top_k"},
        )
    threshold = body.get("score_threshold")
    if threshold is not None and (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or not math.isfinite(threshold)
        or not 0 <= threshold <= 1
    ):
        raise InvalidInput(
            "score_threshold must be null (off) or a number from 0 to 1",
            code="invalid_score_threshold",
            details={"field": "score_threshold"},
        )
    rerank = body.get("rerank", {"enabled": False, "model": None})
    if rerank is None:
        rerank = {"enabled": False, "model": None}
    if not isinstance(rerank, dict) or set(rerank) - {"enabled", "model"}:
        raise InvalidInput(
            "rerank must be an object {enabled, model}",
            code="invalid_rerank",
            details={"field": "rerank"},
        )
    enabled = rerank.get("enabled", False)
    if not isinstance(enabled, bool):
        raise InvalidInput(
            "rerank.enabled must be true or false",
            code="invalid_rerank",
            details={"field": "rerank.enabled"},
        )
    rerank_model = rerank.get("model")
    if enabled and rerank_model is None:
        raise InvalidInput(
            "rerank.model is required when rerank is enabled",
            code="rerank_model_required",
            details={"field": "rerank.model"},
        )
    rerank_selection = None if rerank_model is None else parse_selection(rerank_model, "rerank")
    reasoning = body.get("reasoning_model")
    reasoning_selection = None if reasoning is None else parse_selection(reasoning, "reasoning")
    if threshold is not None and not enabled:
        # Whatever the default mode: the profile's threshold applies to every request that
        # sends none, in any mode, and without a reranker no mode's score is absolute.
        raise InvalidInput(
            "score_threshold: a profile threshold applies to the rerank score; enable rerank "
            "with a model, or set score_threshold to null (a request may still send its own)",
            code="score_threshold_requires_rerank",
            details={"field": "score_threshold"},
        )
    return {
        "retrieval_default_mode": mode,
        "retrieval_reasoning_model": reasoning_selection.as_dict() if reasoning_selection else None,
        "retrieval_rerank_enabled": enabled,
        "retrieval_rerank_model": rerank_selection.as_dict() if rerank_selection else None,
        "retrieval_score_threshold": None if threshold is None else float(threshold),
        "retrieval_top_k": top_k,
    }


def check_revision(current: int, expected: int | None, what: str) -> None:
    """409 ``revision_conflict`` unless ``expected`` is None or the ``current`` revision."""
    if expected is not None and expected != current:
        raise Conflict(
            f"the {what} changed since revision {expected} (now {current}); re-read it and retry",
            code="revision_conflict",
            details={"revision": current},
        )


def parse_revision(revision: Any) -> int | None:
    """A client's expected revision: None, or a positive integer (else 400)."""
    if revision is None:
        return None
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 1:
        raise InvalidInput(
            "revision must be a positive integer",
            code="invalid_request",
            details={"field": "revision"},
        )
    return revision


# --- changing profiles ----------------------------------------------------------------------


def _required_models(fields: dict) -> dict[str, Selection]:
    required = {}
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
    …/profile-validation``); removing the model whose validation failed does the same. Errors:
    404 ``space_not_found``, the 400s of :func:`parse_retrieval_profile`, 409
    ``revision_conflict``.
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


def _not_ready(profile: SpaceProfile, space_id) -> SpaceNotReady:
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

    Refuses a space that is ``setup-required`` or ``validation-failed`` (409
    ``space_setup_required`` / ``space_validation_failed``). Otherwise sets
    ``embedding_frozen_at`` if it is not set yet (a latch in its own commit: it stays set even
    if this upload then fails) and, when the profile is ``ready``, makes sure the space has its
    active index version. A ``pending-validation`` space is admitted too: its first compilation
    runs the preflight and creates the index version.
    """
    profile = profile_of(space)
    if profile.state in (Readiness.SETUP_REQUIRED, Readiness.VALIDATION_FAILED):
        raise _not_ready(profile, space.id)
    if profile.embedding_frozen_at is None:
        # Under the profile's row lock, so a concurrent PUT of the embedding profile either
        # committed first (and is checked here) or sees the latch.
        with transaction.atomic():
            profile = lock_for_update(SpaceProfile.objects.filter(space_id=space.id)).first()
            if profile.state in (Readiness.SETUP_REQUIRED, Readiness.VALIDATION_FAILED):
                raise _not_ready(profile, space.id)
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
        raise _not_ready(profile, space.pk)
    if profile.embedding_plugin_id == LOCAL_PLUGIN_ID:
        dimension = get_embedding_model(profile.embedding_model).dimension
        if profile.embedding_dimension != dimension:
            SpaceProfile.objects.filter(space_id=space.pk).update(embedding_dimension=dimension)
        return profile.embedding_model, dimension
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


# --- readiness checks ---------------------------------------------------------------------------


def require_ready(space: KnowledgeSpace) -> SpaceProfile:
    """The space's profile if it is ``ready``, else 409 ``space_setup_required``,
    ``space_pending_validation`` or ``space_validation_failed`` (used by retrieval)."""
    profile = profile_of(space)
    if profile.state != Readiness.READY:
        raise _not_ready(profile, space.pk)
    return profile


def ensure_ready_for_compile(space_id: uuid.UUID) -> SpaceProfile:
    """Called at the start of a compilation, inside the job's lease: returns the ready profile.

    ``pending-validation`` runs the preflight now. Raises :class:`SpaceNotReady` whose ``code``
    is the failure's (``credential_invalid``, ``model_not_found``, …, or
    ``space_setup_required``) and whose ``retryable`` says whether the job should be retried
    (a timeout or 5xx of Dify) or fail (anything that needs someone to change something).
    """
    space = KnowledgeSpace.objects.get(id=space_id)
    profile = profile_of(space)
    if profile.state == Readiness.PENDING_VALIDATION:
        profile = run_preflight(space)
    if profile.state == Readiness.READY:
        return profile
    if profile.state == Readiness.SETUP_REQUIRED:
        raise _not_ready(profile, space_id)
    failure = profile.failure or {}
    code = failure.get("code") or "profile_validation_failed"
    raise SpaceNotReady(
        f"the knowledge space's {failure.get('field') or 'embedding'} model failed validation: "
        f"{failure.get('message') or profile.state}; fix it, validate again (POST "
        f"/v1/knowledge-spaces/{space_id}/profile-validation) and retry the job",
        code=code,
        retryable=bool(failure.get("retryable")) and profile.state != Readiness.VALIDATION_FAILED,
        details={"state": profile.state, "failure": profile.failure},
    )


# --- the preflight ------------------------------------------------------------------------------


def validate_space(principal: Principal, space_id: uuid.UUID | str) -> KnowledgeSpace:
    """Run the preflight now (``POST …/profile-validation``, ``kfs space validate``); returns the
    space with its readiness recorded (``ready``, or the failure). 409 ``space_setup_required``
    when there is nothing to validate."""
    from .services import get_space

    space = get_space(principal, space_id)
    run_preflight(space)
    space.refresh_from_db()
    return space


def run_preflight(space: KnowledgeSpace, *, attempts: int = 3) -> SpaceProfile:
    """Validate the space's profiles against the runtime and record the outcome; returns the
    profile as recorded.

    The checks run without any lock (they call Dify); the outcome is written under the space's
    and the profile's row locks only if neither profile changed meanwhile (else the checks run
    again, at most ``attempts`` times). Success: ``ready`` with the observed identity, dimension
    and vector space id, and, when a document was admitted already, the space's first index
    version. A retryable failure (timeout, 5xx, connection) is recorded in ``failure`` and
    leaves the state as it was; any other failure makes the space ``validation-failed``.
    Raises :class:`SpaceNotReady` (``space_setup_required``) when there is no embedding
    selection.
    """
    profile = profile_of(space)
    for _ in range(attempts):
        if profile.state == Readiness.SETUP_REQUIRED:
            raise _not_ready(profile, space.pk)
        snapshot = (profile.embedding_revision, profile.retrieval_revision)
        try:
            outcome: dict | ProfileFailure = _check(space, profile, _Deadline())
        except ProfileFailure as failure:
            outcome = failure
        recorded = _record(space, snapshot, outcome)
        if recorded is not None:
            return recorded
        profile = profile_of(space.pk)
    return profile


def _record(space: KnowledgeSpace, snapshot: tuple[int, int], outcome) -> SpaceProfile | None:
    now = timezone.now()
    with transaction.atomic():
        profile = locked_profile(space.pk)
        if (profile.embedding_revision, profile.retrieval_revision) != snapshot:
            return None  # the profile changed while it was checked: check the new one
        if isinstance(outcome, ProfileFailure):
            fields: dict[str, Any] = {"failure": outcome.as_dict(), "updated_at": now}
            if not outcome.retryable:
                fields["state"] = Readiness.VALIDATION_FAILED
            logger.warning(
                "space %s: profile validation failed (%s, %s): %s",
                space.pk,
                outcome.code,
                outcome.field,
                outcome.message,
            )
        else:
            fields = {**outcome, "state": Readiness.READY, "failure": None, "validated_at": now}
        SpaceProfile.objects.filter(space_id=space.pk).update(**fields)
        if fields.get("state") == Readiness.READY and profile.embedding_frozen_at is not None:
            # retrieval: a document waited for this validation; the space gets its index
            signals.embedding_profile_ready.send(
                sender=KnowledgeSpace, space=KnowledgeSpace(id=space.pk)
            )
    return SpaceProfile.objects.get(space_id=space.pk)


def _check(space: KnowledgeSpace, profile: SpaceProfile, deadline: _Deadline) -> dict:
    """Run every check of the profile within ``deadline``; returns the fields to record, or
    raises :class:`ProfileFailure` at the first failure."""
    selection = embedding_selection(profile)
    assert selection is not None
    frozen = profile.embedding_frozen_at is not None
    rerank = (
        Selection.of(profile.retrieval_rerank_model) if profile.retrieval_rerank_enabled else None
    )
    reasoning = Selection.of(profile.retrieval_reasoning_model)
    if selection.is_local:
        for field, chosen in (("rerank", rerank), ("reasoning", reasoning)):
            if chosen is not None:
                raise ProfileFailure(
                    "capability_unavailable",
                    f"{field} model {chosen}: the local runtime serves no {_MODEL_TYPE[field]} "
                    "models",
                    field=field,
                )
        return _check_local(profile, selection, frozen)
    if runtime_name() != "dify":
        raise ProfileFailure(
            "capability_unavailable",
            f"embedding model {selection} is served through Dify, and this server runs "
            f"KNOWLEDGE_MODEL_RUNTIME={runtime_name()!r}",
            field="embedding",
        )
    from knowledgefs.dify.errors import DifyNotConfigured
    from knowledgefs.runtime import model_runtime

    try:
        runtime = model_runtime()
    except DifyNotConfigured as exc:
        raise ProfileFailure("model_runtime_not_configured", str(exc), field="embedding") from None
    tenant = space.tenant_id or KnowledgeSpace.objects.get(id=space.pk).tenant_id
    fields = _check_dify_embedding(runtime, tenant, profile, selection, frozen, deadline)
    capabilities = dict(fields.pop("capabilities"))
    if rerank is not None:
        capabilities["rerank"] = _check_rerank(runtime, tenant, rerank, deadline)
    if reasoning is not None:
        capabilities["reasoning"] = _check_reasoning(runtime, tenant, reasoning, deadline)
    return {**fields, "capabilities": capabilities}


def _check_local(profile: SpaceProfile, selection: Selection, frozen: bool) -> dict:
    from knowledgefs.runtime import UnknownEmbeddingModel

    try:
        model = get_embedding_model(selection.model)
        vector = model.embed_query(PROBE_QUERY)
    except UnknownEmbeddingModel as exc:
        raise ProfileFailure("model_not_found", str(exc), field="embedding") from None
    except Exception as exc:  # noqa: BLE001 - a model that cannot load or run is not usable
        raise ProfileFailure(
            "model_unavailable",
            f"local embedding model {selection.model!r} cannot run: {type(exc).__name__}: {exc}",
            field="embedding",
        ) from None
    dimension = int(getattr(vector, "shape", (model.dimension,))[-1])
    if dimension != model.dimension or (
        frozen and profile.embedding_dimension and profile.embedding_dimension != dimension
    ):
        raise ProfileFailure(
            "embedding_dimension_mismatch",
            f"local embedding model {selection.model!r} returned {dimension}-d vectors; "
            f"{profile.embedding_dimension or model.dimension}-d expected",
            field="embedding",
        )
    return {
        "embedding_identity": selection.model,
        "embedding_dimension": dimension,
        "vector_space_id": vector_space_id(selection, local_identity(selection.model)),
        "capabilities": {"embedding": {"model_id": selection.model, "dimension": dimension}},
    }


def _dify_failure(exc: Exception, field: str, selection: Selection, call: str) -> ProfileFailure:
    """Map a :class:`~knowledgefs.dify.errors.DifyError` of one check to a profile failure."""
    from knowledgefs.dify.errors import EmbeddingDimensionMismatch

    what = f"{field} model {selection}: {call}"
    message = getattr(exc, "message", str(exc))
    status = getattr(exc, "status", None)
    if status in (401, 403):
        return ProfileFailure(
            "credential_invalid",
            f"{what} was refused with {status}: Dify does not accept the credentials for this "
            "model (the tenant's provider credentials, or KnowledgeFS's inner API key)",
            field=field,
        )
    if isinstance(exc, EmbeddingDimensionMismatch):
        return ProfileFailure("embedding_dimension_mismatch", f"{what}: {message}", field=field)
    if getattr(exc, "retryable", False):
        return ProfileFailure(
            "model_runtime_unavailable",
            f"{what} failed ({exc.code}): {message}; validation is retried",
            field=field,
            retryable=True,
        )
    return ProfileFailure(
        "model_invocation_failed", f"{what} failed ({exc.code}): {message}", field=field
    )


def _catalog_item(runtime, tenant: str, field: str, selection: Selection, deadline: _Deadline):
    """The catalog entry of ``selection`` with the model type ``field`` needs, else a
    ``model_not_found`` / ``model_type_mismatch`` failure. Reads at most
    :data:`CATALOG_MAX_PAGES` pages in all."""
    from knowledgefs.dify.errors import DifyError

    pages = [0]

    def find(model_type: str):
        offset: int | None = 0
        while pages[0] < CATALOG_MAX_PAGES:
            deadline.check(field, selection, "the catalog lookup")
            pages[0] += 1
            page = runtime.list_models(
                tenant_id=tenant,
                model_type=model_type,
                provider=selection.canonical_provider,
                model=selection.model,
                offset=offset,
            )
            for item in page.items:
                if (item.plugin_id, item.provider, item.model) == (
                    selection.plugin_id,
                    selection.provider,
                    selection.model,
                ) and item.model_type == model_type:
                    return item
            offset = page.next_offset
            if offset is None:
                return None
        return None

    wanted = _MODEL_TYPE[field]
    try:
        item = find(wanted)
        if item is not None:
            return item
        for other in ("text-embedding", "rerank", "llm"):
            if other != wanted and find(other) is not None:
                raise ProfileFailure(
                    "model_type_mismatch",
                    f"{field} model {selection} is a {other} model in the tenant's catalog, not a "
                    f"{wanted} model",
                    field=field,
                )
    except DifyError as exc:
        raise _dify_failure(exc, field, selection, "the catalog lookup") from None
    raise ProfileFailure(
        "model_not_found",
        f"{field} model {selection} is not in the tenant's model catalog as a {wanted} model "
        "(not installed, not configured, or disabled in Dify)",
        field=field,
    )


def _check_dify_embedding(
    runtime, tenant: str, profile, selection: Selection, frozen: bool, deadline: _Deadline
):
    from knowledgefs.dify.errors import DifyError

    item = _catalog_item(runtime, tenant, "embedding", selection, deadline)
    expected = profile.embedding_dimension if frozen and profile.embedding_dimension else None
    shapes = []
    try:
        for text, input_type in ((PROBE_DOCUMENT, "document"), (PROBE_QUERY, "query")):
            deadline.check("embedding", selection, f"the {input_type} probe embedding")
            matrix = runtime.embed_texts(
                tenant_id=tenant,
                provider=selection.canonical_provider,
                model=selection.model,
                texts=[text],
                input_type=input_type,
                expected_dimension=expected,
            )
            shapes.append(int(matrix.shape[1]))
    except DifyError as exc:
        raise _dify_failure(exc, "embedding", selection, "the probe embedding") from None
    if len(set(shapes)) != 1:
        raise ProfileFailure(
            "embedding_dimension_mismatch",
            f"embedding model {selection}: a document probe returned {shapes[0]}-d vectors and a "
            f"query probe {shapes[1]}-d ones",
            field="embedding",
        )
    dimension = shapes[0]
    if not 1 <= dimension <= MAX_EMBEDDING_DIMENSION:
        raise ProfileFailure(
            "embedding_dimension_out_of_range",
            f"embedding model {selection} returned {dimension}-d vectors; KnowledgeFS indexes "
            f"1 to {MAX_EMBEDDING_DIMENSION} dimensions: select another embedding model",
            field="embedding",
        )
    identity = {
        "plugin_unique_identifier": item.plugin_unique_identifier,
        "dimension": dimension,
        "distance_metric": DISTANCE_METRIC,
    }
    space_id = vector_space_id(selection, identity)
    if frozen and profile.vector_space_id and profile.vector_space_id != space_id:
        raise ProfileFailure(
            "model_identity_changed",
            f"embedding model {selection} is now {item.plugin_unique_identifier} "
            f"({dimension}-d), not the install this space was indexed with "
            f"({profile.embedding_identity}, {profile.embedding_dimension}-d): its vectors would "
            "not be comparable; re-index the space with another model",
            field="embedding",
        )
    return {
        "embedding_identity": item.plugin_unique_identifier,
        "embedding_dimension": dimension,
        "vector_space_id": space_id,
        "capabilities": {
            "embedding": {
                "plugin_unique_identifier": item.plugin_unique_identifier,
                "dimension": dimension,
                "distance_metric": DISTANCE_METRIC,
                "capabilities": dict(item.capabilities),
            }
        },
    }


def _check_rerank(runtime, tenant: str, selection: Selection, deadline: _Deadline) -> dict:
    from knowledgefs.dify.errors import DifyError

    item = _catalog_item(runtime, tenant, "rerank", selection, deadline)
    deadline.check("rerank", selection, "the probe rerank")
    try:
        hits = runtime.rerank(
            tenant_id=tenant,
            provider=selection.canonical_provider,
            model=selection.model,
            query=PROBE_QUERY,
            docs=[PROBE_DOCUMENT, PROBE_OTHER],
        )
    except DifyError as exc:
        raise _dify_failure(exc, "rerank", selection, "the probe rerank") from None
    if not hits:
        raise ProfileFailure(
            "model_invocation_failed",
            f"rerank model {selection} scored none of the probe documents",
            field="rerank",
        )
    bad = next((h.score for h in hits if not 0 <= h.score <= 1), None)
    if bad is not None:
        raise ProfileFailure(
            "rerank_score_out_of_range",
            f"rerank model {selection} returned the score {bad}; scores must be within 0..1 "
            "(thresholds compare them)",
            field="rerank",
        )
    return {"plugin_unique_identifier": item.plugin_unique_identifier}


def _check_reasoning(runtime, tenant: str, selection: Selection, deadline: _Deadline) -> dict:
    from knowledgefs.dify.errors import DifyError

    item = _catalog_item(runtime, tenant, "reasoning", selection, deadline)
    deadline.check("reasoning", selection, "the probe answer")
    frames = 0
    stream = None
    try:
        stream = runtime.invoke_llm(
            tenant_id=tenant,
            provider=selection.canonical_provider,
            model=selection.model,
            prompt_messages=[{"role": "user", "content": PROBE_PROMPT}],
            completion_params={"max_tokens": 8, "temperature": 0},
        )
        for _frame in stream:
            frames += 1
    except DifyError as exc:
        raise _dify_failure(exc, "reasoning", selection, "the probe answer") from None
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    if not frames:
        raise ProfileFailure(
            "model_invocation_failed",
            f"reasoning model {selection} answered nothing",
            field="reasoning",
        )
    return {"plugin_unique_identifier": item.plugin_unique_identifier}


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
