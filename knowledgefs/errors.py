"""Service errors and their JSON shape on the API.

Every error the API returns is ``{"code": <stable machine string>, "message": <human text>}``,
optionally with ``"details"``. Services raise :class:`ServiceError` subclasses; views never build
error bodies themselves.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import (
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

from knowledgefs.dify.errors import (
    DatasourceError,
    DifyError,
    EmbeddingDimensionMismatch,
    ModelRuntimeError,
    ObjectStorageError,
)

logger = logging.getLogger("knowledgefs.errors")


class ServiceError(Exception):
    """A failure with an HTTP status, a stable ``code`` and a message naming the limit or field."""

    status = 400
    code = "invalid_request"
    #: The answer run a failure ended (sent back as ``X-Query-Run-Id``), when one was started.
    trace_id: str | None = None

    def __init__(self, message: str, *, code: str | None = None, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        self.details = details

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details is not None:
            body["details"] = self.details
        return body


class InvalidInput(ServiceError):
    status = 400
    code = "invalid_request"


class Forbidden(ServiceError):
    status = 403
    code = "permission_denied"


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class Conflict(ServiceError):
    status = 409
    code = "conflict"


class PayloadTooLarge(ServiceError):
    status = 413
    code = "file_too_large"


class UnsupportedMediaType(ServiceError):
    status = 415
    code = "unsupported_media_type"


class LengthRequired(ServiceError):
    status = 411
    code = "length_required"


class Unavailable(ServiceError):
    status = 503
    code = "unavailable"


class RequestTimeout(ServiceError):
    """408: the request body did not arrive within a read deadline (``upload_timeout``)."""

    status = 408
    code = "upload_timeout"


class TooManyRequests(ServiceError):
    """429 with ``Retry-After`` (``retry_after`` seconds): try again later."""

    status = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.headers = {"Retry-After": str(max(1, int(retry_after)))}


_DRF_CODES = {
    drf_exceptions.NotAuthenticated: "not_authenticated",
    drf_exceptions.AuthenticationFailed: "authentication_failed",
    drf_exceptions.PermissionDenied: "permission_denied",
    drf_exceptions.NotFound: "not_found",
    drf_exceptions.MethodNotAllowed: "method_not_allowed",
    drf_exceptions.UnsupportedMediaType: "unsupported_media_type",
    drf_exceptions.ParseError: "malformed_request",
    drf_exceptions.Throttled: "rate_limited",
    drf_exceptions.NotAcceptable: "not_acceptable",
}


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler: every error becomes ``{"code", "message"[, "details"]}``."""
    if isinstance(exc, ServiceError):
        return Response(exc.as_dict(), status=exc.status, headers=getattr(exc, "headers", None))
    if isinstance(exc, DifyError):
        return dify_error_response(exc, context)
    if isinstance(exc, Http404):
        return Response({"code": "not_found", "message": "Not found."}, status=404)
    if isinstance(exc, drf_exceptions.ValidationError):
        details = exc.detail
        field, first = _first_error(details)
        message = f"{field}: {first}" if field else str(first)
        return Response(
            {"code": "invalid_request", "message": message, "details": details}, status=400
        )
    if isinstance(exc, drf_exceptions.APIException):
        code = next((c for k, c in _DRF_CODES.items() if isinstance(exc, k)), "error")
        # A specific code given where the exception was raised (``code="token_expired"``)
        # wins over the class's generic one.
        specific = getattr(exc.detail, "code", None)
        if isinstance(specific, str) and specific != exc.default_code:
            code = specific
        response = Response({"code": code, "message": str(exc.detail)}, status=exc.status_code)
        wait = getattr(exc, "wait", None)  # Throttled's, set in __init__ (no stub member)
        if isinstance(exc, drf_exceptions.Throttled) and wait is not None:
            response["Retry-After"] = str(max(1, int(wait)))
        auth_header = getattr(exc, "auth_header", None)
        if auth_header:
            response["WWW-Authenticate"] = auth_header
        if isinstance(exc, drf_exceptions.NotAuthenticated | drf_exceptions.AuthenticationFailed):
            response["WWW-Authenticate"] = 'Bearer realm="knowledgefs"'
        return response
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            {
                "code": "request_too_large",
                "message": f"request body exceeds the limit of {limit} bytes for non-file data",
            },
            status=413,
        )
    if isinstance(exc, TooManyFieldsSent | TooManyFilesSent):
        return Response({"code": "too_many_fields", "message": str(exc)}, status=400)
    if isinstance(exc, SuspiciousOperation):
        return Response({"code": "malformed_request", "message": str(exc)}, status=400)
    if isinstance(exc, DjangoValidationError):
        return Response({"code": "invalid_request", "message": " ".join(exc.messages)}, status=400)
    if isinstance(exc, RecursionError):
        return Response(
            {"code": "malformed_request", "message": "JSON is nested too deeply"}, status=400
        )
    logger.exception("unhandled API error", exc_info=exc)
    return Response(
        {"code": "internal_error", "message": "The server failed to handle the request."},
        status=500,
    )


