"""Failed-query capture and answer feedback (docs/quality.md): real database, local embedding
model, the API in process; capture runs after the trace commits (``on_commit``)."""

from __future__ import annotations

import logging
import uuid

import pytest
from rest_framework.test import APIClient

from ingestion.documents import admit_document
from knowledgefs.testing import capability as cap
from knowledgefs.testing.fixtures import compile_all
from retrieval.models import AnswerTrace, FailedQuery
from spaces.api_keys import create_api_key
from spaces.services import Principal, create_space

pytestmark = pytest.mark.django_db

LEAVE = (
    "# Leave\n\nEvery employee gets 25 days of annual leave per year. Unused leave days expire "
    "at the end of March. Requests go to your manager two weeks ahead."
)
QUESTION = "How many days of annual leave does an employee get?"
SECRET_QUESTION = "Which submarine route did the quartermaster hide in 1987?"


def ask(client: APIClient, space, query: str, capture) -> str:
    """POST /v1/queries, read the whole stream, run the on-commit callbacks; the trace id."""
    with capture(execute=True):
        response = client.post(
            "/v1/queries", {"space_id": str(space.id), "query": query}, format="json"
        )
        assert response.status_code == 200, response.content
        body = b"".join(response.streaming_content).decode()
    assert "answer.done" in body
    return response["X-Query-Run-Id"]


@pytest.fixture
def corpus(space):
    admit_document(space, filename="leave.md", data=LEAVE.encode(), enqueue=False)
    compile_all()
    return space


def test_not_enough_evidence_is_captured_with_exact_provenance_and_no_text_in_logs(
    space, client, django_capture_on_commit_callbacks, caplog
):
    caplog.set_level(logging.DEBUG)
    trace_id = ask(client, space, SECRET_QUESTION, django_capture_on_commit_callbacks)
    row = FailedQuery.objects.get(trace_id=trace_id)
    key = AnswerTrace.objects.get(id=trace_id).api_key_id
    assert row.trigger == "not-enough-evidence" and row.status == "pending-triage"
    assert row.query == SECRET_QUESTION and row.answerability == "not-enough-evidence"
    assert (row.tenant_id, row.requester_kind, row.api_key_id, row.requester) == (
        "tenant-a",
        "api_key",
        key,
        f"key:{key}",
    )
    assert row.permission_scope is None  # an unbound key: the whole tenant
    assert "submarine" not in caplog.text and "quartermaster" not in caplog.text
    assert str(row.id) in caplog.text  # the capture is logged, by id


