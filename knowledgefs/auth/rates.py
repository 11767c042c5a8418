"""Rate-limit strings (``"N/minute"``), checked while settings load (nothing here needs them)."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ImproperlyConfigured

PERIODS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def parse_rate(name: str, rate: str | None) -> tuple[int, int] | None:
    """``"N/period"`` → ``(N, seconds)``; ``None`` means unlimited. Raises
    :class:`ImproperlyConfigured` naming the operation for anything else."""
    if rate is None:
        return None
    count, _, period = str(rate).partition("/")
    period = period.strip()
    if period.endswith("s") and period[:-1] in PERIODS:
        period = period[:-1]  # "minutes" reads as "minute"
    if not count.strip().isdigit() or int(count) < 1 or period not in PERIODS:
        raise ImproperlyConfigured(
            f"KNOWLEDGE_RATE_LIMITS[{name!r}] must be 'N/second|minute|hour|day' or null, "
            f"not {rate!r}"
        )
    return int(count), PERIODS[period]


def validate_rates(rates: dict[str, Any]) -> dict[str, Any]:
    """Check every configured rate and that ``default`` is present; returns ``rates``."""
    if not isinstance(rates, dict) or "default" not in rates:
        raise ImproperlyConfigured("KNOWLEDGE_RATE_LIMITS must be an object with a 'default'")
    for name, rate in rates.items():
        parse_rate(name, rate)
    return rates


def rates_from_env(raw: str) -> dict[str, Any]:
    """Parse the ``KNOWLEDGE_RATE_LIMITS`` JSON object (empty: no overrides)."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise ImproperlyConfigured("KNOWLEDGE_RATE_LIMITS is not valid JSON") from None
    if not isinstance(value, dict):
        raise ImproperlyConfigured("KNOWLEDGE_RATE_LIMITS must be a JSON object")
    return value
