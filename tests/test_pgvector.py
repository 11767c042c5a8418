"""The PostgreSQL dense leg: pgvector column, one HNSW index per model and dimension.

PostgreSQL only (skipped with the reason on SQLite). The corpora are written straight into the
tables (documents, nodes, then the backend's own ``index_dense``) with seeded random unit
vectors, so that a few thousand rows take a second; everything else is real: the migration's
column, the indexes :mod:`retrieval.indexing` creates, the backend's SQL, the planner.
"""

from __future__ import annotations

import hashlib
import uuid

import numpy as np
import pytest
from django.db import connection

from ingestion.models import Document, DocumentState, KnowledgeNode
from retrieval import indexing
from retrieval.backends import IndexedNode, SearchBackend, get_search_backend
from retrieval.backends import pgvector as pgv
from retrieval.backends.postgres import dense_statement
from tests.embedders import FAKE_MODELS, MODEL_A

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="pgvector is PostgreSQL's dense leg (run under scripts/with_postgres.py)",
)


@pytest.fixture(autouse=True)
def fake_models(settings):
    settings.KNOWLEDGE_EMBEDDING_MODELS = FAKE_MODELS


def _unit(rng: np.random.Generator, rows: int, dimension: int) -> np.ndarray:
    matrix = rng.normal(size=(rows, dimension)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def fill(space, model_id, *, documents, per_document, seed, capture):
    """Give ``space`` an active index version of ``model_id`` (its HNSW index created by the
    commit hook, as in production) and ``documents × per_document`` published nodes with seeded
    random unit vectors. Returns ``(version, [document ids], {node id: document id})``."""
    with capture(execute=True):
        version = indexing.change_embedding_model(space, model_id)
    rng = np.random.default_rng(seed)
    docs, nodes = [], []
    for d in range(documents):
        generation = uuid.uuid4()
        doc = Document(
            tenant_id=space.tenant_id,
            space=space,
            filename=f"doc-{d}.txt",
            mime_type="text/plain",
            size_bytes=10,
            sha256=hashlib.sha256(f"{space.id}:{d}".encode()).hexdigest(),
            storage_key=f"test/{space.id}/{d}",
            state=DocumentState.PUBLISHED,
            active_generation=generation,
            node_count=per_document,
        )
        docs.append(doc)
        for c in range(per_document):
            nodes.append(
                KnowledgeNode(
                    id=uuid.uuid4(),
                    space=space,
                    document=doc,
                    generation=generation,
                    chunk_index=c,
                    text=f"chunk {c} of document {d}",
                    start_offset=0,
                    end_offset=10,
                )
            )
    Document.objects.bulk_create(docs, batch_size=500)
    KnowledgeNode.objects.bulk_create(nodes, batch_size=1000)
    indexed = [IndexedNode(n.id, space.id, n.document_id, n.text) for n in nodes]
    get_search_backend().index_dense(
        indexed,
        _unit(rng, len(nodes), version.dimension),
        index_version=version.number,
        model_id=model_id,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE retrieval_densevector")
    return version, [d.id for d in docs], {n.id: n.document_id for n in nodes}


def exact(space, query, version, limit, documents=None):
    """The portable exact search (numpy over the float32 bytes): the reference."""
    return SearchBackend.dense_search(
        get_search_backend(),
        space.id,
        query,
        index_version=version.number,
        head_revision=int(uuid.uuid4().int % 10**9),
        limit=limit,
        dimension=version.dimension,
        documents=documents,
    )


def pg(space, query, version, limit, documents=None):
    return get_search_backend().dense_search(
        space.id,
        query,
        index_version=version.number,
        head_revision=0,
        limit=limit,
        dimension=version.dimension,
        documents=documents,
        model_id=version.model_id,
    )


def explain(space, query, version, limit, documents=None) -> str:
    """``EXPLAIN`` (no ANALYZE) of the statement the backend runs, under its settings."""
    sql, params = dense_statement(
        space.id,
        pgv.vector_literal(query),
        version.model_id,
        version.dimension,
        version.number,
        limit,
        documents,
    )
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.fixture
def second_space(principal):
    from spaces.services import create_space

    return create_space(principal, name="Second space")


def test_dense_query_uses_the_hnsw_index_of_its_model_and_dimension(
    space, django_capture_on_commit_callbacks
):
    version, _, _ = fill(
        space,
        MODEL_A,
        documents=200,
        per_document=20,
        seed=1,
        capture=django_capture_on_commit_callbacks,
    )
    name = pgv.index_name(MODEL_A, 8)
    definition = pgv.hnsw_indexes(connection)[name]
    assert "USING hnsw (((embedding)::vector(8)) vector_ip_ops)" in definition
    assert f"model_id)::text = '{MODEL_A}'::text" in definition
    assert "dimension = 8" in definition
    query = _unit(np.random.default_rng(9), 1, 8)[0]
    plan = explain(space, query, version, 10)
    print(plan)
    assert f"Index Scan using {name} on retrieval_densevector v" in plan
