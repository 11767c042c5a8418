"""Auto mode: one routing call to the space's reasoning model picks a concrete mode; every
failure falls back to the space's default mode, and the route says so.

The reasoning model is scripted on the Dify contract server
(``knowledgefs/testing/dify_server.py``); the requests, the timeouts and the failures are real HTTP.
"""

from __future__ import annotations

import json

import pytest

from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import LLM
from retrieval.auto import resolve_mode
from retrieval.modes import retrieve
from retrieval.tests.test_research import (
    PLAN,
    SPACES,
    ScriptedModel,
    assert_bounded_calls,
    dify,  # noqa: F401 - a fixture
    load,
    reasoned_space,
)
from spaces.profiles import profile_of

pytestmark = pytest.mark.django_db

dify_server = dify_fixtures.dify_server
QUESTION = "How many days of annual leave do employees get?"


def ask(client, space, query=QUESTION, **options):
    """``retrieve(mode="auto")`` as JSON (a retrieval test runs one concrete mode, so Auto is
    reached through the service every query route shares)."""
    return json.loads(json.dumps(retrieve(space, query, mode="auto", **options).as_dict()))


def set_default_mode(client, space, mode: str) -> None:
    body = {"reasoning_model": profile_of(space).retrieval_reasoning_model, "default_mode": mode}
    url = f"{SPACES}/{space.id}"
    assert client.put(f"{url}/retrieval-profile", body, format="json").status_code == 200
    assert client.post(f"{url}/profile-validation").json()["readiness"]["state"] == "ready"


@pytest.mark.parametrize("mode", ["fast", "deep", "research"])
def test_auto_runs_the_mode_the_model_picks(dify, client, principal, mode):  # noqa: F811
    space = reasoned_space(client, principal, dify)
    model = dify.llm_responder = ScriptedModel(route={"mode": mode}, planner=PLAN)
    body = ask(client, space, top_k=2)
    assert body["mode"] == mode
    assert body["route"] == {
        "requested_mode": "auto",
        "resolved_mode": mode,
        "resolver": "llm",
        "degraded": False,
        "error": None,
        "prompt_version": "kfs-reasoning-v1",
        "duration_ms": body["route"]["duration_ms"],
    }
    assert body["route"]["duration_ms"] > 0
    # One routing call (plus Research's own planner call), no tools, the bounded output.
    assert model.steps() == ["route"] + (["planner"] if mode == "research" else [])
    assert_bounded_calls(dify, 2 if mode == "research" else 1)
    _, system, user = model.prompts[0]
    assert user == f"Question:\n{QUESTION}"
    assert '"mode": "fast" or "deep" or "research"' in system
    assert {i["citation"]["filename"] for i in body["items"]} >= {"leave.md"}
    route_stage = body["stages"][0]
    assert (route_stage["name"], route_stage["status"]) == ("route", "executed")


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ("research", "reasoning_invalid_output"),
        (json.dumps({"mode": "auto"}), "reasoning_invalid_output"),
        (json.dumps({"mode": "warp"}), "reasoning_invalid_output"),
        (json.dumps({"mode": "research", "reason": "complex"}), "reasoning_invalid_output"),
        (json.dumps({"mode": ["research"]}), "reasoning_invalid_output"),
        ("timeout", "reasoning_timeout"),
        ("provider", "reasoning_provider_error"),
    ],
)
def test_every_routing_failure_falls_back_to_the_default_mode_recorded(
    dify,  # noqa: F811
    client,
    principal,
    settings,
    answer,
    error,
):
    space = reasoned_space(client, principal, dify)
    set_default_mode(client, space, "deep")
    dify.reset_observations()
    dify.llm_responder = ScriptedModel(route=answer)
    if answer == "timeout":
        settings.KNOWLEDGE_RESEARCH_REASONING_TIMEOUT_MS = 300
        dify.delay(3, route=LLM)
    if answer == "provider":
        dify.fail_next(1, status=400, route=LLM)
    body = ask(client, space)
    assert body["mode"] == "deep"
    route = body["route"]
    assert (route["resolved_mode"], route["resolver"]) == ("deep", "fallback")
    assert (route["degraded"], route["error"]) == (True, error)
    assert dify.count(LLM) == 1  # one routing attempt, never a second
    assert body["items"]


def test_without_a_reasoning_model_auto_uses_the_default_with_no_call(client, space):
    # The embedded default: the local runtime, no reasoning model, no network at all.
    load(space)
    body = ask(client, space)
    assert body["mode"] == "fast"
    assert body["route"]["resolver"] == "fallback"
    assert (body["route"]["degraded"], body["route"]["error"]) == (False, "no_reasoning_model")
    assert body["items"][0]["citation"]["filename"] == "leave.md"


def test_explicit_and_omitted_modes_make_no_routing_call(dify, client, principal):  # noqa: F811
    space = reasoned_space(client, principal, dify)
    dify.llm_responder = ScriptedModel(route={"mode": "research"})
    url = f"{SPACES}/{space.id}/retrieval-tests"
    for body in ({"query": QUESTION}, {"query": QUESTION, "mode": "fast"}):
        answer = client.post(url, body, format="json").json()
        assert answer["mode"] == "fast" and "route" not in answer
    assert dify.count(LLM) == 0


def test_a_default_mode_of_auto_falls_back_to_fast(space):
    profile = profile_of(space)
    profile.retrieval_default_mode = "auto"  # not accepted by the API; older rows may hold it
    mode, route = resolve_mode(space, profile, QUESTION)
    assert (mode, route["resolved_mode"], route["resolver"]) == ("fast", "fast", "fallback")


def test_kfs_query_runs_research_and_auto(space, tenant):
    from io import StringIO

    from django.core.management import call_command

    load(space)

    def kfs(*args: str) -> dict:
        out = StringIO()
        call_command("kfs", "query", *args, "--space", space.slug, "--tenant", tenant, "--json",
                     stdout=out)  # fmt: skip
        return json.loads(out.getvalue())

    research = kfs("rockets vs bread", "--mode", "research", "--top-k", "2")
    assert research["mode"] == "research"
    assert research["metrics"]["research_path"] == "deterministic"
    assert {i["citation"]["filename"] for i in research["items"]} == {"rockets.txt", "bread.txt"}
    auto = kfs(QUESTION, "--mode", "auto")
    assert auto["mode"] == "fast" and auto["route"]["error"] == "no_reasoning_model"
