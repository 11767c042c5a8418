"""Fast retrieval: fusion arithmetic, thresholds, citations that point into the canonical text."""

from __future__ import annotations

import uuid

import pytest

from ingestion.chunking import canonical_text
from ingestion.documents import admit_document
from ingestion.models import Document, ParseArtifact
from ingestion.parsing import Element
from knowledgefs.errors import InvalidInput
from knowledgefs.testing.fixtures import compile_all
from retrieval.backends import ScoredNode
from retrieval.modes import retrieve
from retrieval.recall import fuse, min_max

A, B, C = (uuid.UUID(int=i) for i in (1, 2, 3))


def test_min_max_normalises_each_leg_to_unit_range():
    assert min_max([ScoredNode(A, 10.0), ScoredNode(B, 5.0), ScoredNode(C, 0.0)]) == {
        A: 1.0,
        B: 0.5,
        C: 0.0,
    }
    assert min_max([ScoredNode(A, 3.0)]) == {A: 1.0}
    assert min_max([]) == {}


def test_fusion_is_an_equal_weight_mean_with_missing_legs_counting_zero():
    ranked = fuse(
        {
            "dense": [ScoredNode(A, 0.9), ScoredNode(B, 0.5)],
            "keyword": [ScoredNode(B, 12.0), ScoredNode(C, 2.0)],
        }
    )
    scores = {node: score for node, score, _ in ranked}
    assert scores == {A: 0.5, B: 0.5, C: 0.0}
    assert [r[0] for r in ranked] == [A, B, C]  # ties broken by id, deterministically
    single = fuse({"keyword": [ScoredNode(C, 2.0), ScoredNode(A, 1.0)]})
    assert [(n, s) for n, s, _ in single] == [(C, 1.0), (A, 0.0)]


def test_fusion_keeps_the_dense_legs_raw_cosine_without_changing_the_order():
    legs = {
        "dense": [ScoredNode(A, 0.21), ScoredNode(B, 0.17)],
        "keyword": [ScoredNode(B, 12.0), ScoredNode(C, 2.0)],
    }
    ranked = fuse(legs)
    assert [(n, s) for n, s, _ in ranked] == [(A, 0.5), (B, 0.5), (C, 0.0)]
    per_leg = {n: p for n, _, p in ranked}
    assert per_leg[A] == {"dense": 1.0, "dense_raw": 0.21}
    assert per_leg[B] == {"dense": 0.0, "keyword": 1.0, "dense_raw": 0.17}
    assert per_leg[C] == {"keyword": 0.0}  # the dense leg did not find it: no cosine
    assert fuse({"keyword": [ScoredNode(C, 2.0)]})[0][2] == {"keyword": 1.0}


def test_rrf_orders_by_summed_reciprocal_ranks():
    from retrieval.recall import reciprocal_rank_fusion

    ranked = reciprocal_rank_fusion(
        {"dense": [ScoredNode(A, 0.9), ScoredNode(B, 0.8)], "keyword": [ScoredNode(B, 5.0)]}, k=60
    )
    assert [r[0] for r in ranked] == [B, A]
    assert ranked[0][1] == pytest.approx((61 / 62 + 1.0) / 2)
    assert ranked[1][1] == pytest.approx(0.5)


@pytest.fixture
def corpus(space):
    texts = {
        "cats.txt": "Cats are small carnivorous mammals that purr and sleep most of the day.",
        "rockets.txt": "Rocket engines burn liquid oxygen and kerosene to produce thrust.",
        "bread.txt": "Sourdough bread rises slowly because wild yeast ferments the dough.",
    }
    for name, text in texts.items():
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    return space


