"""Unchanged source items cost no embedding, counted on the simulated Dify: the space's
embedding model is served by Dify's model runtime, and every text the server embeds as a
document is recorded (docs/datasources.md, "Change detection")."""

from __future__ import annotations

import pytest

from ingestion.models import Document
from ingestion.tests import test_sources_sync as sync
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_datasource import WORKSPACE
from knowledgefs.testing.fixtures import compile_all

pytestmark = pytest.mark.django_db

dify_server = dify_fixtures.dify_server
deliver, start, url = sync.deliver, sync.start, sync.url
EMBEDDER = {"plugin_id": "langgenius/openai", "provider": "openai",
            "model": "text-embedding-3-small"}  # fmt: skip


@pytest.fixture
def served(sync_dify, settings, client, space):
    """The space embeds through Dify's model runtime; the server records each document text."""
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    sync_dify.dimension = 48
    put = client.put(url(space, "embedding-profile"), EMBEDDER, format="json")
    assert put.status_code == 200, put.content
    ready = client.post(url(space, "profile-validation")).json()
    assert ready.get("readiness", {}).get("state") == "ready", ready
    embedded: list[str] = []

    def record(body):
        if body.get("input_type") == "document":
            embedded.extend(body["texts"])
        return None  # embed as usual

    sync_dify.embedding_responder = record
    return embedded


sync_dify = sync.dify


def test_a_sync_embeds_only_the_chunks_of_changed_pages(
    client, space, sync_dify, served, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    dify = sync_dify
    source_id = sync.make_source(client, space)
    pages = ("p-leave", "p-parking", "p-travel", "p-lunch")
    items = [{"page_id": p, "workspace_id": WORKSPACE} for p in pages]
    run = start(client, space, source_id, "imports", capture, {"items": items})
    assert deliver(run["id"]) == "completed"
    with capture(execute=True):
        compile_all()
    assert Document.objects.filter(space=space, state="published").count() == 4
    assert any("canteen" in t for t in served)  # the import embedded every page
    per_page = len(served) // 4
    assert per_page >= 1 and len(served) == 4 * per_page  # each small page: the same chunking

    served.clear()
    run = start(client, space, source_id, "sync", capture)
    assert deliver(run["id"]) == "completed"
    with capture(execute=True):
        compile_all()
    assert served == []  # nothing changed: not one text embedded
    assert sync.run_of(client, space, source_id, run["id"])["progress_skipped"] == 4

    dify.provider.change("pages", "p-leave", b"# Leave\n\nEvery employee gets 30 days of leave.\n")
    dify.provider.change("pages", "p-travel", b"# Travel\n\nThe mileage rate is fifty cents.\n")
    run = start(client, space, source_id, "sync", capture)
    assert deliver(run["id"]) == "completed"
    with capture(execute=True):
        compile_all()
    done = sync.run_of(client, space, source_id, run["id"])
    assert (done["progress_completed"], done["progress_skipped"]) == (2, 2)
    # only the chunks of the two changed pages were embedded: each of them, nothing else
    assert len(served) == 2 * per_page, served
    assert all(("30 days" in t) or ("fifty cents" in t) for t in served), served
    assert any("30 days" in t for t in served) and any("fifty cents" in t for t in served)
    assert not any(w in t for t in served for w in ("canteen", "garage", "forty"))
