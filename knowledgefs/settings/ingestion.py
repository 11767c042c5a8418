"""Settings of uploads, ingestion and the worker queue.

Sections, in order: upload admission, ingestion limits, jobs and leases, the worker broker, the
Unstructured-compatible parser, django-q2 (``Q_CLUSTER``, whose timeout follows the parser's
longest deadline) and PDF rasterization, OCR and parser isolation. The private ``_job_timeout``,
``_remote_*`` and ``_unstructured_url_given`` values are what
``knowledgefs.settings.validation`` checks the configured numbers against.
"""

from __future__ import annotations

import os
from typing import Any

from knowledgefs.queue_broker import parse_queue_broker, parse_queue_redis_url
from knowledgefs.settings.runtime import _workers
from knowledgefs.settings.values import _with_alias, bounded_int, env

# --- Upload admission (production deployment guide; ingestion.upload_admission) -------------------
# One per-file limit (15 MiB, at most 50 MiB) drives the file check while the body is read, the
# request-body limit (a Content-Length above limit + envelope is refused unread) and the 413
# text. Buffered multipart uploads pass a process-wide gate before their body is read: active
# requests and an aggregate reservation of three times each request's bounded envelope; waiting
# is FIFO for at most the idle timeout. Body reads have an idle and a total deadline (408).
KNOWLEDGE_UPLOAD_MAX_BYTES = bounded_int(
    "KNOWLEDGE_UPLOAD_MAX_BYTES", 15 * 1024 * 1024, 1, 50 * 1024 * 1024
)
# Multipart envelope allowance on top of the file limit (boundaries, part headers, a long UTF-8
# filename): the largest body admitted is KNOWLEDGE_UPLOAD_MAX_BYTES + this.
KNOWLEDGE_UPLOAD_ENVELOPE_BYTES = 64 * 1024
KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_CONCURRENCY = bounded_int(
    "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_CONCURRENCY", 2, 1, 8
)
KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_RESERVED_BYTES = bounded_int(
    "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_RESERVED_BYTES", 192 * 1024 * 1024, 1024**2, 4 * 1024**3
)
KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS = bounded_int(
    "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS", 30000, 100, 600000
)
KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_TOTAL_TIMEOUT_MS = bounded_int(
    "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_TOTAL_TIMEOUT_MS", 600000, 100, 3600000
)
# Upload sessions (ingestion.upload_sessions): under the Dify storage bridge and the embedded
# default every session is small_fallback (the client POSTs the bytes to this API, which buffers
# them and writes them through the object storage). Its own process-wide gate, separate from the
# multipart one: active requests and the source bytes reserved (each request its declared size),
# acquired before the buffer is allocated and held until the object write finished. The reserved
# total must be at least the per-file limit (checked in knowledgefs.settings.validation).
KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_CONCURRENCY = bounded_int(
    "KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_CONCURRENCY", 2, 1, 8
)
KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_RESERVED_BYTES = bounded_int(
    "KNOWLEDGE_DIRECT_UPLOAD_SMALL_FALLBACK_MAX_RESERVED_BYTES", 30 * 1024**2, 1, 100 * 1024**2
)
# How long a session stays open for its bytes before the sweep expires it (1 hour), and how
# many sessions one sweep run expires at most.
KNOWLEDGE_UPLOAD_SESSION_TTL_SECONDS = bounded_int(
    "KNOWLEDGE_UPLOAD_SESSION_TTL_SECONDS", 3600, 60, 86400
)
KNOWLEDGE_UPLOAD_SESSION_SWEEP_BATCH = bounded_int(
    "KNOWLEDGE_UPLOAD_SESSION_SWEEP_BATCH", 100, 1, 1000
)
# Source bytes one space's open upload sessions may reserve together (each its declared size,
# from create to its terminal state); a create past it is 409 upload_session_quota_exceeded.
# At least the per-file limit (checked in knowledgefs.settings.validation), at most 1 TiB.
KNOWLEDGE_UPLOAD_SESSION_MAX_RESERVED_BYTES_PER_SPACE = bounded_int(
    "KNOWLEDGE_UPLOAD_SESSION_MAX_RESERVED_BYTES_PER_SPACE", 512 * 1024**2, 1, 1024**4
)
# Django's own limits do not contradict the file limit: DATA_UPLOAD_MAX_MEMORY_SIZE counts only
# non-file form fields (2 MiB), and a file over FILE_UPLOAD_MAX_MEMORY_SIZE is spooled to a
# temporary file instead of memory; neither refuses a file under KNOWLEDGE_UPLOAD_MAX_BYTES.
DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
FILE_UPLOAD_HANDLERS = [
    "knowledgefs.uploads.RawNameMemoryUploadHandler",
    "knowledgefs.uploads.RawNameTemporaryUploadHandler",
]

