"""Start-up validation: bounded settings refuse out-of-range values; the django-q2 retry check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.checks import run_checks

from knowledgefs.testing.django_start import BOUNDED, setup_django

ROOT = Path(__file__).resolve().parents[2]


def test_defaults():
    names = list(BOUNDED)
    result = setup_django(
        f"from django.conf import settings; print(*[getattr(settings, n) for n in {names!r}])"
    )
    assert result.returncode == 0, result.stderr
    assert [int(v) for v in result.stdout.split()] == [d for d, _, _ in BOUNDED.values()]


@pytest.mark.parametrize("name", list(BOUNDED))
def test_out_of_range_values_stop_start_up(name):
    _, low, high = BOUNDED[name]
    for value in (low - 1, high + 1):
        result = setup_django(**{name: str(value)})
        assert result.returncode != 0
        assert f"{name}={value} is outside the accepted range {low}..{high}" in result.stderr


def test_range_bounds_are_accepted():
    result = setup_django(
        "from django.conf import settings; "
        "print(settings.KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES, "
        "settings.KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY)",
        KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES="1048576",
        KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY="8",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1048576", "8"]


def e001(errors) -> list:
    return [error for error in errors if error.id == "knowledgefs.E001"]


def test_the_shipped_q_cluster_passes(settings):
    assert settings.Q_CLUSTER["retry"] > settings.Q_CLUSTER["timeout"]
    assert e001(run_checks()) == []


@pytest.mark.parametrize("retry", [1800, 1799, 60])
def test_retry_not_larger_than_timeout_is_an_error(settings, retry):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "timeout": 1800, "retry": retry}
    [error] = e001(run_checks())
    assert error.is_serious()
    assert "retry" in error.msg and "timeout" in error.msg
    assert "1860" in error.hint  # what to set


def test_missing_timeout_is_an_error(settings):
    conf = {k: v for k, v in settings.Q_CLUSTER.items() if k != "timeout"}
    settings.Q_CLUSTER = {**conf, "retry": 120}
    [error] = e001(run_checks())
    assert 'no "timeout"' in error.msg and "timeout" in error.hint
    settings.Q_CLUSTER = {**conf, "timeout": None, "retry": 120}
    assert len(e001(run_checks())) == 1


def test_missing_retry_means_django_q_default_of_60(settings):
    conf = {k: v for k, v in settings.Q_CLUSTER.items() if k != "retry"}
    settings.Q_CLUSTER = {**conf, "timeout": 600}
    [error] = e001(run_checks())
    assert "default" in error.msg
    settings.Q_CLUSTER = {**conf, "timeout": 30}
    assert e001(run_checks()) == []


def test_manage_check_fails_on_a_bad_q_cluster():
    result = setup_django(
        "from django.conf import settings; "
        "settings.Q_CLUSTER = {**settings.Q_CLUSTER, 'retry': settings.Q_CLUSTER['timeout']}; "
        "from django.core.management import call_command; call_command('check')"
    )
    assert result.returncode != 0
    assert "knowledgefs.E001" in result.stderr


def test_a_setting_that_is_not_a_whole_number_is_refused_by_name():
    for raw in ("abc", "10.5", "128 MiB", "١٢٠"):
        result = subprocess.run(
            [sys.executable, "-c", "import django; django.setup()"],
            env={**os.environ, "KNOWLEDGE_JOB_LEASE_SECONDS": raw},
            capture_output=True,
            text=True,
        )
        assert result.returncode != 0
        assert "KNOWLEDGE_JOB_LEASE_SECONDS" in result.stderr and "10..3600" in result.stderr
