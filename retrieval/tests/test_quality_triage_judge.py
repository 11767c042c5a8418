"""Triage's reasoning-model judge (docs/quality.md, "Triage") on the Dify contract server
(``knowledgefs/testing/dify_server.py``): a space whose retrieval profile names a reasoning
model asks it for a strict-JSON verdict per failed query, combined with the keyword and title
signals leaning to ``uncertain``; a malformed answer, a timeout or an outage falls back to the
other signals with the reason recorded. Real database, real triage run, real HTTP model calls."""

from __future__ import annotations

import json
import re
import time

import pytest

from ingestion.documents import admit_document
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import LLM, TEST_INNER_KEY
from knowledgefs.testing.fixtures import compile_all
from knowledgefs.testing.research_script import REASONER
from retrieval.models import FailedQuery, TriageRun
from retrieval.quality import capture, triage_runs
from retrieval.quality.triage_judge import combine
from spaces.services import create_space

pytestmark = pytest.mark.django_db

dify_server = dify_fixtures.dify_server

SPACES = "/v1/knowledge-spaces"
OPENAI = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "text-embedding-3-small"}
LEAVE = (
    "# Leave policy\n\nEvery employee gets 25 days of annual leave per year. Unused leave days "
    "expire at the end of March."
)
MISS = "When do unused annual leave days expire?"  # keyword signals: retrieval-miss
GAP = "How is parental leave paid?"  # keyword signals: coverage-gap
ELSEWHERE = "Which volcano erupted in Iceland?"  # keyword signals: irrelevant
QUESTION = re.compile(r"^Question: (.*)$", re.M)


class Judge:
    """The reasoning model on the contract server: answers triage prompts from ``answers``
    (question → a dict sent as JSON, or a raw string); other prompts (the profile's preflight
    probe) get the server's fixed answer. Records every triage prompt."""

    def __init__(self, answers: dict) -> None:
        self.answers = answers
        self.prompts: list[dict] = []

    def __call__(self, body: dict) -> str | None:
        system = body["prompt_messages"][0]["content"]
        if not system.startswith("You triage"):
            return None
        user = body["prompt_messages"][-1]["content"]
        self.prompts.append({"system": system, "user": user, "body": body})
        answer = self.answers[QUESTION.search(user).group(1)]
        return answer if isinstance(answer, str) else json.dumps(answer)


@pytest.fixture
def dify(settings, dify_server):
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    dify_server.dimension = 48
    return dify_server


@pytest.fixture
def reasoned(client, principal, dify):
    """A Dify space holding the leave policy, with a validated reasoning model."""
    space = create_space(principal, name="Judged")
    url = f"{SPACES}/{space.id}"
    assert client.put(f"{url}/embedding-profile", OPENAI, format="json").status_code == 200
    admit_document(space, filename="leave-policy.md", data=LEAVE.encode(), enqueue=False)
    compile_all()
    body = {"reasoning_model": REASONER}
    assert client.put(f"{url}/retrieval-profile", body, format="json").status_code == 200
    ready = client.post(f"{url}/profile-validation").json()
    assert ready["readiness"]["state"] == "ready", ready
    dify.reset_observations()
    return space


def failed(space, query: str) -> FailedQuery:
    import hashlib
    import uuid

    return capture.store(
        {"tenant_id": space.tenant_id, "space_id": space.id, "trace_id": uuid.uuid4(),
         "trigger": "low-confidence", "requester_kind": "api_key", "requester": "key:x",
         "query": query, "query_sha256": hashlib.sha256(query.encode()).hexdigest()}
    )  # fmt: skip


def triage(client, space, capture_callbacks) -> dict:
    with capture_callbacks(execute=True):
        created = client.post(f"{SPACES}/{space.id}/failed-queries/triage", {}, format="json")
    assert created.status_code == 202, created.content
    run = TriageRun.objects.get(id=created.json()["id"])
    assert triage_runs.run_delivery(str(run.id), run.task_id) == "finished"
    return client.get(f"{SPACES}/{space.id}/failed-queries/triage-runs/{run.id}").json()


def labelled(row) -> FailedQuery:
    return FailedQuery.objects.get(id=row.id)


