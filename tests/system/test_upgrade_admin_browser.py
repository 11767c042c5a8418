"""The upgrade admin in a real headless browser: an operator finds a failed upgrade, reads its
documents' checkpoints and retries it (same browser set-up and skip rules as
tests/system/test_admin_browser.py)."""

from __future__ import annotations

import re

import pytest

from knowledgefs.testing.upgrade_support import (
    INNER_KEY,
    deliver_all,
    inner,
    legacy_file,
    snapshot_body,
)
from tests.system.test_admin_browser import apply_filter, log_in, operator, page  # noqa: F401
from upgrades.models import UpgradeDocument, UpgradeJob

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_reads_a_failed_upgrade_and_retries_it(
    page,  # noqa: F811
    live_server,
    operator,  # noqa: F811
    settings,
):
    settings.DIFY_INNER_API_KEY = INNER_KEY
    docs = [
        legacy_file("ok.txt", b"Leave is 25 days.\n", doc_id="ok"),
        legacy_file("gone.txt", None, doc_id="gone"),
    ]
    created = inner().post(
        "/internal/dataset-upgrades", snapshot_body(docs, dataset_id="ds-browser"), format="json"
    )
    assert created.status_code == 201, created.content
    deliver_all()
    job = UpgradeJob.objects.get(dataset_id="ds-browser")
    assert job.last_error_code == "documents_failed"

    log_in(page, live_server)
    page.goto(f"{live_server.url}/admin/upgrades/upgradejob/")
    apply_filter(page, "status", "Failed")
    assert "status__exact=failed" in page.url
    listed = page.locator("#result_list tbody tr").filter(has_text="ds-browser")
    assert listed.count() == 1
    assert "documents_failed" in listed.inner_text() and "1/1/2" in listed.inner_text()

    listed.locator("th a").first.click()
    page.wait_for_url(re.compile(f"/upgradejob/{job.id}/change/"))
    documents = page.locator("#documents-group").inner_text()
    assert "legacy_file_missing" in documents and "gone.txt" in documents
    assert "uf-" in page.locator("#file_leases-group").inner_text()

    page.goto(f"{live_server.url}/admin/upgrades/upgradejob/")
    page.locator("#result_list tbody tr").filter(has_text="ds-browser").locator(
        "input.action-select"
    ).check()
    page.select_option("#changelist-form select[name=action]", "retry_failed_upgrades")
    page.click('#changelist-form button[name="index"]')
    page.wait_for_load_state()
    assert "Queued 1 upgrade again." in page.locator("ul.messagelist li.success").inner_text()
    assert UpgradeJob.objects.get(id=job.id).status == "queued"
    assert UpgradeDocument.objects.get(job=job, legacy_document_id="gone").status == "pending"
