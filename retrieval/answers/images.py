"""Image blocks of a multimodal answer: the query's images, then the evidence's images.

Only when the space's reasoning profile accepts images (:mod:`spaces.capabilities`); a text-only
model gets OCR, caption and text evidence only and never an image byte. The blocks are chosen
within ``KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_ATTACHMENTS`` (8) images,
``KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_BYTES`` (10 MiB) each and
``KNOWLEDGE_MULTIMODAL_ANSWER_MAX_TOTAL_IMAGE_BYTES`` (32 MiB) in all; query images come first,
so evidence images are the ones dropped when over budget. Evidence images are the stored assets
that visual hits cite (``citation.image``), read with the per-image limit. Loading them and the
model call hold one slot of the process-wide gate :data:`GATE`
(``KNOWLEDGE_MULTIMODAL_ANSWER_MAX_CONCURRENCY``, 2); the call also passes the global
model-request limits of the runtime.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from django.conf import settings

SKIPPED_TEXT_ONLY = "reasoning-model-text-only"


class _Gate:
    """Process-wide answer-image lifecycles; the width is read when a lifecycle asks."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self.active = 0
        self.peak = 0

    def acquire(self) -> None:
        with self._lock:
            while self.active >= settings.KNOWLEDGE_MULTIMODAL_ANSWER_MAX_CONCURRENCY:
                self._lock.wait()
            self.active += 1
            self.peak = max(self.peak, self.active)

    def release(self) -> None:
        with self._lock:
            self.active -= 1
            self._lock.notify_all()


GATE = _Gate()


@dataclass
class AnswerImages:
    """The image parts chosen and what was left out (the trace's ``answer.images`` step)."""

    parts: list[dict] = field(default_factory=list)
    query_images: int = 0
    evidence_images: int = 0
    bytes: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    skipped: str | None = None

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def summary(self) -> dict:
        return {
            "query_images": self.query_images,
            "evidence_images": self.evidence_images,
            "bytes": self.bytes,
            "dropped": dict(self.dropped),
            "skipped": self.skipped,
        }


def choose(space, result, bundle_items) -> AnswerImages:
    """The image parts for this answer (module docstring); call holding :data:`GATE`."""
    from spaces.capabilities import profile_modality
    from spaces.profiles import profile_of

    from ..query_images import QueryImage, image_part

    chosen = AnswerImages()
    plan = getattr(result, "image_plan", None)
    evidence = [i for i in bundle_items if isinstance(i.citation.get("image"), dict)]
    if not (plan is not None and plan.images) and not evidence:
        return chosen
    if not profile_modality(profile_of(space), "reasoning").image:
        chosen.skipped = SKIPPED_TEXT_ONLY  # no byte is read or sent
        return chosen
    most = settings.KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_ATTACHMENTS
    per_image = settings.KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_BYTES
    total = settings.KNOWLEDGE_MULTIMODAL_ANSWER_MAX_TOTAL_IMAGE_BYTES

    def add(image: QueryImage, kind: str) -> None:
        size = len(image.data)
        if not size:
            return chosen.drop(f"{kind}-unavailable")
        if len(chosen.parts) >= most:
            return chosen.drop(f"{kind}-over-attachment-limit")
        if size > per_image:
            return chosen.drop(f"{kind}-over-image-bytes")
        if chosen.bytes + size > total:
            return chosen.drop(f"{kind}-over-total-bytes")
        chosen.parts.append(image_part(image))
        chosen.bytes += size
        if kind == "query":
            chosen.query_images += 1
        else:
            chosen.evidence_images += 1

    for image in plan.images if plan is not None else []:
        add(image, "query")
    seen = set()
    for item in evidence:
        citation = item.citation["image"]
        key = (citation["document_id"], citation["asset_index"])
        if key in seen:
            continue
        seen.add(key)
        if len(chosen.parts) >= most:
            chosen.drop("evidence-over-attachment-limit")
            continue
        image = _evidence_image(citation, per_image)
        if image is None:
            chosen.drop("evidence-unavailable")
            continue
        add(image, "evidence")
    return chosen


def _evidence_image(citation: dict, limit: int):
    """The cited stored asset as a :class:`~retrieval.query_images.QueryImage` (bytes read with
    ``limit``), or ``None`` (gone, too large, not an accepted type)."""
    import hashlib

    from ingestion.models import Document, ParseArtifact
    from knowledgefs import storage

    from ..query_images import SUPPORTED, QueryImage, sniff

    generation = (
        Document.objects.filter(id=citation["document_id"], enabled=True)
        .values_list("active_generation", flat=True)
        .first()
    )
    assets = (
        ParseArtifact.objects.filter(job_id=generation).values_list("assets", flat=True).first()
        if generation
        else None
    ) or []
    index = citation.get("asset_index")
    if not isinstance(index, int) or not 0 <= index < len(assets):
        return None
    asset = assets[index]
    if int(asset.get("bytes") or 0) > limit:
        return None
    try:
        data = storage.read_object(asset["key"], max_bytes=limit)
    except (ValueError, OSError):
        return None
    kind = sniff(data)
    if kind not in SUPPORTED:
        return None
    return QueryImage(f"asset:{index}", hashlib.sha256(data).hexdigest(), len(data), kind, data)
