"""Fast and Deep: the planner's figures, query language, CJK keyword matching (BC-22), the
threshold on the reranked score (BC-20), Deep's context expansion and one unified rerank, the
retrieval-test response and ``kfs query --mode --filters``.

Everything is real: the database (SQLite or PostgreSQL), the compiler, the local embedding
model, and the Dify clients talking HTTP to the contract server
(``knowledgefs/testing/dify_server.py``) whose scripted reranker stands in for a rerank model.
"""

from __future__ import annotations

import json
from io import StringIO

import numpy as np
import pytest
from django.core.management import call_command

from ingestion.documents import admit_document
from ingestion.models import KnowledgeNode
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import RERANK, TEST_INNER_KEY
from knowledgefs.testing.fixtures import compile_all
from retrieval.fast_deep import DEEP_EXPANSION_FACTOR
from retrieval.modes import retrieve
from retrieval.planner import LEG_FLOOR, detect_language, plan
from retrieval.text import keyword_terms, keyword_text
from spaces.services import create_space

dify_server = dify_fixtures.dify_server

OPENAI = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "text-embedding-3-small"}
RERANKER = {"plugin_id": "langgenius/cohere", "provider": "cohere", "model": "rerank-v3.5"}
SPACES = "/v1/knowledge-spaces"
STAGES = [
    "route",
    "filter",
    "embed",
    "dense",
    "keyword",
    "fusion",
    "expansion",
    "rerank",
    "threshold",
]


# --- the planner ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "top_k", "legs", "limit"),
    [
        ("fast", 10, 50, 10),  # formula 10, floor 50
        ("fast", 60, 60, 60),
        ("fast", 100, 100, 100),
        ("deep", 10, 50, 30),
        ("deep", 4, 50, 12),
        ("deep", 20, 100, 60),
        ("deep", 40, 100, 100),  # 200 and 120 capped at 100
        ("research", 3, 50, 15),
        ("research", 10, 100, 50),
        ("research", 30, 100, 100),
    ],
)
def test_planner_figures_per_mode(mode, top_k, legs, limit):
    p = plan(mode, top_k, "what is the leave policy?")
    assert (p.dense_top_k, p.fts_top_k, p.fusion_limit, p.rerank_limit) == (
        legs,
        legs,
        limit,
        limit,
    )
    assert p.leg_floor == LEG_FLOOR == 50
    assert p.as_dict()["query_language"] == "latin"
    assert p.as_dict()["version"] == "retrieval-planner-v1"
    multipliers = {"fast": (1, 1), "deep": (5, 3), "research": (10, 5)}[mode]
    assert (p.recall_multiplier, p.fusion_multiplier) == multipliers


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("人口", "cjk"),
        ("東京都の人口統計", "cjk"),
        ("서울 인구", "cjk"),
        ("ﾃﾞｰﾀ", "cjk"),  # halfwidth Katakana (U+FF66–U+FF9F)
        ("ﾃﾞｰﾀ base", "mixed-cjk-latin"),
        ("how many days of leave?", "latin"),
        ("Café déjà vu", "latin"),
        ("Python 人口統計 2024", "mixed-cjk-latin"),
        ("Привет мир", "other"),
        ("Привет world", "other"),  # 6 Cyrillic letters outnumber 5 Latin ones
        ("2024 ?!", "other"),
        ("", "other"),
    ],
)
def test_query_language_from_unicode_scripts(text, language):
    assert detect_language(text) == language


def test_halfwidth_katakana_is_split_into_bigrams_like_other_kana():
    assert keyword_terms("ﾃﾞｰﾀ", "cjk") == ["ﾃﾞ", "ﾞｰ", "ｰﾀ"]
    assert keyword_text("ﾃﾞｰﾀﾍﾞｰｽの設計").split() == [
        "ﾃﾞ", "ﾞｰ", "ｰﾀ", "ﾀﾍ", "ﾍﾞ", "ﾞｰ", "ｰｽ", "ｽの", "の設", "設計"
    ]  # fmt: skip