# --- Ingestion limits -----------------------------------------------------------------------------
KNOWLEDGE_CHUNK_TARGET_CHARS = bounded_int("KNOWLEDGE_CHUNK_TARGET_CHARS", 1200, 200, 8000)
KNOWLEDGE_CHUNK_OVERLAP_CHARS = bounded_int("KNOWLEDGE_CHUNK_OVERLAP_CHARS", 120, 0, 1000)
# No chunk is sent to an embedding model over this many tokens (KnowledgeFS's approximation,
# ingestion/tokens.py): a longer chunk (CJK text, a wide table) is split again, never truncated.
KNOWLEDGE_EMBEDDING_MAX_INPUT_TOKENS = bounded_int(
    "KNOWLEDGE_EMBEDDING_MAX_INPUT_TOKENS", 512, 16, 32768
)
# Embedding calls in flight to one provider (tenant and provider of a Dify model) from all the
# worker processes of the machine together (ingestion/compilation/throttling.py).
KNOWLEDGE_EMBEDDING_PROVIDER_CONCURRENCY = bounded_int(
    "KNOWLEDGE_EMBEDDING_PROVIDER_CONCURRENCY", 2, 1, 64
)
KNOWLEDGE_COMPILE_BATCH_DOCUMENTS = bounded_int("KNOWLEDGE_COMPILE_BATCH_DOCUMENTS", 64, 1, 1024)

# --- Jobs, leases and memory bounds (production deployment guide; docs/configuration.md) ----------
# Source materialization (read + parse), machine-wide; the heavy lane (every PDF, anything over
# 8 MiB) is nested inside it with max(1, N - 1) slots so light documents keep one
# (ingestion.memory_gates).
KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY = bounded_int(
    "KNOWLEDGE_DOCUMENT_MATERIALIZATION_MAX_CONCURRENCY", 2, 1, 8
)
# Parse artifacts retained through chunking, embedding and indexing: count and aggregate bytes.
KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_CONCURRENCY = bounded_int(
    "KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_CONCURRENCY", 4, 1, 32
)
KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES = bounded_int(
    "KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES", 128 * 1024 * 1024, 1024 * 1024, 1024**3
)
# Durable compilation jobs: lease length, expired-lease sweep interval, dispatch grace, attempts
# and retry backoff (docs/configuration.md, "Jobs, leases and memory bounds").
KNOWLEDGE_JOB_LEASE_SECONDS = bounded_int("KNOWLEDGE_JOB_LEASE_SECONDS", 120, 10, 3600)
KNOWLEDGE_JOB_SWEEP_INTERVAL_SECONDS = bounded_int(
    "KNOWLEDGE_JOB_SWEEP_INTERVAL_SECONDS", 60, 60, 3600
)
# A worker whose compiling thread made no progress this long stops renewing its leases.
KNOWLEDGE_JOB_STALL_SECONDS = bounded_int("KNOWLEDGE_JOB_STALL_SECONDS", 1800, 60, 86400)
# How long a stopping `manage.py qcluster` waits for its processes before killing them (below
# Kubernetes' 30 s and compose's stop_grace_period; knowledgefs/jobs/worker_runtime.py).
KNOWLEDGE_WORKER_SHUTDOWN_GRACE_SECONDS = bounded_int(
    "KNOWLEDGE_WORKER_SHUTDOWN_GRACE_SECONDS", 20, 1, 3600
)
# Unreferenced stored objects younger than this are never reported or deleted by the storage
# sweep (`kfs storage sweep`; ingestion/storage_sweep.py): one day, at least ten minutes.
KNOWLEDGE_STORAGE_SWEEP_GRACE_SECONDS = bounded_int(
    "KNOWLEDGE_STORAGE_SWEEP_GRACE_SECONDS", 86400, 600, 30 * 86400
)
KNOWLEDGE_JOB_DISPATCH_GRACE_SECONDS = bounded_int(
    "KNOWLEDGE_JOB_DISPATCH_GRACE_SECONDS", 300, 10, 86400
)
KNOWLEDGE_JOB_MAX_ATTEMPTS = bounded_int("KNOWLEDGE_JOB_MAX_ATTEMPTS", 3, 1, 10)
KNOWLEDGE_JOB_RETRY_BACKOFF_SECONDS = bounded_int(
    "KNOWLEDGE_JOB_RETRY_BACKOFF_SECONDS", 10, 1, 3600
)

