"""Bulk actions over sources as durable runs of kind ``bulk`` (docs/datasources.md, "Bulk"):
202 with the run, one outcome per source, a checkpoint per source so a killed delivery resumes
without acting on a finished source twice, cancel, the 200-source limit."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ingestion.sources import bulk, dispatch
from ingestion.sources.models import Source, SourceRun, SourceRunItem
from ingestion.tests import test_sources_sync as sync
from knowledgefs.testing import dify_fixtures

pytestmark = pytest.mark.django_db

dify_server = dify_fixtures.dify_server
dify = sync.dify
deliver, start, url, make_source = sync.deliver, sync.start, sync.url, sync.make_source
MISSING = "00000000-0000-0000-0000-000000000000"


def start_bulk(client, space, capture, body, key=None) -> dict:
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    with capture(execute=True):
        response = client.post(url(space, "sources", "bulk"), body, format="json", **headers)
    assert response.status_code == 202, response.content
    return response.json()


def read(client, space, run_id) -> dict:
    response = client.get(url(space, "source-runs", run_id))
    assert response.status_code == 200, response.content
    return response.json()


def test_bulk_actions_are_a_durable_run_with_one_outcome_per_source(
    client, space, dify, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    first, second = make_source(client, space), make_source(client, space)
    busy = start(client, space, second, "sync", capture)
    body = {"action": "sync", "source_ids": [first, second, MISSING]}
    run = start_bulk(client, space, capture, body, key="bulk-1")
    assert (run["kind"], run["state"], run["source_id"], run["progress_total"]) == (
        "bulk", "queued", None, 3,
    )  # fmt: skip
    assert [r["state"] for r in run["results"]] == ["pending"] * 3
    assert start_bulk(client, space, capture, body, key="bulk-1")["id"] == run["id"]
    with capture(execute=True):
        assert deliver(run["id"]) == "completed"
    done = read(client, space, run["id"])
    assert (done["state"], done["progress_completed"], done["progress_failed"]) == (
        "completed", 1, 2,
    )  # fmt: skip
    results = done["results"]
    assert [r["source_id"] for r in results] == [first, second, MISSING]
    assert [r["state"] for r in results] == ["done", "failed", "failed"]
    assert [r.get("code") for r in results] == [None, "source_run_active", "source_not_found"]
    synced = SourceRun.objects.get(id=results[0]["run_id"])
    assert (synced.trigger, synced.source_id) == ("bulk", Source.objects.get(id=first).id)
    assert deliver(synced.id) == "completed"
    listed = client.get(url(space, "source-runs")).json()["results"]
    assert run["id"] in [r["id"] for r in listed]

    Source.objects.filter(id=first).update(sync_enabled=True, sync_mode="interval")
    disabled = start_bulk(client, space, capture, {"action": "disable", "source_ids": [first]})
    assert deliver(disabled["id"]) == "completed"
    assert not Source.objects.get(id=first).sync_enabled
    assert deliver(busy["id"]) == "completed"
    removed = start_bulk(
        client, space, capture, {"action": "remove", "source_ids": [first, second]}
    )
    assert deliver(removed["id"]) == "completed"
    assert not Source.objects.exists()
    assert [r["state"] for r in read(client, space, removed["id"])["results"]] == ["done"] * 2

    for body, code in (
        ({"action": "sync", "source_ids": []}, "invalid_request"),
        ({"action": "sync", "source_ids": [MISSING] * 201}, "too_many_items"),
        ({"action": "purge", "source_ids": [MISSING]}, "invalid_request"),
    ):
        response = client.post(url(space, "sources", "bulk"), body, format="json")
        assert response.status_code == 400 and response.json()["code"] == code, body
        if code == "too_many_items":
            assert "200" in response.json()["message"]
    assert not SourceRun.objects.filter(kind="bulk", progress_total=201).exists()


def test_a_killed_bulk_delivery_resumes_without_redoing_finished_sources(
    client, space, dify, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    ids = [make_source(client, space) for _ in range(3)]
    run = start_bulk(client, space, capture, {"action": "sync", "source_ids": ids})
    row = SourceRun.objects.get(id=run["id"])
    assert dispatch.QUEUE.begin(row.id, row.task_id) is not None  # a worker started it ...
    row = SourceRun.objects.select_related("source", "space").get(id=row.id)
    first = SourceRunItem.objects.filter(run=row).order_by("ordinal").first()
    with capture(execute=True):
        bulk._apply_one(row, row.task_id, first)
    started = SourceRun.objects.get(source_id=ids[0], kind="sync")
    # ... and was killed: the sweep puts it back and dispatches it again
    SourceRun.objects.filter(id=row.id).update(step_started_at=row.started_at - timedelta(hours=1))
    with capture(execute=True):
        report = dispatch.QUEUE.sweep()
    assert report.stale_requeued == 1 and report.dispatched == 1
    with capture(execute=True):
        assert deliver(row.id) == "completed"
    done = read(client, space, run["id"])
    assert [r["state"] for r in done["results"]] == ["done"] * 3
    assert done["results"][0]["run_id"] == str(started.id)  # not started a second time
    assert done["progress_completed"] == 3 and done["execution_attempts"] == 2
    assert SourceRun.objects.filter(kind="sync", trigger="bulk").count() == 3


def test_a_bulk_run_is_canceled_and_retried_by_its_space_route(
    client, space, dify, admin_client, django_capture_on_commit_callbacks
):
    from django.urls import reverse

    capture = django_capture_on_commit_callbacks
    ids = [make_source(client, space) for _ in range(2)]
    run = start_bulk(client, space, capture, {"action": "disable", "source_ids": ids})
    changelist = reverse("admin:ingestion_sourcerun_changelist")
    assert admin_client.get(changelist).status_code == 200  # a run with no source of its own
    detail = reverse("admin:ingestion_sourcerun_change", args=[run["id"]])
    assert admin_client.get(detail).status_code == 200
    canceled = client.post(url(space, "source-runs", run["id"], "cancel"))
    assert canceled.status_code == 200 and canceled.json()["state"] == "canceled"
    assert sync.deliver_stale(run["id"]) == "skipped"
    with capture(execute=True):
        retried = client.post(url(space, "source-runs", run["id"], "retry"))
    assert retried.status_code == 202 and retried.json()["state"] == "queued"
    assert deliver(run["id"]) == "completed"
    assert read(client, space, run["id"])["progress_completed"] == 2
    # a bulk run is not any source's run
    response = client.get(url(space, "sources", ids[0], "runs", run["id"]))
    assert response.status_code == 404 and response.json()["code"] == "source_run_not_found"
