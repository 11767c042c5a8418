"""The SQLite keyword leg on per-space tantivy indexes: visibility with publication, upserts,
filters before the limit, tenant isolation, faults (missing or corrupt index → /ready and 503),
``kfs reindex``, the recovery sweep's heal and the writer lock."""

from __future__ import annotations

import io
import shutil
import uuid

import pytest
import tantivy
from django.core.management import call_command
from django.db import connection

from ingestion.availability import set_document_availability
from ingestion.compilation.pipeline import compile_jobs, run_job
from ingestion.documents import admit_document, delete_document
from ingestion.models import CompilationJob, Document, KnowledgeNode, Stage
from ingestion.projection import IndexedNode, projector
from knowledgefs.auth.principal import Principal
from knowledgefs.health import check_search
from knowledgefs.testing.fixtures import compile_all
from retrieval.backends import SearchBackendError, get_search_backend
from retrieval.keyword_index import maintenance, store
from spaces.services import create_space, delete_space

pytestmark = pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite keyword leg")


def _search(space, text, limit=10, **kwargs):
    return get_search_backend().keyword_search(space.id, text, limit, **kwargs)


def _admit(space, name, text):
    return admit_document(space, filename=name, data=text.encode(), enqueue=False)


def _nodes(space) -> set[uuid.UUID]:
    return set(KnowledgeNode.objects.filter(space=space).values_list("id", flat=True))


def test_a_document_is_searchable_once_published_and_never_before_or_after(space, principal):
    admission = _admit(space, "w.txt", "Warranty claims for broken screens are handled here.")
    compile_jobs([admission.job.id], until=Stage.PROJECTION_BUILT)
    nodes = _nodes(space)
    assert get_search_backend().projection_counts(space.id)["keyword"] == len(nodes) > 0
    assert _search(space, "warranty screens") == []  # indexed, not published

    CompilationJob.objects.filter(id=admission.job.id).update(run_state="queued", lease_token=None)
    run_job(admission.job.id)
    assert {h.node_id for h in _search(space, "warranty screens")} == nodes  # the next query

    # Availability moves the publication head: the leg's verdicts of the old head are not reused.
    document = Document.objects.get(id=admission.document.id)
    version = set_document_availability(document.id, False, document.row_version)
    assert _search(space, "warranty") == []
    set_document_availability(document.id, True, version)
    assert {h.node_id for h in _search(space, "warranty")} == nodes

    delete_document(principal, space.id, document.id)
    assert _search(space, "warranty") == []
    assert get_search_backend().projection_counts(space.id)["keyword"] == 0


def test_a_retried_index_stage_does_not_duplicate_hits(space):
    _admit(space, "a.txt", "Photosynthesis converts light into chemical energy in plants.")
    compile_all()
    backend = get_search_backend()
    nodes = list(KnowledgeNode.objects.filter(space=space))
    indexed = [IndexedNode(n.id, n.space_id, n.document_id, n.text) for n in nodes]
    backend.index_keywords(indexed)
    backend.index_keywords(indexed)
    assert backend.projection_counts(space.id)["keyword"] == len(nodes)
    hits = _search(space, "photosynthesis light")
    assert sorted(h.node_id for h in hits) == sorted(n.id for n in nodes)


def test_documents_filter_applies_before_the_limit(space):
    strong = [_admit(space, f"s{i}.txt", f"apple apple apple orchard apple {i}") for i in range(6)]
    weak = _admit(space, "weak.txt", "An apple fell far from the tree in the long garden path.")
    compile_all()
    assert weak.document.id not in {
        KnowledgeNode.objects.get(id=h.node_id).document_id for h in _search(space, "apple", 3)
    }
    [hit] = _search(space, "apple", 1, documents=frozenset({weak.document.id}))
    assert KnowledgeNode.objects.get(id=hit.node_id).document_id == weak.document.id
    assert _search(space, "apple", 5, documents=frozenset()) == []
    assert len(strong) == 6


def test_tenants_are_isolated_and_statistics_are_per_space(space):
    _admit(space, "z.txt", "The zebra crossing near the school was repainted in spring.")
    _admit(space, "y.txt", "Spring rain filled the reservoir above the valley.")
    compile_all()
    [before] = _search(space, "zebra")
    other = create_space(Principal(tenant_id="other-tenant"), name="Other", slug="other")
    for i in range(5):
        _admit(other, f"z{i}.txt", f"zebra zebra herd number {i} grazing on the savanna")
    compile_all()
    [after] = _search(space, "zebra")
    assert after.node_id == before.node_id
    assert after.score == pytest.approx(before.score)  # idf from this space's documents only
    theirs = _nodes(other)
    assert {h.node_id for h in _search(other, "zebra")} == theirs
    assert not theirs & {h.node_id for h in _search(space, "zebra spring herd savanna", 50)}


