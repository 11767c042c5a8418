"""Fixed-window rate limits keyed by tenant, caller and operation.

Rates come from ``KNOWLEDGE_RATE_LIMITS`` (``{"default": "1200/minute", "<operation id>":
"N/second|minute|hour|day" or null}``). Each window is one counter in the Django cache
(``add`` then ``incr``: atomic in locmem and Redis), so a key costs O(1) memory and time,
unlike DRF's sliding log. With locmem every process counts for itself; set ``REDIS_URL`` to
share the counters. A refused request is 429 ``rate_limited`` with ``Retry-After`` (seconds to
the end of the window).
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.cache import cache
from rest_framework import exceptions
from rest_framework.throttling import BaseThrottle

from .operations import operation_for
from .principal import Principal
from .rates import PERIODS, parse_rate

if TYPE_CHECKING:  # DRF loads this class while rest_framework.views is still importing
    from rest_framework.request import Request
    from rest_framework.views import APIView


class OperationThrottle(BaseThrottle):
    """One fixed window per (tenant, caller, operation)."""

    def __init__(self) -> None:
        self._wait: float | None = None

    def allow_request(self, request: Request, view: APIView) -> bool:
        operation = operation_for(view, request.method or "GET")
        principal = request.user
        if operation is None or not isinstance(principal, Principal):
            return True
        rates = settings.KNOWLEDGE_RATE_LIMITS
        name = operation.operation_id
        limit = parse_rate(name, rates.get(name, rates["default"]))
        if limit is None:
            return True
        count, period = limit
        now = time.time()
        window = int(now // period) * period
        identity = f"{principal.tenant_id}\x00{principal.owner}\x00{name}\x00{window}"
        key = "kfs:throttle:" + hashlib.sha256(identity.encode()).hexdigest()[:40]
        cache.add(key, 0, timeout=period + 1)
        try:
            used = cache.incr(key)
        except ValueError:  # evicted between add and incr
            cache.add(key, 1, timeout=period + 1)
            used = 1
        if used > count:
            self._wait = window + period - now
            unit = next(u for u, seconds in PERIODS.items() if seconds == period)
            raise exceptions.Throttled(
                wait=math.ceil(self._wait),
                detail=f"rate limit of {count} requests per {unit} for {name} reached.",
                code="rate_limited",
            )
        return True

    def wait(self) -> float | None:
        return math.ceil(self._wait) if self._wait is not None else None