#: ``Retry-After`` (seconds) on a 503 for a Dify call that may succeed when sent again.
DIFY_RETRY_AFTER_SECONDS = 5

#: Dify error surface → (code when a retry may succeed, code when it will not, what failed).
_DIFY_SURFACES: tuple[tuple[type[DifyError], str, str, str], ...] = (
    (ObjectStorageError, "storage_unavailable", "storage_error", "the object storage"),
    (ModelRuntimeError, "model_runtime_unavailable", "model_runtime_error", "the model runtime"),
    (DatasourceError, "datasource_unavailable", "datasource_error", "the datasource"),
    (DifyError, "upstream_unavailable", "upstream_error", "Dify"),
)

_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH"})


def dify_error_response(exc: DifyError, context: dict[str, Any] | None = None) -> Response:
    """The API answer for a failed call to Dify's inner API that reached a request.

    Never a 500: a retryable failure (timeout, connection, 408/409/425/429/5xx) is a 503 with
    ``Retry-After``, Dify's 413 on a write a 413, anything else a 502 (codes: docs/api.md).
    ``details.dify_code`` is the boundary's stable code (docs/dify-boundary.md). The message is
    ours: Dify's text, the route and the key stay in the log.
    """
    available, failed, what = next(
        (a, f, w) for cls, a, f, w in _DIFY_SURFACES if isinstance(exc, cls)
    )
    request = (context or {}).get("request")
    method = getattr(request, "method", "") or ""
    details = {"dify_code": exc.code, "retryable": exc.retryable}
    logger.warning(
        "Dify call failed in a request: %s (route %s, status %s, retryable %s)",
        exc.code,
        exc.route,
        exc.status,
        exc.retryable,
    )
    if exc.retryable:
        response = Response(
            {
                "code": available,
                "message": f"{what} is unavailable or did not answer in time; try again later",
                "details": details,
            },
            status=503,
        )
        response["Retry-After"] = str(DIFY_RETRY_AFTER_SECONDS)
        return response
    too_large = isinstance(exc, ObjectStorageError) and (
        exc.code == ObjectStorageError.CODES["too_large"]
    )
    if too_large and method in _WRITE_METHODS:
        # Our own check refuses before sending (no status) at the storage's known limit;
        # Dify's 413 does not say its limit.
        limit = None if exc.status else getattr(_objects(), "max_object_bytes", None)
        message = "the file is larger than the object storage accepts"
        message += f" (its limit is {limit} bytes)" if limit else " (Dify's storage size limit)"
        return Response(
            {
                "code": "file_too_large",
                "message": message + "; nothing is stored",
                "details": details,
            },
            status=413,
        )
    if isinstance(exc, EmbeddingDimensionMismatch):
        message = "the embedding model answered vectors of an unexpected dimension"
    elif exc.code == ObjectStorageError.CODES["checksum"]:
        message = "the object storage stored or returned bytes that do not match their SHA-256"
    else:
        message = f"{what} failed or answered something invalid ({exc.code})"
    return Response({"code": failed, "message": message, "details": details}, status=502)


def _objects() -> Any:
    from knowledgefs.storage import object_storage

    return object_storage()


def _first_error(details: Any, prefix: str = "") -> tuple[str, str]:
    if isinstance(details, dict):
        for key, value in details.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if key == "non_field_errors":
                name = prefix
            return _first_error(value, name)
    if isinstance(details, list) and details:
        return _first_error(details[0], prefix)
    return prefix, str(details)


def json_error(status: int, code: str, message: str) -> JsonResponse:
    """A plain Django JSON error response, for views outside DRF (404/500 handlers, probes)."""
    return JsonResponse({"code": code, "message": message}, status=status)


def handler400(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return json_error(400, "bad_request", str(exception) if exception else "Bad request.")


def handler403(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return json_error(403, "permission_denied", "Forbidden.")


def csrf_failure(request: HttpRequest, reason: str = "") -> JsonResponse:
    return json_error(403, "csrf_failed", f"CSRF verification failed: {reason}")


def handler404(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return json_error(404, "not_found", "Not found.")


def handler500(request: HttpRequest) -> JsonResponse:
    return json_error(500, "internal_error", "The server failed to handle the request.")