def test_capture_waits_for_the_commit(space, client, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(
            "/v1/queries", {"space_id": str(space.id), "query": SECRET_QUESTION}, format="json"
        )
        b"".join(response.streaming_content)
    assert not FailedQuery.objects.exists()  # nothing before the commit
    assert len(callbacks) == 1
    callbacks[0]()
    assert FailedQuery.objects.get().trace_id == uuid.UUID(response["X-Query-Run-Id"])


def test_low_confidence_rule_follows_its_setting(
    corpus, client, settings, django_capture_on_commit_callbacks
):
    settings.KNOWLEDGE_QUALITY_LOW_CONFIDENCE_PERCENT = 0  # off
    ask(client, corpus, QUESTION, django_capture_on_commit_callbacks)
    assert not FailedQuery.objects.exists()
    settings.KNOWLEDGE_QUALITY_LOW_CONFIDENCE_PERCENT = 100  # every answer is under 1.0
    trace_id = ask(client, corpus, QUESTION, django_capture_on_commit_callbacks)
    row = FailedQuery.objects.get(trace_id=trace_id)
    assert row.trigger == "low-confidence" and row.answerability == "answerable"
    assert 0.35 <= row.confidence < 1.0  # the raw dense cosine of the best evidence
    settings.KNOWLEDGE_QUALITY_LOW_CONFIDENCE_PERCENT = int(row.confidence * 100)  # just under
    ask(client, corpus, QUESTION, django_capture_on_commit_callbacks)
    assert FailedQuery.objects.count() == 1


def test_the_low_confidence_setting_names_its_range(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from knowledgefs.settings.values import bounded_int

    monkeypatch.setenv("KNOWLEDGE_QUALITY_LOW_CONFIDENCE_PERCENT", "101")
    with pytest.raises(ImproperlyConfigured, match=r"outside the accepted range 0\.\.100"):
        bounded_int("KNOWLEDGE_QUALITY_LOW_CONFIDENCE_PERCENT", 45, 0, 100)


def test_feedback_records_a_failed_query_once(corpus, client, django_capture_on_commit_callbacks):
    trace_id = ask(client, corpus, QUESTION, django_capture_on_commit_callbacks)
    url = f"/v1/queries/{trace_id}/feedback"
    helpful = client.post(url, {"helpful": True}, format="json")
    assert helpful.status_code == 200 and helpful.json()["failed_query"] is None
    assert not FailedQuery.objects.exists()
    first = client.post(
        url, {"helpful": False, "reason": "wrong year", "query": QUESTION}, format="json"
    )
    assert first.status_code == 201, first.content
    row = first.json()["failed_query"]
    assert row["trigger"] == "user-feedback" and row["reason"] == "wrong year"
    assert row["query"] == QUESTION and row["provenance"]["requester_kind"] == "api_key"
    again = client.post(url, {"helpful": False}, format="json")
    assert again.status_code == 200 and again.json()["failed_query"]["id"] == row["id"]
    assert FailedQuery.objects.count() == 1


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({}, "invalid_feedback", "helpful"),
        ({"helpful": "no"}, "invalid_feedback", "helpful"),
        ({"helpful": False, "reason": "x" * 2001}, "invalid_feedback", "reason"),
        ({"helpful": False, "query": "another question"}, "query_mismatch", "query"),
        ({"helpful": False, "rating": 1}, "invalid_request", "rating"),
    ],
)
def test_bad_feedback_is_a_400_naming_the_field(
    space, client, django_capture_on_commit_callbacks, body, code, field
):
    trace_id = ask(client, space, SECRET_QUESTION, django_capture_on_commit_callbacks)
    response = client.post(f"/v1/queries/{trace_id}/feedback", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == code
    assert response.json()["details"]["field"] == field


def test_feedback_on_a_foreign_trace_is_404(space, client, django_capture_on_commit_callbacks):
    trace_id = ask(client, space, SECRET_QUESTION, django_capture_on_commit_callbacks)
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key('tenant-b')[1]}")
    for ident in (trace_id, str(uuid.uuid4()), "not-a-uuid"):
        response = other.post(f"/v1/queries/{ident}/feedback", {"helpful": False}, format="json")
        assert response.status_code == 404
        assert response.json()["code"] == "trace_not_found"
    assert FailedQuery.objects.filter(trigger="user-feedback").count() == 0


def test_failed_queries_are_read_only_by_callers_whose_scope_covers_them(
    space, client, settings, django_capture_on_commit_callbacks
):
    other_space = create_space(Principal(tenant_id="tenant-a"), name="Other")
    bound = APIClient()
    bound.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key('tenant-a', spaces=[space])[1]}")
    wide_trace = ask(client, space, SECRET_QUESTION, django_capture_on_commit_callbacks)
    bound_trace = ask(bound, space, "What is the canteen menu?", django_capture_on_commit_callbacks)
    wide_row = FailedQuery.objects.get(trace_id=wide_trace)
    bound_row = FailedQuery.objects.get(trace_id=bound_trace)
    assert bound_row.permission_scope == [str(space.id)]
    url = f"/v1/knowledge-spaces/{space.id}/failed-queries"
    listed = {r["id"] for r in client.get(url).json()["results"]}
    assert listed == {str(wide_row.id), str(bound_row.id)}  # the tenant-wide key covers both
    listed = {r["id"] for r in bound.get(url).json()["results"]}
    assert listed == {str(bound_row.id)}  # never what a wider caller asked
    assert bound.get(f"{url}/{wide_row.id}").json()["code"] == "failed_query_not_found"
    assert bound.get(f"{url}/{bound_row.id}").json()["query"] == "What is the canteen menu?"
    # a capability token for the space covers the space-bound row only
    settings.KNOWLEDGE_FS_CAPABILITY_V2_ENABLED = True
    settings.KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS = cap.jwks_text("current")
    token = cap.token(action="failed_queries.list", resource=cap.space_resource(space.id))
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = api.get(url)
    assert response.status_code == 200, response.content
    assert {r["id"] for r in response.json()["results"]} == {str(bound_row.id)}
    # another space and another tenant see none of it
    assert (
        client.get(f"/v1/knowledge-spaces/{other_space.id}/failed-queries").json()["results"] == []
    )
    foreign = APIClient()
    foreign.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key('tenant-b')[1]}")
    assert foreign.get(url).status_code == 404
    assert client.get(f"{url}?status=bogus").json()["code"] == "invalid_status"
    assert client.get(f"{url}?limit=201").json()["code"] == "invalid_limit"
