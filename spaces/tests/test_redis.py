"""``REDIS_URL``: API-key authentication cached in Redis, revoked at once from any process, and
rate-limit counters shared through it. Runs a real redis-server on loopback."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.cache import cache
from django.db import connection
from rest_framework.test import APIClient

from knowledgefs.testing.redis_support import redis_url  # noqa: F401 - the fixture
from spaces import key_auth
from spaces.api_keys import create_api_key

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def redis_cache(settings, redis_url):  # noqa: F811
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_url}
    }
    settings.KNOWLEDGE_AUTH_CACHE_SHARED = True
    settings.KNOWLEDGE_AUTH_CACHE_SECONDS = 300
    cache.clear()
    assert type(cache._cache).__name__ == "RedisCacheClient"
    yield redis_url
    cache.clear()


def api(secret: str) -> APIClient:
    return APIClient(HTTP_AUTHORIZATION=f"Bearer {secret}")


def cached(secret: str):
    return cache.get(key_auth._auth_cache_key(hashlib.sha256(secret.encode()).hexdigest()))


@pytest.mark.django_db(transaction=True)
def test_a_key_revoked_by_another_process_fails_here_with_the_redis_entry_warm(
    redis_cache, tenant, tmp_path
):
    key, secret = create_api_key(tenant)
    client = api(secret)
    assert client.get("/v1/knowledge-spaces").status_code == 200
    assert cached(secret) is not None  # the entry lives in Redis

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "knowledgefs.testing.cluster_settings",
        "KFS_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        "KFS_TEST_OBJECTS": str(tmp_path / "objects"),
        "KNOWLEDGE_VAR_DIR": str(tmp_path / "other-var"),  # nothing shared but Redis and the DB
        "REDIS_URL": redis_cache,
        "LOG_LEVEL": "WARNING",
    }
    run = subprocess.run(
        [sys.executable, "manage.py", "kfs", "apikey", "revoke", key.prefix],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert cached(secret) is None  # the other process deleted the shared entry
    refused = client.get("/v1/knowledge-spaces")
    assert (refused.status_code, refused.json()["code"]) == (401, "authentication_failed")


@pytest.mark.django_db
def test_rate_limit_counters_live_in_redis(redis_cache, settings, client):
    settings.KNOWLEDGE_RATE_LIMITS = {"default": "3/minute"}
    statuses = [client.get("/v1/knowledge-spaces").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    import redis

    keys = redis.Redis.from_url(redis_cache).keys("*kfs:throttle:*")
    assert len(keys) == 1  # one window of one (tenant, caller, operation)
