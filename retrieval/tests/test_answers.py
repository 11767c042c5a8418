"""Cited answers: token approximation, packing, conflicts, answerability, citation normalisation,
extractive answers on the embedded default, LLM answers through the Dify contract server, answer
traces, the JSON errors before a stream, and ``kfs answer``.

Everything is real: the database, the local embedding model, the services, the API (in process;
tests/system/test_answer_sse.py speaks HTTP to gunicorn) and the Dify clients talking HTTP to the
local contract server (``knowledgefs/testing/dify_server.py``) whose scripted LLM answers what a
test says.
"""

from __future__ import annotations

import json
import math
import uuid
from io import StringIO
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from ingestion.documents import admit_document
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import LLM, MODEL_CATALOG, TEST_INNER_KEY
from knowledgefs.testing.fixtures import compile_all
from retrieval import answers
from retrieval import evidence as ev
from retrieval.api import answers as answer_api
from retrieval.models import AnswerTrace
from spaces.api_keys import create_api_key
from spaces.services import Principal, create_space

dify_server = dify_fixtures.dify_server

LEAVE = (
    "# Leave\n\nEvery employee gets 25 days of annual leave per year. Unused leave days expire "
    "at the end of March. Requests go to your manager two weeks ahead."
)
EXPENSES = (
    "# Expenses\n\nSubmit travel receipts within thirty days of the trip. Hotels above 200 euros "
    "a night need written approval."
)
ROCKETS = "Rocket engines burn liquid oxygen and kerosene to produce thrust."
CJK = "年假为二十五天。员工须提前两周申请。报销须在三十天内提交。"
EMBEDDER = {
    "plugin_id": "langgenius/openai",
    "provider": "openai",
    "model": "text-embedding-3-small",
}
REASONER = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "gpt-4.1-mini"}
QUESTION = "How many days of annual leave does an employee get?"
STEPS = ["query.route", "query.embed", "query.retrieve", "query.answer", "query.generate"]


def item(node_id: str, text: str, score: float, filename: str = "f.txt"):
    """A retrieval item as :func:`retrieval.modes.retrieve` returns them."""
    return SimpleNamespace(
        node_id=node_id,
        text=text,
        score=score,
        scores={"final": score},
        citation={"document_id": f"doc-{node_id}", "filename": filename, "page_number": None,
                  "section_path": [], "start_offset": 0, "end_offset": len(text)},
    )  # fmt: skip


def open_window(tokens: int) -> ev.Window:
    return ev.Window(tokens, "setting", prompt_tokens=0, output_tokens=0, safety_tokens=0)


# --- token approximation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 0),
        ("hello world", 2),  # two runs of at most 8 characters
        ("abcdefgh", 1),  # 8 characters: still one token
        ("abcdefghi", 3),  # 9 characters: ceil(9 / 4)
        ("internationalization", 5),  # 20 characters: ceil(20 / 4)
        ("café crème", 2),  # accented Latin letters stay in their run
        ("Hello, 世界!", 5),  # Hello + "," + 世 + 界 + "!"
        ("年假为二十五天。", 8),  # each CJK grapheme and the full stop count 1
        ("ひらがな カタカナ 한국어", 11),
        ("e\u0301", 1),  # a combining accent belongs to its letter
        ("\U0001f468\u200d\U0001f469\u200d\U0001f467", 1),  # one ZWJ family emoji
        ("25 days", 2),
    ],
)
def test_token_approximation(text, tokens):
    assert ev.approx_tokens(text) == tokens


def test_the_window_is_split_into_prompt_output_safety_and_evidence(settings):
    settings.KNOWLEDGE_ANSWER_MAX_OUTPUT_TOKENS = 1024
    win = ev.window(8192, "Question: annual leave", source="catalog")
    assert win.as_dict() == {
        "context_tokens": 8192,
        "context_source": "catalog",
        "prompt_tokens": 4,  # Question + ":" + annual + leave
        "output_tokens": 1024,
        "safety_tokens": 409,  # 5 % of 8192
        "evidence_tokens": 8192 - 4 - 1024 - 409,
    }
    small = ev.window(2048, "q")
    assert small.output_tokens == 512  # never more than a quarter of the window
    assert small.safety_tokens == 102


# --- packing ---------------------------------------------------------------------------------


def test_packing_follows_score_order_and_reports_what_did_not_fit():
    items = [
        item("low", "short low", 0.2),
        item("best", "best item text", 0.9),
        item("huge", "word " * 400, 0.8),  # 400 tokens: over the budget
        item("mid", "middle item", 0.5),
    ]
    evidence = ev.from_retrieval(items, "item")
    bundle = ev.pack(evidence, open_window(60))
    assert [(i.node_id, i.label) for i in bundle.items] == [
        ("best", "[E1]"),
        ("mid", "[E2]"),
        ("low", "[E3]"),
    ]
    assert bundle.omitted == [
        {"node_id": "huge", "score": 0.8, "reason": "over_budget", "budget": "tokens"}
    ]
    assert bundle.used_tokens == sum(ev.approx_tokens(ev.entry_text(i)) for i in bundle.items)
    assert bundle.used_tokens <= 60
    assert ev.entry_text(bundle.items[0]) == "[E1] (f.txt)\nbest item text\n"


