"""``/ready`` on the Dify runtime: a catalog answer that is not a ``{data, error}`` envelope
(``{}``, a bare "Not Found" object) proves nothing about the route, so the model runtime is
not ready (``MODEL_RUNTIME_RESPONSE_INVALID``); only a real error envelope for the probe tenant
counts as an answer (tests/system/test_boundary.py covers that one)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from knowledgefs import boundary, health
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import MODEL_CATALOG, TEST_INNER_KEY

pytestmark = pytest.mark.timeout(120)

dify_server = dify_fixtures.dify_server


@pytest.fixture(autouse=True)
def fresh_probes():
    health.reset()
    yield
    health.reset()


def dify_settings(settings, server_url: str) -> None:
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = server_url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    settings.STORAGES = {
        **settings.STORAGES,
        "objects": boundary.objects_storage("dify", str(settings.OBJECT_STORAGE_DIR)),
    }


@pytest.mark.parametrize("body", [{}, {"error": None, "message": "Not Found"}])
def test_a_catalog_answer_that_is_not_an_envelope_is_not_ready(db, settings, dify_server, body):
    dify_settings(settings, dify_server.url)
    dify_server.add_fault("json", MODEL_CATALOG, status=200, body=body)
    ready = APIClient().get("/ready")
    assert ready.status_code == 503, ready.json()
    payload = ready.json()
    assert payload["status"] == "not_ready" and "model_runtime" in payload["failing"]
    detail = payload["checks"]["model_runtime"]["detail"]
    assert detail.startswith("MODEL_RUNTIME_RESPONSE_INVALID"), detail
    assert payload["checks"]["object_storage"]["ok"] is True
    assert TEST_INNER_KEY not in ready.content.decode()
