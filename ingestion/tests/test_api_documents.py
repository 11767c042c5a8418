"""Document upload, compilation and listing through the API, with every kind of bad input."""

from __future__ import annotations

import pytest

from ingestion.models import CompilationJob, Document, KnowledgeNode
from knowledgefs.testing.fixtures import compile_all, upload
from retrieval.modes import retrieve

pytestmark = pytest.mark.django_db

TEXT = (
    "# Travel policy\n\nEmployees book economy class for flights under six hours.\n\n"
    "## Hotels\n\nHotel stays are reimbursed up to 180 euros per night in capital cities.\n"
)


def test_upload_compile_and_read_back(client, space):
    response = upload(client, space, "policy.md", TEXT.encode())
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["document"]["state"] == "queued"
    assert body["document"]["mime_type"] == "text/markdown"
    assert body["job"]["stage"] == "queued"

    compile_all()

    job = client.get(f"/v1/jobs/{body['job']['id']}").json()
    assert job["stage"] == "published"
    assert job["run_state"] == "succeeded"
    assert job["progress_percent"] == 100
    document = client.get(
        f"/v1/knowledge-spaces/{space.id}/documents/{body['document']['id']}"
    ).json()
    assert document["state"] == "published"
    assert document["nodes"] >= 1
    listing = client.get(f"/v1/knowledge-spaces/{space.id}/documents").json()
    assert [d["id"] for d in listing["results"]] == [body["document"]["id"]]


def test_the_storage_key_never_derives_from_the_filename(client, space, object_storage):
    upload(client, space, "../../etc/passwd.txt", b"harmless text about passwords")
    document = Document.objects.get()
    assert document.filename == "../../etc/passwd.txt"
    assert ".." not in document.storage_key and "passwd" not in document.storage_key
    stored = [p for p in object_storage.rglob("*") if p.is_file()]
    assert len(stored) == 1 and stored[0].is_relative_to(object_storage)


@pytest.mark.parametrize(
    "filename",
    [
        "test@|123.txt",
        "a/b.txt",
        "..\\x.txt",
        "trailing space.txt ",
        "报告 (最终).txt",
        "n" * 296 + ".txt",
    ],
)
def test_bc01_unusual_filenames_are_accepted_and_kept_verbatim(client, space, filename):
    response = upload(client, space, filename, f"content of {filename!r} 1 KB ".encode() * 40)
    assert response.status_code == 202, response.content
    assert response.json()["document"]["filename"] == filename
    compile_all()
    hit = retrieve(space, "content", top_k=1).items[0]
    assert hit.citation["filename"] == filename


def test_bc01_a_truly_unusable_filename_names_the_character(client, space):
    response = upload(client, space, "bad\x00name.txt", b"hello")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_filename"
    assert "U+0000" in response.json()["message"]
    assert not Document.objects.exists()


def test_empty_file_is_refused_up_front(client, space):
    # BC-18: a 0-byte .txt gets "no extractable content" up front and creates nothing.
    response = upload(client, space, "empty.txt", b"")
    assert response.status_code == 400
    assert response.json()["code"] == "empty_file"
    assert not Document.objects.exists() and not KnowledgeNode.objects.exists()


def test_bc18_whitespace_only_text_fails_with_no_extractable_text(client, space):
    response = upload(client, space, "blank.txt", b"   \n\n\t  \n")
    assert response.status_code == 202
    compile_all()
    document = Document.objects.get()
    assert document.state == "failed"
    assert document.error_code == "no_extractable_text"
    assert not KnowledgeNode.objects.exists()
    job = CompilationJob.objects.get()
    assert (job.stage, job.run_state) == ("failed", "failed")


def test_unknown_type_gets_415_with_the_supported_list(client, space):
    icon = b"\x00\x00\x01\x00\x01\x00\x10\x10" + b"\x00" * 64
    response = upload(client, space, "favicon.ico", icon)
    assert response.status_code == 415
    body = response.json()
    assert body["code"] == "unsupported_media_type"
    assert "application/pdf" in body["details"]["supported"]
    assert not Document.objects.exists()


def test_oversize_file_gets_413_naming_the_limit(client, space, settings, object_storage):
    settings.KNOWLEDGE_UPLOAD_MAX_BYTES = 2048
    response = upload(client, space, "big.txt", b"a" * 2049)
    assert response.status_code == 413
    assert response.json()["code"] == "file_too_large"
    assert "2048 bytes" in response.json()["message"]
    assert not Document.objects.exists()
    assert not [p for p in object_storage.rglob("*") if p.is_file()]


