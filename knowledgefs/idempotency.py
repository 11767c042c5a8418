"""``Idempotency-Key`` support for POST routes (the convention of Stripe and the IETF draft
"The Idempotency-Key HTTP Header Field").

The first request with a key runs and its successful (2xx) response is stored; a retry with the
same key and the same request gets that response again with ``Idempotent-Replayed: true`` and
nothing runs twice. Errors are not stored, so a retry after a 4xx or 5xx runs again (also a
retry racing the failing first attempt: it runs again, or is 409 ``idempotency_key_in_progress``
while the key stays contended; never a 500). Keys are per API key, 1–255 printable ASCII
characters, kept 24 hours.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.response import Response

from .auth.principal import Principal
from .errors import Conflict, InvalidInput, ServiceError
from .models import IdempotencyRecord

HEADER = "HTTP_IDEMPOTENCY_KEY"
RETENTION = timedelta(hours=24)


class KeyReused(ServiceError):
    status = 422
    code = "idempotency_key_reused"


def fingerprint(*parts: str | bytes) -> str:
    """SHA-256 over the parts that define a request."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\x00")
    return digest.hexdigest()


def idempotent(
    request: Request, request_fingerprint: str, handler: Callable[[], Response]
) -> Response:
    """Run ``handler`` once per ``Idempotency-Key``; without the header just run it.

    A replay of the same key and request answers the stored response; a key still running or
    used for another request is refused (codes: docs/api.md).
    """
    key = request.META.get(HEADER)
    if key is None:
        return handler()
    # Records belong to the API key that made the request, so one key can never replay a
    # response another key (perhaps with a wider scope) received.
    principal = request.user
    if not isinstance(principal, Principal):
        raise TypeError("idempotent() needs an authenticated request")
    owner = principal.owner
    if not 1 <= len(key) <= 255 or not key.isascii() or not key.isprintable():
        raise InvalidInput(
            "Idempotency-Key must be 1-255 printable ASCII characters",
            code="invalid_idempotency_key",
        )
    IdempotencyRecord.objects.filter(created_at__lt=timezone.now() - RETENTION).delete()
    record = _claim(owner, key, request_fingerprint)
    if isinstance(record, Response):
        return record
    try:
        response = handler()
    except BaseException:
        record.delete()
        raise
    if 200 <= response.status_code < 300:
        record.status = response.status_code
        record.body = response.data
        record.save(update_fields=["status", "body"])
    else:
        record.delete()
    return response


CLAIM_ATTEMPTS = 3


def _claim(owner: str, key: str, request_fingerprint: str) -> IdempotencyRecord | Response:
    """Insert this request's record, or answer from the record already there.

    A record can vanish between a failed insert and the read that follows: the attempt that
    held it failed and deleted it (errors are not stored). The key is then free and the insert
    is tried again, at most :data:`CLAIM_ATTEMPTS` times (3: each retry follows another
    attempt's whole failed run); a key still contended after that is 409
    ``idempotency_key_in_progress``, never a 500.
    """
    for _ in range(CLAIM_ATTEMPTS):
        try:
            with transaction.atomic():
                return IdempotencyRecord.objects.create(
                    owner=owner, key=key, fingerprint=request_fingerprint
                )
        except IntegrityError:
            existing = IdempotencyRecord.objects.filter(owner=owner, key=key).first()
        if existing is None:
            continue  # the holder failed and released the key: claim it again
        if existing.fingerprint != request_fingerprint:
            raise KeyReused("this Idempotency-Key was already used for a different request")
        if existing.status is None:
            break
        response = Response(existing.body, status=existing.status)
        response["Idempotent-Replayed"] = "true"
        return response
    raise Conflict(
        "a request with this Idempotency-Key is still running; retry later",
        code="idempotency_key_in_progress",
    )
