"""The start-up checks across settings: :func:`validate` raises ``ImproperlyConfigured``.

``knowledgefs.settings`` calls it once, at import, after every settings module has run; each
refusal names the variables and the accepted values.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from knowledgefs.auth.capability import parse_public_jwks
from knowledgefs.auth.rates import validate_rates
from knowledgefs.boundary import require_dify_settings
from knowledgefs.settings.ingestion import (
    KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS,
    KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_TOTAL_TIMEOUT_MS,
    KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_RESERVED_BYTES,
    KNOWLEDGE_OCR_LANGUAGES,
    KNOWLEDGE_PARSER_TIMEOUT_SECONDS,
    KNOWLEDGE_PDF_RASTERIZER,
    KNOWLEDGE_PDF_RASTERIZER_COMMAND,
    KNOWLEDGE_UPLOAD_MAX_BYTES,
    KNOWLEDGE_UPLOAD_SESSION_MAX_RESERVED_BYTES_PER_SPACE,
    UNSTRUCTURED_API_KEY,
    UNSTRUCTURED_HEAVY_MAX_CONCURRENCY,
    UNSTRUCTURED_MAX_CONCURRENCY,
    UNSTRUCTURED_STRATEGY,
    _heavy_name,
    _job_timeout,
    _job_timeout_given,
    _remote_s,
    _remote_too_long,
    _unstructured_url_given,
)
from knowledgefs.settings.multimodal import (
    KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_BYTES,
    KNOWLEDGE_MULTIMODAL_ANSWER_MAX_TOTAL_IMAGE_BYTES,
    KNOWLEDGE_VISUAL_EMBEDDING_MAX_ASSET_BYTES,
    KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_BYTES,
)
from knowledgefs.settings.platform import (
    DATABASES,
    DIFY_INNER_API_KEY,
    KNOWLEDGE_AUTH_CACHE_SECONDS,
    KNOWLEDGE_AUTH_CACHE_SHARED,
    KNOWLEDGE_AUTH_EPOCH_FILE,
    KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME,
    KNOWLEDGE_FS_CAPABILITY_V2_ENABLED,
    KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS,
    KNOWLEDGE_RATE_LIMITS,
)
from knowledgefs.settings.retrieval import (
    KNOWLEDGE_PG_HNSW_EF_CONSTRUCTION,
    KNOWLEDGE_PG_HNSW_M,
    KNOWLEDGE_SEARCH_BACKEND,
    KNOWLEDGE_UPGRADE_RECONCILE_DELIVERY_BUDGET_SECONDS,
    KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS,
    KNOWLEDGE_UPGRADE_STEP_STALE_SECONDS,
    KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS,
)
from knowledgefs.settings.runtime import DIFY_INNER_API_URL, KNOWLEDGE_MODEL_RUNTIME

# --- Start-up checks across settings --------------------------------------------------------------
# Each raises ImproperlyConfigured at import, naming the variables and the accepted values; the
# system checks of knowledgefs/checks.py (with stable ids) cover what needs a database or a file.


def validate() -> None:
    """Refuse settings that contradict each other or the process's folders."""
    if KNOWLEDGE_AUTH_CACHE_SECONDS and not KNOWLEDGE_AUTH_CACHE_SHARED:
        # A process that could not replace the epoch could not revoke; one that could not read
        # it would never cache. Refuse to start rather than find out at the first revocation.
        try:
            KNOWLEDGE_AUTH_EPOCH_FILE.parent.mkdir(parents=True, exist_ok=True)
            usable = os.access(KNOWLEDGE_AUTH_EPOCH_FILE.parent, os.R_OK | os.W_OK | os.X_OK)
        except OSError:
            usable = False
        if not usable:
            raise ImproperlyConfigured(
                f"{KNOWLEDGE_AUTH_EPOCH_FILE.parent} must be readable and writable: it holds the "
                "API-key revocation epoch (or set REDIS_URL, or KNOWLEDGE_AUTH_CACHE_SECONDS=0)"
            )
    if KNOWLEDGE_FS_CAPABILITY_V2_ENABLED and not KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS.strip():
        raise ImproperlyConfigured(
            "KNOWLEDGE_FS_CAPABILITY_V2_ENABLED needs KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS"
        )
    if KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS.strip():
        parse_public_jwks(KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS)
    if DIFY_INNER_API_KEY and (
        len(DIFY_INNER_API_KEY) < 16
        or not DIFY_INNER_API_KEY.isascii()
        or not DIFY_INNER_API_KEY.isprintable()
    ):
        raise ImproperlyConfigured(
            "DIFY_INNER_API_KEY must be at least 16 printable ASCII characters "
            "(no newline or other control character)"
        )
    validate_rates(KNOWLEDGE_RATE_LIMITS)
    require_dify_settings(
        KNOWLEDGE_MODEL_RUNTIME, inner_api_url=DIFY_INNER_API_URL, inner_api_key=DIFY_INNER_API_KEY
    )
    idle_ms = KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS
    if KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_TOTAL_TIMEOUT_MS < idle_ms:
        raise ImproperlyConfigured(
            "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_TOTAL_TIMEOUT_MS="
            f"{KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_TOTAL_TIMEOUT_MS} must be at least "
            f"KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS={idle_ms}; "
            f"accepted range {idle_ms}..3600000"
        )
    if KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME not in ("durable", "inline"):
        raise ImproperlyConfigured(
            f"KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME={KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME!r} "
            "must be 'durable' (the worker cluster) or 'inline' (single-process development)"
        )
    engine = DATABASES["default"]["ENGINE"]
    if (
        KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME == "inline"
        and engine != "django.db.backends.sqlite3"
    ):
        raise ImproperlyConfigured(
            "KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME=inline is for single-process development on "
            f"the embedded SQLite database only; with a server database ({engine}) compilation "
            "must be 'durable' (run the worker cluster)"
        )
    if KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_RESERVED_BYTES < KNOWLEDGE_UPLOAD_MAX_BYTES:
        raise ImproperlyConfigured(
            "KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_RESERVED_BYTES="
            f"{KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_RESERVED_BYTES} must be at least the "
            f"per-file limit KNOWLEDGE_UPLOAD_MAX_BYTES={KNOWLEDGE_UPLOAD_MAX_BYTES}; accepted "
            f"range {KNOWLEDGE_UPLOAD_MAX_BYTES}..{100 * 1024**2}"
        )
    if KNOWLEDGE_UPLOAD_SESSION_MAX_RESERVED_BYTES_PER_SPACE < KNOWLEDGE_UPLOAD_MAX_BYTES:
        raise ImproperlyConfigured(
            "KNOWLEDGE_UPLOAD_SESSION_MAX_RESERVED_BYTES_PER_SPACE="
            f"{KNOWLEDGE_UPLOAD_SESSION_MAX_RESERVED_BYTES_PER_SPACE} must be at least the "
            f"per-file limit KNOWLEDGE_UPLOAD_MAX_BYTES={KNOWLEDGE_UPLOAD_MAX_BYTES}; accepted "
            f"range {KNOWLEDGE_UPLOAD_MAX_BYTES}..{1024**4}"
        )
    if _unstructured_url_given:
        parsed = urlsplit(_unstructured_url_given)
        try:
            parsed.port  # noqa: B018 - raises on a port that is not a number in 0..65535
        except ValueError:
            raise ImproperlyConfigured("UNSTRUCTURED_API_URL has an invalid port") from None
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ImproperlyConfigured(
                "UNSTRUCTURED_API_URL must be an http:// or https:// URL with a host, "
                "e.g. http://knowledge_fs_unstructured:8000"
            )
        if parsed.username or parsed.password or parsed.query or parsed.fragment:
            raise ImproperlyConfigured(
                "UNSTRUCTURED_API_URL must not carry credentials, a query or a fragment "
                "(use UNSTRUCTURED_API_KEY for authentication)"
            )
    if UNSTRUCTURED_API_KEY and not (
        UNSTRUCTURED_API_KEY.isascii() and UNSTRUCTURED_API_KEY.isprintable()
    ):
        raise ImproperlyConfigured(
            "UNSTRUCTURED_API_KEY must be printable ASCII (no control character)"
        )
    if UNSTRUCTURED_HEAVY_MAX_CONCURRENCY > UNSTRUCTURED_MAX_CONCURRENCY:
        raise ImproperlyConfigured(
            f"{_heavy_name}={UNSTRUCTURED_HEAVY_MAX_CONCURRENCY} exceeds "
            f"UNSTRUCTURED_MAX_CONCURRENCY={UNSTRUCTURED_MAX_CONCURRENCY}: the heavy lane is "
            "nested in the process-wide limit and must not exceed it"
        )
    if UNSTRUCTURED_STRATEGY not in ("auto", "fast", "hi_res", "ocr_only"):
        raise ImproperlyConfigured(
            f"UNSTRUCTURED_STRATEGY={UNSTRUCTURED_STRATEGY!r} is not one of "
            "auto, fast, hi_res, ocr_only"
        )
    if KNOWLEDGE_PDF_RASTERIZER not in {"poppler", "off"}:
        raise ImproperlyConfigured(
            f"KNOWLEDGE_PDF_RASTERIZER={KNOWLEDGE_PDF_RASTERIZER!r} is not one of: poppler, off"
        )
    if KNOWLEDGE_PDF_RASTERIZER_COMMAND and not (
        os.path.isabs(KNOWLEDGE_PDF_RASTERIZER_COMMAND)
        and os.path.isfile(KNOWLEDGE_PDF_RASTERIZER_COMMAND)
        and os.access(KNOWLEDGE_PDF_RASTERIZER_COMMAND, os.X_OK)
    ):
        raise ImproperlyConfigured(
            "KNOWLEDGE_PDF_RASTERIZER_COMMAND must be the absolute path of an executable pdftoppm"
        )
    if not re.fullmatch(r"[A-Za-z_]{3,}(\+[A-Za-z_]{3,})*", KNOWLEDGE_OCR_LANGUAGES):
        raise ImproperlyConfigured(
            f"KNOWLEDGE_OCR_LANGUAGES={KNOWLEDGE_OCR_LANGUAGES!r} must be Tesseract language codes "
            "joined by '+', e.g. eng or eng+deu"
        )
    # Against the timeout as configured, before it follows the Unstructured deadline.
    if KNOWLEDGE_PARSER_TIMEOUT_SECONDS >= _job_timeout:
        raise ImproperlyConfigured(
            f"KNOWLEDGE_PARSER_TIMEOUT_SECONDS={KNOWLEDGE_PARSER_TIMEOUT_SECONDS} must be less "
            "than "
            f"KNOWLEDGE_JOB_TIMEOUT_SECONDS={_job_timeout}"
        )
    if _remote_too_long and _job_timeout_given:
        raise ImproperlyConfigured(
            f"KNOWLEDGE_JOB_TIMEOUT_SECONDS={_job_timeout} must be at least "
            f"{_remote_s + 300} (the longest Unstructured request deadline, {_remote_s} s, "
            "plus 300 s) when UNSTRUCTURED_API_URL is set"
        )
    if KNOWLEDGE_PG_HNSW_EF_CONSTRUCTION < 2 * KNOWLEDGE_PG_HNSW_M:
        raise ImproperlyConfigured(
            f"KNOWLEDGE_PG_HNSW_EF_CONSTRUCTION={KNOWLEDGE_PG_HNSW_EF_CONSTRUCTION} must be at "
            "least "
            f"2 * KNOWLEDGE_PG_HNSW_M = {2 * KNOWLEDGE_PG_HNSW_M} (pgvector's rule)"
        )
    if KNOWLEDGE_SEARCH_BACKEND not in ("database", "dify"):
        raise ImproperlyConfigured(
            f"KNOWLEDGE_SEARCH_BACKEND={KNOWLEDGE_SEARCH_BACKEND!r} is not one of: database, dify"
        )
    if KNOWLEDGE_SEARCH_BACKEND == "dify" and not (DIFY_INNER_API_URL and DIFY_INNER_API_KEY):
        raise ImproperlyConfigured(
            "KNOWLEDGE_SEARCH_BACKEND=dify keeps the search index in Dify's vector store and needs "
            "DIFY_INNER_API_URL and DIFY_INNER_API_KEY (Compose: http://api:5001 and Dify's "
            "INNER_API_KEY_FOR_PLUGIN)"
        )
    _validate_multimodal()
    if KNOWLEDGE_UPGRADE_STEP_STALE_SECONDS <= KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS:
        raise ImproperlyConfigured(
            f"KNOWLEDGE_UPGRADE_STEP_STALE_SECONDS={KNOWLEDGE_UPGRADE_STEP_STALE_SECONDS} must be "
            f"greater than KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS="
            f"{KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS}"
        )
    if (
        KNOWLEDGE_UPGRADE_RECONCILE_DELIVERY_BUDGET_SECONDS * 2
        > KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS
    ):
        raise ImproperlyConfigured(
            "KNOWLEDGE_UPGRADE_RECONCILE_DELIVERY_BUDGET_SECONDS="
            f"{KNOWLEDGE_UPGRADE_RECONCILE_DELIVERY_BUDGET_SECONDS} must be at most half of "
            "KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS="
            f"{KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS}: "
            "a delivery must end well before its lease can be re-issued"
        )