def test_packing_stops_at_128_items_and_200000_characters():
    many = [item(f"n{i:03d}", f"text {i}", 1 - i / 1000) for i in range(130)]
    bundle = ev.pack(ev.from_retrieval(many, "text"), open_window(10**6))
    assert len(bundle.items) == 128 and bundle.items[-1].label == "[E128]"
    assert [(o["node_id"], o["reason"]) for o in bundle.omitted] == [
        ("n128", "item_limit"),
        ("n129", "item_limit"),
    ]
    big = [item(f"b{i}", "x" * 90_000, 1 - i / 10) for i in range(3)]
    bundle = ev.pack(ev.from_retrieval(big, "x"), open_window(10**6))
    assert [i.node_id for i in bundle.items] == ["b0", "b1"]
    assert bundle.used_chars == 180_000
    assert bundle.omitted == [
        {"node_id": "b2", "score": 0.8, "reason": "over_budget", "budget": "characters"}
    ]


# --- conflicts and answerability --------------------------------------------------------------


def test_same_subject_numeric_disagreement_is_a_conflict():
    items = [
        item("a", "Every employee gets 25 days of annual leave per year.", 0.9),
        item("b", "Employees receive 20 days of annual leave each year.", 0.8),
        item("c", "Submit travel receipts within 30 days of the trip.", 0.7),
        item("d", "Every employee gets 25 days of annual leave, as agreed.", 0.6),
    ]
    evidence = ev.from_retrieval(items, QUESTION)
    conflicts = {
        e.node_id: [(c["with_node_id"], c["detail"]) for c in e.conflicts] for e in evidence
    }
    detail = "25 vs 20 day (annual, employee, leave)"
    assert conflicts == {
        "a": [("b", detail)],
        "b": [("a", detail), ("d", "20 vs 25 day (annual, employee, leave)")],
        "c": [],  # days of a trip, not of leave: shares no subject with the others
        "d": [("b", "20 vs 25 day (annual, employee, leave)")],
    }
    bundle = ev.assess(ev.pack(evidence, open_window(10_000)))
    assert bundle.answerability == "conflict"
    assert bundle.reasons == ["20 vs 25 day (annual, employee, leave)", detail]
    # Omitting the disagreeing item from the window removes the conflict from the answer.
    only = ev.assess(
        ev.pack(ev.from_retrieval(items[:1] + items[2:], QUESTION), open_window(10_000))
    )
    assert only.answerability == "answerable"


def test_answerability_rules(settings):
    settings.KNOWLEDGE_ANSWER_MIN_FINAL_SCORE = 0.5
    settings.KNOWLEDGE_ANSWER_MIN_ITEMS = 2
    win = open_window(10_000)
    nothing = ev.assess(ev.pack([], win))
    assert nothing.answerability == "not-enough-evidence"
    weak = ev.from_retrieval([item("a", "some text", 0.9), item("b", "more text", 0.3)], "text")
    partial = ev.assess(ev.pack(weak, win))
    assert partial.answerability == "partial"
    assert partial.reasons == ["1 items are related by meaning; 2 needed"]
    strong = ev.from_retrieval([item("a", "some text", 0.9), item("b", "more text", 0.6)], "text")
    assert ev.assess(ev.pack(strong, win)).answerability == "answerable"
    # Evidence that exists but is filtered out with some left is not permission-limited.
    removed = ev.Removals(permission=5, filtered=5, considered=9)
    assert ev.assess(ev.pack(strong, win), removed=removed).answerability == "answerable"


# --- citation normalisation ------------------------------------------------------------------


def test_markers_are_normalised_across_deltas():
    normaliser = answers.CitationNormaliser({"[E1]", "[E2]"}, max_bytes=10_000)
    pieces = ["Leave is 25 days [E", "1] [E9] per year [E1][E1", "]. Ask HR [E2] [E02] [E7]", "."]
    out = "".join(normaliser.feed(p) for p in pieces) + normaliser.flush()
    assert out == normaliser.answer == "Leave is 25 days [E1] per year [E1]. Ask HR [E2]."
    assert normaliser.cited == ["[E1]", "[E2]"]
    assert normaliser.orphans == ["[E9]", "[E7]"]
    assert not normaliser.truncated


def test_the_answer_is_bounded_in_bytes_without_cutting_a_character_or_a_marker():
    normaliser = answers.CitationNormaliser({"[E1]"}, max_bytes=12)
    out = normaliser.feed("年假二十五天 [E1]") + normaliser.flush()
    assert out == "年假二十" and len(out.encode()) == 12 and normaliser.truncated
    assert normaliser.cited == []
    normaliser = answers.CitationNormaliser({"[E1]"}, max_bytes=12)
    out = normaliser.feed("Leave 25 [E1] days") + normaliser.flush()
    assert out == "Leave 25" and normaliser.truncated  # "[E1]" would not fit whole: dropped


