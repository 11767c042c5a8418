"""Knowledge-space and API-key services: the only code that changes these rows.

A :class:`Principal` is who is calling: a tenant and, for a space-bound API key, the spaces it
may reach. Every lookup goes through :func:`get_space`, so an id from another tenant or outside
the key's scope is a 404, exactly like an id that does not exist.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import secrets
import tempfile
import unicodedata
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Prefetch, Q, QuerySet
from django.utils import timezone

from knowledgefs.auth.principal import Principal
from knowledgefs.errors import Conflict, Forbidden, InvalidInput, NotFound

from . import signals
from .models import (
    SLUG_PATTERN,
    ApiKey,
    ApiKeyBinding,
    BindingType,
    KnowledgeSpace,
    PublicationHead,
)

logger = logging.getLogger("knowledgefs.apikeys")
KEY_PREFIX = "kfs_"
_SLUG_RE = re.compile(SLUG_PATTERN)
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
LAST_USED_RESOLUTION = timedelta(minutes=1)


def validate_tenant_id(tenant_id: str) -> str:
    """Return ``tenant_id`` or raise :class:`InvalidInput` (1–64 of ``A-Za-z0-9_.:-``)."""
    if not isinstance(tenant_id, str) or not _TENANT_RE.fullmatch(tenant_id):
        raise InvalidInput(
            "tenant must be 1-64 characters of letters, digits, '_', '.', ':' or '-'",
            code="invalid_tenant",
        )
    return tenant_id


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


def space_fields(changes: dict) -> dict:
    """The checked row fields of ``changes`` (``name``, ``description``, ``slug``); other keys
    are left to their owners (``embedding_model_id``: retrieval.embedding_profile)."""
    fields: dict = {}
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
    return fields


def update_space(
    principal: Principal,
    space_id: uuid.UUID | str,
    *,
    changes: dict,
    expected_revision: int | None = None,
) -> KnowledgeSpace:
    """Apply ``changes`` (``name``, ``description``, ``slug``) by compare-and-set on
    ``revision`` (:func:`apply_space_update`). A model change (``embedding_model_id``) is
    :func:`retrieval.embedding_profile.update_space`."""
    if changes.get("embedding_model_id") is not None:
        raise ValueError("embedding_model_id: use retrieval.embedding_profile.update_space")
    space = get_space(principal, space_id)
    return apply_space_update(space, space_fields(changes), expected_revision)


def apply_space_update(
    space: KnowledgeSpace,
    fields: dict,
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


# --- API keys -------------------------------------------------------------------------------
#
# A key's scope is its bindings (``ApiKeyBinding``): none = every space of its tenant; some =
# exactly those resources, of which this service honours the ``knowledge_fs_space`` ones. Every
# change that can narrow or end a key (revoke, unbind, delete, a space deleted) goes through
# this section, takes the key's row lock, and invalidates cached authentication results before
# it commits and again once it has (see "Authentication cache" below).

_DATASET_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


@dataclass(frozen=True)
class UnbindResult:
    """What :func:`unbind_api_key` did: ``removed`` the binding (False if it was already gone),
    ``revoked`` the key because that was its last binding, ``remaining`` bindings of the key."""

    key: ApiKey
    removed: bool
    revoked: bool
    remaining: int


def _hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def validate_key_name(name: str) -> str:
    """Return the stripped name or raise ``invalid_name`` (over 120 characters, or a control
    character)."""
    name = (name or "").strip()
    if len(name) > 120 or any(unicodedata.category(c) == "Cc" for c in name):
        raise InvalidInput(
            "name must be at most 120 characters without control characters",
            code="invalid_name",
        )
    return name


def validate_dataset_id(dataset_id: str) -> str:
    """Return ``dataset_id`` or raise ``invalid_binding`` (1-64 of ``A-Za-z0-9_.:-``)."""
    if not isinstance(dataset_id, str) or not _DATASET_ID_RE.fullmatch(dataset_id):
        raise InvalidInput(
            "a dataset id is 1-64 characters of letters, digits, '_', '.', ':' or '-'",
            code="invalid_binding",
        )
    return dataset_id


def _lock_bindable_spaces(tenant_id: str, spaces: list) -> list[KnowledgeSpace]:
    """Lock and return these spaces (objects or ids) for binding; call inside a transaction.

    Raises ``invalid_binding`` for a space of another tenant and ``space_not_bindable`` for one
    that does not exist or whose deletion has started. Space rows are always locked before key
    rows (the order :func:`delete_space` uses).
    """
    ids = []
    for space in spaces:
        try:
            ids.append(uuid.UUID(str(getattr(space, "pk", space))))
        except ValueError:
            raise InvalidInput("not a knowledge-space id", code="invalid_binding") from None
    ids = sorted(set(ids))
    locked = {
        s.id: s
        for s in KnowledgeSpace.objects.select_for_update().filter(id__in=ids).order_by("id")
    }
    for space_id in ids:
        space = locked.get(space_id)
        if space is None:
            raise Conflict(f"knowledge space {space_id} does not exist", code="space_not_bindable")
        if space.tenant_id != tenant_id:
            raise InvalidInput(
                "a key can only be bound to spaces of its own tenant", code="invalid_binding"
            )
        if space.deleting_at is not None:
            raise Conflict(
                f"knowledge space {space.slug!r} is being deleted and cannot be bound",
                code="space_not_bindable",
            )
    return [locked[i] for i in ids]


def create_api_key(
    tenant_id: str,
    *,
    spaces: list[KnowledgeSpace] | None = None,
    datasets: list[str] | None = None,
    name: str = "",
) -> tuple[ApiKey, str]:
    """Create a key for ``tenant_id``; returns ``(key, secret)``.

    ``spaces`` (spaces of the same tenant) and ``datasets`` (Dify dataset ids) become its
    bindings; with neither the key is unrestricted within its tenant. The secret
    ``kfs_<prefix><random>`` is returned once; only its SHA-256 is stored. Errors:
    ``invalid_tenant``, ``invalid_name`` (over 120 characters), ``invalid_binding`` (another
    tenant's space, a malformed dataset id), ``space_not_bindable`` (a space gone or being
    deleted). Key and bindings are written in one transaction.
    """
    validate_tenant_id(tenant_id)
    name = validate_key_name(name)
    dataset_ids = sorted({validate_dataset_id(d) for d in datasets or []})
    prefix = secrets.token_hex(4)
    secret = f"{KEY_PREFIX}{prefix}{secrets.token_urlsafe(32)}"
    with transaction.atomic():
        bound = _lock_bindable_spaces(tenant_id, list(spaces or []))
        key = ApiKey.objects.create(
            tenant_id=tenant_id, name=name, prefix=prefix, key_hash=_hash_secret(secret)
        )
        ApiKeyBinding.objects.bulk_create(
            [
                ApiKeyBinding(api_key=key, resource_type=BindingType.KNOWLEDGE_FS_SPACE, space=s)
                for s in bound
            ]
            + [
                ApiKeyBinding(api_key=key, resource_type=BindingType.DATASET, dataset_id=d)
                for d in dataset_ids
            ]
        )
    logger.info(
        "created API key %s for tenant %s with %d bindings",
        prefix,
        tenant_id,
        len(bound) + len(dataset_ids),
    )
    return key, secret


def _lock_key(key: ApiKey | uuid.UUID | str) -> ApiKey:
    """Re-read a key under its row lock (inside a transaction), or ``api_key_not_found``."""
    key_id = getattr(key, "pk", key)
    locked = ApiKey.objects.select_for_update().filter(id=key_id).first()
    if locked is None:
        raise NotFound("no such API key", code="api_key_not_found")
    return locked


def bind_api_key(
    key: ApiKey, space: KnowledgeSpace | None = None, *, dataset_id: str | None = None
) -> ApiKeyBinding:
    """Bind ``key`` to one more resource (a space of its tenant, or a Dify dataset id); returns
    the binding (the existing one if it was already bound).

    Binding an unrestricted key **narrows** it to that one resource. Errors:
    ``api_key_not_found``, ``api_key_revoked`` (409), ``invalid_binding`` (neither or both
    targets, another tenant's space, a malformed dataset id), ``space_not_bindable`` (409: the
    space is gone or being deleted). Cached authentication results are invalidated.
    """
    if (space is None) == (dataset_id is None):
        raise InvalidInput("bind to exactly one space or one dataset", code="invalid_binding")
    if dataset_id is not None:
        validate_dataset_id(dataset_id)
    with transaction.atomic():
        locked_space = None
        if space is not None:
            tenant = ApiKey.objects.filter(pk=key.pk).values_list("tenant_id", flat=True).first()
            if tenant is None:
                raise NotFound("no such API key", code="api_key_not_found")
            (locked_space,) = _lock_bindable_spaces(tenant, [space])
        locked = _lock_key(key)
        if locked.revoked_at is not None:
            raise Conflict(f"API key {locked.prefix} is revoked", code="api_key_revoked")
        if locked_space is not None:
            binding, created = ApiKeyBinding.objects.get_or_create(
                api_key=locked,
                space=locked_space,
                defaults={"resource_type": BindingType.KNOWLEDGE_FS_SPACE},
            )
        else:
            binding, created = ApiKeyBinding.objects.get_or_create(
                api_key=locked,
                dataset_id=dataset_id,
                defaults={"resource_type": BindingType.DATASET},
            )
        if created:
            _invalidate_authentication([locked.key_hash])
    return binding


def unbind_api_key(
    key: ApiKey, space_or_binding: KnowledgeSpace | ApiKeyBinding | str
) -> UnbindResult:
    """Remove one binding of ``key``: given as the binding, the bound space, or a dataset id.

    If it was the key's last binding the key is **revoked in the same transaction** (a key with
    no bindings would otherwise reach the whole tenant); ``UnbindResult.revoked`` says so. A
    binding already gone is not an error (``removed`` False). Errors: ``api_key_not_found``,
    ``invalid_binding`` (a binding of another key). Cached authentication results are
    invalidated before the commit and again after it.
    """
    with transaction.atomic():
        locked = _lock_key(key)
        bindings = ApiKeyBinding.objects.filter(api_key=locked)
        if isinstance(space_or_binding, ApiKeyBinding):
            if space_or_binding.api_key_id != locked.id:
                raise InvalidInput("that binding belongs to another key", code="invalid_binding")
            target = bindings.filter(id=space_or_binding.id)
        elif isinstance(space_or_binding, KnowledgeSpace):
            target = bindings.filter(space_id=space_or_binding.id)
        else:
            target = bindings.filter(dataset_id=str(space_or_binding))
        removed, _ = target.delete()
        remaining = bindings.count()
        revoked = False
        if removed and remaining == 0 and locked.revoked_at is None:
            revoked = bool(
                ApiKey.objects.filter(id=locked.id, revoked_at__isnull=True).update(
                    revoked_at=timezone.now()
                )
            )
        if removed:
            _invalidate_authentication([locked.key_hash])
    locked.refresh_from_db()
    if revoked:
        logger.info("revoked API key %s: its last binding was removed", locked.prefix)
    return UnbindResult(key=locked, removed=bool(removed), revoked=revoked, remaining=remaining)


def get_api_key(key_or_prefix: ApiKey | str) -> ApiKey:
    """Find a key by its secret (``kfs_…``), its visible prefix (8 hex characters, with or
    without ``kfs_``) or an :class:`ApiKey`; ``api_key_not_found`` otherwise."""
    if isinstance(key_or_prefix, ApiKey):
        key = ApiKey.objects.filter(pk=key_or_prefix.pk).first()
    else:
        value = str(key_or_prefix).strip()
        if value.startswith(KEY_PREFIX) and len(value) > len(KEY_PREFIX) + 8:
            key = ApiKey.objects.filter(key_hash=_hash_secret(value)).first()
        elif value.removeprefix(KEY_PREFIX):
            key = ApiKey.objects.filter(prefix=value.removeprefix(KEY_PREFIX)).first()
        else:
            key = None
    if key is None:
        raise NotFound("no API key matches that key or prefix", code="api_key_not_found")
    return key


def revoke_api_key(key_or_prefix: ApiKey | str) -> ApiKey:
    """Revoke a key given as an :class:`ApiKey`, its secret or its visible prefix; returns it.

    Effective on the next request in every process: cached authentication results are
    invalidated before the revocation commits and again after it. Revoking a revoked key
    changes nothing. Errors: ``api_key_not_found``.
    """
    key = get_api_key(key_or_prefix)
    with transaction.atomic():
        locked = _lock_key(key)
        if locked.revoked_at is None:
            _invalidate_authentication([locked.key_hash])
            ApiKey.objects.filter(id=locked.id).update(revoked_at=timezone.now())
    locked.refresh_from_db()
    logger.info("revoked API key %s of tenant %s", locked.prefix, locked.tenant_id)
    return locked


def delete_api_key(key: ApiKey) -> None:
    """Delete a key and its bindings (the admin's delete); cached results are invalidated
    first. A key already gone is not an error."""
    with transaction.atomic():
        locked = ApiKey.objects.select_for_update().filter(pk=key.pk).first()
        if locked is None:
            return
        _invalidate_authentication([locked.key_hash])
        locked.delete()
    logger.info("deleted API key %s of tenant %s", locked.prefix, locked.tenant_id)


def list_api_keys(tenant_id: str) -> QuerySet[ApiKey]:
    """A tenant's keys, newest first, with their bindings (and bound spaces) prefetched.

    Never exposes secrets; :func:`describe_api_key` turns one into a JSON-ready dict.
    Errors: ``invalid_tenant``.
    """
    validate_tenant_id(tenant_id)
    return (
        ApiKey.objects.filter(tenant_id=tenant_id)
        .prefetch_related(
            Prefetch("bindings", queryset=ApiKeyBinding.objects.select_related("space"))
        )
        .order_by("-created_at", "-id")
    )


def describe_api_key(key: ApiKey) -> dict:
    """``{id, prefix, name, tenant_id, state: active|revoked, bindings: [{type, space_id,
    space_slug, dataset_id}], created_at, last_used_at, revoked_at}`` (ISO times or null)."""

    def iso(value):
        return value.isoformat() if value else None

    return {
        "id": str(key.id),
        "prefix": key.prefix,
        "name": key.name,
        "tenant_id": key.tenant_id,
        "state": "active" if key.revoked_at is None else "revoked",
        "bindings": [
            {
                "type": b.resource_type,
                "space_id": str(b.space_id) if b.space_id else None,
                "space_slug": b.space.slug if b.space_id else None,
                "dataset_id": b.dataset_id,
            }
            for b in sorted(key.bindings.all(), key=lambda b: b.id)
        ],
        "created_at": iso(key.created_at),
        "last_used_at": iso(key.last_used_at),
        "revoked_at": iso(key.revoked_at),
    }


def delete_keys_scoped_only_to(space: KnowledgeSpace) -> list[uuid.UUID]:
    """Delete the keys whose **only** binding is ``space`` and invalidate every key bound to it.

    Call it inside the transaction that deletes the space (:func:`delete_space`, and a
    ``pre_delete`` guard for any other deletion): keys bound elsewhere too only lose this binding
    (the cascade) and stay narrowed; none ever drops to zero bindings, which would make it
    unrestricted. The key rows are locked (in id order) before their bindings are counted, so a
    concurrent :func:`unbind_api_key` either runs first and is seen, or waits and then sees this
    binding gone. Returns the ids of the deleted keys.
    """
    KnowledgeSpace.objects.select_for_update().filter(id=space.pk).first()  # no new bindings
    bound_ids = list(
        ApiKeyBinding.objects.filter(space_id=space.pk).values_list("api_key_id", flat=True)
    )
    if not bound_ids:
        return []
    keys = list(ApiKey.objects.select_for_update().filter(id__in=bound_ids).order_by("id"))
    counts = dict(
        ApiKeyBinding.objects.filter(api_key_id__in=[k.id for k in keys])
        .values_list("api_key_id")
        .annotate(n=Count("id"))
        .values_list("api_key_id", "n")
    )
    _invalidate_authentication([k.key_hash for k in keys])
    only_here = [k.id for k in keys if counts.get(k.id, 0) <= 1]
    ApiKey.objects.filter(id__in=only_here).delete()
    if only_here:
        logger.info("deleted %d API keys bound only to space %s", len(only_here), space.pk)
    return only_here


# --- Authentication cache -------------------------------------------------------------------
#
# ``authenticate_secret`` caches ``{id, tenant_id, space_ids, epoch}`` per key hash in the
# Django cache for ``KNOWLEDGE_AUTH_CACHE_SECONDS``. Every cached record carries the
# **revocation epoch** read before the database read that produced it, and is used only while
# the epoch is unchanged. Each revocation, unbind, bind or key deletion replaces the epoch
# (and deletes the key's entry) before its transaction commits and again after it, so once it
# returns no process can use a record read before the change. The epoch lives where every
# process can see it: a small file in KNOWLEDGE_VAR_DIR (``KNOWLEDGE_AUTH_EPOCH_FILE``) with
# the per-process locmem cache, or a key in the shared cache when ``REDIS_URL`` is set (which
# also closes the race where a request that read the key just before the revocation writes its
# record into Redis just after the entry was deleted). The epoch is a random token, replaced
# atomically (write + rename), so two changes never look alike. Unknown and revoked keys are
# never cached.

_EPOCH_CACHE_KEY = "kfs:apikey:epoch"
_ABSENT = "absent"


def _auth_cache_key(key_hash: str) -> str:
    return f"kfs:apikey:{key_hash}"


def _used_cache_key(key_hash: str) -> str:
    return f"kfs:apikey-used:{key_hash}"


def _read_file_epoch() -> str | None:
    """The epoch file's token, ``"absent"`` before the first change, ``None`` if unreadable
    (then nothing is cached or trusted)."""
    try:
        with open(settings.KNOWLEDGE_AUTH_EPOCH_FILE, "rb") as handle:
            return handle.read(128).decode("ascii", "replace") or _ABSENT
    except FileNotFoundError:
        return _ABSENT
    except OSError:
        logger.warning("cannot read the API-key revocation epoch file; not caching")
        return None


def _bump_epoch() -> None:
    """Replace the revocation epoch with a fresh random token (raises if it cannot)."""
    token = secrets.token_hex(16)
    if settings.KNOWLEDGE_AUTH_CACHE_SHARED:
        cache.set(_EPOCH_CACHE_KEY, token, None)
        return
    path = Path(settings.KNOWLEDGE_AUTH_EPOCH_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".epoch-")
    try:
        os.write(fd, token.encode())
        os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _invalidate_authentication(key_hashes: list[str]) -> None:
    """Invalidate cached authentication now and again when the transaction commits.

    The first round raises if the epoch cannot be replaced, so the change does not commit; the
    second runs after the commit (a failure there is logged: the first round already stopped
    every record read before the change).
    """
    cache_keys = [_auth_cache_key(h) for h in key_hashes]

    def forget() -> None:
        _bump_epoch()
        cache.delete_many(cache_keys)

    forget()

    def forget_after_commit() -> None:
        try:
            forget()
        except Exception:
            logger.exception("could not invalidate cached API-key authentication after commit")

    transaction.on_commit(forget_after_commit)


def _current_epoch(cached: dict) -> str | None:
    if settings.KNOWLEDGE_AUTH_CACHE_SHARED:
        return cached.get(_EPOCH_CACHE_KEY) or _ABSENT
    return _read_file_epoch()


def _load_key_record(key_hash: str, epoch: str | None) -> tuple[dict, float | None] | None:
    """Read an active key and its scope: ``({id, tenant_id, space_ids, epoch}, last_used)``,
    or ``None`` for an unknown or revoked key."""
    # The lookup is by the SHA-256 of the secret, so comparing secrets leaks no timing.
    key = ApiKey.objects.filter(key_hash=key_hash, revoked_at__isnull=True).first()
    if key is None:
        return None
    bindings = list(key.bindings.values_list("resource_type", "space_id"))
    space_ids = (
        sorted(str(s) for t, s in bindings if t == BindingType.KNOWLEDGE_FS_SPACE)
        if bindings
        else None
    )
    record = {"id": str(key.id), "tenant_id": key.tenant_id, "space_ids": space_ids, "epoch": epoch}
    return record, (key.last_used_at.timestamp() if key.last_used_at else None)


def authenticate_secret(secret: str) -> Principal | None:
    """Return the principal for a presented secret, or ``None`` (unknown or revoked key).

    Scope: no bindings → ``space_ids=None`` (the whole tenant); otherwise the bound
    ``knowledge_fs_space`` ids (an empty set for a key bound only to datasets). Results are
    cached for ``KNOWLEDGE_AUTH_CACHE_SECONDS`` (0 = read the key every time) and dropped at
    once by any revocation or scope change (module notes above); a cached request costs one
    cache read and one small file read (locmem) or one cache round trip (Redis), no database
    query. ``last_used_at`` is written at most once a minute (an UPDATE conditioned on the stored
    time, so processes that each think it is due still write the row once).
    """
    if not secret.startswith(KEY_PREFIX) or len(secret) > 200:
        return None
    key_hash = _hash_secret(secret)
    ttl = settings.KNOWLEDGE_AUTH_CACHE_SECONDS
    entry_key, used_key = _auth_cache_key(key_hash), _used_cache_key(key_hash)
    record = last_used = epoch = None
    if ttl:
        names = [entry_key, used_key]
        if settings.KNOWLEDGE_AUTH_CACHE_SHARED:
            names.append(_EPOCH_CACHE_KEY)
        cached = cache.get_many(names)
        # Read before the database read below: a record is stored with the epoch that was
        # current before the key was read, so a change committed after that read is noticed.
        epoch = _current_epoch(cached)
        found = cached.get(entry_key)
        if found is not None and epoch is not None and found.get("epoch") == epoch:
            record, last_used = found, cached.get(used_key)
    remember = None  # a last-used time to put in the cache
    if record is None:
        loaded = _load_key_record(key_hash, epoch)
        if loaded is None:
            return None  # unknown or revoked: never cached
        record, last_used = loaded
        if ttl and epoch is not None:
            cache.set(entry_key, record, ttl)
            remember = last_used
    now = timezone.now()
    resolution = LAST_USED_RESOLUTION.total_seconds()
    if last_used is None or now.timestamp() - last_used >= resolution:
        ApiKey.objects.filter(id=record["id"]).filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lte=now - LAST_USED_RESOLUTION)
        ).update(last_used_at=now)
        remember = now.timestamp()
    if ttl and remember is not None:
        cache.set(used_key, remember, max(ttl, int(resolution)))
    space_ids = record["space_ids"]
    return Principal(
        tenant_id=record["tenant_id"],
        space_ids=frozenset(uuid.UUID(s) for s in space_ids) if space_ids is not None else None,
        api_key_id=uuid.UUID(record["id"]),
        kind="api_key",
        subject=f"key:{record['id']}",
    )