def test_cjk_terms_are_never_dropped_by_stop_words_or_the_term_cap():
    assert keyword_terms("人口統計", "cjk") == ["人口", "口統", "統計"]
    assert keyword_terms("the 人口 of", "mixed-cjk-latin") == ["人口"]
    words = " ".join(f"word{i}" for i in range(70))
    mixed = keyword_terms(f"{words} 人口", "mixed-cjk-latin")
    assert len(mixed) == 64 and mixed[0] == "人口"
    assert "人口" not in keyword_terms(f"{words} 人口", "latin")  # the cap without the planner


# --- BC-22: CJK without spaces --------------------------------------------------------------------


@pytest.fixture
def cjk_space(space):
    texts = {
        "tokyo.txt": "東京都の人口統計は毎年更新される",
        "beijing.txt": "北京市的人口数据",
        "rockets.txt": "Rocket engines burn liquid oxygen and kerosene to produce thrust.",
        "bread.txt": "Sourdough bread rises slowly because wild yeast ferments the dough.",
        "cats.txt": "Cats are small carnivorous mammals that purr and sleep most of the day.",
    }
    for name, text in texts.items():
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    return space


@pytest.mark.django_db
@pytest.mark.parametrize("query", ["人口", "人口統計"])
def test_bc22_cjk_queries_match_without_spaces_in_keyword_and_hybrid(cjk_space, query):
    keyword = retrieve(cjk_space, query, top_k=5, legs=("keyword",))
    assert {i.citation["filename"] for i in keyword.items} == {"tokyo.txt", "beijing.txt"}
    assert keyword.plan["query_language"] == "cjk"
    hybrid = retrieve(cjk_space, query, top_k=5)
    assert {i.citation["filename"] for i in hybrid.items[:2]} == {"tokyo.txt", "beijing.txt"}
    assert hybrid.metrics["keyword_candidates"] == 2


# --- BC-20: the threshold applies to the reranked score -------------------------------------------


@pytest.fixture
def dify(settings, dify_server):
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    dify_server.dimension = 48
    return dify_server


def reranked_space(client, principal, *, threshold=None):
    space = create_space(principal, name="Reranked")
    client.put(f"{SPACES}/{space.id}/embedding-profile", OPENAI, format="json")
    profile = {"rerank": {"enabled": True, "model": RERANKER}, "score_threshold": threshold}
    answer = client.put(f"{SPACES}/{space.id}/retrieval-profile", profile, format="json")
    assert answer.status_code == 200, answer.json()
    ready = client.post(f"{SPACES}/{space.id}/profile-validation").json()
    assert ready["readiness"]["state"] == "ready", ready["readiness"]
    return space


def cosine(a, b) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.django_db
def test_bc20_threshold_applies_to_the_reranked_score(dify, client, principal):
    space = reranked_space(client, principal, threshold=0.60)
    texts = {"one.txt": "alpha gamma", "two.txt": "alpha delta", "three.txt": "alpha epsilon"}
    for name, text in texts.items():
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    query = "alpha beta"
    # The stub vectors: each chunk's similarity to the query is about 0.5.
    [q] = dify.embed([query], 48)
    for text in texts.values():
        assert cosine(q, dify.embed([text], 48)[0]) == pytest.approx(0.5, abs=0.15)
    scripted = {"alpha gamma": 0.84, "alpha delta": 0.90, "alpha epsilon": 0.96}
    dify.rerank_responder = lambda body: [scripted[d] for d in body["docs"]]
    dify.reset_observations()

    result = retrieve(space, query, top_k=3)  # the profile's threshold: 0.60
    assert [i.score for i in result.items] == [0.96, 0.90, 0.84]
    assert [i.text for i in result.items] == ["alpha epsilon", "alpha delta", "alpha gamma"]
    assert all(i.scores["rerank"] == i.score == i.scores["final"] for i in result.items)
    assert len(dify.calls(RERANK)) == 1
    stages = {s["name"]: s for s in result.stages}
    assert stages["rerank"]["status"] == "executed" and stages["rerank"]["candidate_count"] == 3
    assert stages["threshold"] == {**stages["threshold"], "status": "executed",
                                   "candidate_count": 3, "filtered_count": 0}  # fmt: skip
    # Shown to the user as the score, over HTTP too.
    body = client.post(
        f"{SPACES}/{space.id}/retrieval-tests", {"query": query, "top_k": 3}, format="json"
    ).json()
    assert [i["score"] for i in body["items"]] == [0.96, 0.9, 0.84]
    # A threshold between the reranked scores cuts between them, whatever the fused scores.
    strict = retrieve(space, query, top_k=3, score_threshold=0.92)
    assert [i.score for i in strict.items] == [0.96]


