"""Triage, clusters, metrics, annotation and promotion of failed queries (docs/quality.md), end
to end through the API on a real space: a question the space holds but the answer missed
(``retrieval-miss``, promoted to a golden question that a replay runs), one on the space's topic
it does not hold (``coverage-gap``, never a golden question) and one from elsewhere."""

from __future__ import annotations

import pytest

from ingestion.documents import admit_document
from ingestion.models import KnowledgeNode
from knowledgefs.testing.fixtures import compile_all
from retrieval.models import FailedQuery, GoldenQuestion, TriageRun
from retrieval.quality import capture, triage_dispatch, triage_runs
from retrieval.quality.triage import cluster_key

pytestmark = pytest.mark.django_db

LEAVE = (
    "# Leave policy\n\nEvery employee gets 25 days of annual leave per year. Unused leave days "
    "expire at the end of March."
)


@pytest.fixture
def corpus(space):
    admit_document(space, filename="leave-policy.md", data=LEAVE.encode(), enqueue=False)
    compile_all()
    return space


@pytest.fixture
def queued(client, django_capture_on_commit_callbacks):
    """``queued(space, body, key=None)``: ``POST …/triage`` with its on-commit dispatch run."""

    def post(space, body, key=None):
        headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
        with django_capture_on_commit_callbacks(execute=True):
            return client.post(url(space, "triage"), body, format="json", **headers)

    return post


@pytest.fixture
def triage(client, queued):
    """``triage(space, body, key=None)``: 202 with the run queued and claimed, one delivery,
    then the polled run."""

    def run(space, body, key=None) -> dict:
        response = queued(space, body, key)
        assert response.status_code == 202, response.content
        assert response.json()["state"] == "queued"
        assert deliver(response.json()["id"]) == "finished"
        polled = client.get(url(space, "triage-runs", response.json()["id"]))
        assert polled.status_code == 200, polled.content
        return polled.json()

    return run


def failed(space, query: str, n: int) -> FailedQuery:
    """A captured failed query (as the capture writes it after a trace commits)."""
    import hashlib
    import uuid

    return capture.store(
        {"tenant_id": space.tenant_id, "space_id": space.id, "trace_id": uuid.uuid4(),
         "trigger": "low-confidence", "requester_kind": "api_key", "requester": "key:x",
         "query": query, "query_sha256": hashlib.sha256(query.encode()).hexdigest()}
    )  # fmt: skip


def url(space, *parts) -> str:
    return "/".join([f"/v1/knowledge-spaces/{space.id}/failed-queries", *parts])


def deliver(run_id) -> str:
    """What the worker does with the published message: the run's current claim."""
    run = TriageRun.objects.get(id=run_id)
    assert run.task_id, "the run was not claimed before its message was published"
    return triage_runs.run_delivery(str(run.id), run.task_id)


def test_triage_labels_then_annotation_promotes_a_miss_and_records_a_gap(corpus, client, triage):
    miss = failed(corpus, "When do unused annual leave days expire?", 1)
    gap = failed(corpus, "How is parental leave paid?", 2)
    elsewhere = failed(corpus, "Which volcano erupted in Iceland?", 3)
    unknown = failed(corpus, "", 4)
    result = triage(corpus, {"limit": 10})
    assert result["state"] == "succeeded" and result["summary"]["triaged"] == 4
    rows = {r.id: r for r in FailedQuery.objects.all()}
    assert (rows[miss.id].verdict, rows[miss.id].status) == ("retrieval-miss", "pending-annotation")
    assert (rows[gap.id].verdict, rows[gap.id].status) == ("coverage-gap", "pending-annotation")
    assert (rows[elsewhere.id].verdict, rows[elsewhere.id].status) == ("irrelevant", "dismissed")
    assert (rows[unknown.id].verdict, rows[unknown.id].status) == ("uncertain", "triaged")
    assert rows[miss.id].triage_signals["keyword_coverage"] >= 0.6
    again = triage(corpus, {})
    assert again["summary"]["triaged"] == 0  # nothing pending any more
    # annotation: the miss becomes a golden question with its expected evidence
    node = KnowledgeNode.objects.get(space=corpus)
    stale = client.patch(url(corpus, str(miss.id)), {"expected_revision": 1,
                         "verdict": "retrieval-miss", "expected_evidence_ids": [str(node.id)]},
                         format="json")  # fmt: skip
    assert stale.status_code == 409 and stale.json()["code"] == "revision_conflict"
    promoted = client.patch(url(corpus, str(miss.id)), {"expected_revision": 2,
                            "verdict": "retrieval-miss", "expected_evidence_ids": [str(node.id)],
                            "note": "the policy says March"}, format="json")  # fmt: skip
    assert promoted.status_code == 200, promoted.content
    assert promoted.json()["status"] == "promoted"
    question = GoldenQuestion.objects.get(id=promoted.json()["golden_question_id"])
    assert question.question == miss.query and question.status == "active"
    assert question.expected_evidence[0]["document_id"] == str(node.document_id)
    assert question.metadata["failed_query_id"] == str(miss.id)
    # the gap is recorded as a gap, never a golden question
    annotated = client.patch(url(corpus, str(gap.id)), {"expected_revision": 2,
                             "verdict": "coverage-gap"}, format="json")  # fmt: skip
    assert annotated.json()["status"] == "annotated"
    assert annotated.json()["golden_question_id"] is None
    assert GoldenQuestion.objects.count() == 1
    closed = client.patch(url(corpus, str(gap.id)), {"expected_revision": 3,
                          "verdict": "irrelevant"}, format="json")  # fmt: skip
    assert closed.status_code == 409 and closed.json()["code"] == "failed_query_closed"
    metrics = client.get(url(corpus, "metrics")).json()
    assert metrics["total"] == 4 and metrics["promotion_rate"] == 0.25
    assert metrics["by_status"]["promoted"] == 1