# --- Worker broker: django-q2 on Redis for many workers on many machines, docs/scaling.md ---------
# orm (default): messages are rows of the KnowledgeFS database (one machine, or many sharing
# PostgreSQL). redis: messages are a Redis list every cluster named "knowledgefs" pops from, at
# KNOWLEDGE_QUEUE_REDIS_URL (default REDIS_URL). Either way every job is claimed in the database
# and published after the claim commits, and the recovery sweeps re-publish a claim whose message
# never arrived (docs/configuration.md, "Worker broker"). Redis has no acknowledgement: a cluster
# holds at most one prefetched message per worker, and a message lost with it is re-published by
# the sweep after the dispatch grace.
KNOWLEDGE_QUEUE_BROKER = parse_queue_broker(env.str("KNOWLEDGE_QUEUE_BROKER", default="orm"))
KNOWLEDGE_QUEUE_REDIS_URL = parse_queue_redis_url(
    KNOWLEDGE_QUEUE_BROKER,
    queue_url=env.str("KNOWLEDGE_QUEUE_REDIS_URL", default=""),
    shared_url=env.str("REDIS_URL", default=""),
)

# --- Unstructured-compatible parser ---------------------------------------------------------------
# Complex formats (PDF, Office, EPUB, mail, RTF, ODF) go to this parser when UNSTRUCTURED_API_URL
# is set (ingestion/unstructured/, docs/unstructured.md). Numbers from the seed deployment guide.
UNSTRUCTURED_API_URL = env.str("UNSTRUCTURED_API_URL", default="").strip().rstrip("/")
# The endpoint path is added by the client; accept a URL that already names it (the URL as given
# is checked at the end).
_unstructured_url_given = UNSTRUCTURED_API_URL
UNSTRUCTURED_API_URL = UNSTRUCTURED_API_URL.removesuffix("/general/v0/general")
UNSTRUCTURED_API_KEY = env.str("UNSTRUCTURED_API_KEY", default="").strip()
UNSTRUCTURED_MAX_CONCURRENCY = bounded_int("UNSTRUCTURED_MAX_CONCURRENCY", 2, 1, 64)
_heavy_name = _with_alias("UNSTRUCTURED_HEAVY_MAX_CONCURRENCY", "UNSTRUCTURED_PDF_MAX_CONCURRENCY")
UNSTRUCTURED_HEAVY_MAX_CONCURRENCY = bounded_int(_heavy_name, 1, 1, 64)
UNSTRUCTURED_MAX_INPUT_BYTES = bounded_int(
    "UNSTRUCTURED_MAX_INPUT_BYTES", 15 * 1024 * 1024, 1, 50 * 1024 * 1024
)
UNSTRUCTURED_MAX_RESPONSE_BYTES = bounded_int(
    "UNSTRUCTURED_MAX_RESPONSE_BYTES", 32 * 1024 * 1024, 1024, 256 * 1024 * 1024
)
UNSTRUCTURED_REQUEST_TIMEOUT_MS = bounded_int(
    "UNSTRUCTURED_REQUEST_TIMEOUT_MS", 600_000, 1000, 3_600_000
)
UNSTRUCTURED_HEAVY_REQUEST_TIMEOUT_MS = bounded_int(
    _with_alias("UNSTRUCTURED_HEAVY_REQUEST_TIMEOUT_MS", "UNSTRUCTURED_PDF_REQUEST_TIMEOUT_MS"),
    2_400_000,
    1000,
    3_600_000,
)
UNSTRUCTURED_MAX_RETRIES = bounded_int("UNSTRUCTURED_MAX_RETRIES", 0, 0, 10)
# Partitioning strategy sent with every request; hi_res needs layout models the parser must have.
UNSTRUCTURED_STRATEGY = env.str("UNSTRUCTURED_STRATEGY", default="auto").strip().lower()

