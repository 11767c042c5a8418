"""Research mode: local decomposition, weighted RRF, the shared rerank pool, and the reasoning
path against the Dify contract server (``tests/dify_server.py``) with a scripted model.

Everything is real: the database, the compiler, the search backends, the Dify clients talking
HTTP to the loopback server whose ``llm_responder`` plays the reasoning model and whose faults
stand in for a slow or broken one.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest

from ingestion.services.documents import admit_document
from retrieval.research import (
    ResearchCanceled,
    decompose,
    run_research,
    shared_pool,
    weighted_rrf,
)
from retrieval.services import retrieve
from tests.conftest import compile_all

A, B, C, D = (uuid.UUID(int=i) for i in (1, 2, 3, 4))

CORPUS = {
    "leave.md": "# Leave\n\nEvery employee gets 25 days of annual leave per year.",
    "expenses.md": "# Expenses\n\nSubmit travel receipts within thirty days of the trip.",
    "travel.md": "# Travel\n\nBook trains for trips under four hours; flights need approval.",
    "cats.txt": "Cats are small carnivorous mammals that purr and sleep most of the day.",
    "rockets.txt": "Rocket engines burn liquid oxygen and kerosene to produce thrust.",
    "bread.txt": "Sourdough bread rises slowly because wild yeast ferments the dough.",
}


def load(space, corpus=CORPUS) -> None:
    for name, text in corpus.items():
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()


def names(result) -> list[str]:
    return [i.citation["filename"] for i in result.items]


# --- pure parts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "parts"),
    [
        ("How many days of annual leave do we get?", []),
        ("Mutations in BRCA1 and BRCA2 cause cancer", []),  # a noun phrase, not two clauses
        ("salt and pepper", []),
        (
            "How many days of annual leave? When are travel receipts due?",
            ["How many days of annual leave?", "When are travel receipts due?"],
        ),
        ("What is sourdough and how does it rise", ["What is sourdough", "how does it rise"]),
        ("rockets vs cats", ["rockets", "cats"]),
        ("Compare trains with flights", ["trains", "flights"]),
        ("What is the difference between sourdough and rye?", ["sourdough", "rye"]),
        ("leave; expenses; travel; cats; bread", ["leave", "expenses", "travel"]),
        ("年假有多少天？报销期限是多久？", ["年假有多少天？", "报销期限是多久？"]),
        ("a? b?", []),  # no word of two characters
    ],
)
def test_local_decomposition_rule(query, parts):
    assert decompose(query) == parts


def ranked(*ids):
    return [(i, 1.0 - n / 10, {"dense": 1.0}) for n, i in enumerate(ids)]


def test_weighted_rrf_with_one_list_keeps_its_order_and_k_is_60():
    fused = weighted_rrf([ranked(C, A, B)], [1.0])
    assert [r[0] for r in fused] == [C, A, B]
    assert [r[1] for r in fused] == pytest.approx([1.0, 61 / 62, 61 / 63])
    assert fused[0][2] == {"dense": 1.0, "rrf": 1.0}


def test_weighted_rrf_lets_the_original_query_lead():
    # B is first for one sub-query only; A is the original query's first hit.
    fused = weighted_rrf([ranked(A, C), ranked(B, D)], [1.0, 0.5])
    assert [r[0] for r in fused] == [A, C, B, D]
    best = 1 / 61 + 0.5 / 61
    assert [r[1] for r in fused] == pytest.approx(
        [(1 / 61) / best, (1 / 62) / best, (0.5 / 61) / best, (0.5 / 62) / best]
    )
    # Found by both, B at ranks 2 and 1 beats the original's first hit.
    fused = weighted_rrf([ranked(A, B), ranked(B, C)], [1.0, 0.5])
    assert [r[0] for r in fused] == [B, A, C]
    # Two sub-queries agreeing on D tie with the original's first hit (the original's rank
    # breaks the tie) and outweigh its second.
    fused = weighted_rrf([ranked(A, B), ranked(D), ranked(D)], [1.0, 0.5, 0.5])
    assert [r[0] for r in fused] == [A, D, B]
    assert fused[0][1] == pytest.approx(fused[1][1])


def test_shared_pool_is_round_robin_fair_and_capped():
    lists = [
        ranked(*(uuid.UUID(int=100 + i) for i in range(300))),
        ranked(*(uuid.UUID(int=1000 + i) for i in range(300))),
        ranked(*(uuid.UUID(int=2000 + i) for i in range(300))),
        ranked(*(uuid.UUID(int=3000 + i) for i in range(300))),
    ]
    pool, counts = shared_pool(lists, 200)
    assert len(pool) == len(set(pool)) == 200
    assert counts == [50, 50, 50, 50]
    # A short list gives its turns away; duplicates are skipped, not counted twice.
    pool, counts = shared_pool([ranked(A, B, C, D), ranked(A, B), ranked()], 3)
    assert pool == [A, B, C] and counts == [2, 1, 0]
    pool, counts = shared_pool([ranked(A, B), ranked(A, B)], 200)
    assert pool == [A, B] and counts == [1, 1]


# --- the deterministic path (embedded default: local runtime, no reasoning model) ---------------


@pytest.mark.django_db
def test_deterministic_path_finds_evidence_for_both_parts(space):
    load(space)
    result = retrieve(
        space,
        "How many days of annual leave? When are travel receipts due?",
        top_k=2,
        mode="research",
    )
    assert result.mode == "research"
    assert set(names(result)) == {"leave.md", "expenses.md"}
    metrics = result.metrics
    assert metrics["research_path"] == "deterministic"
    assert metrics["research_model_calls"] == 0 and metrics["degraded"] is False
    assert metrics["budget_exhausted"] is None and metrics["research_rounds"] == 1
    assert [q["role"] for q in result.plan["queries"]] == ["original", "planned", "planned"]
    assert [lst["weight"] for lst in metrics["research_lists"]] == [1.0, 0.5, 0.5]
    assert metrics["rerank_pool"] == len(CORPUS)  # every node, taken fairly
    assert [s["name"] for s in result.stages] == [
        "plan", "embed", "recall", "rerank", "threshold", "judge", "supplemental",
    ]  # fmt: skip
    stage = {s["name"]: s for s in result.stages}
    assert stage["plan"]["candidate_count"] == 3 and stage["embed"]["candidate_count"] == 3
    assert stage["rerank"]["status"] == "skipped" and stage["judge"]["status"] == "skipped"
    # Fast on the same question ranks one part only in its top 2.
    fast = retrieve(space, "How many days of annual leave? When are travel receipts due?", top_k=2)
    assert len(fast.items) == 2


@pytest.mark.django_db
def test_one_query_research_keeps_fasts_order_and_scores_as_rrf(space):
    load(space)
    for query in ("annual leave days", "how do rocket engines make thrust", "yeast"):
        fast = retrieve(space, query, top_k=6, score_threshold=None, mode="fast")
        research = retrieve(space, query, top_k=6, score_threshold=None, mode="research")
        assert [i.node_id for i in research.items] == [i.node_id for i in fast.items]
        assert research.plan["queries"] == [{"text": query, "role": "original", "weight": 1.0}]
        assert research.items[0].score == 1.0
        assert [i.score for i in research.items[:2]] == pytest.approx([1.0, 61 / 62])
        assert research.items[0].scores["rrf"] == 1.0
    # The threshold applies to the final (RRF) score before top_k.
    kept = retrieve(space, "yeast", top_k=6, score_threshold=0.99, mode="research")
    assert names(kept) == ["bread.txt"]
    assert kept.metrics["threshold_filtered"] == len(CORPUS) - 1


@pytest.mark.django_db
def test_research_through_the_retrieval_tests_api(client, space):
    load(space)
    url = f"/v1/knowledge-spaces/{space.id}/retrieval-tests"
    body = client.post(
        url,
        {"query": "rockets vs bread", "mode": "research", "top_k": 2, "score_threshold": None},
        format="json",
    ).json()
    assert body["mode"] == "research"
    assert {i["citation"]["filename"] for i in body["items"]} == {"rockets.txt", "bread.txt"}
    assert body["metrics"]["research_path"] == "deterministic"
    assert [q["text"] for q in body["plan"]["queries"]] == ["rockets vs bread", "rockets", "bread"]
    assert {s["name"] for s in body["stages"]} >= {"plan", "recall", "threshold"}


@pytest.mark.django_db
def test_should_stop_cancels_between_steps(space):
    load(space)
    polls = []

    def stop() -> bool:
        polls.append(1)
        return len(polls) >= 2  # after the plan

    with pytest.raises(ResearchCanceled):
        run_research(space, "rockets vs bread", top_k=2, score_threshold=None, should_stop=stop)
    assert len(polls) == 2


def json_of(text: str) -> dict:
    return json.loads(text)


UNTRUSTED = re.compile(r"<<<UNTRUSTED DATA (\w+)>>>\n(.*)\n<<<END UNTRUSTED DATA \1>>>", re.S)
