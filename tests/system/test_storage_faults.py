"""Object-storage failures under ``KNOWLEDGE_MODEL_RUNTIME=dify`` as API clients see them.

Against the local Dify contract server (knowledgefs/testing/dify_server.py) with its faults: a
failing storage is never a 500 (503 ``storage_unavailable`` with ``Retry-After``, 413
``file_too_large``, 502 ``storage_error``); a failed upload leaves no object behind; a delete
during an outage answers 503 with the rows (and objects) intact and succeeds when sent again; an
object Dify stored after the upload timed out is removed by `kfs storage sweep`.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIRequestFactory

from ingestion.models import Document, KnowledgeNode
from knowledgefs import boundary
from knowledgefs.dify.errors import (
    DatasourceError,
    EmbeddingDimensionMismatch,
    ModelRuntimeError,
    ObjectStorageError,
)
from knowledgefs.errors import api_exception_handler
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import OBJECT, TEST_INNER_KEY, wait_until
from knowledgefs.testing.fixtures import compile_all, upload
from spaces.models import KnowledgeSpace

pytestmark = pytest.mark.timeout(120)

dify_server = dify_fixtures.dify_server

TEXT = b"# Storage faults\n\nThe heron counts the reeds along the northern canal at dawn.\n"
OTHER = b"# Second\n\nA lantern maker repairs forty lanterns before the autumn fair.\n"


@pytest.fixture
def dify(settings, dify_server, space):
    """The Dify runtime, as ``KNOWLEDGE_MODEL_RUNTIME=dify`` sets it at start-up (the space is
    created first, with the embedded default's ready profile, as in
    tests/system/test_boundary.py)."""
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    settings.DIFY_OBJECT_STORAGE_REQUEST_TIMEOUT_MS = 1500
    settings.STORAGES = {
        **settings.STORAGES,
        "objects": boundary.objects_storage("dify", str(settings.OBJECT_STORAGE_DIR)),
    }
    return dify_server


def methods(server, method: str) -> list:
    return [r for r in server.calls(OBJECT) if r.method == method]


def assert_unavailable(response) -> None:
    assert response.status_code == 503, response.content
    body = response.json()
    assert body["code"] == "storage_unavailable", body
    assert body["details"]["retryable"] is True
    assert body["details"]["dify_code"] in ("STORAGE_UNAVAILABLE", "STORAGE_TIMEOUT")
    assert int(response["Retry-After"]) > 0


# --- uploads ------------------------------------------------------------------------------------


def test_an_upload_while_dify_storage_is_down_is_503_and_stores_nothing(dify, client, space):
    dify.add_fault("status", OBJECT, times=None, status=503)
    response = upload(client, space, "notes.md", TEXT)
    assert_unavailable(response)
    assert not Document.objects.exists() and dify.objects == {}

    dify.clear_faults()
    assert upload(client, space, "notes.md", TEXT).status_code == 202
    assert len(dify.objects) == 1


def test_a_checksum_mismatch_on_upload_is_502_storage_error(dify, client, space):
    dify.add_fault("corrupt_upload", OBJECT)
    response = upload(client, space, "notes.md", TEXT)
    assert response.status_code == 502, response.content
    body = response.json()
    assert body["code"] == "storage_error"
    assert body["details"] == {"dify_code": "STORAGE_CHECKSUM_MISMATCH", "retryable": False}
    assert "SHA-256" in body["message"]
    assert not Document.objects.exists() and dify.objects == {}


def test_difys_413_on_upload_is_413_file_too_large(dify, client, space):
    dify.max_object_bytes = 16
    response = upload(client, space, "notes.md", TEXT)
    assert response.status_code == 413, response.content
    body = response.json()
    assert body["code"] == "file_too_large"
    assert body["details"]["dify_code"] == "STORAGE_OBJECT_TOO_LARGE"
    assert "object storage" in body["message"]
    assert not Document.objects.exists() and dify.objects == {}


def test_an_upload_whose_answer_is_dropped_leaves_no_object(dify, client, space):
    # Dify stores every attempt, then the connection drops before the answer's body.
    dify.add_fault("drop", OBJECT, times=None, after_bytes=0)
    response = upload(client, space, "notes.md", TEXT)
    assert_unavailable(response)
    assert methods(dify, "PUT") and all(r.status == 200 for r in methods(dify, "PUT"))
    assert len(methods(dify, "DELETE")) == 1
    assert dify.objects == {} and not Document.objects.exists()


def test_an_upload_that_times_out_after_dify_stored_it_leaves_no_object(
    dify, settings, client, space
):
    settings.DIFY_OBJECT_STORAGE_REQUEST_TIMEOUT_MS = 400
    settings.STORAGES = {**settings.STORAGES}  # a new storage with the shorter timeout
    dify.add_fault("stall", OBJECT, after_bytes=0, seconds=1.5)
    response = upload(client, space, "notes.md", TEXT)
    assert_unavailable(response)
    assert response.json()["details"]["dify_code"] == "STORAGE_TIMEOUT"
    assert wait_until(lambda: dify.in_flight(OBJECT) == 0, timeout=10)
    assert dify.objects == {} and not Document.objects.exists()


def test_an_upload_delayed_within_the_timeout_succeeds_and_keeps_its_object(dify, client, space):
    dify.delay(0.3, route=OBJECT)
    response = upload(client, space, "notes.md", TEXT)
    assert response.status_code == 202, response.content
    key = Document.objects.get().storage_key
    assert list(dify.objects) == [key]


def test_an_upload_dify_stores_after_the_timeout_is_removed_by_the_storage_sweep(
    dify, settings, client, space
):
    """A PUT Dify stores only after the client gave up (and after the cleanup DELETE) leaves an
    object no document references; the storage sweep reports it once past its grace period
    (never before) and ``--apply`` deletes it, leaving the other documents' objects."""
    import json
    import time
    from io import StringIO

    from django.core.management import call_command

    from knowledgefs.storage import WRITTEN_AT

    kept = upload(client, space, "kept.md", OTHER)
    assert kept.status_code == 202, kept.content
    settings.DIFY_OBJECT_STORAGE_REQUEST_TIMEOUT_MS = 300
    settings.STORAGES = {**settings.STORAGES}
    dify.delay(1.0, route=OBJECT)
    assert_unavailable(upload(client, space, "notes.md", TEXT))
    assert wait_until(lambda: dify.in_flight(OBJECT) == 0, timeout=10)
    dify.clear_faults()
    (stray,) = [k for k in dify.objects if k != Document.objects.get().storage_key]
    assert float(dify.objects[stray].metadata[WRITTEN_AT]) > time.time() - 60

    def run(*args: str) -> dict:
        out = StringIO()
        call_command("kfs", "storage", "sweep", *args, "--json", stdout=out)
        return json.loads(out.getvalue())

    assert run()["objects"] == []  # younger than the grace period: never a candidate
    for key in dify.objects:  # two days pass
        dify.objects[key].metadata[WRITTEN_AT] = str(int(time.time()) - 2 * 86400)
    report = run("--dry-run")
    assert [(o["key"], o["size_bytes"]) for o in report["objects"]] == [(stray, len(TEXT))]
    assert 2 * 86400 - 5 <= report["objects"][0]["age_seconds"] <= 2 * 86400 + 60
    assert stray in dify.objects and report["applied"] is False
    applied = run("--apply")
    assert applied["deleted"] == 1 and applied["failed"] == []
    assert list(dify.objects) == [Document.objects.get().storage_key]


