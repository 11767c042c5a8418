"""Liveness (``/health``) and readiness (``/ready``) probes.

``/health`` answers 200 while the process serves requests, with component diagnostics.
``/ready`` answers 200 only when every capability the service needs is assembled: the database
answers and has no unapplied migrations, object storage is writable, and the embedding model's
files are installed; otherwise 503 with the failing checks. Keep a replica with ``/ready=503``
out of rotation.
"""

from __future__ import annotations

from functools import wraps

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from . import storage
from .runtime.local_embedding import ModelFilesMissing, locate_model_files


def _database() -> tuple[bool, str]:
    try:
        connection = connections[DEFAULT_DB_ALIAS]
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as exc:  # noqa: BLE001 - a probe reports, it never raises
        return False, f"{type(exc).__name__}: {exc}"
    if plan:
        return False, f"{len(plan)} unapplied migrations; run 'python manage.py migrate'"
    return True, connections[DEFAULT_DB_ALIAS].vendor


def _embedding_model() -> tuple[bool, str]:
    try:
        locate_model_files()
    except ModelFilesMissing as exc:
        return False, str(exc)
    return True, "local"


def _storage() -> tuple[bool, str]:
    return (True, "writable") if storage.storage_writable() else (False, "not writable")


def get_only(view):
    """GET/HEAD only; anything else is a JSON 405 (probes never see Django's HTML pages)."""

    @csrf_exempt
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.method not in ("GET", "HEAD"):
            response = JsonResponse(
                {"code": "method_not_allowed", "message": f"{request.method} is not allowed"},
                status=405,
            )
            response["Allow"] = "GET, HEAD"
            return response
        return view(request, *args, **kwargs)

    return wrapper


@get_only
def health(request):
    """Liveness: always 200 while the process answers."""
    ok, detail = _database()
    return JsonResponse({"status": "ok", "components": {"database": {"ok": ok, "detail": detail}}})


@get_only
def ready(request):
    """Readiness: 200 only if every check passes, else 503 naming the failing ones."""
    checks = {
        "database": _database(),
        "object_storage": _storage(),
        "embedding_model": _embedding_model(),
    }
    body = {
        "status": "ready" if all(ok for ok, _ in checks.values()) else "not_ready",
        "checks": {name: {"ok": ok, "detail": detail} for name, (ok, detail) in checks.items()},
    }
    return JsonResponse(body, status=200 if body["status"] == "ready" else 503)
