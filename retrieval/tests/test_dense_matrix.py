"""The exact dense leg's incremental matrix (retrieval.backends.dense_matrix) on SQLite.

Rows are written the way compilation writes them (documents, nodes, the backend's
``index_dense``, vectors before the publication that moves the head); every search is compared
with a brute-force numpy top-k over the rows visible in the database at that moment.
"""

from __future__ import annotations

import hashlib
import uuid
from types import SimpleNamespace

import numpy as np
import pytest
from django.db import connection, transaction
from django.db.models import F

from ingestion.models import Document, DocumentState, KnowledgeNode
from retrieval.backends import IndexedNode, get_search_backend
from retrieval.backends import dense_matrix as dm
from retrieval.index_versions import ensure_active_version
from retrieval.models import DenseVector, IndexState, IndexVersion
from spaces.models import PublicationHead
from spaces.services import create_space

pytestmark = pytest.mark.skipif(
    connection.vendor != "sqlite",
    reason="the in-process matrix serves SQLite (PostgreSQL's dense leg is pgvector)",
)

DIM = 8


class Corpus:
    """A space's documents written through the same tables and backend calls as compilation."""

    def __init__(self, space, seed: int, number: int = 1):
        self.space = space
        self.rng = np.random.default_rng(seed)
        self.number = number
        self.backend = get_search_backend()
        self.made = 0

    def vectors(self, n: int) -> np.ndarray:
        m = self.rng.normal(size=(n, DIM)).astype(np.float32)
        return m / np.linalg.norm(m, axis=1, keepdims=True)

    def _nodes(self, document, generation, chunks: int) -> list[KnowledgeNode]:
        nodes = [
            KnowledgeNode(
                id=uuid.uuid4(), space=self.space, document=document, generation=generation,
                chunk_index=c, text=f"chunk {c}", start_offset=0, end_offset=5,
            )
            for c in range(chunks)
        ]  # fmt: skip
        KnowledgeNode.objects.bulk_create(nodes)
        self.embed(nodes)
        return nodes

    def embed(self, nodes, number: int | None = None) -> None:
        items = [IndexedNode(n.id, self.space.id, n.document_id, n.text) for n in nodes]
        self.backend.index_dense(
            items, self.vectors(len(nodes)), index_version=number or self.number, model_id="t"
        )

    def publish(self, chunks: int = 5) -> Document:
        """A new document: nodes and vectors first, then the head moves."""
        self.made += 1
        generation = uuid.uuid4()
        with transaction.atomic():
            document = Document.objects.create(
                tenant_id=self.space.tenant_id, space=self.space, filename=f"d{self.made}.txt",
                mime_type="text/plain", size_bytes=1,
                sha256=hashlib.sha256(f"{self.space.id}{self.made}".encode()).hexdigest(),
                storage_key=f"t/{self.space.id}/{self.made}", state=DocumentState.PUBLISHED,
                active_generation=None,
            )  # fmt: skip
            self._nodes(document, generation, chunks)
        self.activate(document, generation)
        return document

    def activate(self, document, generation) -> None:
        """Publish ``generation``: the other generations go, in the commit that moves the head."""
        with transaction.atomic():
            Document.objects.filter(id=document.id).update(active_generation=generation)
            old = list(
                KnowledgeNode.objects.filter(document=document)
                .exclude(generation=generation)
                .values_list("id", flat=True)
            )
            self.backend.delete_nodes(old)
            KnowledgeNode.objects.filter(id__in=old).delete()
            self.advance()

    def republish(self, document, chunks: int = 4):
        """A new generation of ``document``, staged (searchable nowhere) until :meth:`activate`."""
        generation = uuid.uuid4()
        self._nodes(document, generation, chunks)
        return generation

    def set_enabled(self, document, enabled: bool) -> None:
        Document.objects.filter(id=document.id).update(enabled=enabled)
        self.advance()

    def delete(self, document) -> None:
        with transaction.atomic():
            ids = list(KnowledgeNode.objects.filter(document=document).values_list("id", flat=True))
            self.backend.delete_nodes(ids)
            Document.objects.filter(id=document.id).delete()
            self.advance()

    def reembed(self, node_ids) -> None:
        """New vectors for these nodes in the same version: the old rows go, new rows come."""
        DenseVector.objects.filter(node_id__in=node_ids, index_version=self.number).delete()
        self.embed(list(KnowledgeNode.objects.filter(id__in=node_ids)))
        self.advance()

    def advance(self) -> None:
        PublicationHead.objects.advance(self.space.id)

    def head(self) -> int:
        return PublicationHead.objects.get(space_id=self.space.id).revision

    def search(self, query, limit, documents=None, number=None):
        return self.backend.dense_search(
            self.space.id, query, index_version=number or self.number,
            head_revision=self.head(), limit=limit, dimension=DIM, documents=documents,
        )  # fmt: skip


