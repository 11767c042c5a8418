"""Idempotency-Key on space creation and uploads: retries replay, reuse elsewhere fails."""

from __future__ import annotations

import pytest

from ingestion.models import CompilationJob, Document
from knowledgefs.models import IdempotencyRecord
from knowledgefs.testing.fixtures import multipart_body
from spaces.models import KnowledgeSpace

pytestmark = pytest.mark.django_db


def test_a_retried_space_creation_returns_the_first_response(client):
    first = client.post(
        "/v1/knowledge-spaces", {"name": "Ops"}, format="json", HTTP_IDEMPOTENCY_KEY="create-ops-1"
    )
    retry = client.post(
        "/v1/knowledge-spaces", {"name": "Ops"}, format="json", HTTP_IDEMPOTENCY_KEY="create-ops-1"
    )
    assert first.status_code == retry.status_code == 201
    assert retry.json() == first.json()
    assert retry["Idempotent-Replayed"] == "true"
    assert KnowledgeSpace.objects.count() == 1


def test_a_key_reused_for_another_request_is_422(client):
    client.post("/v1/knowledge-spaces", {"name": "A"}, format="json", HTTP_IDEMPOTENCY_KEY="k")
    other = client.post(
        "/v1/knowledge-spaces", {"name": "B"}, format="json", HTTP_IDEMPOTENCY_KEY="k"
    )
    assert other.status_code == 422
    assert other.json()["code"] == "idempotency_key_reused"
    assert KnowledgeSpace.objects.count() == 1


def test_errors_are_not_stored_and_bad_keys_are_refused(client):
    bad = client.post(
        "/v1/knowledge-spaces",
        {"name": "x", "slug": "Bad Slug"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k2",
    )
    assert bad.status_code == 400
    assert not IdempotencyRecord.objects.exists()
    long = client.post(
        "/v1/knowledge-spaces", {"name": "x"}, format="json", HTTP_IDEMPOTENCY_KEY="k" * 256
    )
    assert long.status_code == 400
    assert long.json()["code"] == "invalid_idempotency_key"


def test_a_retried_upload_replays_instead_of_409(client, space):
    url = f"/v1/knowledge-spaces/{space.id}/documents"
    body, content_type = multipart_body("notes.txt", b"retry me safely")
    responses = [
        client.generic("POST", url, body, content_type=content_type, HTTP_IDEMPOTENCY_KEY="up-1")
        for _ in range(2)
    ]
    assert [r.status_code for r in responses] == [202, 202]
    assert responses[1].json() == responses[0].json()
    assert Document.objects.count() == 1 and CompilationJob.objects.count() == 1
    # Without the key the same bytes are a duplicate, as before.
    again = client.generic("POST", url, body, content_type=content_type)
    assert again.status_code == 409


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(240)
def test_concurrent_retries_of_a_failing_first_attempt_never_500(api_key):
    """Every attempt fails (409 slug_taken), so each deletes its record; an attempt whose
    insert collided with a record deleted before it could read it once raised DoesNotExist
    (500). Now each attempt runs again cleanly or is 409 ``idempotency_key_in_progress``."""
    import threading

    from django.db import connections
    from rest_framework.test import APIClient

    APIClient().post(
        "/v1/knowledge-spaces", {"name": "Docs", "slug": "docs"}, format="json",
        HTTP_AUTHORIZATION=f"Bearer {api_key}",
    )  # fmt: skip
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def attempt() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key}")
        try:
            for _ in range(12):
                barrier.wait(30)
                try:
                    response = client.post(
                        "/v1/knowledge-spaces", {"name": "dup", "slug": "docs"},
                        format="json", HTTP_IDEMPOTENCY_KEY="sp-race",
                    )  # fmt: skip
                    outcomes.append(f"{response.status_code} {response.json()['code']}")
                except Exception as exc:  # what the server would answer with a 500
                    outcomes.append(f"500 {type(exc).__name__}")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(200)
    assert len(outcomes) == 96
    assert set(outcomes) <= {"409 slug_taken", "409 idempotency_key_in_progress"}, sorted(
        set(outcomes)
    )
    assert "409 slug_taken" in outcomes
    assert not IdempotencyRecord.objects.exists()
