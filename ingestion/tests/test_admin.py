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


# --- the job page: buttons, progress bar, retryable -------------------------------------------


def job_page(admin_client, job: CompilationJob) -> str:
    response = admin_client.get(reverse("admin:ingestion_compilationjob_change", args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


def press(admin_client, button: str, job: CompilationJob):
    url = reverse(f"admin:ingestion_compilationjob_{button}", args=[job.pk])
    return admin_client.post(url, follow=True)


def test_the_job_page_has_retry_and_cancel_buttons_posting_with_a_csrf_token(admin_client, space):
    job = failed_job(space)
    page = job_page(admin_client, job)
    for button in ("retry", "cancel"):
        url = reverse(f"admin:ingestion_compilationjob_{button}", args=[job.pk])
        form = page[page.index(f'action="{url}"') - 60 : page.index(f'action="{url}"') + 300]
        assert 'method="post"' in form and 'name="csrfmiddlewaretoken"' in form, form
        assert admin_client.get(url).status_code == 405  # never on a GET


def test_the_job_buttons_refuse_a_post_without_the_csrf_token(admin_user, space):
    from django.test import Client

    job = failed_job(space)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(admin_user)
    url = reverse("admin:ingestion_compilationjob_retry", args=[job.pk])
    assert browser.post(url).status_code == 403
    assert not CompilationJob.objects.filter(retry_of=job).exists()


def test_the_retry_button_queues_a_new_attempt_or_reports_the_refusal(admin_client, space):
    failed = failed_job(space, error_retryable=True)
    response = press(admin_client, "retry", failed)
    page = response.content.decode()
    assert response.redirect_chain[-1][0].endswith(f"/compilationjob/{failed.pk}/change/")
    assert "Queued a new attempt for 1 job." in page
    assert "terminal" not in page
    retry = CompilationJob.objects.get(retry_of=failed)
    assert (retry.run_state, retry.attempt_number) == (RunState.QUEUED, 2)
    assert reverse("admin:ingestion_compilationjob_change", args=[retry.pk]) in page
    # the same refusal as the list action: the job was replaced by the new attempt
    page = press(admin_client, "retry", failed).content.decode()
    assert f"Job {failed.id} (blank.txt): " in page and "replaced by a newer attempt" in page
    assert CompilationJob.objects.filter(retry_of=failed).count() == 1


def test_the_cancel_button_cancels_a_queued_job_or_reports_the_refusal(admin_client, space):
    queued = admit_document(space, filename="queued.md", data=b"# Q\n\ntext", enqueue=False).job
    page = press(admin_client, "cancel", queued).content.decode()
    assert "Canceled 1 job." in page
    assert CompilationJob.objects.get(id=queued.id).run_state == RunState.CANCELED
    page = press(admin_client, "cancel", queued).content.decode()
    assert f"Job {queued.id} (queued.md): " in page
    assert '<li class="warning">' in page


def test_retrying_a_job_whose_error_is_terminal_warns_and_queues_it(admin_client, space):
    terminal = failed_job(space, "terminal.txt", error_retryable=False)
    retryable = failed_job(space, "transient.txt", error_retryable=True, error_code="timeout")
    page = run_action(admin_client, "retry_jobs", terminal, retryable).content.decode()
    assert "Queued a new attempt for 2 jobs." in page
    warning = (
        f"Job {terminal.id} (terminal.txt): its error no_extractable_text is terminal "
        "(not retryable)"
    )
    assert warning in page
    assert f"Job {retryable.id}" not in page
    assert CompilationJob.objects.filter(retry_of__in=[terminal, retryable]).count() == 2
    # the page's button says the same
    other = failed_job(space, "other.txt", error_retryable=False)
    page = press(admin_client, "retry", other).content.decode()
    assert '<li class="warning">' in page and "is terminal (not retryable)" in page


def test_the_job_page_shows_progress_as_a_bar_with_counters_not_json(admin_client, space):
    job = admit_document(space, filename="p.md", data=b"# P\n\ntext", enqueue=False).job
    progress = {
        "phase": "embedding",
        "operation": "embedding with the local model",
        "nodes_total": 500,
        "nodes_embedded": 310,
        "percent": 62,
    }
    CompilationJob.objects.filter(id=job.id).update(
        run_state=RunState.RUNNING, progress=progress, progress_percent=62
    )
    page = job_page(admin_client, job)
    assert '<progress max="100" value="62"' in page
    assert '<strong class="kfs-percent">62%</strong>' in page
    for label, value in [("phase", "embedding"), ("nodes", "500"), ("embedded", "310 of 500")]:
        assert f"<li><span>{label}</span> <strong>{value}</strong></li>" in page
    assert "nodes_embedded" not in page and "&quot;phase&quot;" not in page


def test_retryable_shows_only_once_a_job_has_ended_with_an_error(admin_client, space):
    running = admit_document(space, filename="r.md", data=b"# R\n\ntext", enqueue=False).job
    CompilationJob.objects.filter(id=running.id).update(
        run_state=RunState.RUNNING, error_retryable=False
    )

    def retryable_field(job) -> str:
        page = job_page(admin_client, job)
        start = page.index("field-retryable")
        return page[start : page.index("</div>", page.index('class="readonly"', start))]

    field = retryable_field(running)
    assert "—" in field and "icon-no" not in field and "icon-yes" not in field
    assert "icon-no" in retryable_field(failed_job(space, "t.txt", error_retryable=False))
    assert "icon-yes" in retryable_field(failed_job(space, "u.txt", error_retryable=True))


def test_long_filenames_are_cut_with_an_ellipsis_and_kept_whole_in_the_title(admin_client, space):
    name = "quarterly-report-" + "x" * 230 + ".txt"
    failed_job(space, name)
    for url in (reverse(JOBS), reverse("admin:ingestion_document_changelist")):
        page = admin_client.get(url).content.decode()
        assert f'class="kfs-ellipsis" title="{name}"' in page, url
        assert "text-overflow:ellipsis" in page and "white-space:nowrap" in page
