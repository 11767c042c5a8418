"""Index versions: changing a space's embedding model builds a new index beside the live one.

BC-19 (a Dify bug: switching the embedding model while documents were indexing mixed 1536- and
1024-d vectors and queries failed). Fake models A (8-d) and B (4-d) from
``knowledgefs/testing/embedders.py`` stand in for the two models; everything else is real: the
database, the compiler, the backend.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import numpy as np
import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone

from ingestion.compilation.pipeline import compile_jobs
from ingestion.compilation.recovery import drain_queued
from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document, KnowledgeNode, Stage
from knowledgefs.errors import InvalidInput
from knowledgefs.runtime import DEFAULT_MODEL_ID, UnknownEmbeddingModel, get_embedding_model
from knowledgefs.testing.embedders import FAKE_MODELS, MODEL_A, MODEL_B, EmbedderKilled
from knowledgefs.testing.fixtures import compile_all
from retrieval import index_builds, index_projection, index_versions
from retrieval.backends import IndexedNode, get_search_backend
from retrieval.models import DenseVector, IndexVersion
from retrieval.modes import retrieve
from spaces.models import KnowledgeSpace, PublicationHead

FIFTY_SECTIONS = "\n\n".join(
    f"# Topic {i}\n\nParagraph {i} talks about subject{i} and widget{i % 7} with gadget{i % 5}."
    for i in range(50)
).encode()
SEED = b"Rocket engines burn liquid oxygen and kerosene to produce thrust at launch."


@pytest.fixture(autouse=True)
def fake_models(settings):
    settings.KNOWLEDGE_EMBEDDING_MODELS = FAKE_MODELS
    models = {m: get_embedding_model(m) for m in FAKE_MODELS}
    for model in models.values():
        model.reset()
    yield models
    for model in models.values():
        model.reset()


@pytest.fixture
def space_a(space):
    """A space whose index is filled by model A (chosen before the first upload)."""
    version = index_versions.change_embedding_model(space, MODEL_A)
    assert (version.number, version.state, version.dimension) == (1, "active", 8)
    return space


def _admit(space, data, name):
    return admit_document(space, filename=name, data=data, enqueue=False)


def _requeue(job_id):
    """What the recovery sweep does for a worker that died: the attempt is queued again."""
    CompilationJob.objects.filter(id=job_id).update(run_state="queued", lease_token=None)


def visible_nodes(space) -> set:
    return set(
        KnowledgeNode.objects.filter(
            space=space, generation=F("document__active_generation")
        ).values_list("id", flat=True)
    )


def vectors_of(space, number=None):
    rows = DenseVector.objects.filter(space=space)
    if number is not None:
        rows = rows.filter(index_version=number)
    return rows


def assert_one_dimension(space):
    """Every vector of the active version has the version's dimension; returns the version."""
    active = IndexVersion.objects.get(space=space, state="active")
    dims = set(vectors_of(space, active.number).values_list("dimension", flat=True))
    assert dims <= {active.dimension}
    for vector in vectors_of(space, active.number).values_list("vector", flat=True):
        assert len(bytes(vector)) == 4 * active.dimension
    space.refresh_from_db()
    assert (space.embedding_model_id, space.embedding_dimension) == (
        active.model_id,
        active.dimension,
    )
    return active


def assert_fully_indexed(space, number):
    """Every published node has exactly one vector in version ``number``."""
    nodes = visible_nodes(space)
    ids = list(vectors_of(space, number).values_list("node_id", flat=True))
    assert len(ids) == len(set(ids))
    assert nodes <= set(ids)


# --- BC-19 --------------------------------------------------------------------------------------