# --- extractive answers on the embedded default ---------------------------------------------


@pytest.fixture
def corpus(space):
    for name, text in (
        ("leave.md", LEAVE),
        ("expenses.md", EXPENSES),
        ("rockets.txt", ROCKETS),
        ("nianjia.txt", CJK),
    ):
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    return space


def requester(tenant: str = "tenant-a") -> answers.Requester:
    return answers.Requester.of(Principal(tenant_id=tenant))


def run_events(space, query: str, **kwargs) -> list[tuple[str, dict]]:
    run = answers.start(requester(space.tenant_id), space, query, **kwargs)
    return list(answers.events(run))


def done_of(events: list[tuple[str, dict]]) -> dict:
    assert events[-1][0] == "answer.done", events[-1]
    assert all(name == "answer.delta" for name, _ in events[:-1])
    deltas = "".join(payload["delta"] for _, payload in events[:-1])
    assert deltas == events[-1][1]["answer"]  # the stream adds up to the answer
    return events[-1][1]


@pytest.mark.django_db
def test_extractive_answer_cites_the_supporting_sentences(corpus):
    done = done_of(run_events(corpus, QUESTION, mode="fast", top_k=3))
    assert done["answer"].startswith(
        "Every employee gets 25 days of annual leave per year. [E1]"
    ), done["answer"]
    assert done["finish_reason"] == "retrieval-evidence"
    assert done["generator"] == "extractive" and done["mode"] == "fast"
    assert done["answerability"] == "answerable"
    by_marker = {e["marker"]: e for e in done["evidence"]}
    assert by_marker["[E1]"]["citation"]["filename"] == "leave.md"
    assert "Every employee gets 25 days" in by_marker["[E1]"]["text"]
    assert done["citations"][0] == {"marker": "[E1]", "citation": by_marker["[E1]"]["citation"]}
    for entry in done["citations"]:  # every citation points at the evidence it marks
        assert entry["citation"] == by_marker[entry["marker"]]["citation"]
        assert entry["marker"] in done["answer"]
    assert done["orphan_markers"] == []


@pytest.mark.django_db
def test_extractive_answer_splits_cjk_sentences(corpus):
    done = done_of(run_events(corpus, "年假有多少天", top_k=3))
    assert done["answer"].startswith("年假为二十五天。 [E1]"), done["answer"]
    assert done["citations"][0]["citation"]["filename"] == "nianjia.txt"


@pytest.mark.django_db
def test_no_evidence_is_an_explicit_answer_not_an_empty_one(space):
    events = run_events(space, QUESTION)
    done = done_of(events)
    assert done["finish_reason"] == "no-retrieval-evidence"
    assert done["answerability"] == "not-enough-evidence"
    assert done["answer"] == answers.NO_EVIDENCE_MESSAGE
    assert done["citations"] == [] and done["evidence"] == []
    trace = AnswerTrace.objects.get(id=done["trace_id"])
    assert trace.completed and trace.finish_reason == "no-retrieval-evidence"
    assert [s["status"] for s in trace.steps][-1] == "skipped"


@pytest.mark.django_db
def test_the_trace_keeps_steps_and_evidence_ids_but_no_text(corpus):
    run = answers.start(requester(), corpus, QUESTION, mode="deep", top_k=2)
    assert AnswerTrace.objects.get(id=run.trace.id).completed is False  # written before the stream
    name, done = answers.answer(run)
    assert name == "answer.done"
    trace = AnswerTrace.objects.get(id=run.trace.id)
    assert [s["name"] for s in trace.steps] == STEPS
    assert [s["status"] for s in trace.steps] == ["skipped", "ok", "ok", "ok", "ok"]
    assert trace.steps[0]["metadata"]["resolver"] == "explicit"
    assert trace.requested_mode == "deep" and trace.mode == "deep"
    assert trace.evidence_node_ids == [e["node_id"] for e in done["evidence"]]
    assert trace.answerability == "answerable" and trace.completed
    assert trace.source == "service_api" and trace.finish_reason == "retrieval-evidence"
    assert (trace.requester_kind, trace.requester) == ("operator", "operator:tenant-a")
    stored = json.dumps(
        {f.name: str(getattr(trace, f.attname)) for f in AnswerTrace._meta.fields},
        ensure_ascii=False,
    )
    for text in (
        QUESTION,
        "Every employee gets 25 days",
        answers.SYSTEM_PROMPT[:40],
        done["answer"],
    ):
        assert text not in stored
    answer_step = trace.steps[3]["metadata"]
    assert answer_step["packed"] == len(done["evidence"])
    assert answer_step["window"]["context_source"] == "setting"
    assert answer_step["window"]["context_tokens"] == 8192


