"""Operator screens: every admin page renders, keys are revoked and jobs retried from admin."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from ingestion.admin import attempt_chain, progress_label
from ingestion.compilation import operations
from ingestion.documents import admit_document
from ingestion.models import CompilationJob, RunState, Stage
from knowledgefs.errors import Conflict
from knowledgefs.testing.fixtures import compile_all
from spaces.api_keys import create_api_key
from spaces.models import ApiKey

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


# --- compilation jobs -----------------------------------------------------------------------

JOBS = "admin:ingestion_compilationjob_changelist"


def failed_job(space, filename: str = "blank.txt", **fields) -> CompilationJob:
    """An admitted document whose job ended the way a compile failure leaves it."""
    job = admit_document(space, filename=filename, data=filename.encode(), enqueue=False)
    fields = {
        "stage": Stage.FAILED,
        "run_state": RunState.FAILED,
        "error_code": "no_extractable_text",
        "error_message": "the document has no text",
        "finished_at": timezone.now(),
        **fields,
    }
    CompilationJob.objects.filter(id=job.job.id).update(**fields)
    return CompilationJob.objects.get(id=job.job.id)


def run_action(admin_client, action: str, *jobs: CompilationJob):
    return admin_client.post(
        reverse(JOBS),
        {"action": action, "_selected_action": [str(job.pk) for job in jobs]},
        follow=True,
    )


def test_the_progress_column_says_where_a_job_is():
    job = CompilationJob(progress_percent=62)
    assert progress_label(job) == "62%"
    job.progress = {"phase": "embedding", "operation": "embedding with m", "nodes_total": 500}
    job.progress.update(nodes_embedded=310, percent=62)
    assert progress_label(job) == "62% embedding 310/500"
    job.progress = {"phase": "parsed", "operation": "parsed", "elements_parsed": 120, "percent": 30}
    assert progress_label(job) == "30% parsed 120 elements"
    job.progress = {"phase": "chunked", "nodes_total": 40, "percent": 50}
    assert progress_label(job) == "50% chunked 40 nodes"


def test_the_jobs_list_shows_the_error_message_escaped_in_a_title(admin_client, space):
    failed_job(space, error_message='bad "<script>" & more')
    response = admin_client.get(reverse(JOBS))
    assert response.status_code == 200
    assert b'title="bad &quot;&lt;script&gt;&quot; &amp; more">no_extractable_text' in (
        response.content
    )
    assert b"<script>" not in response.content


def test_filters_by_tenant_age_and_stale_lease(admin_client, space):
    now = timezone.now()
    old = failed_job(space, "old.txt")
    CompilationJob.objects.filter(id=old.id).update(created_at=now - timedelta(days=3))
    stale = admit_document(space, filename="stale.txt", data=b"stale text", enqueue=False).job
    CompilationJob.objects.filter(id=stale.id).update(
        run_state=RunState.RUNNING, lease_expires_at=now - timedelta(minutes=5)
    )
    alive = admit_document(space, filename="alive.txt", data=b"alive text", enqueue=False).job
    CompilationJob.objects.filter(id=alive.id).update(
        run_state=RunState.RUNNING, lease_expires_at=now + timedelta(minutes=5)
    )

    def listed(query: str) -> set[str]:
        response = admin_client.get(reverse(JOBS) + query)
        assert response.status_code == 200
        return {job.document.filename for job in response.context["cl"].result_list}

    assert listed("?age=stale") == {"stale.txt"}
    page = admin_client.get(reverse(JOBS)).content.decode()
    assert page.count("Running <strong>(lease expired)</strong>") == 1
    assert listed("?age=gt1d") == {"old.txt"}
    assert listed("?age=lt1h") == {"stale.txt", "alive.txt"}
    assert listed("?age=1h-24h") == set()
    assert listed(f"?tenant={space.tenant_id}") == {"old.txt", "stale.txt", "alive.txt"}
    assert listed("?tenant=someone-else") == set()
    assert listed("?q=alive") == {"alive.txt"}
    assert listed(f"?q={stale.id}") == {"stale.txt"}
    assert listed("?q=not-a-uuid") == set()


def test_the_job_page_is_read_only_and_shows_the_whole_attempt_chain(admin_client, space):
    first = failed_job(space)
    second = CompilationJob.objects.create(
        tenant_id=first.tenant_id,
        space=space,
        document=first.document,
        stage=Stage.FAILED,
        run_state=RunState.FAILED,
        error_code="parse_failed",
        retry_of=first,
        attempt_number=2,
    )
    third = CompilationJob.objects.create(
        tenant_id=first.tenant_id,
        space=space,
        document=first.document,
        retry_of=second,
        attempt_number=3,
    )
    assert [job.pk for job in attempt_chain(second)] == [first.pk, second.pk, third.pk]
    response = admin_client.get(reverse("admin:ingestion_compilationjob_change", args=[second.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    assert 'name="_save"' not in page
    for job in (first, third):
        assert reverse("admin:ingestion_compilationjob_change", args=[job.pk]) in page
    assert f"<strong>{second.pk}</strong> (this job)" in page
    assert "parse_failed" in page and "no_extractable_text" in page


def test_the_jobs_list_offers_no_add(admin_client):
    response = admin_client.get(reverse(JOBS))
    assert reverse("admin:ingestion_compilationjob_changelist") + "add/" not in (
        response.content.decode()
    )


def test_retry_reports_each_job_it_queued_and_each_it_refused(admin_client, space):
    retriable = failed_job(space)
    live = admit_document(space, filename="live.md", data=b"# Live\n\ntext", enqueue=False).job
    response = run_action(admin_client, "retry_jobs", retriable, live)
    page = response.content.decode()
    assert "Queued a new attempt for 1 job." in page
    assert f"Job {live.id} (live.md): " in page
    retry = CompilationJob.objects.get(retry_of=retriable)
    assert (retry.run_state, retry.attempt_number) == (RunState.QUEUED, 2)
    assert CompilationJob.objects.get(id=live.id).run_state == RunState.QUEUED


def test_cancel_reports_each_job_it_canceled_and_each_it_refused(admin_client, space):
    queued = admit_document(space, filename="queued.md", data=b"# Q\n\ntext", enqueue=False).job
    finished = failed_job(space)
    response = run_action(admin_client, "cancel_jobs", queued, finished)
    page = response.content.decode()
    assert "Canceled 1 job." in page
    assert f"Job {finished.id} (blank.txt): " in page
    assert CompilationJob.objects.get(id=queued.id).run_state == RunState.CANCELED
    assert CompilationJob.objects.get(id=finished.id).run_state == RunState.FAILED


def test_the_job_actions_report_every_conflict_the_service_raises(admin_client, space, monkeypatch):
    jobs = [failed_job(space, f"{name}.txt") for name in ("a", "b")]

    def refuse(job_id):
        raise Conflict("the job is being compiled", code="job_live")

    monkeypatch.setattr(operations, "retry_job", refuse)
    page = run_action(admin_client, "retry_jobs", *jobs).content.decode()
    for job in jobs:
        assert f"Job {job.id} ({job.document.filename}): the job is being compiled" in page
    assert "Queued a new attempt" not in page
