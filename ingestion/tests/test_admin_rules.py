"""Admin screens follow the service rules: deletes purge, derived rows cannot be deleted,
revoking needs the change permission, and secrets never ride in a cookie."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document, KnowledgeNode
from knowledgefs.models import CapabilityGrant
from knowledgefs.storage import object_storage
from knowledgefs.testing.fixtures import compile_all
from retrieval.modes import retrieve

pytestmark = pytest.mark.django_db


def test_deleting_a_document_in_admin_purges_it_like_the_api(admin_client, space):
    admission = admit_document(
        space, filename="a.md", data=b"# Secret\n\nZEBRA-UNIQUE-4242 text.", enqueue=False
    )
    compile_all()
    document = Document.objects.get(pk=admission.document.pk)
    key = document.storage_key
    assert object_storage().exists(key)
    assert retrieve(space, "ZEBRA-UNIQUE-4242").items

    url = reverse("admin:ingestion_document_delete", args=[document.pk])
    assert admin_client.post(url, {"post": "yes"}).status_code == 302
    assert not Document.objects.filter(pk=document.pk).exists()
    assert not object_storage().exists(key)
    assert not KnowledgeNode.objects.filter(document_id=document.pk).exists()
    assert not retrieve(space, "ZEBRA-UNIQUE-4242").items


def test_derived_rows_cannot_be_deleted_or_added_in_admin(admin_client, space):
    admit_document(space, filename="a.md", data=b"# T\n\nsome text", enqueue=False)
    compile_all()
    job = CompilationJob.objects.first()
    node = KnowledgeNode.objects.first()
    for name, pk in (("compilationjob", job.pk), ("knowledgenode", node.pk)):
        response = admin_client.get(reverse(f"admin:ingestion_{name}_delete", args=[pk]))
        assert response.status_code == 403, name
    assert admin_client.get(reverse("admin:ingestion_document_add")).status_code == 403


def test_view_only_staff_cannot_revoke_grants(space):
    grant = CapabilityGrant.objects.create(grant_id="g-1", tenant_id="tenant-a", action="a.b")
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_capabilitygrant"))
    browser = Client()
    browser.force_login(viewer)
    url = reverse("admin:knowledgefs_capabilitygrant_changelist")
    page = browser.get(url)
    assert page.status_code == 200 and b"revoke_grants" not in page.content
    browser.post(url, {"action": "revoke_grants", "_selected_action": ["g-1"]})
    grant.refresh_from_db()
    assert grant.revoked_at is None

    viewer.user_permissions.add(Permission.objects.get(codename="change_capabilitygrant"))
    viewer = User.objects.get(pk=viewer.pk)  # drop the permission cache
    browser.force_login(viewer)
    assert b"revoke_grants" in browser.get(url).content


def test_admin_messages_are_kept_in_the_session_not_a_cookie(admin_client, settings):
    assert settings.MESSAGE_STORAGE.endswith("session.SessionStorage")


def test_cached_keys_on_a_server_database_without_redis_warn():
    from knowledgefs.checks import revocation_reach_warnings

    postgres = "django.db.backends.postgresql"
    warned = revocation_reach_warnings(engine=postgres, shared=False, seconds=300, var_dir="/v")
    assert [w.id for w in warned] == ["knowledgefs.W001"]
    assert "REDIS_URL" in warned[0].hint
    assert not revocation_reach_warnings(engine=postgres, shared=True, seconds=300, var_dir="/v")
    assert not revocation_reach_warnings(engine=postgres, shared=False, seconds=0, var_dir="/v")
    sqlite = "django.db.backends.sqlite3"
    assert not revocation_reach_warnings(engine=sqlite, shared=False, seconds=300, var_dir="/v")


def test_a_space_cannot_change_tenant_or_slug_in_admin_and_names_are_checked(admin_client, space):
    url = reverse("admin:spaces_knowledgespace_change", args=[space.pk])
    page = admin_client.get(url)
    assert page.status_code == 200
    assert b'name="tenant_id"' not in page.content and b'name="slug"' not in page.content
    form = {
        "name": "Renamed",
        "description": "",
        "tenant_id": "tenant-b",
        "slug": "moved",
        # the read-only profile inline's management form
        "profile-TOTAL_FORMS": "1",
        "profile-INITIAL_FORMS": "1",
        "profile-MIN_NUM_FORMS": "0",
        "profile-MAX_NUM_FORMS": "1",
        "profile-0-space": str(space.pk),
    }
    response = admin_client.post(url, form)
    assert response.status_code == 302, response.content[:2000]
    space.refresh_from_db()
    assert (space.name, space.tenant_id, space.slug) == ("Renamed", "tenant-a", "test-space")
    assert space.revision == 2  # saved through the service's compare-and-set

    bad = admin_client.post(url, {**form, "name": "bell\x07name"})
    assert bad.status_code == 200 and b"control character" in bad.content
    space.refresh_from_db()
    assert space.name == "Renamed"
    assert admin_client.get(reverse("admin:spaces_knowledgespace_add")).status_code == 403


def test_view_only_staff_cannot_revoke_api_keys(tenant):
    from spaces.api_keys import create_api_key
    from spaces.models import ApiKey

    key, _ = create_api_key(tenant)
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_apikey"))
    browser = Client()
    browser.force_login(viewer)
    url = reverse("admin:spaces_apikey_changelist")
    assert b'value="revoke"' not in browser.get(url).content
    browser.post(url, {"action": "revoke", "_selected_action": [str(key.pk)]})
    assert ApiKey.objects.get(pk=key.pk).revoked_at is None


def test_an_idempotent_replay_does_not_hand_a_narrowed_key_a_space(tenant, space):
    from rest_framework.test import APIClient

    from spaces.api_keys import bind_api_key, create_api_key

    key, secret = create_api_key(tenant)
    api = APIClient(HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_IDEMPOTENCY_KEY="create-1")
    assert api.post("/v1/knowledge-spaces", {"name": "Once"}, format="json").status_code == 201
    bind_api_key(key, space)
    replay = api.post("/v1/knowledge-spaces", {"name": "Once"}, format="json")
    assert (replay.status_code, replay.json()["code"]) == (403, "key_scope_forbids_create")
