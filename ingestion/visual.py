"""Visual projections: the images of a document embedded by its space's image-capable profile.

Compilation calls :func:`build_visual_projections` for a generation before it is published. It
does nothing unless the space's frozen embedding profile accepts image input
(:func:`spaces.capabilities.profile_modality`); a text-only profile never reads an image.

Memory bounds (production guide, "Visual embedding memory bounds"; settings
``KNOWLEDGE_VISUAL_EMBEDDING_*``):

- one process-wide **lifecycle gate** of ``MAX_CONCURRENCY`` slots (:data:`GATE`), acquired
  before any image object is read and held through every microbatch of the generation;
  cancellation is honoured while waiting and before each read;
- images are microbatched independently of text batches: at most ``MAX_BATCH_ASSETS`` images and
  ``MAX_BATCH_BYTES`` raw bytes per request; an image over ``MAX_ASSET_BYTES`` is skipped (its
  recorded size, and again while reading); before the next read the batch is flushed when its
  remaining budget cannot hold one maximum-sized image, so the raw bytes held by one lifecycle
  never pass ``MAX_BATCH_BYTES + MAX_ASSET_BYTES``;
- bodies are read through :func:`knowledgefs.storage.read_object` with the per-image limit (a
  bounded stream that stops at the limit; Dify's storage refuses a declared larger size before
  reading).

Only PNG, JPEG, GIF and WebP images are embedded (what the multimodal route takes); other stored
assets (TIFF, EMF, SVG, …) stay stored and served, without a visual projection.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from django.conf import settings
from django.db import transaction

from ingestion.models import CompilationJob, ParseArtifact, VisualProjection
from knowledgefs import storage

logger = logging.getLogger("knowledgefs.compilation")

EMBEDDABLE = ("image/png", "image/jpeg", "image/gif", "image/webp")


class VisualCanceled(Exception):
    """The compilation was canceled (or its lease lost) before the next image read."""


class _Gate:
    """The process-wide visual embedding lifecycle gate (FIFO, ``MAX_CONCURRENCY`` slots; the
    width is read when the first lifecycle asks, so tests may change the setting)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._active = 0
        self._queue: list[object] = []
        self.peak = 0

    @property
    def width(self) -> int:
        return settings.KNOWLEDGE_VISUAL_EMBEDDING_MAX_CONCURRENCY

    def acquire(self, cancelled: Callable[[], bool], poll: float = 0.2) -> None:
        ticket = object()
        with self._lock:
            self._queue.append(ticket)
            try:
                while self._queue[0] is not ticket or self._active >= self.width:
                    if cancelled():
                        raise VisualCanceled("canceled while waiting for the visual gate")
                    self._lock.wait(poll)
            finally:
                self._queue.remove(ticket)
                self._lock.notify_all()
            self._active += 1
            self.peak = max(self.peak, self._active)

    def release(self) -> None:
        with self._lock:
            self._active -= 1
            self._lock.notify_all()

    @property
    def active(self) -> int:
        return self._active


GATE = _Gate()


@dataclass
class VisualReport:
    """What one build did: images embedded, skipped (with reasons), requests, raw-byte peak."""

    embedded: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    requests: int = 0
    peak_raw_bytes: int = 0
    batches: list[tuple[int, int]] = field(default_factory=list)  # (images, raw bytes)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def image_profile(space_id) -> tuple | None:
    """``(profile, selection)`` when the space's frozen embedding profile accepts image input,
    else ``None``."""
    from spaces.capabilities import profile_modality
    from spaces.models import SpaceProfile
    from spaces.selection import embedding_selection

    profile = SpaceProfile.objects.select_related("space").filter(space_id=space_id).first()
    if profile is None or not profile_modality(profile, "embedding").image:
        return None
    return profile, embedding_selection(profile)


def projection_id(generation: uuid.UUID, asset_index: int, vector_space_id: str) -> uuid.UUID:
    name = f"visual:{generation}:{asset_index}:{vector_space_id}"
    return uuid.uuid5(uuid.NAMESPACE_URL, name)


def build_visual_projections(
    job: CompilationJob,
    *,
    cancelled: Callable[[], bool] = lambda: False,
    assets: list[dict] | None = None,
    found: tuple | None = None,
) -> VisualReport:
    """Embed the images of ``job``'s generation and store its visual projections (replacing any
    of the same generation and profile); see the module docstring for the bounds. A
    ``DifyError`` of the model runtime is raised (the compilation retries or fails it);
    :class:`VisualCanceled` when ``cancelled()`` turns true before a read. ``found`` is the
    space's :func:`image_profile` when the caller read it already (one read per space)."""
    report = VisualReport()
    found = found or image_profile(job.space_id)
    if found is None:
        return report
    profile, selection = found
    if assets is None:
        assets = (
            ParseArtifact.objects.filter(job_id=job.id).values_list("assets", flat=True).first()
            or []
        )
    wanted = []
    max_asset = settings.KNOWLEDGE_VISUAL_EMBEDDING_MAX_ASSET_BYTES
    for index, asset in enumerate(assets):
        if asset.get("mime_type") not in EMBEDDABLE:
            report.skip("unsupported-type")
        elif int(asset.get("bytes") or 0) > max_asset:
            report.skip("too-large")
        else:
            wanted.append((index, asset))
    if not wanted:
        return report
    vectors: list[tuple[int, dict, np.ndarray]] = []
    GATE.acquire(cancelled)
    try:
        for batch, size in _microbatches(wanted, cancelled, report):
            matrix = _embed(profile, selection, [data for _, _, data in batch])
            report.requests += 1
            report.batches.append((len(batch), size))
            for (index, asset, _), row in zip(batch, matrix, strict=True):
                vectors.append((index, asset, row))
            batch.clear()  # the raw bytes go before the next read
    finally:
        GATE.release()
    _store(job, profile, vectors)
    report.embedded = len(vectors)
    return report


