"""Source runs end to end on the simulated Dify (docs/datasources.md): preview, select, import,
query; then change two pages and delete one at the provider, and the sync updates exactly
those (two candidate revisions published, one document disabled) while unchanged pages are
neither read again nor compiled again (counted on the test server and in compilation jobs).
Faults: 429/5xx back off and resume, an oversized item fails alone, an invalid or foreign
credential fails the run with nothing removed. Runs are delivered by this process with the
worker's entry point (the jobs kernel's claim)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from ingestion.models import CompilationJob, Document
from ingestion.sources import dispatch, runner
from ingestion.sources.materialize import process
from ingestion.sources.models import Source, SourceItem, SourceRun, SourceRunItem
from ingestion.tasks import start_due_source_syncs
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_datasource import WORKSPACE, Item
from knowledgefs.testing.dify_server import DATASOURCE, TEST_INNER_KEY
from knowledgefs.testing.fixtures import compile_all
from retrieval.modes import retrieve

pytestmark = pytest.mark.django_db

dify_server = dify_fixtures.dify_server
NOTION = "langgenius/notion_datasource/notion"
TOPICS = {
    "p-leave": "Every employee gets 25 days of annual leave per year.",
    "p-parking": "Staff park on level two of the garage; visitors use level one.",
    "p-travel": "The mileage rate is forty cents per kilometre for private cars.",
    "p-lunch": "The canteen serves lunch from noon until two in the afternoon.",
    "p-secret": "This page was never selected and must never be imported.",
}


@pytest.fixture
def dify(dify_server, settings, tenant):
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    settings.KNOWLEDGE_SOURCE_RETRY_BASE_SECONDS = 0
    provider = dify_server.provider
    provider.credentials = {"cred-kfs": tenant, "cred-other": "tenant-elsewhere"}
    for page_id, text in TOPICS.items():
        title = page_id.removeprefix("p-").title()
        provider.pages[page_id] = Item(title, f"# {title}\n\n{text}\n".encode())
    return dify_server


def url(space, *parts) -> str:
    return "/".join([f"/v1/knowledge-spaces/{space.id}", *parts])


def make_source(client, space, credential="cred-kfs") -> str:
    response = client.post(
        url(space, "sources"),
        {"name": "Wiki", "kind": "online_document", "provider": NOTION,
         "datasource": "notion_datasource", "credential_id": credential},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    return response.json()["id"]


def deliver(run_id) -> str:
    """What the worker does with the published message: the run's current claim."""
    run = SourceRun.objects.get(id=run_id)
    assert run.task_id, "the run was not claimed before its message was published"
    return runner.run_delivery(str(run.id), run.task_id)


def start(client, space, source_id, what, capture, body=None, key=None):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    with capture(execute=True):
        response = client.post(
            url(space, "sources", source_id, what), body or {}, format="json", **headers
        )
    assert response.status_code == 202, response.content
    return response.json()


def run_of(client, space, source_id, run_id) -> dict:
    return client.get(url(space, "sources", source_id, "runs", run_id)).json()


def import_selected(client, space, source_id, capture) -> dict:
    listed = client.get(url(space, "sources", source_id, "pages"), {"limit": 200}).json()
    pages = listed["workspaces"][0]["pages"]
    assert len(pages) == 5 and all("content" not in p for p in pages)
    chosen = [p for p in pages if p["page_id"] != "p-secret"]
    items = [{"page_id": p["page_id"], "workspace_id": WORKSPACE, "name": p["name"]}
             for p in chosen]  # fmt: skip
    run = start(
        client, space, source_id, "imports", capture, {"items": items}, key=f"import-{source_id}"
    )
    assert run["state"] == "queued" and run["progress_total"] == 4
    assert deliver(run["id"]) == "completed"
    with capture(execute=True):
        compile_all()
    return run_of(client, space, source_id, run["id"])