@pytest.mark.django_db
def test_hybrid_ranks_the_matching_document_first_with_a_citation(corpus):
    # The default (calibrated) fusion: the match first with an absolute score in (0.5, 1).
    default = retrieve(corpus, "how do rocket engines make thrust?", top_k=3).items[0]
    assert default.citation["filename"] == "rockets.txt" and 0.5 <= default.score < 1.0
    # Min-max (selectable): the best of each leg scores 1.
    result = retrieve(corpus, "how do rocket engines make thrust?", top_k=3, fusion="minmax")
    assert result.mode == "fast"
    top = result.items[0]
    assert top.citation["filename"] == "rockets.txt"
    assert top.score == pytest.approx(1.0)
    assert top.scores["dense"] == pytest.approx(1.0) and top.scores["keyword"] == pytest.approx(1.0)
    assert set(top.citation) == {
        "document_id",
        "filename",
        "page_number",
        "section_path",
        "start_offset",
        "end_offset",
        "revision",
    }
    assert top.citation["revision"] == 1  # the document's first revision


@pytest.mark.django_db
def test_dense_leg_finds_paraphrases_the_keyword_leg_cannot(corpus):
    assert retrieve(corpus, "felines napping", top_k=3, legs=("keyword",)).items == []
    dense = retrieve(corpus, "felines napping", top_k=1, legs=("dense",)).items
    assert dense[0].citation["filename"] == "cats.txt"


@pytest.mark.django_db
def test_threshold_null_is_off_and_zero_is_a_real_threshold(corpus):
    everything = retrieve(corpus, "bread dough yeast", top_k=3, score_threshold=None).items
    assert len(everything) == 3
    zero = retrieve(corpus, "bread dough yeast", top_k=3, score_threshold=0).items
    assert len(zero) == 3  # every fused score is >= 0
    # Min-max: the best candidate scores 1, so 0.99 keeps it alone.
    strict = retrieve(
        corpus, "bread dough yeast", top_k=3, score_threshold=0.99, fusion="minmax"
    ).items
    assert [i.citation["filename"] for i in strict] == ["bread.txt"]
    assert all(i.score >= 0.99 for i in strict)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"top_k": 0}, "invalid_top_k"),
        ({"top_k": 101}, "invalid_top_k"),
        ({"score_threshold": 1.5}, "invalid_score_threshold"),
        ({"mode": "warp"}, "invalid_mode"),
    ],
)
def test_bad_requests_name_the_field(space, kwargs, code):
    with pytest.raises(InvalidInput) as error:
        retrieve(space, "q", **kwargs)
    assert error.value.code == code
    with pytest.raises(InvalidInput):
        retrieve(space, "   ")


