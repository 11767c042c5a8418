"""Operator screens: every KnowledgeFS admin page renders, and revoking keys works from admin."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.urls import reverse
from rest_framework.test import APIClient

from ingestion.services.documents import admit_document
from spaces.models import ApiKey
from spaces.services import create_api_key
from tests.conftest import compile_all

pytestmark = pytest.mark.django_db

APPS = {"spaces", "ingestion", "retrieval", "knowledgefs"}


def test_every_changelist_and_change_page_renders(admin_client, space, tenant):
    admit_document(space, filename="a.md", data=b"# Title\n\nSome text.", enqueue=False)
    compile_all()
    create_api_key(tenant)
    for model, _ in admin.site._registry.items():
        if model._meta.app_label not in APPS:
            continue
        info = f"{model._meta.app_label}_{model._meta.model_name}"
        response = admin_client.get(reverse(f"admin:{info}_changelist"))
        assert response.status_code == 200, info
        obj = model.objects.first()
        if obj is not None:
            response = admin_client.get(reverse(f"admin:{info}_change", args=[obj.pk]))
            assert response.status_code == 200, info


def test_the_revoke_action_stops_the_key_at_once(admin_client, tenant):
    key, secret = create_api_key(tenant)
    api = APIClient(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert api.get("/v1/knowledge-spaces").status_code == 200
    response = admin_client.post(
        reverse("admin:spaces_apikey_changelist"),
        {"action": "revoke", "_selected_action": [str(key.pk)]},
        follow=True,
    )
    assert response.status_code == 200
    assert b"Revoked 1 API keys" in response.content
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None
    assert api.get("/v1/knowledge-spaces").status_code == 401
