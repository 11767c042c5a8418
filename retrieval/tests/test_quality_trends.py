"""Quality trends (docs/quality.md): the current window against the one before, slices, top
unanswered clusters, daily series; the admin's quality page draws them as inline SVG."""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from retrieval.models import BadCase, FailedQuery, ReplayRun

pytestmark = pytest.mark.django_db


def run(space, *, passed: int, total: int, days_ago: float, mode: str = "fast") -> ReplayRun:
    done = timezone.now() - timedelta(days=days_ago)
    row = ReplayRun.objects.create(
        tenant_id=space.tenant_id, space=space, requester_kind="operator",
        requester="operator:tenant-a", mode=mode, selection="all-active",
        state="passed" if passed == total else "failed", request_fingerprint="sha256:x",
        frozen_snapshot={"embedding_model": "m", "retrieval_profile": {"revision": 3}},
        summary={"total": total, "completed": total, "passed": passed, "failed": total - passed},
    )  # fmt: skip
    ReplayRun.objects.filter(id=row.id).update(completed_at=done)
    return row


def failed(space, query: str, *, days_ago: float = 0, verdict: str = "") -> FailedQuery:
    row = FailedQuery.objects.create(
        tenant_id=space.tenant_id, space=space, trace_id=uuid.uuid4(),
        trigger="not-enough-evidence", requester_kind="operator",
        requester="operator:tenant-a", query=query, mode="fast", verdict=verdict,
        query_sha256=hashlib.sha256(query.encode()).hexdigest(),
    )  # fmt: skip
    FailedQuery.objects.filter(id=row.id).update(
        created_at=timezone.now() - timedelta(days=days_ago)
    )
    return row


@pytest.fixture
def history(space):
    run(space, passed=1, total=4, days_ago=9)  # baseline window of 7d
    run(space, passed=3, total=4, days_ago=2)
    run(space, passed=4, total=4, days_ago=0.1, mode="deep")
    failed(space, "Where is the parking garage?", days_ago=1, verdict="coverage-gap")
    failed(space, "where is parking garage", days_ago=0.2)
    failed(space, "Who signs contracts?", days_ago=0.1, verdict="retrieval-miss")
    failed(space, "Old question?", days_ago=10)
    BadCase.objects.create(tenant_id=space.tenant_id, space=space, trace_id=uuid.uuid4(),
                           requester_kind="operator", requester="operator:tenant-a",
                           reason="r", status="fixed")  # fmt: skip
    return space


def test_trends_compare_the_window_with_its_baseline(history, client):
    body = client.get(f"/v1/knowledge-spaces/{history.id}/quality/trends").json()
    assert body["window"] == "7d"
    assert body["current"]["pass_rate"] == 0.875 and body["baseline"]["pass_rate"] == 0.25
    assert body["current"]["total_replays"] == 2 and body["baseline"]["total_replays"] == 1
    assert body["current"]["failed_queries"] == 3 and body["baseline"]["failed_queries"] == 1
    assert body["current"]["bad_cases"] == {"open": 0, "replaying": 0, "fixed": 1,
                                            "dismissed": 0}  # fmt: skip
    assert {(s["mode"], s["replay_runs"]) for s in body["slices"]} == {("fast", 1), ("deep", 1)}
    assert body["top_unanswered"][0] == {"query": "where is parking garage", "count": 2}
    assert len(body["daily"]) == 7 and body["daily"][-1]["day"] == timezone.localdate().isoformat()
    deep_day = timezone.localtime(timezone.now() - timedelta(days=0.1)).date().isoformat()
    assert {d["day"]: d["pass_rate"] for d in body["daily"]}[deep_day] == 1.0
    day = client.get(f"/v1/knowledge-spaces/{history.id}/quality/trends?window=24h").json()
    assert day["current"]["total_replays"] == 1 and len(day["daily"]) == 1
    bad = client.get(f"/v1/knowledge-spaces/{history.id}/quality/trends?window=1y")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_window"


def test_the_admin_quality_page_draws_svg_charts(history, admin_client):
    page = admin_client.get(f"/admin/retrieval/failedquery/space/{history.id}/")
    assert page.status_code == 200
    html = page.content.decode()
    quality = html.split('id="kfs-quality"')[1]
    assert quality.count('class="kfs-chart"') == 3 and "<script" not in quality
    assert 'aria-label="Replay pass rate over time"' in html and "<polyline" in html
    assert html.count('class="kfs-bar"') == 3  # one bar per day and verdict
    assert "where is parking garage" in html
    assert 'id="kfs-pass-rate">87.5%' in html
