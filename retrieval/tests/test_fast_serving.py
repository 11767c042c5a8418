"""What a Fast query reads before and around its legs: the space's profile kept per unchanged
row, the documents a filter allows kept per publication head revision, and the keyword leg's
first window with the growth that keeps it exact (SQLite and PostgreSQL, whichever the run
uses)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ingestion.availability import patch_document_metadata, set_document_availability
from ingestion.documents import admit_document
from ingestion.models import Document, KnowledgeNode
from knowledgefs.testing.fixtures import compile_all
from retrieval import filters
from retrieval.backends import get_search_backend
from retrieval.modes import retrieve
from retrieval.recall import resolve_snapshot
from spaces.models import Readiness, SpaceProfile
from spaces.profiles import SpaceNotReady
from spaces.readiness import serving_profile

TEAM_HR = {
    "conditions": [
        {"name": "team", "field_type": "string", "comparison_operator": "is", "value": "hr"}
    ]
}


def admit(space, name: str, text: str, meta: dict | None = None) -> Document:
    return admit_document(
        space, filename=name, data=text.encode(), metadata=meta or {}, enqueue=False
    ).document


def names(result) -> list[str]:
    return sorted(i.citation["filename"] for i in result.items)


def row_version(doc: Document) -> int:
    return Document.objects.get(id=doc.id).row_version


@pytest.fixture
def handbook(space):
    docs = {
        "leave-hr.txt": admit(space, "leave-hr.txt", "Annual leave: 28 days.", {"team": "hr"}),
        "leave-ops.txt": admit(space, "leave-ops.txt", "Annual leave rota.", {"team": "ops"}),
        "leave-old.txt": admit(space, "leave-old.txt", "Old annual leave.", {"team": "hr"}),
    }
    compile_all()
    return space, docs


@pytest.mark.django_db
def test_an_unchanged_profile_row_is_served_from_memory_and_any_change_is_seen(handbook):
    space, _ = handbook
    first = serving_profile(space)
    assert serving_profile(space) is first  # the same row: the kept instance
    assert len(retrieve(space, "annual leave").items) == 3
    # A write that bypasses the model (no updated_at, no signal) is still seen by the next query.
    SpaceProfile.objects.filter(space_id=space.id).update(retrieval_top_k=1)
    assert serving_profile(space) is not first
    assert serving_profile(space).retrieval_top_k == 1
    assert len(retrieve(space, "annual leave").items) == 1
    SpaceProfile.objects.filter(space_id=space.id).update(state=Readiness.VALIDATION_FAILED)
    with pytest.raises(SpaceNotReady) as refused:
        retrieve(space, "annual leave")
    assert refused.value.code == "space_validation_failed"
    SpaceProfile.objects.filter(space_id=space.id).update(state=Readiness.READY)
    assert len(retrieve(space, "annual leave").items) == 1


@pytest.mark.django_db
def test_a_filter_is_resolved_once_per_head_revision_and_every_change_moves_it(handbook):
    space, docs = handbook
    revision = resolve_snapshot(space).head_revision
    first = filters.resolve(space, TEAM_HR, head_revision=revision)
    with CaptureQueriesContext(connection) as again:
        kept = filters.resolve(space, TEAM_HR, head_revision=revision)
    assert len(again.captured_queries) == 0
    assert kept.document_ids == first.document_ids
    assert names(retrieve(space, "annual leave", filters=TEAM_HR)) == [
        "leave-hr.txt",
        "leave-old.txt",
    ]
    # A metadata patch moves the head: the filter sees it at once.
    ops = docs["leave-ops.txt"]
    patch_document_metadata(ops.id, {"team": "hr"}, row_version(ops))
    assert resolve_snapshot(space).head_revision == revision + 1
    assert names(retrieve(space, "annual leave", filters=TEAM_HR)) == [
        "leave-hr.txt",
        "leave-old.txt",
        "leave-ops.txt",
    ]
    old = docs["leave-old.txt"]
    set_document_availability(old.id, False, row_version(old))
    assert names(retrieve(space, "annual leave", filters=TEAM_HR)) == [
        "leave-hr.txt",
        "leave-ops.txt",
    ]
    admit(space, "leave-new.txt", "New annual leave rules.", {"team": "hr"})
    compile_all()
    assert names(retrieve(space, "annual leave", filters=TEAM_HR)) == [
        "leave-hr.txt",
        "leave-new.txt",
        "leave-ops.txt",
    ]


@pytest.mark.django_db
def test_the_keyword_window_grows_past_hidden_hits_and_stays_exact(space):
    # Document k says "zephyr" k times: BM25 ranks 20 above 19 … above 1. The 15 best are
    # disabled, so the first window (limit + slack) holds no visible hit and must grow.
    docs = {
        k: admit(space, f"z{k:02d}.txt", " ".join(["zephyr"] * k + ["filler"] * (21 - k)))
        for k in range(1, 21)
    }
    compile_all()
    for k in range(6, 21):
        set_document_availability(docs[k].id, False, row_version(docs[k]))
    revision = resolve_snapshot(space).head_revision
    hits = get_search_backend().keyword_search(
        space.id, "zephyr", 3, language="latin", head_revision=revision
    )
    by_node = dict(Document.objects.filter(space=space).values_list("nodes__id", "filename"))
    assert [by_node[h.node_id] for h in hits] == ["z05.txt", "z04.txt", "z03.txt"]
    assert names(retrieve(space, "zephyr", top_k=10, legs=("keyword",))) == [
        f"z{k:02d}.txt" for k in range(1, 6)
    ]


@pytest.mark.django_db
def test_the_keyword_leg_follows_disable_enable_and_a_replaced_generation(space):
    docs = {n: admit(space, f"k{n}.txt", f"Quokka survey number {n}.") for n in range(3)}
    compile_all()

    def found() -> list[str]:
        return names(retrieve(space, "quokka survey", top_k=10, legs=("keyword",)))

    assert found() == ["k0.txt", "k1.txt", "k2.txt"]
    set_document_availability(docs[1].id, False, row_version(docs[1]))
    assert found() == ["k0.txt", "k2.txt"]
    set_document_availability(docs[1].id, True, row_version(docs[1]))
    assert found() == ["k0.txt", "k1.txt", "k2.txt"]
    # A new generation of k0 (the same bytes, replaced): only one of its generations is found,
    # and the idf of a term whose old nodes are deleted but not yet merged away stays defined.
    admit_document(
        space, filename="k0.txt", data=b"Quokka survey number 0.", on_duplicate="replace",
        enqueue=False,
    )  # fmt: skip
    compile_all()
    result = retrieve(space, "quokka survey", top_k=10, legs=("keyword",))
    assert names(result) == ["k0.txt", "k1.txt", "k2.txt"]
    generation = Document.objects.get(id=docs[0].id).active_generation
    k0 = [i for i in result.items if i.citation["filename"] == "k0.txt"]
    assert KnowledgeNode.objects.get(id=k0[0].node_id).generation == generation
