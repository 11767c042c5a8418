"""The preflight: a space's profiles checked against the model runtime, and the outcome recorded.

A catalog lookup of each selected model (it exists for the tenant, with the right model type),
then one real call to each: two probe embeddings (whose dimension and identity are recorded),
one rerank, one tiny LLM answer when a reasoning model is set; the local runtime checks its
registry. The checks run without any lock, within :data:`PREFLIGHT_DEADLINE_SECONDS`; the
outcome is written under the space's and the profile's row locks only if neither profile changed
meanwhile (:func:`run_preflight`). A ready outcome of a frozen profile sends
``spaces.signals.embedding_profile_ready`` in that transaction (retrieval creates the index).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from knowledgefs.auth.principal import Principal
from knowledgefs.runtime import (
    UnknownEmbeddingModel,
    get_embedding_model,
    runtime_name,
)

from . import signals
from .capabilities import PROBE_PNG, catalog_digest, declares_image_input
from .models import KnowledgeSpace, Readiness, SpaceProfile
from .profiles import locked_profile, not_ready, profile_of
from .selection import (
    DISTANCE_METRIC,
    MODEL_TYPE,
    Selection,
    embedding_selection,
    local_identity,
    vector_space_id,
)

if TYPE_CHECKING:
    from knowledgefs.dify.errors import DifyError

logger = logging.getLogger("knowledgefs.profiles")

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
            raise not_ready(profile, space.pk)
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
                    f"{field} model {chosen}: the local runtime serves no {MODEL_TYPE[field]} "
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


def _dify_failure(exc: DifyError, field: str, selection: Selection, call: str) -> ProfileFailure:
    """Map a :class:`~knowledgefs.dify.errors.DifyError` of one check to a profile failure."""
    from knowledgefs.dify.errors import EmbeddingDimensionMismatch

    what = f"{field} model {selection}: {call}"
    message = getattr(exc, "message", str(exc))
    status = getattr(exc, "status", None)
    if status in (401, 403):
        return ProfileFailure(
            "credential_invalid",
            f"{what} was refused with {status}: authentication failed ({status}), Dify does not "
            "accept the credentials for this "
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

    wanted = MODEL_TYPE[field]
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
    image = _check_image_input(runtime, tenant, item, selection, dimension, deadline)
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
                "catalog_digest": catalog_digest(
                    item.plugin_unique_identifier, dict(item.capabilities)
                ),
                **image,
            }
        },
    }


def _check_image_input(
    runtime, tenant: str, item, selection: Selection, dimension: int, deadline: _Deadline
) -> dict:
    """``{"input_modalities", "image_reason", "probe_model"}``: image input is recorded only when
    the catalog entry declares it and a text probe plus 1×1 PNG document and query probes all
    answer with one model identity and ``dimension``. Any other outcome (a probe refused, a
    different identity or dimension, no time left) leaves the profile text-only with the reason;
    the text profile itself stays valid."""
    from knowledgefs.dify.errors import DifyError

    if not declares_image_input(item.capabilities):
        return {"input_modalities": ["text"], "image_reason": "embedding-model-text-only"}
    probes = (
        ("text", {"text": PROBE_DOCUMENT, "input_type": "document"}),
        ("image document", {"image": PROBE_PNG, "input_type": "document"}),
        ("image query", {"image": PROBE_PNG, "input_type": "query"}),
    )
    seen: list[tuple[str, int]] = []
    try:
        for name, probe in probes:
            deadline.check("embedding", selection, f"the {name} probe")
            seen.append(
                runtime.embedding_probe(
                    tenant_id=tenant,
                    provider=selection.canonical_provider,
                    model=selection.model,
                    **probe,
                )
            )
    except (DifyError, ProfileFailure) as exc:
        reason = getattr(exc, "code", type(exc).__name__)
        logger.warning("embedding model %s: image probe failed (%s): text only", selection, exc)
        return {"input_modalities": ["text"], "image_reason": f"image-probe-failed:{reason}"}
    identities = {identity for identity, _ in seen}
    dimensions = {d for _, d in seen}
    if len(identities) != 1 or dimensions != {dimension}:
        logger.warning(
            "embedding model %s: image probes disagree (identities %s, dimensions %s): text only",
            selection,
            sorted(identities),
            sorted(dimensions),
        )
        return {"input_modalities": ["text"], "image_reason": "image-probe-mismatch"}
    return {
        "input_modalities": ["text", "image"],
        "image_reason": None,
        "probe_model": identities.pop(),
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
    vision = declares_image_input(item.capabilities)
    return {
        "plugin_unique_identifier": item.plugin_unique_identifier,
        "capabilities": dict(item.capabilities),
        "catalog_digest": catalog_digest(item.plugin_unique_identifier, dict(item.capabilities)),
        "input_modalities": ["text", "image"] if vision else ["text"],
        "image_reason": None if vision else "reasoning-model-text-only",
    }
