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
    assert triage_dispatch.begin(run_id, row.task_id) is not None  # a worker started it ...
    FailedQuery.objects.filter(id=first.id).update(
        status="triaged", verdict="uncertain", triage_signals={"marker": "kept"}, revision=2
    )  # ... labelled the first row, and was killed
    TriageRun.objects.filter(id=run_id).update(step_started_at=timezone.now() - timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        report = triage_dispatch.sweep()
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