def brute_force(space, query, limit, documents=None, number=1):
    """The reference: numpy over the rows visible in the database now, ties by node id."""
    rows = DenseVector.objects.filter(
        space_id=space.id,
        index_version=number,
        node__generation=F("node__document__active_generation"),
        node__document__enabled=True,
    )
    if documents is not None:
        rows = rows.filter(node__document_id__in=documents)
    found = [(n, np.frombuffer(bytes(v), "<f4")) for n, v in rows.values_list("node_id", "vector")]
    if not found:
        return []
    scores = np.stack([v for _, v in found]) @ query
    ranked = sorted(
        zip([n for n, _ in found], scores.tolist(), strict=True), key=lambda r: (-r[1], r[0].hex)
    )
    return ranked[:limit]


def assert_exact(corpus, query, limit, documents=None, number=None):
    got = corpus.search(query, limit, documents, number)
    want = brute_force(corpus.space, query, limit, documents, number or corpus.number)
    assert [h.node_id for h in got] == [n for n, _ in want]
    np.testing.assert_allclose([h.score for h in got], [s for _, s in want], rtol=1e-5)
    return got


def assert_all_exact(corpus, queries, limits, docs):
    """Every query at every limit, and filtered to ``docs[2:5]``, against the brute force."""
    for q in queries:
        for limit in limits:
            assert_exact(corpus, q, limit)
        assert_exact(corpus, q, 5, documents=frozenset(d.id for d in docs[2:5]))


@pytest.fixture
def corpus(space):
    ensure_active_version(space, default_model=SimpleNamespace(model_id="t", dimension=DIM))
    return Corpus(space, seed=7)


@pytest.fixture
def inline(monkeypatch):
    """Compaction and growth run in the calling thread, with small thresholds."""
    backend = get_search_backend()
    monkeypatch.setattr(backend, "dense_compact_in_background", False)
    monkeypatch.setattr(backend, "dense_compact_min_rows", 1)
    monkeypatch.setattr(backend, "dense_compact_fraction", 0.2)
    monkeypatch.setattr(dm, "MIN_SPARE_ROWS", 4)
    return backend


def test_exact_through_publish_republish_disable_enable_delete_and_reembed(corpus, inline):
    docs = [corpus.publish(chunks=6) for _ in range(8)]
    queries = corpus.vectors(6)

    def check_all():
        assert_all_exact(corpus, queries, (1, 7, 100), docs)

    check_all()
    staged = corpus.republish(docs[0], chunks=3)  # vectors written, not yet visible
    check_all()
    corpus.activate(docs[0], staged)  # the new generation replaces the old one
    check_all()
    corpus.set_enabled(docs[1], False)
    check_all()
    corpus.publish(chunks=4)
    check_all()
    corpus.set_enabled(docs[1], True)  # its rows come back, never re-read
    check_all()
    corpus.delete(docs[2])
    check_all()
    nodes = list(KnowledgeNode.objects.filter(document=docs[3]).values_list("id", flat=True))
    corpus.reembed(nodes[:3])
    check_all()
    for d in docs[4:7]:
        corpus.delete(d)
    check_all()
    stats = inline.dense_stats(corpus.space.id, 1)
    assert stats["builds"] == 1  # every later revision was a refresh
    assert stats["compactions"] >= 1 and stats["dead"] < stats["rows"]
    live = DenseVector.objects.filter(space=corpus.space, index_version=1).count()
    assert stats["rows"] - stats["dead"] == live  # compacted: dead rows dropped, none lost