@pytest.mark.django_db
def test_a_client_that_goes_away_completes_the_trace(corpus):
    run = answers.start(requester(), corpus, QUESTION, top_k=3)
    stream = answer_api.sse(run)
    assert next(stream).startswith(b"event: answer.delta\ndata: ")
    stream.close()  # what the WSGI server does when the client disconnects
    trace = AnswerTrace.objects.get(id=run.trace.id)
    assert trace.completed and trace.error_code == "client_disconnected"
    assert trace.steps[-1]["name"] == "query.generate" and trace.steps[-1]["status"] == "error"


# --- the API (in process) ----------------------------------------------------------------------


def post(client: APIClient, body):
    return client.post("/v1/queries", body, format="json")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"query": "leave"}, 400, "invalid_space_id"),
        ({"space_id": "SPACE", "query": ""}, 400, "invalid_query"),
        ({"space_id": "SPACE", "query": "x" * 16001}, 400, "invalid_query"),
        ({"space_id": "SPACE", "query": "leave", "mode": "warp"}, 400, "invalid_mode"),
        ({"space_id": "SPACE", "query": "leave", "top_k": 0}, 400, "invalid_top_k"),
        ({"space_id": "SPACE", "query": "leave", "score_threshold": 2}, 400,
         "invalid_score_threshold"),
        ({"space_id": "00000000-0000-0000-0000-000000000000", "query": "leave"}, 404,
         "space_not_found"),
    ],
)  # fmt: skip
def test_refusals_before_the_stream_are_json(client, space, body, status, code):
    body = {k: (str(space.id) if v == "SPACE" else v) for k, v in body.items()}
    response = post(client, body)
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    assert response.json()["code"] == code
    assert not AnswerTrace.objects.exists()  # a refused request is no run


@pytest.mark.django_db
def test_a_query_streams_events_and_its_trace_is_readable_in_the_tenant_only(client, corpus):
    response = post(client, {"space_id": str(corpus.id), "query": QUESTION, "top_k": 3})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    run_id = response["X-Query-Run-Id"]
    body = b"".join(response.streaming_content).decode()
    names = [line[len("event: ") :] for line in body.splitlines() if line.startswith("event: ")]
    assert names[-1] == "answer.done" and set(names[:-1]) == {"answer.delta"}
    done = json.loads(body.strip().splitlines()[-1][len("data: ") :])
    assert done["trace_id"] == run_id
    trace = client.get(f"/v1/queries/{run_id}").json()
    assert trace["id"] == run_id and trace["completed"] is True
    assert trace["source"] == "service_api" and trace["requester_kind"] == "api_key"
    assert [s["name"] for s in trace["steps"]] == STEPS
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key('tenant-b')[1]}")
    assert other.get(f"/v1/queries/{run_id}").json()["code"] == "trace_not_found"
    assert client.get("/v1/queries/not-a-uuid").status_code == 404


# --- LLM answers through the Dify contract server ---------------------------------------------


@pytest.fixture
def llm_space(settings, dify_server, client, principal):
    """A space on the contract server: its embedding model and a reasoning model."""
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    dify_server.dimension = 48
    answers.window._catalog_sizes.clear()
    space = create_space(principal, name="Reasoned")
    base = f"/v1/knowledge-spaces/{space.id}"
    for which, body in (("embedding", EMBEDDER), ("retrieval", {"reasoning_model": REASONER})):
        put = client.put(f"{base}/{which}-profile", body, format="json")
        assert put.status_code == 200, put.content
    ready = client.post(f"/v1/knowledge-spaces/{space.id}/profile-validation").json()
    assert ready.get("readiness", {}).get("state") == "ready", ready
    for name, text in (("leave.md", LEAVE), ("expenses.md", EXPENSES)):
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    dify_server.reset_observations()
    return space


@pytest.mark.django_db
def test_an_llm_answer_keeps_real_markers_and_reports_orphans(llm_space, dify_server):
    dify_server.llm_responder = lambda body: "Employees get 25 days of leave [E1] [E9]. [E1]"
    done = done_of(run_events(llm_space, QUESTION, top_k=2))
    assert done["answer"] == "Employees get 25 days of leave [E1]. [E1]"
    assert done["orphan_markers"] == ["[E9]"]
    assert done["generator"] == "llm"
    assert [c["marker"] for c in done["citations"]] == ["[E1]"]
    assert done["citations"][0]["citation"]["filename"] == "leave.md"
    call = dify_server.calls(LLM)[-1].body
    assert call["tools"] == [] and call["model"] == "gpt-4.1-mini"
    assert call["completion_params"] == {"max_tokens": 1024, "temperature": 0}
    system, user = call["prompt_messages"]
    assert system == {"role": "system", "content": answers.SYSTEM_PROMPT}
    assert user["content"].startswith(f"Question:\n{QUESTION}\n\nEvidence:\n[E1] (leave.md")
    assert len(dify_server.calls(MODEL_CATALOG)) == 1  # the context size, then cached
    trace = AnswerTrace.objects.get(id=done["trace_id"])
    window = trace.steps[3]["metadata"]["window"]
    assert (window["context_source"], window["context_tokens"]) == ("catalog", 8192)
    generate = trace.steps[4]["metadata"]
    assert generate["orphan_markers"] == ["[E9]"] and generate["model"].endswith("gpt-4.1-mini")
    run_events(llm_space, QUESTION, top_k=2)
    assert len(dify_server.calls(MODEL_CATALOG)) == 1


