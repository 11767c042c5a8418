"""bench/replicate.py: copies of a compiled space's chunks are published, searchable on both legs
and cited to their own documents, and a space of copies deletes cleanly."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document, KnowledgeNode
from knowledgefs.testing.fixtures import compile_all
from retrieval.backends import get_search_backend
from retrieval.modes import retrieve
from spaces.models import KnowledgeSpace, PublicationHead
from spaces.services import create_space, delete_space

pytestmark = pytest.mark.django_db

_spec = importlib.util.spec_from_file_location(
    "bench_replicate", Path(__file__).resolve().parents[2] / "bench" / "replicate.py"
)
replicate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replicate)

TEXTS = {
    "cats.txt": "Cats are small carnivorous mammals that purr and sleep most of the day.",
    "rockets.txt": "Rocket engines burn liquid oxygen and kerosene to produce thrust.",
    "bread.txt": "Sourdough bread rises slowly because wild yeast ferments the dough.",
}


def test_copies_are_published_searchable_and_cited(space, principal):
    for name, text in TEXTS.items():
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    target = create_space(principal, name="Replicated")
    head_before = (
        PublicationHead.objects.filter(space_id=target.id)
        .values_list("revision", flat=True)
        .first()
        or 0
    )

    added = replicate.replicate_space(space, target, chunks=7)
    assert added["chunks"] == 7 and added["documents"] == 7 and added["copies"] == 3
    assert PublicationHead.objects.get(space_id=target.id).revision == head_before + 1
    copies = Document.objects.filter(space=target)
    assert copies.count() == 7
    assert {d.state for d in copies} == {"published"}
    sources = {str(d.id): d for d in Document.objects.filter(space=space)}
    for doc in copies:
        source = sources[doc.metadata["replica_of"]]
        assert doc.filename == f"c{doc.metadata['copy']}-{source.filename}"
        job = CompilationJob.objects.get(id=doc.active_generation)
        assert (job.stage, job.run_state, job.document_id) == ("published", "succeeded", doc.id)
    assert get_search_backend().projection_counts(target.id) == {"keyword": 7, "dense": 7}

    target = KnowledgeSpace.objects.get(id=target.id)
    for legs in (("keyword",), ("dense",), ("dense", "keyword")):
        result = retrieve(target, "cats purr and sleep", top_k=7, legs=legs, score_threshold=None)
        top = result.items[0]
        copy = Document.objects.get(id=top.citation["document_id"])
        assert copy.space_id == target.id
        assert sources[copy.metadata["replica_of"]].filename == "cats.txt"
        assert top.citation["filename"] == copy.filename
        assert top.text == TEXTS["cats.txt"]
        assert (top.citation["start_offset"], top.citation["end_offset"]) == (
            0,
            len(TEXTS["cats.txt"]),
        )
        node = KnowledgeNode.objects.get(id=top.node_id)
        assert node.generation == copy.active_generation
    hybrid = retrieve(target, "cats purr and sleep", top_k=7, score_threshold=None)
    cats = [i for i in hybrid.items if i.text == TEXTS["cats.txt"]]
    assert len(cats) == sum(
        1 for d in copies if sources[d.metadata["replica_of"]].filename == "cats.txt"
    )
    assert (
        retrieve(space, "cats purr", top_k=10, score_threshold=None)
        .items[0]
        .citation["document_id"]
        in sources
    )  # the source space is untouched

    more = replicate.replicate_space(space, target, chunks=9)
    assert more["chunks"] == 2
    assert sorted({d.metadata["copy"] for d in Document.objects.filter(space=target)}) == [
        1,
        2,
        3,
    ]
    assert sorted(Document.objects.filter(space=target).values_list("sha256", flat=True)) == sorted(
        set(Document.objects.filter(space=target).values_list("sha256", flat=True))
    )

    delete_space(principal, target.id)
    assert not Document.objects.filter(space_id=target.id).exists()
    assert get_search_backend().projection_counts(target.id) == {"keyword": 0, "dense": 0}
