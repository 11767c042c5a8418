"""Triage, clusters, metrics, annotation and promotion of failed queries (docs/quality.md), end
to end through the API on a real space: a question the space holds but the answer missed
(``retrieval-miss``, promoted to a golden question that a replay runs), one on the space's topic
it does not hold (``coverage-gap``, never a golden question) and one from elsewhere."""

from __future__ import annotations

import pytest

from ingestion.documents import admit_document
from ingestion.models import KnowledgeNode
from knowledgefs.testing.fixtures import compile_all
from retrieval.models import FailedQuery, GoldenQuestion
from retrieval.quality import capture
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


def test_triage_labels_then_annotation_promotes_a_miss_and_records_a_gap(corpus, client):
    miss = failed(corpus, "When do unused annual leave days expire?", 1)
    gap = failed(corpus, "How is parental leave paid?", 2)
    elsewhere = failed(corpus, "Which volcano erupted in Iceland?", 3)
    unknown = failed(corpus, "", 4)
    result = client.post(url(corpus, "triage"), {"limit": 10}, format="json").json()
    assert result["triaged"] == 4
    rows = {r.id: r for r in FailedQuery.objects.all()}
    assert (rows[miss.id].verdict, rows[miss.id].status) == ("retrieval-miss", "pending-annotation")
    assert (rows[gap.id].verdict, rows[gap.id].status) == ("coverage-gap", "pending-annotation")
    assert (rows[elsewhere.id].verdict, rows[elsewhere.id].status) == ("irrelevant", "dismissed")
    assert (rows[unknown.id].verdict, rows[unknown.id].status) == ("uncertain", "triaged")
    assert rows[miss.id].triage_signals["keyword_coverage"] >= 0.6
    again = client.post(url(corpus, "triage"), {}, format="json").json()
    assert again["triaged"] == 0  # nothing pending any more
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