def test_bc22_cjk_bigrams_lone_character_stop_words_and_stemming(space):
    _admit(space, "zh.txt", "人口普查显示城市人口增长。")
    _admit(space, "en.txt", "The runners were running quickly through the forests.")
    compile_all()
    zh = _nodes(space) - set(
        KnowledgeNode.objects.filter(document__filename="en.txt").values_list("id", flat=True)
    )
    assert {h.node_id for h in _search(space, "人口", language="cjk")} == zh
    assert {h.node_id for h in _search(space, "普", language="cjk")} == zh  # prefix of 普查
    en = _nodes(space) - zh
    assert {h.node_id for h in _search(space, "run forest")} == en  # stemmed both ways
    assert {h.node_id for h in _search(space, "the of running")} == en  # stop words dropped
    assert _search(space, "the") != []  # a query of stop words only still searches


def _published_space(space):
    _admit(space, "m.txt", "Mitochondria produce most of the cell's supply of energy.")
    compile_all()
    assert _search(space, "mitochondria")
    return store.current_path(space.id)


@pytest.fixture
def published(space):
    _published_space(space)
    return space


def test_a_missing_index_fails_ready_and_queries_until_reindex(published):
    space = published
    shutil.rmtree(store.space_dir(space.id))
    ok, status, detail = check_search()
    assert (ok, status) == (False, "failing")
    assert str(space.id) in detail and "missing" in detail
    with pytest.raises(SearchBackendError) as caught:
        _search(space, "mitochondria")
    assert (caught.value.status, caught.value.code) == (503, "search_backend_unavailable")
    out = io.StringIO()
    call_command("kfs", "reindex", "--space", space.slug, "--tenant", space.tenant_id, stdout=out)
    assert f"{space.id}" in out.getvalue() and "1 nodes indexed, swapped in" in out.getvalue()
    assert check_search()[0] is True
    assert len(_search(space, "mitochondria")) == 1


def test_a_corrupt_meta_json_is_named_and_healed_by_the_sweep(published):
    space = published
    (store.current_path(space.id) / "meta.json").write_text("{not json")
    store.forget(space.id)
    ok, _, detail = check_search()
    assert not ok and str(space.id) in detail and "meta.json" in detail
    with pytest.raises(SearchBackendError) as caught:
        _search(space, "mitochondria")
    assert caught.value.status == 503
    projector().recover_builds()  # the recovery sweep
    assert check_search()[0] is True
    assert len(_search(space, "mitochondria")) == 1


def test_the_sweep_rebuilds_an_index_behind_the_database(published):
    space = published
    with store.writer(space.id) as w:  # a lost write: the index misses a published node
        w.delete_all_documents()
    assert store.num_docs(space.id) == 0
    assert maintenance.behind(space.id)
    old = store.current_path(space.id)
    projector().recover_builds()
    assert not maintenance.behind(space.id)
    assert store.current_path(space.id) != old and not old.exists()
    assert len(_search(space, "mitochondria")) == 1


def test_a_busy_writer_gives_up_with_a_retryable_error(published, monkeypatch):
    space = published
    monkeypatch.setattr(store, "WRITER_WAIT_SECONDS", 0.2)
    other = tantivy.Index.open(str(store.current_path(space.id)))
    held = other.writer(15_000_000, 1)  # another process's writer, as far as the lock goes
    node = KnowledgeNode.objects.filter(space=space).first()
    with pytest.raises(SearchBackendError) as caught:
        get_search_backend().index_keywords(
            [IndexedNode(node.id, node.space_id, node.document_id, node.text)]
        )
    assert (caught.value.code, caught.value.retryable, caught.value.status) == (
        "keyword_index_busy",
        True,
        503,
    )
    held.rollback()
    del held


def test_deleting_a_space_removes_its_index(
    published, principal, django_capture_on_commit_callbacks
):
    space = published
    assert store.space_dir(space.id).exists()
    with django_capture_on_commit_callbacks(execute=True):
        delete_space(principal, space.id)
    assert not store.space_dir(space.id).exists()


@pytest.mark.django_db(transaction=True)
def test_migration_0009_is_reversible_and_refills_fts5(space):
    _admit(space, "r.txt", "Ribosomes translate messenger RNA into proteins.")
    compile_all()
    nodes = KnowledgeNode.objects.filter(space=space).count()
    try:
        call_command("migrate", "retrieval", "0008", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM retrieval_keyword_fts WHERE retrieval_keyword_fts MATCH %s",
                [f'text : "ribosom*" AND space_id : "{space.id.hex}"'],
            )
            assert cursor.fetchone()[0] == nodes  # the previous release's projection, whole
        shutil.rmtree(store.space_dir(space.id))
    finally:
        call_command("migrate", "retrieval", verbosity=0)
    assert "retrieval_keyword_fts" not in connection.introspection.table_names()
    assert store.num_docs(space.id) == nodes  # rebuilt by the forward migration
    assert len(_search(space, "ribosomes")) == nodes
