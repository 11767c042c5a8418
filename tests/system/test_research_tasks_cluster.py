"""Research tasks on a real django-q2 cluster (ORM broker): created over HTTP, run by the
cluster's workers to ``completed``; and a task canceled while its judge call is in flight,
resumed, and finished without a second planner call (the reasoning model is the Dify contract
server's scripted LLM, reached by the workers over loopback HTTP)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.db import connections
from django_q.brokers import get_broker
from django_q.cluster import Cluster

from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import LLM, TEST_INNER_KEY
from knowledgefs.testing.research_script import JUDGEMENT, PLAN, QUESTION, SUPPLEMENT, step_of
from retrieval.tests.test_research_tasks import TASKS, load, reasoned_space

pytestmark = pytest.mark.django_db(transaction=True)

dify_server = dify_fixtures.dify_server
FINISHED = ("completed", "failed", "canceled")


def _start_cluster():
    # The cluster forks its workers from this process: close our connections first so that no
    # child inherits a socket the test uses (see tests/system/test_e2e_cluster.py).
    connections.close_all()
    running = Cluster(get_broker())
    running.start()
    return running


def _wait(client, task_id: str, until, seconds: float = 90) -> dict:
    deadline = time.monotonic() + seconds
    body: dict = {}
    while time.monotonic() < deadline:
        body = client.get(f"{TASKS}/{task_id}").json()
        if until(body):
            return body
        time.sleep(0.2)
    raise AssertionError(f"research task {task_id} did not get there in {seconds}s: {body}")


def test_the_cluster_runs_a_task_to_completed(client, space):
    load(space)
    cluster = _start_cluster()
    try:
        created = client.post(
            TASKS,
            {"space_id": str(space.id), "query": "rockets vs bread", "top_k": 2},
            format="json",
        )
        assert created.status_code == 202
        body = _wait(client, created.json()["id"], lambda b: b["status"] in FINISHED)
    finally:
        cluster.stop()
    assert (body["stage"], body["status"], body["error"]) == ("completed", "completed", None)
    assert {i["citation"]["filename"] for i in body["result"]["items"]} == {
        "rockets.txt",
        "bread.txt",
    }
    assert body["result"]["metrics"]["research_policy"] == "durable"
    assert body["progress"]["attempts"] == 1


@pytest.fixture
def dify(settings, dify_server):
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    dify_server.dimension = 48
    return dify_server


class GatedModel:
    """The scripted reasoning model; the judge's answer waits until ``release`` is set, so the
    test can cancel while that call is in flight. Counts the steps asked."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.judging = threading.Event()
        self.release = threading.Event()
        self.gate_judge = True

    def __call__(self, body: dict) -> str | None:
        system = body["prompt_messages"][0]["content"]
        step = step_of(system)
        if step is None:
            return None
        self.steps.append(step)
        if step == "judge" and self.gate_judge:
            self.judging.set()
            self.release.wait(30)
        return json.dumps({"planner": PLAN, "judge": JUDGEMENT, "supplemental": SUPPLEMENT}[step])


def test_cancel_while_running_and_resume_on_the_cluster(dify, client, principal):
    space = reasoned_space(client, principal, dify)
    model = dify.llm_responder = GatedModel()
    cluster = _start_cluster()
    try:
        created = client.post(
            TASKS, {"space_id": str(space.id), "query": QUESTION, "top_k": 3}, format="json"
        )
        task_id = created.json()["id"]
        assert model.judging.wait(60), "the worker never reached the judge"
        running = client.get(f"{TASKS}/{task_id}").json()
        assert running["status"] == "running" and running["stage"] == "retrieving"
        assert running["progress"]["checkpoint_steps"] == ["planner"]
        canceled = client.delete(f"{TASKS}/{task_id}")
        assert canceled.status_code == 200 and canceled.json()["stage"] == "canceled"
        model.release.set()  # the judge answers; the worker may not save it
        time.sleep(1.5)
        after = client.get(f"{TASKS}/{task_id}").json()
        assert after["stage"] == "canceled" and after["progress"]["checkpoint_steps"] == ["planner"]
        assert model.steps == ["planner", "judge"]
        model.gate_judge = False
        assert client.post(f"{TASKS}/{task_id}/resume").status_code == 202
        body = _wait(client, task_id, lambda b: b["status"] in FINISHED)
    finally:
        cluster.stop()
    assert body["stage"] == "completed", body
    # One planner call; the canceled judge call stays charged, so the resumed run asks the
    # judge again and has no call left for the supplemental planning: 3 calls in all.
    assert model.steps == ["planner", "judge", "judge"]
    assert dify.count(LLM) == 3
    metrics = body["result"]["metrics"]
    assert metrics["research_model_calls"] == 3 and metrics["research_model_calls_reused"] == 1
    assert metrics["research_model_calls_abandoned"] == 1
    assert metrics["budget_exhausted"] == "model_calls"
    assert body["progress"]["resumes"] == 1