# --- Deep: context expansion ----------------------------------------------------------------------

GUIDE = (
    "# Animals\n\n"
    "Lions hunt in prides across the open grassland at dusk, then rest in the shade of thorn "
    "trees through the heat of the day.\n\n"
    "Zebras carry black and white stripes that confuse biting flies on the savanna, and they "
    "gather in large herds near rivers.\n\n"
    "Giraffes browse acacia leaves high above the ground with long prehensile tongues that "
    "reach between the sharp thorns.\n\n"
    "Elephants remember distant waterholes and lead their families there in the dry seasons, "
    "walking for days without rest.\n\n"
    "# Weather\n\n"
    "Monsoon rains arrive in June and flood the lowland rice paddies for weeks, filling the "
    "canals and village wells again.\n"
)


@pytest.fixture
def guide(space, settings):
    settings.KNOWLEDGE_CHUNK_TARGET_CHARS = 200
    settings.KNOWLEDGE_CHUNK_OVERLAP_CHARS = 0
    admit_document(space, filename="guide.md", data=GUIDE.encode(), enqueue=False)
    admit_document(space, filename="other.txt", data=b"Volcanoes vent ash and lava.", enqueue=False)
    compile_all()
    chunks = list(
        KnowledgeNode.objects.filter(document__filename="guide.md").order_by("chunk_index")
    )
    assert [("Zebras" in c.text, c.section_path) for c in chunks] == [
        (False, ["Animals"]),
        (True, ["Animals"]),
        (False, ["Animals"]),
        (False, ["Animals"]),
        (False, ["Weather"]),
    ]
    return space, chunks


@pytest.mark.django_db
def test_deep_returns_neighbours_and_section_chunks_with_citations(guide, settings):
    settings.KNOWLEDGE_LOCAL_RERANK_ENABLED = False  # the order without a reranker
    space, chunks = guide
    zebra = chunks[1]
    result = retrieve(
        space, "zebras stripes", top_k=5, mode="deep", legs=("keyword",), fusion="minmax"
    )
    assert result.mode == "deep"
    assert [i.node_id for i in result.items] == [zebra.id, chunks[0].id, chunks[2].id, chunks[3].id]
    top, *expanded = result.items
    assert top.context is None and top.score == pytest.approx(1.0)
    assert [i.context["relation"] for i in expanded] == ["neighbour", "neighbour", "section"]
    for item, chunk in zip(expanded, chunks[0:1] + chunks[2:4], strict=True):
        assert item.context["source_node_id"] == str(zebra.id)
        assert item.score == pytest.approx(top.score * DEEP_EXPANSION_FACTOR)
        assert item.text == chunk.text
        assert item.citation["filename"] == "guide.md"
        assert item.citation["section_path"] == ["Animals"]
        assert (item.citation["start_offset"], item.citation["end_offset"]) == (
            chunk.start_offset,
            chunk.end_offset,
        )
    stages = {s["name"]: s for s in result.stages}
    assert stages["expansion"]["status"] == "executed"
    assert stages["expansion"]["candidate_count"] == result.metrics["expansion_candidates"] == 3
    assert result.as_dict()["items"][1]["context"]["relation"] == "neighbour"
    assert "context" not in result.as_dict()["items"][0]
    # Fast never expands.
    fast = retrieve(space, "zebras stripes", top_k=5, mode="fast", legs=("keyword",))
    assert [i.node_id for i in fast.items] == [zebra.id]
    assert {s["name"]: s["status"] for s in fast.stages}["expansion"] == "skipped"