@pytest.mark.django_db
def test_an_llm_failure_mid_stream_is_an_answer_error(llm_space, dify_server):
    dify_server.llm_responder = lambda body: "Employees get 25 days of annual leave [E1]."
    dify_server.add_fault("frame_error", LLM, message="model overloaded")
    events = run_events(llm_space, QUESTION, top_k=2)
    name, payload = events[-1]
    assert name == "answer.error"
    assert payload["error"]["code"] == "answer_generation_failed"
    assert payload["error"]["cause"] == "MODEL_RUNTIME_ERROR"
    assert all(n == "answer.delta" for n, _ in events[:-1])
    trace = AnswerTrace.objects.get(id=payload["trace_id"])
    assert trace.completed and trace.error_code == "answer_generation_failed"
    assert trace.steps[-1]["status"] == "error"
    assert trace.steps[-1]["metadata"]["error"]["cause"] == "MODEL_RUNTIME_ERROR"


@pytest.mark.django_db
def test_an_llm_answering_only_orphans_is_not_a_silent_empty_answer(llm_space, dify_server):
    dify_server.llm_responder = lambda body: "[E9]"
    name, payload = run_events(llm_space, QUESTION, top_k=2)[-1]
    assert (name, payload["error"]["code"]) == ("answer.error", "answer_empty")


# --- kfs answer --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_kfs_answer_json(corpus):
    out = StringIO()
    call_command(
        "kfs", "answer", QUESTION, "--space", corpus.slug, "--tenant", "tenant-a", "--json",
        stdout=out,
    )  # fmt: skip
    payload = json.loads(out.getvalue())
    assert {"answer", "answerability", "evidence", "mode"} <= set(payload)
    assert payload["mode"] == "fast" and payload["answerability"] == "answerable"
    assert payload["answer"].startswith(
        "Every employee gets 25 days of annual leave per year. [E1]"
    )
    assert set(payload["evidence"][0]) == {
        "marker", "node_id", "text", "citation", "score", "conflicts"
    }  # fmt: skip
    assert payload["evidence"][0]["marker"] == "[E1]"
    assert payload["evidence"][0]["citation"]["filename"] == "leave.md"
    assert AnswerTrace.objects.get(id=payload["trace_id"]).source == "cli"
    with pytest.raises(CommandError, match="space_not_found"):
        call_command("kfs", "answer", "q", "--space", "nope", "--tenant", "tenant-a")


@pytest.mark.django_db
def test_capability_tokens_answer_and_read_only_their_own_traces(settings, corpus):
    from knowledgefs.testing import capability as cap

    settings.KNOWLEDGE_FS_CAPABILITY_V2_ENABLED = True
    settings.KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS = cap.jwks_text("current")
    subject = "dify-service-api:caller-1"

    def bearer(token: str) -> APIClient:
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        return api

    ask = cap.token(
        action="queries.answer", resource=cap.space_resource(corpus.id), sub=subject, actor=subject
    )
    response = post(bearer(ask), {"space_id": str(corpus.id), "query": QUESTION})
    assert response.status_code == 200, response.content
    b"".join(response.streaming_content)
    run_id = response["X-Query-Run-Id"]
    trace = AnswerTrace.objects.get(id=run_id)
    assert trace.requester_kind == "capability"
    assert trace.requester.startswith("cap:") and subject not in trace.requester  # a digest
    assert trace.grant_id.startswith("grant-")

    def read(sub: str):
        token = cap.token(
            action="queries.read",
            resource=cap.child_resource("query", run_id, corpus.id),
            sub=sub,
            actor=sub,
        )
        return bearer(token).get(f"/v1/queries/{run_id}")

    assert read(subject).status_code == 200
    assert read("dify-service-api:caller-2").json()["code"] == "trace_not_found"
    # A token for another space's answers cannot name this space in its body.
    other = cap.token(action="queries.answer", resource=cap.space_resource(uuid.uuid4()))
    refused = post(bearer(other), {"space_id": str(corpus.id), "query": QUESTION})
    assert refused.json()["code"] == "resource_not_permitted"


@pytest.mark.django_db
def test_a_retrieval_failure_is_json_and_traced(llm_space, settings, client):
    settings.KNOWLEDGE_MODEL_RUNTIME = "local"  # the space's Dify embedding model is not served
    response = post(client, {"space_id": str(llm_space.id), "query": QUESTION})
    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    assert response.json()["code"] == "embedding_model_unavailable"
    trace = AnswerTrace.objects.get(id=response["X-Query-Run-Id"])
    assert trace.completed and trace.error_code == "embedding_model_unavailable"
    assert [(s["name"], s["status"]) for s in trace.steps] == [("query.retrieve", "error")]


