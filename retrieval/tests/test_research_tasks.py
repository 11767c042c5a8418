"""Durable research tasks: the plan estimate, admission, execution through the real delivery
path (claim, compare-and-set start, fenced writes), cancel, resume from the checkpoint, the
recovery sweep, isolation and pagination.

Deliveries run in this process through the django-q2 entry point with the delivery id the
dispatch claimed (what a worker does with the queue's message);
tests/system/test_research_tasks_cluster.py runs them on a real cluster. The reasoning model is the
Dify contract server's scripted LLM.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from ingestion.documents import admit_document
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import LLM, TEST_INNER_KEY
from knowledgefs.testing.fixtures import compile_all
from knowledgefs.testing.research_script import (
    JUDGEMENT,
    PLAN,
    QUESTION,
    REASONER,
    SUPPLEMENT,
    step_of,
)
from retrieval.research_tasks import dispatch, runner, service, tasks
from retrieval.research_tasks.models import ResearchTask, ResearchTaskPartial
from retrieval.research_tasks.planning import approx_tokens
from spaces.api_keys import create_api_key
from spaces.services import Principal, create_space

pytestmark = pytest.mark.django_db

dify_server = dify_fixtures.dify_server

TASKS = "/v1/research-tasks"
SPACES = "/v1/knowledge-spaces"
CORPUS = {
    "leave.md": "# Leave\n\nEvery employee gets 25 days of annual leave per year.",
    "expenses.md": "# Expenses\n\nSubmit travel receipts within thirty days of the trip.",
    "travel.md": "# Travel\n\nBook trains for trips under four hours; flights need approval.",
    "rockets.txt": "Rocket engines burn liquid oxygen and kerosene to produce thrust.",
    "bread.txt": "Sourdough bread rises slowly because wild yeast ferments the dough.",
}
OPENAI = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "text-embedding-3-small"}


def load(space, corpus=CORPUS) -> None:
    for name, text in corpus.items():
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()


@pytest.fixture
def corpus(space):
    load(space)
    return space


def post(client, body: dict, **headers):
    return client.post(TASKS, body, format="json", **headers)


def create(client, space, commit_hooks, **body) -> dict:
    """POST a task (its on-commit dispatch runs) and return the 202 body."""
    with commit_hooks(execute=True):
        response = post(client, {"space_id": str(space.id), "query": "rockets vs bread", **body})
    assert response.status_code == 202, response.content
    return response.json()


def deliver(task_id) -> str:
    """Deliver the message the dispatch published: the worker's entry point with the task id
    and the delivery id the claim wrote."""
    delivery = ResearchTask.objects.get(id=task_id).task_id
    assert delivery, "the task holds no claim: nothing was dispatched"
    return tasks.run_research_task(str(task_id), delivery)


# --- the plan ------------------------------------------------------------------------------------


def test_the_plan_on_the_embedded_default_is_a_dry_run(client, corpus):
    response = client.post(
        f"{TASKS}/plan",
        {"space_id": str(corpus.id), "query": "rockets vs bread", "top_k": 5},
        format="json",
    )
    assert response.status_code == 200, response.content
    plan = response.json()
    assert plan["path"] == "deterministic"
    assert plan["model_calls"] == {"min": 0, "max": 0}
    assert plan["tokens"] == {
        "input": {"min": 0, "max": 0},
        "output": {"min": 0, "max": 0},
        "basis": "no model calls",
    }
    assert plan["latency_ms"] == {"p50": None, "p95": None, "basis": "unknown", "samples": 0}
    assert [(s["name"], s["model_call"], s["status"]) for s in plan["steps"]] == [
        ("plan", False, "planned"),
        ("embed", False, "planned"),
        ("recall", False, "planned"),
        ("rerank", False, "skipped"),
        ("threshold", False, "planned"),
        ("judge", True, "skipped"),
        ("supplemental", True, "skipped"),
    ]
    assert plan["work_bounds"] == {
        "rounds": 1,
        "supplemental_queries": 0,
        "planned_queries": 4,
        "recall_per_query_and_leg": 50,
        "rerank_candidates": 0,
        "rerank_calls": 0,
        "max_items": 5,
        "timeout_ms": 180000,
    }
    assert plan["limits"] == {"max_model_calls": 3, "timeout_ms": 180000}
    assert plan["violations"] == []
    assert ResearchTask.objects.count() == 0


@pytest.mark.parametrize(
    ("body", "code", "named"),
    [
        ({"top_k": 51}, "invalid_top_k", "1 to 50"),
        ({"top_k": 0}, "invalid_top_k", "1 to 50"),
        ({"query": "  "}, "invalid_query", "query"),
        ({"limits": {"timeout_ms": 180001}}, "invalid_limits", "limits.timeout_ms"),
        ({"limits": {"max_model_calls": 4}}, "invalid_limits", "limits.max_model_calls"),
        ({"limits": {"max_tool_calls": 1}}, "invalid_limits", "max_tool_calls"),
        ({"limits": [1]}, "invalid_limits", "limits"),
        ({"filters": "x"}, "invalid_filter", "filters"),
        ({"filters": {"tags": ["a"]}}, "invalid_filter", "filters.tags"),
        ({"space_id": None}, "invalid_space_id", "space_id"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(client, space, body, code, named):
    full = {"space_id": str(space.id), "query": "leave", **body}
    for url in (f"{TASKS}/plan", TASKS):
        response = client.post(url, full, format="json")
        assert response.status_code == 400, (url, response.content)
        assert response.json()["code"] == code and named in response.json()["message"]
    assert ResearchTask.objects.count() == 0


def test_a_foreign_or_unknown_space_is_404(client):
    other = create_space(Principal(tenant_id="tenant-b"), name="B")
    for space_id in (str(other.id), str(uuid.uuid4()), "not-a-uuid"):
        response = post(client, {"space_id": space_id, "query": "leave"})
        assert response.status_code == 404 and response.json()["code"] == "space_not_found"


# --- the reasoning path: a Dify space with a validated reasoning model ---------------------------


@pytest.fixture
def dify(settings, dify_server):
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    dify_server.dimension = 48
    return dify_server


def reasoned_space(client, principal, dify, name="Research"):
    space = create_space(principal, name=name)
    url = f"{SPACES}/{space.id}"
    assert client.put(f"{url}/embedding-profile", OPENAI, format="json").status_code == 200
    load(space)
    body = {"reasoning_model": REASONER}
    assert client.put(f"{url}/retrieval-profile", body, format="json").status_code == 200
    assert client.post(f"{url}/profile-validation").json()["readiness"]["state"] == "ready"
    dify.reset_observations()
    return space


class ScriptedModel:
    """The reasoning model: an answer per Research step (a callable is called first, with no
    arguments); records the steps asked, in order."""

    def __init__(self, **answers) -> None:
        self.answers = answers
        self.steps: list[str] = []

    def __call__(self, body: dict) -> str | None:
        system = body["prompt_messages"][0]["content"]
        step = step_of(system)
        if step is None:
            return None  # the preflight probe gets the server's fixed answer
        self.steps.append(step)
        answer = self.answers[step]
        return json.dumps(answer() if callable(answer) else answer)


def test_the_plan_with_a_reasoning_model_and_limits_it_cannot_meet(
    dify, client, principal, django_capture_on_commit_callbacks
):
    space = reasoned_space(client, principal, dify)
    url = f"{TASKS}/plan"
    short, long = "leave", "leave leave leave"
    assert approx_tokens(long) - approx_tokens(short) == 2
    plans = [
        client.post(url, {"space_id": str(space.id), "query": q}, format="json").json()
        for q in (short, long)
    ]
    plan = plans[0]
    assert plan["path"] == "reasoning"
    assert plan["model_calls"] == {"min": 1, "max": 3}
    assert plan["tokens"]["output"] == {"min": 0, "max": 3 * 8192}
    # The query is in every prompt: 2 more tokens per call.
    assert plans[1]["tokens"]["input"]["min"] - plan["tokens"]["input"]["min"] == 2
    assert plans[1]["tokens"]["input"]["max"] - plan["tokens"]["input"]["max"] == 3 * 2
    # The judge's evidence budget: min(top_k 10, 10 items) × the mean node length / 4.
    assert "judge evidence 10 items" in plan["tokens"]["basis"]
    assert plan["latency_ms"] == {"p50": 60000, "p95": 180000, "basis": "configured", "samples": 0}
    assert plan["work_bounds"]["rounds"] == 2 and plan["work_bounds"]["supplemental_queries"] == 1
    assert [s["status"] for s in plan["steps"] if s["model_call"]] == ["planned"] * 3
    assert dify.count(LLM) == 0  # a dry run calls no model
    limits = {"max_model_calls": 2, "timeout_ms": 30000}
    expected = [
        {"limit": "max_model_calls", "limit_value": 2, "estimated_value": 3},
        {"limit": "timeout_ms", "limit_value": 30000, "estimated_value": 60000},
    ]
    body = {"space_id": str(space.id), "query": QUESTION, "limits": limits}
    planned = client.post(url, body, format="json").json()
    assert planned["violations"] == expected
    with django_capture_on_commit_callbacks(execute=True):
        refused = post(client, body)
    assert refused.status_code == 422
    assert refused.json() == {
        "code": "research_limits_exceeded",
        "message": "the research plan cannot meet the limits: max_model_calls, timeout_ms",
        "violations": expected,
    }
    assert ResearchTask.objects.count() == 0


# --- execution -----------------------------------------------------------------------------------


def test_a_task_runs_to_completed_with_cited_evidence(
    client, corpus, django_capture_on_commit_callbacks
):
    created = create(client, corpus, django_capture_on_commit_callbacks, top_k=2)
    assert created["stage"] == "queued" and created["status"] == "queued"
    assert created["result"] is None and created["error"] is None
    assert created["plan"]["path"] == "deterministic"
    task = ResearchTask.objects.get(id=created["id"])
    assert task.task_id and task.claimed_at  # claimed before it was published
    assert task.owner.startswith("key:") and task.api_key_id is not None
    assert deliver(task.id) == "completed"
    body = client.get(f"{TASKS}/{task.id}").json()
    assert (body["stage"], body["status"], body["error"]) == ("completed", "completed", None)
    assert body["progress"]["attempts"] == 1 and body["elapsed_ms"] > 0
    items = body["result"]["items"]
    assert {i["citation"]["filename"] for i in items} == {"rockets.txt", "bread.txt"}
    assert all(i["citation"]["document_id"] and i["text"] for i in items)
    metrics = body["result"]["metrics"]
    assert metrics["research_path"] == "deterministic"
    assert metrics["research_policy"] == "durable" and metrics["research_model_calls"] == 0
    assert [q["text"] for q in body["result"]["plan"]["queries"]] == [
        "rockets vs bread",
        "rockets",
        "bread",
    ]
    partials = client.get(f"{TASKS}/{task.id}/partials").json()
    # One retrieval round (no reasoning model): its evidence as it ended, then the result.
    assert [(p["sequence"], p["kind"]) for p in partials["results"]] == [(1, "round"), (2, "final")]
    round_one, final = (p["evidence_bundle"] for p in partials["results"])
    assert final["items"] == items and round_one["items"] == items
    assert round_one["metrics"]["research_round"] == 1
    assert round_one["metrics"]["queries"] == ["rockets vs bread", "rockets", "bread"]
    assert body["progress"]["model_calls_spent"] == 0
    # A second copy of the same message, or a stale one, is refused without a write.
    updated = ResearchTask.objects.get(id=task.id).updated_at
    assert tasks.run_research_task(str(task.id), "another-delivery") == "stale"
    assert ResearchTask.objects.get(id=task.id).updated_at == updated
    # The next plan in this space is based on the measured run.
    plan = client.post(
        f"{TASKS}/plan", {"space_id": str(corpus.id), "query": "bread"}, format="json"
    ).json()
    elapsed = ResearchTask.objects.get(id=task.id).elapsed_ms
    assert plan["latency_ms"] == {"p50": elapsed, "p95": elapsed, "basis": "measured", "samples": 1}


def test_a_task_applies_its_filters(client, corpus, django_capture_on_commit_callbacks):
    from ingestion.models import Document

    rockets = str(Document.objects.get(filename="rockets.txt").id)
    created = create(
        client, corpus, django_capture_on_commit_callbacks, filters={"document_ids": [rockets]}
    )
    assert created["filters"] == {"document_ids": [rockets]}
    assert deliver(created["id"]) == "completed"
    items = client.get(f"{TASKS}/{created['id']}").json()["result"]["items"]
    assert [i["citation"]["filename"] for i in items] == ["rockets.txt"]


def test_the_same_idempotency_key_returns_the_same_task(
    client, corpus, django_capture_on_commit_callbacks
):
    body = {"space_id": str(corpus.id), "query": "yeast", "top_k": 3}
    with django_capture_on_commit_callbacks(execute=True):
        first = post(client, body, HTTP_IDEMPOTENCY_KEY="research-1")
        again = post(client, body, HTTP_IDEMPOTENCY_KEY="research-1")
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again["Idempotent-Replayed"] == "true"
    assert ResearchTask.objects.count() == 1
    assert ResearchTask.objects.get().idempotency_key == "research-1"
    other = post(client, {**body, "query": "rockets"}, HTTP_IDEMPOTENCY_KEY="research-1")
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"
    # The key is the task's own: after the replay records expire the task is still found.
    from knowledgefs.models import IdempotencyRecord

    IdempotencyRecord.objects.all().delete()
    later = post(client, body, HTTP_IDEMPOTENCY_KEY="research-1")
    assert later.status_code == 202 and later.json()["id"] == first.json()["id"]
    assert later["Idempotent-Replayed"] == "true"
    # Another key of the tenant cannot take it over.
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key('tenant-a')[1]}")
    taken = post(stranger, body, HTTP_IDEMPOTENCY_KEY="research-1")
    assert taken.status_code == 422 and taken.json()["code"] == "idempotency_key_reused"
    assert ResearchTask.objects.count() == 1


def test_cancel_a_queued_task_then_resume_it(client, corpus, django_capture_on_commit_callbacks):
    created = create(client, corpus, django_capture_on_commit_callbacks)
    first_delivery = ResearchTask.objects.get(id=created["id"]).task_id
    canceled = client.delete(f"{TASKS}/{created['id']}")
    assert canceled.status_code == 200
    assert (canceled.json()["stage"], canceled.json()["status"]) == ("canceled", "canceled")
    assert canceled.json()["error"] == {"code": "canceled", "message": "canceled by request"}
    # The message already on the queue arrives: refused, nothing runs.
    assert tasks.run_research_task(created["id"], first_delivery) == "stale"
    assert ResearchTask.objects.get(id=created["id"]).attempt_count == 0
    again = client.delete(f"{TASKS}/{created['id']}")
    assert again.status_code == 409 and again.json()["code"] == "research_task_finished"
    with django_capture_on_commit_callbacks(execute=True):
        resumed = client.post(f"{TASKS}/{created['id']}/resume")
    assert resumed.status_code == 202
    assert (resumed.json()["stage"], resumed.json()["error"]) == ("queued", None)
    assert resumed.json()["progress"]["resumes"] == 1
    live = client.post(f"{TASKS}/{created['id']}/resume")
    assert live.status_code == 409 and live.json()["code"] == "research_task_live"
    assert deliver(created["id"]) == "completed"
    done = client.post(f"{TASKS}/{created['id']}/resume")
    assert done.status_code == 409 and done.json()["code"] == "research_task_completed"
    finished = client.delete(f"{TASKS}/{created['id']}")
    assert finished.status_code == 409 and finished.json()["code"] == "research_task_finished"


def test_should_stop_sees_a_cancel_within_a_second(
    client, corpus, django_capture_on_commit_callbacks
):
    created = create(client, corpus, django_capture_on_commit_callbacks)
    task = ResearchTask.objects.get(id=created["id"])
    running = dispatch.begin(task.id, task.task_id)
    assert running.run_state == "running" and running.stage == "planning"
    delivery = runner._Delivery(running, task.task_id)
    assert delivery.should_stop() is False
    service.cancel_task(task.id)
    canceled_at = time.monotonic()
    while not delivery.should_stop():
        time.sleep(0.05)
    assert time.monotonic() - canceled_at <= 1.0
    assert delivery.lost and not delivery.timed_out
    # Its checkpoint write is refused: the canceled task keeps what it had.
    with pytest.raises(dispatch.ClaimLost):
        delivery.save_checkpoint({"planner": {"status": "ok", "output": PLAN}})
    assert ResearchTask.objects.get(id=task.id).checkpoint == {}


def test_a_spent_wall_clock_still_completes_and_research_timeout_is_the_hard_stop(
    client, corpus, django_capture_on_commit_callbacks, monkeypatch
):
    # Past its timeout_ms Research starts no model call but still returns what recall finds
    # (the deterministic path needs none): the task completes.
    created = create(client, corpus, django_capture_on_commit_callbacks)
    ResearchTask.objects.filter(id=created["id"]).update(
        limits={"max_model_calls": 3, "timeout_ms": 1}
    )
    assert deliver(created["id"]) == "completed"
    body = client.get(f"{TASKS}/{created['id']}").json()
    assert body["result"]["items"][0]["citation"]["filename"] in ("rockets.txt", "bread.txt")
    assert body["result"]["metrics"]["budget_exhausted"] is None  # it needed no model call
    # Research still running STOP_GRACE_SECONDS after the limit (here: at once) has no result
    # to give: research_timeout, the checkpoint kept for a resume.
    monkeypatch.setattr(runner, "STOP_GRACE_SECONDS", 0)
    created = create(client, corpus, django_capture_on_commit_callbacks)
    ResearchTask.objects.filter(id=created["id"]).update(
        limits={"max_model_calls": 3, "timeout_ms": 1}
    )
    assert deliver(created["id"]) == "failed"
    body = client.get(f"{TASKS}/{created['id']}").json()
    assert (body["stage"], body["error"]["code"]) == ("failed", "research_timeout")
    assert "0 s past its 1 ms wall clock" in body["error"]["message"]


@pytest.mark.django_db(transaction=True)
def test_canceled_after_the_planner_and_resumed_within_one_budget(dify, client, api_key, principal):
    """The durable budget (3 model calls, 180 s) holds across deliveries: the judge call a
    cancel cut short stays charged, the planner is not asked again, and the elapsed time of
    both deliveries is reported."""
    space = reasoned_space(client, principal, dify)
    holder: dict = {}

    def judge_while_canceled() -> dict:
        # The user cancels while the judge call is in flight; the planner's outcome was saved.
        # (This runs on the Dify server's thread: it records what it saw, the test asserts.)
        from django.db import connection

        try:
            task = ResearchTask.objects.get(id=holder["id"])
            holder["seen"] = (sorted(task.checkpoint), task.stage, task.checkpoint["spent"])
            user = APIClient()
            user.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key}")
            holder["cancel"] = user.delete(f"{TASKS}/{holder['id']}").status_code
        finally:
            connection.close()
        return JUDGEMENT

    model = dify.llm_responder = ScriptedModel(
        planner=PLAN, judge=judge_while_canceled, supplemental=SUPPLEMENT
    )
    dify.delay(0.5, route=LLM)  # the planner takes half a second: time the budget must keep
    created = post(client, {"space_id": str(space.id), "query": QUESTION, "top_k": 3})
    assert created.status_code == 202
    holder["id"] = created.json()["id"]
    assert deliver(holder["id"]) == "lost"  # canceled during the judge call
    seen_keys, seen_stage, seen_spent = holder["seen"]
    assert (seen_keys, seen_stage) == (["planner", "rounds", "spent"], "retrieving")
    assert seen_spent["model_calls"] == 2  # the judge call was charged when it started
    assert holder["cancel"] == 200
    task = ResearchTask.objects.get(id=holder["id"])
    assert (task.run_state, task.stage) == ("canceled", "canceled")
    assert sorted(task.checkpoint) == ["planner", "rounds", "spent"]
    assert task.checkpoint["planner"] == {"status": "ok", "output": PLAN}
    first_elapsed = task.checkpoint["spent"]["elapsed_ms"]
    assert first_elapsed >= 500 and task.elapsed_ms >= first_elapsed
    assert model.steps == ["planner", "judge"]

    def judge_after_resume() -> dict:
        from django.db import connection

        try:  # the resumed delivery shows the progress it resumes from
            holder["resumed_stage"] = ResearchTask.objects.get(id=holder["id"]).stage
        finally:
            connection.close()
        return JUDGEMENT

    model.answers["judge"] = judge_after_resume
    resumed = client.post(f"{TASKS}/{holder['id']}/resume")
    assert resumed.status_code == 202
    assert deliver(holder["id"]) == "completed"
    # One planner call; the judge again (its first answer never arrived); no third call left
    # for the supplemental planning: three model calls in all.
    assert model.steps == ["planner", "judge", "judge"]
    assert dify.count(LLM) == 3
    assert holder["resumed_stage"] == "retrieving"
    body = client.get(f"{TASKS}/{holder['id']}").json()
    metrics = body["result"]["metrics"]
    assert body["stage"] == "completed" and metrics["research_path"] == "reasoning"
    assert metrics["research_model_calls"] == 3 and metrics["research_model_calls_reused"] == 1
    assert metrics["research_model_calls_abandoned"] == 1
    assert metrics["budget_exhausted"] == "model_calls" and metrics["research_rounds"] == 1
    assert metrics["research_coverage"]["missing"] == ["train booking"]
    assert len(body["result"]["items"]) == 3
    # The elapsed total covers both deliveries.
    assert metrics["research_elapsed_ms"] > first_elapsed
    assert body["elapsed_ms"] >= metrics["research_elapsed_ms"] - 50
    assert body["progress"]["model_calls_spent"] == 3
    assert body["progress"]["checkpoint_steps"] == ["judge", "planner"]
    stored = ResearchTask.objects.get(id=holder["id"]).checkpoint
    assert stored["spent"]["model_calls"] == 3
    partials = client.get(f"{TASKS}/{holder['id']}/partials").json()["results"]
    # Round one was recorded by the first delivery; the resumed run redid it in place.
    assert [(p["sequence"], p["kind"]) for p in partials] == [(1, "round"), (2, "final")]


@pytest.mark.django_db(transaction=True)
def test_a_supplemental_round_gives_two_round_partials_then_the_final(dify, client, principal):
    space = reasoned_space(client, principal, dify)
    model = dify.llm_responder = ScriptedModel(
        planner=PLAN, judge=JUDGEMENT, supplemental=SUPPLEMENT
    )
    created = post(client, {"space_id": str(space.id), "query": QUESTION, "top_k": 3})
    assert created.status_code == 202
    task_id = created.json()["id"]
    assert deliver(task_id) == "completed"
    assert model.steps == ["planner", "judge", "supplemental"]
    body = client.get(f"{TASKS}/{task_id}").json()
    partials = client.get(f"{TASKS}/{task_id}/partials").json()["results"]
    assert [(p["sequence"], p["kind"]) for p in partials] == [
        (1, "round"),
        (2, "round"),
        (3, "final"),
    ]
    first, second, final = (p["evidence_bundle"] for p in partials)
    assert first["metrics"]["research_round"] == 1 and second["metrics"]["research_round"] == 2
    assert first["metrics"]["queries"] == [QUESTION, *PLAN["sub_queries"]]
    assert second["metrics"]["queries"] == [QUESTION, *PLAN["sub_queries"], SUPPLEMENT["query"]]
    assert first["metrics"]["research_model_calls"] == 1
    assert second["metrics"]["research_model_calls"] == 3
    assert len(first["items"]) == 3 and all(i["citation"]["filename"] for i in first["items"])
    assert second["items"] == final["items"] == body["result"]["items"]
    # The supplemental query (book trains) brought in the travel rule.
    assert "travel.md" in {i["citation"]["filename"] for i in second["items"]}
    assert final["metrics"]["research_rounds"] == 2


@pytest.mark.django_db(transaction=True)
def test_a_short_timeout_completes_with_budget_exhausted_and_the_evidence(dify, client, principal):
    space = reasoned_space(client, principal, dify)
    model = dify.llm_responder = ScriptedModel(
        planner=PLAN, judge=JUDGEMENT, supplemental=SUPPLEMENT
    )
    created = post(client, {"space_id": str(space.id), "query": QUESTION, "top_k": 3})
    assert created.status_code == 202
    task_id = created.json()["id"]
    # A 2 s limit (set on the row: admission asks for the configured 60 s a call may take). The
    # planner answers after 1.2 s, leaving less than the 1 s a call needs: no judge is asked.
    ResearchTask.objects.filter(id=task_id).update(
        limits={"max_model_calls": 3, "timeout_ms": 2000}
    )
    dify.delay(1.2, route=LLM)
    assert deliver(task_id) == "completed"
    assert model.steps == ["planner"]
    body = client.get(f"{TASKS}/{task_id}").json()
    assert (body["stage"], body["error"]) == ("completed", None)
    metrics = body["result"]["metrics"]
    assert (metrics["budget_exhausted"], metrics["degraded"]) == ("wall_clock", False)
    assert metrics["research_path"] == "reasoning" and metrics["research_model_calls"] == 1
    items = body["result"]["items"]
    assert len(items) == 3 and {"leave.md", "expenses.md"} <= {
        i["citation"]["filename"] for i in items
    }
    kinds = [p["kind"] for p in client.get(f"{TASKS}/{task_id}/partials").json()["results"]]
    assert kinds == ["round", "final"]
    # The task's max_model_calls reaches Research too: with one call, only the planner.
    model.steps.clear()
    again = post(client, {"space_id": str(space.id), "query": QUESTION, "top_k": 3})
    ResearchTask.objects.filter(id=again.json()["id"]).update(
        limits={"max_model_calls": 1, "timeout_ms": 180000}
    )
    assert deliver(again.json()["id"]) == "completed"
    assert model.steps == ["planner"]
    metrics = client.get(f"{TASKS}/{again.json()['id']}").json()["result"]["metrics"]
    assert (metrics["budget_exhausted"], metrics["research_model_calls"]) == ("model_calls", 1)


# --- recovery ------------------------------------------------------------------------------------


def test_the_sweep_takes_back_a_killed_delivery_and_caps_attempts(
    client, corpus, django_capture_on_commit_callbacks
):
    created = create(client, corpus, django_capture_on_commit_callbacks)
    task_id = created["id"]
    stale = timedelta(seconds=settings.KNOWLEDGE_RESEARCH_TASK_STALE_SECONDS + 1)
    for attempt in range(1, settings.KNOWLEDGE_RESEARCH_TASK_MAX_ATTEMPTS + 1):
        task = ResearchTask.objects.get(id=task_id)
        assert dispatch.begin(task.id, task.task_id) is not None  # a worker starts, then dies
        killed = task.task_id
        assert dispatch.sweep().as_dict() == {  # not stale yet: left alone
            "undelivered_reclaimed": 0,
            "stale_requeued": 0,
            "attempts_exhausted": 0,
            "dispatched": 0,
        }
        report = dispatch.sweep(now=timezone.now() + stale)
        task = ResearchTask.objects.get(id=task_id)
        assert task.attempt_count == attempt
        if attempt < settings.KNOWLEDGE_RESEARCH_TASK_MAX_ATTEMPTS:
            assert (report.stale_requeued, report.dispatched) == (1, 1)
            assert task.run_state == "queued" and task.task_id not in (None, killed)
            # The killed worker's late writes are fenced off.
            assert tasks.run_research_task(task_id, killed) == "stale"
    assert report.attempts_exhausted == 1
    body = client.get(f"{TASKS}/{task_id}").json()
    assert (body["stage"], body["error"]["code"]) == ("failed", "attempts_exhausted")
    assert "started 3 times" in body["error"]["message"]
    # Resume gives it a fresh set of attempts; it runs to the end.
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(f"{TASKS}/{task_id}/resume").status_code == 202
    assert deliver(task_id) == "completed"
    assert ResearchTask.objects.get(id=task_id).attempt_count == 1


def test_the_sweep_redelivers_a_claim_never_delivered_and_dispatches_unclaimed_tasks(
    client, corpus
):
    created = post(client, {"space_id": str(corpus.id), "query": "bread"})  # no on-commit run
    task = ResearchTask.objects.get(id=created.json()["id"])
    assert task.task_id is None
    later = timezone.now() + timedelta(seconds=dispatch.UNCLAIMED_SETTLE_SECONDS + 1)
    assert dispatch.sweep(now=later).dispatched == 1
    claimed = ResearchTask.objects.get(id=task.id).task_id
    assert claimed
    grace = timedelta(seconds=settings.KNOWLEDGE_RESEARCH_TASK_DISPATCH_GRACE_SECONDS + 1)
    report = dispatch.sweep(now=timezone.now() + grace)
    assert (report.undelivered_reclaimed, report.dispatched) == (1, 1)
    fresh = ResearchTask.objects.get(id=task.id).task_id
    assert fresh and fresh != claimed
    assert tasks.run_research_task(str(task.id), claimed) == "stale"
    assert tasks.run_research_task(str(task.id), fresh) == "completed"


def test_the_sweep_schedule_exists_after_migrating():
    from django_q.models import Schedule

    schedule = Schedule.objects.get(name=dispatch.SWEEP_SCHEDULE)
    assert (schedule.func, schedule.minutes, schedule.repeats) == (dispatch.SWEEP_TASK, 1, -1)
    assert dispatch.ensure_sweep_schedule().pk == schedule.pk
    schedule.delete()
    call_command("kfs", "schedules")
    assert (
        Schedule.objects.filter(name=dispatch.SWEEP_SCHEDULE, func=dispatch.SWEEP_TASK).count() == 1
    )


# --- isolation and pagination --------------------------------------------------------------------


def test_another_tenant_or_another_key_gets_404(client, corpus, django_capture_on_commit_callbacks):
    created = create(client, corpus, django_capture_on_commit_callbacks)
    b_space = create_space(Principal(tenant_id="tenant-b"), name="B")
    outsiders = []
    for tenant in ("tenant-b", "tenant-a"):
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key(tenant)[1]}")
        outsiders.append(api)
    for api in outsiders:
        for method, suffix in (
            ("get", ""),
            ("delete", ""),
            ("get", "/partials"),
            ("post", "/resume"),
        ):
            response = getattr(api, method)(f"{TASKS}/{created['id']}{suffix}")
            assert response.status_code == 404, (method, suffix, response.content)
            assert response.json()["code"] == "research_task_not_found"
    assert outsiders[0].get(f"{SPACES}/{corpus.id}/research-tasks").status_code == 404
    assert outsiders[1].get(f"{SPACES}/{corpus.id}/research-tasks").json()["results"] == []
    assert outsiders[0].get(f"{SPACES}/{b_space.id}/research-tasks").json()["results"] == []
    missing = client.get(f"{TASKS}/{uuid.uuid4()}")
    assert missing.status_code == 404 and missing.json()["code"] == "research_task_not_found"
    assert ResearchTask.objects.get(id=created["id"]).run_state == "queued"  # nothing changed


def test_lists_and_partials_are_paginated(client, corpus, django_capture_on_commit_callbacks):
    ids = [create(client, corpus, django_capture_on_commit_callbacks)["id"] for _ in range(3)]
    url = f"{SPACES}/{corpus.id}/research-tasks?limit=2"
    first = client.get(url).json()
    assert [t["id"] for t in first["results"]] == ids[::-1][:2]  # newest first
    assert "result" not in first["results"][0] and first["results"][0]["stage"] == "queued"
    second = client.get(first["next"]).json()
    assert [t["id"] for t in second["results"]] == [ids[0]] and second["next"] is None
    assert deliver(ids[0]) == "completed"  # a round partial, then the final one
    runner._add_partial(ids[0], "round", {"items": [], "metrics": {"round": 9}})
    page = client.get(f"{TASKS}/{ids[0]}/partials?limit=2").json()
    assert [(p["sequence"], p["kind"]) for p in page["results"]] == [(1, "round"), (2, "final")]
    rest = client.get(page["next"]).json()
    assert [(p["sequence"], p["kind"]) for p in rest["results"]] == [(3, "round")]
    assert rest["next"] is None
    bad = client.get(f"{TASKS}/{ids[0]}/partials?cursor=bogus")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_cursor"
    assert ResearchTaskPartial.objects.filter(task_id=ids[0]).count() == 3


def test_round_evidence_in_a_checkpoint_becomes_round_partials(
    client, corpus, django_capture_on_commit_callbacks
):
    created = create(client, corpus, django_capture_on_commit_callbacks)
    task = ResearchTask.objects.get(id=created["id"])
    running = dispatch.begin(task.id, task.task_id)
    delivery = runner._Delivery(running, task.task_id)
    round_one = {"items": [{"node_id": "n1"}], "metrics": {"round": 1}}
    delivery.save_checkpoint({"planner": {"status": "ok", "output": PLAN}, "rounds": [round_one]})
    delivery.save_checkpoint(
        {"planner": {"status": "ok", "output": PLAN}, "judge": {}, "rounds": [round_one]}
    )
    stored = ResearchTask.objects.get(id=task.id)
    assert stored.stage == "analyzing"
    assert list(stored.partials.values_list("sequence", "kind", "evidence")) == [
        (1, "round", round_one)
    ]


def test_the_profile_threshold_and_top_k_are_frozen_at_creation(
    client, corpus, django_capture_on_commit_callbacks, settings
):
    from spaces.models import SpaceProfile

    # Fused scores without a reranker: absolute (calibrated), at most 1.
    settings.KNOWLEDGE_LOCAL_RERANK_ENABLED = False
    url = f"{SPACES}/{corpus.id}/retrieval-profile"
    # A profile stored before a threshold needed rerank in every mode (PUT now refuses a
    # threshold without a Dify reranker).
    SpaceProfile.objects.filter(space=corpus).update(
        retrieval_default_mode="research", retrieval_score_threshold=0.5, retrieval_top_k=2
    )
    created = create(client, corpus, django_capture_on_commit_callbacks)
    assert (created["top_k"], created["score_threshold"]) == (2, 0.5)
    later = {"default_mode": "research", "score_threshold": None}
    assert client.put(url, later, format="json").status_code == 200
    assert deliver(created["id"]) == "completed"
    result = client.get(f"{TASKS}/{created['id']}").json()["result"]
    # The frozen 0.5 applies (the profile's threshold now is off): every item reaches it and
    # candidates below it were filtered.
    assert len(result["items"]) <= 2 and all(i["score"] >= 0.5 for i in result["items"])
    assert result["metrics"]["threshold_filtered_candidates"] >= 1


def test_capability_tokens_reach_only_their_subjects_tasks(settings, corpus):
    from knowledgefs.testing import capability as cap

    settings.KNOWLEDGE_FS_CAPABILITY_V2_ENABLED = True
    settings.KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS = cap.jwks_text("current")

    def caller(action: str, resource: dict, subject: str) -> APIClient:
        api = APIClient()
        token = cap.token(action=action, resource=resource, sub=subject, actor=subject)
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        return api

    alice, bob = "dify-service-api:alice", "dify-service-api:bob"
    space_resource = cap.space_resource(corpus.id)
    created = post(
        caller("research_tasks.create", space_resource, alice),
        {"space_id": str(corpus.id), "query": "bread"},
    )
    assert created.status_code == 202, created.content
    task_id = created.json()["id"]
    task = ResearchTask.objects.get(id=task_id)
    assert task.owner.startswith("cap:") and task.caller_kind == "service"
    resource = cap.child_resource("research_task", task_id, corpus.id)
    mine = caller("research_tasks.read", resource, alice).get(f"{TASKS}/{task_id}")
    assert mine.status_code == 200 and mine.json()["id"] == task_id
    theirs = caller("research_tasks.read", resource, bob).get(f"{TASKS}/{task_id}")
    assert theirs.status_code == 404 and theirs.json()["code"] == "research_task_not_found"
    # The token's action must be the route's.
    wrong = caller("research_tasks.read", resource, alice).delete(f"{TASKS}/{task_id}")
    assert wrong.status_code == 403 and wrong.json()["code"] == "action_not_permitted"
    cancel = caller("research_tasks.cancel", resource, alice).delete(f"{TASKS}/{task_id}")
    assert cancel.status_code == 200 and cancel.json()["stage"] == "canceled"


# --- admin ---------------------------------------------------------------------------------------


def test_admin_lists_tasks_and_cancels_and_resumes(
    admin_client, client, corpus, django_capture_on_commit_callbacks
):
    created = create(client, corpus, django_capture_on_commit_callbacks)
    listing = admin_client.get("/admin/retrieval/researchtask/")
    assert listing.status_code == 200 and b"rockets vs bread" in listing.content
    detail = admin_client.get(f"/admin/retrieval/researchtask/{created['id']}/change/")
    assert detail.status_code == 200 and b'name="_save"' not in detail.content
    for action, state in (("cancel_tasks", "canceled"), ("resume_tasks", "queued")):
        with django_capture_on_commit_callbacks(execute=True):
            response = admin_client.post(
                "/admin/retrieval/researchtask/",
                {"action": action, "_selected_action": [created["id"]]},
            )
        assert response.status_code == 302
        assert ResearchTask.objects.get(id=created["id"]).run_state == state
    assert admin_client.get("/admin/retrieval/researchtask/add/").status_code == 403
