"""Knowledge-space services: the only code that changes these rows.

A :class:`Principal` is who is calling: a tenant and, for a space-bound API key, the spaces it
may reach. Every lookup goes through :func:`get_space`, so an id from another tenant or outside
the key's scope is a 404, exactly like an id that does not exist.
"""

from __future__ import annotations

import hashlib
import logging
import re
import unicodedata
import uuid
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from knowledgefs.auth.principal import Principal as Principal
from knowledgefs.errors import Conflict, Forbidden, InvalidInput, NotFound

from . import signals
from .api_keys import delete_keys_scoped_only_to
from .models import (
    SLUG_PATTERN,
    KnowledgeSpace,
    PublicationHead,
)
from .models import (
    validate_tenant_id as validate_tenant_id,
)

logger = logging.getLogger("knowledgefs.apikeys")
_SLUG_RE = re.compile(SLUG_PATTERN)


# --- spaces ---------------------------------------------------------------------------------


def slugify_name(name: str) -> str:
    """Kebab-case slug from a name; names with no Latin letters get a stable SHA-256 suffix."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    base = re.sub(r"[^a-z0-9]+", "-", ascii_name.lower()).strip("-")[:120].strip("-")
    if not base or len(base) < len(name.strip()) // 3:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        base = f"{base}-{digest}" if base else f"space-{digest}"
    return base


def _clean_name(name: str | None) -> str:
    """Strip a space name and refuse control characters or names with nothing visible."""
    name = (name or "").strip()
    visible = [c for c in name if not c.isspace() and unicodedata.category(c) not in ("Cf", "Cc")]
    if not 1 <= len(name) <= 160 or not visible:
        raise InvalidInput(
            "name must be 1-160 characters with something visible", code="invalid_name"
        )
    bad = next((c for c in name if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        raise InvalidInput(
            f"name contains the control character U+{ord(bad):04X}", code="invalid_name"
        )
    return name


def ensure_can_create_spaces(principal: Principal) -> None:
    """Raise 403 ``key_scope_forbids_create`` unless the caller reaches its whole tenant.

    Checked before an idempotent replay too: a key narrowed since its first request must not
    get a space back through the replay.
    """
    if principal.space_ids is not None:
        raise Forbidden(
            "this API key is bound to specific knowledge spaces and cannot create new ones",
            code="key_scope_forbids_create",
        )


def create_space(
    principal: Principal, *, name: str, slug: str | None = None, description: str = ""
) -> KnowledgeSpace:
    """Create a space and its publication head in one transaction.

    A given slug must match ``^[a-z0-9]+(?:-[a-z0-9]+)*$`` and be free in the tenant (409
    ``slug_taken``); without one a slug is derived from the name, with ``-2`` … ``-20`` tried on
    collision. A space-bound key cannot create spaces (403 ``key_scope_forbids_create``).
    """
    ensure_can_create_spaces(principal)
    name = _clean_name(name)
    if len(description or "") > 2000:
        raise InvalidInput(
            "description must be at most 2000 characters", code="invalid_description"
        )
    if slug is not None:
        _check_slug(slug)
        candidates = [slug]
    else:
        base = slugify_name(name)
        candidates = [base] + [f"{base}-{n}" for n in range(2, 21)]
    for candidate in candidates:
        try:
            with transaction.atomic():
                space = KnowledgeSpace.objects.create(
                    tenant_id=principal.tenant_id,
                    name=name,
                    slug=candidate,
                    description=description or "",
                )
                PublicationHead.objects.create(space=space)
                return space
        except IntegrityError:
            continue
    if slug is not None:
        raise Conflict(f"slug {slug!r} is already used in this tenant", code="slug_taken")
    raise Conflict("could not derive a free slug from the name; pass one", code="slug_taken")


def _check_slug(slug: str) -> None:
    if not isinstance(slug, str) or len(slug) > 160 or not _SLUG_RE.fullmatch(slug):
        raise InvalidInput(
            "slug must be lower-case kebab case (^[a-z0-9]+(?:-[a-z0-9]+)*$), "
            "at most 160 characters",
            code="invalid_slug",
        )


def spaces_for(principal: Principal) -> QuerySet[KnowledgeSpace]:
    """Every space the principal may see, newest first."""
    qs = KnowledgeSpace.objects.filter(tenant_id=principal.tenant_id)
    if principal.space_ids is not None:
        qs = qs.filter(id__in=principal.space_ids)
    return qs.order_by("-created_at", "-id")


def provision_space(
    tenant_id: str, *, name: str, slug: str, description: str = ""
) -> tuple[KnowledgeSpace, bool]:
    """Create the tenant's space ``slug`` unless it exists; returns ``(space, created)``.

    Dify's provisioning call (internal route) is retried by its workers, so the slug is the
    idempotency key: a repeat returns the existing space unchanged. Raises
    :class:`InvalidInput` for a bad tenant, name or slug.
    """
    principal = Principal(tenant_id=validate_tenant_id(tenant_id), kind="internal")
    _check_slug(slug)
    existing = KnowledgeSpace.objects.filter(tenant_id=tenant_id, slug=slug).first()
    if existing is not None:
        return existing, False
    try:
        return create_space(principal, name=name, slug=slug, description=description), True
    except Conflict:  # created by a concurrent repeat of the same call
        return KnowledgeSpace.objects.get(tenant_id=tenant_id, slug=slug), False


def get_space(principal: Principal, space_id: uuid.UUID | str) -> KnowledgeSpace:
    """The space with this id if the principal may reach it, else :class:`NotFound`."""
    try:
        space_uuid = uuid.UUID(str(space_id))
    except ValueError:
        raise NotFound("knowledge space not found", code="space_not_found") from None
    if not principal.can_reach(space_uuid):
        raise NotFound("knowledge space not found", code="space_not_found")
    space = KnowledgeSpace.objects.filter(id=space_uuid, tenant_id=principal.tenant_id).first()
    if space is None:
        raise NotFound("knowledge space not found", code="space_not_found")
    return space


def get_space_by_slug(principal: Principal, slug: str) -> KnowledgeSpace:
    """Resolve a slug within the principal's tenant (used by the command line)."""
    space = spaces_for(principal).filter(slug=slug).first()
    if space is None:
        raise NotFound(
            f"no knowledge space with slug {slug!r} in tenant {principal.tenant_id!r}",
            code="space_not_found",
        )
    return space