def test_a_failed_cleanup_does_not_hide_the_uploads_own_error(dify, client, space, caplog):
    # Every answer dropped: the PUTs are stored, and the cleanup DELETE fails too (503).
    dify.add_fault("drop", OBJECT, times=3, after_bytes=0)
    dify.add_fault("status", OBJECT, skip=3, times=None, status=503)
    response = upload(client, space, "notes.md", TEXT)
    assert_unavailable(response)
    assert response.json()["details"]["dify_code"] == "STORAGE_UNAVAILABLE"
    messages = [r.getMessage() for r in caplog.records if r.name == "knowledgefs.documents"]
    assert any("could not delete the object of failed upload" in m for m in messages)
    assert not any("tenants/" in m for m in messages)  # the log names the id, not the key


# --- deletes ------------------------------------------------------------------------------------


def test_a_document_delete_during_an_outage_is_503_and_can_be_sent_again(dify, client, space):
    created = upload(client, space, "notes.md", TEXT)
    assert created.status_code == 202, created.content
    document_id = created.json()["document"]["id"]
    assert compile_all() >= 1
    url = f"/v1/knowledge-spaces/{space.id}/documents/{document_id}"
    assert client.get(url).json()["state"] == "published"
    key = Document.objects.get().storage_key
    nodes = KnowledgeNode.objects.filter(document_id=document_id).count()
    assert nodes > 0

    dify.add_fault("status", OBJECT, times=None, status=503)
    assert_unavailable(client.delete(url))
    assert client.get(url).status_code == 200
    assert KnowledgeNode.objects.filter(document_id=document_id).count() == nodes
    assert key in dify.objects

    dify.clear_faults()
    assert client.delete(url).status_code == 204
    assert client.get(url).status_code == 404
    assert dify.objects == {} and not KnowledgeNode.objects.exists()