def test_bc19_switching_the_model_mid_job_never_mixes_dimensions(space_a, fake_models):
    space = space_a
    _admit(space, SEED, "seed.txt")
    compile_all()
    big = _admit(space, FIFTY_SECTIONS, "fifty.md")
    # The worker chunks the 50-section document and is about to embed it with A...
    compile_jobs([big.job.id], until=Stage.NODES_GENERATED)
    assert KnowledgeNode.objects.filter(generation=big.job.id).count() == 50
    head = PublicationHead.objects.get(space=space).revision

    # ...when the knowledge base is switched to B.
    building = index_versions.change_embedding_model(space, MODEL_B)
    assert (building.number, building.state, building.dimension) == (2, "building", 4)
    space.refresh_from_db()
    assert space.embedding_model_id == MODEL_A  # still serving A

    # Queries keep using A while B builds.
    before = retrieve(space, "rocket engines thrust", top_k=5)
    assert before.metrics["index_version"] == 1
    assert before.items[0].citation["filename"] == "seed.txt"
    assert before.items[0].scores["dense"] > 0

    # The job finishes: its nodes are embedded for both versions and published.
    _requeue(big.job.id)
    compile_jobs([big.job.id])
    assert CompilationJob.objects.get(id=big.job.id).run_state == "succeeded"
    assert vectors_of(space, 1).filter(node__generation=big.job.id).count() == 50
    assert vectors_of(space, 2).filter(node__generation=big.job.id).count() == 50
    assert_one_dimension(space)
    during = retrieve(space, "subject17 widget3", top_k=3)
    assert during.metrics["index_version"] == 1
    assert during.items[0].citation["section_path"] == ["Topic 17"]

    # The rebuild embeds what B lacks (the seed document) and cuts over.
    fake_models[MODEL_B].reset()
    assert index_builds.rebuild_index_version(building.id, batch_size=8) == "active"
    assert fake_models[MODEL_B].texts_embedded == 1
    states = dict(IndexVersion.objects.filter(space=space).values_list("number", "state"))
    assert states == {1: "retired", 2: "active"}
    active = assert_one_dimension(space)
    assert (active.number, active.model_id, active.dimension) == (2, MODEL_B, 4)
    assert not vectors_of(space, 1).exists()  # the retired version's vectors are gone
    assert set(vectors_of(space).values_list("dimension", flat=True)) == {4}
    assert_fully_indexed(space, 2)
    assert PublicationHead.objects.get(space=space).revision > head

    after = retrieve(space, "subject17 widget3", top_k=3)
    assert after.metrics["index_version"] == 2
    assert after.items[0].citation["section_path"] == ["Topic 17"]
    assert retrieve(space, "anything", top_k=100).metrics["dense_candidates"] == 51

    # A second run of the same rebuild changes nothing.
    rows = set(vectors_of(space).values_list("id", "node_id", "index_version"))
    fake_models[MODEL_B].reset()
    assert index_builds.rebuild_index_version(building.id, batch_size=8) == "active"
    assert index_builds.cutover(building.id) == "active"
    assert fake_models[MODEL_B].calls == 0
    assert set(vectors_of(space).values_list("id", "node_id", "index_version")) == rows

    # New documents go to B only.
    _admit(space, b"Sourdough bread rises slowly because wild yeast ferments dough.", "b.txt")
    compile_all()
    assert set(vectors_of(space).values_list("index_version", "dimension")) == {(2, 4)}
    assert_fully_indexed(space, 2)


def test_a_job_that_embedded_with_the_old_model_is_carried_over_by_the_cutover(space_a):
    space = space_a
    _admit(space, SEED, "seed.txt")
    compile_all()
    big = _admit(space, FIFTY_SECTIONS, "fifty.md")
    # Projected with A only (the switch came after its embedding), not yet published.
    compile_jobs([big.job.id], until=Stage.PROJECTION_BUILT)
    building = index_versions.change_embedding_model(space, MODEL_B)
    assert index_builds.rebuild_index_version(building.id, batch_size=8) == "active"
    # The cutover embedded the in-flight nodes for B too.
    assert vectors_of(space, 2).filter(node__generation=big.job.id).count() == 50
    _requeue(big.job.id)
    compile_jobs([big.job.id])
    assert Document.objects.get(id=big.document.id).state == "published"
    assert set(vectors_of(space).values_list("index_version", "dimension")) == {(2, 4)}
    assert_fully_indexed(space, 2)
    assert retrieve(space, "subject3 widget3", top_k=1).items[0].citation["section_path"] == [
        "Topic 3"
    ]


def test_a_job_whose_old_version_retired_while_it_embedded_restarts_on_the_new_one(
    space_a, fake_models
):
    space = space_a
    big = _admit(space, FIFTY_SECTIONS, "fifty.md")
    compile_jobs([big.job.id], until=Stage.NODES_GENERATED)
    model_a = fake_models[MODEL_A]
    original = model_a.embed_documents
    switched = []

    def embed_then_switch(texts):
        out = original(texts)
        if not switched:  # the whole switch completes while the job is still embedding with A
            switched.append(index_versions.change_embedding_model(space, MODEL_B))
            assert index_builds.rebuild_index_version(switched[0].id) == "active"
        return out

    model_a.embed_documents = embed_then_switch
    try:
        _requeue(big.job.id)
        compile_jobs([big.job.id])
    finally:
        del model_a.embed_documents
    assert switched and CompilationJob.objects.get(id=big.job.id).run_state == "succeeded"
    # A's vectors were dropped (version 1 is retired); the nodes were embedded with B on commit.
    assert set(vectors_of(space).values_list("index_version", "dimension")) == {(2, 4)}
    assert_fully_indexed(space, 2)
    assert_one_dimension(space)
    assert retrieve(space, "subject9", top_k=1).metrics["index_version"] == 2


