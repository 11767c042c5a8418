"""Liveness (``/health``) and readiness (``/ready``) probes.

``/ready`` answers 200 only when every enabled capability is assembled, and 503 otherwise, naming
each failing component with a short reason (never a key, a token, a URL credential or a
document). A replica with ``/health=200`` and ``/ready=503`` must stay out of rotation. The
components (docs/operations.md, "Readiness"):

| component | ``KNOWLEDGE_MODEL_RUNTIME=local`` | ``dify`` |
|---|---|---|
| ``auth`` | capability v2 on: the public JWKS parses; off: API keys only (always ready) | same |
| ``database`` | ``SELECT 1`` and no unapplied migrations | same |
| ``model_runtime`` | local ONNX model files installed, SHA-256 checked | one model-catalog page |
| ``datasource_runtime`` | ``disabled`` (ready) | the client is configured; ``not_probed`` |
| ``object_storage`` | write, read back and delete a 2-byte object | Dify's storage health |
| ``search`` | a search backend: SQLite, PostgreSQL with pgvector ≥ 0.8 (not MySQL) | same |

Bounds: a call to Dify gives up after :data:`PROBE_TIMEOUT_MS` (2 s, inline retries included);
the checks run concurrently on a small pool and ``/ready`` waits at most
:data:`READY_WAIT_SECONDS` (2.5 s) for all of them, so a dead or hanging Dify (or database)
cannot hold the probe longer. A component's result is reused for :data:`CACHE_SECONDS` (2 s) and
at most one check per component is in flight, so probes every 5–10 s from several callers cost
one catalog call and one storage call per interval at most.

Logs (logger ``knowledgefs.health``): one WARNING when the process becomes not ready or the set
of failing components changes (each with its reason), one INFO when it becomes ready again;
a 503 from ``/ready`` is not logged again by ``django.request`` on every probe.

``/health`` is liveness: 200 while the process answers. It waits for nothing; it shows the last
result of each component with its age (``unchecked`` before the first) and starts a check of
the stale ones in the background.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from ingestion import fallback_admission, upload_admission

from . import storage
from .auth.capability import parse_public_jwks
from .dify.errors import DifyError, ModelRuntimeError
from .dify.model_runtime import DifyModelRuntime
from .dify.object_storage import DifyObjectStorage
from .runtime import selection
from .runtime.local_embedding import LOCAL_MODELS, ModelFilesMissing, locate_model_files
from .runtime.local_rerank import RerankModelError, verify_files

#: One call to Dify from a probe (model catalog, storage health), inline retries included.
PROBE_TIMEOUT_MS = 2000
#: The longest ``/ready`` waits for its checks, which run concurrently.
READY_WAIT_SECONDS = 2.5
#: How long a component's result is reused.
CACHE_SECONDS = 2.0
#: The tenant named in the catalog probe (Dify's catalog is per tenant). Nil UUID: no real
#: tenant, so the answer is an empty page, or an error envelope; both prove the route and key.
PROBE_TENANT_ID = "00000000-0000-0000-0000-000000000000"
#: A reason is cut to this many characters.
DETAIL_MAX_CHARS = 240

logger = logging.getLogger("knowledgefs.health")

COMPONENTS = (
    "auth",
    "database",
    "model_runtime",
    "datasource_runtime",
    "object_storage",
    "search",
)


@dataclass(frozen=True)
class Result:
    """One check: ``ok`` (counts as ready), ``state`` (``ok``, ``failing``, ``disabled``: the
    capability is off under this runtime, ``not_probed``: configured but there is no cheap
    check), a short ``detail``, when it finished (``time.monotonic()``) and how long it took."""

    ok: bool
    state: str
    detail: str
    finished_at: float
    duration_ms: int

    def as_dict(self, now: float) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "state": self.state,
            "detail": self.detail,
            "duration_ms": self.duration_ms,
            "age_ms": max(0, int((now - self.finished_at) * 1000)),
        }


def _short(text: str) -> str:
    """One line, without the database password, cut to :data:`DETAIL_MAX_CHARS`."""
    line = (text.strip().splitlines() or [""])[0]
    password = settings.DATABASES.get(DEFAULT_DB_ALIAS, {}).get("PASSWORD")
    if password:
        line = line.replace(str(password), "[redacted]")
    line = re.sub(r"://[^@/\s]*@", "://[redacted]@", line)
    return line[:DETAIL_MAX_CHARS]


def _dify_reason(error: DifyError) -> str:
    """The error's stable code and status; Dify's own words are not repeated."""
    reason = error.code + (f" ({error.status})" if error.status else "")
    if error.status in (401, 403):
        reason += ": Dify refused the inner key (DIFY_INNER_API_KEY)"
    return reason


# --- checks: each returns (ok, state, detail) and may raise; _Component turns a raise into a
# failing result with the exception's class and first line ---------------------------------


Check = tuple[bool, str, str]


def check_auth() -> Check:
    """The request verifiers: with capability v2 on, its public key set must parse."""
    internal = "internal routes on" if settings.DIFY_INNER_API_KEY else "internal routes off"
    if not settings.KNOWLEDGE_FS_CAPABILITY_V2_ENABLED:
        return True, "ok", f"API keys; capability v2 tokens off; {internal}"
    try:
        keys = parse_public_jwks(settings.KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS)
    except ImproperlyConfigured as exc:
        return False, "failing", _short(str(exc))
    return True, "ok", f"API keys; capability v2 tokens with {len(keys)} public key(s); {internal}"


def check_database() -> Check:
    """The database answers and has no unapplied migrations."""
    connection = connections[DEFAULT_DB_ALIAS]
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if plan:
        return False, "failing", f"{len(plan)} unapplied migrations; run 'manage.py migrate'"
    return True, "ok", f"{connection.vendor}; no unapplied migrations"


def check_model_runtime() -> Check:
    """local: every built-in ONNX model's files are installed and each ``model.onnx`` has its
    recorded SHA-256 (a mismatch names the file). dify: one catalog page of at most one
    embedding model for :data:`PROBE_TENANT_ID`, within :data:`PROBE_TIMEOUT_MS`."""
    if not selection.uses_dify():
        try:
            for model in LOCAL_MODELS.values():
                locate_model_files(model)
        except ModelFilesMissing as exc:
            return False, "failing", _short(str(exc))
        if not settings.KNOWLEDGE_LOCAL_RERANK_ENABLED:
            return True, "ok", "local ONNX embedding model files installed"
        try:
            verify_files()  # the reranker's model.onnx against its pinned sha256
        except RerankModelError as exc:
            return False, "failing", _short(str(exc))
        return True, "ok", "local ONNX embedding and reranker model files installed and verified"
    probe = DifyModelRuntime(
        transport=selection.model_runtime().transport, timeout_ms=PROBE_TIMEOUT_MS
    )
    try:
        probe.list_models(tenant_id=PROBE_TENANT_ID, model_type="text-embedding", limit=1)
    except ModelRuntimeError as exc:
        if exc.code == ModelRuntimeError.CODES["error"]:
            # Dify answered on the route with our key, in its envelope, refusing the tenant.
            return True, "ok", "Dify model catalog answered (an error for the probe tenant)"
        return False, "failing", _dify_reason(exc)
    return True, "ok", "Dify model catalog answered"


def check_datasource_runtime() -> Check:
    """local: no datasources. dify: the client is configured (URL and key); it is not called:
    the contract has no health route, every call needs a tenant's ``credential_id``, and no
    feature uses datasources yet. ``model_runtime`` proves the same URL and key."""
    if not selection.uses_dify():
        return True, "disabled", "no datasources with KNOWLEDGE_MODEL_RUNTIME=local"
    selection.datasources()
    return True, "not_probed", "Dify datasource client configured; no cheap check in the contract"


def check_object_storage() -> Check:
    """Dify storage: its health route within :data:`PROBE_TIMEOUT_MS`. Any other storage:
    write, read back and delete a 2-byte object. Under dify the storage must be Dify's."""
    store = storage.object_storage()
    if isinstance(store, DifyObjectStorage):
        health = store.health(timeout_ms=PROBE_TIMEOUT_MS)
        if health:
            return True, "ok", "Dify storage answered ok"
        return False, "failing", _short(health.detail)
    if selection.uses_dify():
        return (
            False,
            "failing",
            f"KNOWLEDGE_MODEL_RUNTIME=dify but STORAGES['objects'] is {type(store).__name__}",
        )
    if storage.storage_writable():
        return True, "ok", f"{type(store).__name__}: wrote, read back and deleted a probe object"
    return False, "failing", f"{type(store).__name__}: write, read back or delete failed"