def space_fields(changes: dict[str, Any]) -> dict[str, Any]:
    """The checked row fields of ``changes`` (``name``, ``description``, ``slug``); other keys
    are left to their owners (``embedding_model_id``: retrieval.embedding_profile)."""
    fields: dict[str, Any] = {}
    if "name" in changes:
        fields["name"] = _clean_name(changes["name"])
    if "description" in changes:
        if len(changes["description"] or "") > 2000:
            raise InvalidInput(
                "description must be at most 2000 characters", code="invalid_description"
            )
        fields["description"] = changes["description"] or ""
    if "slug" in changes:
        _check_slug(changes["slug"])
        fields["slug"] = changes["slug"]
    if "chunking" in changes:
        fields["chunking"] = checked_chunking(changes["chunking"])
    return fields


#: A space's chunk size in tokens: the bounds a PATCH accepts (the compiler also never exceeds
#: ``KNOWLEDGE_EMBEDDING_MAX_INPUT_TOKENS``).
CHUNK_SIZE_TOKENS = (16, 8192)
_CHUNKING_KEYS = frozenset({"chunk_size_tokens", "chunk_overlap_tokens"})


def checked_chunking(value: object) -> dict[str, int] | None:
    """A space's ``chunking``: ``null`` (the deployment's) or ``{"chunk_size_tokens": 16..8192,
    "chunk_overlap_tokens": 0..size-1}`` (overlap 0 when left out). 400 ``invalid_chunking``
    naming the member and the rule otherwise; an overlap as large as the size is refused here,
    when it is saved, since a splitter could never move forward with it."""
    if value is None:
        return None

    def refuse(message: str) -> InvalidInput:
        return InvalidInput(f"chunking: {message}", code="invalid_chunking")

    if not isinstance(value, dict):
        raise refuse("must be an object or null")
    unknown = sorted(set(value) - _CHUNKING_KEYS)
    if unknown:
        raise refuse(f"unknown member {unknown[0]!r}")
    size = value.get("chunk_size_tokens")
    overlap = value.get("chunk_overlap_tokens", 0)
    low, high = CHUNK_SIZE_TOKENS
    for name, number in (("chunk_size_tokens", size), ("chunk_overlap_tokens", overlap)):
        if isinstance(number, bool) or not isinstance(number, int):
            raise refuse(f"{name} must be an integer")
    assert isinstance(size, int) and isinstance(overlap, int)  # checked just above
    if not low <= size <= high:
        raise refuse(f"chunk_size_tokens must be between {low} and {high}")
    if overlap < 0:
        raise refuse("chunk_overlap_tokens must be 0 or more")
    if overlap >= size:
        raise refuse(
            f"chunk_overlap_tokens ({overlap}) must be smaller than chunk_size_tokens ({size}): "
            "the overlap must be smaller than the chunk size"
        )
    return {"chunk_size_tokens": size, "chunk_overlap_tokens": overlap}