@pytest.mark.django_db
def test_deep_keeps_fasts_order_of_the_base_hits_without_a_reranker(guide, settings):
    settings.KNOWLEDGE_LOCAL_RERANK_ENABLED = False
    space, _ = guide
    for query in ("zebras stripes", "elephants waterholes herds", "rain floods"):
        fast = retrieve(space, query, top_k=4, mode="fast")
        deep = retrieve(space, query, top_k=4, mode="deep")
        base = [i.node_id for i in deep.items if i.context is None]
        assert base == [i.node_id for i in fast.items][: len(base)]
        position = {i.node_id: n for n, i in enumerate(deep.items)}
        for item in deep.items:
            if item.context is not None:
                source = item.context["source_node_id"]
                assert item.score < item.context["source_score"]
                if any(str(i.node_id) == source for i in deep.items):
                    assert position[item.node_id] > next(
                        n for n, i in enumerate(deep.items) if str(i.node_id) == source
                    )


@pytest.mark.django_db
def test_deep_reranks_hits_and_expansions_in_one_call(dify, client, principal, settings):
    settings.KNOWLEDGE_CHUNK_TARGET_CHARS = 200
    settings.KNOWLEDGE_CHUNK_OVERLAP_CHARS = 0
    space = reranked_space(client, principal)
    admit_document(space, filename="guide.md", data=GUIDE.encode(), enqueue=False)
    compile_all()
    giraffe = KnowledgeNode.objects.get(text__contains="Giraffes")

    def scripted(body):  # the neighbour answers the question best
        return [0.97 if "Giraffes" in d else 0.3 if "Zebras" in d else 0.1 for d in body["docs"]]

    dify.rerank_responder = scripted
    dify.reset_observations()
    result = retrieve(space, "zebras stripes", top_k=2, mode="deep", legs=("keyword",))
    [call] = dify.calls(RERANK)
    assert any("Giraffes" in d for d in call.body["docs"])
    assert len(call.body["docs"]) == 4  # the hit and its three expansions, one pool
    first = result.items[0]
    assert first.node_id == giraffe.id and first.score == 0.97
    assert first.context["relation"] == "neighbour"
    assert "Zebras" in result.items[1].text and result.items[1].score == 0.3
    assert {s["name"]: s["candidate_count"] for s in result.stages}["rerank"] == 4


# --- retrieval tests over HTTP, and the command line ----------------------------------------------


