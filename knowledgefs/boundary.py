"""Start-up rules of the Dify boundary, applied by ``knowledgefs/settings.py``.

- **Runtime selection.** ``KNOWLEDGE_MODEL_RUNTIME`` is ``local`` (the embedded default: local
  files under ``KNOWLEDGE_OBJECT_STORAGE_DIR``, the local ONNX embedding model, no reranker, no
  LLM, no datasources) or ``dify`` (models, object storage and datasources through Dify's inner
  API; needs ``DIFY_INNER_API_URL`` and ``DIFY_INNER_API_KEY``).

Settings import this module before Django is set up, so it imports nothing from Django but the
exception. Every refusal is an ``ImproperlyConfigured`` naming the variable, so ``manage.py``,
gunicorn and the django-q2 cluster all stop with the same message.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

# --- runtime selection ------------------------------------------------------------------------

LOCAL = "local"
DIFY = "dify"
RUNTIMES = (LOCAL, DIFY)

#: ``STORAGES["objects"]["BACKEND"]`` under ``KNOWLEDGE_MODEL_RUNTIME=dify``.
DIFY_OBJECT_STORAGE_BACKEND = "knowledgefs.dify.object_storage.DifyObjectStorage"
LOCAL_OBJECT_STORAGE_BACKEND = "django.core.files.storage.FileSystemStorage"


def parse_model_runtime(value: str | None) -> str:
    """``KNOWLEDGE_MODEL_RUNTIME`` → ``"local"`` or ``"dify"`` (unset or empty → ``"local"``;
    surrounding spaces and case are ignored). Anything else raises ``ImproperlyConfigured``
    naming the variable, the value and the accepted values."""
    runtime = (value or "").strip().lower() or LOCAL
    if runtime not in RUNTIMES:
        raise ImproperlyConfigured(
            f"KNOWLEDGE_MODEL_RUNTIME={value!r} is not supported; accepted values: "
            + ", ".join(RUNTIMES)
        )
    return runtime


def require_dify_settings(runtime: str, *, inner_api_url: str, inner_api_key: str) -> None:
    """Under ``dify``, refuse start-up when ``DIFY_INNER_API_URL`` or ``DIFY_INNER_API_KEY`` is
    missing; the message names every missing variable (never a value)."""
    if runtime != DIFY:
        return
    missing = [
        name
        for name, value in (
            ("DIFY_INNER_API_URL", inner_api_url),
            ("DIFY_INNER_API_KEY", inner_api_key),
        )
        if not (value or "").strip()
    ]
    if missing:
        raise ImproperlyConfigured(
            f"KNOWLEDGE_MODEL_RUNTIME=dify needs {' and '.join(missing)}: models, object "
            "storage and datasources are reached through Dify's inner API "
            "(Compose injects DIFY_INNER_API_URL=http://api:5001 and the inner key)"
        )


def objects_storage(runtime: str, location: str) -> dict:
    """The ``STORAGES["objects"]`` entry for ``runtime``: ``FileSystemStorage`` under
    ``location`` for ``local``, :class:`~knowledgefs.dify.object_storage.DifyObjectStorage`
    (which reads the ``DIFY_*`` settings when it is built) for ``dify``."""
    if runtime == DIFY:
        return {"BACKEND": DIFY_OBJECT_STORAGE_BACKEND}
    return {"BACKEND": LOCAL_OBJECT_STORAGE_BACKEND, "OPTIONS": {"location": str(location)}}
