"""Bad cases (docs/quality.md): made from an answer trace, changed only by compare-and-set on
their revision, with an immutable history. Real database, the API in process."""

from __future__ import annotations

import uuid

import pytest
from rest_framework.test import APIClient

from retrieval.models import BadCase, BadCaseEvent
from retrieval.quality.models import ImmutableRow
from spaces.api_keys import create_api_key
from spaces.services import Principal, create_space

pytestmark = pytest.mark.django_db


@pytest.fixture
def trace_id(space, client, django_capture_on_commit_callbacks) -> str:
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            "/v1/queries", {"space_id": str(space.id), "query": "Where is the lost manual?"},
            format="json",
        )  # fmt: skip
        b"".join(response.streaming_content)
    return response["X-Query-Run-Id"]


def url(space, *parts) -> str:
    return "/".join([f"/v1/knowledge-spaces/{space.id}/quality/bad-cases", *parts])


def test_a_bad_case_goes_through_its_statuses_with_a_history(space, client, trace_id):
    created = client.post(
        url(space), {"trace_id": trace_id, "reason": "missed the manual", "tags": ["manual"]},
        format="json",
    )  # fmt: skip
    assert created.status_code == 201, created.content
    case = created.json()
    assert (case["status"], case["revision"], case["tags"]) == ("open", 1, ["manual"])
    assert case["query"] == "Where is the lost manual?"  # from the captured failed query
    run_id = str(uuid.uuid4())
    replaying = client.patch(
        url(space, case["id"]),
        {"expected_revision": 1, "status": "replaying", "replay_run_id": run_id},
        format="json",
    )
    assert replaying.status_code == 200, replaying.content
    assert replaying.json()["revision"] == 2 and replaying.json()["replay_run_id"] == run_id
    fixed = client.patch(
        url(space, case["id"]), {"expected_revision": 2, "status": "fixed"}, format="json"
    )
    assert fixed.json()["status"] == "fixed" and fixed.json()["revision"] == 3
    history = client.get(url(space, case["id"], "history")).json()["results"]
    assert [(h["revision"], h["from_status"], h["to_status"]) for h in history] == [
        (1, None, "open"),
        (2, "open", "replaying"),
        (3, "replaying", "fixed"),
    ]
    listed = client.get(url(space) + "?status=fixed").json()["results"]
    assert [c["id"] for c in listed] == [case["id"]]
    assert client.get(url(space) + "?status=open").json()["results"] == []


def test_a_stale_revision_is_409_and_changes_nothing(space, client, trace_id):
    case = client.post(url(space), {"trace_id": trace_id, "reason": "r"}, format="json").json()
    client.patch(url(space, case["id"]), {"expected_revision": 1, "status": "dismissed"},
                 format="json")  # fmt: skip
    stale = client.patch(
        url(space, case["id"]), {"expected_revision": 1, "status": "fixed"}, format="json"
    )
    assert stale.status_code == 409
    assert stale.json()["code"] == "revision_conflict"
    assert stale.json()["details"] == {"current_revision": 2, "expected_revision": 1}
    assert BadCase.objects.get(id=case["id"]).status == "dismissed"
    assert BadCaseEvent.objects.filter(bad_case_id=case["id"]).count() == 2


def test_history_rows_are_immutable(space, client, trace_id):
    case = client.post(url(space), {"trace_id": trace_id, "reason": "r"}, format="json").json()
    event = BadCaseEvent.objects.get(bad_case_id=case["id"])
    event.to_status = "fixed"
    with pytest.raises(ImmutableRow):
        event.save()
    with pytest.raises(ImmutableRow):
        event.delete()
    assert BadCaseEvent.objects.get(bad_case_id=case["id"]).to_status == "open"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"reason": "r"}, 404, "trace_not_found"),
        ({"trace_id": "TRACE", "reason": ""}, 400, "invalid_reason"),
        ({"trace_id": "TRACE", "reason": "x" * 4001}, 400, "invalid_reason"),
        ({"trace_id": "TRACE", "reason": "r", "tags": ["t"] * 51}, 400, "invalid_tags"),
        ({"trace_id": "TRACE", "reason": "r", "tags": ["x" * 81]}, 400, "invalid_tags"),
        ({"trace_id": "TRACE", "reason": "r", "status": "fixed"}, 400, "invalid_request"),
    ],
)
def test_bad_create_bodies(space, client, trace_id, body, status, code):
    body = {k: trace_id if v == "TRACE" else v for k, v in body.items()}
    response = client.post(url(space), body, format="json")
    assert (response.status_code, response.json()["code"]) == (status, code), response.content


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"status": "fixed"}, "invalid_revision"),
        ({"expected_revision": "1", "status": "fixed"}, "invalid_revision"),
        ({"expected_revision": 1, "status": "closed"}, "invalid_status"),
        ({"expected_revision": 1, "status": "replaying"}, "replay_run_required"),
        ({"expected_revision": 1, "replay_run_id": "run-1"}, "invalid_replay_run_id"),
    ],
)
def test_bad_updates_are_400(space, client, trace_id, body, code):
    case = client.post(url(space), {"trace_id": trace_id, "reason": "r"}, format="json").json()
    response = client.patch(url(space, case["id"]), body, format="json")
    assert (response.status_code, response.json()["code"]) == (400, code), response.content
    assert BadCase.objects.get(id=case["id"]).revision == 1


def test_a_trace_of_another_space_or_tenant_is_404(space, client, trace_id):
    other = create_space(Principal(tenant_id="tenant-a"), name="Other")
    response = client.post(url(other), {"trace_id": trace_id, "reason": "r"}, format="json")
    assert response.json()["code"] == "trace_not_found"
    case = client.post(url(space), {"trace_id": trace_id, "reason": "r"}, format="json").json()
    foreign = APIClient()
    foreign.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key('tenant-b')[1]}")
    assert foreign.get(url(space, case["id"])).status_code == 404
    bound = APIClient()
    bound.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key('tenant-a', spaces=[space])[1]}")
    # made by a tenant-wide key: a space-bound key's scope does not cover it
    assert bound.get(url(space, case["id"])).json()["code"] == "bad_case_not_found"
    assert bound.get(url(space)).json()["results"] == []
