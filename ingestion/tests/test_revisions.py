"""Document revisions (ingestion.revisions): a replacement compiles as a candidate beside the
published revision and swaps in one transaction; a failed candidate leaves the old one serving."""

from __future__ import annotations

import base64
import hashlib
import threading

import pytest
from django.db import connection

from ingestion import documents
from ingestion.models import Document, DocumentRevision
from knowledgefs import storage
from knowledgefs.testing.fixtures import compile_all, upload
from retrieval.modes import retrieve

OLD = b"# Travel\n\nThe mileage rate is forty cents per kilometre for private cars.\n"
NEW = b"# Travel\n\nThe mileage rate is fifty cents per kilometre for private cars.\n"


def revisions_of(client, space, document_id) -> dict:
    response = client.get(f"/v1/knowledge-spaces/{space.id}/documents/{document_id}/revisions")
    assert response.status_code == 200, response.content
    return response.json()


@pytest.mark.django_db
def test_a_replacement_is_a_candidate_until_it_publishes(
    client, space, object_storage, django_capture_on_commit_callbacks
):
    document_id = upload(client, space, "travel.md", OLD).json()["document"]["id"]
    compile_all()
    document = Document.objects.get()
    old_key = document.storage_key
    listed = revisions_of(client, space, document_id)
    assert [(r["number"], r["state"]) for r in listed["results"]] == [(1, "active")]

    admission = documents.replace_document(document, filename="travel-2.md", data=NEW)
    assert admission.document.id == document.id and not admission.created
    states = [
        (r["number"], r["state"]) for r in revisions_of(client, space, document_id)["results"]
    ]
    assert states == [(2, "candidate"), (1, "active")]
    # the old revision keeps answering, cited as revision 1
    item = retrieve(space, "mileage rate", top_k=1, score_threshold=None).items[0]
    assert "forty" in item.text and item.citation["revision"] == 1
    assert item.citation["filename"] == "travel.md"

    with django_capture_on_commit_callbacks(execute=True):
        compile_all()
    item = retrieve(space, "mileage rate", top_k=1, score_threshold=None).items[0]
    assert "fifty" in item.text and item.citation["revision"] == 2
    assert item.citation["filename"] == "travel-2.md"
    document.refresh_from_db()
    assert document.sha256 == hashlib.sha256(NEW).hexdigest()
    assert storage.read_object(document.storage_key, max_bytes=1024) == NEW
    states = [
        (r["number"], r["state"]) for r in revisions_of(client, space, document_id)["results"]
    ]
    assert states == [(2, "active"), (1, "superseded")]
    # the replaced source object is gone; one document, one source
    assert not (object_storage / old_key).exists()
    assert Document.objects.count() == 1


@pytest.mark.django_db
def test_a_candidate_that_fails_to_parse_leaves_the_old_revision_answering(
    client, space, object_storage
):
    document_id = upload(client, space, "travel.md", OLD).json()["document"]["id"]
    compile_all()
    document = Document.objects.get()
    # a PDF that is not one: sniffed as a PDF, fails in the parser
    broken = b"%PDF-1.7\n" + b"\x00garbage" * 20
    documents.replace_document(document, filename="travel.pdf", data=broken)
    compile_all()
    listed = revisions_of(client, space, document_id)["results"]
    assert [(r["number"], r["state"]) for r in listed] == [(2, "failed"), (1, "active")]
    assert listed[0]["error_code"]
    item = retrieve(space, "mileage rate", top_k=1, score_threshold=None).items[0]
    assert "forty" in item.text and item.citation["revision"] == 1
    document.refresh_from_db()
    assert document.state == "published" and document.filename == "travel.md"


@pytest.mark.django_db
def test_a_session_for_an_existing_document_replaces_it(client, space):
    document_id = upload(client, space, "travel.md", OLD).json()["document"]["id"]
    compile_all()
    created = client.post(
        f"/v1/knowledge-spaces/{space.id}/upload-sessions",
        {
            "file_name": "travel.md",
            "content_type": "text/markdown",
            "expected_size_bytes": len(NEW),
            "checksum_sha256": base64.b64encode(hashlib.sha256(NEW).digest()).decode(),
            "document_id": document_id,
        },
        format="json",
    ).json()["session"]
    done = client.generic(
        "POST",
        f"/v1/knowledge-spaces/{space.id}/upload-sessions/{created['id']}/small-file",
        NEW,
        content_type="application/octet-stream",
    )
    assert done.status_code == 200, done.content
    assert done.json()["session"]["document_id"] == document_id
    compile_all()
    states = [
        (r["number"], r["state"]) for r in revisions_of(client, space, document_id)["results"]
    ]
    assert states == [(2, "active"), (1, "superseded")]
    assert Document.objects.count() == 1
    assert DocumentRevision.objects.get(number=2).storage_key.endswith(f"{created['id']}/source")


