"""Research task guards found by black-box review: unknown body members, the active-task
limits, results of documents disabled or deleted since, plain internal-error messages and
the pagination parameters."""

from __future__ import annotations

import pytest

from ingestion.availability import set_document_availability
from ingestion.documents import admit_document
from ingestion.models import Document
from knowledgefs.testing.fixtures import compile_all
from retrieval.research_tasks import tasks
from retrieval.research_tasks.models import ResearchTask
from spaces.api_keys import create_api_key

pytestmark = pytest.mark.django_db

TASKS = "/v1/research-tasks"
CORPUS = {
    "rockets.txt": "Rocket engines burn liquid oxygen and kerosene to produce thrust.",
    "bread.txt": "Sourdough bread rises slowly because wild yeast ferments the dough.",
    "boats.txt": "Sail boats use the wind; rockets and bread are not involved.",
}


@pytest.fixture
def corpus(space):
    for name, text in CORPUS.items():
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    return space


def create(client, space, hooks, **body):
    with hooks(execute=True):
        return client.post(
            TASKS, {"space_id": str(space.id), "query": "rockets vs bread", **body}, format="json"
        )


def deliver(task_id) -> str:
    return tasks.run_research_task(str(task_id), ResearchTask.objects.get(id=task_id).task_id)


@pytest.mark.parametrize("route", [TASKS, f"{TASKS}/plan"])
def test_unknown_members_are_400_naming_the_member(client, corpus, route):
    body = {"space_id": str(corpus.id), "query": "rockets", "filter": {"document_ids": []}}
    refused = client.post(route, body, format="json")
    assert refused.status_code == 400
    assert refused.json()["code"] == "invalid_request"
    assert refused.json()["message"].startswith("filter: not a research-task member (members: ")
    assert refused.json()["details"] == {"field": "filter"}
    assert not ResearchTask.objects.exists()


def test_unknown_members_on_queries_are_400(client, corpus):
    body = {"space_id": str(corpus.id), "query": "rockets", "topk": 3}
    refused = client.post("/v1/queries", body, format="json")
    assert refused.status_code == 400
    assert refused.json()["code"] == "invalid_request"
    assert refused.json()["message"].startswith("topk: not a query member")


def test_active_tasks_are_capped_per_caller_and_per_tenant(
    client, corpus, tenant, settings, django_capture_on_commit_callbacks
):
    settings.KNOWLEDGE_RESEARCH_TASK_MAX_ACTIVE_PER_OWNER = 2
    settings.KNOWLEDGE_RESEARCH_TASK_MAX_ACTIVE_PER_TENANT = 3
    hooks = django_capture_on_commit_callbacks
    first = [create(client, corpus, hooks).json()["id"] for _ in range(2)]
    refused = create(client, corpus, hooks)
    assert refused.status_code == 429 and refused["Retry-After"] == "30"
    assert refused.json()["code"] == "research_task_limit"
    assert refused.json()["message"] == (
        "this caller has 2 active research tasks (queued or running); the limit is 2 "
        "(KNOWLEDGE_RESEARCH_TASK_MAX_ACTIVE_PER_OWNER); retry when one has finished"
    )
    assert refused.json()["details"] == {"scope": "owner", "limit": 2, "active": 2}
    from rest_framework.test import APIClient

    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key(tenant)[1]}")
    assert create(other, corpus, hooks).status_code == 202  # another caller: the tenant's 3rd
    tenant_full = create(other, corpus, hooks)
    assert tenant_full.status_code == 429
    assert tenant_full.json()["details"] == {"scope": "tenant", "limit": 3, "active": 3}
    assert deliver(first[0]) == "completed"  # a finished task frees a place
    assert create(client, corpus, hooks).status_code == 202


def test_results_and_partials_leave_out_documents_disabled_or_deleted_since(
    client, corpus, django_capture_on_commit_callbacks
):
    task = create(client, corpus, django_capture_on_commit_callbacks, top_k=3).json()
    assert deliver(task["id"]) == "completed"
    items = client.get(f"{TASKS}/{task['id']}").json()["result"]["items"]
    assert {i["citation"]["filename"] for i in items} == set(CORPUS)
    rockets = Document.objects.get(filename="rockets.txt")
    bread = Document.objects.get(filename="bread.txt")
    set_document_availability(rockets.id, False, rockets.row_version)
    assert client.get(
        f"/v1/knowledge-spaces/{corpus.id}/documents/{rockets.id}/text"
    ).status_code == 409  # fmt: skip
    assert client.delete(f"/v1/knowledge-spaces/{corpus.id}/documents/{bread.id}").status_code in (
        200,
        202,
        204,
    )
    result = client.get(f"{TASKS}/{task['id']}").json()["result"]
    assert [i["citation"]["filename"] for i in result["items"]] == ["boats.txt"]
    assert result["redacted"] == sorted(
        [
            {"document_id": str(rockets.id), "reason": "document_disabled"},
            {"document_id": str(bread.id), "reason": "document_deleted"},
        ],
        key=lambda r: r["document_id"],
    )
    for partial in client.get(f"{TASKS}/{task['id']}/partials").json()["results"]:
        bundle = partial["evidence_bundle"]
        assert [i["citation"]["filename"] for i in bundle["items"]] == ["boats.txt"]
        assert {r["reason"] for r in bundle["redacted"]} == {
            "document_disabled",
            "document_deleted",
        }
    rockets.refresh_from_db()
    set_document_availability(rockets.id, True, rockets.row_version)  # served again
    again = client.get(f"{TASKS}/{task['id']}").json()["result"]
    assert {i["citation"]["filename"] for i in again["items"]} == {"rockets.txt", "boats.txt"}


