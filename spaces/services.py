"""Knowledge-space and API-key services: the only code that changes these rows.

A :class:`Principal` is who is calling: a tenant and, for a space-bound API key, the spaces it
may reach. Every lookup goes through :func:`get_space`, so an id from another tenant or outside
the key's scope is a 404, exactly like an id that does not exist.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import unicodedata
import uuid
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.db.models import Count, F, QuerySet
from django.utils import timezone

from knowledgefs.auth.principal import Principal
from knowledgefs.errors import Conflict, Forbidden, InvalidInput, NotFound

from .models import SLUG_PATTERN, ApiKey, KnowledgeSpace, PublicationHead

KEY_PREFIX = "kfs_"
_SLUG_RE = re.compile(SLUG_PATTERN)
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
LAST_USED_RESOLUTION = timedelta(minutes=1)


def validate_tenant_id(tenant_id: str) -> str:
    """Return ``tenant_id`` or raise :class:`InvalidInput` (1–64 of ``A-Za-z0-9_.:-``)."""
    if not isinstance(tenant_id, str) or not _TENANT_RE.match(tenant_id):
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


def create_space(
    principal: Principal, *, name: str, slug: str | None = None, description: str = ""
) -> KnowledgeSpace:
    """Create a space and its publication head in one transaction.

    A given slug must match ``^[a-z0-9]+(?:-[a-z0-9]+)*$`` and be free in the tenant (409
    ``slug_taken``); without one a slug is derived from the name, with ``-2`` … ``-20`` tried on
    collision. A space-bound key cannot create spaces (403 ``key_scope_forbids_create``).
    """
    if principal.space_ids is not None:
        raise Forbidden(
            "this API key is bound to specific knowledge spaces and cannot create new ones",
            code="key_scope_forbids_create",
        )
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
    if not isinstance(slug, str) or len(slug) > 160 or not _SLUG_RE.match(slug):
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


def update_space(
    principal: Principal,
    space_id: uuid.UUID | str,
    *,
    changes: dict,
    expected_revision: int | None = None,
) -> KnowledgeSpace:
    """Apply ``changes`` (``name``, ``description``, ``slug``, ``embedding_model_id``) by
    compare-and-set on ``revision``.

    With ``expected_revision`` the update applies only if the stored revision still matches,
    else 409 ``revision_conflict``; without it the current revision is used (last writer wins).
    ``embedding_model_id`` (400 ``unknown_embedding_model`` unless registered) starts a new
    index version built beside the live one (:func:`retrieval.indexing.change_embedding_model`);
    the space's ``embedding_model_id`` changes when that version takes over. Asking for the
    model already in use changes nothing.
    """
    space = get_space(principal, space_id)
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
    model_id = changes.get("embedding_model_id")
    model_change = False
    if model_id is not None:
        from retrieval.indexing import model_change_needed, resolve_model

        resolve_model(model_id)
        model_change = model_change_needed(space, model_id)
    revision = space.revision if expected_revision is None else expected_revision
    if not fields and not model_change:
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
            if updated and model_change:
                from retrieval.indexing import change_embedding_model

                change_embedding_model(space, model_id)
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
    bound only to it.

    Documents are purged one by one (each in its own transaction, so a long purge does not hold
    the database); the space row then goes in one transaction that first purges anything
    admitted meanwhile.
    """
    from ingestion.services.documents import purge_documents

    space = get_space(principal, space_id)
    purge_documents(space.documents.all())
    with transaction.atomic():
        KnowledgeSpace.objects.select_for_update().filter(id=space.id).first()
        purge_documents(space.documents.all())  # admitted while the first purge ran
        # Annotate before filtering on the binding: the count must see all of a key's spaces.
        only_here = ApiKey.objects.annotate(bound=Count("spaces", distinct=True)).filter(
            scoped=True, spaces=space, bound=1
        )
        for key in only_here:
            _forget_cached_key(key.key_hash)
            key.delete()
        space.delete()


# --- API keys -------------------------------------------------------------------------------


