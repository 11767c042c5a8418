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
