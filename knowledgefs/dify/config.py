"""Defaults and limits of the Dify inner API, and the check of ``DIFY_INNER_API_URL``.

Imported by ``knowledgefs/settings/``, so it imports nothing heavy. Where a number comes from
is said next to it; docs/dify-boundary.md lists them all.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from .errors import DifyNotConfigured

# Model runtime (Dify's model-runtime client contract): 60 s per request, at most 10 minutes;
# 8 MiB per response body.
MODEL_RUNTIME_TIMEOUT_MS = 60_000
MODEL_RUNTIME_TIMEOUT_MS_MAX = 600_000
MODEL_RUNTIME_MAX_RESPONSE_BYTES = 8 * 1024 * 1024
# Embedding fan-out (production guide, "Capacity knobs"): 16 texts per request, 2 requests in
# flight per call (KNOWLEDGE_EMBEDDING_REQUEST_CONCURRENCY, 1..8).
EMBEDDING_TEXTS_PER_REQUEST = 16
EMBEDDING_REQUEST_CONCURRENCY = 2
# Image embedding batches (production guide: KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_ASSETS 8,
# _MAX_BATCH_BYTES 32 MiB, _MAX_ASSET_BYTES 20 MiB).
MULTIMODAL_DOCUMENTS_PER_REQUEST = 8
MULTIMODAL_MAX_BATCH_BYTES = 32 * 1024 * 1024
MULTIMODAL_MAX_DOCUMENT_BYTES = 20 * 1024 * 1024
# Model catalog pages hold at most 100 items (Dify's catalog route).
CATALOG_MAX_LIMIT = 100

# Object storage (Dify's storage route): 64 MiB per object, list pages of at most 100 keys,
# keys of at most 1024 UTF-8 bytes, metadata of at most 64 entries (key ≤ 64 B, value ≤ 1 KiB).
OBJECT_STORAGE_TIMEOUT_MS = 60_000
OBJECT_MAX_BYTES = 64 * 1024 * 1024
OBJECT_KEY_MAX_BYTES = 1024
OBJECT_LIST_MAX_LIMIT = 100
OBJECT_METADATA_MAX_ENTRIES = 64
OBJECT_METADATA_KEY_MAX_BYTES = 64
OBJECT_METADATA_VALUE_MAX_BYTES = 1024
# JSON answers of the storage routes (metadata of one object, a page of 100).
OBJECT_METADATA_RESPONSE_MAX_BYTES = 1024 * 1024
OBJECT_LIST_RESPONSE_MAX_BYTES = 16 * 1024 * 1024

# Datasources (Dify's datasource-runtime client contract): 60 s, 8 MiB, browse pages ≤ 1000 keys.
DATASOURCE_TIMEOUT_MS = 60_000
DATASOURCE_MAX_RESPONSE_BYTES = 8 * 1024 * 1024
DATASOURCE_MAX_KEYS = 1000

# Vector and text bridge (Dify's knowledge-fs/vectors and knowledge-fs/texts routes, inventory
# 7.2-7.3): at most 64 points and 2048 ids per request, 64 ids per get, limit 1..256, dimension
# 1..16384, vector-space ids of at most 256 characters, texts of at most 1 MiB (UTF-8) and
# queries of at most 8192 characters; request bodies of at most 32 MiB.
BRIDGE_TIMEOUT_MS = 30_000
BRIDGE_MAX_POINTS = 64
BRIDGE_MAX_IDS = 2048
BRIDGE_MAX_GET_IDS = 64
BRIDGE_MAX_LIMIT = 256
BRIDGE_MAX_DIMENSION = 16384
BRIDGE_MAX_SCOPE_ID_CHARS = 256
BRIDGE_MAX_TEXT_BYTES = 1024 * 1024
BRIDGE_MAX_QUERY_CHARS = 8192
BRIDGE_MAX_BODY_BYTES = 32 * 1024 * 1024
# Answers: search/upsert/delete carry at most 256 matches (1 MiB is ample); a get carries up to
# 64 points of 16384 floats or 64 texts of 1 MiB.
BRIDGE_RESPONSE_MAX_BYTES = 1024 * 1024
BRIDGE_GET_RESPONSE_MAX_BYTES = 80 * 1024 * 1024
# Searches over more than 2048 authorized ids are sent as parallel requests, at most this many
# in flight per search (KNOWLEDGE_SEARCH_BRIDGE_CONCURRENCY).
BRIDGE_SEARCH_CONCURRENCY = 4

# Transport: connections kept per process (enough for every worker thread's embedding fan-out
# and storage streams), connect timeout, inline retries and their backoff.
POOL_SIZE = 32
CONNECT_TIMEOUT_S = 5.0
MAX_RETRIES = 2
BACKOFF_BASE_S = 0.2
BACKOFF_MAX_S = 2.0
RETRY_AFTER_MAX_S = 5.0
THROTTLE_MAX_RETRIES = 6  # a 429: more attempts than other retryable answers, within the deadline

USER_ID = "knowledge-fs"


def parse_inner_api_url(value: str, name: str = "DIFY_INNER_API_URL") -> str:
    """Return ``value`` without trailing slashes, or raise :class:`DifyNotConfigured`.

    Accepted: ``http://`` or ``https://`` with a host, no user or password, no query or
    fragment, printable ASCII (Compose: ``http://api:5001``). The error names the variable and
    never repeats the value (it could carry a password, a token in its query or fragment).
    """
    raw = value.strip()
    if not raw.isascii() or not raw.isprintable() or any(c.isspace() for c in raw):
        raise DifyNotConfigured(f"{name} must be a URL of printable ASCII characters, no spaces")
    try:
        parts = urlsplit(raw)
        hostname = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise DifyNotConfigured(f"{name} is not a URL (host or port malformed)") from None
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise DifyNotConfigured(f"{name} must not carry a user name or password")
    if "?" in raw or "#" in raw:
        raise DifyNotConfigured(f"{name} must not have a query string or fragment")
    if parts.scheme not in ("http", "https") or not hostname:
        raise DifyNotConfigured(f"{name} must be an http:// or https:// URL with a host")
    return raw.rstrip("/")