def test_paraphrases_cluster_together_largest_first(corpus, client):
    for n, query in enumerate(["Leave days expire when?", "When do leave days expire?",
                               "when do leave day expire", "Who approves hotels?"]):  # fmt: skip
        failed(corpus, query, n)
    body = client.get(url(corpus, "clusters")).json()["clusters"]
    assert [c["count"] for c in body] == [3, 1]
    assert cluster_key("Leave days expire when?") == cluster_key("when do leave day expire")
    assert client.get(url(corpus, "clusters") + "?limit=1001").json()["code"] == "invalid_limit"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"verdict": "retrieval-miss"}, "invalid_revision"),
        ({"expected_revision": 1, "verdict": "maybe"}, "invalid_verdict"),
        ({"expected_revision": 1, "verdict": "retrieval-miss"}, "invalid_expected_evidence"),
        ({"expected_revision": 1, "verdict": "retrieval-miss",
          "expected_evidence_ids": ["x"] * 101}, "invalid_expected_evidence"),
        ({"expected_revision": 1, "verdict": "coverage-gap", "note": "n" * 2001}, "invalid_note"),
    ],
)  # fmt: skip
def test_bad_annotations_are_400(corpus, client, body, code):
    row = failed(corpus, "When do unused annual leave days expire?", 1)
    response = client.patch(url(corpus, str(row.id)), body, format="json")
    assert (response.status_code, response.json()["code"]) == (400, code), response.content
    assert FailedQuery.objects.get(id=row.id).revision == 1


def test_a_triage_run_twice_labels_each_row_once(corpus, queued, triage):
    rows = [failed(corpus, "When do unused annual leave days expire?", 1),
            failed(corpus, "How is parental leave paid?", 2)]  # fmt: skip
    first = queued(corpus, {}).json()
    run = TriageRun.objects.get(id=first["id"])
    task_id = run.task_id
    assert deliver(run.id) == "finished"
    after = {r.id: (r.revision, r.verdict, r.updated_at) for r in FailedQuery.objects.all()}
    assert [after[r.id][0] for r in rows] == [2, 2]
    # the same message delivered again changes nothing (the run is no longer queued) ...
    assert triage_runs.run_delivery(str(run.id), task_id) == "skipped"
    # ... and a second run finds nothing pending: each row was labelled once
    second = triage(corpus, {})
    assert second["summary"] == {"triaged": 0, "verdicts": dict.fromkeys(
        ("retrieval-miss", "coverage-gap", "irrelevant", "uncertain"), 0)}  # fmt: skip
    assert {r.id: (r.revision, r.verdict, r.updated_at) for r in FailedQuery.objects.all()} == after
    assert TriageRun.objects.get(id=run.id).summary["triaged"] == 2


