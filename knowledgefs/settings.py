"""KnowledgeFS settings, read from the environment.

With no environment set this is the embedded default: SQLite in ``var/`` (WAL mode), django-q2 on
the ORM broker, objects under ``var/objects/`` and the local ONNX embedding model. Every variable
is documented in ``docs/configuration.md``; ``scripts/settings_table.py`` reads this file's text
(its section banners and environment reads) to generate the operator table.

Sections run in domain order: the process and Django's own settings, the database, cache and
callers, Dify and the runtime boundary, uploads and ingestion, the worker queue, retrieval and
the upgrade bridge. Each setting (and each dict: ``INSTALLED_APPS``, ``DATABASES``, ``CACHES``,
``STORAGES``, ``Q_CLUSTER``, ``REST_FRAMEWORK``) is written once, in its section. A malformed
value is refused where it is read (``bounded_int`` and the ``parse_*`` helpers); the checks
across settings run last, in :func:`_validate`, and raise ``ImproperlyConfigured`` at import.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from pathlib import Path
from urllib.parse import unquote, urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

from knowledgefs.auth.capability import parse_public_jwks
from knowledgefs.auth.rates import rates_from_env, validate_rates
from knowledgefs.boundary import (
    objects_storage,
    parse_model_runtime,
    refuse_forbidden_credentials,
    require_dify_settings,
)
from knowledgefs.dify.config import parse_inner_api_url
from knowledgefs.queue_broker import parse_queue_broker, parse_queue_redis_url

# --- Process and paths ----------------------------------------------------------------------------
BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env") if (BASE_DIR / ".env").exists() else None

# Credentials Dify owns (provider keys, object-storage and plugin-daemon credentials, datasource
# tokens, OAuth secrets) must never reach this process: refuse to start, naming each variable
# (knowledgefs/boundary.py holds the rule; docs/configuration.md, "Forbidden credentials").
refuse_forbidden_credentials(os.environ)

VAR_DIR = Path(env.str("KNOWLEDGE_VAR_DIR", default=str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def bounded_int(name: str, default: int, low: int, high: int) -> int:
    """Read an integer setting and refuse values outside ``[low, high]`` at start-up, naming the
    variable, the value and the range (unset or empty → ``default``)."""
    raw = env.str(name, default="").strip()
    if not raw:
        return default
    if not (raw.isascii() and raw.lstrip("-").isdigit()):
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not a whole number; accepted range {low}..{high}"
        )
    value = int(raw)
    if not low <= value <= high:
        raise ImproperlyConfigured(f"{name}={value} is outside the accepted range {low}..{high}")
    return value


def _with_alias(name: str, alias: str) -> str:
    """``name`` when it is set, else its lower-precedence compatibility ``alias`` when that is."""
    return (
        name
        if env.str(name, default="").strip() or not env.str(alias, default="").strip()
        else alias
    )


SECRET_KEY = env.str("SECRET_KEY", default="insecure-embedded-default-change-me")
DEBUG = env.bool("DEBUG", default=False)
# An internal service reached by Dify under its Compose service name: any Host by default;
# restrict it where the service is reachable from outside.
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["*"])

# --- Django: apps, middleware, templates, languages -----------------------------------------------
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_q",
    "knowledgefs",
    "spaces",
    "ingestion",
    "retrieval",
    "upgrades",
    "drf_spectacular",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # The admin's CSS and JavaScript under gunicorn (make serve, the image): served from the
    # apps' static folders, no collectstatic step (WHITENOISE_USE_FINDERS below).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "knowledgefs.urls"
CSRF_FAILURE_VIEW = "knowledgefs.errors.csrf_failure"
WSGI_APPLICATION = "knowledgefs.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# Admin messages live in the session (database), never in a client-side cookie: the message
# that shows a new API key's secret once must not travel back and forth in a readable cookie.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

# --- Logging --------------------------------------------------------------------------------------
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="WARNING")},
    "loggers": {
        "knowledgefs": {"level": env.str("LOG_LEVEL", default="INFO"), "propagate": True},
        # pypdf warns about every font it decodes without fontTools; failures still raise.
        "pypdf": {"level": "ERROR", "propagate": True},
    },
}

# --- REST framework and the OpenAPI schema --------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "knowledgefs.auth.authentication.CapabilityTokenAuthentication",
        "spaces.authentication.ApiKeyAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["knowledgefs.auth.permissions.OperationPermission"],
    "DEFAULT_THROTTLE_CLASSES": ["knowledgefs.auth.throttling.OperationThrottle"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": [
        "knowledgefs.parsers.TextJSONParser",
        "knowledgefs.uploads.VerbatimMultiPartParser",
    ],
    "EXCEPTION_HANDLER": "knowledgefs.errors.api_exception_handler",
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_SCHEMA_CLASS": "knowledgefs.openapi.schema.KnowledgeAutoSchema",
}
# The OpenAPI schema (drf-spectacular) is served at /openapi.json (docs/api.md). Not read from
# the environment. The schema view takes no credential (inventory §3: GET /openapi.json is
# public, like /health); knowledgefs/openapi/ holds the security schemes, the error envelope and
# the per-route annotations.


def _package_version() -> str:
    """The version in pyproject.toml beside this checkout, else the installed distribution's,
    else ``0+unknown`` (the schema's ``info.version``)."""
    import tomllib
    from importlib import metadata

    try:
        with open(BASE_DIR / "pyproject.toml", "rb") as handle:
            return str(tomllib.load(handle)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        pass
    try:
        return metadata.version("knowledgefs")
    except metadata.PackageNotFoundError:
        return "0+unknown"


SPECTACULAR_SETTINGS = {
    "TITLE": "KnowledgeFS API",
    "DESCRIPTION": (
        "Knowledge spaces for Dify: product routes under /v1/, Dify's internal routes under "
        '/internal/. Every error is {code, message, details?} (docs/api.md, "Errors").'
    ),
    "VERSION": _package_version(),
    # Relative: the document describes the server it is read from, whatever its host name.
    "SERVERS": [{"url": "/", "description": "this KnowledgeFS server"}],
    # The document view itself is not an API route; request and response shapes of a
    # serializer are separate components (read-only fields are not asked for).
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "PREPROCESSING_HOOKS": ["knowledgefs.openapi.schema.only_api_routes"],
    "TAGS": [
        {"name": "knowledge-spaces", "description": "Spaces and their profiles"},
        {"name": "documents", "description": "Uploads, documents and their text"},
        {"name": "jobs", "description": "Compilation jobs"},
        {"name": "retrieval", "description": "Retrieval tests and golden questions"},
        {"name": "queries", "description": "Cited answers over SSE and their traces"},
        {"name": "research-tasks", "description": "Durable Research runs"},
        {"name": "internal", "description": "Dify's internal routes (X-Inner-Api-Key)"},
    ],
}

# --- Database -------------------------------------------------------------------------------------
# DATABASE_URL switches to PostgreSQL or MySQL/MariaDB; the embedded default is SQLite in WAL mode
# with IMMEDIATE transactions so that concurrent writers (API + workers) queue on the lock instead
# of failing.
DATABASE_ENGINES = ("django.db.backends.postgresql", "django.db.backends.mysql")


def database_from_url(name: str) -> dict:
    """``DATABASE_URL`` → Django's ``DATABASES["default"]``; only PostgreSQL (``postgres://``,
    ``postgresql://``, ``pgsql://``) or MySQL/MariaDB (``mysql://``) with a database name is
    accepted. The error names the variable and shows the value without its user, password and
    query string."""
    raw = env.str(name).strip()
    shown = re.sub(r"^([A-Za-z0-9+.-]*://)?[^@/]*@", r"\1***@", raw).split("?", 1)[0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # django-environ warns about unknown schemes
            config = environ.Env.db_url_config(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={shown!r} is not a database URL: {exc}") from None
    if config.get("ENGINE") not in DATABASE_ENGINES or not config.get("NAME"):
        raise ImproperlyConfigured(
            f"{name}={shown!r} is not accepted: a PostgreSQL URL "
            "postgres://user:password@host:port/database or a MySQL/MariaDB URL "
            "mysql://user:password@host:port/database is required (unset = embedded SQLite)"
        )
    return config


if env.str("DATABASE_URL", default="").strip():
    _database = database_from_url("DATABASE_URL")
    # A Unix-socket directory may be given percent-encoded in the host position.
    _database["HOST"] = unquote(_database.get("HOST") or "")
    _database.setdefault("CONN_MAX_AGE", 60)
    _database["CONN_HEALTH_CHECKS"] = True
else:
    _database = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": VAR_DIR / "knowledgefs.sqlite3",
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
        },
        "TEST": {"NAME": VAR_DIR / "test-knowledgefs.sqlite3"},
    }
# MySQL/MariaDB through PyMySQL (MIT), installed as the MySQLdb module Django's backend imports,
# unless mysqlclient (GPL-2.0, never a dependency of ours) is installed by the operator; PyMySQL
# reports mysqlclient-compatible version 1.4.6, above Django 5.2's minimum 1.4.3
# (docs/testing.md, "MariaDB"). utf8mb4 for full Unicode; READ COMMITTED like PostgreSQL, so
# the compare-and-set updates and SKIP LOCKED claims see committed rows; strict mode so an
# over-long or invalid value is an error instead of a silent truncation.
if _database["ENGINE"] == "django.db.backends.mysql":
    from knowledgefs.mysql import MYSQL_SILENCED_CHECKS, install_driver

    install_driver()
    SILENCED_SYSTEM_CHECKS = MYSQL_SILENCED_CHECKS
    _database.setdefault("OPTIONS", {}).update(
        {
            "charset": "utf8mb4",
            "isolation_level": "read committed",
            "init_command": "SET sql_mode='STRICT_TRANS_TABLES'",
        }
    )
    _database.setdefault("TEST", {}).update(
        {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"}
    )

DATABASES = {"default": _database}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Cache (API-key authentication results); Redis when REDIS_URL is set --------------------------
# Authentication results are cached per process (locmem) or in Redis, and stay valid only while
# the revocation epoch they were read under is unchanged (spaces.services, "Authentication
# cache"): every revocation or scope change replaces it before its commit and again after. With
# locmem the epoch is a file in KNOWLEDGE_VAR_DIR, so every API process must share that folder
# (one machine or one volume); processes that do not share it must share REDIS_URL instead.
KNOWLEDGE_AUTH_CACHE_SHARED = bool(env.str("REDIS_URL", default=""))
if KNOWLEDGE_AUTH_CACHE_SHARED:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": env.str("REDIS_URL"),
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
KNOWLEDGE_AUTH_CACHE_SECONDS = bounded_int("KNOWLEDGE_AUTH_CACHE_SECONDS", 300, 0, 3600)
KNOWLEDGE_AUTH_EPOCH_FILE = VAR_DIR / "auth" / "revocation-epoch"

# --- Callers: Dify capability tokens, the inner API key, rate limits ------------------------------
# Capability v2 tokens are RS256 JWTs Dify signs; KnowledgeFS holds the public JWKS only (one
# current key and at most two previous ones). A JWKS with private key members is refused.
KNOWLEDGE_FS_CAPABILITY_V2_ENABLED = env.bool("KNOWLEDGE_FS_CAPABILITY_V2_ENABLED", default=False)
KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS = env.str(
    "KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS", default=""
)
# The key Dify presents on internal routes (X-Inner-Api-Key) and that KnowledgeFS presents on
# Dify's inner API: Dify's INNER_API_KEY_FOR_PLUGIN. Empty: internal routes are off.
DIFY_INNER_API_KEY = env.str("DIFY_INNER_API_KEY", default="")
# Fixed-window limits per (tenant, caller, operation id); JSON object, null = unlimited.
KNOWLEDGE_RATE_LIMITS = {
    "default": "1200/minute",
    "documents.create": "600/minute",
    "queries.create": "600/minute",
    "queries.answer": "600/minute",
    **rates_from_env(env.str("KNOWLEDGE_RATE_LIMITS", default="")),
}

# --- Dify inner API -------------------------------------------------------------------------------
# Models, object storage and datasources are Dify's: KnowledgeFS reaches them only through
# Dify's inner API with DIFY_INNER_API_KEY and never holds their credentials (knowledgefs/dify/,
# docs/dify-boundary.md). Compose injects DIFY_INNER_API_URL=http://api:5001.
DIFY_INNER_API_URL = env.str("DIFY_INNER_API_URL", default="").strip()
if DIFY_INNER_API_URL:
    DIFY_INNER_API_URL = parse_inner_api_url(DIFY_INNER_API_URL)
# Per request, its retries and its body included (Dify's client contract: 60 s, at most 10 min).
DIFY_MODEL_RUNTIME_TIMEOUT_MS = bounded_int("DIFY_MODEL_RUNTIME_TIMEOUT_MS", 60000, 100, 600000)
DIFY_MODEL_RUNTIME_MAX_RESPONSE_BYTES = bounded_int(
    "DIFY_MODEL_RUNTIME_MAX_RESPONSE_BYTES", 8 * 1024 * 1024, 1024, 256 * 1024 * 1024
)
# Embedding requests in flight per call (16 texts each); production guide: 2, 1..8.
KNOWLEDGE_EMBEDDING_REQUEST_CONCURRENCY = bounded_int(
    "KNOWLEDGE_EMBEDDING_REQUEST_CONCURRENCY", 2, 1, 8
)
# Each object-storage request, its body included (production guide: 60 s).
DIFY_OBJECT_STORAGE_REQUEST_TIMEOUT_MS = bounded_int(
    "DIFY_OBJECT_STORAGE_REQUEST_TIMEOUT_MS", 60000, 100, 3600000
)

# --- Model runtime --------------------------------------------------------------------------------
# local (the embedded default) or dify: models, object storage and datasources through Dify's
# inner API (knowledgefs.boundary, knowledgefs.runtime.selection). Under dify, Dify's inner API
# is required (checked at the end) and document bytes go to Dify's storage (below).
KNOWLEDGE_MODEL_RUNTIME = parse_model_runtime(env.str("KNOWLEDGE_MODEL_RUNTIME", default="local"))
# 8 measured fastest on 2 cores (docs/benchmarks.md): larger batches pad more and lose cache.
KNOWLEDGE_EMBEDDING_BATCH_SIZE = bounded_int("KNOWLEDGE_EMBEDDING_BATCH_SIZE", 8, 1, 256)
# 0 = every core. Inside a django-q2 cluster the workers share the cores, so each gets its share.
_workers = bounded_int("KNOWLEDGE_WORKERS", 2, 1, 32)
_in_cluster = len(sys.argv) > 1 and sys.argv[1] == "qcluster"
KNOWLEDGE_EMBEDDING_THREADS = bounded_int(
    "KNOWLEDGE_EMBEDDING_THREADS",
    max(1, (os.cpu_count() or 1) // _workers) if _in_cluster else 0,
    0,
    64,
)
# Extra embedding models by id: {"model-id": "dotted.path.to.ClassOrFactory"} (called without
# arguments; the object's model_id must be its id). The local default model is always registered.
KNOWLEDGE_EMBEDDING_MODELS: dict[str, str] = {}

# --- Object storage boundary ----------------------------------------------------------------------
# "objects" holds document bytes: local files here, Dify's storage under
# KNOWLEDGE_MODEL_RUNTIME=dify (knowledgefs.boundary.objects_storage; the local folder is unused).
OBJECT_STORAGE_DIR = Path(env.str("KNOWLEDGE_OBJECT_STORAGE_DIR", default=str(VAR_DIR / "objects")))
STORAGES = {
    "default": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(VAR_DIR / "media")},
    },
    "objects": objects_storage(KNOWLEDGE_MODEL_RUNTIME, str(OBJECT_STORAGE_DIR)),
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
STATIC_URL = "static/"
# No collectstatic: whitenoise serves the apps' static folders directly (a STATIC_ROOT that
# nothing fills would only make it warn at every start).
STATIC_ROOT = None
WHITENOISE_USE_FINDERS = True

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
Q_CLUSTER = {
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
# Every parse runs in a child process with a hard wall-clock limit and an address-space cap
# (ingestion/parsing/isolation.py); it must end well within the worker timeout.
# Default 300 s, or half the worker timeout when that is shorter.
KNOWLEDGE_PARSER_TIMEOUT_SECONDS = bounded_int(
    "KNOWLEDGE_PARSER_TIMEOUT_SECONDS", max(5, min(300, Q_CLUSTER["timeout"] // 2)), 5, 3600
)
KNOWLEDGE_PARSER_MAX_MEMORY_MB = bounded_int("KNOWLEDGE_PARSER_MAX_MEMORY_MB", 2048, 256, 65536)

# --- Search backends: PostgreSQL + pgvector -------------------------------------------------------
# HNSW per model and dimension, docs/scaling.md.
# HNSW build parameters of each (model, dimension) index (pgvector's defaults: m 16,
# ef_construction 64; pgvector needs ef_construction >= 2 * m). Read when an index is created.
KNOWLEDGE_PG_HNSW_M = bounded_int("KNOWLEDGE_PG_HNSW_M", 16, 2, 100)
KNOWLEDGE_PG_HNSW_EF_CONSTRUCTION = bounded_int("KNOWLEDGE_PG_HNSW_EF_CONSTRUCTION", 64, 4, 1000)
# Candidate list of an HNSW search (hnsw.ef_search; raised to the query's depth when smaller).
# 400, not pgvector's 40 or our first 100: at 1M chunks recall@10 against exact search was 0.64
# at 100 and 0.81 at 400 (0.934 and 0.9935 at 100k), with the dense leg at 10-45 ms either way
# (docs/benchmarks.md, "Scale curve").
KNOWLEDGE_PG_HNSW_EF_SEARCH = bounded_int("KNOWLEDGE_PG_HNSW_EF_SEARCH", 400, 10, 1000)
# Most index tuples an iterative scan visits to find enough rows that pass the filters
# (hnsw.max_scan_tuples, pgvector's default 20000); when it runs out first, the query is
# answered by an exact scan of the space's rows instead.
KNOWLEDGE_PG_HNSW_MAX_SCAN_TUPLES = bounded_int(
    "KNOWLEDGE_PG_HNSW_MAX_SCAN_TUPLES", 20000, 1000, 10000000
)

# --- Search backends: the Dify vector and text bridge ---------------------------------------------
# Inventory 7.2-7.3, docs/scaling.md.
# database (default): the keyword and dense projections live in this service's database (FTS5 or
# tsvector, exact dense search). dify: they live in Dify's vector store (Qdrant, Elasticsearch,
# Weaviate...) through POST /inner/api/knowledge-fs/texts and /vectors; relational state, and
# the SQL that decides which ids a search may return, stay here (docs/architecture.md).
KNOWLEDGE_SEARCH_BACKEND = env.str("KNOWLEDGE_SEARCH_BACKEND", default="database").strip().lower()
# One bridge request (retries included), in ms.
DIFY_VECTOR_STORE_REQUEST_TIMEOUT_MS = bounded_int(
    "DIFY_VECTOR_STORE_REQUEST_TIMEOUT_MS", 30000, 100, 600000
)
# Chunk searches (2048 authorized ids each) of one search leg in flight at once.
KNOWLEDGE_SEARCH_BRIDGE_CONCURRENCY = bounded_int("KNOWLEDGE_SEARCH_BRIDGE_CONCURRENCY", 4, 1, 32)

# --- Retrieval: planner, Deep mode, filters and retrieval tests -----------------------------------
# docs/retrieval.md, "Modes".
RETRIEVAL_MAX_TOP_K = 100
RETRIEVAL_MAX_QUERY_CHARS = 16000

# --- Retrieval: Research and Auto -----------------------------------------------------------------
# Reasoning-model budgets; docs/retrieval.md, "Research and Auto".
# Seed deployment guide: per planner/judge call a 60 s deadline and an 8,192-token output ceiling
# (so hidden reasoning tokens do not force a second call); the initial Research rerank pool,
# shared fairly across the original query and up to three planned intents, defaults to and is
# capped at 200 candidates.
KNOWLEDGE_RESEARCH_REASONING_TIMEOUT_MS = bounded_int(
    "KNOWLEDGE_RESEARCH_REASONING_TIMEOUT_MS", 60000, 100, 600000
)
KNOWLEDGE_RESEARCH_REASONING_MAX_OUTPUT_TOKENS = bounded_int(
    "KNOWLEDGE_RESEARCH_REASONING_MAX_OUTPUT_TOKENS", 8192, 256, 65536
)
KNOWLEDGE_RESEARCH_MAX_RERANK_CANDIDATES = bounded_int(
    "KNOWLEDGE_RESEARCH_MAX_RERANK_CANDIDATES", 200, 1, 200
)


# --- Retrieval: durable research tasks ------------------------------------------------------------
# docs/retrieval.md, "Research tasks".
# Durable runs of Research mode on the worker queue (retrieval.research_tasks). The per-task
# wall clock defaults to and is capped at the durable Research budget of 180 s (issue: "durable
# 180 s"); a delivery's django-q2 timeout is that budget + 30 s, so a running task is stale (its
# worker died) only after KNOWLEDGE_RESEARCH_TASK_STALE_SECONDS, which must exceed 210 s.
KNOWLEDGE_RESEARCH_TASK_TIMEOUT_MS = bounded_int(
    "KNOWLEDGE_RESEARCH_TASK_TIMEOUT_MS", 180000, 1000, 180000
)
KNOWLEDGE_RESEARCH_TASK_MAX_ATTEMPTS = bounded_int("KNOWLEDGE_RESEARCH_TASK_MAX_ATTEMPTS", 3, 1, 10)
KNOWLEDGE_RESEARCH_TASK_STALE_SECONDS = bounded_int(
    "KNOWLEDGE_RESEARCH_TASK_STALE_SECONDS", 300, 240, 3600
)
KNOWLEDGE_RESEARCH_TASK_DISPATCH_GRACE_SECONDS = bounded_int(
    "KNOWLEDGE_RESEARCH_TASK_DISPATCH_GRACE_SECONDS", 120, 10, 3600
)
# Active (queued + running) tasks per owner (API key / capability subject) and per tenant:
# one caller's burst must not fill the shared worker queue (429 research_task_limit).
KNOWLEDGE_RESEARCH_TASK_MAX_ACTIVE_PER_OWNER = bounded_int(
    "KNOWLEDGE_RESEARCH_TASK_MAX_ACTIVE_PER_OWNER", 5, 1, 1000
)
KNOWLEDGE_RESEARCH_TASK_MAX_ACTIVE_PER_TENANT = bounded_int(
    "KNOWLEDGE_RESEARCH_TASK_MAX_ACTIVE_PER_TENANT", 20, 1, 10000
)
# The plan estimate reads the Research section's KNOWLEDGE_RESEARCH_REASONING_* budgets.


# --- Retrieval: cited answers over SSE and answer traces ------------------------------------------
# docs/retrieval.md, "Answers".
# The evidence window: the reasoning model's context size comes from the Dify model catalog;
# this is the size used when the catalog gives none (and for extractive answers).
KNOWLEDGE_ANSWER_CONTEXT_TOKENS = bounded_int(
    "KNOWLEDGE_ANSWER_CONTEXT_TOKENS", 8192, 1024, 2000000
)
# Output reservation of the window (at most a quarter of it); also the LLM's max_tokens.
KNOWLEDGE_ANSWER_MAX_OUTPUT_TOKENS = bounded_int(
    "KNOWLEDGE_ANSWER_MAX_OUTPUT_TOKENS", 1024, 64, 32768
)
# Answerability: items needed at or above the score for "answerable" (else "partial").
KNOWLEDGE_ANSWER_MIN_ITEMS = bounded_int("KNOWLEDGE_ANSWER_MIN_ITEMS", 1, 1, 20)
KNOWLEDGE_ANSWER_MIN_FINAL_SCORE_PERCENT = bounded_int(
    "KNOWLEDGE_ANSWER_MIN_FINAL_SCORE_PERCENT", 30, 0, 100
)
KNOWLEDGE_ANSWER_MIN_FINAL_SCORE = KNOWLEDGE_ANSWER_MIN_FINAL_SCORE_PERCENT / 100
# Answerability's absolute signals (fused scores are relative): the raw query–evidence cosine
# of the dense leg, and the share of the question's content words one item holds. Defaults
# calibrated on SciFact claims vs off-topic questions (docs/retrieval.md, "Answerability").
KNOWLEDGE_ANSWER_MIN_DENSE_SIMILARITY_PERCENT = bounded_int(
    "KNOWLEDGE_ANSWER_MIN_DENSE_SIMILARITY_PERCENT", 35, 0, 100
)
KNOWLEDGE_ANSWER_MIN_DENSE_SIMILARITY = KNOWLEDGE_ANSWER_MIN_DENSE_SIMILARITY_PERCENT / 100
KNOWLEDGE_ANSWER_MIN_TERM_COVERAGE_PERCENT = bounded_int(
    "KNOWLEDGE_ANSWER_MIN_TERM_COVERAGE_PERCENT", 50, 1, 100
)
KNOWLEDGE_ANSWER_MIN_TERM_COVERAGE = KNOWLEDGE_ANSWER_MIN_TERM_COVERAGE_PERCENT / 100
# Extractive answers (no reasoning model): at most this many sentences.
KNOWLEDGE_ANSWER_EXTRACTIVE_SENTENCES = bounded_int(
    "KNOWLEDGE_ANSWER_EXTRACTIVE_SENTENCES", 3, 1, 20
)
# Longest answer, in UTF-8 bytes; a longer one is cut at a character boundary (truncated: true).
KNOWLEDGE_ANSWER_MAX_BYTES = bounded_int("KNOWLEDGE_ANSWER_MAX_BYTES", 65536, 1024, 1048576)
# How long a catalog lookup of a reasoning model's context size is reused by this process.
KNOWLEDGE_ANSWER_CATALOG_CACHE_SECONDS = bounded_int(
    "KNOWLEDGE_ANSWER_CATALOG_CACHE_SECONDS", 300, 0, 86400
)


# --- Retrieval: golden questions and the evaluation gate ------------------------------------------
# docs/retrieval.md, "Evaluation".
# At most this many golden questions per space (a run retrieves once per question).
KNOWLEDGE_GOLDEN_MAX_QUESTIONS_PER_SPACE = bounded_int(
    "KNOWLEDGE_GOLDEN_MAX_QUESTIONS_PER_SPACE", 1000, 1, 100000
)

# --- Upgrade bridge: staged run -------------------------------------------------------------------
# Snapshot, steps, claims, sweeps, file leases.
# docs/upgrades.md "Staged run" and docs/configuration.md. G5 of the bridge specification: the
# wait for a new space is bounded by time (the reference's 360 retries x 5 s = about 30 min).
KNOWLEDGE_UPGRADE_SPACE_WAIT_SECONDS = bounded_int(
    "KNOWLEDGE_UPGRADE_SPACE_WAIT_SECONDS", 1800, 60, 86400
)
# A claimed step that was never delivered is claimed again after this many seconds (G1).
KNOWLEDGE_UPGRADE_DISPATCH_GRACE_SECONDS = bounded_int(
    "KNOWLEDGE_UPGRADE_DISPATCH_GRACE_SECONDS", 120, 10, 3600
)
# One step's django-q2 timeout (a step is one storage read and one admission, or one space
# call): the worker is killed past it. A running step older than the stale limit is taken back
# by the sweep (G2); the limit must outlast the step timeout, so django-q2 has stopped a live
# worker before its step is handed to another.
KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS = bounded_int(
    "KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS", 300, 30, 3600
)
KNOWLEDGE_UPGRADE_STEP_STALE_SECONDS = bounded_int(
    "KNOWLEDGE_UPGRADE_STEP_STALE_SECONDS", KNOWLEDGE_UPGRADE_STEP_TIMEOUT_SECONDS + 60, 60, 7200
)
# Deliveries one step may start before the job is failed with attempts_exhausted.
KNOWLEDGE_UPGRADE_STEP_MAX_ATTEMPTS = bounded_int("KNOWLEDGE_UPGRADE_STEP_MAX_ATTEMPTS", 5, 1, 50)
# Not read from the environment: a dotted django-q2 broker class for the upgrade step messages
# only ("" = the cluster's broker). Tests select a broker that refuses every message.
KNOWLEDGE_UPGRADE_BROKER_CLASS = ""

# --- Upgrade bridge: document reconciliation ------------------------------------------------------
# Lease, batches, recovery schedule, dead letter.
# docs/configuration.md, "Upgrade document reconciliation". The lease TTL bounds how long a lost
# delivery stalls a space (recovery re-issues after expiry); a delivery stops its batch once its
# time budget is spent, and the budget must stay at most half the TTL so a live worker always
# finishes before its lease can be re-issued (at most one effective worker per lease).
KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS = bounded_int(
    "KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS", 300, 30, 3600
)
KNOWLEDGE_UPGRADE_RECONCILE_DELIVERY_BUDGET_SECONDS = bounded_int(
    "KNOWLEDGE_UPGRADE_RECONCILE_DELIVERY_BUDGET_SECONDS", 60, 5, 1800
)
KNOWLEDGE_UPGRADE_RECONCILE_BATCH_SIZE = bounded_int(
    "KNOWLEDGE_UPGRADE_RECONCILE_BATCH_SIZE", 50, 1, 1000
)
KNOWLEDGE_UPGRADE_RECONCILE_MAX_ATTEMPTS = bounded_int(
    "KNOWLEDGE_UPGRADE_RECONCILE_MAX_ATTEMPTS", 20, 1, 1000
)
KNOWLEDGE_UPGRADE_RECONCILE_RETRY_DELAY_SECONDS = bounded_int(
    "KNOWLEDGE_UPGRADE_RECONCILE_RETRY_DELAY_SECONDS", 60, 0, 3600
)
KNOWLEDGE_UPGRADE_RECONCILE_RECOVERY_BATCH = bounded_int(
    "KNOWLEDGE_UPGRADE_RECONCILE_RECOVERY_BATCH", 100, 1, 1000
)


# --- Upgrade bridge: workspace cutover ledger, runtime gate and cleanup authorizations ------------
# Windows start at the cutover (or the observing step); see docs/upgrades.md for what each fences.
KNOWLEDGE_CUTOVER_ROLLBACK_WINDOW_SECONDS = bounded_int(
    "KNOWLEDGE_CUTOVER_ROLLBACK_WINDOW_SECONDS", 14 * 86400, 3600, 90 * 86400
)
KNOWLEDGE_CUTOVER_OBSERVATION_SECONDS = bounded_int(
    "KNOWLEDGE_CUTOVER_OBSERVATION_SECONDS", 86400, 60, 30 * 86400
)
KNOWLEDGE_CUTOVER_MAX_TASK_TTL_SECONDS = bounded_int(
    "KNOWLEDGE_CUTOVER_MAX_TASK_TTL_SECONDS", 7 * 86400, 60, 30 * 86400
)
KNOWLEDGE_CLEANUP_APPROVAL_SECONDS = bounded_int(
    "KNOWLEDGE_CLEANUP_APPROVAL_SECONDS", 86400, 300, 7 * 86400
)


# --- Start-up checks across settings --------------------------------------------------------------
# Each raises ImproperlyConfigured at import, naming the variables and the accepted values; the
# system checks of knowledgefs/checks.py (with stable ids) cover what needs a database or a file.


def _validate() -> None:
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


_validate()