def test_a_body_declared_far_above_the_limit_is_refused_unread(client, space):
    response = client.generic(
        "POST",
        f"/v1/knowledge-spaces/{space.id}/documents",
        b"",
        content_type="multipart/form-data; boundary=x",
        CONTENT_LENGTH=str(16 * 1024 * 1024),
    )
    assert response.status_code == 413
    assert "15728640 bytes (15 MiB)" in response.json()["message"]


def test_bc03_duplicate_upload_is_409_with_the_existing_id(client, space):
    first = upload(client, space, "a.txt", b"same bytes about invoices").json()
    again = upload(client, space, "a.txt", b"same bytes about invoices")
    renamed = upload(client, space, "other-name.txt", b"same bytes about invoices")
    for response in (again, renamed):
        assert response.status_code == 409
        assert response.json()["code"] == "duplicate_document"
        assert response.json()["details"]["existing_document_id"] == first["document"]["id"]
    assert Document.objects.count() == 1
    compile_all()
    hits = retrieve(space, "invoices", top_k=10).items
    assert len(hits) == 1  # each chunk once


def test_bc03_replace_leaves_exactly_one_document(client, space):
    first = upload(client, space, "a.txt", b"quarterly invoices are due").json()
    compile_all()
    replaced = upload(
        client, space, "renamed.txt", b"quarterly invoices are due", on_duplicate="replace"
    )
    assert replaced.status_code == 202
    assert replaced.json()["document"]["id"] == first["document"]["id"]
    assert replaced.json()["created"] is False
    compile_all()
    assert Document.objects.count() == 1
    hits = retrieve(space, "invoices", top_k=10).items
    assert [h.citation["filename"] for h in hits] == ["renamed.txt"]
    assert KnowledgeNode.objects.count() == 1  # the old generation is gone


def test_missing_file_field_and_bad_duplicate_policy(client, space):
    response = client.post(f"/v1/knowledge-spaces/{space.id}/documents", {}, format="multipart")
    assert response.status_code == 400
    assert response.json()["code"] == "file_required"
    bad = upload(client, space, "a.txt", b"text", on_duplicate="merge")
    assert bad.status_code == 400
    assert bad.json()["code"] == "invalid_on_duplicate"


def test_cross_tenant_documents_and_jobs_are_404(client, space):
    from spaces.services import Principal, create_space

    body = upload(client, space, "a.txt", b"mine").json()
    other_space = create_space(Principal(tenant_id="tenant-b"), name="B")
    from rest_framework.test import APIClient

    from spaces.api_keys import create_api_key

    other = APIClient(HTTP_AUTHORIZATION=f"Bearer {create_api_key('tenant-b')[1]}")
    assert other.get(f"/v1/jobs/{body['job']['id']}").status_code == 404
    assert (
        other.get(f"/v1/knowledge-spaces/{space.id}/documents/{body['document']['id']}").status_code
        == 404
    )
    assert (
        other.get(
            f"/v1/knowledge-spaces/{other_space.id}/documents/{body['document']['id']}"
        ).status_code
        == 404
    )


def test_deleting_a_document_removes_it_from_every_leg(client, space):
    body = upload(client, space, "canary.txt", b"ZEBRA-CANARY-913 lives here").json()
    compile_all()
    for legs in (("keyword",), ("dense",), ("keyword", "dense")):
        assert retrieve(space, "ZEBRA-CANARY-913", top_k=5, legs=legs).items
    url = f"/v1/knowledge-spaces/{space.id}/documents/{body['document']['id']}"
    assert client.delete(url).status_code == 204
    for legs in (("keyword",), ("dense",), ("keyword", "dense")):
        assert retrieve(space, "ZEBRA-CANARY-913", top_k=5, legs=legs).items == []
    assert not KnowledgeNode.objects.exists()
    from retrieval.backends import get_search_backend

    # Not just hidden: the projection rows are gone too (BC-24: counts drop to match).
    assert get_search_backend().projection_counts(space.id) == {"keyword": 0, "dense": 0}


def test_a_scan_without_a_text_layer_fails_naming_its_pages(client, space, settings):
    from knowledgefs.testing.fixtures import shared_path

    settings.KNOWLEDGE_PDF_RASTERIZER = (
        "off"  # no OCR (ingestion/tests/test_pdf.py covers the OCR path)
    )
    scan = shared_path("data", "sample-docs", "loremipsum-flat.pdf").read_bytes()
    assert upload(client, space, "scan.pdf", scan).status_code == 202
    compile_all()
    document = Document.objects.get()
    assert (document.state, document.error_code) == ("failed", "no_extractable_text")
    assert "pages without a text layer: 1" in document.error_message
    assert not KnowledgeNode.objects.exists()