def check_search() -> Check:
    """The default database's engine has a search backend (``retrieval.backends``): SQLite
    (tantivy keyword indexes: failing with the first space whose index is missing while it has
    published nodes or cannot be opened, :func:`retrieval.keyword_index.maintenance.problems`)
    or PostgreSQL (BM25 impact lists, and pgvector ≥ 0.8 installed with its column: the reason
    names the missing extension otherwise). MySQL/MariaDB fails: schema and migrations only. With
    ``KNOWLEDGE_SEARCH_BACKEND=dify``, Dify's vector and text routes answer a probe ``get``."""
    from retrieval.backends import backend_name, get_search_backend, unsupported_reason

    connection = connections[DEFAULT_DB_ALIAS]
    vendor = connection.vendor
    reason = unsupported_reason(vendor)
    if reason is not None:
        return False, "failing", _short(reason)
    if backend_name() == "dify":  # KNOWLEDGE_SEARCH_BACKEND=dify: one get on each bridge route
        from retrieval.backends.dify import DifyBridgeBackend

        backend = get_search_backend()
        assert isinstance(backend, DifyBridgeBackend)  # backend_name() == "dify"
        ok, detail = backend.probe(PROBE_TIMEOUT_MS)
        return ok, "ok" if ok else "failing", _short(detail)
    if vendor == "postgresql":
        from retrieval.backends.pgvector import extension_problem

        problem = extension_problem(connection)
        if problem is not None:
            return False, "failing", _short(problem)
        return True, "ok", "postgresql: BM25 impact lists and pgvector HNSW dense search"
    from retrieval.keyword_index import maintenance

    problems = maintenance.problems()
    if problems:
        space_id, problem = next(iter(problems.items()))
        more = f" (and {len(problems) - 1} more spaces)" if len(problems) > 1 else ""
        return (
            False,
            "failing",
            _short(
                f"keyword index of space {space_id}: {problem}{more}; "
                f"run `kfs reindex --space {space_id}`"
            ),
        )
    return True, "ok", f"{vendor}: tantivy keyword indexes and dense search"