def test_a_refresh_reads_only_the_new_rows(corpus):
    for _ in range(4):
        corpus.publish(chunks=5)
    query = corpus.vectors(1)[0]
    assert_exact(corpus, query, 10)
    backend = corpus.backend
    stats = backend.dense_stats(corpus.space.id, 1)
    assert (stats["builds"], stats["rows_read"], stats["last_refresh_rows"]) == (1, 20, 20)
    corpus.publish(chunks=3)
    assert_exact(corpus, query, 10)
    stats = backend.dense_stats(corpus.space.id, 1)
    assert (stats["builds"], stats["refreshes"]) == (1, 1)
    assert (stats["rows_read"], stats["last_refresh_rows"]) == (23, 3)
    corpus.advance()  # a revision with no new vectors reads none
    assert_exact(corpus, query, 10)
    stats = backend.dense_stats(corpus.space.id, 1)
    assert (stats["rows_read"], stats["last_refresh_rows"], stats["builds"]) == (23, 0, 1)
    assert stats["bytes_per_row"] == 4 * DIM + dm.ROW_OVERHEAD_BYTES


def test_hidden_rows_come_back_when_enabled_again(corpus):
    docs = [corpus.publish(chunks=5) for _ in range(3)]
    query = corpus.vectors(1)[0]
    corpus.set_enabled(docs[0], False)
    assert_exact(corpus, query, 15)
    assert len(assert_exact(corpus, query, 100)) == 10
    corpus.set_enabled(docs[0], True)
    assert len(assert_exact(corpus, query, 100)) == 15
    stats = corpus.backend.dense_stats(corpus.space.id, 1)
    assert stats["hidden"] == 0 and stats["rechecked"] >= 5


def test_filters_restrict_before_the_limit(corpus):
    docs = [corpus.publish(chunks=10) for _ in range(6)]
    for q in corpus.vectors(5):
        allowed = frozenset({docs[1].id, docs[4].id})
        hits = assert_exact(corpus, q, 20, documents=allowed)
        assert len(hits) == 20  # all 20 rows of the two documents, not fewer
        node_docs = dict(KnowledgeNode.objects.values_list("id", "document_id"))
        assert {node_docs[h.node_id] for h in hits} == allowed
    assert corpus.search(corpus.vectors(1)[0], 5, documents=frozenset({uuid.uuid4()})) == []


def test_two_index_versions_are_separate_matrices(corpus):
    for _ in range(3):
        corpus.publish(chunks=4)
    IndexVersion.objects.create(
        space=corpus.space, number=2, model_id="t2", dimension=DIM, state=IndexState.BUILDING
    )
    corpus.embed(list(KnowledgeNode.objects.filter(space=corpus.space)), number=2)
    for q in corpus.vectors(4):
        one = assert_exact(corpus, q, 6, number=1)
        two = assert_exact(corpus, q, 6, number=2)
        assert [h.score for h in one] != [h.score for h in two]
    corpus.publish(chunks=2)  # version 2 holds no vector of it yet
    q = corpus.vectors(1)[0]
    assert len(assert_exact(corpus, q, 100, number=1)) == 14
    assert len(assert_exact(corpus, q, 100, number=2)) == 12


def test_another_spaces_vectors_are_never_returned(corpus, principal):
    other_space = create_space(principal, name="Other space")
    ensure_active_version(other_space, default_model=SimpleNamespace(model_id="t", dimension=DIM))
    other = Corpus(other_space, seed=8)
    for _ in range(3):
        corpus.publish(chunks=4)
        other.publish(chunks=4)
    mine = set(KnowledgeNode.objects.filter(space=corpus.space).values_list("id", flat=True))
    for q in corpus.vectors(3):
        hits = assert_exact(corpus, q, 100)
        assert len(hits) == 12 and {h.node_id for h in hits} <= mine
        assert not {h.node_id for h in assert_exact(other, q, 100)} & mine


def test_growth_keeps_every_row(corpus, inline):
    corpus.publish(chunks=3)
    query = corpus.vectors(1)[0]
    assert_exact(corpus, query, 5)
    for _ in range(6):  # more rows than the spare ones: the arrays grow
        corpus.publish(chunks=7)
        assert_exact(corpus, query, 50)
    stats = inline.dense_stats(corpus.space.id, 1)
    assert stats["rows"] == 45 and stats["growths"] + stats["inline_growths"] >= 1
    assert stats["builds"] == 1


def test_the_query_dimension_must_match(corpus):
    corpus.publish(chunks=2)
    with pytest.raises(ValueError, match="query vector has 4 dimensions, index has 8"):
        corpus.backend.dense_search(
            corpus.space.id, np.ones(4, np.float32), index_version=1,
            head_revision=corpus.head(), limit=3, dimension=DIM,
        )  # fmt: skip
