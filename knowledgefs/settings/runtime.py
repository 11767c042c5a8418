"""Settings of the Dify boundary: Dify's inner API, the model runtime and object storage.

``KNOWLEDGE_MODEL_RUNTIME`` (local or dify) selects where models and document bytes live;
``STORAGES["objects"]`` follows it. That dify needs the inner API URL and key is checked in
``knowledgefs.settings.validation``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from knowledgefs.boundary import objects_storage, parse_model_runtime
from knowledgefs.dify.config import parse_inner_api_url
from knowledgefs.settings.platform import VAR_DIR
from knowledgefs.settings.values import bounded_int, env

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
# The local model new spaces get (a registered id; empty = bge-small-en-v1.5 int8, docs/models.md).
# Existing spaces keep the model of their embedding profile.
KNOWLEDGE_DEFAULT_EMBEDDING_MODEL = env.str("KNOWLEDGE_DEFAULT_EMBEDDING_MODEL", default="").strip()
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