# --- django-q2 ------------------------------------------------------------------------------------
# A remote parse runs inside one compilation task, so the task's hard timeout must outlast the
# longest remote deadline (plus five minutes for the rest of the stages). Left unset,
# KNOWLEDGE_JOB_TIMEOUT_SECONDS follows it; set explicitly below it, start-up is refused.
_job_timeout = bounded_int("KNOWLEDGE_JOB_TIMEOUT_SECONDS", 1800, 10, 86400)
_job_timeout_given = bool(os.environ.get("KNOWLEDGE_JOB_TIMEOUT_SECONDS", "").strip())
_remote_s = max(UNSTRUCTURED_REQUEST_TIMEOUT_MS, UNSTRUCTURED_HEAVY_REQUEST_TIMEOUT_MS) // 1000
_remote_too_long = bool(UNSTRUCTURED_API_URL) and _job_timeout < _remote_s + 300
_cluster_timeout = _remote_s + 300 if _remote_too_long and not _job_timeout_given else _job_timeout
# The ORM broker names its database; the Redis broker its URL and a prefetch of one per worker.
_on_orm = KNOWLEDGE_QUEUE_BROKER == "orm"
Q_CLUSTER: dict[str, Any] = {
    "name": "knowledgefs",
    **({"orm": "default"} if _on_orm else {}),
    "workers": _workers,
    "timeout": _cluster_timeout,
    "retry": _cluster_timeout + 60,
    "max_attempts": 1,
    "ack_failures": True,
    "catch_up": False,
    "poll": 0.5,
    "save_limit": 1000,
    "label": "Worker tasks",
    # The isolated parser is a child of the worker; django-q2's daemonic workers may have none.
    "daemonize_workers": False,
    **({} if _on_orm else {"redis": KNOWLEDGE_QUEUE_REDIS_URL, "queue_limit": _workers}),
}