CHECKS: dict[str, Callable[[], Check]] = {
    "auth": check_auth,
    "database": check_database,
    "model_runtime": check_model_runtime,
    "datasource_runtime": check_datasource_runtime,
    "object_storage": check_object_storage,
    "search": check_search,
}


# --- running checks: a small pool, one check per component in flight, results cached ---------

_pool_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None


def _executor() -> ThreadPoolExecutor:
    """The probe pool of this process (re-created in a forked child)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (
                os.getpid(),
                ThreadPoolExecutor(max_workers=len(CHECKS), thread_name_prefix="kfs-ready"),
            )
        return _pool[1]


class _Component:
    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.last: Result | None = None
        self.future: Future[Result] | None = None

    def fresh(self, now: float) -> Result | None:
        last = self.last
        return last if last is not None and now - last.finished_at < CACHE_SECONDS else None

    def start(self) -> Future[Result] | Result:
        """The cached result if fresh; else the check in flight, or a new one."""
        with self.lock:
            cached = self.fresh(time.monotonic())
            if cached is not None:
                return cached
            if self.future is None or self.future.done():
                self.future = _executor().submit(self._run)
            return self.future

    def _run(self) -> Result:
        started = time.monotonic()
        try:
            ok, state, detail = CHECKS[self.name]()
        except Exception as exc:  # noqa: BLE001 - a probe reports, it never raises
            ok, state, detail = False, "failing", _short(f"{type(exc).__name__}: {exc}")
        finally:
            # This pool thread's database connection (only the database check opens one).
            connections.close_all()
        finished = time.monotonic()
        result = Result(ok, state, detail, finished, int((finished - started) * 1000))
        with self.lock:
            self.last = result
        return result


_components = {name: _Component(name) for name in CHECKS}
_transition_lock = threading.Lock()
_last_failing: tuple[str, ...] | None = None


def clear_cache() -> None:
    """Forget every cached result, so the next probe checks again."""
    for component in _components.values():
        with component.lock:
            component.last = None


def reset() -> None:
    """Forget cached results and the last logged readiness (settings changed; tests)."""
    global _last_failing
    clear_cache()
    with _transition_lock:
        _last_failing = None


def _on_setting_changed(**kwargs: Any) -> None:
    reset()


setting_changed.connect(_on_setting_changed, dispatch_uid="knowledgefs.health.clear_cache")


def readiness() -> tuple[bool, dict[str, Any]]:
    """Run (or reuse) every check, waiting at most :data:`READY_WAIT_SECONDS` in all.

    Returns ``(ready, body)``; body ``{"status": "ready"|"not_ready", "runtime",
    "failing": [names], "checks": {name: {ok, state, detail, duration_ms, age_ms}}}``. A check
    still running at the deadline is failing with "no answer within 2.5 s"."""
    pending = {name: component.start() for name, component in _components.items()}
    futures = [f for f in pending.values() if isinstance(f, Future)]
    wait_for(futures, timeout=READY_WAIT_SECONDS)
    now = time.monotonic()
    checks: dict[str, dict[str, Any]] = {}
    for name, outcome in pending.items():
        if isinstance(outcome, Future):
            if outcome.done():
                outcome = outcome.result()
            else:
                outcome = Result(
                    False,
                    "failing",
                    f"no answer within {READY_WAIT_SECONDS:g} s",
                    now,
                    int(READY_WAIT_SECONDS * 1000),
                )
        checks[name] = outcome.as_dict(now)
    failing = [name for name, check in checks.items() if not check["ok"]]
    _log_transition(failing, checks)
    body = {
        "status": "not_ready" if failing else "ready",
        "runtime": selection.runtime_name(),
        "failing": failing,
        "checks": checks,
    }
    return not failing, body


def _log_transition(failing: list[str], checks: dict[str, dict[str, Any]]) -> None:
    """Log readiness only when it changes, not on every probe."""
    global _last_failing
    with _transition_lock:
        if tuple(failing) == _last_failing:
            return
        _last_failing = tuple(failing)
    if failing:
        reasons = "; ".join(f"{name}: {checks[name]['detail']}" for name in failing)
        logger.warning("not ready: %s", reasons)
    else:
        logger.info("ready")


def diagnostics() -> dict[str, Any]:
    """``/health``'s body, without waiting: ``{"status": "ok", "runtime", "components": {name:
    last result (with its age) or {"ok": false, "state": "unchecked"}}, "uploads": the upload
    limits and this process's upload admission (ingestion.upload_admission.diagnostics)},
    "small_fallback_uploads": the upload-session body gate (ingestion.fallback_admission),
    "rollout": the two Workspace rollout switches}``.
    Stale components are checked in the background."""
    now = time.monotonic()
    components: dict[str, dict[str, Any]] = {}
    for name, component in _components.items():
        last = component.last
        component.start()
        components[name] = (
            last.as_dict(now)
            if last is not None
            else {"ok": False, "state": "unchecked", "detail": "not checked yet"}
        )
    return {
        "status": "ok",
        "runtime": selection.runtime_name(),
        "components": components,
        "uploads": upload_admission.diagnostics(),
        "small_fallback_uploads": fallback_admission.diagnostics(),
        "rollout": {
            "integrated_mode_enabled": settings.KNOWLEDGE_INTEGRATED_MODE_ENABLED,
            "document_compilation_runtime": settings.KNOWLEDGE_DOCUMENT_COMPILATION_RUNTIME,
        },
    }


# --- views --------------------------------------------------------------------------------------


View = Callable[..., HttpResponse]


def get_only(view: View) -> View:
    """GET/HEAD only; anything else is a JSON 405 (probes never see Django's HTML pages)."""

    @csrf_exempt
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
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
def health(request: HttpRequest) -> JsonResponse:
    """Liveness: always 200 while the process answers, with the last component results."""
    return JsonResponse(diagnostics())


@get_only
def ready(request: HttpRequest) -> JsonResponse:
    """Readiness: 200 only if every component is ready, else 503 naming the failing ones."""
    ready_, body = readiness()
    response = JsonResponse(body, status=200 if ready_ else 503)
    # Transitions are logged above; django.request would log every failing probe as an ERROR.
    response._has_been_logged = True  # type: ignore[attr-defined]  # Django's private flag
    return response
