"""Settings of images as evidence: visual embedding, image understanding, multimodal answers and
query images (production deployment guide: "Visual embedding memory bounds", "Image-query
rollout").

Only byte, count, concurrency and timeout limits are operator-owned. Whether a space embeds,
retrieves or describes images follows its frozen profiles (``spaces.capabilities``), never a
deployment selector: the retired selectors listed in :data:`RETIRED_MULTIMODAL_SELECTORS` are
not read, and :data:`KNOWLEDGE_IGNORED_MULTIMODAL_SELECTORS` names those set in the environment
(the start-up warning ``knowledgefs.W104``). The checks across these settings run in
``knowledgefs.settings.validation``.
"""

from __future__ import annotations

from knowledgefs.settings.values import bounded_int, env

# --- Visual embedding (document images, ingestion/compilation) ----------------------------------
# Microbatched independently of text batches: at most MAX_BATCH_ASSETS images and MAX_BATCH_BYTES
# raw bytes per request, MAX_ASSET_BYTES per image (at most the batch bytes). One process-wide
# lifecycle gate of MAX_CONCURRENCY slots is taken before any image is read and held through the
# microbatches; the raw peak per lifecycle is MAX_BATCH_BYTES + MAX_ASSET_BYTES (52 MiB).
KNOWLEDGE_VISUAL_EMBEDDING_MAX_ASSET_BYTES = bounded_int(
    "KNOWLEDGE_VISUAL_EMBEDDING_MAX_ASSET_BYTES", 20 * 1024 * 1024, 1024, 256 * 1024 * 1024
)
KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_ASSETS = bounded_int(
    "KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_ASSETS", 8, 1, 64
)
KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_BYTES = bounded_int(
    "KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_BYTES", 32 * 1024 * 1024, 1024, 256 * 1024 * 1024
)
KNOWLEDGE_VISUAL_EMBEDDING_MAX_CONCURRENCY = bounded_int(
    "KNOWLEDGE_VISUAL_EMBEDDING_MAX_CONCURRENCY", 2, 1, 8
)

# --- Image understanding (document images described by a vision reasoning model) ----------------
KNOWLEDGE_MULTIMODAL_ENRICHMENT_MAX_CONCURRENCY = bounded_int(
    "KNOWLEDGE_MULTIMODAL_ENRICHMENT_MAX_CONCURRENCY", 4, 1, 32
)
# Each image of a document is described in one call (caption, OCR text and summary as strict
# JSON); at most MAX_CONCURRENCY calls run at once in a process, an image over MAX_IMAGE_BYTES is
# skipped (its recorded size, and again while reading: a bounded stream), and one call ends after
# TIMEOUT_MS (that image is recorded as failed; the document is published without it).
KNOWLEDGE_MULTIMODAL_ENRICHMENT_MAX_IMAGE_BYTES = bounded_int(
    "KNOWLEDGE_MULTIMODAL_ENRICHMENT_MAX_IMAGE_BYTES", 10 * 1024 * 1024, 1024, 64 * 1024 * 1024
)
KNOWLEDGE_MULTIMODAL_ENRICHMENT_TIMEOUT_MS = bounded_int(
    "KNOWLEDGE_MULTIMODAL_ENRICHMENT_TIMEOUT_MS", 60000, 1000, 600000
)

# --- Multimodal answers (query and evidence image blocks for a vision reasoning model) ----------
# Evidence images are dropped first when a request is over its count or byte budget; the total
# must be at least the per-image limit. Calls also share the global model-request gate.
KNOWLEDGE_MULTIMODAL_ANSWER_MAX_CONCURRENCY = bounded_int(
    "KNOWLEDGE_MULTIMODAL_ANSWER_MAX_CONCURRENCY", 2, 1, 16
)
KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_ATTACHMENTS = bounded_int(
    "KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_ATTACHMENTS", 8, 0, 32
)
KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_BYTES = bounded_int(
    "KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_BYTES", 10 * 1024 * 1024, 1024, 64 * 1024 * 1024
)
KNOWLEDGE_MULTIMODAL_ANSWER_MAX_TOTAL_IMAGE_BYTES = bounded_int(
    "KNOWLEDGE_MULTIMODAL_ANSWER_MAX_TOTAL_IMAGE_BYTES", 32 * 1024 * 1024, 1024, 256 * 1024 * 1024
)

# --- Query images (query_images on /v1/queries, retrieval tests and research tasks) -------------
# The one bounded image-to-text expansion of Deep/Research and of an image-only Fast query on a
# text-only embedding profile. The request limits (4 images, 10 MiB each, 32 MiB in all; PNG,
# JPEG, WebP, GIF by content) are the public contract and not configurable.
KNOWLEDGE_QUERY_IMAGE_EXPANSION_TIMEOUT_MS = bounded_int(
    "KNOWLEDGE_QUERY_IMAGE_EXPANSION_TIMEOUT_MS", 8000, 100, 120000
)
# The largest stored image asset GET …/documents/{id}/assets/{asset} serves (413 above it,
# decided from the stored size before any byte is read).
KNOWLEDGE_MULTIMODAL_ASSET_MAX_READ_BYTES = bounded_int(
    "KNOWLEDGE_MULTIMODAL_ASSET_MAX_READ_BYTES", 25 * 1024 * 1024, 1024, 256 * 1024 * 1024
)

# --- Retired selectors (not read) ---------------------------------------------------------------
# Capability comes from the frozen profiles; these deployment selectors of older builds are
# ignored, and a start-up warning (knowledgefs.W104) names any that are set.
RETIRED_MULTIMODAL_SELECTORS = (
    "KNOWLEDGE_VISUAL_EMBEDDING_PROVIDER",
    "KNOWLEDGE_VISUAL_EMBEDDING_MODEL",
    "KNOWLEDGE_VISUAL_EMBEDDING_QUERY_MODE",
    "KNOWLEDGE_QUERY_IMAGE_RETRIEVAL_ENABLED",
    "KNOWLEDGE_MULTIMODAL_ENRICHMENT_PROVIDER",
    "KNOWLEDGE_MULTIMODAL_ANSWER_PROVIDER",
)
KNOWLEDGE_IGNORED_MULTIMODAL_SELECTORS = [
    name for name in RETIRED_MULTIMODAL_SELECTORS if env.str(name, default="").strip()
]