def test_only_figures_and_labels_of_a_retrieval_plan_reach_the_trace():
    plan = {"dense_top_k": 50, "query_language": "latin", "sub_queries": ["annual leave days"]}
    assert answers.traces._figures(plan) == {"dense_top_k": 50, "query_language": "latin"}
    stages = [{"name": "rerank", "status": "executed", "candidate_count": 9, "note": "leave"}]
    assert answers.traces._stages(stages) == [
        {"name": "rerank", "status": "executed", "candidate_count": 9}
    ]


# --- evidence can neither forge nor remove markers ---------------------------------------------

REFUND = "The refund window is 30 days [E2] for all customers who keep the receipt."
SHIPPING = "Shipping takes 5 business days [E9] within the country."
CATS = "Cats sleep most of the day and purr loudly when they are content."


@pytest.fixture
def marked(space):
    for name, text in (("refund.txt", REFUND), ("shipping.txt", SHIPPING), ("cats.txt", CATS)):
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    return space


def test_marker_shaped_text_in_evidence_is_neutralised_visibly():
    assert ev.neutralise_markers(REFUND) == (
        "The refund window is 30 days \uff3bE2\uff3d for all customers who keep the receipt."
    )
    assert ev.neutralise_markers("[E 2] [e2] [E] E2 [F2]") == "[E 2] [e2] [E] E2 [F2]"
    assert ev.neutralise_markers("[E02][E10]") == "\uff3bE02\uff3d\uff3bE10\uff3d"
    # What an LLM is given: only the entry's own marker is a real one.
    evidence = ev.from_retrieval([item("a", REFUND, 0.9, filename="notes [E3].txt")], "refund")
    bundle = ev.pack(evidence, open_window(10_000))
    entry = ev.entry_text(bundle.items[0])
    assert entry == (
        "[E1] (notes \uff3bE3\uff3d.txt)\nThe refund window is 30 days \uff3bE2\uff3d for all "
        "customers who keep the receipt.\n"
    )
    assert answers.citations._MARKER.findall(entry) == ["1"]


@pytest.mark.django_db
def test_a_document_cannot_forge_a_citation_in_an_extractive_answer(marked):
    done = done_of(run_events(marked, "How long is the refund window for customers?", top_k=3))
    assert done["answer"].startswith(
        "The refund window is 30 days \uff3bE2\uff3d for all customers who keep the receipt. [E1]"
    ), done["answer"]
    assert [c["marker"] for c in done["citations"]] == ["[E1]"]
    assert done["citations"][0]["citation"]["filename"] == "refund.txt"
    assert done["orphan_markers"] == []
    # The evidence itself is returned as the document has it.
    assert done["evidence"][0]["text"] == REFUND


@pytest.mark.django_db
def test_a_marker_in_a_document_is_not_cut_from_the_quoted_sentence(marked):
    done = done_of(run_events(marked, "How many business days does shipping take?", top_k=3))
    assert done["answer"].startswith(
        "Shipping takes 5 business days \uff3bE9\uff3d within the country. [E1]"
    ), done["answer"]
    assert done["orphan_markers"] == []


# --- answerability rests on absolute signals ----------------------------------------------------

DALY = (
    "The age-standardized DALY rate was higher in countries with a low human development "
    "index than in countries with a very high one."
)


@pytest.mark.django_db
def test_items_carry_the_raw_dense_cosine_and_keep_their_order(corpus):
    from retrieval.modes import retrieve

    result = retrieve(corpus, QUESTION, mode="fast", top_k=3, score_threshold=None)
    top = result.items[0]
    assert top.citation["filename"] == "leave.md"
    assert 0.4 < top.scores["dense_raw"] <= 1.0  # a cosine, not a min-max score
    # The default fusion's score is the calibrated map of the raw leg scores (no exact target).
    from retrieval.calibration import BGE_SMALL_ID, KEYWORD_REFERENCE, calibration_for

    cal = calibration_for(BGE_SMALL_ID)  # the embedded default model
    feature = cal.alpha * top.scores["dense_raw"] + (1 - cal.alpha) * (
        math.log1p(top.scores["keyword_raw"]) / KEYWORD_REFERENCE
    )
    assert top.scores["final"] == pytest.approx(
        1 / (1 + math.exp(-(cal.bias + cal.scale * feature)))
    )


