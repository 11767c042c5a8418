"""API keys and their bindings: the only code that creates, narrows or ends a key.

A key's scope is its bindings; every change that can narrow or end a key takes the key's row
lock and invalidates cached authentication results (:mod:`spaces.key_auth`) before it commits
and again once it has.
"""

from __future__ import annotations

import logging
import re
import secrets
import unicodedata
import uuid
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Count, Prefetch, QuerySet
from django.utils import timezone

from knowledgefs.errors import Conflict, InvalidInput, NotFound

from .key_auth import KEY_PREFIX, hash_secret, invalidate_authentication
from .models import (
    ApiKey,
    ApiKeyBinding,
    BindingType,
    KnowledgeSpace,
    validate_tenant_id,
)

logger = logging.getLogger("knowledgefs.apikeys")


# --- API keys -------------------------------------------------------------------------------
#
# A key's scope is its bindings (``ApiKeyBinding``): none = every space of its tenant; some =
# exactly those resources, of which this service honours the ``knowledge_fs_space`` ones. Every
# change that can narrow or end a key (revoke, unbind, delete, a space deleted) goes through
# this section, takes the key's row lock, and invalidates cached authentication results before
# it commits and again once it has (spaces/key_auth.py, "Authentication cache").

_DATASET_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


@dataclass(frozen=True)
class UnbindResult:
    """What :func:`unbind_api_key` did: ``removed`` the binding (False if it was already gone),
    ``revoked`` the key because that was its last binding, ``remaining`` bindings of the key."""

    key: ApiKey
    removed: bool
    revoked: bool
    remaining: int


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
    ``kfs_<prefix><random>`` is returned once; only its SHA-256 is stored. ``name``: at most
    120 characters. Key and bindings are written in one transaction.
    """
    validate_tenant_id(tenant_id)
    name = validate_key_name(name)
    dataset_ids = sorted({validate_dataset_id(d) for d in datasets or []})
    prefix = secrets.token_hex(4)
    secret = f"{KEY_PREFIX}{prefix}{secrets.token_urlsafe(32)}"
    with transaction.atomic():
        bound = _lock_bindable_spaces(tenant_id, list(spaces or []))
        key = ApiKey.objects.create(
            tenant_id=tenant_id, name=name, prefix=prefix, key_hash=hash_secret(secret)
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
    key_id = key.pk if isinstance(key, ApiKey) else key
    locked = ApiKey.objects.select_for_update().filter(id=key_id).first()
    if locked is None:
        raise NotFound("no such API key", code="api_key_not_found")
    return locked


def bind_api_key(
    key: ApiKey, space: KnowledgeSpace | None = None, *, dataset_id: str | None = None
) -> ApiKeyBinding:
    """Bind ``key`` to one more resource (a space of its tenant, or a Dify dataset id); returns
    the binding (the existing one if it was already bound).

    Binding an unrestricted key **narrows** it to that one resource; exactly one target.
    Cached authentication results are invalidated.
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
            invalidate_authentication([locked.key_hash])
    return binding


def unbind_api_key(
    key: ApiKey, space_or_binding: KnowledgeSpace | ApiKeyBinding | str
) -> UnbindResult:
    """Remove one binding of ``key``: given as the binding, the bound space, or a dataset id.

    If it was the key's last binding the key is **revoked in the same transaction** (a key with
    no bindings would otherwise reach the whole tenant); ``UnbindResult.revoked`` says so. A
    binding already gone is not an error (``removed`` False). Cached authentication results
    are invalidated before the commit and again after it.
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
            invalidate_authentication([locked.key_hash])
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
            key = ApiKey.objects.filter(key_hash=hash_secret(value)).first()
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
    changes nothing.
    """
    key = get_api_key(key_or_prefix)
    with transaction.atomic():
        locked = _lock_key(key)
        if locked.revoked_at is None:
            invalidate_authentication([locked.key_hash])
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
        invalidate_authentication([locked.key_hash])
        locked.delete()
    logger.info("deleted API key %s of tenant %s", locked.prefix, locked.tenant_id)


def list_api_keys(tenant_id: str) -> QuerySet[ApiKey]:
    """A tenant's keys, newest first, with their bindings (and bound spaces) prefetched.

    Never exposes secrets; :func:`describe_api_key` turns one into a JSON-ready dict.
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
                "space_slug": b.space.slug if b.space is not None else None,
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
    invalidate_authentication([k.key_hash for k in keys])
    only_here = [k.id for k in keys if counts.get(k.id, 0) <= 1]
    ApiKey.objects.filter(id__in=only_here).delete()
    if only_here:
        logger.info("deleted %d API keys bound only to space %s", len(only_here), space.pk)
    return only_here
