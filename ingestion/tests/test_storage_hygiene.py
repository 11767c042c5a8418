"""Object storage hygiene: no empty directories left by deletes (local storage)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ingestion.documents import admit_document, delete_document
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
    for directory, _, files in os.walk(object_storage):  # everything two days old
        for name in files:
            _age(object_storage, str(Path(directory, name).relative_to(object_storage)), 2 * 86400)
    assert _sweep()["objects"] == []  # sources and page images are all referenced
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


# --- the sweep of unreferenced objects ----------------------------------------------------------


def _sweep(*args: str) -> dict:
    import json
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("kfs", "storage", "sweep", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def _age(root: Path, key: str, seconds: float) -> None:
    import time

    stamp = time.time() - seconds
    os.utime(root / key, (stamp, stamp))


def test_the_storage_sweep_reports_then_deletes_only_old_unreferenced_objects(
    client, space, object_storage
):
    import uuid

    from ingestion.models import CompilationJob

    upload(client, space, "kept.txt", b"A document that stays.")
    compile_all()
    kept = Document.objects.get()
    day = 86400
    orphan = f"tenants/{space.tenant_id}/spaces/{space.id}/documents/{uuid.uuid4()}/source"
    young = f"tenants/{space.tenant_id}/spaces/{space.id}/documents/{uuid.uuid4()}/source"
    foreign = "upload_files/tenant-a/uf-1"  # Dify's own area: never ours to sweep
    live = admit_document(space, filename="live.txt", data=b"Still compiling.").job
    live_asset = f"assets/{space.id}/{live.document_id}/{live.id}/0.png"
    dead_asset = f"assets/{space.id}/{uuid.uuid4()}/{uuid.uuid4()}/0.png"
    for key, data in [
        (orphan, b"orphan bytes"),
        (young, b"young"),
        (foreign, b"legacy"),
        (live_asset, b"png"),
        (dead_asset, b"old png!"),
    ]:
        storage.put_object(key, data)
    for key in (orphan, foreign, live_asset, dead_asset, kept.storage_key):
        _age(object_storage, key, 2 * day)
    _age(object_storage, young, 900)  # under a day, over ten minutes
    assert CompilationJob.objects.get(id=live.id).run_state == "queued"

    report = _sweep()  # a dry run by default
    assert report["applied"] is False and report["grace_seconds"] == 86400
    found = {o["key"]: o for o in report["objects"]}
    assert sorted(found) == sorted([orphan, dead_asset])
    assert found[orphan]["size_bytes"] == len(b"orphan bytes")
    assert 2 * day - 5 <= found[orphan]["age_seconds"] <= 2 * day + 60
    assert report["total_bytes"] == len(b"orphan bytes") + len(b"old png!")
    assert (object_storage / orphan).exists() and (object_storage / dead_asset).exists()
    # a shorter grace period includes the young one
    assert young in {o["key"] for o in _sweep("--older-than", "600")["objects"]} - set(found)

    applied = _sweep("--apply")
    assert applied["deleted"] == 2 and applied["failed"] == []
    assert not (object_storage / orphan).exists() and not (object_storage / dead_asset).exists()
    for key in (young, foreign, live_asset, kept.storage_key):
        assert (object_storage / key).exists(), key
    assert _empty_directories(object_storage) == []
    assert _sweep()["objects"] == []


def test_the_storage_sweep_refuses_a_grace_period_under_ten_minutes(object_storage):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="--older-than must be at least 600 seconds"):
        call_command("kfs", "storage", "sweep", "--older-than", "10")


def test_the_storage_sweep_report_is_a_registered_schedule_that_never_deletes(
    space, object_storage
):
    import uuid

    from ingestion.tasks import report_unreferenced_objects
    from knowledgefs.jobs import schedules

    schedule = schedules.SCHEDULES["kfs-storage-sweep-report"]
    assert schedule.func == "ingestion.tasks.report_unreferenced_objects"
    key = f"tenants/{space.tenant_id}/spaces/{space.id}/documents/{uuid.uuid4()}/source"
    storage.put_object(key, b"stray")
    _age(object_storage, key, 3 * 86400)
    assert report_unreferenced_objects() == {"count": 1, "total_bytes": 5}
    assert (object_storage / key).exists()
