"""The PostgreSQL dense leg: pgvector column, one HNSW index per model and dimension.

PostgreSQL only (skipped with the reason on SQLite). The corpora are written straight into the
tables (documents, nodes, then the backend's own ``index_dense``) with seeded random unit
vectors, so that a few thousand rows take a second; everything else is real: the migration's
column, the indexes :mod:`retrieval.index_versions` creates, the backend's SQL, the planner.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from django.db import connection, transaction

from ingestion.models import Document, KnowledgeNode
from knowledgefs.health import check_search
from knowledgefs.testing.embedders import FAKE_MODELS, MODEL_A, MODEL_B
from knowledgefs.testing.migration_support import migrate, migrate_to_latest
from knowledgefs.testing.rows import published_document
from retrieval import backends, index_versions
from retrieval.backends import IndexedNode, SearchBackend, get_search_backend
from retrieval.backends import pgvector as pgv
from retrieval.backends.postgres import dense_statement
from retrieval.checks import check_pgvector_available
from retrieval.models import DenseVector
from retrieval.modes import retrieve

#: The local model migration 0008 indexes (the embedded default when it was written).
MIGRATION_LOCAL_MODEL = "local/all-MiniLM-L6-v2-int8-onnx"

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
        version = index_versions.change_embedding_model(space, model_id)
    rng = np.random.default_rng(seed)
    docs, nodes = [], []
    for d in range(documents):
        generation = uuid.uuid4()
        doc = published_document(space, f"doc-{d}", generation=generation, node_count=per_document)
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
    assert f"Index Scan using {name} on retrieval_densevector v" in plan


def test_two_models_of_different_dimensions_get_their_own_index_and_never_cross(
    space, second_space, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    version_a, _, nodes_a = fill(
        space, MODEL_A, documents=100, per_document=20, seed=2, capture=capture
    )
    version_b, _, nodes_b = fill(
        second_space, MODEL_B, documents=100, per_document=20, seed=3, capture=capture
    )
    name_a, name_b = pgv.index_name(MODEL_A, 8), pgv.index_name(MODEL_B, 4)
    indexes = pgv.hnsw_indexes(connection)
    assert name_a != name_b and {name_a, name_b} <= set(indexes)
    assert "vector(4)" in indexes[name_b] and f"'{MODEL_B}'" in indexes[name_b]
    assert "vector(8)" not in indexes[name_b] and MODEL_A not in indexes[name_b]
    # No index covers two models: every HNSW index's predicate names exactly one.
    for definition in indexes.values():
        assert definition.count("model_id") == 1
    rng = np.random.default_rng(4)
    query_a, query_b = _unit(rng, 1, 8)[0], _unit(rng, 1, 4)[0]
    plan_a, plan_b = (
        explain(space, query_a, version_a, 10),
        explain(second_space, query_b, version_b, 10),
    )
    assert f"Index Scan using {name_a} " in plan_a and name_b not in plan_a
    assert f"Index Scan using {name_b} " in plan_b and name_a not in plan_b
    hits_a = pg(space, query_a, version_a, 50)
    hits_b = pg(second_space, query_b, version_b, 50)
    assert len(hits_a) == len(hits_b) == 50
    assert {h.node_id for h in hits_a} <= set(nodes_a)
    assert {h.node_id for h in hits_b} <= set(nodes_b)


def test_filtered_and_unfiltered_top_k_equal_the_exact_search_with_cosine_scores(
    space, django_capture_on_commit_callbacks
):
    version, documents, node_documents = fill(
        space,
        MODEL_A,
        documents=200,
        per_document=20,
        seed=5,
        capture=django_capture_on_commit_callbacks,
    )
    rng = np.random.default_rng(6)
    allowed = frozenset(documents[::40])  # 5 of 200 documents: 100 of 4,000 rows pass
    plan = explain(space, _unit(rng, 1, 8)[0], version, 10, allowed)
    # The visibility and filter subquery is a filter of the index scan, under its LIMIT.
    assert f"Index Scan using {pgv.index_name(MODEL_A, 8)} " in plan
    assert "Filter: ((space_id = " in plan and "AND (SubPlan 1))" in plan
    for query in _unit(rng, 8, 8):
        for documents_filter in (None, allowed):
            got = pg(space, query, version, 10, documents_filter)
            want = exact(space, query, version, 10, documents_filter)
            assert [h.node_id for h in got] == [h.node_id for h in want]
            assert np.allclose([h.score for h in got], [h.score for h in want], atol=1e-5)
            if documents_filter is not None:
                assert {node_documents[h.node_id] for h in got} <= allowed
    # The raw dense score is the cosine similarity: the best hit of a stored vector is itself.
    node_id = next(iter(node_documents))
    stored = np.frombuffer(bytes(DenseVector.objects.get(node_id=node_id).vector), dtype="<f4")
    best = pg(space, stored, version, 1)[0]
    assert best.node_id == node_id and abs(best.score - 1.0) < 1e-5


def test_disabled_and_unpublished_documents_are_never_returned(
    space, django_capture_on_commit_callbacks
):
    version, documents, node_documents = fill(
        space,
        MODEL_A,
        documents=100,
        per_document=20,
        seed=7,
        capture=django_capture_on_commit_callbacks,
    )
    by_document: dict = {}
    for node_id, document_id in node_documents.items():
        by_document.setdefault(document_id, []).append(node_id)
    disabled, unpublished = documents[3], documents[4]
    Document.objects.filter(id=disabled).update(enabled=False)
    Document.objects.filter(id=unpublished).update(active_generation=uuid.uuid4())
    for document_id in (disabled, unpublished):
        node_id = by_document[document_id][0]
        query = np.frombuffer(bytes(DenseVector.objects.get(node_id=node_id).vector), dtype="<f4")
        hits = pg(space, query, version, 100)
        assert len(hits) == 100
        assert not {node_documents[h.node_id] for h in hits} & {disabled, unpublished}
        # Even as the only allowed document (the filter leaves nothing visible).
        assert pg(space, query, version, 10, frozenset({document_id})) == []
    Document.objects.filter(id=disabled).update(enabled=True)
    node_id = by_document[disabled][0]
    query = np.frombuffer(bytes(DenseVector.objects.get(node_id=node_id).vector), dtype="<f4")
    assert pg(space, query, version, 1)[0].node_id == node_id


def test_a_server_without_the_extension_is_named_by_readiness_and_queries_get_503(space):
    assert check_search() == (
        True,
        "ok",
        "postgresql: BM25 impact lists and pgvector HNSW dense search",
    )
    assert pgv.extension_problem(connection) is None
    assert check_pgvector_available(databases=["default"]) == []  # what `migrate` checks first
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("DROP EXTENSION vector CASCADE")  # rolled back below
        ok, state, detail = check_search()
        assert (ok, state) == (False, "failing")
        assert "PostgreSQL extension 'vector' (pgvector" in detail
        assert "not set up in this database: run migrations" in detail
        saved = dict(backends._backends)
        backends._backends.clear()
        try:
            with pytest.raises(backends.SearchBackendUnavailable) as caught:
                retrieve(space, "anything", top_k=5)
        finally:
            backends._backends.update(saved)
        assert caught.value.code == "search_backend_unavailable"
        assert caught.value.details == {"vendor": "postgresql", "extension": "vector"}
        transaction.set_rollback(True)
    assert pgv.extension_problem(connection) is None


@pytest.mark.django_db(transaction=True)
def test_reversing_0008_drops_column_and_indexes_and_reapplying_refills(
    space, django_capture_on_commit_callbacks
):
    version, _, node_documents = fill(
        space,
        MODEL_A,
        documents=10,
        per_document=5,
        seed=8,
        capture=django_capture_on_commit_callbacks,
    )
    node_id = next(iter(node_documents))
    try:
        migrate("retrieval", "0007")
        assert pgv.hnsw_indexes(connection) == {}
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM information_schema.columns "
                "WHERE table_name = 'retrieval_densevector' AND column_name = 'embedding'"
            )
            assert cursor.fetchone()[0] == 0
            cursor.execute("SELECT count(*) FROM pg_extension WHERE extname = 'vector'")
            assert cursor.fetchone()[0] == 1  # kept: see the migration's docstring
        assert DenseVector.objects.count() == 50  # the portable copy stays
    finally:
        migrate_to_latest()
    # The migration indexes the models its rows use and the local model it names (MiniLM: the
    # embedded default when it was written), whatever the default is now.
    assert {pgv.index_name(MODEL_A, 8), pgv.index_name(MIGRATION_LOCAL_MODEL, 384)} <= set(
        pgv.hnsw_indexes(connection)
    )
    stored = np.frombuffer(bytes(DenseVector.objects.get(node_id=node_id).vector), dtype="<f4")
    hit = pg(space, stored, version, 1)[0]
    assert hit.node_id == node_id and abs(hit.score - 1.0) < 1e-5
    # This test commits: leave the schema as the migrations alone make it for the tests after.
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX {pgv.index_name(MODEL_A, 8)}")


def test_index_creation_is_idempotent_and_rebuilds_an_invalid_index(db):
    name = pgv.ensure_hnsw_index(connection, "test/idempotent", 16)
    assert name == pgv.index_name("test/idempotent", 16)
    assert pgv.ensure_hnsw_index(connection, "test/idempotent", 16) == name
    with connection.cursor() as cursor:  # what an interrupted CREATE INDEX CONCURRENTLY leaves
        cursor.execute(
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass", [name]
        )
    assert pgv._index_state(connection, name) == "invalid"
    assert pgv.ensure_hnsw_index(connection, "test/idempotent", 16) == name
    assert pgv._index_state(connection, name) == "valid"
    # Dimensions: vector up to 2,000, halfvec up to 4,000, no index above.
    assert pgv.index_type(2000) == "vector" and pgv.index_type(3072) == "halfvec"
    assert pgv.ensure_hnsw_index(connection, "test/huge", 4001) is None
    halfvec = pgv.ensure_hnsw_index(connection, "test/large", 3072)
    assert "halfvec(3072)) halfvec_ip_ops" in pgv.hnsw_indexes(connection)[halfvec]


def test_an_hnsw_attempt_past_its_time_bound_is_cancelled_and_the_exact_scan_answers(
    space, django_capture_on_commit_callbacks, monkeypatch, caplog
):
    from retrieval.backends import postgres

    version, _, _ = fill(
        space,
        MODEL_A,
        documents=20,
        per_document=20,
        seed=5,
        capture=django_capture_on_commit_callbacks,
    )
    query = _unit(np.random.default_rng(11), 1, 8)[0]
    backend = get_search_backend()
    kwargs = dict(index_version=version.number, head_revision=0, limit=10, dimension=8)
    want = backend.dense_search(space.id, query, model_id=MODEL_A, **kwargs)
    assert len(want) == 10 and getattr(want, "exact_fallback", None) is None

    def slow_when_indexed(*args, indexed=True):  # the indexed statement sleeps 0.5 s first
        sql, params = dense_statement(*args, indexed=indexed)
        if indexed:
            sql = f"WITH pause AS (SELECT pg_sleep(0.5)) SELECT q.* FROM ({sql}) q, pause"
        return sql, params

    monkeypatch.setattr(postgres, "dense_statement", slow_when_indexed)
    monkeypatch.setattr(postgres, "HNSW_ATTEMPT_TIMEOUT_MS", 50)
    with caplog.at_level("WARNING", logger="knowledgefs.retrieval"):
        got = backend.dense_search(space.id, query, model_id=MODEL_A, **kwargs)
    assert [h.node_id for h in got] == [h.node_id for h in want]
    assert "cancelled after 50 ms" in got.exact_fallback
    assert "cancelled after 50 ms" in caplog.text
    # The caller's transaction goes on, with its own statement timeout back.
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('statement_timeout')")
        assert cursor.fetchone()[0] == "0"
