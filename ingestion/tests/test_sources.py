"""Sources (docs/datasources.md): create, list, read, delete and the credential test through the
simulated Dify's datasource provider; a source never holds a secret."""

from __future__ import annotations

import pytest

from ingestion.sources.models import Source
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import DATASOURCE, TEST_INNER_KEY

pytestmark = pytest.mark.django_db

dify_server = dify_fixtures.dify_server
NOTION = "langgenius/notion_datasource/notion"


@pytest.fixture
def dify(dify_server, settings, tenant):
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    dify_server.provider.credentials = {"cred-kfs": tenant, "cred-other": "tenant-elsewhere"}
    return dify_server


def sources_url(space, *parts) -> str:
    return "/".join([f"/v1/knowledge-spaces/{space.id}/sources", *parts])


def body(**overrides) -> dict:
    return {
        "name": "Team wiki",
        "kind": "online_document",
        "provider": NOTION,
        "datasource": "notion_datasource",
        "credential_id": "cred-kfs",
        "parameters": {"workspace": "ws-kfs"},
        **overrides,
    }


def test_create_list_read_delete(client, space):
    created = client.post(sources_url(space), body(), format="json")
    assert created.status_code == 201, created.content
    source = created.json()
    assert source["kind"] == "online_document" and source["credential_id"] == "cred-kfs"
    listed = client.get(sources_url(space)).json()
    assert [s["id"] for s in listed["results"]] == [source["id"]]
    assert client.get(sources_url(space, source["id"])).json() == source
    assert client.delete(sources_url(space, source["id"])).status_code == 204
    assert client.get(sources_url(space, source["id"])).status_code == 404
    assert not Source.objects.exists()


@pytest.mark.parametrize(
    ("overrides", "code", "field"),
    [
        ({"kind": "ftp"}, "invalid_source", "kind"),
        ({"provider": "notion"}, "invalid_provider", "provider"),
        ({"provider": "Lang Genius/x/y"}, "invalid_provider", "provider"),
        ({"credential_id": "sk-live secret"}, "invalid_credential_id", "credential_id"),
        ({"parameters": {"workspace": "w", "api_key": "sk-123"}}, "credential_in_parameters",
         "parameters"),
        ({"parameters": {"nested": [{"Authorization": "Bearer x"}]}}, "credential_in_parameters",
         "parameters"),
        ({"client_secret": "x"}, "credential_in_parameters", "client_secret"),
        ({"name": ""}, "invalid_source", "name"),
        ({"name": "n" * 201}, "invalid_source", "name"),
        ({"parameters": ["a"]}, "invalid_source", "parameters"),
    ],
)  # fmt: skip
def test_bad_sources_are_400_naming_the_field(client, space, overrides, code, field):
    response = client.post(sources_url(space), body(**overrides), format="json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == code
    assert response.json()["details"]["field"] == field
    assert "sk-123" not in response.content.decode()
    assert not Source.objects.exists()


def test_the_credential_test_goes_through_dify(client, space, dify):
    source_id = client.post(sources_url(space), body(), format="json").json()["id"]
    response = client.post(sources_url(space, source_id, "test"))
    assert response.status_code == 200, response.content
    assert response.json() == {"valid": True}
    sent = dify.calls(DATASOURCE)[-1].body
    assert sent["operation"] == "validate_credentials" and sent["credential_id"] == "cred-kfs"
    assert sent["provider"] == NOTION and sent["datasource_type"] == "online_document"

    dify.provider.valid = False  # expired in Dify
    response = client.post(sources_url(space, source_id, "test"))
    assert response.json()["valid"] is False
    assert response.json()["code"] == "source_credential_invalid"


def test_another_tenants_credential_is_403_with_a_stable_code(client, space, dify):
    source_id = client.post(
        sources_url(space), body(credential_id="cred-other"), format="json"
    ).json()["id"]
    response = client.post(sources_url(space, source_id, "test"))
    assert response.status_code == 403, response.content
    assert response.json()["code"] == "source_credential_forbidden"


def test_dify_unavailable_is_503_and_unconfigured_is_503(client, space, dify, settings):
    source_id = client.post(sources_url(space), body(), format="json").json()["id"]
    dify.fail_next(1, status=503, route=DATASOURCE)
    response = client.post(sources_url(space, source_id, "test"))
    assert response.status_code == 503 and response.json()["code"] == "datasource_unavailable"
    settings.DIFY_INNER_API_URL = ""
    response = client.post(sources_url(space, source_id, "test"))
    assert response.status_code == 503 and response.json()["code"] == "datasources_unavailable"


@pytest.mark.parametrize(
    "target",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://127.0.0.1:5432/",
        "http://[::1]:8000/admin",
        "file:///etc/passwd",
        "http://10.0.0.5/",
        "http://localhost:8080/",
        "ftp://example.com/",
    ],
)
def test_bc48_a_crawl_source_with_a_private_target_is_400(client, space, target):
    website = body(kind="website", provider="langgenius/firecrawl/firecrawl", datasource="crawl",
                   parameters={"url": target})  # fmt: skip
    response = client.post(sources_url(space), website, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "source_target_refused"
    assert response.json()["details"]["field"] == "parameters.url"
    assert not Source.objects.exists()
    public = {**website, "parameters": {"url": "https://example.com/docs"}}
    assert client.post(sources_url(space), public, format="json").status_code == 201