@pytest.mark.django_db(transaction=True)
def test_bc19_switching_from_another_thread_while_a_slow_job_embeds(principal, fake_models):
    from spaces.services import create_space

    space = create_space(principal, name="Threaded")
    index_versions.change_embedding_model(space, MODEL_A)
    _admit(space, FIFTY_SECTIONS, "fifty.md")
    fake_models[MODEL_A].delay = 0.01  # 50 chunks: about half a second of embedding
    errors = []

    def worker():
        try:
            drain_queued(space.id)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=worker)
    thread.start()
    deadline = time.monotonic() + 30
    while fake_models[MODEL_A].calls < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert fake_models[MODEL_A].calls >= 2, "the job never started embedding"
    building = index_versions.change_embedding_model(space, MODEL_B)  # mid-job
    thread.join(60)
    assert not thread.is_alive() and not errors
    assert Document.objects.get(space=space).state == "published"
    assert retrieve(space, "subject5", top_k=1).metrics["index_version"] == 1
    assert index_builds.rebuild_index_version(building.id, batch_size=8) == "active"
    assert_one_dimension(space)
    assert_fully_indexed(space, 2)
    assert set(vectors_of(space).values_list("dimension", flat=True)) == {4}
    result = retrieve(space, "subject5 widget5", top_k=1)
    assert result.metrics["index_version"] == 2
    assert result.items[0].citation["section_path"] == ["Topic 5"]


# --- rebuilds -----------------------------------------------------------------------------------


def test_a_rebuild_killed_halfway_resumes_without_duplicates(space_a, fake_models):
    space = space_a
    _admit(space, FIFTY_SECTIONS, "fifty.md")
    compile_all()
    building = index_versions.change_embedding_model(space, MODEL_B)
    model_b = fake_models[MODEL_B]
    model_b.fail_after_calls = 3  # the worker dies during its fourth batch
    with pytest.raises(EmbedderKilled):
        index_builds.rebuild_index_version(building.id, batch_size=8)
    building.refresh_from_db()
    assert building.state == "building"
    assert "EmbedderKilled" in building.last_error
    assert vectors_of(space, 2).count() == 24  # three committed batches survive
    assert retrieve(space, "subject1", top_k=1).metrics["index_version"] == 1

    model_b.fail_after_calls = None
    assert index_builds.rebuild_index_version(building.id, batch_size=8) == "active"
    assert model_b.texts_embedded == 50  # 24 before the crash + 26 after: nothing twice
    ids = list(vectors_of(space, 2).values_list("node_id", flat=True))
    assert len(ids) == len(set(ids)) == 50
    assert_fully_indexed(space, 2)
    assert_one_dimension(space)


def test_two_rebuilds_of_one_version_write_each_vector_once(space_a, fake_models):
    space = space_a
    _admit(space, FIFTY_SECTIONS, "fifty.md")
    compile_all()
    building = index_versions.change_embedding_model(space, MODEL_B)
    missing = list(index_builds._missing(building).values_list("id", "document_id", "text")[:10])
    matrix = fake_models[MODEL_B].embed_documents([m[2] for m in missing])
    assert index_builds._write_vectors(building, missing, matrix)
    assert index_builds._write_vectors(building, missing, matrix)  # a racing run: ignored
    assert vectors_of(space, 2).count() == 10
    assert index_builds.rebuild_index_version(building.id) == "active"
    assert vectors_of(space, 2).count() == 50


def test_the_cutover_embeds_documents_published_after_the_rebuild_read_its_batches(space_a):
    space = space_a
    _admit(space, SEED, "seed.txt")
    compile_all()
    building = index_versions.change_embedding_model(space, MODEL_B)
    # Simulate a compiler that did not know about version 2: it writes A's vectors only.
    late = _admit(space, FIFTY_SECTIONS, "fifty.md")
    compile_jobs([late.job.id], until=Stage.NODES_GENERATED)
    nodes = [
        IndexedNode(n.id, n.space_id, n.document_id, n.text)
        for n in KnowledgeNode.objects.filter(generation=late.job.id)
    ]
    vectors = get_embedding_model(MODEL_A).embed_documents([n.text for n in nodes])
    CompilationJob.objects.filter(id=late.job.id).update(run_state="failed")
    index_projection.index_projections(  # the one-model entry point
        nodes, index_projection.vectors_for_model(space.id, MODEL_A, vectors)
    )
    Document.objects.filter(id=late.document.id).update(active_generation=late.job.id)
    assert vectors_of(space, 2).count() == 0
    assert index_builds.cutover(building.id) == "active"
    assert_fully_indexed(space, 2)
    assert vectors_of(space, 2).count() == 51