@pytest.mark.django_db
def test_a_replacement_with_another_documents_bytes_is_a_duplicate(client, space):
    upload(client, space, "travel.md", OLD)
    upload(client, space, "other.md", NEW)
    document = Document.objects.get(filename="travel.md")
    with pytest.raises(documents.Conflict) as raised:
        documents.replace_document(document, filename="travel.md", data=NEW)
    assert raised.value.code == "duplicate_document"


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_queries_during_the_swap_see_the_old_or_the_new_text_never_neither_or_both(space):
    """Replace a document while another thread queries in a loop: every answer holds exactly
    one of the two versions."""
    document_id = documents.admit_document(space, filename="travel.md", data=OLD).document.id
    compile_all()
    stop = threading.Event()
    seen: list[tuple[bool, bool]] = []
    errors: list[BaseException] = []

    def query_loop() -> None:
        try:
            while not stop.is_set():
                items = retrieve(space, "mileage rate kilometre", top_k=5, score_threshold=None)
                texts = [
                    i.text for i in items.items if i.citation["document_id"] == str(document_id)
                ]
                seen.append((any("forty" in t for t in texts), any("fifty" in t for t in texts)))
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)
        finally:
            connection.close()

    reader = threading.Thread(target=query_loop)
    reader.start()
    try:
        # the reader's first answer comes before the swap (its first query can be slower than
        # the whole replacement, and then it never sees the old text)
        while not seen and reader.is_alive():
            threading.Event().wait(0.01)
        document = Document.objects.get(id=document_id)
        documents.replace_document(document, filename="travel.md", data=NEW)
        compile_all()
        before = len(seen)
        while len(seen) < before + 5 and reader.is_alive():
            threading.Event().wait(0.05)
    finally:
        stop.set()
        reader.join(60)
    assert not errors, errors
    assert seen and seen[-1] == (False, True)
    assert (True, False) in seen
    assert all(old != new for old, new in seen), [s for s in seen if s[0] == s[1]][:5]


def _lanes_seen(monkeypatch) -> list[int]:
    """Wrap the wave's parse to record how many heavy-lane holders each parse runs under."""
    from ingestion import memory_gates
    from ingestion.compilation import waves

    seen: list[int] = []
    real = waves._parse

    def parse(job, *args):
        _, heavy_width = memory_gates.materialization_capacities()
        heavy = memory_gates.MachineSemaphore(memory_gates.MATERIALIZATION_HEAVY_GATE, heavy_width)
        seen.append(len(heavy.snapshot()["holders"]))
        return real(job, *args)

    monkeypatch.setattr(waves, "_parse", parse)
    return seen


@pytest.mark.django_db
def test_a_pdf_replacing_a_small_text_takes_the_heavy_lane(
    client, space, object_storage, settings, tmp_path, monkeypatch
):
    settings.VAR_DIR = tmp_path / "var"  # this test's own gate ledgers
    upload(client, space, "travel.md", OLD)
    seen = _lanes_seen(monkeypatch)
    compile_all()
    assert seen == [0]  # a small Markdown file: the light lane
    document = Document.objects.get()
    broken = b"%PDF-1.7\n" + b"\x00garbage" * 20  # sniffed as a PDF (its parse may fail)
    documents.replace_document(document, filename="travel.pdf", data=broken)
    compile_all()
    # routed by the candidate revision (a PDF), not by the published Markdown document
    assert seen == [0, 1]


@pytest.mark.django_db
def test_a_large_replacement_of_a_small_document_takes_the_heavy_lane(
    client, space, object_storage, settings, tmp_path, monkeypatch
):
    from ingestion import memory_gates

    settings.VAR_DIR = tmp_path / "var"
    monkeypatch.setattr(memory_gates, "HEAVY_SOURCE_BYTES", 4096)  # the 8 MiB line, scaled down
    upload(client, space, "travel.md", OLD)
    seen = _lanes_seen(monkeypatch)
    compile_all()
    document = Document.objects.get()
    large = NEW + b"\nPrivate cars on official travel are reimbursed per kilometre.\n" * 100
    assert len(large) > 4096 >= document.size_bytes
    documents.replace_document(document, filename="travel.md", data=large)
    compile_all()
    assert seen == [0, 1]