@pytest.mark.django_db
def test_an_unrelated_question_sharing_one_common_word_is_not_enough_evidence(corpus):
    admit_document(corpus, filename="daly.txt", data=DALY.encode(), enqueue=False)
    compile_all()
    question = "What is the capital gains tax rate in Germany for 2024?"
    done = done_of(run_events(corpus, question, top_k=5))
    assert done["answerability"] == "not-enough-evidence", done["answerability_reasons"]
    assert done["answer"] == answers.UNRELATED_EVIDENCE_MESSAGE
    assert done["citations"] == [] and done["finish_reason"] == "no-retrieval-evidence"
    assert done["answerability_reasons"][0].startswith("no evidence is about the question: best")
    assert done["evidence"]  # what was found is still listed, cited nowhere
    trace = AnswerTrace.objects.get(id=done["trace_id"])
    assert trace.answerability == "not-enough-evidence"
    assert trace.steps[-1]["metadata"] == {"reason": "unrelated evidence"}
    # A question the same evidence does answer.
    done = done_of(run_events(corpus, "Was the DALY rate higher in low HDI countries?", top_k=5))
    assert done["answerability"] == "answerable", done["answerability_reasons"]
    assert done["answer"].startswith(DALY + " [E1]")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "question", ["How do I reset my router password?", "xyzzy plugh", "felines napping"]
)
def test_an_unrelated_question_on_a_tiny_corpus_is_not_enough_evidence(corpus, question):
    done = done_of(run_events(corpus, question, top_k=3))
    assert done["answerability"] == "not-enough-evidence", done["answerability_reasons"]
    assert done["answer"] == answers.UNRELATED_EVIDENCE_MESSAGE


@pytest.mark.django_db
def test_evidence_related_by_meaning_only_is_partial(corpus):
    done = done_of(
        run_events(corpus, "How much vacation time do workers receive each year?", top_k=3)
    )
    assert done["answerability"] == "partial", done["answerability_reasons"]
    assert done["answerability_reasons"] == [
        "evidence is related by meaning but holds too few words of the question"
    ]
    first = done["evidence"][0]
    assert first["citation"]["filename"] == "leave.md"
    assert done["answer"] == f"{answers.answer_sentences(first['text'])[0]} [E1]"


def test_absolute_signals_decide_answerability(settings):
    settings.KNOWLEDGE_ANSWER_MIN_DENSE_SIMILARITY = 0.35
    settings.KNOWLEDGE_ANSWER_MIN_TERM_COVERAGE = 0.5
    win = open_window(10_000)

    def with_scores(node_id, text, final, **scores):
        row = item(node_id, text, final)
        row.scores = {"final": final, **scores}
        return row

    def state(rows, query):
        bundle = ev.assess(ev.pack(ev.from_retrieval(rows, query), win), query=query)
        return bundle.answerability, bundle.reasons

    # Relative score 1.0 but a low cosine and one word of six: about something else.
    rate = [with_scores("a", "The DALY rate rose.", 1.0, dense_raw=0.12)]
    question = "capital gains tax rate Germany 2024"
    assert state(rate, question) == (
        "not-enough-evidence",
        ["no evidence is about the question: best dense_raw 0.12 (0.35 needed), "
         "1 of 6 question words in one item (50% needed)"],
    )  # fmt: skip
    near = [with_scores("a", "Capital gains are taxed at a flat rate.", 0.4, dense_raw=0.5)]
    assert state(near, question)[0] == "answerable"  # 3 of 6 words, cosine 0.5
    assert state([with_scores("a", "x y", 1.0, dense_raw=0.5)], question)[0] == "partial"
    assert state([with_scores("a", "tax rate gains", 1.0, dense_raw=0.1)], question)[0] == (
        "partial"
    )
    # A reranker's score is absolute: it decides instead of the cosine.
    reranked = [with_scores("a", "alpha gamma", 0.96, dense_raw=0.1, rerank=0.96)]
    assert state(reranked, "alpha beta")[0] == "answerable"
    low = [with_scores("a", "delta", 0.05, dense_raw=0.9, rerank=0.05)]
    assert state(low, "alpha beta")[0] == "not-enough-evidence"


# --- short evidence -------------------------------------------------------------------------


def test_short_chunks_still_answer_and_no_sentence_without_the_questions_words():
    win = open_window(10_000)
    rows = [
        item("a", "alpha gamma", 0.96),
        item("b", "alpha delta", 0.9),
        item("c", "VAT 19%", 0.5),
    ]
    bundle = ev.pack(ev.from_retrieval(rows, "alpha beta"), win)
    assert answers.extract(bundle, "alpha beta", 3) == [
        ("alpha gamma", "[E1]"),
        ("alpha delta", "[E2]"),
    ]
    # No sentence shares a word with the question: no sentence is the answer.
    assert answers.extract(bundle, "zeta", 3) == []
    # A heading inside a longer chunk is still skipped.
    assert answers.answer_sentences(LEAVE)[0].startswith("Every employee gets 25 days")


@pytest.mark.django_db
def test_a_short_chunk_corpus_answers_from_the_best_item(space):
    for name, text in (("one.txt", "alpha gamma"), ("two.txt", "VAT 19%")):
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    done = done_of(run_events(space, "alpha", top_k=3))
    assert done["answer"] == "alpha gamma [E1]", done["answer"]
    assert done["citations"][0]["citation"]["filename"] == "one.txt"
    assert done["answerability"] in ("answerable", "partial")


