"""Object storage hygiene: no empty directories left by deletes (local storage)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ingestion.documents import delete_document
from ingestion.models import Document, ParseArtifact
from knowledgefs import storage
from knowledgefs.testing.fixtures import compile_all, upload
from knowledgefs.testing.pdf_fixtures import bc14_pdf, require_ocr

pytestmark = pytest.mark.django_db


def _directories(root: Path) -> list[str]:
    return sorted(str(Path(d).relative_to(root)) for d, _, _ in os.walk(root) if Path(d) != root)


def _empty_directories(root: Path) -> list[str]:
    return sorted(
        str(Path(d).relative_to(root))
        for d, dirs, files in os.walk(root)
        if Path(d) != root and not dirs and not files
    )


def test_deleting_documents_and_their_space_leaves_no_empty_directories(
    client, space, principal, object_storage
):
    require_ocr()
    pdf = bc14_pdf()  # its image-only page is stored as a page image and a thumbnail
    first = upload(client, space, "a.pdf", pdf).json()["document"]["id"]
    upload(client, space, "b.txt", b"Another document about tides.")
    compile_all()
    assets = [a for r in ParseArtifact.objects.values_list("assets", flat=True) for a in r or []]
    assert assets, "the PDF's page images are stored (the test needs asset directories)"
    delete_document(principal, space.id, first)
    # a's source and asset directories are gone; b's stay, and so does the shared part
    assert _empty_directories(object_storage) == []
    (second,) = Document.objects.filter(space=space)
    assert (object_storage / second.storage_key).exists()
    assert not any(str(first) in d for d in _directories(object_storage))

    from spaces.services import delete_space

    delete_space(principal, space.id)
    assert _directories(object_storage) == []
    assert object_storage.exists()  # the root itself stays


def test_a_write_racing_the_pruning_of_its_directory_never_fails(object_storage):
    """One thread deletes the only object of a directory (pruning it) while another keeps
    writing new objects into the same directory: every write lands, none raises."""
    stop = threading.Event()
    errors: list[BaseException] = []
    written: list[str] = []

    def deleter() -> None:
        n = 0
        while not stop.is_set():
            key = f"tenants/t/spaces/s/documents/d/churn-{n}"
            try:
                storage.put_object(key, b"x")
                storage.delete_object(key)
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)
            n += 1

    thread = threading.Thread(target=deleter)
    thread.start()
    try:
        for n in range(400):
            key = f"tenants/t/spaces/s/documents/d/kept-{n}"
            storage.put_object(key, b"kept")
            written.append(key)
            storage.delete_object(key)  # leaves the directory empty for the other thread
    finally:
        stop.set()
        thread.join()
    assert errors == []
    storage.put_object("tenants/t/spaces/s/documents/d/last", b"last")
    assert storage.read_object("tenants/t/spaces/s/documents/d/last", max_bytes=10) == b"last"
    storage.delete_object("tenants/t/spaces/s/documents/d/last")
    assert _directories(object_storage) == []


def test_pruning_stops_at_a_directory_that_is_not_empty_and_never_leaves_the_root(
    object_storage, tmp_path
):
    storage.put_object("a/b/one", b"1")
    storage.put_object("a/two", b"2")
    storage.delete_object("a/b/one")
    assert _directories(object_storage) == ["a"]
    storage.delete_object("a/two")
    assert _directories(object_storage) == [] and object_storage.is_dir()
    # a missing object in a missing directory is not an error
    storage.delete_object("x/y/z")
