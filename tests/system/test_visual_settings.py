"""Settings of images as evidence: the seed's defaults and ranges, read and refused at start-up,
the limits that must agree, and the retired selectors named by a warning (never read)."""

from __future__ import annotations

import pytest

from knowledgefs.checks import ignored_selector_warnings
from knowledgefs.testing.django_start import setup_django

MIB = 1024 * 1024
VISUAL = {
    "KNOWLEDGE_VISUAL_EMBEDDING_MAX_ASSET_BYTES": (20 * MIB, 1024, 256 * MIB),
    "KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_ASSETS": (8, 1, 64),
    "KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_BYTES": (32 * MIB, 1024, 256 * MIB),
    "KNOWLEDGE_VISUAL_EMBEDDING_MAX_CONCURRENCY": (2, 1, 8),
    "KNOWLEDGE_MULTIMODAL_ENRICHMENT_MAX_CONCURRENCY": (4, 1, 32),
    "KNOWLEDGE_MULTIMODAL_ENRICHMENT_MAX_IMAGE_BYTES": (10 * MIB, 1024, 64 * MIB),
    "KNOWLEDGE_MULTIMODAL_ENRICHMENT_TIMEOUT_MS": (60000, 1000, 600000),
    "KNOWLEDGE_MULTIMODAL_ANSWER_MAX_CONCURRENCY": (2, 1, 16),
    "KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_ATTACHMENTS": (8, 0, 32),
    "KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_BYTES": (10 * MIB, 1024, 64 * MIB),
    "KNOWLEDGE_MULTIMODAL_ANSWER_MAX_TOTAL_IMAGE_BYTES": (32 * MIB, 1024, 256 * MIB),
    "KNOWLEDGE_QUERY_IMAGE_EXPANSION_TIMEOUT_MS": (8000, 100, 120000),
    "KNOWLEDGE_MULTIMODAL_ASSET_MAX_READ_BYTES": (25 * MIB, 1024, 256 * MIB),
}
RETIRED = (
    "KNOWLEDGE_VISUAL_EMBEDDING_PROVIDER",
    "KNOWLEDGE_VISUAL_EMBEDDING_MODEL",
    "KNOWLEDGE_VISUAL_EMBEDDING_QUERY_MODE",
    "KNOWLEDGE_QUERY_IMAGE_RETRIEVAL_ENABLED",
    "KNOWLEDGE_MULTIMODAL_ENRICHMENT_PROVIDER",
    "KNOWLEDGE_MULTIMODAL_ANSWER_PROVIDER",
)


def _unset() -> dict[str, str]:
    return {name: "" for name in (*VISUAL, *RETIRED)}


def test_the_seed_defaults_are_read():
    names = list(VISUAL)
    result = setup_django(
        f"from django.conf import settings; print(*[getattr(settings, n) for n in {names!r}])",
        **_unset(),
    )
    assert result.returncode == 0, result.stderr
    assert [int(v) for v in result.stdout.split()] == [d for d, _, _ in VISUAL.values()]


@pytest.mark.parametrize("name", list(VISUAL))
def test_out_of_range_values_stop_start_up(name):
    _, low, high = VISUAL[name]
    for value in (low - 1, high + 1):
        result = setup_django(**{**_unset(), name: str(value)})
        assert result.returncode != 0
        assert f"{name}={value} is outside the accepted range {low}..{high}" in result.stderr


def test_one_image_must_fit_one_visual_batch():
    result = setup_django(
        **{
            **_unset(),
            "KNOWLEDGE_VISUAL_EMBEDDING_MAX_ASSET_BYTES": str(40 * MIB),
            "KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_BYTES": str(32 * MIB),
        }
    )
    assert result.returncode != 0
    assert "KNOWLEDGE_VISUAL_EMBEDDING_MAX_ASSET_BYTES=41943040 must not exceed" in result.stderr
    assert "KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_BYTES=33554432" in result.stderr


def test_the_answer_total_must_hold_one_image():
    result = setup_django(
        **{
            **_unset(),
            "KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_BYTES": str(20 * MIB),
            "KNOWLEDGE_MULTIMODAL_ANSWER_MAX_TOTAL_IMAGE_BYTES": str(16 * MIB),
        }
    )
    assert result.returncode != 0
    assert "KNOWLEDGE_MULTIMODAL_ANSWER_MAX_TOTAL_IMAGE_BYTES=16777216 must be at least" in (
        result.stderr
    )


def test_retired_selectors_are_not_read_and_a_warning_names_them():
    result = setup_django(
        "from django.conf import settings; "
        "print(settings.KNOWLEDGE_IGNORED_MULTIMODAL_SELECTORS); "
        "print(hasattr(settings, 'KNOWLEDGE_VISUAL_EMBEDDING_MODEL')); "
        "from django.core.management import call_command; call_command('check')",
        **{
            **_unset(),
            "KNOWLEDGE_VISUAL_EMBEDDING_MODEL": "clip",
            "KNOWLEDGE_QUERY_IMAGE_RETRIEVAL_ENABLED": "false",
        },
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert (
        lines[0]
        == "['KNOWLEDGE_VISUAL_EMBEDDING_MODEL', 'KNOWLEDGE_QUERY_IMAGE_RETRIEVAL_ENABLED']"
    )
    assert lines[1] == "False"
    output = result.stdout + result.stderr
    assert "knowledgefs.W104" in output
    assert (
        "KNOWLEDGE_VISUAL_EMBEDDING_MODEL, KNOWLEDGE_QUERY_IMAGE_RETRIEVAL_ENABLED are set but "
        in (output)
    )


def test_no_warning_without_retired_selectors():
    assert ignored_selector_warnings([]) == []
    (warning,) = ignored_selector_warnings(["KNOWLEDGE_MULTIMODAL_ANSWER_PROVIDER"])
    assert warning.id == "knowledgefs.W104" and "is set but not read" in warning.msg
