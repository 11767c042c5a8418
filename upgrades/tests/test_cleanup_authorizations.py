"""Cleanup authorizations: four-eyes approval, expiry, compare-and-set transitions, the start
that makes a rollback impossible, and the database checks behind them (spec §1.7, §2.7)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from upgrades.models import CleanupAuthorization, WorkspaceCutoverLedger
from upgrades.services import cleanup, cutover
from upgrades.tests.test_cutover import observing, ready, refused, snapshot

pytestmark = pytest.mark.django_db


def approved(tenant: str):
    found = cleanup.request_cleanup(tenant, requested_by="alice", reason="remove legacy data")
    return cleanup.approve(found.id, expected_row_version=0, approved_by="bob")


def test_the_requester_cannot_approve_and_another_operator_can(tenant):
    ready(tenant)
    found = cleanup.request_cleanup(tenant, requested_by="alice")
    assert (found.status, found.row_version, found.tenant_id) == ("requested", 0, tenant)
    error = refused(
        lambda: cleanup.approve(found.id, expected_row_version=0, approved_by="alice"),
        "four_eyes_required",
    )
    assert error.status == 403 and "another operator" in error.message
    assert CleanupAuthorization.objects.get(id=found.id).status == "requested"

    refused(lambda: cleanup.approve(found.id, expected_row_version=1, approved_by="bob"),
            "stale_version")  # fmt: skip
    done = cleanup.approve(found.id, expected_row_version=0, approved_by="bob")
    assert (done.status, done.row_version, done.approved_by) == ("approved", 1, "bob")
    assert done.approval_expires_at - done.approved_at == dt.timedelta(days=1)
    refused(lambda: cleanup.approve(found.id, expected_row_version=1, approved_by="carol"),
            "invalid_status")  # fmt: skip


def test_the_database_refuses_a_self_approval_written_by_sql(tenant):
    ready(tenant)
    found = cleanup.request_cleanup(tenant, requested_by="alice")
    now = timezone.now()
    with pytest.raises(IntegrityError), transaction.atomic():
        CleanupAuthorization.objects.filter(id=found.id).update(
            status="approved",
            approved_by="alice",
            approved_at=now,
            approval_expires_at=now + dt.timedelta(hours=1),
        )
    with pytest.raises(IntegrityError), transaction.atomic():  # status without its fields
        CleanupAuthorization.objects.filter(id=found.id).update(status="started")


def test_start_marks_the_ledger_irreversible_and_rollback_is_refused(tenant):
    ledger = ready(tenant)
    found = approved(tenant)
    started = cleanup.start(
        found.id, expected_row_version=1, started_by="bob", evidence={"ticket": "OPS-12"}
    )
    after = WorkspaceCutoverLedger.objects.get(tenant_id=tenant)
    assert started.status == "started" and started.started_ledger_cas_version == after.cas_version
    assert after.cas_version == ledger.cas_version + 1
    assert after.irreversible_cleanup_at == started.started_at
    refused(
        lambda: cutover.rollback(
            tenant, expected_phase="ready_for_cleanup", expected_cas_version=after.cas_version
        ),
        "irreversible_cleanup_started",
    )
    refused(lambda: cleanup.complete(started.id, expected_row_version=3, completed_by="carol",
                                     evidence={"rows": 1}), "stale_version")  # fmt: skip
    refused(lambda: cleanup.complete(started.id, expected_row_version=2, completed_by="carol",
                                     evidence={}), "invalid_evidence")  # fmt: skip
    done = cleanup.complete(
        started.id, expected_row_version=2, completed_by="carol", evidence={"rows": 1}
    )
    assert (done.status, done.row_version) == ("completed", 3)
    assert done.completed_ledger_cas_version == after.cas_version
    assert done.completion_evidence == {"rows": 1}


def test_an_expired_approval_cannot_start(tenant):
    ready(tenant)
    found = approved(tenant)
    before = snapshot(tenant)
    error = refused(
        lambda: cleanup.start(
            found.id,
            expected_row_version=1,
            started_by="bob",
            evidence={"ticket": "OPS-12"},
            now=found.approval_expires_at,
        ),
        "approval_expired",
    )
    assert error.status == 409
    assert CleanupAuthorization.objects.get(id=found.id).status == "approved"
    assert snapshot(tenant) == before


def test_start_needs_ready_for_cleanup_and_changes_nothing_before(tenant):
    observing(tenant)
    found = approved(tenant)
    before = snapshot(tenant)
    refused(lambda: cleanup.start(found.id, expected_row_version=1, started_by="bob",
                                  evidence={"t": 1}), "ledger_not_ready")  # fmt: skip
    assert snapshot(tenant) == before
    assert CleanupAuthorization.objects.get(id=found.id).status == "approved"


def test_requests_need_a_cut_over_ledger_and_one_open_authorization_at_a_time(tenant):
    refused(lambda: cleanup.request_cleanup(tenant, requested_by="alice"), "ledger_not_found")
    cutover.create_ledger(tenant)
    refused(lambda: cleanup.request_cleanup(tenant, requested_by="alice"), "ledger_not_ready")
    WorkspaceCutoverLedger.objects.filter(tenant_id=tenant).delete()
    ready(tenant)
    first = cleanup.request_cleanup(tenant, requested_by="alice")
    error = refused(lambda: cleanup.request_cleanup(tenant, requested_by="bob"),
                    "cleanup_already_open")  # fmt: skip
    assert str(first.id) in error.message
    refused(lambda: cleanup.request_cleanup(tenant, requested_by=" "), "invalid_operator")
    refused(lambda: cleanup.request_cleanup(tenant, requested_by="bob", reason="x" * 2001),
            "invalid_reason")  # fmt: skip
    refused(lambda: cleanup.approve("nope", expected_row_version=0, approved_by="bob"),
            "authorization_not_found")  # fmt: skip
