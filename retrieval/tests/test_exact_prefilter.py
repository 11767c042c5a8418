"""The exact boost's text prefilter (:func:`retrieval.calibration.node_texts`) against queries
as long as the API allows (``RETRIEVAL_MAX_QUERY_CHARS``)."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings

from ingestion.documents import admit_document
from ingestion.models import KnowledgeNode
from knowledgefs.testing.fixtures import compile_all
from knowledgefs.testing.rows import published_document
from retrieval.calibration import PREFILTER_MAX_WORDS, exact_share, exact_targets, node_texts
from retrieval.modes import retrieve


def nodes_of(space, texts: list[str]) -> list[uuid.UUID]:
    generation = uuid.uuid4()
    doc = published_document(space, "exact", generation=generation, node_count=len(texts))
    doc.save()
    nodes = KnowledgeNode.objects.bulk_create(
        KnowledgeNode(
            id=uuid.uuid4(), space=space, document=doc, generation=generation, chunk_index=i,
            text=t, start_offset=0, end_offset=len(t),
        )
        for i, t in enumerate(texts)
    )  # fmt: skip
    return [n.id for n in nodes]


@pytest.mark.django_db
@pytest.mark.parametrize("shape", ["tokens", "phrase"])
def test_a_query_with_many_exact_targets_or_words_keeps_the_texts(space, shape):
    """Every token with a digit is a target and every word of a quoted phrase a LIKE of its
    own: a query of the allowed length may hold thousands of them (SQLite refuses an
    expression tree deeper than 1,000)."""
    words = [f"w{i}" for i in range(2000)]
    if shape == "tokens":
        query = " ".join(words)
    else:
        query = '"' + " ".join(words) + '"'
    assert len(query) <= settings.RETRIEVAL_MAX_QUERY_CHARS
    targets = exact_targets(query)
    texts = [" ".join(words), "w1 only", "nothing here"]
    ids = nodes_of(space, texts)
    found = node_texts(ids, targets)
    matched = {ids[i] for i, t in enumerate(texts) if exact_share(targets, t) > 0}
    assert matched == ({ids[0], ids[1]} if shape == "tokens" else {ids[0]})
    assert matched <= set(found)
    assert all(found[i] == texts[ids.index(i)] for i in found)


@pytest.mark.django_db
def test_up_to_the_bound_the_database_still_drops_the_texts_without_a_target(space):
    words = [f"w{i}" for i in range(PREFILTER_MAX_WORDS)]
    targets = exact_targets(" ".join(words))
    assert len(targets) == PREFILTER_MAX_WORDS
    ids = nodes_of(space, ["w7 here", "nothing here"])
    assert node_texts(ids, targets) == {ids[0]: "w7 here"}


@pytest.mark.django_db
def test_a_fast_search_with_two_thousand_identifiers_answers(space, settings):
    """End to end: the calibrated fusion of a query of 2,000 identifiers (within the query
    limit) ranks the document holding them instead of failing in the prefilter."""
    settings.KNOWLEDGE_LOCAL_RERANK_ENABLED = False
    words = [f"w{i}" for i in range(2000)]
    admit_document(space, filename="ids.txt", data=" ".join(words).encode(), enqueue=False)
    admit_document(space, filename="other.txt", data=b"Nothing to see here.", enqueue=False)
    compile_all()
    result = retrieve(space, " ".join(words), top_k=2, mode="fast", fusion="calibrated")
    assert result.items[0].citation["filename"] == "ids.txt"
    assert result.items[0].scores["exact"] > 0


@pytest.mark.django_db
def test_the_four_letters_unicode_folds_onto_ascii_keep_their_texts(space):
    """The pattern matches an ASCII target's i, s and k also as İ ı ſ K (Python's IGNORECASE;
    Turkish capitals are everyday text): the database keeps those texts too."""
    texts = [
        "\u0130STANBUL-34 plates",  # İSTANBUL-34
        "\u0131stanbul-34",  # ıstanbul-34
        "Stra\u017fse 12",  # Straſse 12
        "\u212a2 at 4 \u212a",  # K2 (Kelvin sign)
        "Ordu-52 \u0131 plates",  # a dotless ı, no target
        "istanbul-35",
    ]
    ids = nodes_of(space, texts)
    targets = exact_targets('istanbul-34 "strasse 12" k2')
    assert targets == ["strasse 12", "istanbul-34", "k2"]
    shares = [exact_share(targets, t) for t in texts]
    assert shares == [1 / 3, 1 / 3, 1 / 3, 1 / 3, 0.0, 0.0]
    found = node_texts(ids, targets)
    assert {ids[i] for i in range(4)} <= set(found)
    assert ids[5] not in found
    assert all(found[i] == texts[ids.index(i)] for i in found)
    # Without an i, s or k in a target, a text of those letters is not read for it.
    assert node_texts(ids, ["ordu-52"]) == {ids[4]: texts[4]}


@pytest.mark.django_db
def test_the_database_keeps_every_text_that_may_hold_an_ascii_target(space):
    """:func:`node_texts` lets the database drop the texts that cannot hold a target (LIKE over
    the lowered text): every text the pattern matches is kept, the rest mostly not, and LIKE's
    own wildcards in a target are literals."""
    texts = [
        "See Exhibit EX-4471 and the SIGNED\nlease, page 7.",
        "ex-4471b only",
        "100% of 50_50 deals!",
        "signed, then a lease",
        "Stra\u017fse 12 and K2",
        "at 1000 of 50x50",
    ]
    ids = nodes_of(space, texts)
    cases = {
        ("ex-4471",): {0, 1},  # 1: the substring, which the pattern then rejects
        ("signed lease",): {0, 3, 4},  # 4: its ſ may stand for the target's s
        ("100%", "50_50"): {2},  # not "1000" nor "50x50": % and _ are literals
        ("k2", "page 7"): {0, 4},
        ("50x50",): {5},
        ("missing9",): {4},  # ſ again
    }
    for targets, kept in cases.items():
        found = node_texts(ids, list(targets))
        assert set(found) == {ids[i] for i in kept}, targets
        assert all(found[ids[i]] == texts[i] for i in kept)
        matched = {i for i, t in enumerate(texts) if exact_share(list(targets), t) > 0}
        assert matched <= kept, targets
    # A non-ASCII target: every text is read (the pattern's Unicode folding decides).
    assert set(node_texts(ids, ["stra\u017fse"])) == set(ids)
