"""What a space may do with images, from its frozen profiles (never from deployment selectors).

The embedding profile accepts image input only when its validation (:mod:`spaces.preflight`)
found the catalog entry declaring image input **and** a text probe plus 1×1 PNG document and
query probes all returned the same model identity and dimension: the outcome is frozen in
``SpaceProfile.capabilities["embedding"]`` as ``input_modalities`` with the ``catalog_digest``
of the entry it was validated against. The reasoning profile accepts images when its catalog
entry declares vision (``capabilities["reasoning"]["input_modalities"]``).

A *legacy* snapshot (validated before image input was recorded) is image-capable only while the
current catalog entry has the same identity and the same full digest as the frozen one; a
changed entry (drift) or a catalog that cannot be read (outage) fails closed to text. The
embedded local model is text-only.

:func:`space_modalities` is what the query path, compilation and ``GET /v1/knowledge-spaces/{id}``
read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("knowledgefs.profiles")

TEXT = ("text",)
TEXT_AND_IMAGE = ("text", "image")

#: How long a legacy snapshot's catalog comparison is trusted in this process.
LEGACY_CHECK_SECONDS = 60.0


def _png_1x1() -> bytes:
    """A valid 1×1 white RGB PNG (the image probe; no user's bytes are ever a probe)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\xff\xff")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


PROBE_PNG = _png_1x1()


def declares_image_input(catalog_capabilities: Mapping[str, Any] | None) -> bool:
    """Whether a Dify catalog entry declares image input: ``features`` holding ``vision`` (Dify's
    model-schema feature of vision LLMs and multimodal embedding models) or
    ``input_modalities`` holding ``image``."""
    if not isinstance(catalog_capabilities, Mapping):
        return False
    features = catalog_capabilities.get("features")
    modalities = catalog_capabilities.get("input_modalities")
    return (isinstance(features, list) and "vision" in features) or (
        isinstance(modalities, list) and "image" in modalities
    )


def catalog_digest(identity: str, capabilities: Mapping[str, Any] | None) -> str:
    """The full digest of a catalog entry as frozen: its install identity and every declared
    capability (canonical JSON, SHA-256)."""
    canonical = json.dumps(
        {"identity": identity, "capabilities": capabilities or {}},
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Modality:
    """One profile's image capability: ``input_modalities`` (``("text",)`` or ``("text",
    "image")``), ``source`` (how it was decided) and ``reason`` (why images are not accepted,
    else ``None``)."""

    input_modalities: tuple[str, ...]
    source: str
    reason: str | None = None

    @property
    def image(self) -> bool:
        return "image" in self.input_modalities

    def as_dict(self) -> dict:
        return {
            "input_modalities": list(self.input_modalities),
            "image_input": self.image,
            "source": self.source,
            "reason": self.reason,
        }


def _text(source: str, reason: str) -> Modality:
    return Modality(TEXT, source, reason)


_legacy_cache: dict[tuple, tuple[float, Modality]] = {}
_legacy_lock = threading.Lock()

#: ``(tenant_id, field, {provider, model}) -> current catalog entry {plugin_unique_identifier,
#: capabilities} | None``; raises on an outage. Set by :func:`set_catalog_lookup` (tests) or
#: built from the Dify runtime.
CatalogLookup = Callable[[str, str, Mapping[str, Any]], Mapping[str, Any] | None]
_catalog_lookup: CatalogLookup | None = None


def set_catalog_lookup(lookup: CatalogLookup | None) -> None:
    """Replace how legacy snapshots read the current catalog (``None``: through Dify)."""
    global _catalog_lookup
    _catalog_lookup = lookup
    with _legacy_lock:
        _legacy_cache.clear()


def _dify_catalog_lookup(tenant_id: str, field: str, wanted: Mapping[str, Any]):
    from knowledgefs.runtime import model_runtime

    from .selection import MODEL_TYPE

    runtime = model_runtime()
    page = runtime.list_models(
        tenant_id=tenant_id,
        model_type=MODEL_TYPE[field],
        provider=wanted["provider"],
        model=wanted["model"],
        offset=0,
    )
    for item in page.items:
        if item.canonical_provider == wanted["provider"] and item.model == wanted["model"]:
            return {
                "plugin_unique_identifier": item.plugin_unique_identifier,
                "capabilities": dict(item.capabilities),
            }
    return None


def _legacy(tenant_id: str, field: str, snapshot: Mapping[str, Any], selection) -> Modality:
    """A snapshot without recorded modalities: image only while the catalog still matches."""
    identity = snapshot.get("plugin_unique_identifier") or ""
    frozen = snapshot.get("capabilities")
    if not declares_image_input(frozen):
        return _text("legacy-snapshot", f"{field}-model-text-only")
    key = (tenant_id, field, identity, catalog_digest(identity, frozen))
    now = time.monotonic()
    with _legacy_lock:
        cached = _legacy_cache.get(key)
        if cached and now - cached[0] < LEGACY_CHECK_SECONDS:
            return cached[1]
    lookup = _catalog_lookup or _dify_catalog_lookup
    try:
        wanted = {"provider": selection.canonical_provider, "model": selection.model}
        current = lookup(tenant_id, field, wanted)
    except Exception as exc:  # noqa: BLE001 - an outage fails closed to text
        logger.warning("%s catalog check of a legacy snapshot failed: %s", field, exc)
        return _text("legacy-snapshot", "catalog-unavailable")  # not cached: retried next time
    if current is None:
        outcome = _text("legacy-snapshot", "catalog-drift")
    else:
        same = current.get("plugin_unique_identifier") == identity and catalog_digest(
            current.get("plugin_unique_identifier") or "", current.get("capabilities")
        ) == catalog_digest(identity, frozen)
        outcome = (
            Modality(TEXT_AND_IMAGE, "legacy-catalog-match")
            if same
            else _text("legacy-snapshot", "catalog-drift")
        )
    with _legacy_lock:
        _legacy_cache[key] = (now, outcome)
    return outcome


def profile_modality(profile, field: str) -> Modality:
    """The image capability of ``profile``'s ``embedding`` or ``reasoning`` model (see the
    module docstring)."""
    from knowledgefs.runtime import LOCAL_PLUGIN_ID

    if field == "embedding":
        if not profile.embedding_plugin_id:
            return _text("no-profile", "embedding-profile-not-set")
        if profile.embedding_plugin_id == LOCAL_PLUGIN_ID:
            return _text("embedded-model", "embedding-model-text-only")
    elif not profile.retrieval_reasoning_model:
        return _text("no-profile", "no-reasoning-model")
    snapshot = (profile.capabilities or {}).get(field)
    if not isinstance(snapshot, Mapping) or profile.state != "ready":
        return _text("not-validated", f"{field}-profile-not-validated")
    recorded = snapshot.get("input_modalities")
    if isinstance(recorded, list):
        if "image" in recorded:
            return Modality(TEXT_AND_IMAGE, "validated-probes")
        return _text("validated-probes", snapshot.get("image_reason") or f"{field}-model-text-only")
    from .selection import Selection, embedding_selection

    selection = (
        embedding_selection(profile)
        if field == "embedding"
        else Selection.of(profile.retrieval_reasoning_model)
    )
    return _legacy(str(profile.space.tenant_id), field, snapshot, selection)


def space_modalities(profile) -> dict[str, Modality]:
    """``{"embedding": Modality, "reasoning": Modality}`` of a space's profile."""
    return {field: profile_modality(profile, field) for field in ("embedding", "reasoning")}


def describe_capabilities(profile) -> dict:
    """The ``capabilities`` member of ``GET /v1/knowledge-spaces/{id}``: each profile's input
    modalities and what that means for images (visual projections, query images, image
    understanding, multimodal answers)."""
    modalities = space_modalities(profile)
    embedding, reasoning = modalities["embedding"], modalities["reasoning"]
    if embedding.image:
        image_only_fast = "visual-retrieval"
    elif reasoning.image:
        image_only_fast = "vision-expansion"
    else:
        image_only_fast = "rejected"
    return {
        "embedding": embedding.as_dict(),
        "reasoning": reasoning.as_dict(),
        "visual_projections": embedding.image,
        "image_understanding": reasoning.image,
        "multimodal_answers": reasoning.image,
        "image_only_fast_query": image_only_fast,
    }