def test_the_sweep_requeues_an_expired_lease_and_the_run_resumes(
    corpus, queued, django_capture_on_commit_callbacks
):
    from datetime import timedelta

    from django.utils import timezone

    first = failed(corpus, "When do unused annual leave days expire?", 1)
    second = failed(corpus, "How is parental leave paid?", 2)
    run_id = queued(corpus, {}).json()["id"]
    row = TriageRun.objects.get(id=run_id)
    assert triage_dispatch.QUEUE.begin(run_id, row.task_id) is not None  # a worker started it ...
    FailedQuery.objects.filter(id=first.id).update(
        status="triaged", verdict="uncertain", triage_signals={"marker": "kept"}, revision=2
    )  # ... labelled the first row, and was killed
    TriageRun.objects.filter(id=run_id).update(step_started_at=timezone.now() - timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        report = triage_dispatch.QUEUE.sweep()
    assert report.stale_requeued == 1 and report.dispatched == 1
    assert TriageRun.objects.get(id=run_id).state == "queued"
    assert deliver(run_id) == "finished"
    done = TriageRun.objects.get(id=run_id)
    assert done.state == "succeeded" and done.attempt_count == 2
    assert done.summary["triaged"] == 1  # only the row still pending
    assert FailedQuery.objects.get(id=first.id).triage_signals == {"marker": "kept"}
    moved = FailedQuery.objects.get(id=second.id)
    assert (moved.verdict, moved.status, moved.revision) == (
        "coverage-gap",
        "pending-annotation",
        2,
    )


def test_triage_idempotency_key_and_bad_requests(corpus, client, queued, triage):
    failed(corpus, "When do unused annual leave days expire?", 1)
    one = triage(corpus, {"limit": 5}, key="triage-key-1")
    same = queued(corpus, {"limit": 5}, key="triage-key-1")
    other = queued(corpus, {"limit": 6}, key="triage-key-1")
    assert same.status_code == 202 and same.json()["id"] == one["id"]
    assert (other.status_code, other.json()["code"]) == (409, "idempotency_key_reused")
    for body, code in (({"limit": 1001}, "invalid_limit"), ({"limit": 0}, "invalid_limit"),
                       ({"size": 3}, "invalid_request")):  # fmt: skip
        response = queued(corpus, body)
        assert (response.status_code, response.json()["code"]) == (400, code), response.content
    assert TriageRun.objects.count() == 1
    missing = client.get(url(corpus, "triage-runs", "not-a-run"))
    assert (missing.status_code, missing.json()["code"]) == (404, "triage_run_not_found")


@pytest.mark.django_db(transaction=True)  # the run is dispatched at its commit, as in production
def test_the_published_triage_task_runs_the_run(corpus, client, monkeypatch):
    from django_q.conf import Conf

    monkeypatch.setattr(Conf, "SYNC", True)  # the published message runs in this process
    row = failed(corpus, "When do unused annual leave days expire?", 1)
    response = client.post(url(corpus, "triage"), {"limit": 5}, format="json")
    assert response.status_code == 202, response.content
    polled = client.get(url(corpus, "triage-runs", response.json()["id"])).json()
    assert polled["state"] == "succeeded" and polled["attempt_count"] == 1, polled
    assert polled["summary"]["verdicts"]["retrieval-miss"] == 1
    assert FailedQuery.objects.get(id=row.id).status == "pending-annotation"


def test_triage_runs_are_listed_newest_first_and_filtered_by_state(corpus, client, queued, triage):
    failed(corpus, "When do unused annual leave days expire?", 1)
    done = triage(corpus, {"limit": 5})
    waiting = queued(corpus, {"limit": 7}).json()
    listed = client.get(url(corpus, "triage-runs"))
    assert listed.status_code == 200, listed.content
    assert [r["id"] for r in listed.json()["results"]] == [waiting["id"], done["id"]]
    assert listed.json()["results"][1]["summary"]["triaged"] == 1
    only = client.get(url(corpus, "triage-runs") + "?state=succeeded").json()["results"]
    assert [r["id"] for r in only] == [done["id"]]
    paged = client.get(url(corpus, "triage-runs") + "?limit=1").json()
    assert [r["id"] for r in paged["results"]] == [waiting["id"]] and paged["next"]
    second = client.get(paged["next"]).json()["results"]
    assert [r["id"] for r in second] == [done["id"]]
    for query, code in (("?state=done", "invalid_state"), ("?limit=0", "invalid_limit")):
        bad = client.get(url(corpus, "triage-runs") + query)
        assert (bad.status_code, bad.json()["code"]) == (400, code), bad.content


def test_cancel_is_compare_and_set_and_stops_the_delivery(corpus, client, queued, monkeypatch):
    rows = [failed(corpus, "When do unused annual leave days expire?", 1),
            failed(corpus, "How is parental leave paid?", 2)]  # fmt: skip
    created = queued(corpus, {}).json()
    assert (created["state"], created["revision"], created["attempt"]) == ("queued", 1, 1)
    cancel = url(corpus, "triage-runs", created["id"], "cancel")
    stale = client.post(cancel, {"expected_revision": 2}, format="json")
    assert (stale.status_code, stale.json()["code"]) == (409, "revision_conflict")
    assert stale.json()["details"]["current_revision"] == 1
    missing = client.post(cancel, {}, format="json")
    assert (missing.status_code, missing.json()["code"]) == (400, "invalid_revision")
    # the operator cancels while the worker labels the first row (the real verdict, then the
    # cancel from another connection's point of view: a committed state change)
    real = triage_runs.verdict_for
    responses = []

    def verdict_then_cancel(*args):
        if not responses:
            responses.append(client.post(cancel, {"expected_revision": 1}, format="json"))
        return real(*args)

    monkeypatch.setattr(triage_runs, "verdict_for", verdict_then_cancel)
    assert deliver(created["id"]) == "claim_lost"
    assert responses[0].status_code == 200, responses[0].content
    assert (responses[0].json()["state"], responses[0].json()["revision"]) == ("canceled", 2)
    # nothing labelled after the cancel, and the summary stays as it was
    assert [FailedQuery.objects.get(id=r.id).status for r in rows] == ["pending-triage"] * 2
    run = TriageRun.objects.get(id=created["id"])
    assert (run.state, run.summary["triaged"], run.task_id) == ("canceled", 0, None)
    again = client.post(cancel, {"expected_revision": 2}, format="json")
    assert (again.status_code, again.json()["code"]) == (409, "triage_run_finished")
    listed = client.get(url(corpus, "triage-runs") + "?state=canceled").json()["results"]
    assert [r["id"] for r in listed] == [created["id"]]


def test_a_retry_labels_the_rows_still_pending(corpus, queued, django_capture_on_commit_callbacks):
    first = failed(corpus, "When do unused annual leave days expire?", 1)
    created = queued(corpus, {}).json()
    run = TriageRun.objects.get(id=created["id"])
    triage_runs.cancel_run(run, {"expected_revision": 1})
    with pytest.raises(Exception, match="revision"):
        triage_runs.retry_run(None, run, {"expected_revision": 1})
    with django_capture_on_commit_callbacks(execute=True):
        retried = triage_runs.retry_run(None, run, {"expected_revision": 2})
    assert (retried.state, retried.attempt, retried.revision) == ("queued", 2, 3)
    assert deliver(run.id) == "finished"
    done = TriageRun.objects.get(id=run.id)
    assert (done.state, done.summary["triaged"]) == ("succeeded", 1)
    assert FailedQuery.objects.get(id=first.id).status == "pending-annotation"


def test_triage_runs_of_another_tenant_or_scope_are_404(corpus, client, queued):
    from rest_framework.test import APIClient

    from spaces.api_keys import create_api_key

    run = queued(corpus, {}).json()
    for tenant, spaces in (("tenant-b", None), ("tenant-a", [corpus])):
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key(tenant, spaces=spaces)[1]}")
        for method, path, body in (
            ("get", url(corpus, "triage-runs", run["id"]), None),
            ("post", url(corpus, "triage-runs", run["id"], "cancel"), {"expected_revision": 1}),
        ):
            response = getattr(api, method)(path, body, format="json")
            assert response.status_code == 404, (tenant, path, response.content)
        listed = api.get(url(corpus, "triage-runs"))
        assert listed.status_code == 404 or listed.json()["results"] == [], listed.content
    assert TriageRun.objects.get(id=run["id"]).state == "queued"


def test_the_admin_lists_cancels_and_retries_triage_runs(
    corpus, queued, admin_client, django_capture_on_commit_callbacks
):
    failed(corpus, "When do unused annual leave days expire?", 1)
    run_id = queued(corpus, {}).json()["id"]
    changelist = "/admin/retrieval/triagerun/"
    page = admin_client.get(changelist)
    assert page.status_code == 200 and run_id in page.content.decode()
    action = {"action": "cancel_runs", "_selected_action": [run_id]}
    assert admin_client.post(changelist, action).status_code == 302
    assert TriageRun.objects.get(id=run_id).state == "canceled"
    refused = admin_client.post(changelist, action, follow=True)
    assert "already ended canceled" in refused.content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(changelist, {"action": "retry_runs", "_selected_action": [run_id]})
    run = TriageRun.objects.get(id=run_id)
    assert (run.state, run.attempt) == ("queued", 2) and run.task_id
    assert deliver(run_id) == "finished"
    detail = admin_client.get(f"{changelist}{run_id}/change/")
    assert detail.status_code == 200 and "succeeded" in detail.content.decode()