def _microbatches(wanted, cancelled, report: VisualReport):
    """Yield ``(batch, raw bytes)`` lists of ``(index, asset, data)``; reads each image only when
    the current batch can still hold a maximum-sized one (else flushes first)."""
    max_assets = settings.KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_ASSETS
    max_bytes = settings.KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_BYTES
    max_asset = settings.KNOWLEDGE_VISUAL_EMBEDDING_MAX_ASSET_BYTES
    batch: list[tuple[int, dict, bytes]] = []
    size = 0
    for index, asset in wanted:
        if batch and (len(batch) >= max_assets or max_bytes - size < max_asset):
            yield batch, size
            batch, size = [], 0
        if cancelled():
            raise VisualCanceled("canceled before reading the next image")
        try:
            data = storage.read_object(asset["key"], max_bytes=max_asset)
        except ValueError:
            report.skip("too-large")
            continue
        except FileNotFoundError:
            report.skip("missing")
            continue
        recorded = asset.get("sha256")
        if recorded and hashlib.sha256(data).hexdigest() != recorded:
            report.skip("checksum-mismatch")
            continue
        batch.append((index, asset, data))
        size += len(data)
        report.peak_raw_bytes = max(report.peak_raw_bytes, size)
    if batch:
        yield batch, size


def _embed(profile, selection, images: list[bytes]) -> np.ndarray:
    from knowledgefs.dify.model_runtime import MultimodalDocument
    from knowledgefs.runtime import model_runtime

    return model_runtime().embed_multimodal(
        tenant_id=profile.space.tenant_id,
        provider=selection.canonical_provider,
        model=selection.model,
        documents=[MultimodalDocument(data, "image") for data in images],
        input_type="document",
        expected_dimension=profile.embedding_dimension,
    )


def _store(job: CompilationJob, profile, vectors) -> None:
    # A job being compiled or published has its document (deleting it cancels its jobs first).
    assert job.document_id is not None
    rows = [
        VisualProjection(
            id=projection_id(job.id, index, profile.vector_space_id),
            space_id=job.space_id,
            document_id=job.document_id,
            generation=job.id,
            asset_index=index,
            asset_key=asset["key"],
            page_number=asset.get("page_number"),
            kind=str(asset.get("kind") or "")[:32],
            mime_type=asset["mime_type"],
            sha256=asset.get("sha256") or "",
            vector_space_id=profile.vector_space_id,
            dimension=int(row.shape[0]),
            vector=np.asarray(row, dtype=np.float32).tobytes(),
        )
        for index, asset, row in vectors
    ]
    with transaction.atomic():
        VisualProjection.objects.filter(document_id=job.document_id, generation=job.id).delete()
        VisualProjection.objects.bulk_create(rows, batch_size=200)


def backfill_space(space_id, *, cancelled: Callable[[], bool] = lambda: False) -> dict:
    """Build the visual projections of every published document of a space with its current
    image-capable profile (the runbook's backfill, ``kfs visual backfill``); removes those of
    other profiles. Returns ``{documents, embedded, removed}``; nothing when text-only (then
    every visual projection of the space is removed)."""
    from ingestion.models import Document

    found = image_profile(space_id)
    stale = VisualProjection.objects.filter(space_id=space_id)
    if found is not None:
        stale = stale.exclude(vector_space_id=found[0].vector_space_id)
    removed, _ = stale.delete()
    summary = {"documents": 0, "embedded": 0, "removed": removed}
    if found is None:
        return summary
    started = time.monotonic()
    for document in Document.objects.filter(space_id=space_id, active_generation__isnull=False):
        if document.active_generation is None:  # (excluded by the filter above)
            continue
        job = CompilationJob.objects.filter(id=document.active_generation).first()
        if job is None:
            continue
        report = build_visual_projections(job, cancelled=cancelled, found=found)
        summary["documents"] += 1
        summary["embedded"] += report.embedded
    logger.info(
        "space %s: visual backfill of %s documents in %.1f s",
        space_id,
        summary["documents"],
        time.monotonic() - started,
    )
    return summary
