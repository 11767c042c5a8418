"""The quality loop end to end through the public API (docs/quality.md), on a space compiled from
a generated document with the real compiler and the local embedding model: failed answers are
captured, triaged by a run, annotated and promoted, replayed, the missing document is uploaded
and compiled, the replay runs again and the trends show the change. Runs are delivered the way
the triage and replay tests deliver them (this process plays the worker with its entry point)."""

from __future__ import annotations

import pytest

from knowledgefs.testing.fixtures import compile_all, upload
from retrieval.tests.test_quality_capture import ask
from retrieval.tests.test_quality_replay import PARKING, runs_url
from retrieval.tests.test_quality_replay import deliver as deliver_replay
from retrieval.tests.test_quality_triage import corpus, url  # noqa: F401 - corpus: a fixture
from retrieval.tests.test_quality_triage import deliver as deliver_triage

pytestmark = pytest.mark.django_db

MISSED = "When do unused annual leave days expire?"  # the space holds it, the answer did not help
GAP = "Which garage level do staff park on each year?"  # no parking document yet


def test_failed_answers_become_golden_questions_that_fail_then_pass_and_show_in_trends(
    corpus,  # noqa: F811 - the fixture imported above
    client,
    django_capture_on_commit_callbacks,
):
    capture = django_capture_on_commit_callbacks
    space = f"/v1/knowledge-spaces/{corpus.id}"

    # (1) capture: an answer without evidence, and a helpful: false on another answer
    gap_trace = ask(client, corpus, GAP, capture)
    missed_trace = ask(client, corpus, MISSED, capture)
    feedback = client.post(
        f"/v1/queries/{missed_trace}/feedback",
        {"helpful": False, "reason": "it does not say when", "query": MISSED},
        format="json",
    )
    assert feedback.status_code == 201, feedback.content
    listed = client.get(url(corpus) + "?status=pending-triage")
    assert listed.status_code == 200, listed.content
    rows = {(r["trace_id"], r["trigger"]): r for r in listed.json()["results"]}
    assert set(rows) == {(gap_trace, "not-enough-evidence"), (missed_trace, "user-feedback")}
    gap_row = rows[gap_trace, "not-enough-evidence"]
    missed_row = rows[missed_trace, "user-feedback"]
    assert (gap_row["query"], gap_row["answerability"]) == (GAP, "not-enough-evidence")
    assert (missed_row["query"], missed_row["reason"]) == (MISSED, "it does not say when")
    for row in (gap_row, missed_row):
        assert row["provenance"]["tenant_id"] == "tenant-a"
        assert row["provenance"]["requester_kind"] == "api_key"
        assert row["provenance"]["api_key_id"] and row["provenance"]["permission_scope"] is None
        assert (row["status"], row["verdict"], row["revision"]) == ("pending-triage", None, 1)

    # (2) triage: 202 with a queued run, one delivery, the run and the labels read back
    with capture(execute=True):
        started = client.post(url(corpus, "triage"), {"limit": 10}, format="json",
                              HTTP_IDEMPOTENCY_KEY="loop-triage-1")  # fmt: skip
    assert started.status_code == 202, started.content
    assert started.json()["state"] == "queued"
    assert deliver_triage(started.json()["id"]) == "finished"
    run = client.get(url(corpus, "triage-runs", started.json()["id"])).json()
    assert (run["state"], run["summary"]["triaged"]) == ("succeeded", 2)
    assert run["summary"]["verdicts"] == {"retrieval-miss": 1, "coverage-gap": 1,
                                          "irrelevant": 0, "uncertain": 0}  # fmt: skip
    labelled = {r["id"]: r for r in client.get(url(corpus)).json()["results"]}
    missed_row, gap_row = labelled[missed_row["id"]], labelled[gap_row["id"]]
    assert (missed_row["verdict"], missed_row["status"]) == ("retrieval-miss", "pending-annotation")
    assert missed_row["triage_signals"]["keyword_coverage"] >= 0.6
    assert (gap_row["verdict"], gap_row["status"]) == ("coverage-gap", "pending-annotation")
    assert gap_row["triage_signals"]["keyword_coverage"] <= 0.25

    # (3) annotation: the miss with the chunk that answers it (found through retrieval-tests)
    hits = client.post(f"{space}/retrieval-tests", {"query": "unused leave days expire"},
                       format="json").json()["items"]  # fmt: skip
    node_id = hits[0]["node_id"]
    assert "end of March" in hits[0]["text"]
    promoted = client.patch(url(corpus, missed_row["id"]), {
        "expected_revision": missed_row["revision"], "verdict": "retrieval-miss",
        "expected_evidence_ids": [node_id], "note": "the policy says March",
    }, format="json")  # fmt: skip
    assert promoted.status_code == 200, promoted.content
    assert (promoted.json()["status"], promoted.json()["revision"]) == ("promoted", 3)
    # the gap is recorded as a known gap (never a golden question itself)
    annotated = client.patch(url(corpus, gap_row["id"]), {
        "expected_revision": gap_row["revision"], "verdict": "coverage-gap",
    }, format="json")  # fmt: skip
    assert annotated.json()["status"] == "annotated", annotated.content
    assert annotated.json()["golden_question_id"] is None

    # (4) golden questions: the promoted one, and the gap's question with the evidence it needs
    golden = client.get(f"{space}/golden-questions/{promoted.json()['golden_question_id']}")
    assert golden.status_code == 200, golden.content
    assert (golden.json()["question"], golden.json()["status"]) == (MISSED, "active")
    assert "failed-query" in golden.json()["tags"]
    assert "expire at the end of March" in golden.json()["expected_evidence"][0]["text"]
    gap_question = client.post(f"{space}/golden-questions", {
        "question": GAP, "expected_evidence": [{"text": "park on level two"}],
        "metadata": {"failed_query_id": gap_row["id"]}}, format="json")  # fmt: skip
    assert gap_question.status_code == 201, gap_question.content

    # (5) a replay of all active questions fails for the gap's question
    with capture(execute=True):
        first = client.post(runs_url(corpus), {"selection": "all-active"}, format="json")
    assert first.status_code == 202, first.content
    assert deliver_replay(first.json()["id"]) == "finished"
    before = client.get(runs_url(corpus, first.json()["id"])).json()
    assert (before["state"], before["error"]) == ("failed", None)
    states = {i["question"]: i["state"] for i in before["items"]}
    assert states == {MISSED: "passed", GAP: "failed"}
    assert before["summary"]["pass_rate"] == 0.5
    trends_before = client.get(f"{space}/quality/trends?window=24h").json()

    # (6) the missing document is uploaded through the documents API and compiled
    uploaded = upload(client, corpus, "parking.md", PARKING.encode())
    assert uploaded.status_code == 202, uploaded.content
    assert uploaded.json()["document"]["state"] == "queued"
    assert compile_all() == 1  # the worker's code path
    document = client.get(f"{space}/documents/{uploaded.json()['document']['id']}").json()
    assert document["state"] == "published", document

    # (7) the replay re-run on a fresh snapshot passes
    with capture(execute=True):
        second = client.post(runs_url(corpus), {"selection": "all-active"}, format="json")
    assert second.status_code == 202, second.content
    assert deliver_replay(second.json()["id"]) == "finished"
    after = client.get(runs_url(corpus, second.json()["id"])).json()
    assert (after["state"], after["summary"]["pass_rate"]) == ("passed", 1.0)
    parking = next(i for i in after["items"] if i["question"] == GAP)
    assert parking["result"]["evidence_diff"]["matched_count"] == 1
    assert "parking.md" in [r["filename"] for r in parking["result"]["evidence_diff"]["retrieved"]]
    assert (
        after["provenance"]["projection"]["publication_revision"]
        > before["provenance"]["projection"]["publication_revision"]
    )

    # (8) the trends of the last 24 hours show the change
    trends = client.get(f"{space}/quality/trends?window=24h")
    assert trends.status_code == 200, trends.content
    now = trends.json()
    assert (trends_before["current"]["pass_rate"], trends_before["current"]["total_replays"]) == (
        0.5,
        1,
    )
    assert (now["current"]["pass_rate"], now["current"]["total_replays"]) == (0.75, 2)
    assert now["current"]["pass_rate"] > trends_before["current"]["pass_rate"]
    assert now["current"]["failed_queries"] == trends_before["current"]["failed_queries"] == 2
    assert now["baseline"] == {"pass_rate": None, "failed_queries": 0, "total_replays": 0}
    assert now["daily"][-1]["failed_queries"] == {"retrieval-miss": 1, "coverage-gap": 1}
    assert now["top_unanswered"] == [{"query": GAP, "count": 1}]
    metrics = client.get(url(corpus, "metrics")).json()
    assert (metrics["total"], metrics["promotion_rate"]) == (2, 0.5)
    assert metrics["by_status"] == {"promoted": 1, "annotated": 1}