@pytest.mark.django_db
def test_retrieval_test_response_shape_and_stages(client, guide):
    space, _ = guide
    url = f"{SPACES}/{space.id}/retrieval-tests"
    response = client.post(
        url,
        {"query": "zebras stripes", "mode": "deep", "top_k": 3, "score_threshold": None},
        format="json",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert set(body) == {"mode", "items", "metrics", "plan", "stages"}
    assert body["mode"] == "deep"
    assert body["plan"]["fusion_limit"] == 9 and body["plan"]["dense_top_k"] == 50
    assert [s["name"] for s in body["stages"]] == STAGES
    for stage in body["stages"]:
        assert set(stage) == {"name", "status", "candidate_count", "filtered_count", "duration_ms"}
        assert stage["status"] in ("executed", "skipped")
    status = {s["name"]: s["status"] for s in body["stages"]}
    assert status == {
        "route": "skipped",
        "filter": "skipped",
        "embed": "executed",
        "dense": "executed",
        "keyword": "executed",
        "fusion": "executed",
        "expansion": "executed",
        "rerank": "executed",  # Deep's local reranker (KNOWLEDGE_MODEL_RUNTIME=local)
        "threshold": "skipped",
    }
    assert "Zebras" in body["items"][0]["text"]
    no_text = client.post(url, {"query": "zebras", "include_text": False}, format="json").json()
    assert no_text["items"] and all("text" not in i for i in no_text["items"])

    auto = client.post(url, {"query": "zebras", "mode": "auto"}, format="json")
    assert auto.status_code == 400 and auto.json()["code"] == "mode_unavailable"
    assert "auto is not available" in auto.json()["message"]
    unknown = client.post(url, {"query": "zebras", "topk": 3}, format="json")
    assert unknown.json()["code"] == "invalid_request" and unknown.json()["message"].startswith(
        "topk:"
    )
    bad = client.post(url, {"query": "zebras", "include_text": "no"}, format="json")
    assert bad.status_code == 400 and bad.json()["details"] == {"field": "include_text"}


def test_responses_are_bounded_by_dropping_the_lowest_items():
    from retrieval.api.views import bounded

    payload = {"items": [{"text": "x" * 1000} for _ in range(10)], "metrics": {}}
    out = bounded(payload, limit=5000)
    assert len(json.dumps(out)) <= 5000
    assert len(out["items"]) == 4 and out["metrics"]["response_truncated_items"] == 6
    assert "response_truncated_items" not in bounded({"items": [], "metrics": {}})["metrics"]


@pytest.mark.django_db
def test_kfs_query_mode_deep_with_filters(tmp_path, settings):
    settings.KNOWLEDGE_CHUNK_TARGET_CHARS = 200
    settings.KNOWLEDGE_CHUNK_OVERLAP_CHARS = 0
    call_command("kfs", "space", "create", "Zoo", "--tenant", "acme", "--slug", "zoo")
    from spaces.models import KnowledgeSpace

    zoo = KnowledgeSpace.objects.get(slug="zoo")
    admit_document(
        zoo, filename="guide.md", data=GUIDE.encode(), metadata={"team": "field"}, enqueue=False
    )
    admit_document(
        zoo,
        filename="copy.md",
        data=GUIDE.replace("Lions", "Tigers").encode(),
        metadata={"team": "office"},
        enqueue=False,
    )
    compile_all()
    filters = {
        "conditions": [
            {"name": "team", "field_type": "string", "comparison_operator": "is", "value": "field"}
        ]
    }

    def kfs(*args):
        out = StringIO()
        call_command("kfs", "query", *args, stdout=out)
        return out.getvalue()

    common = ("zebras stripes", "--space", "zoo", "--tenant", "acme", "--top-k", "3")
    out = json.loads(kfs(*common, "--mode", "deep", "--filters", json.dumps(filters), "--json"))
    assert out["mode"] == "deep"
    assert [i["citation"]["filename"] for i in out["items"]] == ["guide.md"] * 3
    assert "Zebras" in out["items"][0]["text"]
    assert {s["name"]: s for s in out["stages"]}["filter"]["filtered_count"] == 1
    assert out["metrics"]["filter_allowed_documents"] == 1
    text = kfs(*common, "--mode", "deep", "--filters", json.dumps(filters))
    assert "guide.md" in text and "copy.md" not in text
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="invalid_filter: --filters is not valid JSON"):
        kfs(*common, "--filters", "{nope")
    with pytest.raises(CommandError, match=r"invalid_filter: filters.conditions\[0\].field_type"):
        kfs(*common, "--filters", '{"conditions": [{"name": "a", "field_type": "text"}]}')


@pytest.mark.django_db
def test_auto_records_its_route_stage(guide):
    space, _ = guide
    result = retrieve(space, "zebras stripes", top_k=2, mode="auto")
    assert result.mode in ("fast", "deep") and result.route["requested_mode"] == "auto"
    route = result.stages[0]
    assert route["name"] == "route" and route["status"] == "executed"
    assert [s["name"] for s in result.stages] == STAGES