def _validate_multimodal() -> None:
    """The image limits that must agree: one image fits a visual batch, one answer image fits
    the answer's total."""
    if KNOWLEDGE_VISUAL_EMBEDDING_MAX_ASSET_BYTES > KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_BYTES:
        raise ImproperlyConfigured(
            "KNOWLEDGE_VISUAL_EMBEDDING_MAX_ASSET_BYTES="
            f"{KNOWLEDGE_VISUAL_EMBEDDING_MAX_ASSET_BYTES} must not exceed "
            "KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_BYTES="
            f"{KNOWLEDGE_VISUAL_EMBEDDING_MAX_BATCH_BYTES}: one image must fit one request"
        )
    if (
        KNOWLEDGE_MULTIMODAL_ANSWER_MAX_TOTAL_IMAGE_BYTES
        < KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_BYTES
    ):
        raise ImproperlyConfigured(
            "KNOWLEDGE_MULTIMODAL_ANSWER_MAX_TOTAL_IMAGE_BYTES="
            f"{KNOWLEDGE_MULTIMODAL_ANSWER_MAX_TOTAL_IMAGE_BYTES} must be at least "
            "KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_BYTES="
            f"{KNOWLEDGE_MULTIMODAL_ANSWER_MAX_IMAGE_BYTES}"
        )