def test_get_in_space_is_the_one_404_for_a_row_outside_its_space(client, space, principal):
    import uuid

    from knowledgefs.errors import NotFound
    from spaces.services import create_space

    response = upload(client, space, "notes.txt", b"Scoped lookups.\n")
    document = Document.objects.get(id=response.json()["document"]["id"])
    other = create_space(principal, name="Other space")
    assert Document.objects.get_in_space(space, str(document.id), what="document") == document
    for ident in ("not-a-uuid", uuid.uuid4()):
        with pytest.raises(NotFound) as missing:
            Document.objects.get_in_space(space, ident, what="document")
        assert (missing.value.code, missing.value.message) == (
            "document_not_found",
            "document not found",
        )
    with pytest.raises(NotFound) as elsewhere:
        Document.objects.get_in_space(other, document.id, what="document")
    assert elsewhere.value.code == "document_not_found"


def test_a_json_body_sent_to_the_upload_route_says_multipart_is_required(client, space):
    url = f"/v1/knowledge-spaces/{space.id}/documents"
    for body, content_type in (
        ('{"file": "a.txt", "text": "hello"}', "application/json"),
        ("file=a.txt", "application/x-www-form-urlencoded"),
        ("hello", "text/plain"),
    ):
        response = client.generic("POST", url, body, content_type=content_type)
        assert response.status_code == 400, response.content
        body = response.json()
        assert body["code"] == "multipart_required", body
        assert "multipart/form-data" in body["message"] and content_type in body["message"]
        assert body["details"] == {"content_type": content_type}
    assert not Document.objects.exists()


def test_the_upload_engine_check_passes_on_sqlite_and_postgresql(client, space):
    """The MySQL/MariaDB refusal itself runs in tests/system/test_migrations_engine_writes.py."""
    from django.db import connection

    from retrieval.backends import require_supported_engine

    assert connection.vendor in ("sqlite", "postgresql")
    require_supported_engine()  # no exception


def test_bc42_a_job_canceled_by_its_documents_deletion_stays_readable(client, space):
    import uuid

    from ingestion.compilation.leases import Held, claim
    from ingestion.compilation.pipeline import _compile_claimed

    old = upload(client, space, "ledger.txt", b"ORPHAN-CANARY-42 in the ledger").json()
    document_id = old["document"]["id"]
    assert client.delete(f"/v1/jobs/{old['job']['id']}").status_code == 200  # an ended attempt
    job_id = client.post(f"/v1/jobs/{old['job']['id']}/retry", {}, format="json").json()["id"]
    token = claim(uuid.UUID(job_id), "worker-1")  # a worker holds the attempt: it is running
    assert token is not None
    assert client.get(f"/v1/jobs/{job_id}").json()["run_state"] == "running"

    url = f"/v1/knowledge-spaces/{space.id}/documents/{document_id}"
    assert client.delete(url).status_code == 204

    job = client.get(f"/v1/jobs/{job_id}")
    assert job.status_code == 200, job.content
    body = job.json()
    assert (body["state"], body["run_state"], body["stage"]) == ("canceled",) * 3
    assert body["document_id"] is None and body["error_code"] == "document_deleted"
    assert document_id in body["error_message"] and body["finished_at"]
    listed = client.get(f"/v1/knowledge-spaces/{space.id}/jobs").json()["results"]
    assert [j["id"] for j in listed] == [job_id]  # the ended first attempt went with it
    assert client.get(f"/v1/jobs/{old['job']['id']}").status_code == 404
    # Nothing more to do with it: no cancel, no retry of a document that is gone.
    assert client.delete(f"/v1/jobs/{job_id}").json()["code"] == "job_finished"
    retry = client.post(f"/v1/jobs/{job_id}/retry", {}, format="json")
    assert (retry.status_code, retry.json()["code"]) == (409, "document_deleted")
    # The worker that still runs it writes nothing: its lease is gone.
    _compile_claimed(Held({uuid.UUID(job_id): token}), None)
    assert not KnowledgeNode.objects.exists() and not Document.objects.exists()
    assert CompilationJob.objects.get(id=job_id).run_state == "canceled"
