"""Settings of the process and of Django itself, the database, the cache and the callers.

Sections, in order: process and paths (``.env`` is loaded and the forbidden Dify credentials are
refused here, before any other setting is read), Django, logging, REST framework and the
OpenAPI schema, the database (``DATABASE_URL``), the cache (``REDIS_URL``) and the callers
(capability tokens, the inner API key, rate limits). Their cross-setting checks run in
``knowledgefs.settings.validation``.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import environ
from django.core.exceptions import ImproperlyConfigured

from knowledgefs.auth.rates import rates_from_env
from knowledgefs.boundary import refuse_forbidden_credentials
from knowledgefs.settings.values import bounded_int, env

# --- Process and paths ----------------------------------------------------------------------------
BASE_DIR = Path(__file__).resolve().parents[2]

environ.Env.read_env(BASE_DIR / ".env") if (BASE_DIR / ".env").exists() else None

# Credentials Dify owns (provider keys, object-storage and plugin-daemon credentials, datasource
# tokens, OAuth secrets) must never reach this process: refuse to start, naming each variable
# (knowledgefs/boundary.py holds the rule; docs/configuration.md, "Forbidden credentials").
refuse_forbidden_credentials(os.environ)

VAR_DIR = Path(env.str("KNOWLEDGE_VAR_DIR", default=str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

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
    # Before django_q: its `qcluster` command is replaced by knowledgefs's (the stop on SIGTERM).
    "knowledgefs",
    "django_q",
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


def database_from_url(name: str) -> dict[str, Any]:
    """``DATABASE_URL`` → Django's ``DATABASES["default"]``; only PostgreSQL (``postgres://``,
    ``postgresql://``, ``pgsql://``) or MySQL/MariaDB (``mysql://``) with a database name is
    accepted. The error names the variable and shows the value without its user, password and
    query string."""
    raw = env.str(name).strip()
    shown = re.sub(r"^([A-Za-z0-9+.-]*://)?[^@/]*@", r"\1***@", raw).split("?", 1)[0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # django-environ warns about unknown schemes
            config: dict[str, Any] = environ.Env.db_url_config(raw)
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

# --- Workspace rollout switches (seed deployment guide) -----------------------------------------
# KNOWLEDGE_INTEGRATED_MODE_ENABLED gates the internal Workspace provisioning and cutover routes
# only (off: 409 integrated_mode_disabled); model, datasource and object-storage calls go through
# Dify (KNOWLEDGE_MODEL_RUNTIME) whatever its value. KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME:
# "durable" (the worker cluster compiles queued jobs) or "inline" (the API process compiles a
# document right after its upload commits: single-process development on SQLite only, refused at
# start-up with a server database by knowledgefs.settings.validation).
KNOWLEDGE_INTEGRATED_MODE_ENABLED = env.bool("KNOWLEDGE_INTEGRATED_MODE_ENABLED", default=False)
KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME = env.str(
    "KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME", default="durable"
).strip()
