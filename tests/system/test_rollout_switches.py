"""The Workspace rollout switches: ``KNOWLEDGE_INTEGRATED_MODE_ENABLED`` gates the internal
provisioning and cutover routes (never a transport), ``KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME``
selects durable or inline compilation (inline refused with a server database)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from ingestion.models import Document
from knowledgefs.testing.fixtures import upload
from retrieval.modes import retrieve

INNER_KEY = "inner-key-for-rollout-0123456789"
PROVISION = {"namespace_id": "tenant-a", "name": "Provisioned", "slug": "provisioned"}


@pytest.fixture
def inner(settings) -> APIClient:
    settings.DIFY_INNER_API_KEY = INNER_KEY
    api = APIClient()
    api.credentials(HTTP_X_INNER_API_KEY=INNER_KEY)
    return api


@pytest.mark.django_db
def test_integrated_mode_off_refuses_provisioning_and_cutover_with_409(inner, settings, client):
    settings.KNOWLEDGE_INTEGRATED_MODE_ENABLED = False
    routes = [
        ("POST", "/internal/knowledge-spaces/provision", PROVISION),
        ("GET", "/internal/workspaces/tenant-a/cutover", None),
        ("POST", "/internal/workspaces/tenant-a/cutover", {}),
        ("POST", "/internal/workspaces/tenant-a/cutover/rollback", {}),
    ]
    for method, path, body in routes:
        response = inner.generic(method, path, _json(body), content_type="application/json")
        assert response.status_code == 409, (path, response.content)
        assert response.json()["code"] == "integrated_mode_disabled"
        assert "KNOWLEDGE_INTEGRATED_MODE_ENABLED" in response.json()["message"]
    # the inner key is still checked first
    anonymous = APIClient().post("/internal/knowledge-spaces/provision", PROVISION, format="json")
    assert anonymous.status_code in (401, 403)
    # other internal routes and product routes are not gated; the transport is unchanged
    assert client.get("/v1/knowledge-spaces").status_code == 200
    health = client.get("/health").json()
    assert health["rollout"] == {
        "integrated_mode_enabled": False,
        "document_compilation_runtime": "durable",
    }
    assert health["runtime"] == "local"

    settings.KNOWLEDGE_INTEGRATED_MODE_ENABLED = True
    created = inner.post("/internal/knowledge-spaces/provision", PROVISION, format="json")
    assert created.status_code == 201, created.content
    assert inner.post("/internal/workspaces/tenant-a/cutover", {}, format="json").status_code == 201


def _json(body) -> str:
    import json

    return json.dumps(body or {})


@pytest.mark.django_db(transaction=True)
def test_inline_compilation_publishes_within_the_upload_request(space, tenant, settings):
    from spaces.api_keys import create_api_key

    settings.KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME = "inline"
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key(tenant)[1]}")
    response = upload(client, space, "inline.md", b"# Inline\n\nCompiled in the API process.\n")
    assert response.status_code == 202, response.content
    document = Document.objects.get()
    assert document.state == "published"  # no worker ran
    assert retrieve(space, "compiled in the API process", top_k=1).items


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME": "lambda"},
            "KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME='lambda' must be 'durable'",
        ),
        (
            {
                "KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME": "inline",
                "DATABASE_URL": "postgres://kfs:kfs@127.0.0.1:5432/kfs",
            },
            "KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME=inline is for single-process development",
        ),
    ],
)
def test_bad_rollout_settings_stop_start_up(tmp_path, variables, message):
    from tests.system.test_boundary import manage_check

    run = manage_check(tmp_path, **variables)
    assert run.returncode != 0
    assert message in run.stderr
