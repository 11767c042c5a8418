"""Cutover and cleanup settings: defaults, and out-of-range values refused at start-up."""

from __future__ import annotations

import pytest

from knowledgefs.testing.django_start import setup_django

CUTOVER_SETTINGS = {
    # name: (default, low, high)
    "KNOWLEDGE_CUTOVER_ROLLBACK_WINDOW_SECONDS": (14 * 86400, 3600, 90 * 86400),
    "KNOWLEDGE_CUTOVER_OBSERVATION_SECONDS": (86400, 60, 30 * 86400),
    "KNOWLEDGE_CUTOVER_MAX_TASK_TTL_SECONDS": (7 * 86400, 60, 30 * 86400),
    "KNOWLEDGE_CLEANUP_APPROVAL_SECONDS": (86400, 300, 7 * 86400),
}


def test_defaults():
    names = list(CUTOVER_SETTINGS)
    result = setup_django(
        f"from django.conf import settings; print(*[getattr(settings, n) for n in {names!r}])"
    )
    assert result.returncode == 0, result.stderr
    assert [int(v) for v in result.stdout.split()] == [d for d, _, _ in CUTOVER_SETTINGS.values()]


@pytest.mark.parametrize("name", list(CUTOVER_SETTINGS))
def test_out_of_range_values_stop_start_up(name):
    _, low, high = CUTOVER_SETTINGS[name]
    for value in (low - 1, high + 1):
        result = setup_django(**{name: str(value)})
        assert result.returncode != 0
        assert f"{name}={value} is outside the accepted range {low}..{high}" in result.stderr