def test_recovery_re_enqueues_a_stalled_build_once(space_a):
    from django_q.models import OrmQ

    space = space_a
    building = index_versions.change_embedding_model(space, MODEL_B)
    assert index_versions.recover_index_builds() == 0  # fresh: progress was just recorded
    IndexVersion.objects.filter(id=building.id).update(
        progress_at=timezone.now() - timedelta(hours=1)
    )
    queued = OrmQ.objects.count()
    assert index_versions.recover_index_builds() == 1
    assert OrmQ.objects.count() == queued + 1
    assert index_versions.recover_index_builds() == 0  # claimed: the next sweep leaves it alone
    from retrieval.tasks import rebuild_index

    assert rebuild_index(str(building.id)) == "active"
    assert index_versions.recover_index_builds() == 0


# --- choosing and changing the model ------------------------------------------------------------


def test_the_first_upload_creates_version_one_with_the_default_model(space):
    _admit(space, SEED, "seed.txt")
    version = IndexVersion.objects.get(space=space)
    assert (version.number, version.state, version.model_id) == (1, "active", DEFAULT_MODEL_ID)
    space.refresh_from_db()
    assert (space.embedding_model_id, space.embedding_dimension) == (
        DEFAULT_MODEL_ID,
        version.dimension,
    )
    _admit(space, b"another document entirely", "two.txt")
    assert IndexVersion.objects.filter(space=space).count() == 1


def test_changing_to_the_active_model_is_a_no_op_and_a_new_choice_replaces_a_build(space_a):
    space = space_a
    _admit(space, SEED, "seed.txt")
    compile_all()
    active = IndexVersion.objects.get(space=space, state="active")
    assert index_versions.change_embedding_model(space, MODEL_A) == active
    assert IndexVersion.objects.filter(space=space).count() == 1
    first = index_versions.change_embedding_model(space, MODEL_B)
    assert index_versions.change_embedding_model(space, MODEL_B) == first  # already building
    index_builds._fill(first, index_builds._missing(first), 8)
    assert vectors_of(space, first.number).count() == 1
    # Back to A while B builds: the build is dropped with its vectors.
    assert index_versions.change_embedding_model(space, MODEL_A) == active
    first.refresh_from_db()
    assert first.state == "retired"
    index_versions.purge_retired_vectors(space.id)  # what the commit hook does
    assert not vectors_of(space, first.number).exists()
    assert index_builds.rebuild_index_version(first.id) == "retired"  # a late delivery: nothing
    assert IndexVersion.objects.get(space=space, state="active") == active
    with pytest.raises(InvalidInput) as error:
        index_versions.change_embedding_model(space, "no/such-model")
    assert error.value.code == "unknown_embedding_model"
    assert MODEL_B in error.value.details["registered"]


def test_the_registry_serves_models_by_id():
    assert get_embedding_model(MODEL_A).dimension == 8
    assert get_embedding_model(MODEL_B).dimension == 4
    assert get_embedding_model(MODEL_A) is get_embedding_model(MODEL_A)
    with pytest.raises(UnknownEmbeddingModel, match="no/such-model"):
        get_embedding_model("no/such-model")


# --- the dense leg never mixes dimensions -------------------------------------------------------


def test_the_dense_matrix_never_mixes_dimensions(space_a, caplog):
    space = space_a
    _admit(space, FIFTY_SECTIONS, "fifty.md")
    compile_all()
    node = KnowledgeNode.objects.filter(space=space).first()
    # A foreign row slipped into version 1 (only possible by bypassing the services).
    DenseVector.objects.filter(node=node, index_version=1).update(
        dimension=4, vector=np.ones(4, dtype="<f4").tobytes()
    )
    PublicationHead.objects.filter(space=space).update(revision=999)  # a fresh matrix
    with caplog.at_level(logging.ERROR, logger="knowledgefs.retrieval"):
        result = retrieve(space, "subject4 widget4", top_k=100)
    assert result.metrics["dense_candidates"] == 49  # the 4-d row is left out, nothing fails
    if connection.vendor == "postgresql":
        return  # pgvector: the statement's ``dimension = 8`` leaves it out (no in-process matrix)
    assert "left out 1 vectors" in caplog.text
    backend = get_search_backend()
    view = backend._dense_matrices[(space.id, 1)].view
    assert view.count == 49 and view.matrix.shape[1] == 8
    assert node.id.hex.encode() not in set(view.node_hex[: view.count].tolist())