# --- PDF rasterization, OCR and parser isolation --------------------------------------------------
# Production deployment guide, "PDF image rasterization" and its settings table: poppler or off,
# 144 DPI page images, 48 DPI thumbnails, 30 s per Poppler operation, 500 assets per document,
# 2 concurrent page batches (1..8). The pixel budget, OCR and isolation limits are ours
# (docs/configuration.md, "PDF rasterization, OCR and parser isolation").
KNOWLEDGE_PDF_RASTERIZER = env.str("KNOWLEDGE_PDF_RASTERIZER", default="poppler").strip().lower()
KNOWLEDGE_PDF_RASTERIZER_DPI = bounded_int("KNOWLEDGE_PDF_RASTERIZER_DPI", 144, 36, 600)
KNOWLEDGE_PDF_RASTERIZER_THUMBNAIL_DPI = bounded_int(
    "KNOWLEDGE_PDF_RASTERIZER_THUMBNAIL_DPI", 48, 12, KNOWLEDGE_PDF_RASTERIZER_DPI
)
KNOWLEDGE_PDF_RASTERIZER_TIMEOUT_MS = bounded_int(
    "KNOWLEDGE_PDF_RASTERIZER_TIMEOUT_MS", 30000, 500, 600000
)
KNOWLEDGE_PDF_RASTERIZER_MAX_ASSETS = bounded_int(
    "KNOWLEDGE_PDF_RASTERIZER_MAX_ASSETS", 500, 0, 5000
)
KNOWLEDGE_PDF_RASTERIZER_MAX_CONCURRENCY = bounded_int(
    "KNOWLEDGE_PDF_RASTERIZER_MAX_CONCURRENCY", 2, 1, 8
)
# Optional absolute path of pdftoppm (empty: found on PATH); the published image leaves it unset.
KNOWLEDGE_PDF_RASTERIZER_COMMAND = env.str("KNOWLEDGE_PDF_RASTERIZER_COMMAND", default="").strip()
# Pixels of one rendered page; larger pages render at a reduced DPI. 25 M holds an A3 page at
# 300 DPI and stays below Pillow's decompression-bomb limit (89,478,485), never raised.
KNOWLEDGE_PDF_RASTERIZER_MAX_PIXELS = bounded_int(
    "KNOWLEDGE_PDF_RASTERIZER_MAX_PIXELS", 25_000_000, 1_000_000, 89_478_485
)
# OCR of pages without a text layer and of image documents (Debian tesseract-ocr).
KNOWLEDGE_OCR_DPI = bounded_int("KNOWLEDGE_OCR_DPI", 300, 72, 600)
KNOWLEDGE_OCR_LANGUAGES = env.str("KNOWLEDGE_OCR_LANGUAGES", default="eng").strip()
# Up-front limits of one PDF (our choice): its pages, and its pages without a text layer that
# need OCR (200 x 1-2 s of Tesseract on one core stays inside the 300 s parser timeout).
# A document over either fails at once with document_too_large, before any page is parsed.
KNOWLEDGE_PDF_MAX_PAGES = bounded_int("KNOWLEDGE_PDF_MAX_PAGES", 5000, 1, 100_000)
KNOWLEDGE_OCR_MAX_PAGES = bounded_int("KNOWLEDGE_OCR_MAX_PAGES", 200, 0, 10_000)
# Every parse runs in a child process with a hard wall-clock limit and an address-space cap
# (ingestion/parsing/isolation.py); it must end well within the worker timeout.
# Default 300 s, or half the worker timeout when that is shorter.
KNOWLEDGE_PARSER_TIMEOUT_SECONDS = bounded_int(
    "KNOWLEDGE_PARSER_TIMEOUT_SECONDS", max(5, min(300, Q_CLUSTER["timeout"] // 2)), 5, 3600
)
KNOWLEDGE_PARSER_MAX_MEMORY_MB = bounded_int("KNOWLEDGE_PARSER_MAX_MEMORY_MB", 2048, 256, 65536)

# --- Datasource sources (ingestion.sources; docs/datasources.md) ------------------------------
# Source runs (imports, syncs) on the jobs kernel: a claim never delivered is dispatched again
# after the grace; a running run whose delivery wrote nothing for the stale time (its worker died)
# is put back to queued (finished items kept) and failed attempts_exhausted after the attempts.
# A retryable Dify failure (429/5xx, timeout) puts the run back with a back-off that doubles from
# the base up to the cap. Items gone at the provider are disabled, then their documents removed
# after the retention. The schedule starts at most the batch of due syncs per minute.
KNOWLEDGE_SOURCE_RUN_DISPATCH_GRACE_SECONDS = bounded_int(
    "KNOWLEDGE_SOURCE_RUN_DISPATCH_GRACE_SECONDS", 120, 5, 3600
)
KNOWLEDGE_SOURCE_RUN_STALE_SECONDS = bounded_int(
    "KNOWLEDGE_SOURCE_RUN_STALE_SECONDS", 600, 5, 86400
)
KNOWLEDGE_SOURCE_RUN_MAX_ATTEMPTS = bounded_int("KNOWLEDGE_SOURCE_RUN_MAX_ATTEMPTS", 6, 1, 50)
KNOWLEDGE_SOURCE_RETRY_BASE_SECONDS = bounded_int(
    "KNOWLEDGE_SOURCE_RETRY_BASE_SECONDS", 30, 0, 3600
)
KNOWLEDGE_SOURCE_RETRY_MAX_SECONDS = bounded_int(
    "KNOWLEDGE_SOURCE_RETRY_MAX_SECONDS", 1800, 0, 86400
)
KNOWLEDGE_SOURCE_RETENTION_DAYS = bounded_int("KNOWLEDGE_SOURCE_RETENTION_DAYS", 30, 0, 3650)
KNOWLEDGE_SOURCE_SCHEDULE_BATCH = bounded_int("KNOWLEDGE_SOURCE_SCHEDULE_BATCH", 100, 1, 1000)
