"""Dify drives the cutover ledger through the internal routes (inner API key only)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

INNER_KEY = "inner-key-for-cutover-0123456789"
BASE = "/internal/workspaces/tenant-a/cutover"


@pytest.fixture
def inner(settings) -> APIClient:
    settings.DIFY_INNER_API_KEY = INNER_KEY
    api = APIClient()
    api.credentials(HTTP_X_INNER_API_KEY=INNER_KEY)
    return api


def post(api: APIClient, path: str, body: dict | None = None):
    return api.post(f"{BASE}{path}", body or {}, format="json")


def advance(api, ledger: dict, to_phase: str, **extra):
    body = {
        "expected_phase": ledger["phase"],
        "expected_cas_version": ledger["cas_version"],
        "to_phase": to_phase,
        **extra,
    }
    return post(api, "/advance", body)


def test_dify_walks_a_workspace_through_cutover_rollback_and_recutover(inner, client):
    assert inner.get(BASE).json()["code"] == "ledger_not_found"
    created = post(inner, "")
    assert created.status_code == 201
    ledger = created.json()
    assert (ledger["phase"], ledger["cas_version"], ledger["tenant_id"]) == (
        "inventory",
        0,
        "tenant-a",
    )
    assert ledger["gate"] == {
        "open": False,
        "code": "not_cut_over",
        "reason": "the workspace is in phase inventory, not cut over yet",
    }
    assert post(inner, "").status_code == 200
    assert client.get("/v1/knowledge-spaces").json()["code"] == "workspace_cutover_closed"

    ledger = advance(inner, ledger, "backfill").json()
    ledger = advance(inner, ledger, "shadow").json()
    freeze = {"tenant_id": "tenant-a", "ledger_cas_version": 2, "freeze_id": "f-1",
              "freeze_revision": 1}  # fmt: skip
    ledger = advance(inner, ledger, "frozen", ack=freeze).json()
    assert (ledger["phase"], ledger["remote_freeze_id"]) == ("frozen", "f-1")

    bad = advance(inner, ledger, "cutover", ack={"tenant_id": "tenant-a"})
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_ack")
    stale = post(inner, "/advance", {"expected_phase": "frozen", "expected_cas_version": 1,
                                      "to_phase": "cutover"})  # fmt: skip
    assert (stale.status_code, stale.json()["code"]) == (409, "stale_version")
    assert stale.json()["details"] == {"phase": "frozen", "cas_version": 3}

    activation = {"tenant_id": "tenant-a", "ledger_cas_version": 3, "activation_id": "a-1",
                  "activation_revision": 1}  # fmt: skip
    ledger = advance(inner, ledger, "cutover", ack=activation).json()
    assert ledger["gate"]["open"] and ledger["product_routes_enabled"]
    assert client.get("/v1/knowledge-spaces").status_code == 200

    rolled = post(inner, "/rollback", {"expected_phase": "cutover", "expected_cas_version": 4})
    assert rolled.status_code == 200 and rolled.json()["rolled_back_at"]
    assert rolled.json()["gate"]["code"] == "rolled_back"
    assert client.get("/v1/knowledge-spaces").status_code == 409

    second = {**activation, "ledger_cas_version": 5, "activation_revision": 2}
    again = post(inner, "/recutover", {"expected_cas_version": 5, "ack": second})
    assert again.status_code == 200, again.json()
    assert (again.json()["rolled_back_at"], again.json()["gate"]["open"]) == (None, True)
    assert client.get("/v1/knowledge-spaces").status_code == 200


def test_cutover_routes_take_only_the_inner_key(inner, api_key):
    product = APIClient()
    product.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key}")
    refused = product.post(BASE, {}, format="json")
    assert refused.status_code in (401, 403)
    wrong = APIClient()
    wrong.credentials(HTTP_X_INNER_API_KEY="not-the-key")
    assert wrong.get(BASE).json()["code"] == "invalid_inner_api_key"
    bad_tenant = inner.post("/internal/workspaces/bad tenant!/cutover", {}, format="json")
    assert (bad_tenant.status_code, bad_tenant.json()["code"]) == (400, "invalid_tenant")
    missing = inner.post(f"{BASE}/rollback", {"expected_phase": "cutover"}, format="json")
    assert (missing.status_code, missing.json()["code"]) == (400, "invalid_request")
