"""The keyword leg's visibility verdicts per publication head
(:mod:`retrieval.backends.head_verdicts`): read once per head, dropped when the head moves,
never stored from an older head, bounded."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ingestion.availability import set_document_availability
from ingestion.documents import admit_document
from ingestion.models import Document, KnowledgeNode
from knowledgefs.testing.fixtures import compile_all
from retrieval.backends import get_search_backend
from retrieval.backends.head_verdicts import HeadVerdicts
from spaces.models import PublicationHead

SPACE = uuid.uuid4()


class Reader:
    """A visibility read over a fixed set of visible ids that records what it was asked."""

    def __init__(self, visible: set[str]):
        self.visible = set(visible)
        self.asked: list[list[str]] = []

    def __call__(self, ids: list[str]) -> set[str]:
        self.asked.append(list(ids))
        return {i for i in ids if i in self.visible}


def test_each_id_is_read_once_per_head():
    read = Reader({"a", "c"})
    verdicts = HeadVerdicts(read)
    assert verdicts.visible(SPACE, 1, ["a", "b"]) == {"a"}
    assert verdicts.visible(SPACE, 1, ["a", "b", "c"]) == {"a", "c"}
    assert read.asked == [["a", "b"], ["c"]]  # only the id not yet known was read
    assert verdicts.visible(SPACE, 1, ["c", "b", "a"]) == {"a", "c"}
    assert read.asked == [["a", "b"], ["c"]]


def test_a_newer_head_starts_over_and_an_older_one_reads_everything_and_keeps_nothing():
    read = Reader({"a"})
    verdicts = HeadVerdicts(read)
    assert verdicts.visible(SPACE, 4, ["a", "b"]) == {"a"}
    read.visible = {"b"}  # the head moved: "a" was disabled, "b" published
    assert verdicts.visible(SPACE, 5, ["a", "b"]) == {"b"}
    assert read.asked[-1] == ["a", "b"]
    read.visible = {"a"}  # what a query still at head 4 reads now (its own statement)
    assert verdicts.visible(SPACE, 4, ["a", "b"]) == {"a"}
    assert read.asked[-1] == ["a", "b"]
    assert verdicts.visible(SPACE, 5, ["a", "b"]) == {"b"}  # head 5's verdicts were kept
    assert len(read.asked) == 3


def test_spaces_are_apart_and_an_unknown_head_is_never_cached():
    read = Reader({"a"})
    verdicts = HeadVerdicts(read)
    other = uuid.uuid4()
    assert verdicts.visible(SPACE, 1, ["a"]) == {"a"}
    assert verdicts.visible(other, 1, ["a"]) == {"a"}
    assert verdicts.visible(SPACE, None, ["a"]) == {"a"}
    assert verdicts.visible(SPACE, None, ["a"]) == {"a"}
    assert len(read.asked) == 4
    verdicts.forget(SPACE)
    assert verdicts.visible(SPACE, 1, ["a"]) == {"a"}
    assert verdicts.visible(other, 1, ["a"]) == {"a"}
    assert len(read.asked) == 5


def test_the_verdicts_of_a_space_start_over_past_the_limit():
    read = Reader({"a", "b", "c", "d"})
    verdicts = HeadVerdicts(read, limit=3)
    assert verdicts.visible(SPACE, 1, ["a", "b"]) == {"a", "b"}
    assert verdicts.visible(SPACE, 1, ["c", "d"]) == {"c", "d"}  # 4 > 3: cleared, then "c", "d"
    assert verdicts.visible(SPACE, 1, ["a", "c"]) == {"a", "c"}
    assert read.asked == [["a", "b"], ["c", "d"], ["a"]]


def test_the_least_recently_queried_space_is_dropped_past_the_bound():
    read = Reader({"a"})
    verdicts = HeadVerdicts(read, spaces=2)
    first, second, third = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for space in (first, second, first, third):  # "second" is the least recently queried
        verdicts.visible(space, 1, ["a"])
    assert len(read.asked) == 3  # the second query of "first" read nothing
    verdicts.visible(first, 1, ["a"])
    verdicts.visible(third, 1, ["a"])
    assert len(read.asked) == 3  # both still held
    verdicts.visible(second, 1, ["a"])
    assert len(read.asked) == 4  # dropped when "third" came, so read again


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the SQLite keyword leg's verdicts")
def test_the_keyword_leg_reads_visibility_once_per_head(space):
    admission = admit_document(
        space, filename="w.txt", data=b"Warranty claims for broken screens.", enqueue=False
    )
    compile_all()
    backend = get_search_backend()
    backend.keyword_verdicts.forget()
    nodes = set(KnowledgeNode.objects.filter(space=space).values_list("id", flat=True))
    head = PublicationHead.objects.get(space=space).revision

    def search():
        revision = PublicationHead.objects.get(space=space).revision
        hits = backend.keyword_search(space.id, "warranty", 10, head_revision=revision)
        return {h.node_id for h in hits}

    assert search() == nodes
    with CaptureQueriesContext(connection) as second:
        assert search() == nodes
    assert not [q for q in second.captured_queries if "active_generation" in q["sql"]]

    document = Document.objects.get(id=admission.document.id)
    set_document_availability(document.id, False, document.row_version)
    assert PublicationHead.objects.get(space=space).revision == head + 1
    assert search() == set()
