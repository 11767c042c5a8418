"""Faults of Dify's datasource at the level of a sync run (docs/datasources.md, "Faults"), on
the simulated Dify: a 429 is retried by the run with a doubling back-off (attempts counted on
the server), an oversized page fails alone while the sync goes on, and a revoked connection
fails a crawl preview with a clear code."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from ingestion.models import Document
from ingestion.sources import dispatch
from ingestion.sources.models import SourceItem, SourceRun, SourceRunItem
from ingestion.tests import test_sources_sync as sync
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_datasource import Item
from knowledgefs.testing.dify_server import DATASOURCE

pytestmark = pytest.mark.django_db

dify_server = dify_fixtures.dify_server
dify = sync.dify
deliver, start, url = sync.deliver, sync.start, sync.url


def redeliver(run_id, capture) -> str:
    """The sweep once the back-off is due (moved into the past), then the delivery."""
    past = timezone.now() - timedelta(minutes=1)
    SourceRun.objects.filter(id=run_id).update(retry_at=past, updated_at=past)
    with capture(execute=True):
        assert dispatch.QUEUE.sweep().dispatched == 1
    return deliver(run_id)


def test_a_sync_backs_off_on_429_with_doubling_delays_then_completes(
    client, space, dify, settings, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    source_id = sync.make_source(client, space)
    sync.import_selected(client, space, source_id, capture)
    settings.KNOWLEDGE_SOURCE_RETRY_BASE_SECONDS = 30
    settings.KNOWLEDGE_SOURCE_RETRY_MAX_SECONDS = 600
    dify.provider.change("pages", "p-lunch", b"# Lunch\n\nLunch is served from half past noon.\n")
    run = start(client, space, source_id, "sync", capture)
    dify.reset_observations()
    dify.fail_next(2, status=429, route=DATASOURCE)
    delays = []
    for expected in ("retry", "retry"):
        before = timezone.now()
        outcome = deliver(run["id"]) if not delays else redeliver(run["id"], capture)
        assert outcome == expected
        row = SourceRun.objects.get(id=run["id"])
        assert (row.state, row.error_code, row.task_id) == (
            "queued",
            "datasource_unavailable",
            None,
        )
        delays.append((row.retry_at - before).total_seconds())
    # the base, then doubled (the delivery's own time allowed for on a slow machine)
    assert 30 <= delays[0] < 45 and 60 <= delays[1] < 75, delays
    assert redeliver(run["id"], capture) == "completed"
    done = sync.run_of(client, space, source_id, run["id"])
    assert (done["execution_attempts"], done["error_code"]) == (3, None)
    assert (done["progress_completed"], done["progress_skipped"]) == (1, 3)
    # two refused listings, one that answered, and the changed page's content: 4 requests
    assert dify.count(DATASOURCE) == 4


def test_an_oversized_page_fails_alone_in_a_sync_and_the_others_update(
    client, space, dify, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    source_id = sync.make_source(client, space)
    sync.import_selected(client, space, source_id, capture)
    dify.provider.change("pages", "p-leave", b"# Leave\n\nEvery employee gets 30 days.\n")
    dify.provider.change("pages", "p-travel", b"# Travel\n\nThe mileage rate is fifty cents.\n")
    dify.provider.oversize.add("p-travel")  # now answers over 8 MiB
    run = start(client, space, source_id, "sync", capture)
    assert deliver(run["id"]) == "completed"
    done = sync.run_of(client, space, source_id, run["id"])
    assert (done["state"], done["error_code"]) == ("completed", None)
    assert (done["progress_completed"], done["progress_skipped"], done["progress_failed"]) == (
        1, 2, 1,
    )  # fmt: skip
    failed = SourceRunItem.objects.get(run_id=run["id"], state="failed")
    assert failed.error_code == "source_item_too_large" and "p-travel" in failed.provider_item_id
    travel = SourceItem.objects.get(provider_item_id__contains="p-travel")
    assert travel.state == "active" and Document.objects.get(id=travel.document_id).enabled


def test_a_revoked_connection_fails_a_crawl_preview_with_a_clear_code(
    client, space, dify, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    dify.provider.sites["https://example.test/a"] = Item("A", b"# A\n\nAlpha.\n")
    site = client.post(
        url(space, "sources"),
        {"name": "Site", "kind": "website", "provider": "langgenius/firecrawl/firecrawl",
         "datasource": "crawl", "credential_id": "cred-kfs",
         "parameters": {"url": "https://example.test"}},
        format="json",
    ).json()["id"]  # fmt: skip
    dify.provider.valid = False
    preview = start(client, space, site, "crawl-preview", capture)
    assert deliver(preview["id"]) == "failed"
    failed = sync.run_of(client, space, site, preview["id"])
    assert failed["error_code"] == "source_credential_invalid"
    assert not SourceRunItem.objects.filter(run_id=preview["id"]).exists()