def test_the_judge_is_one_more_signal_leaning_to_uncertain(
    reasoned, dify, client, django_capture_on_commit_callbacks
):
    dify.llm_responder = judge = Judge({
        MISS: {"verdict": "retrieval-miss", "reason": "the policy states when days expire"},
        GAP: {"verdict": "retrieval-miss", "reason": "leave is covered"},
        ELSEWHERE: {"verdict": "irrelevant", "reason": "volcanoes are not about leave"},
    })  # fmt: skip
    rows = {q: failed(reasoned, q) for q in (MISS, GAP, ELSEWHERE)}
    run = triage(client, reasoned, django_capture_on_commit_callbacks)
    assert run["state"] == "succeeded" and run["summary"]["triaged"] == 3
    miss, gap, elsewhere = (labelled(rows[q]) for q in (MISS, GAP, ELSEWHERE))
    # agreement keeps the verdict
    assert (miss.verdict, miss.status) == ("retrieval-miss", "pending-annotation")
    assert miss.triage_signals["judge"] == {
        "model": miss.triage_signals["judge"]["model"], "verdict": "retrieval-miss",
        "reason": "the policy states when days expire",
        "duration_ms": miss.triage_signals["judge"]["duration_ms"],
    }  # fmt: skip
    assert miss.triage_signals["combined"] == "agree"
    assert "gpt-4.1-mini" in miss.triage_signals["judge"]["model"]
    # the keywords say coverage gap, the model says retrieval miss: uncertain
    assert (gap.verdict, gap.status) == ("uncertain", "triaged")
    assert gap.triage_signals["signals_verdict"] == "coverage-gap"
    assert gap.triage_signals["combined"] == "disagree"
    assert (elsewhere.verdict, elsewhere.status) == ("irrelevant", "dismissed")
    # one bounded, tool-less call per row, the question given, the document as untrusted data
    calls = dify.calls(LLM)
    assert len(calls) == 3 and len(judge.prompts) == 3
    for call in calls:
        assert call.body["tools"] == []
    prompt = next(p for p in judge.prompts if MISS in p["user"])
    assert (
        '"verdict": "retrieval-miss" or "coverage-gap" or "irrelevant" or "uncertain"'
        in (prompt["system"])
    )
    assert re.search(r"<<<UNTRUSTED DATA \w+>>>\n.*leave-policy\.md.*Unused leave days",
                     prompt["user"], re.S)  # fmt: skip


def test_the_model_decides_where_keywords_abstain_but_never_dismisses_alone():
    assert combine("uncertain", "coverage-gap") == ("coverage-gap", "model-decides")
    assert combine("uncertain", "irrelevant") == ("uncertain", "model-alone-never-dismisses")
    assert combine("retrieval-miss", "uncertain") == ("retrieval-miss", "signals-decide")
    assert combine("irrelevant", "coverage-gap") == ("uncertain", "disagree")
    assert combine("coverage-gap", None) == ("coverage-gap", "signals-only")


@pytest.mark.parametrize(
    "answer",
    [
        "The question is a retrieval miss.",  # prose, not JSON
        '{"verdict": "retrieval-miss"}',  # no reason
        '{"verdict": "miss", "reason": "x"}',  # not a verdict
        '{"verdict": "irrelevant", "reason": "x", "confidence": 0.9}',  # a key outside
        '{"verdict": "irrelevant", "reason": "x"',  # cut off
    ],
)
def test_a_malformed_answer_falls_back_to_the_keyword_signals(
    reasoned, dify, client, django_capture_on_commit_callbacks, answer
):
    dify.llm_responder = Judge({GAP: answer})
    row = failed(reasoned, GAP)
    run = triage(client, reasoned, django_capture_on_commit_callbacks)
    assert run["state"] == "succeeded" and run["summary"]["verdicts"]["coverage-gap"] == 1
    row = labelled(row)
    assert (row.verdict, row.status) == ("coverage-gap", "pending-annotation")
    judged = row.triage_signals["judge"]
    assert judged["verdict"] is None and judged["error"] == "reasoning_invalid_output"
    assert "labelled by the keyword and title signals" in judged["reason"]
    assert row.triage_signals["combined"] == "signals-only"


def test_a_timeout_or_an_outage_falls_back_within_the_bound(
    reasoned, dify, client, settings, django_capture_on_commit_callbacks
):
    settings.KNOWLEDGE_QUALITY_TRIAGE_JUDGE_TIMEOUT_MS = 1000
    dify.llm_responder = Judge({q: {"verdict": "irrelevant", "reason": "x"} for q in (MISS, GAP)})
    dify.delay(6, route=LLM, times=None)  # every call hangs far past the deadline
    slow = failed(reasoned, MISS)
    started = time.monotonic()
    triage(client, reasoned, django_capture_on_commit_callbacks)
    assert time.monotonic() - started < 5  # generous: the bound is one second
    slow = labelled(slow)
    assert (slow.verdict, slow.status) == ("retrieval-miss", "pending-annotation")
    assert slow.triage_signals["judge"]["error"] == "reasoning_timeout"
    assert "1000 ms deadline" in slow.triage_signals["judge"]["reason"]
    # an outage (503 on every attempt) is recorded the same way
    dify.clear_faults()
    dify.fail_next(20, status=503, route=LLM)
    down = failed(reasoned, GAP)
    triage(client, reasoned, django_capture_on_commit_callbacks)
    down = labelled(down)
    assert (down.verdict, down.status) == ("coverage-gap", "pending-annotation")
    assert down.triage_signals["judge"]["error"] == "reasoning_provider_error"


def test_a_space_without_a_reasoning_model_asks_no_model(
    space, client, django_capture_on_commit_callbacks
):
    admit_document(space, filename="leave-policy.md", data=LEAVE.encode(), enqueue=False)
    compile_all()
    row = failed(space, MISS)
    triage(client, space, django_capture_on_commit_callbacks)
    row = labelled(row)
    assert row.verdict == "retrieval-miss" and "judge" not in row.triage_signals
