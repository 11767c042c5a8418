"""Knowledge-space API: CRUD, compare-and-set updates, tenancy and key scope."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from spaces.api_keys import create_api_key, revoke_api_key
from spaces.models import KnowledgeSpace
from spaces.services import Principal, create_space

pytestmark = pytest.mark.django_db


def test_it_creates_lists_reads_updates_and_deletes_a_space(client):
    created = client.post("/v1/knowledge-spaces", {"name": "Policies 2026"}, format="json")
    assert created.status_code == 201, created.content
    space = created.json()
    assert space["slug"] == "policies-2026"
    assert space["revision"] == 1

    listing = client.get("/v1/knowledge-spaces").json()
    assert [s["id"] for s in listing["results"]] == [space["id"]]

    patched = client.patch(
        f"/v1/knowledge-spaces/{space['id']}", {"name": "Policies", "revision": 1}, format="json"
    )
    assert patched.status_code == 200
    assert patched.json()["name"] == "Policies"
    assert patched.json()["revision"] == 2

    stale = client.patch(
        f"/v1/knowledge-spaces/{space['id']}", {"name": "Old", "revision": 1}, format="json"
    )
    assert stale.status_code == 409
    assert stale.json()["code"] == "revision_conflict"

    assert client.delete(f"/v1/knowledge-spaces/{space['id']}").status_code == 204
    gone = client.get(f"/v1/knowledge-spaces/{space['id']}")
    assert gone.status_code == 404
    assert gone.json()["code"] == "space_not_found"


def test_non_latin_names_get_a_stable_slug_and_collisions_are_numbered(client):
    first = client.post("/v1/knowledge-spaces", {"name": "知识库"}, format="json").json()
    second = client.post("/v1/knowledge-spaces", {"name": "知识库"}, format="json").json()
    assert first["slug"].startswith("space-") and len(first["slug"]) == len("space-") + 8
    assert second["slug"] == first["slug"] + "-2"


def test_bad_input_gets_a_clear_error(client):
    response = client.post(
        "/v1/knowledge-spaces", {"name": "x", "slug": "Not A Slug"}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_slug"
    response = client.post("/v1/knowledge-spaces", {}, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert response.json()["message"].startswith("name:")
    client.post("/v1/knowledge-spaces", {"name": "a", "slug": "same"}, format="json")
    taken = client.post("/v1/knowledge-spaces", {"name": "b", "slug": "same"}, format="json")
    assert taken.status_code == 409
    assert taken.json()["code"] == "slug_taken"


def test_requests_without_a_valid_key_are_refused():
    anonymous = APIClient().get("/v1/knowledge-spaces")
    assert anonymous.status_code == 401
    assert anonymous.json()["code"] == "not_authenticated"
    forged = APIClient(HTTP_AUTHORIZATION="Bearer kfs_deadbeefnotakey").get("/v1/knowledge-spaces")
    assert forged.status_code == 401
    assert forged.json()["code"] == "authentication_failed"


def test_revocation_takes_effect_on_the_next_request(tenant):
    _, secret = create_api_key(tenant)
    api = APIClient(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert api.get("/v1/knowledge-spaces").status_code == 200  # result now cached
    revoke_api_key(secret[:12])
    assert api.get("/v1/knowledge-spaces").status_code == 401


def test_another_tenants_space_is_not_found(client):
    other = create_space(Principal(tenant_id="tenant-b"), name="Secret")
    for method in ("get", "patch", "delete"):
        response = getattr(client, method)(f"/v1/knowledge-spaces/{other.id}", {}, format="json")
        assert response.status_code == 404, method
    assert client.get("/v1/knowledge-spaces").json()["results"] == []


def test_a_space_bound_key_reaches_only_its_spaces(tenant, principal):
    mine = create_space(principal, name="Mine")
    private = create_space(principal, name="Private")
    _, secret = create_api_key(tenant, spaces=[mine])
    api = APIClient(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert [s["id"] for s in api.get("/v1/knowledge-spaces").json()["results"]] == [str(mine.id)]
    assert api.get(f"/v1/knowledge-spaces/{mine.id}").status_code == 200
    # List and GET agree: the private space is invisible, for reads and writes alike (BC-29).
    assert api.get(f"/v1/knowledge-spaces/{private.id}").status_code == 404
    assert (
        api.patch(f"/v1/knowledge-spaces/{private.id}", {"name": "x"}, format="json").status_code
        == 404
    )
    create = api.post("/v1/knowledge-spaces", {"name": "New"}, format="json")
    assert create.status_code == 403
    assert create.json()["code"] == "key_scope_forbids_create"


def test_probes(client):
    assert APIClient().get("/health").status_code == 200
    ready = APIClient().get("/ready")
    assert ready.status_code == 200, ready.json()
    assert set(ready.json()["checks"]) == {
        "auth",
        "database",
        "model_runtime",
        "datasource_runtime",
        "object_storage",
        "search",
    }
    assert client.get("/v1/nope").json()["code"] == "not_found"


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"name": 5}, "invalid_name", "name"),
        ({"name": True}, "invalid_name", "name"),
        ({"name": ["x"]}, "invalid_name", "name"),
        ({"name": "ok", "slug": 7}, "invalid_slug", "slug"),
        ({"name": "ok", "description": {"a": 1}}, "invalid_description", "description"),
        ({"name": "ok", "colour": "red"}, "invalid_request", "colour"),
        ({"name": "ok", "embedding_model_id": "m"}, "invalid_request", "embedding_model_id"),
    ],
)
def test_create_refuses_unknown_members_and_non_strings_naming_the_member(
    client, body, code, field
):
    response = client.post("/v1/knowledge-spaces", body, format="json")
    assert response.status_code == 400, response.content
    assert (response.json()["code"], response.json()["details"]) == (code, {"field": field})
    assert response.json()["message"].startswith(field)
    assert not KnowledgeSpace.objects.exists()


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"name": 5}, "invalid_name", "name"),
        ({"description": 1.5}, "invalid_description", "description"),
        ({"embedding_model_id": 3}, "invalid_request", "embedding_model_id"),
        ({"revision": "1"}, "invalid_request", "revision"),
        ({"revision": True}, "invalid_request", "revision"),
        ({"nmae": "typo"}, "invalid_request", "nmae"),
    ],
)
def test_patch_refuses_unknown_members_and_wrong_types_naming_the_member(
    client, space, body, code, field
):
    response = client.patch(f"/v1/knowledge-spaces/{space.id}", body, format="json")
    assert response.status_code == 400, response.content
    assert (response.json()["code"], response.json()["details"]) == (code, {"field": field})
    assert field in response.json()["message"]
    space.refresh_from_db()
    assert (space.name, space.revision) == ("Test space", 1)
