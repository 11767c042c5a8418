"""Rate limits per tenant, caller and operation: 429 with Retry-After, overrides by operation."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from rest_framework.test import APIClient

from knowledgefs.auth.rates import parse_rate, validate_rates
from spaces.api_keys import create_api_key

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_counters():
    cache.clear()
    yield
    cache.clear()


def keyed(secret: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return api


def test_an_operation_over_its_limit_gets_429_with_retry_after(settings, client, space):
    settings.KNOWLEDGE_RATE_LIMITS = {"default": "100/minute", "knowledge_spaces.list": "2/minute"}
    assert client.get("/v1/knowledge-spaces").status_code == 200
    assert client.get("/v1/knowledge-spaces").status_code == 200
    refused = client.get("/v1/knowledge-spaces")
    assert refused.status_code == 429
    body = refused.json()
    assert body["code"] == "rate_limited"
    wait = int(refused["Retry-After"])
    assert 1 <= wait <= 60
    assert body["message"] == (
        "rate limit of 2 requests per minute for knowledge_spaces.list reached. "
        f"Expected available in {wait} second{'s' if wait != 1 else ''}."
    )

    # another operation of the same caller has its own window
    assert client.get(f"/v1/knowledge-spaces/{space.id}").status_code == 200
    # another caller of the same tenant has its own window
    assert keyed(create_api_key("tenant-a")[1]).get("/v1/knowledge-spaces").status_code == 200


def test_the_default_applies_and_null_means_unlimited(settings, client, space):
    settings.KNOWLEDGE_RATE_LIMITS = {"default": "1/minute", "knowledge_spaces.read": None}
    for _ in range(5):
        assert client.get(f"/v1/knowledge-spaces/{space.id}").status_code == 200
    assert client.get("/v1/knowledge-spaces").status_code == 200
    assert client.get("/v1/knowledge-spaces").status_code == 429


def test_rate_strings_are_checked_naming_the_operation():
    assert parse_rate("x", "5/minute") == (5, 60)
    assert parse_rate("x", "10/hours") == (10, 3600)
    assert parse_rate("x", None) is None
    for bad in ("5/fortnight", "0/minute", "-1/second", "many/minute", "5"):
        with pytest.raises(ImproperlyConfigured, match=r"KNOWLEDGE_RATE_LIMITS\['x'\]"):
            parse_rate("x", bad)
    with pytest.raises(ImproperlyConfigured, match="'default'"):
        validate_rates({"documents.create": "1/second"})