def test_a_document_whose_object_is_already_gone_is_deleted(dify, client, space):
    created = upload(client, space, "notes.md", TEXT)
    document_id = created.json()["document"]["id"]
    dify.objects.clear()
    url = f"/v1/knowledge-spaces/{space.id}/documents/{document_id}"
    assert client.delete(url).status_code == 204
    assert not Document.objects.exists()


def test_a_space_delete_during_an_outage_is_503_and_keeps_the_space(dify, client, space):
    for name, data in (("a.md", TEXT), ("b.md", OTHER)):
        assert upload(client, space, name, data).status_code == 202
    url = f"/v1/knowledge-spaces/{space.id}"

    dify.add_fault("status", OBJECT, times=None, status=503)
    assert_unavailable(client.delete(url))
    assert client.get(url).status_code == 200
    assert Document.objects.filter(space=space).count() == 2 and len(dify.objects) == 2

    dify.clear_faults()
    assert client.delete(url).status_code == 204
    assert client.get(url).status_code == 404
    assert not KnowledgeSpace.objects.filter(id=space.id).exists()
    assert not Document.objects.exists() and dify.objects == {}


def test_a_space_delete_stops_at_the_first_document_the_storage_fails(dify, client, space):
    for name, data in (("a.md", TEXT), ("b.md", OTHER)):
        assert upload(client, space, name, data).status_code == 202
    url = f"/v1/knowledge-spaces/{space.id}"

    # The first document's DELETE goes through; every later one fails.
    dify.add_fault("status", OBJECT, skip=1, times=None, status=503)
    assert_unavailable(client.delete(url))
    remaining = list(Document.objects.filter(space=space))
    assert len(remaining) == 1
    assert list(dify.objects) == [remaining[0].storage_key]  # each row with its object
    assert client.get(url).status_code == 200
    listed = client.get(f"{url}/documents").json()
    assert [d["id"] for d in listed["results"]] == [str(remaining[0].id)]

    dify.clear_faults()
    assert client.delete(url).status_code == 204
    assert not KnowledgeSpace.objects.filter(id=space.id).exists() and dify.objects == {}


# --- the mapping itself -------------------------------------------------------------------------


def handled(exc: Exception, method: str = "GET"):
    request = getattr(APIRequestFactory(), method.lower())("/")
    return api_exception_handler(exc, {"request": request})


@pytest.mark.parametrize(
    ("error", "method", "status", "code"),
    [
        (ObjectStorageError.for_status(503, OBJECT), "POST", 503, "storage_unavailable"),
        (
            ObjectStorageError.of("timeout", "dify said zq9", retryable=True),
            "DELETE",
            503,
            "storage_unavailable",
        ),
        (ObjectStorageError.for_status(413, OBJECT), "POST", 413, "file_too_large"),
        (ObjectStorageError.of("too_large", "dify said zq9"), "GET", 502, "storage_error"),
        (ObjectStorageError.for_status(422, OBJECT), "POST", 502, "storage_error"),
        (ObjectStorageError.of("invalid", "dify said zq9"), "GET", 502, "storage_error"),
        (ObjectStorageError.for_status(403, OBJECT), "DELETE", 502, "storage_error"),
        (ObjectStorageError.for_status(404, OBJECT), "GET", 502, "storage_error"),
        (ModelRuntimeError.for_status(502, "/m"), "POST", 503, "model_runtime_unavailable"),
        (ModelRuntimeError.of("invalid", "dify said zq9"), "POST", 502, "model_runtime_error"),
        (
            EmbeddingDimensionMismatch("EMBEDDING_DIMENSION_MISMATCH", "dify said zq9"),
            "POST",
            502,
            "model_runtime_error",
        ),
        (DatasourceError.for_status(429, "/d"), "GET", 503, "datasource_unavailable"),
        (DatasourceError.of("error", "dify said zq9"), "GET", 502, "datasource_error"),
    ],
)
def test_dify_errors_map_to_stable_codes_never_500(error, method, status, code, settings):
    response = handled(error, method)
    assert response.status_code == status
    assert response.data["code"] == code
    assert response.data["details"] == {"dify_code": error.code, "retryable": error.retryable}
    assert (status == 503) == response.has_header("Retry-After")
    assert error.message not in response.data["message"]  # Dify's text stays in the log