# --- filters and permissions ------------------------------------------------------------------

NO_MATCH = {
    "conditions": [
        {"name": "team", "field_type": "string", "comparison_operator": "is", "value": "zzz"}
    ]
}


@pytest.mark.django_db
def test_a_filter_matching_nothing_is_not_enough_evidence_not_permission_limited(corpus):
    done = done_of(run_events(corpus, QUESTION, filters=NO_MATCH))
    assert done["answerability"] == "not-enough-evidence"
    assert done["answerability_reasons"] == [
        "the request's filters matched none of the 4 documents"
    ]
    assert done["answer"] == answers.FILTERS_MATCHED_NOTHING_MESSAGE
    assert done["evidence"] == [] and done["citations"] == []


def test_only_permission_removals_are_permission_limited():
    win = open_window(10_000)
    removed = ev.removals(SimpleNamespace(metrics={"permission_filtered_candidates": 3}, stages=[]))
    limited = ev.assess(ev.pack([], win), removed=removed)
    assert limited.answerability == "permission-limited"
    assert limited.reasons == ["3 candidates were removed by permissions"]
    staged = SimpleNamespace(
        metrics={}, stages=[{"name": "filter", "candidate_count": 7, "filtered_count": 7}]
    )
    assert ev.removals(staged) == ev.Removals(permission=0, filtered=7, considered=7)
    bundle = ev.assess(ev.pack([], win), removed=ev.removals(staged))
    assert bundle.answerability == "not-enough-evidence" and bundle.filters_matched_nothing
    some = SimpleNamespace(metrics={}, stages=[{"name": "filter", "candidate_count": 7,
                                                "filtered_count": 5}])  # fmt: skip
    bundle = ev.assess(ev.pack([], win), removed=ev.removals(some))
    assert bundle.reasons == ["no evidence passed retrieval, its threshold and the window"]
    assert answers.no_evidence_message(bundle) == answers.NO_EVIDENCE_MESSAGE


# --- kfs answer: --filters and --threshold ------------------------------------------------------


@pytest.mark.django_db
def test_kfs_answer_filters_and_threshold(corpus):
    def kfs_answer(*extra):
        out = StringIO()
        call_command(
            "kfs", "answer", QUESTION, "--space", corpus.slug, "--tenant", "tenant-a", *extra,
            stdout=out,
        )  # fmt: skip
        return out.getvalue()

    payload = json.loads(kfs_answer("--filters", json.dumps(NO_MATCH), "--json"))
    assert payload["answerability"] == "not-enough-evidence"
    assert payload["answer"] == answers.FILTERS_MATCHED_NOTHING_MESSAGE
    # The default (calibrated) score is absolute: 0.5 keeps the real hit, 1.0 keeps nothing (a
    # relative min-max score would make the best candidate 1.0 whatever it is).
    payload = json.loads(kfs_answer("--threshold", "0.5", "--json"))
    assert payload["evidence"] and payload["answerability"] == "answerable"
    assert payload["evidence"][0]["citation"]["filename"] == "leave.md"
    payload = json.loads(kfs_answer("--threshold", "1", "--json"))
    assert payload["evidence"] == [] and payload["answerability"] == "not-enough-evidence"
    payload = json.loads(kfs_answer("--threshold", "off", "--top-k", "3", "--json"))
    assert len(payload["evidence"]) == 3
    text = kfs_answer("--top-k", "2")
    assert text.startswith("Every employee gets 25 days of annual leave per year. [E1]")
    assert "answerability: answerable (best dense_raw" in text
    assert "evidence:\n*[E1] leave.md [" in text
    with pytest.raises(CommandError, match="invalid_filter"):
        kfs_answer("--filters", "{nope")
    with pytest.raises(CommandError, match="threshold"):
        kfs_answer("--threshold", "lots")


@pytest.mark.django_db
def test_short_chunks_with_a_reranker_answer_instead_of_answer_empty(settings, dify_server, client):
    from retrieval.tests.test_retrieval_modes import reranked_space

    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    dify_server.dimension = 48
    space = reranked_space(client, Principal(tenant_id="tenant-a"))
    texts = {"one.txt": "alpha gamma", "two.txt": "alpha delta", "three.txt": "alpha epsilon"}
    for name, text in texts.items():
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    scripted = {"alpha gamma": 0.84, "alpha delta": 0.90, "alpha epsilon": 0.96}
    dify_server.rerank_responder = lambda body: [scripted[d] for d in body["docs"]]
    done = done_of(run_events(space, "alpha beta", top_k=3))
    assert done["answer"] == "alpha epsilon [E1] alpha delta [E2] alpha gamma [E3]"
    assert done["answerability"] == "answerable", done["answerability_reasons"]
    assert done["answerability_reasons"][0].startswith("best rerank 0.96 (0.30 needed)")
