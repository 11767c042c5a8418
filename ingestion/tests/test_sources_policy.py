"""Sync policies and the schedule (docs/datasources.md): compare-and-set PUTs, bounds, due
sources found by (enabled, next_run_at) in bounded batches and each started once, the
retention of items gone at the provider."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from ingestion.models import Document
from ingestion.sources import policy
from ingestion.sources.models import Source, SourceItem, SourceRun
from knowledgefs.jobs import schedules

pytestmark = pytest.mark.django_db


def make_source(space, name="Wiki") -> Source:
    return Source.objects.create(
        tenant_id=space.tenant_id, space=space, name=name, kind="online_document",
        provider="langgenius/notion_datasource/notion", datasource="notion",
        credential_id="cred-kfs",
    )  # fmt: skip


def policy_url(space, source) -> str:
    return f"/v1/knowledge-spaces/{space.id}/sources/{source.id}/sync-policy"


def test_put_is_compare_and_set_and_bounded(client, space):
    source = make_source(space)
    read = client.get(policy_url(space, source)).json()
    assert read["mode"] == "manual" and read["enabled"] is False and read["revision"] == 1
    body = {"mode": "custom", "enabled": True, "custom_interval_seconds": 7200,
            "expected_revision": 1}  # fmt: skip
    before = timezone.now()
    response = client.put(policy_url(space, source), body, format="json")
    assert response.status_code == 200, response.content
    written = response.json()
    assert written["revision"] == 2 and written["interval_seconds"] == 7200
    source.refresh_from_db()
    assert before + timedelta(seconds=7200) <= source.next_run_at
    stale = client.put(policy_url(space, source), body, format="json")
    assert stale.status_code == 409 and stale.json()["code"] == "revision_conflict"
    for bad, field in (
        ({**body, "custom_interval_seconds": 3599, "expected_revision": 2},
         "custom_interval_seconds"),
        ({**body, "custom_interval_seconds": 2_592_001, "expected_revision": 2},
         "custom_interval_seconds"),
        ({"mode": "interval", "enabled": True, "custom_interval_seconds": 7200,
          "expected_revision": 2}, "custom_interval_seconds"),
        ({"mode": "hourly", "enabled": True, "expected_revision": 2}, "mode"),
        ({"mode": "manual", "enabled": "yes", "expected_revision": 2}, "enabled"),
        ({"mode": "manual", "enabled": False}, "expected_revision"),
        ({"mode": "manual", "enabled": False, "expected_revision": 2, "cron": "*"}, "cron"),
    ):  # fmt: skip
        response = client.put(policy_url(space, source), bad, format="json")
        assert response.status_code == 400, (bad, response.content)
        assert response.json()["code"] == "invalid_sync_policy"
        assert response.json()["details"]["field"] == field
    manual = client.put(
        policy_url(space, source),
        {"mode": "manual", "enabled": True, "expected_revision": 2}, format="json",
    ).json()  # fmt: skip
    assert manual["enabled"] is False and manual["next_run_at"] is None


def test_due_sources_start_once_in_bounded_batches(space, django_capture_on_commit_callbacks):
    now = timezone.now()
    due = [make_source(space, f"due-{n}") for n in range(3)]
    for n, source in enumerate(due):
        Source.objects.filter(id=source.id).update(
            sync_mode="interval", sync_enabled=True, next_run_at=now - timedelta(minutes=3 - n)
        )
    later = make_source(space, "later")
    Source.objects.filter(id=later.id).update(
        sync_mode="interval", sync_enabled=True, next_run_at=now + timedelta(hours=1)
    )
    off = make_source(space, "off")
    Source.objects.filter(id=off.id).update(sync_enabled=False, next_run_at=now)
    with django_capture_on_commit_callbacks(execute=True):
        report = policy.start_due(now=now, batch=2)
    assert report["due"] == 2 and report["started"] == 2
    assert set(SourceRun.objects.values_list("source_id", flat=True)) == {due[0].id, due[1].id}
    assert all(r.trigger == "schedule" and r.task_id for r in SourceRun.objects.all())
    with django_capture_on_commit_callbacks(execute=True):
        report = policy.start_due(now=now, batch=2)
    assert report["started"] == 1  # the third; the first two moved on a day
    assert SourceRun.objects.count() == 3
    assert Source.objects.get(id=due[0].id).next_run_at > now + timedelta(hours=23)
    # a source still running its last sync is left to it, and its turn still moves on
    Source.objects.filter(id=due[0].id).update(next_run_at=now - timedelta(seconds=1))
    assert policy.start_due(now=now)["busy"] == 1
    assert SourceRun.objects.count() == 3


def test_items_gone_past_the_retention_are_removed(space, settings):
    from ingestion.documents import admit_document

    settings.KNOWLEDGE_SOURCE_RETENTION_DAYS = 30
    source = make_source(space)
    now = timezone.now()
    kept = admit_document(space, filename="a.md", data=b"# A\n\nalpha\n", enqueue=False).document
    gone = admit_document(space, filename="b.md", data=b"# B\n\nbeta\n", enqueue=False).document
    for name, document, days in (("a", kept, 29), ("b", gone, 31)):
        SourceItem.objects.create(
            source=source, provider_item_id=name, item_digest=name * 64, name=name,
            document=document, state="disabled", disabled_at=now - timedelta(days=days),
        )  # fmt: skip
    assert policy.purge_disabled(now=now) == 1
    assert list(Document.objects.values_list("id", flat=True)) == [kept.id]
    assert list(SourceItem.objects.values_list("name", flat=True)) == ["a"]


def test_the_schedules_are_registered():
    assert schedules.SCHEDULES["knowledgefs.sources.due_syncs"].func == (
        "ingestion.tasks.start_due_source_syncs"
    )
    assert schedules.SCHEDULES["knowledgefs.sources.run_sweep"].func == (
        "ingestion.tasks.sweep_source_runs"
    )
