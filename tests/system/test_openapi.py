"""The OpenAPI 3 document at ``/openapi.json``: valid, silent, complete and true to the API.

- ``manage.py spectacular --validate --fail-on-warn`` (a real subprocess) passes: the document
  validates against the OpenAPI 3.0 meta-schema and generation raised no warning;
- the served document is public, names the package version and the three credentials;
- every ``/v1`` and ``/internal`` route of knowledgefs/urls.py, with each method its view
  registers, is in it;
- real error responses of a few routes have a status the document lists for the operation, and
  bodies that validate against the schema it gives (the ``{code, message, details?}`` envelope).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from knowledgefs.testing.fixtures import upload

ROOT = Path(__file__).resolve().parents[2]
INNER_KEY = "inner-key-for-the-openapi-tests-0123"


@pytest.fixture(scope="module")
def document(django_db_blocker) -> dict:
    """The served document (read once; it needs no database)."""
    with django_db_blocker.unblock():
        response = APIClient().get("/openapi.json")
    assert response.status_code == 200, response.content
    return json.loads(response.content)


def test_spectacular_validates_the_schema_without_a_warning(tmp_path):
    out = tmp_path / "schema.yaml"
    result = subprocess.run(
        [sys.executable, "manage.py", "spectacular", "--validate", "--fail-on-warn"]
        + ["--file", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KNOWLEDGE_VAR_DIR": str(tmp_path / "var")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Warnings: " not in result.stderr and "Error" not in result.stderr, result.stderr
    assert out.read_text().startswith("openapi: 3.0.3")


def test_the_document_is_public_and_names_version_and_credentials(db):
    # No credential, and a credential that would be refused elsewhere, are both ignored.
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer kfs_not-a-key"}):
        response = APIClient().get("/openapi.json", **headers)
        assert response.status_code == 200
        assert response["Content-Type"].startswith("application/vnd.oai.openapi+json")
    body = json.loads(response.content)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert body["openapi"] == "3.0.3"
    assert body["info"] == {
        "title": "KnowledgeFS API",
        "version": version,
        "description": body["info"]["description"],
    }
    assert body["servers"] == [{"url": "/", "description": "this KnowledgeFS server"}]
    schemes = body["components"]["securitySchemes"]
    assert schemes["apiKey"]["scheme"] == "bearer" and schemes["apiKey"]["type"] == "http"
    assert schemes["capabilityToken"]["bearerFormat"] == "JWT"
    assert schemes["innerApiKey"] == {
        "type": "apiKey",
        "in": "header",
        "name": "X-Inner-Api-Key",
        "description": schemes["innerApiKey"]["description"],
    }
    # Asked for as plain JSON (curl -H 'Accept: application/json'), it is the same document.
    plain = APIClient().get("/openapi.json", HTTP_ACCEPT="application/json")
    assert plain.status_code == 200 and json.loads(plain.content) == body


def _routes(patterns, prefix: str = "") -> list[tuple[str, type]]:
    """(OpenAPI path, view class) of every URL pattern under ``patterns``."""
    found = []
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            found += _routes(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern) and hasattr(pattern.callback, "view_class"):
            found.append(("/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route), pattern.callback))
    return found


def test_every_v1_and_internal_route_and_method_is_documented(document):
    routes = [
        (path, callback.view_class)
        for path, callback in _routes(get_resolver().url_patterns)
        if path.startswith(("/v1/", "/internal/"))
    ]
    assert len(routes) >= 34
    missing = []
    for path, view in routes:
        documented = document["paths"].get(path, {})
        for method in view.operations:
            operation = documented.get(method.lower())
            if operation is None:
                missing.append(f"{method} {path}")
                continue
            assert operation["operationId"] == view.operations[method].action
            expected = "innerApiKey" if path.startswith("/internal/") else "apiKey"
            assert any(expected in requirement for requirement in operation["security"])
    assert not missing, missing
    # and nothing else: no probe, admin page or the document itself
    assert all(p.startswith(("/v1/", "/internal/")) for p in document["paths"])


def test_sse_idempotency_if_match_and_pagination_are_described(document):
    paths = document["paths"]
    answer = paths["/v1/queries"]["post"]
    assert "text/event-stream" in answer["responses"]["200"]["content"]
    assert answer["requestBody"]["content"]["application/json"]["schema"]["required"] == [
        "space_id",
        "query",
    ]
    create = paths["/v1/knowledge-spaces/{space_id}/documents"]["post"]
    headers = {p["name"] for p in create["parameters"] if p["in"] == "header"}
    assert "Idempotency-Key" in headers
    assert "multipart/form-data" in create["requestBody"]["content"]
    assert {"413", "415", "429", "411", "408"} <= set(create["responses"])
    patch = paths["/v1/knowledge-spaces/{space_id}/documents/{document_id}"]["patch"]
    assert "If-Match" in {p["name"] for p in patch["parameters"]}
    listing = paths["/v1/knowledge-spaces"]["get"]
    assert {"limit", "cursor"} <= {p["name"] for p in listing["parameters"]}
    page = _resolve(document, listing["responses"]["200"]["content"]["application/json"]["schema"])
    assert set(page["properties"]) == {"next", "previous", "results"}


def json_schema(document: dict, schema, depth: int = 0):
    """An OpenAPI 3.0 schema as plain JSON Schema: ``$ref`` inlined, ``nullable`` turned into
    ``null`` being allowed (jsonschema knows no ``nullable``)."""
    assert depth < 20, "a recursive schema"
    if isinstance(schema, list):
        return [json_schema(document, item, depth + 1) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        return json_schema(document, _resolve(document, schema), depth + 1)
    converted = {k: json_schema(document, v, depth + 1) for k, v in schema.items()}
    if converted.pop("nullable", False):
        return {"anyOf": [converted, {"type": "null"}]}
    return converted


def _resolve(document: dict, schema: dict) -> dict:
    if "$ref" in schema:
        return document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def assert_documented(document: dict, method: str, path: str, response) -> dict:
    """``response`` has a status the document lists for the operation and a body valid against
    the schema it lists; returns the body."""
    operation = document["paths"][path][method.lower()]
    status = str(response.status_code)
    assert status in operation["responses"], (method, path, status, list(operation["responses"]))
    schema = operation["responses"][status]["content"]["application/json"]["schema"]
    body = json.loads(response.content)
    jsonschema.validate(body, json_schema(document, schema))
    return body


@pytest.mark.django_db
def test_documented_errors_are_the_real_ones(document, client, space, settings):
    settings.DIFY_INNER_API_KEY = INNER_KEY
    anonymous = APIClient()
    body = assert_documented(
        document, "GET", "/v1/knowledge-spaces", anonymous.get("/v1/knowledge-spaces")
    )
    assert body["code"] == "not_authenticated"
    body = assert_documented(
        document, "GET", "/v1/knowledge-spaces", client.get("/v1/knowledge-spaces?limit=0")
    )
    assert body["code"] == "invalid_limit"
    missing = "/v1/knowledge-spaces/00000000-0000-0000-0000-000000000000"
    body = assert_documented(
        document, "GET", "/v1/knowledge-spaces/{space_id}", client.get(missing)
    )
    assert body["code"] == "space_not_found"

    admitted = upload(client, space, "notes.txt", b"A note about openapi documents.\n")
    document_path = "/v1/knowledge-spaces/{space_id}/documents/{document_id}"
    url = f"/v1/knowledge-spaces/{space.id}/documents/{admitted.json()['document']['id']}"
    stale = client.patch(url, {"enabled": False}, format="json", HTTP_IF_MATCH='"99"')
    body = assert_documented(document, "PATCH", document_path, stale)
    assert body["code"] == "document_version_conflict"

    key = {"HTTP_IDEMPOTENCY_KEY": "create-once"}
    first = client.post("/v1/knowledge-spaces", {"name": "One"}, format="json", **key)
    assert_documented(document, "POST", "/v1/knowledge-spaces", first)
    reused = client.post("/v1/knowledge-spaces", {"name": "Two"}, format="json", **key)
    body = assert_documented(document, "POST", "/v1/knowledge-spaces", reused)
    assert body["code"] == "idempotency_key_reused"

    wrong = anonymous.get(
        "/internal/dataset-upgrades?namespace_id=tenant-a", HTTP_X_INNER_API_KEY="x" * 20
    )
    body = assert_documented(document, "GET", "/internal/dataset-upgrades", wrong)
    assert body["code"] == "invalid_inner_api_key"
    product_key = client.get("/internal/dataset-upgrades?namespace_id=tenant-a")
    body = assert_documented(document, "GET", "/internal/dataset-upgrades", product_key)
    assert body["code"] in ("credential_not_permitted", "not_authenticated")