def test_a_matrix_of_the_wrong_dimension_is_refused(space_a):
    space = space_a
    _admit(space, SEED, "seed.txt")
    compile_all()
    node = KnowledgeNode.objects.get(space=space)
    DenseVector.objects.all().delete()
    item = IndexedNode(node.id, node.space_id, node.document_id, node.text)
    with pytest.raises(ValueError, match="refusing 4-d vectors"):
        index_projection.index_projections([item], {1: np.ones((1, 4), dtype=np.float32)})
    assert not DenseVector.objects.exists()


# --- the API ------------------------------------------------------------------------------------


def test_patching_the_embedding_model_starts_a_build(client, fake_models):
    created = client.post("/v1/knowledge-spaces", {"name": "Models"}, format="json").json()
    url = f"/v1/knowledge-spaces/{created['id']}"
    assert created["index"] == {"active": None, "building": None}
    chosen = client.patch(url, {"embedding_model_id": MODEL_A}, format="json")
    assert chosen.status_code == 200  # an empty space takes the model at once
    assert chosen.json()["index"] == {
        "active": {"number": 1, "model_id": MODEL_A, "dimension": 8},
        "building": None,
    }
    assert chosen.json()["embedding_model_id"] == MODEL_A
    space = KnowledgeSpace.objects.get(id=created["id"])
    _admit(space, SEED, "seed.txt")
    compile_all()

    revision = chosen.json()["revision"]
    patched = client.patch(
        url, {"embedding_model_id": MODEL_B, "revision": revision}, format="json"
    )
    assert patched.status_code == 202, patched.content
    body = patched.json()
    assert body["index"] == {
        "active": {"number": 1, "model_id": MODEL_A, "dimension": 8},
        "building": {"number": 2, "model_id": MODEL_B, "dimension": 4},
    }
    assert body["embedding_model_id"] == MODEL_A and body["revision"] == revision + 1
    assert client.get(url).json()["index"] == body["index"]
    listed = client.get("/v1/knowledge-spaces").json()["results"][0]
    assert listed["index"] == body["index"]
    again = client.patch(url, {"embedding_model_id": MODEL_B}, format="json")
    assert again.status_code == 202 and again.json()["revision"] == revision + 1

    unknown = client.patch(url, {"embedding_model_id": "no/such-model"}, format="json")
    assert unknown.status_code == 400
    assert unknown.json()["code"] == "unknown_embedding_model"
    stale = client.patch(url, {"embedding_model_id": MODEL_A, "revision": 1}, format="json")
    assert stale.status_code == 409

    building = IndexVersion.objects.get(space=space, state="building")
    assert index_builds.rebuild_index_version(building.id) == "active"
    done = client.get(url).json()
    assert done["index"] == {
        "active": {"number": 2, "model_id": MODEL_B, "dimension": 4},
        "building": None,
    }
    assert (done["embedding_model_id"], done["embedding_dimension"]) == (MODEL_B, 4)
    same = client.patch(url, {"embedding_model_id": MODEL_B}, format="json")
    assert same.status_code == 200 and same.json()["revision"] == done["revision"]
    query = client.post(f"{url}/retrieval-tests", {"query": "rocket thrust"}, format="json")
    assert query.status_code == 200
    assert query.json()["metrics"]["index_version"] == 2


def test_a_cutover_to_a_text_only_model_removes_the_visual_projections(space_a):
    import uuid

    import numpy as np

    from ingestion.models import VisualProjection

    _admit(space_a, SEED, "seed.txt")
    compile_all()
    document = Document.objects.get(space=space_a)
    VisualProjection.objects.create(
        id=uuid.uuid4(), space=space_a, document=document, generation=document.active_generation,
        asset_index=0, asset_key="assets/x.png", mime_type="image/png", sha256="0" * 64,
        vector_space_id="embedding-space-sha256:old", dimension=4,
        vector=np.ones(4, dtype=np.float32).tobytes(),
    )  # fmt: skip
    building = index_versions.change_embedding_model(space_a, MODEL_B)
    assert index_builds.rebuild_index_version(building.id, batch_size=8) == "active"
    assert not VisualProjection.objects.filter(space=space_a).exists()
