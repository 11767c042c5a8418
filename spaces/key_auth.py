"""API-key authentication: a secret to its :class:`Principal`, through a revocation-safe cache.

``authenticate_secret`` caches ``{id, tenant_id, space_ids, epoch}`` per key hash in the Django
cache; every change that narrows or ends a key (:mod:`spaces.api_keys`) replaces the revocation
epoch through :func:`invalidate_authentication` before and after it commits, so no process uses
a record read before the change (the section comment below).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from knowledgefs.auth.principal import Principal

from .models import (
    ApiKey,
    BindingType,
)

logger = logging.getLogger("knowledgefs.apikeys")
KEY_PREFIX = "kfs_"
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_secret(secret: str) -> str:
    """The stored form of a key's secret: its SHA-256, hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


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


def invalidate_authentication(key_hashes: list[str]) -> None:
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
    key_hash = hash_secret(secret)
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
