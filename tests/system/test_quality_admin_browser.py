"""The quality screens in a real headless browser: an operator opens a space's quality page
from the failed-query list, reads the charts (inline SVG, no script), switches the window,
follows a replay run to its page and reads the evidence diff per question.

Chromium and Playwright as in tests/system/test_admin_browser.py (skip with the reason when
absent; under CI they fail instead)."""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from retrieval.models import FailedQuery, ReplayItem, ReplayRun
from tests.system.test_admin_browser import log_in, operator, page  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def quality_space(space):
    for n, (query, verdict) in enumerate(
        [("Where is the parking garage?", "coverage-gap"), ("where is parking garage", ""),
         ("Who signs contracts?", "retrieval-miss")]
    ):  # fmt: skip
        row = FailedQuery.objects.create(
            tenant_id=space.tenant_id, space=space, trace_id=uuid.uuid4(),
            trigger="not-enough-evidence", requester_kind="operator",
            requester="operator:tenant-a", query=query, verdict=verdict,
            query_sha256=hashlib.sha256(query.encode()).hexdigest(),
        )  # fmt: skip
        FailedQuery.objects.filter(id=row.id).update(created_at=timezone.now() - timedelta(days=n))
    run = ReplayRun.objects.create(
        tenant_id=space.tenant_id, space=space, requester_kind="operator",
        requester="operator:tenant-a", mode="fast", selection="all-active", state="failed",
        request_fingerprint="sha256:x", completed_at=timezone.now(),
        summary={"total": 2, "completed": 2, "passed": 1, "failed": 1},
    )  # fmt: skip
    diff = {"expected_count": 1, "matched_count": 0, "missing_count": 1, "retrieved": [
        {"filename": "leave.md"}], "evidence_items": [
        {"ordinal": 1, "matched": False, "text": "park on level two"}]}  # fmt: skip
    ReplayItem.objects.create(run=run, golden_question_id=uuid.uuid4(), ordinal=1,
                              question="Where do staff park?", state="failed",
                              result={"passed": False, "evidence_diff": diff})  # fmt: skip
    ReplayItem.objects.create(run=run, golden_question_id=uuid.uuid4(), ordinal=2,
                              question="How many leave days?", state="passed",
                              result={"passed": True, "evidence_diff": {
                                  "expected_count": 1, "matched_count": 1,
                                  "evidence_items": [{"matched": True}]}})  # fmt: skip
    space.run = run
    return space


def test_an_operator_reads_the_quality_charts_and_a_replay_run(
    page,  # noqa: F811
    live_server,
    operator,  # noqa: F811
    quality_space,
):
    log_in(page, live_server)
    page.goto(f"{live_server.url}/admin/retrieval/failedquery/")
    page.locator("#result_list a", has_text="charts").first.click()
    page.wait_for_url(f"**/admin/retrieval/failedquery/space/{quality_space.id}/")
    assert page.locator("#kfs-pass-rate").inner_text() == "50.0%"
    charts = page.locator("#kfs-quality svg.kfs-chart")
    assert charts.count() == 3
    assert page.locator('svg[aria-label="Replay pass rate over time"] circle').count() == 1
    bars = page.locator('svg[aria-label="Failed queries per day by verdict"] rect.kfs-bar')
    assert bars.count() == 3
    box = charts.first.bounding_box()
    assert box and box["width"] > 300 and box["height"] > 100  # drawn, not an empty box
    clusters = page.locator('svg[aria-label="Top unanswered clusters"] rect.kfs-cluster')
    assert clusters.count() == 2
    labels = page.locator('svg[aria-label="Top unanswered clusters"]').text_content()
    assert "parking garage?2" in labels  # the cluster of two paraphrases, then its count
    page.click("text=24h")
    page.wait_for_url("**?window=24h")
    assert page.locator("#kfs-failed").inner_text() == "1"
    page.click(f"#kfs-runs a:has-text('{quality_space.run.id}')")
    page.wait_for_url(f"**/admin/retrieval/replayrun/{quality_space.run.id}/change/")
    failed_row = page.locator("#kfs-evidence-diff tr.kfs-failed")
    assert failed_row.count() == 1
    assert "park on level two" in failed_row.inner_text()
    assert "leave.md" in failed_row.inner_text()
    assert page.locator("#kfs-evidence-diff tr.kfs-passed").count() == 1
