"""Crawl previews as durable runs with a frozen selection (docs/datasources.md, "Crawl
preview"), on the simulated Dify: the preview lists pages (URL, title, SHA-256, size) without
keeping content, pages through them, and an import takes exactly a selection of its URLs."""

from __future__ import annotations

import hashlib

import pytest

from ingestion.models import Document
from ingestion.sources.models import SourceItem, SourceRun, SourceRunItem
from ingestion.tests import test_sources_sync as sync
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_datasource import Item

pytestmark = pytest.mark.django_db

dify_server = dify_fixtures.dify_server
dify = sync.dify
deliver, run_of, start, url = sync.deliver, sync.run_of, sync.start, sync.url
SITE = "https://docs.example.test"


def make_site(client, space) -> str:
    response = client.post(
        url(space, "sources"),
        {"name": "Docs", "kind": "website", "provider": "langgenius/firecrawl/firecrawl",
         "datasource": "crawl", "credential_id": "cred-kfs", "parameters": {"url": SITE}},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    return response.json()["id"]


def page(n: int) -> bytes:
    return f"# Page {n}\n\nTopic number {n} of the handbook.\n".encode()


def test_a_crawl_preview_is_a_durable_run_and_an_import_takes_its_frozen_selection(
    client, space, dify, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    provider = dify.provider
    for n in range(5):
        provider.sites[f"{SITE}/p{n}"] = Item(f"Page {n}", page(n))
    site = make_site(client, space)
    # the synchronous listing is for online documents only
    listed = client.get(url(space, "sources", site, "pages"))
    assert listed.status_code == 400 and listed.json()["code"] == "source_kind_mismatch"

    preview = start(client, space, site, "crawl-preview", capture, key="preview-1")
    assert (preview["kind"], preview["state"]) == ("crawl-preview", "queued")
    again = start(client, space, site, "crawl-preview", capture, key="preview-1")
    assert again["id"] == preview["id"]  # the Idempotency-Key replays the first answer
    busy = client.post(url(space, "sources", site, "crawl-preview"), {}, format="json")
    assert busy.status_code == 409 and busy.json()["code"] == "source_run_active"
    assert deliver(preview["id"]) == "completed"

    first = client.get(url(space, "sources", site, "runs", preview["id"]), {"limit": 2}).json()
    assert (first["state"], first["progress_total"], first["total"]) == ("completed", 5, 5)
    assert first["pages"][0] == {
        "source_url": f"{SITE}/p0", "title": "Page 0",
        "sha256": hashlib.sha256(page(0)).hexdigest(), "size": len(page(0)),
    }  # fmt: skip
    second = client.get(
        url(space, "sources", site, "runs", preview["id"]),
        {"limit": 2, "cursor": first["next_cursor"]},
    ).json()
    last = client.get(
        url(space, "sources", site, "runs", preview["id"]),
        {"limit": 2, "cursor": second["next_cursor"]},
    ).json()
    urls = [p["source_url"] for p in first["pages"] + second["pages"] + last["pages"]]
    assert urls == [f"{SITE}/p{n}" for n in range(5)] and last["next_cursor"] is None
    # nothing of the content is kept, and nothing was imported
    kept = SourceRunItem.objects.filter(run_id=preview["id"])
    assert all("content" not in r.payload for r in kept) and not Document.objects.exists()

    # a selection naming URLs the preview never listed is refused, naming them
    other = f"{SITE}/never-listed"
    refused = client.post(
        url(space, "sources", site, "imports"),
        {"preview_run_id": preview["id"], "urls": [f"{SITE}/p1", other]},
        format="json",
    )
    assert refused.status_code == 400
    assert refused.json()["code"] == "source_selection_not_in_preview"
    assert refused.json()["details"]["urls"] == [other] and other in refused.json()["message"]
    too_many = client.post(
        url(space, "sources", site, "imports"),
        {"preview_run_id": preview["id"], "urls": [f"{SITE}/p{n}" for n in range(201)]},
        format="json",
    )
    assert too_many.status_code == 400 and too_many.json()["code"] == "too_many_items"
    assert "200" in too_many.json()["message"]
    bare = client.post(
        url(space, "sources", site, "imports"),
        {"items": [{"source_url": f"{SITE}/p1"}]},
        format="json",
    )
    assert bare.status_code == 400 and bare.json()["code"] == "crawl_preview_required"

    # a page added at the site after the preview is not part of the frozen selection
    provider.sites[f"{SITE}/p9"] = Item("Page 9", page(9))
    run = start(client, space, site, "imports", capture,
                {"preview_run_id": preview["id"], "urls": [f"{SITE}/p1", f"{SITE}/p3"]},
                key="import-1")  # fmt: skip
    assert (run["kind"], run["progress_total"]) == ("crawl-import", 2)
    assert deliver(run["id"]) == "completed"
    done = run_of(client, space, site, run["id"])
    assert (done["progress_completed"], done["progress_failed"]) == (2, 0)
    assert sorted(i.provider_item_id for i in SourceItem.objects.filter(source_id=site)) == [
        f"{SITE}/p1", f"{SITE}/p3",
    ]  # fmt: skip
    assert Document.objects.filter(space=space).count() == 2
    assert SourceRun.objects.filter(source_id=site, kind="crawl-preview").count() == 1


def test_a_selection_needs_a_completed_preview_of_this_source(
    client, space, dify, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    dify.provider.sites[f"{SITE}/a"] = Item("A", page(1))
    site = make_site(client, space)
    preview = start(client, space, site, "crawl-preview", capture)
    early = client.post(
        url(space, "sources", site, "imports"),
        {"preview_run_id": preview["id"], "urls": [f"{SITE}/a"]},
        format="json",
    )
    assert early.status_code == 409 and early.json()["code"] == "source_preview_not_completed"
    assert deliver(preview["id"]) == "completed"
    other_site = make_site(client, space)
    foreign = client.post(
        url(space, "sources", other_site, "imports"),
        {"preview_run_id": preview["id"], "urls": [f"{SITE}/a"]},
        format="json",
    )
    assert foreign.status_code == 404 and foreign.json()["code"] == "source_run_not_found"
    wiki = sync.make_source(client, space)
    wrong = client.post(url(space, "sources", wiki, "crawl-preview"), {}, format="json")
    assert wrong.status_code == 400 and wrong.json()["code"] == "source_kind_mismatch"