def update_space(
    principal: Principal,
    space_id: uuid.UUID | str,
    *,
    changes: dict[str, Any],
    expected_revision: int | None = None,
) -> KnowledgeSpace:
    """Apply ``changes`` (``name``, ``description``, ``slug``) by compare-and-set on
    ``revision`` (:func:`apply_space_update`). A model change (``embedding_model_id``) is
    :func:`retrieval.embedding_profile.update_space_and_model`."""
    if changes.get("embedding_model_id") is not None:
        raise ValueError(
            "embedding_model_id: use retrieval.embedding_profile.update_space_and_model"
        )
    space = get_space(principal, space_id)
    return apply_space_update(space, space_fields(changes), expected_revision)


def apply_space_update(
    space: KnowledgeSpace,
    fields: dict[str, Any],
    expected_revision: int | None,
    *,
    also: Callable[[KnowledgeSpace], object] | None = None,
) -> KnowledgeSpace:
    """Write ``fields`` and bump ``revision`` by compare-and-set; returns the space re-read.

    With ``expected_revision`` the update applies only if the stored revision still matches,
    else 409; without it the current revision is used (last writer wins). ``also(space)`` runs
    in the same transaction once the revision was bumped (a model change); nothing to write
    and no ``also`` changes nothing.
    """
    revision = space.revision if expected_revision is None else expected_revision
    if not fields and also is None:
        if revision != space.revision:
            raise Conflict(
                f"knowledge space changed since revision {revision}; re-read it and retry",
                code="revision_conflict",
            )
        return space
    target = KnowledgeSpace.objects.filter(id=space.id)
    if expected_revision is not None:
        target = target.filter(revision=expected_revision)
    try:
        with transaction.atomic():
            updated = target.update(revision=F("revision") + 1, updated_at=timezone.now(), **fields)
            if updated and also is not None:
                also(space)
    except IntegrityError:
        if "slug" not in fields:
            raise
        raise Conflict(
            f"slug {fields.get('slug')!r} is already used in this tenant", code="slug_taken"
        ) from None
    if not updated:
        raise Conflict(
            f"knowledge space changed since revision {revision}; re-read it and retry",
            code="revision_conflict",
        )
    space.refresh_from_db()
    return space


def delete_space(principal: Principal, space_id: uuid.UUID | str) -> None:
    """Delete a space with its documents, nodes, projections, stored objects and the API keys
    bound only to it (:func:`delete_keys_scoped_only_to`; keys bound elsewhere too only lose
    this binding).

    Order: ``space_deletion_requested`` (a receiver may refuse; upgrades does while an
    upgrade into the space runs), the space marked ``deleting_at`` (no longer bindable),
    ``space_emptying`` outside a transaction (ingestion purges documents one by one, each in its
    own transaction), then one transaction under the space's row lock: ``space_emptying`` again
    (what was admitted meanwhile), the keys, ``space_deleting`` (upgrades detaches finished
    jobs), the row.
    """
    space = get_space(principal, space_id)
    # A receiver may refuse here (upgrades: an upgrade into the space is queued or running).
    signals.space_deletion_requested.send(sender=KnowledgeSpace, space=space)
    # From here on the space cannot be bound to an API key (bind_api_key checks under the
    # space's row lock).
    KnowledgeSpace.objects.filter(id=space.id, deleting_at__isnull=True).update(
        deleting_at=timezone.now()
    )
    signals.space_emptying.send(sender=KnowledgeSpace, space=space)  # ingestion: documents
    with transaction.atomic():
        KnowledgeSpace.objects.select_for_update().filter(id=space.id).first()
        # admitted while the first purge ran
        signals.space_emptying.send(sender=KnowledgeSpace, space=space)
        delete_keys_scoped_only_to(space)
        # upgrades: finished upgrades keep their record
        signals.space_deleting.send(sender=KnowledgeSpace, space=space)
        space.delete()
