"""What can end a compilation attempt: a lost lease, or a failure with a stable code and its
retry class.

:func:`classify` maps any exception to a :class:`CompilationFailure`: a projection (search store)
failure keeps its own code and retry class, database and connection errors are retryable
``transient_error``, anything else is a terminal ``internal_error``.
"""

from __future__ import annotations

from django.db import DatabaseError

from ingestion.projection import ProjectionError


class LeaseLost(Exception):
    """The job is no longer ours (another delivery owns it, or it was canceled)."""


class CompilationFailure(Exception):
    """A document-level failure with a stable ``code``, a message and its retry class.

    ``retryable=False`` (the default) ends the attempt as ``failed``; ``True`` puts it in
    ``retry_wait`` with exponential back-off until ``KNOWLEDGE_JOB_MAX_ATTEMPTS`` is reached.
    """

    def __init__(self, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable


# Exceptions that say "try again later" rather than "this document cannot be compiled".
# A parser transport timeout is deliberately absent: the remote parser may still be working on
# the document, so an automatic retry would pile up work (see docs/architecture.md).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (DatabaseError, ConnectionError)


def embedding_failure(exc: BaseException) -> CompilationFailure:
    """The failure of an embedding call, with the retry class the model runtime gave it.

    A Dify error keeps Dify's own answer to "may a later attempt succeed?" (``retryable``, see
    :mod:`knowledgefs.dify.errors`): a retryable one (timeout, connection, 408/409/425/429/5xx,
    already retried inline by the transport) is ``embedding_unavailable`` and goes through the
    job's retry policy; a refused key (401/403) is ``credential_invalid`` ("authentication
    failed"), a dimension change ``embedding_dimension_mismatch``, any other refusal (a 4xx, an
    error envelope: invalid model or parameters, an input the provider will not take)
    ``embedding_rejected``; the three are terminal and end the job at once. Anything else (the
    local model) stays the retryable ``embedding_failed``.
    """
    from knowledgefs.dify.errors import DifyError, EmbeddingDimensionMismatch

    if not isinstance(exc, DifyError):
        return CompilationFailure(
            "embedding_failed", f"{type(exc).__name__}: {exc}", retryable=True
        )
    if exc.retryable:
        return CompilationFailure("embedding_unavailable", str(exc), retryable=True)
    if exc.status in (401, 403):
        return CompilationFailure(
            "credential_invalid",
            f"authentication failed ({exc.status}): Dify refused the credentials of the "
            f"embedding model; fix them and retry the job ({exc.code})",
        )
    if isinstance(exc, EmbeddingDimensionMismatch):
        return CompilationFailure("embedding_dimension_mismatch", str(exc))
    return CompilationFailure("embedding_rejected", str(exc))


def is_input_refusal(exc: BaseException) -> bool:
    """May this embedding failure be the fault of one text of the batch (so the batch's other
    texts, and their documents, can still be embedded without it)? A terminal Dify refusal
    other than a refused key or a dimension change."""
    failure = embedding_failure(exc)
    return failure.code == "embedding_rejected"


def classify(exc: BaseException) -> CompilationFailure:
    """Map an unexpected exception to a :class:`CompilationFailure` with its retry class."""
    if isinstance(exc, CompilationFailure):
        return exc
    if isinstance(exc, ProjectionError):  # e.g. the Dify bridge: its code and retry class
        return CompilationFailure(exc.code, exc.message, retryable=exc.retryable)
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, TRANSIENT_ERRORS):
        return CompilationFailure("transient_error", text, retryable=True)
    return CompilationFailure("internal_error", text)