def test_import_then_sync_updates_exactly_what_changed(
    client, space, dify, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    source_id = make_source(client, space)
    done = import_selected(client, space, source_id, capture)
    assert (done["state"], done["checkpoint"]) == ("completed", "source-committed")
    assert (done["progress_completed"], done["progress_skipped"], done["progress_failed"]) == (
        4, 0, 0,
    )  # fmt: skip
    assert Document.objects.filter(space=space, state="published").count() == 4
    hit = retrieve(space, "annual leave days", top_k=1, score_threshold=None).items[0]
    assert "25 days" in hit.text

    provider = dify.provider
    provider.change("pages", "p-leave", b"# Leave\n\nEvery employee gets 30 days of leave.\n")
    provider.change("pages", "p-travel", b"# Travel\n\nThe mileage rate is fifty cents.\n")
    del provider.pages["p-parking"]
    provider.item_calls.clear()
    jobs_before = CompilationJob.objects.count()

    # the scheduled sync: a policy due now, started by the schedule's task
    policy_url = url(space, "sources", source_id, "sync-policy")
    put = client.put(policy_url, {"mode": "custom", "enabled": True,
                                  "custom_interval_seconds": 3600, "expected_revision": 1},
                     format="json")  # fmt: skip
    assert put.status_code == 200, put.content
    Source.objects.filter(id=source_id).update(next_run_at=timezone.now())
    with capture(execute=True):
        assert start_due_source_syncs()["started"] == 1
    run = {"id": str(SourceRun.objects.get(kind="sync", trigger="schedule").id)}
    assert deliver(run["id"]) == "completed"
    synced = run_of(client, space, source_id, run["id"])
    assert synced["state"] == "completed" and synced["progress_total"] == 4
    assert (synced["progress_completed"], synced["progress_skipped"]) == (3, 1)
    # only the two changed pages were read again; the unchanged one and the gone one were not
    assert sorted(k[1] for k in provider.item_calls) == ["p-leave", "p-travel"]
    # two candidate revisions, and nothing else compiled (no embedding of unchanged pages)
    assert CompilationJob.objects.count() == jobs_before + 2
    old = retrieve(space, "mileage rate", top_k=1, score_threshold=None).items[0]
    assert "forty" in old.text  # the published revision answers until the candidate compiles
    with capture(execute=True):
        compile_all()
    new = retrieve(space, "mileage rate", top_k=1, score_threshold=None).items[0]
    assert "fifty" in new.text and new.citation["revision"] == 2
    parking = SourceItem.objects.get(name__startswith="Parking")
    assert parking.state == "disabled" and parking.disabled_at is not None
    assert Document.objects.get(id=parking.document_id).enabled is False
    assert not [
        i for i in retrieve(space, "garage level", top_k=5, score_threshold=None).items
        if "garage" in i.text
    ]  # fmt: skip
    # never a page that was not selected
    assert not Document.objects.filter(filename__startswith="Secret").exists()
    assert SourceItem.objects.count() == 4
    # a second sync with nothing changed reads no content and compiles nothing
    provider.item_calls.clear()
    jobs_before = CompilationJob.objects.count()
    run = start(client, space, source_id, "sync", capture)
    assert deliver(run["id"]) == "completed"
    assert not provider.item_calls and CompilationJob.objects.count() == jobs_before
    listed = client.get(url(space, "source-runs"), {"source_id": source_id}).json()
    assert [r["kind"] for r in listed["results"]] == ["sync", "sync", "online-document-import"]


def test_a_rerun_after_a_killed_delivery_imports_only_the_pending_items(
    client, space, dify, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    source_id = make_source(client, space)
    items = [{"page_id": p, "workspace_id": WORKSPACE} for p in ("p-leave", "p-travel")]
    run = start(client, space, source_id, "imports", capture, {"items": items})
    row = SourceRun.objects.get(id=run["id"])
    assert dispatch.QUEUE.begin(row.id, row.task_id) is not None  # a worker started it ...
    row.refresh_from_db()
    first = SourceRunItem.objects.filter(run=row).order_by("ordinal").first()
    row = SourceRun.objects.select_related("source", "space").get(id=row.id)
    runner._stage(row, row.task_id, runner.client())
    process(row, row.task_id, SourceRunItem.objects.get(id=first.id), runner.client())
    # ... and was killed: the sweep puts it back and dispatches it again
    SourceRun.objects.filter(id=row.id).update(step_started_at=row.started_at - timedelta(hours=1))
    with capture(execute=True):
        report = dispatch.QUEUE.sweep()
    assert report.stale_requeued == 1 and report.dispatched == 1
    dify.provider.item_calls.clear()
    assert deliver(row.id) == "completed"
    assert [k[1] for k in dify.provider.item_calls] == ["p-travel"]
    assert Document.objects.filter(space=space).count() == 2
    done = run_of(client, space, source_id, run["id"])
    assert done["progress_completed"] == 2 and done["execution_attempts"] == 2


def test_429_and_5xx_back_off_and_the_run_resumes(
    client, space, dify, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    source_id = make_source(client, space)
    items = [{"page_id": p, "workspace_id": WORKSPACE} for p in ("p-leave", "p-travel")]
    run = start(client, space, source_id, "imports", capture, {"items": items})
    dify.fail_next(1, status=429, route=DATASOURCE)
    assert deliver(run["id"]) == "retry"
    row = SourceRun.objects.get(id=run["id"])
    assert row.state == "queued" and row.retry_at is not None and row.task_id is None
    assert row.error_code == "datasource_unavailable"
    # the sweep dispatches it once due (the test's back-off is 0 s)
    SourceRun.objects.filter(id=row.id).update(updated_at=row.updated_at - timedelta(minutes=1))
    with capture(execute=True):
        assert dispatch.QUEUE.sweep().dispatched == 1
    dify.fail_next(1, status=503, route=DATASOURCE)
    assert deliver(row.id) == "retry"
    SourceRun.objects.filter(id=row.id).update(updated_at=row.updated_at - timedelta(minutes=1))
    with capture(execute=True):
        dispatch.QUEUE.sweep()
    assert deliver(row.id) == "completed"
    done = run_of(client, space, source_id, run["id"])
    assert done["progress_completed"] == 2 and done["error_code"] is None
    assert done["execution_attempts"] == 3


def test_a_run_gives_up_after_the_attempts_setting(
    client, space, dify, settings, django_capture_on_commit_callbacks
):
    settings.KNOWLEDGE_SOURCE_RUN_MAX_ATTEMPTS = 1
    source_id = make_source(client, space)
    run = start(client, space, source_id, "sync", django_capture_on_commit_callbacks)
    dify.fail_next(1, status=502, route=DATASOURCE)
    assert deliver(run["id"]) == "failed"
    assert run_of(client, space, source_id, run["id"])["error_code"] == "datasource_unavailable"


def test_an_oversized_item_fails_alone_and_the_run_goes_on(
    client, space, dify, django_capture_on_commit_callbacks
):
    dify.provider.oversize.add("p-travel")
    source_id = make_source(client, space)
    items = [{"page_id": p, "workspace_id": WORKSPACE} for p in ("p-leave", "p-travel", "p-lunch")]
    run = start(client, space, source_id, "imports", django_capture_on_commit_callbacks,
                {"items": items})  # fmt: skip
    assert deliver(run["id"]) == "completed"
    done = run_of(client, space, source_id, run["id"])
    assert (done["progress_completed"], done["progress_failed"]) == (2, 1)
    failed = SourceRunItem.objects.get(run_id=run["id"], state="failed")
    assert failed.error_code == "source_item_too_large" and "p-travel" in failed.provider_item_id
    assert Document.objects.filter(space=space).count() == 2


def test_an_invalid_credential_fails_the_sync_and_removes_nothing(
    client, space, dify, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    source_id = make_source(client, space)
    import_selected(client, space, source_id, capture)
    dify.provider.valid = False  # revoked in Dify
    assert client.post(url(space, "sources", source_id, "test")).json()["valid"] is False
    run = start(client, space, source_id, "sync", capture)
    assert deliver(run["id"]) == "failed"
    failed = run_of(client, space, source_id, run["id"])
    assert failed["error_code"] == "source_credential_invalid"
    assert Document.objects.filter(space=space, enabled=True).count() == 4
    assert not SourceItem.objects.filter(state="disabled").exists()
    # fixed in Dify: the same run retried completes with nothing changed
    dify.provider.valid = True
    with capture(execute=True):
        response = client.post(url(space, "sources", source_id, "runs", run["id"], "retry"))
    assert response.status_code == 202, response.content
    assert deliver(run["id"]) == "completed"
    assert run_of(client, space, source_id, run["id"])["progress_skipped"] == 4


def test_another_tenants_credential_fails_the_run_403_code(
    client, space, dify, django_capture_on_commit_callbacks
):
    source_id = make_source(client, space, credential="cred-other")
    run = start(client, space, source_id, "sync", django_capture_on_commit_callbacks)
    assert deliver(run["id"]) == "failed"
    assert run_of(client, space, source_id, run["id"])["error_code"] == (
        "source_credential_forbidden"
    )
    response = client.get(url(space, "sources", source_id, "pages"))
    assert response.status_code == 403 and response.json()["code"] == "source_credential_forbidden"


def test_one_live_run_per_source_idempotency_cancel_and_bad_imports(
    client, space, dify, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    source_id = make_source(client, space)
    first = start(client, space, source_id, "sync", capture, key="k-1")
    again = start(client, space, source_id, "sync", capture, key="k-1")
    assert again["id"] == first["id"]  # the same key replays the first answer
    response = client.post(url(space, "sources", source_id, "sync"), {}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "source_run_active"
    cancel = client.post(url(space, "sources", source_id, "runs", first["id"], "cancel"))
    assert cancel.status_code == 200 and cancel.json()["state"] == "canceled"
    assert deliver_stale(first["id"]) == "skipped"  # its message arrives later: nothing runs
    again = client.post(url(space, "sources", source_id, "runs", first["id"], "cancel"))
    assert again.status_code == 409 and again.json()["code"] == "source_run_finished"
    for body, code in (
        ({"items": []}, "invalid_items"),
        ({"items": [{"page_id": "p", "workspace_id": WORKSPACE}] * 201}, "too_many_items"),
        ({"items": [{"page_id": "p"}]}, "invalid_items"),
        ({"items": [{"page_id": "p", "workspace_id": "w", "token": "x"}]}, "invalid_items"),
        ({"pages": []}, "invalid_request"),
    ):
        response = client.post(url(space, "sources", source_id, "imports"), body, format="json")
        assert response.status_code == 400 and response.json()["code"] == code, body


def deliver_stale(run_id) -> str:
    return runner.run_delivery(str(run_id), "a-delivery-that-lost-its-claim")


def test_drives_skip_downloads_by_checksum_and_websites_compare_content(
    client, space, dify, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    provider = dify.provider
    for n in range(3):
        provider.files[f"f-{n}"] = Item(
            f"memo-{n}.md", f"# Memo {n}\n\nMemo number {n}.\n".encode()
        )
    drive = client.post(
        url(space, "sources"),
        {"name": "Drive", "kind": "online_drive", "provider": "langgenius/drive/google_drive",
         "datasource": "google_drive", "credential_id": "cred-kfs"},
        format="json",
    ).json()["id"]  # fmt: skip
    listed = client.get(url(space, "sources", drive, "files"), {"max_keys": 2}).json()
    bucket = listed["buckets"][0]
    assert [f["id"] for f in bucket["files"]] == ["f-0", "f-1"] and bucket["is_truncated"]
    more = client.get(
        url(space, "sources", drive, "files"),
        {"max_keys": 2, "continuation_token": bucket["continuation_token"]},
    ).json()
    assert [f["id"] for f in more["buckets"][0]["files"]] == ["f-2"]
    bad = client.get(url(space, "sources", drive, "files"), {"max_keys": 1001})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_limit"
    items = [{"id": f"f-{n}", "name": f"memo-{n}.md"} for n in range(3)]
    run = start(client, space, drive, "imports", capture, {"items": items})
    assert deliver(run["id"]) == "completed"
    provider.change("files", "f-1", b"# Memo 1\n\nMemo one, revised.\n")
    provider.item_calls.clear()
    run = start(client, space, drive, "sync", capture)
    assert deliver(run["id"]) == "completed"
    assert list(provider.item_calls) == [("online_drive_download_file", "f-1")]
    # without provider checksums, an etag seen only at the import never skips a download
    provider.send_checksums = False
    provider.item_calls.clear()
    run = start(client, space, drive, "sync", capture)
    assert deliver(run["id"]) == "completed"
    assert sorted(k[1] for k in provider.item_calls) == ["f-0", "f-2"]  # f-1's etag was seen
    provider.item_calls.clear()
    run = start(client, space, drive, "sync", capture)
    assert deliver(run["id"]) == "completed"
    assert not provider.item_calls  # every etag now matched a real download

    provider.sites["https://example.test/a"] = Item("A", b"# A\n\nAlpha page about apples.\n")
    provider.sites["https://example.test/b"] = Item("B", b"# B\n\nBeta page about bananas.\n")
    site = client.post(
        url(space, "sources"),
        {"name": "Site", "kind": "website", "provider": "langgenius/firecrawl/firecrawl",
         "datasource": "crawl", "credential_id": "cred-kfs",
         "parameters": {"url": "https://example.test"}},
        format="json",
    ).json()["id"]  # fmt: skip
    preview = start(client, space, site, "crawl-preview", capture)
    assert deliver(preview["id"]) == "completed"
    run = start(client, space, site, "imports", capture,
                {"preview_run_id": preview["id"], "urls": ["https://example.test/a"]})  # fmt: skip
    assert deliver(run["id"]) == "completed"
    jobs = CompilationJob.objects.count()
    run = start(client, space, site, "sync", capture)
    assert deliver(run["id"]) == "completed"
    assert CompilationJob.objects.count() == jobs  # same content: skipped, never compiled
    provider.change("sites", "https://example.test/a", b"# A\n\nAlpha page about apricots.\n")
    run = start(client, space, site, "sync", capture)
    assert deliver(run["id"]) == "completed"
    assert CompilationJob.objects.count() == jobs + 1
    assert SourceItem.objects.filter(source_id=site).count() == 1  # b was never selected


def test_the_admin_cancels_and_retries_source_runs(
    client, space, dify, admin_client, django_capture_on_commit_callbacks
):
    from django.urls import reverse

    source_id = make_source(client, space)
    run = start(client, space, source_id, "sync", django_capture_on_commit_callbacks)
    changelist = reverse("admin:ingestion_sourcerun_changelist")
    assert admin_client.get(changelist).status_code == 200
    assert (
        admin_client.get(reverse("admin:ingestion_source_change", args=[source_id])).status_code
        == 200
    )
    response = admin_client.post(
        changelist, {"action": "cancel_runs", "_selected_action": [run["id"]]}, follow=True
    )
    assert response.status_code == 200
    assert SourceRun.objects.get(id=run["id"]).state == "canceled"
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(changelist, {"action": "retry_runs", "_selected_action": [run["id"]]})
    assert SourceRun.objects.get(id=run["id"]).state == "queued"
    assert deliver(run["id"]) == "completed"
    response = admin_client.post(
        changelist, {"action": "cancel_runs", "_selected_action": [run["id"]]}, follow=True
    )
    assert "already ended" in response.content.decode()  # a refusal is reported, not a 500


def test_a_page_back_at_the_provider_is_enabled_again_not_duplicated(
    client, space, dify, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    source_id = make_source(client, space)
    import_selected(client, space, source_id, capture)
    parking = dify.provider.pages.pop("p-parking")
    run = start(client, space, source_id, "sync", capture)
    assert deliver(run["id"]) == "completed"
    item = SourceItem.objects.get(name__startswith="Parking")
    assert item.state == "disabled" and not Document.objects.get(id=item.document_id).enabled
    dify.provider.pages["p-parking"] = parking  # restored in the workspace, unchanged
    run = start(client, space, source_id, "sync", capture)
    assert deliver(run["id"]) == "completed"
    item.refresh_from_db()
    assert item.state == "active" and item.disabled_at is None
    assert Document.objects.get(id=item.document_id).enabled
    assert Document.objects.filter(space=space).count() == 4
    hit = retrieve(space, "garage level two", top_k=1, score_threshold=None).items[0]
    assert "garage" in hit.text


def test_deleting_a_source_keeps_or_deletes_its_documents_never_while_it_runs(
    client, space, dify, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    kept_id = make_source(client, space)
    import_selected(client, space, kept_id, capture)
    run = start(client, space, kept_id, "sync", capture)
    busy = client.delete(url(space, "sources", kept_id))
    assert busy.status_code == 409 and busy.json()["code"] == "source_run_active"
    assert deliver(run["id"]) == "completed"
    assert client.delete(url(space, "sources", kept_id)).status_code == 204
    assert Document.objects.filter(space=space).count() == 4  # documents=keep
    assert not SourceItem.objects.exists() and not SourceRun.objects.exists()
    Document.objects.all().delete()
    gone_id = make_source(client, space)
    import_selected(client, space, gone_id, capture)
    bad = client.delete(url(space, "sources", gone_id) + "?documents=all")
    assert bad.status_code == 400 and bad.json()["details"]["field"] == "documents"
    assert client.delete(url(space, "sources", gone_id) + "?documents=cascade").status_code == 204
    assert not Document.objects.filter(space=space).exists()