@pytest.mark.django_db
def test_retrieval_test_api(client, corpus):
    url = f"/v1/knowledge-spaces/{corpus.id}/retrieval-tests"
    response = client.post(url, {"query": "sourdough", "top_k": 2}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert body["items"][0]["citation"]["filename"] == "bread.txt"
    bad = client.post(url, {"query": "x", "top_k": 1000}, format="json")
    assert bad.status_code == 400
    assert bad.json() == {
        "code": "invalid_top_k",
        "message": "top_k must be an integer from 1 to 100",
    }


@pytest.mark.django_db
def test_bc11_markdown_preface_is_retrievable_with_its_section_path(space):
    markdown = (
        "This preface mentions PREFACE-7Q and explains the scope.\n\n"
        "A second preface paragraph.\n\n"
        "# Section A\n\nIntro to section A.\n\n## Sub\n\nBody text about gearboxes.\n"
    )
    admit_document(space, filename="guide.md", data=markdown.encode(), enqueue=False)
    compile_all()
    hits = retrieve(space, "PREFACE-7Q", top_k=3, legs=("keyword",)).items
    assert hits and "PREFACE-7Q" in hits[0].text
    assert hits[0].citation["section_path"] == []
    gear = retrieve(space, "gearboxes", top_k=1, legs=("keyword",)).items[0]
    assert gear.citation["section_path"] == ["Section A", "Sub"]


@pytest.mark.django_db
def test_citation_offsets_point_into_the_canonical_text(space):
    paragraphs = [
        f"Paragraph {i} talks about topic number {i} in some detail. " * 6 for i in range(12)
    ]
    admit_document(space, filename="long.txt", data="\n\n".join(paragraphs).encode(), enqueue=False)
    compile_all()
    artifact = ParseArtifact.objects.get()
    elements = [
        Element(**{**e, "section_path": tuple(e["section_path"])}) for e in artifact.elements
    ]
    text, _ = canonical_text(elements)
    items = retrieve(space, "topic number 7", top_k=10).items
    assert len(items) > 1
    for item in items:
        c = item.citation
        assert text[c["start_offset"] : c["end_offset"]] == item.text


@pytest.mark.django_db
def test_cjk_text_is_found_by_keyword_without_spaces(space):
    admit_document(
        space, filename="tokyo.txt", data="東京都の人口統計は毎年更新される".encode(), enqueue=False
    )
    admit_document(space, filename="beijing.txt", data="北京市的人口数据".encode(), enqueue=False)
    compile_all()
    found = {
        i.citation["filename"] for i in retrieve(space, "人口", top_k=5, legs=("keyword",)).items
    }
    assert found == {"tokyo.txt", "beijing.txt"}
    top = retrieve(space, "人口統計", top_k=5, legs=("keyword",)).items[0]
    assert top.citation["filename"] == "tokyo.txt"
    assert Document.objects.filter(state="published").count() == 2


@pytest.mark.django_db
def test_a_single_cjk_character_matches_the_bigrams_it_starts(space):
    admit_document(space, filename="tokyo.txt", data="東京都の人口統計".encode(), enqueue=False)
    admit_document(space, filename="beijing.txt", data="北京市的人民公园".encode(), enqueue=False)
    admit_document(space, filename="kyoto.txt", data="京都の寺院".encode(), enqueue=False)
    compile_all()

    def files(query):
        return {
            i.citation["filename"] for i in retrieve(space, query, top_k=5, legs=("keyword",)).items
        }

    assert files("人") == {"tokyo.txt", "beijing.txt"}  # 人口, 人民
    assert files("寺") == {"kyoto.txt"}
    assert files("京") == {"tokyo.txt", "beijing.txt", "kyoto.txt"}  # 京都 in all three
    assert files("猫") == set()


@pytest.mark.django_db
def test_halfwidth_katakana_is_found_by_keyword_without_spaces(space):
    admit_document(space, filename="hw.txt", data="ﾃﾞｰﾀﾍﾞｰｽの設計".encode(), enqueue=False)
    admit_document(space, filename="fw.txt", data="東京都の人口統計".encode(), enqueue=False)
    compile_all()
    result = retrieve(space, "ﾃﾞｰﾀ", top_k=5, legs=("keyword",))
    assert [i.citation["filename"] for i in result.items] == ["hw.txt"]
    assert result.plan["query_language"] == "cjk"
    assert result.metrics["keyword_candidates"] == 1


@pytest.mark.django_db
def test_citation_offsets_can_be_checked_through_the_text_route(client, space):
    from knowledgefs.testing.fixtures import upload

    body = upload(
        client, space, "pages.md", b"# Intro\n\nAlpha beta.\n\n# Details\n\nGamma delta."
    ).json()
    doc = body["document"]["id"]
    url = f"/v1/knowledge-spaces/{space.id}/documents/{doc}/text"
    assert client.get(url).json()["code"] == "document_not_published"
    compile_all()
    item = client.post(
        f"/v1/knowledge-spaces/{space.id}/retrieval-tests", {"query": "gamma"}, format="json"
    ).json()["items"][0]
    c = item["citation"]
    piece = client.get(url, {"start": c["start_offset"], "end": c["end_offset"]}).json()
    assert piece["text"] == item["text"]
    assert client.get(url, {"start": 5, "end": 2}).json()["code"] == "invalid_range"