def _hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_api_key(
    tenant_id: str, *, spaces: list[KnowledgeSpace] | None = None, name: str = ""
) -> tuple[ApiKey, str]:
    """Create a key for ``tenant_id`` (bound to ``spaces`` if given); returns ``(key, secret)``.

    The secret ``kfs_<prefix><random>`` is returned once; only its SHA-256 is stored.
    """
    validate_tenant_id(tenant_id)
    for space in spaces or []:
        if space.tenant_id != tenant_id:
            raise InvalidInput(
                "a key can only be bound to spaces of its own tenant", code="invalid_binding"
            )
    prefix = secrets.token_hex(4)
    secret = f"{KEY_PREFIX}{prefix}{secrets.token_urlsafe(32)}"
    with transaction.atomic():
        key = ApiKey.objects.create(
            tenant_id=tenant_id,
            name=name,
            prefix=prefix,
            key_hash=_hash_secret(secret),
            scoped=bool(spaces),
        )
        if spaces:
            key.spaces.set(spaces)
    return key, secret


def revoke_api_key(key_or_prefix: str) -> ApiKey:
    """Revoke a key given its secret or its visible prefix; effective on the next request.

    The cached authentication result is deleted before the revocation commits and again
    after it, so a request racing the revocation cannot leave a stale entry behind. (The cache
    is shared only when ``REDIS_URL`` is set; otherwise results are not cached at all.)
    """
    value = key_or_prefix.strip()
    if value.startswith(KEY_PREFIX) and len(value) > len(KEY_PREFIX) + 8:
        key = ApiKey.objects.filter(key_hash=_hash_secret(value)).first()
    else:
        key = ApiKey.objects.filter(prefix=value.removeprefix(KEY_PREFIX)).first()
    if key is None:
        raise NotFound("no API key matches that key or prefix", code="api_key_not_found")
    with transaction.atomic():
        _forget_cached_key(key.key_hash)
        ApiKey.objects.filter(id=key.id, revoked_at__isnull=True).update(revoked_at=timezone.now())
    key.refresh_from_db()
    return key


def _forget_cached_key(key_hash: str) -> None:
    """Delete a key's cached authentication now and again when the transaction commits."""
    cache_key = _auth_cache_key(key_hash)
    cache.delete(cache_key)
    transaction.on_commit(lambda: cache.delete(cache_key))


def _auth_cache_key(key_hash: str) -> str:
    return f"kfs:apikey:{key_hash}"


def authenticate_secret(secret: str) -> Principal | None:
    """Return the principal for a presented secret, or ``None`` (unknown or revoked key).

    With a shared cache (``KNOWLEDGE_AUTH_CACHE_SECONDS`` > 0, the default only when
    ``REDIS_URL`` is set) results are cached per key hash for at most that long from the
    database read; :func:`revoke_api_key` deletes the entry. A per-process cache could not be
    invalidated by a revocation made in another process, so without Redis every request reads
    the key from the database (one indexed lookup). ``last_used_at`` is written at most once a
    minute.
    """
    if not secret.startswith(KEY_PREFIX) or len(secret) > 200:
        return None
    key_hash = _hash_secret(secret)
    ttl = settings.KNOWLEDGE_AUTH_CACHE_SECONDS
    cache_key = _auth_cache_key(key_hash)
    cached = cache.get(cache_key) if ttl else None
    now = timezone.now().timestamp()
    if cached is None:
        # The lookup is by the SHA-256 of the secret, so comparing secrets leaks no timing.
        key = ApiKey.objects.filter(key_hash=key_hash, revoked_at__isnull=True).first()
        if key is None:
            return None
        space_ids = list(key.spaces.values_list("id", flat=True))
        cached = {
            "id": str(key.id),
            "tenant_id": key.tenant_id,
            "space_ids": [str(s) for s in space_ids] if key.scoped else None,
            "last_used_at": key.last_used_at.timestamp() if key.last_used_at else 0,
            "expires_at": now + ttl,
        }
        if ttl:
            cache.set(cache_key, cached, ttl)
    if now - cached["last_used_at"] >= LAST_USED_RESOLUTION.total_seconds():
        ApiKey.objects.filter(id=cached["id"]).update(last_used_at=timezone.now())
        cached["last_used_at"] = now
        remaining = int(cached["expires_at"] - now)
        if ttl and remaining > 0:
            cache.set(cache_key, cached, remaining)  # keeps the original expiry
    space_ids = cached["space_ids"]
    return Principal(
        tenant_id=cached["tenant_id"],
        space_ids=frozenset(uuid.UUID(s) for s in space_ids) if space_ids is not None else None,
        api_key_id=uuid.UUID(cached["id"]),
        kind="api_key",
        subject=f"key:{cached['id']}",
    )