def test_an_internal_failure_gives_a_plain_message(
    client, corpus, django_capture_on_commit_callbacks
):
    # A checkpoint damaged outside the service (an operator's manual edit): the run fails on
    # an unexpected error, whose text must stay in the log, not reach the caller.
    task = create(client, corpus, django_capture_on_commit_callbacks).json()
    ResearchTask.objects.filter(id=task["id"]).update(checkpoint=["damaged"])
    assert deliver(task["id"]) == "failed"
    error = client.get(f"{TASKS}/{task['id']}").json()["error"]
    assert error == {
        "code": "internal_error",
        "message": "the research task failed on an internal error; resume it to retry from "
        "its checkpoint, or contact the operator",
    }


@pytest.mark.parametrize(
    "route",
    ["/v1/queries", TASKS, f"{TASKS}/plan", "/v1/knowledge-spaces/{space}/retrieval-tests",
     "/v1/knowledge-spaces/{space}/golden-questions",
     "/v1/knowledge-spaces/{space}/research-tasks"],
)  # fmt: skip
def test_options_is_not_listed_in_allow_when_it_is_405(client, space, route):
    response = client.options(route.format(space=space.id))
    assert response.status_code == 405
    assert "OPTIONS" not in response["Allow"]
    assert response["Allow"] in ("POST", "GET, POST, HEAD", "GET, HEAD")


@pytest.mark.parametrize("limit", ["0", "101", "-1", "abc", "1.5"])
def test_an_out_of_range_limit_is_400_naming_the_range(client, space, limit):
    for route in (f"/v1/knowledge-spaces/{space.id}/research-tasks", "/v1/knowledge-spaces"):
        refused = client.get(f"{route}?limit={limit}")
        assert refused.status_code == 400, refused.content
        assert refused.json()["code"] == "invalid_limit"
        assert refused.json()["message"] == f"limit must be an integer from 1 to 100, not {limit!r}"
    assert client.get("/v1/knowledge-spaces?limit=100").status_code == 200


def test_a_cursor_that_decodes_to_nothing_is_400(client, space):
    for cursor in ("%00", "AAAA", "bm90aGluZw"):
        refused = client.get(f"/v1/knowledge-spaces/{space.id}/research-tasks?cursor={cursor}")
        assert refused.status_code == 400, (cursor, refused.content)
        assert refused.json()["code"] == "invalid_cursor"


def test_the_retrieval_test_mode_error_lists_only_concrete_modes(client, space):
    refused = client.post(
        f"/v1/knowledge-spaces/{space.id}/retrieval-tests",
        {"query": "x", "mode": "FAST"},
        format="json",
    )
    assert refused.status_code == 400
    assert refused.json()["code"] == "invalid_mode"
    assert refused.json()["message"] == "mode must be one of: fast, deep, research"


def test_kfs_research_tasks_lists_every_owner_of_the_tenant(
    client, corpus, tenant, capsys, django_capture_on_commit_callbacks
):
    import json

    from django.core.management import call_command
    from rest_framework.test import APIClient

    mine = create(client, corpus, django_capture_on_commit_callbacks).json()
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key(tenant)[1]}")
    theirs = create(other, corpus, django_capture_on_commit_callbacks).json()
    assert deliver(mine["id"]) == "completed"
    call_command("kfs", "research-tasks", "--tenant", tenant, "--space", corpus.slug, "--json")
    rows = json.loads(capsys.readouterr().out)["items"]
    assert [(r["id"], r["status"]) for r in rows] == [
        (theirs["id"], "queued"),
        (mine["id"], "completed"),
    ]
    assert rows[0]["owner"] != rows[1]["owner"] and rows[0]["space"] == corpus.slug
    call_command("kfs", "research-tasks", "--tenant", tenant, "--status", "queued")
    assert capsys.readouterr().out.startswith(theirs["id"])
    call_command("kfs", "research-tasks", "--tenant", "tenant-nobody")
    assert capsys.readouterr().out.strip() == "no research tasks"
