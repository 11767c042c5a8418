"""The sweep of unreferenced objects: stored bytes no document or parse artifact points at.

An upload writes its object before its document row; when the write fails the object is
deleted again, but a PUT that Dify stores only after our client gave up (a timeout) lands after
that cleanup DELETE and is then referenced by nothing. An asset written by a job that died
before its parse artifact was committed is the same. :func:`find_unreferenced` lists such
objects; :func:`sweep` reports them (the default, a dry run) or deletes them (``apply``).

What is a candidate, all of:

* its key is under one of our namespaces (:data:`PREFIXES`: document sources, page images,
  readiness probes); nothing else in a shared storage (Dify's own ``upload_files/``, the
  classic Datasets an upgrade reads) is ever looked at;
* no document has it as its source and no parse artifact lists it as an asset;
* it is older than the grace period (``KNOWLEDGE_STORAGE_SWEEP_GRACE_SECONDS``, default one
  day): the age is the file's modification time on local storage, the ``kfs-written-at``
  metadata that :func:`knowledgefs.storage.put_object` stores with each object under Dify's
  (an object without it has no known age and is never a candidate);
* it does not belong to a live job or document: an asset of a job that is still queued or
  running, or a source of a document that is still being admitted, is kept whatever its age.

``apply`` checks each key again just before deleting it, so a document admitted meanwhile is
never robbed of its source.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from django.conf import settings

from ingestion.models import (
    LIVE_RUN_STATES,
    UPLOAD_TERMINAL,
    CompilationJob,
    Document,
    DocumentRevision,
    ParseArtifact,
    RunState,
    UploadSession,
)
from knowledgefs import storage

#: Key namespaces this service writes (documents.storage_key_for, compilation.assets, the probe).
PREFIXES = ("tenants/", "assets/", "_probe/")


@dataclass(frozen=True)
class StoredObject:
    """One object of the storage: key, size in bytes, age in seconds (``None``: unknown)."""

    key: str
    size_bytes: int
    age_seconds: float | None

    def as_dict(self) -> dict:
        return {
            "key": self.key,
            "size_bytes": self.size_bytes,
            "age_seconds": None if self.age_seconds is None else round(self.age_seconds),
        }


@dataclass(frozen=True)
class SweepReport:
    """What a sweep found (and, with ``applied``, deleted)."""

    objects: list[StoredObject]
    applied: bool
    grace_seconds: int
    deleted: list[str]
    failed: list[str]

    @property
    def total_bytes(self) -> int:
        return sum(o.size_bytes for o in self.objects)

    def as_dict(self) -> dict:
        return {
            "applied": self.applied,
            "grace_seconds": self.grace_seconds,
            "count": len(self.objects),
            "total_bytes": self.total_bytes,
            "objects": [o.as_dict() for o in self.objects],
            "deleted": len(self.deleted),
            "failed": self.failed,
        }


def iter_stored(now: float | None = None) -> Iterator[StoredObject]:
    """Every object under :data:`PREFIXES` with its size and age."""
    now = time.time() if now is None else now
    backend = storage.object_storage()
    if hasattr(backend, "iter_objects"):  # Dify's storage: a paged listing per prefix
        for prefix in PREFIXES:
            for info in backend.iter_objects(prefix):
                written = storage.written_at(info.metadata)
                age = None if written is None else max(0.0, now - written)
                yield StoredObject(info.key, info.size_bytes, age)
        return
    root = getattr(backend, "location", None)
    if not root:
        raise RuntimeError("the object storage can neither be listed nor walked")
    for prefix in PREFIXES:
        top = os.path.join(root, prefix.rstrip("/"))
        for directory, _, files in os.walk(top):
            for name in files:
                path = os.path.join(directory, name)
                try:
                    info = os.stat(path)
                except FileNotFoundError:  # deleted meanwhile
                    continue
                key = os.path.relpath(path, root).replace(os.sep, "/")
                yield StoredObject(key, info.st_size, max(0.0, now - info.st_mtime))


def _referenced(keys: set[str]) -> set[str]:
    """Which of ``keys`` a document, a revision, an open upload session or a parse artifact
    points at."""
    found = set(Document.objects.filter(storage_key__in=keys).values_list("storage_key", flat=True))
    # A revision's source (a candidate, or a failed one kept for a retry) and the object of an
    # upload session that has not ended (its own sweep deletes it when it expires).
    found |= set(
        DocumentRevision.objects.filter(storage_key__in=keys, job__isnull=False)
        .exclude(job__run_state__in=[RunState.SUCCEEDED, RunState.SUPERSEDED])
        .values_list("storage_key", flat=True)
    )
    found |= set(
        UploadSession.objects.filter(object_key__in=keys)
        .exclude(status__in=UPLOAD_TERMINAL)
        .values_list("object_key", flat=True)
    )
    # An asset key names its job (``assets/<space>/<document>/<job>/<n>.<ext>``): only that
    # job's artifacts can list it. A key of another shape is kept (counted as referenced).
    jobs: dict[str, uuid.UUID] = {}
    for key in keys:
        if key.startswith("assets/"):
            parts = key.split("/")
            job = _uuid(parts[3]) if len(parts) >= 5 else None
            if job is None:
                found.add(key)
            else:
                jobs[key] = job
    if jobs:
        listed = ParseArtifact.objects.filter(job_id__in=set(jobs.values()))
        for assets in listed.values_list("assets", flat=True):
            found.update(a.get("key") for a in assets or [] if a.get("key") in jobs)
    return found


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _live(keys: set[str]) -> set[str]:
    """Keys of live work: assets of a job not yet ended, sources of a document with a live job."""
    jobs, documents = {}, {}
    for key in keys:
        parts = key.split("/")
        if parts[0] == "assets" and len(parts) >= 4 and (job := _uuid(parts[3])):
            jobs[key] = job
        elif parts[0] == "tenants" and len(parts) >= 6 and (document := _uuid(parts[5])):
            documents[key] = document
    live_jobs = set(
        CompilationJob.objects.filter(
            id__in=set(jobs.values()), run_state__in=LIVE_RUN_STATES
        ).values_list("id", flat=True)
    )
    live_documents = set(
        CompilationJob.objects.filter(
            document_id__in=set(documents.values()), run_state__in=LIVE_RUN_STATES
        ).values_list("document_id", flat=True)
    )
    return {k for k, j in jobs.items() if j in live_jobs} | {
        k for k, d in documents.items() if d in live_documents
    }


def find_unreferenced(grace_seconds: int | None = None, *, batch: int = 500) -> list[StoredObject]:
    """Objects under :data:`PREFIXES` nobody references, older than ``grace_seconds``
    (default ``KNOWLEDGE_STORAGE_SWEEP_GRACE_SECONDS``), not of live work; in key order."""
    grace = (
        settings.KNOWLEDGE_STORAGE_SWEEP_GRACE_SECONDS if grace_seconds is None else grace_seconds
    )
    old = [o for o in iter_stored() if o.age_seconds is not None and o.age_seconds >= grace]
    found: list[StoredObject] = []
    for start in range(0, len(old), batch):
        chunk = old[start : start + batch]
        keys = {o.key for o in chunk}
        keep = _referenced(keys) | _live(keys)
        found.extend(o for o in chunk if o.key not in keep)
    return sorted(found, key=lambda o: o.key)


def sweep(*, apply: bool = False, grace_seconds: int | None = None) -> SweepReport:
    """Report the unreferenced objects; with ``apply`` delete them (each key checked again
    just before its delete). A failed delete is reported, never raised, and the sweep goes on."""
    grace = (
        settings.KNOWLEDGE_STORAGE_SWEEP_GRACE_SECONDS if grace_seconds is None else grace_seconds
    )
    objects = find_unreferenced(grace)
    deleted: list[str] = []
    failed: list[str] = []
    if apply:
        for stored in objects:
            if _referenced({stored.key}) or _live({stored.key}):
                continue  # admitted or claimed since the listing
            try:
                storage.delete_object(stored.key)
            except Exception:  # noqa: BLE001 - reported; the next sweep tries again
                failed.append(stored.key)
            else:
                deleted.append(stored.key)
    return SweepReport(objects, apply, grace, deleted, failed)


def report_unreferenced() -> dict:
    """The scheduled task's body: a dry run whose summary is returned (and so kept in
    django-q2's task record); it never deletes."""
    report = sweep(apply=False)
    return {"count": len(report.objects), "total_bytes": report.total_bytes}
