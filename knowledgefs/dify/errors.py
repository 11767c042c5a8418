"""Typed errors of the Dify inner-API clients, each with a stable ``code`` and a ``retryable`` flag.

``retryable`` answers one question for the durable job layer: can a later attempt of the same
operation succeed without anyone changing anything? Timeouts, connection failures and the
statuses 408/409/425/429/5xx are retryable; a refused request, an invalid or oversized answer, an
error reported by the model or the datasource, a dimension or checksum mismatch are not.

Messages name the route, the status and the limit involved; they never carry the inner key, the
texts sent, or the body Dify answered (an error envelope's message is kept only after
:func:`knowledgefs.dify.redaction.sanitize_message`).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured


class DifyNotConfigured(ImproperlyConfigured):
    """``DIFY_INNER_API_URL`` or ``DIFY_INNER_API_KEY`` is missing or malformed."""


class DifyError(Exception):
    """A failed call to Dify's inner API.

    ``code`` is stable (documented in docs/dify-boundary.md), ``retryable`` says whether a later
    attempt may succeed, ``status`` is the HTTP status when Dify answered one, ``route`` the path
    called (no query string), ``bytes_read`` how many response-body bytes were read before the
    failure (``None`` when no body was read).
    """

    #: kind → code; each surface fills in its own codes.
    CODES: dict[str, str] = {}

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retryable: bool = False,
        status: int | None = None,
        route: str | None = None,
        bytes_read: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable
        self.status = status
        self.route = route
        self.bytes_read = bytes_read

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    @classmethod
    def of(cls, kind: str, message: str, **kwargs: Any) -> DifyError:
        """Build the error of this surface for ``kind`` (``timeout``, ``unavailable``,
        ``rejected``, ``too_large``, ``invalid``, ``error``, ``input``, ``not_found``...)."""
        return cls(cls.CODES[kind], message, **kwargs)

    @classmethod
    def for_status(cls, status: int, route: str) -> DifyError:
        """The error for an unexpected HTTP status (408/409/425/429/5xx retryable)."""
        if status == 408:
            return cls.of("timeout", f"{route} answered 408", retryable=True, status=status)
        if is_retryable_status(status):
            return cls.of(
                "unavailable", f"{route} answered {status}", retryable=True, status=status
            )
        if status in (401, 403):
            return cls.of(
                "rejected",
                f"{route} answered {status}: authentication failed ({status}), Dify refused "
                "the inner API key "
                "(DIFY_INNER_API_KEY must equal Dify's INNER_API_KEY_FOR_PLUGIN)",
                status=status,
            )
        return cls.of("rejected", f"{route} answered {status}", status=status)


RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})


def is_retryable_status(status: int) -> bool:
    """408, 409, 425, 429 and every 5xx: the request may succeed when sent again."""
    return status in RETRYABLE_STATUSES or status >= 500


class ModelRuntimeError(DifyError):
    """A model call (embedding, rerank, LLM, catalog) failed."""

    CODES = {
        "timeout": "MODEL_RUNTIME_TIMEOUT",
        "unavailable": "MODEL_RUNTIME_UNAVAILABLE",
        "rejected": "MODEL_RUNTIME_REQUEST_REJECTED",
        "too_large": "MODEL_RUNTIME_RESPONSE_TOO_LARGE",
        "invalid": "MODEL_RUNTIME_RESPONSE_INVALID",
        "error": "MODEL_RUNTIME_ERROR",
        "input": "MODEL_RUNTIME_INPUT_INVALID",
        "dimension": "EMBEDDING_DIMENSION_MISMATCH",
    }

    @classmethod
    def of(cls, kind: str, message: str, **kwargs: Any) -> DifyError:
        if kind == "dimension":
            return EmbeddingDimensionMismatch(cls.CODES[kind], message, **kwargs)
        return super().of(kind, message, **kwargs)


class EmbeddingDimensionMismatch(ModelRuntimeError):
    """Vectors of a dimension other than the expected one (or than an earlier batch's)."""


class ObjectStorageError(DifyError, OSError):
    """An object-storage call failed. Also an ``OSError``, so code written for a file system
    storage (``except OSError``) treats it as the I/O failure it is."""

    CODES = {
        "timeout": "STORAGE_TIMEOUT",
        "unavailable": "STORAGE_UNAVAILABLE",
        "rejected": "STORAGE_REQUEST_REJECTED",
        "too_large": "STORAGE_OBJECT_TOO_LARGE",
        "invalid": "STORAGE_RESPONSE_INVALID",
        "checksum": "STORAGE_CHECKSUM_MISMATCH",
        "not_found": "STORAGE_NOT_FOUND",
        "input": "STORAGE_INPUT_INVALID",
        "listing_too_large": "STORAGE_LISTING_TOO_LARGE",
    }

    @classmethod
    def of(cls, kind: str, message: str, **kwargs: Any) -> DifyError:
        if kind == "not_found":
            return StorageNotFound(cls.CODES[kind], message, **kwargs)
        return super().of(kind, message, **kwargs)

    @classmethod
    def for_status(cls, status: int, route: str) -> DifyError:
        if status == 404:
            return cls.of("not_found", f"{route}: no such object", status=status)
        if status == 413:
            return cls.of(
                "too_large", f"{route} answered 413: object over Dify's size limit", status=status
            )
        if status == 422:
            return cls.of(
                "checksum",
                f"{route} answered 422: the body does not match its SHA-256 checksum",
                status=status,
            )
        return super().for_status(status, route)


class StorageNotFound(ObjectStorageError, FileNotFoundError):
    """No object under this key (also a ``FileNotFoundError``, like a file system storage)."""


class DatasourceError(DifyError):
    """A datasource call (credential validation, browsing) failed."""

    CODES = {
        "timeout": "DATASOURCE_TIMEOUT",
        "unavailable": "DATASOURCE_UNAVAILABLE",
        "rejected": "DATASOURCE_REQUEST_REJECTED",
        "too_large": "DATASOURCE_RESPONSE_TOO_LARGE",
        "invalid": "DATASOURCE_RESPONSE_INVALID",
        "error": "DATASOURCE_ERROR",
        "input": "DATASOURCE_INPUT_INVALID",
    }


# --- the vector and text bridge (inventory 7.2-7.3) -------------------------------------------


class _BridgeError(DifyError):
    """A call to one of Dify's bridge routes failed; 413 is the vector-space quota (terminal),
    503 (with ``Retry-After`` while Dify provisions the tenant's store) and the other
    408/409/425/429/5xx are retryable, 400 is a request Dify refused."""

    @classmethod
    def for_status(cls, status: int, route: str) -> DifyError:
        if status == 413:
            return cls.of(
                "quota",
                f"{route} answered 413: the tenant's vector-space quota is exhausted",
                status=status,
            )
        if status == 400:
            return cls.of(
                "rejected", f"{route} answered 400: Dify refused the operation", status=status
            )
        return super().for_status(status, route)


class VectorStoreError(_BridgeError):
    """A call to ``POST /inner/api/knowledge-fs/vectors`` failed."""

    CODES = {
        "timeout": "VECTOR_STORE_TIMEOUT",
        "unavailable": "VECTOR_STORE_UNAVAILABLE",
        "rejected": "VECTOR_STORE_REQUEST_REJECTED",
        "too_large": "VECTOR_STORE_RESPONSE_TOO_LARGE",
        "invalid": "VECTOR_STORE_RESPONSE_INVALID",
        "input": "VECTOR_STORE_INPUT_INVALID",
        "quota": "VECTOR_SPACE_QUOTA_EXCEEDED",
    }


class TextStoreError(_BridgeError):
    """A call to ``POST /inner/api/knowledge-fs/texts`` failed."""

    CODES = {
        "timeout": "TEXT_STORE_TIMEOUT",
        "unavailable": "TEXT_STORE_UNAVAILABLE",
        "rejected": "TEXT_STORE_REQUEST_REJECTED",
        "too_large": "TEXT_STORE_RESPONSE_TOO_LARGE",
        "invalid": "TEXT_STORE_RESPONSE_INVALID",
        "input": "TEXT_STORE_INPUT_INVALID",
        "quota": "VECTOR_SPACE_QUOTA_EXCEEDED",
    }
