"""Cutover ledgers and cleanup authorizations in the admin (Django test client): pages render,
the gate column, the request form, four-eyes on the approve action, no deletion."""

from __future__ import annotations

import pytest
from django.urls import reverse

from upgrades.models import CleanupAuthorization
from upgrades.services import cleanup, cutover
from upgrades.tests.test_cutover import ready

pytestmark = pytest.mark.django_db

LEDGERS = "admin:upgrades_workspacecutoverledger_changelist"
AUTHS = "admin:upgrades_cleanupauthorization_changelist"


def act(client, action: str, authorization) -> str:
    response = client.post(
        reverse(AUTHS),
        {"action": action, "_selected_action": [str(authorization.pk)]},
        follow=True,
    )
    assert response.status_code == 200
    return response.content.decode()


def test_ledger_pages_are_read_only_and_show_the_gate(admin_client, tenant):
    ledger = ready(tenant)
    cutover.create_ledger("tenant-waiting")
    page = admin_client.get(reverse(LEDGERS)).content.decode()
    assert "ready_for_cleanup" in page and "tenant-waiting" in page
    assert "closed: not_cut_over" in page and ">open<" in page
    detail = admin_client.get(
        reverse("admin:upgrades_workspacecutoverledger_change", args=[ledger.pk])
    )
    assert detail.status_code == 200 and b'name="_save"' not in detail.content
    assert admin_client.get(reverse(LEDGERS) + "add/").status_code == 403
    assert (
        admin_client.get(
            reverse("admin:upgrades_workspacecutoverledger_delete", args=[ledger.pk])
        ).status_code
        == 403
    )


def test_request_form_approve_four_eyes_start_complete(client, django_user_model, tenant):
    ready(tenant)
    for name in ("alice", "bob"):
        django_user_model.objects.create_superuser(name, f"{name}@example.com", "pw")
    client.login(username="alice", password="pw")
    ledger_id = cutover.get_ledger(tenant).pk
    created = client.post(reverse(AUTHS) + "add/", {"ledger": ledger_id, "reason": "old data"})
    assert created.status_code == 302
    authorization = CleanupAuthorization.objects.get()
    assert (authorization.requested_by, authorization.status) == ("alice", "requested")
    again = client.post(reverse(AUTHS) + "add/", {"ledger": ledger_id, "reason": "twice"})
    assert "cleanup_already_open" in again.content.decode()

    page = act(client, "approve_authorizations", authorization)
    assert "four_eyes_required" in page and "another operator must approve it" in page
    assert f"Cleanup of {tenant} refused: four_eyes_required" in page  # tenant id as stored
    assert CleanupAuthorization.objects.get().status == "requested"

    client.logout()
    client.login(username="bob", password="pw")
    assert "Approved the cleanup of tenant-a" in act(client, "approve_authorizations",
                                                     authorization)  # fmt: skip
    assert "Started the cleanup" in act(client, "start_cleanups", authorization)
    assert "Completed the cleanup" in act(client, "complete_cleanups", authorization)
    done = CleanupAuthorization.objects.get()
    assert (done.status, done.approved_by, done.completed_by) == ("completed", "bob", "bob")
    assert done.completion_evidence == {"via": "admin", "operator": "bob"}
    assert "invalid_status" in act(client, "complete_cleanups", authorization)

    detail = client.get(reverse("admin:upgrades_cleanupauthorization_change", args=[done.pk]))
    assert detail.status_code == 200 and b'name="_save"' not in detail.content
    delete = reverse("admin:upgrades_cleanupauthorization_delete", args=[done.pk])
    assert client.get(delete).status_code == 403


def test_an_expired_approval_is_reported(admin_client, tenant):
    ready(tenant)
    found = cleanup.request_cleanup(tenant, requested_by="alice")
    found = cleanup.approve(found.id, expected_row_version=0, approved_by="bob")
    CleanupAuthorization.objects.filter(id=found.id).update(
        approved_at=found.approved_at.replace(year=2020),
        approval_expires_at=found.approval_expires_at.replace(year=2020),
    )
    assert "approval_expired" in act(admin_client, "start_cleanups", found)
