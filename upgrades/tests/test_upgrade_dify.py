"""The staged run under ``KNOWLEDGE_MODEL_RUNTIME=dify`` against the Dify contract server
(knowledgefs/testing/dify_server.py): legacy bytes are read through Dify's object storage, the
Dataset's embedding model becomes the space's profile, the documents compile through Dify's model
runtime; a storage outage fails the step with ``storage_unavailable`` and a retry completes the
run."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from ingestion.compilation.recovery import drain_queued
from ingestion.models import Document
from knowledgefs import boundary
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import OBJECT, TEST_INNER_KEY
from knowledgefs.testing.upgrade_support import deliver_all, legacy_file, snapshot_body
from spaces.models import SpaceProfile
from upgrades.models import UpgradeJob

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

dify_server = dify_fixtures.dify_server

LEAVE = b"# Leave\n\nAnnual leave is twenty five days per year for every employee.\n"
RECEIPTS = b"# Receipts\n\nReceipts are due within thirty days of the purchase date.\n"
CONFIG = {
    "name": "Policies",
    "embedding_model_provider": "langgenius/openai/openai",
    "embedding_model": "text-embedding-3-small",
}


@pytest.fixture
def dify(settings, dify_server):
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = dify_server.url
    settings.DIFY_INNER_API_KEY = TEST_INNER_KEY
    settings.DIFY_OBJECT_STORAGE_REQUEST_TIMEOUT_MS = 1500
    settings.STORAGES = {
        **settings.STORAGES,
        "objects": boundary.objects_storage("dify", str(settings.OBJECT_STORAGE_DIR)),
    }
    return dify_server


def dify_client() -> APIClient:
    api = APIClient()
    api.credentials(HTTP_X_INNER_API_KEY=TEST_INNER_KEY)
    return api


def _start(documents) -> UpgradeJob:
    response = dify_client().post(
        "/internal/dataset-upgrades", snapshot_body(documents, config=CONFIG), format="json"
    )
    assert response.status_code == 201, response.content
    return UpgradeJob.objects.get(id=response.json()["id"])


def test_legacy_bytes_come_from_dify_storage_and_compile_with_the_datasets_model(dify):
    job = _start([legacy_file("leave.md", LEAVE), legacy_file("receipts.md", RECEIPTS)])
    assert deliver_all()[-1] == "succeeded"
    job = UpgradeJob.objects.get(id=job.id)
    assert job.resolved_configuration["embedding"]["mapped"] is True
    profile = SpaceProfile.objects.get(space_id=job.space_id)
    assert (profile.embedding_plugin_id, profile.embedding_provider, profile.embedding_model) == (
        "langgenius/openai",
        "openai",
        "text-embedding-3-small",
    )
    assert [r.method for r in dify.calls(OBJECT)].count("GET") >= 2  # the legacy reads
    drain_queued(job.space_id)
    published = Document.objects.filter(space_id=job.space_id, active_generation__isnull=False)
    assert sorted(published.values_list("filename", flat=True)) == ["leave.md", "receipts.md"]


def test_a_storage_outage_fails_the_step_and_a_retry_completes(dify):
    job = _start([legacy_file("leave.md", LEAVE)])
    dify.add_fault("status", OBJECT, times=None, status=503)
    results = deliver_all()
    assert results[-1] == "failed"
    job = UpgradeJob.objects.get(id=job.id)
    assert (job.status, job.stage, job.last_error_code) == (
        "failed",
        "submitting_documents",
        "storage_unavailable",
    )
    assert job.documents.get().status == "processing"  # picked again on retry
    dify.clear_faults()
    retry = dify_client().post(
        f"/internal/dataset-upgrades/{job.id}/retry", {"namespace_id": "tenant-a"}, format="json"
    )
    assert retry.status_code == 202
    assert deliver_all()[-1] == "succeeded"


def test_a_non_retryable_answer_about_one_object_fails_only_that_document(dify):
    job = _start([legacy_file("leave.md", LEAVE), legacy_file("receipts.md", RECEIPTS)])
    first = job.documents.order_by("id").first()
    # Dify answers 422 (checksum mismatch) for the first legacy read only: not retryable, and
    # about that object alone.
    dify.add_fault("status", OBJECT, times=1, status=422)
    results = deliver_all()
    assert results[-1] == "documents_failed"
    rows = {d.id: d for d in job.documents.all()}
    assert rows[first.id].last_error_code == "legacy_file_unreadable"
    assert "STORAGE_CHECKSUM_MISMATCH" in rows[first.id].last_error_message
    assert [d.status for d in rows.values()].count("succeeded") == 1
