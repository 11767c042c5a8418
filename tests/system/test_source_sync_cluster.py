"""A source sync on a real ``manage.py qcluster`` survives ``kill -9`` of the whole cluster
mid-run: the sweep (played by this process, as its schedule would) puts the run back, a new
cluster resumes it from its checkpoint, and the items finished before the kill are neither read
again nor revised twice; no document is duplicated.

The simulated Dify runs in this process (the clusters reach it on loopback) and answers every
datasource request after a delay, so each item takes a while and the kill lands between
items."""

from __future__ import annotations

import time

import pytest

from ingestion.models import Document, DocumentRevision
from ingestion.sources import dispatch, runner, runs
from ingestion.sources.models import Source, SourceRun, SourceRunItem
from knowledgefs.testing.dify_contract import DATASOURCE, TEST_INNER_KEY
from knowledgefs.testing.dify_datasource import WORKSPACE, Item
from knowledgefs.testing.dify_server import DifyTestServer
from knowledgefs.testing.qcluster_process import QClusterProcess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

PAGES = 12
STALE = 5  # the smallest stale time the settings accept


@pytest.fixture
def dify(settings, tenant):
    server = DifyTestServer().start()
    settings.DIFY_INNER_API_URL = server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    settings.KNOWLEDGE_SOURCE_RUN_STALE_SECONDS = STALE
    server.provider.credentials = {"cred-kfs": tenant}
    for n in range(PAGES):
        server.provider.pages[f"p-{n:02d}"] = Item(
            f"Page {n}", f"# Page {n}\n\nThe tide table number {n * 7} is kept here.\n".encode()
        )
    yield server
    server.stop()


def _wait(condition, seconds: float, sweep: bool = False):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if sweep:
            dispatch.QUEUE.sweep()
        time.sleep(0.2)
    return None


def test_a_killed_sync_resumes_from_its_checkpoint_without_duplicates(
    space, object_storage, tmp_path, dify
):
    source = Source.objects.create(
        tenant_id=space.tenant_id, space=space, name="Wiki", kind="online_document",
        provider="langgenius/notion_datasource/notion", datasource="notion",
        credential_id="cred-kfs",
    )  # fmt: skip
    items = [{"page_id": p, "workspace_id": WORKSPACE} for p in sorted(dify.provider.pages)]
    imported = runs.start_import(source, {"items": items})
    imported.refresh_from_db()
    assert runner.run_delivery(str(imported.id), imported.task_id) == "completed"
    assert Document.objects.filter(space=space).count() == PAGES
    for n in range(PAGES):
        dify.provider.change("pages", f"p-{n:02d}", f"# Page {n}\n\nRevised table {n}.\n".encode())
    dify.provider.item_calls.clear()
    dify.delay(0.7, route=DATASOURCE, times=None)
    env = {
        "DIFY_INNER_API_URL": dify.url,
        "DIFY_INNER_API_KEY": TEST_INNER_KEY,
        "KNOWLEDGE_SOURCE_RUN_STALE_SECONDS": str(STALE),
        "KFS_TEST_WORKERS": "1",
    }
    log = tmp_path / "qcluster.log"
    first = QClusterProcess(object_storage, log, **env).start()
    try:
        run = runs.start_sync(source)
        done_before = _wait(
            lambda: (
                (n := SourceRunItem.objects.filter(run=run).exclude(state="pending").count()) >= 3
                and n
            ),
            120,
        )
        assert done_before, f"the cluster finished no items: {log.read_text()[-2000:]}"
    finally:
        first.kill()
    finished = set(
        SourceRunItem.objects.filter(run=run).exclude(state="pending")
        .values_list("provider_item_id", flat=True)
    )  # fmt: skip
    assert 3 <= len(finished) < PAGES, finished
    assert SourceRun.objects.get(id=run.id).state == "running"
    second = QClusterProcess(object_storage, log, **env).start()
    try:
        ended = _wait(
            lambda: SourceRun.objects.get(id=run.id).state in ("completed", "failed"), 180,
            sweep=True,
        )  # fmt: skip
    finally:
        second.kill()
    assert ended, f"the run did not end: {log.read_text()[-2000:]}"
    run.refresh_from_db()
    assert (run.state, run.error_code, run.attempt_count) == ("completed", "", 2)
    assert (run.progress_total, run.progress_completed, run.progress_failed) == (PAGES, PAGES, 0)
    assert Document.objects.filter(space=space).count() == PAGES  # no duplicate documents
    # one candidate revision per page: an item finished before the kill was not revised again
    revisions = [DocumentRevision.objects.filter(document=d).count()
                 for d in Document.objects.filter(space=space)]  # fmt: skip
    assert revisions == [2] * PAGES, revisions
    reads = dify.provider.item_calls
    for provider_id in finished:
        page_id = provider_id.split('"')[-2]
        assert reads[("get_online_document_page_content", page_id)] == 1, page_id
    # at most the one item in flight at the kill was read twice
    assert PAGES <= sum(reads.values()) <= PAGES + 1
