"""The HTTP client of the Unstructured-compatible parser: one bounded, lane-limited POST.

``POST {UNSTRUCTURED_API_URL}/general/v0/general`` with the document as the multipart field
``files`` (sent under a name whose extension matches the sniffed type) and the form fields
``strategy`` (``UNSTRUCTURED_STRATEGY``), ``coordinates=false`` and
``output_format=application/json``; header ``unstructured-api-key`` when
``UNSTRUCTURED_API_KEY`` is set. Redirects are not followed and no proxy variable applies.

Limits (seed deployment guide, through settings; :mod:`ingestion.unstructured.limits`):

* admission before any request: input cap, ZIP central-directory inspection, heavy lane;
* one total deadline per call - 600 s, or 2,400 s for heavy documents - covering connect, the
  upload, waiting for the answer, every retry and the whole response body: the shared watchdog
  of :mod:`knowledgefs.http_deadline` shuts the socket down when it passes;
* the response body is read in pieces and never past ``UNSTRUCTURED_MAX_RESPONSE_BYTES`` (a
  larger ``Content-Length`` is refused before reading); JSON is parsed only after the cap held.

Failures (:mod:`ingestion.unstructured.errors`): a transport timeout is terminal
(``parser_timeout``: the parser may still be working, inspect it and retry manually); a refused
or unresolvable connection is ``parser_unavailable`` (retryable later, never inline); a
connection lost after the document was sent is ``parser_connection_lost`` (terminal, like a
timeout); 429/502/503/504 are retried inline up to ``UNSTRUCTURED_MAX_RETRIES`` times
(``Retry-After`` honoured when it fits the deadline) and end as ``parser_unavailable``; another
4xx is ``parser_rejected`` and another 5xx ``parser_failed``, both naming the status; a body
that is not a JSON list of elements is ``parser_invalid_response``.

Logs (logger ``knowledgefs.unstructured``): lane, status, duration, bytes sent and received,
error code. Never the key or document content.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from email.utils import parsedate_to_datetime
from typing import Any

import requests
import urllib3

from ingestion.parsing.base import ParseReport
from ingestion.parsing.errors import EmptyDocument, UnsupportedType
from knowledgefs.dify.redaction import sanitize_message
from knowledgefs.http_deadline import Deadline, Guard, current, exception_cause
from knowledgefs.http_session import ProcessSession

from .elements import to_report
from .errors import (
    ParserConnectionLost,
    ParserFailed,
    ParserInvalidResponse,
    ParserRejected,
    ParserResponseTooLarge,
    ParserTimeout,
    ParserUnavailable,
    UnstructuredError,
)
from .limits import ROUTED, Limits, admit, lanes, normalize

logger = logging.getLogger("knowledgefs.unstructured")

ENDPOINT = "/general/v0/general"
#: Statuses that say "try again later" explicitly; the only ones retried inline.
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
#: Connect timeout, cut to what is left of the deadline.
CONNECT_TIMEOUT_S = 10.0
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 30.0
CHUNK_BYTES = 64 * 1024
#: At most this much of an error answer is read for its ``detail``.
ERROR_BODY_BYTES = 16 * 1024

_SESSION = ProcessSession(pool_connections=2, pool_maxsize=64)


def session() -> requests.Session:
    """The process's pooled session for the parser (guarded pools, no cookies, no proxies)."""
    return _SESSION.get()


def parse_remote(data: bytes, mime_type: str, filename: str) -> ParseReport:
    """Parse ``data`` with the remote parser and map its elements.

    Args:
        data: the whole document.
        mime_type: its sniffed MIME type; must satisfy :func:`ingestion.unstructured.routes`.
        filename: the upload's name (only its stem is sent, with the type's extension).

    Returns:
        :class:`~ingestion.parsing.ParseReport` with ``parser="unstructured"``.

    Raises:
        ParserNotConfigured: ``UNSTRUCTURED_API_URL`` is not set.
        UnsupportedType: a type that is not routed to the parser.
        EmptyDocument: ``data`` is empty.
        ParserInputTooLarge, ArchiveRejected, CorruptDocument: refused before any request.
        ParserTimeout, ParserUnavailable, ParserConnectionLost, ParserRejected, ParserFailed,
        ParserResponseTooLarge, ParserInvalidResponse, ParserEmptyOutput: see the module doc.
    """
    limits = Limits.from_settings()
    base_url = limits.require_url()
    mime = normalize(mime_type)
    if mime not in ROUTED:
        raise UnsupportedType(mime, f"{mime!r} is not sent to the remote parser")
    if not data:
        raise EmptyDocument()
    heavy = admit(data, mime, limits)
    name = upload_name(filename, mime)
    timeout = limits.heavy_timeout_s if heavy else limits.timeout_s
    with lanes(limits).slot(heavy):
        items = _post(base_url + ENDPOINT, data, mime, name, limits, timeout, heavy)
    return to_report(items, mime_type=mime, filename=name)


_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f\"\\/]+")


def upload_name(filename: str, mime_type: str) -> str:
    """The name the document is sent under: the upload's base name without its extension,
    control characters and quotes removed, cut at 120 characters, plus the extension of its
    sniffed type (``"scan.bin"`` sniffed as PDF -> ``"scan.pdf"``)."""
    base = re.split(r"[\\/]", filename or "")[-1]
    stem = base.rsplit(".", 1)[0] if "." in base else base
    stem = _UNSAFE_NAME.sub("", stem).strip()[:120] or "document"
    return stem + ROUTED.get(normalize(mime_type), "")


# --- the call ---------------------------------------------------------------------------------


class _Retry(Exception):
    """A retryable status: ``error`` to raise when no retry is left."""

    def __init__(self, error: UnstructuredError, retry_after: float | None) -> None:
        super().__init__(error.code)
        self.error = error
        self.retry_after = retry_after


def _post(
    url: str, data: bytes, mime: str, name: str, limits: Limits, timeout: float, heavy: bool
) -> Any:
    deadline = Deadline(timeout)
    attempt = 0
    while True:
        attempt += 1
        started = time.monotonic()
        try:
            items = _attempt(url, data, mime, name, limits, deadline)
        except _Retry as exc:
            _log(heavy, attempt, started, len(data), exc.error)
            delay = _retry_delay(exc.retry_after, attempt, limits.max_retries, deadline)
            if delay is None:
                raise exc.error from None
            logger.info("unstructured retry=%d in %.2f s after %s", attempt, delay, exc.error.code)
            time.sleep(delay)
            continue
        except UnstructuredError as exc:
            _log(heavy, attempt, started, len(data), exc)
            raise
        _log(heavy, attempt, started, len(data), None)
        return items


def _log(heavy: bool, attempt: int, started: float, sent: int, error: Any) -> None:
    logger.info(
        "unstructured POST %s lane=%s attempt=%d ms=%.0f sent=%d%s",
        ENDPOINT,
        "heavy" if heavy else "standard",
        attempt,
        (time.monotonic() - started) * 1000,
        sent,
        f" error={error.code}" if error is not None else "",
    )


def _retry_delay(
    retry_after: float | None, attempt: int, max_retries: int, deadline: Deadline
) -> float | None:
    """Seconds to wait before the next attempt, or ``None``: no retry left, or the wait (the
    ``Retry-After`` of the answer, else exponential backoff with jitter) would not leave time
    for another attempt within the deadline."""
    if attempt > max_retries:
        return None
    if retry_after is not None:
        delay = max(0.0, retry_after)
    else:
        delay = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (attempt - 1)) * random.uniform(0.5, 1)
    if deadline.remaining() - delay < min(1.0, deadline.seconds / 10):
        return None
    return delay


def _attempt(
    url: str, data: bytes, mime: str, name: str, limits: Limits, deadline: Deadline
) -> Any:
    remaining = deadline.remaining()
    if remaining <= 0:
        raise _timeout(deadline, "before the request was sent")
    headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
    headers["User-Agent"] = "knowledgefs"
    if limits.api_key:
        headers["unstructured-api-key"] = limits.api_key
    form = {
        "strategy": limits.strategy,
        "coordinates": "false",
        "output_format": "application/json",
    }
    guard = Guard(deadline)
    current.guard = guard
    try:
        response = session().post(
            url,
            files={"files": (name, data, mime)},
            data=form,
            headers=headers,
            timeout=(min(CONNECT_TIMEOUT_S, remaining), remaining),
            stream=True,
            allow_redirects=False,
        )
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        raise _transport_error(exc, guard, deadline) from None
    finally:
        current.guard = None
    try:
        return _answer(response, limits, deadline, guard)
    finally:
        response.close()


def _transport_error(exc: BaseException, guard: Guard, deadline: Deadline) -> UnstructuredError:
    cause = exception_cause(exc)
    if guard.timed_out or deadline.expired() or isinstance(exc, requests.exceptions.ReadTimeout):
        return _timeout(deadline, f"({cause})")
    if _never_sent(exc):
        return ParserUnavailable(
            f"the remote parser at UNSTRUCTURED_API_URL is unreachable ({cause}); "
            "the document was not sent"
        )
    return ParserConnectionLost(
        f"the connection to the remote parser broke after the document was sent ({cause}); "
        "it may still be working on it: inspect the parser and retry manually once it is idle"
    )


def _never_sent(exc: BaseException) -> bool:
    """Whether the failure happened while connecting (refused, unresolvable, connect timeout),
    so the parser never saw the document."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return True
    seen: set[int] = set()
    stack: list[Any] = [exc]
    while stack:
        current_exc = stack.pop()
        if current_exc is None or id(current_exc) in seen:
            continue
        seen.add(id(current_exc))
        if isinstance(
            current_exc,
            urllib3.exceptions.NewConnectionError
            | urllib3.exceptions.ConnectTimeoutError
            | ConnectionRefusedError,
        ):
            return True
        if isinstance(current_exc, BaseException):
            stack.extend(a for a in current_exc.args if isinstance(a, BaseException))
            stack.extend([getattr(current_exc, "reason", None), current_exc.__cause__])
            stack.append(current_exc.__context__)
    return False


def _timeout(deadline: Deadline, detail: str) -> ParserTimeout:
    return ParserTimeout(
        f"the remote parser did not answer completely within {deadline.seconds:g} s {detail}; "
        "it may still be working on the document: inspect the parser and retry manually once "
        "it is idle"
    )


def _answer(response: requests.Response, limits: Limits, deadline: Deadline, guard: Guard) -> Any:
    status = response.status_code
    if status != 200:
        _raise_for_status(response, limits, deadline, guard)
    body = _read(response, limits.max_response_bytes, deadline, guard)
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise ParserInvalidResponse(
            f"the remote parser's answer is not JSON ({len(body)} bytes)"
        ) from None


def _raise_for_status(
    response: requests.Response, limits: Limits, deadline: Deadline, guard: Guard
) -> None:
    status = response.status_code
    reason = f"HTTP {status}" + (f" {response.reason}" if response.reason else "")
    detail = _detail(response, limits, deadline, guard)
    suffix = f": {detail}" if detail else ""
    if status in RETRYABLE_STATUSES:
        error: UnstructuredError = ParserUnavailable(f"the remote parser answered {reason}{suffix}")
        raise _Retry(error, _retry_after(response))
    if 400 <= status < 500:
        hint = (
            f": authentication failed ({status}), check UNSTRUCTURED_API_KEY"
            if status in (401, 403)
            else ""
        )
        raise ParserRejected(
            f"the remote parser refused the document with {reason}{hint}{suffix}", status=status
        )
    if status >= 500:
        raise ParserFailed(f"the remote parser failed with {reason}{suffix}", status=status)
    raise ParserInvalidResponse(f"the remote parser answered the unexpected status {reason}")


def _detail(response: requests.Response, limits: Limits, deadline: Deadline, guard: Guard) -> str:
    """The sanitized ``detail`` of an error answer (``{"detail": "..."}``), or ``""``."""
    try:
        body = _read(response, ERROR_BODY_BYTES, deadline, guard)
        value = json.loads(body)
    except (UnstructuredError, ValueError, RecursionError):
        return ""
    detail = value.get("detail") if isinstance(value, dict) else None
    if not isinstance(detail, str):
        return ""
    return sanitize_message(detail, secrets=(limits.api_key,))


def _retry_after(response: requests.Response) -> float | None:
    value = response.headers.get("Retry-After", "").strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time()) if when.tzinfo is not None else None


def _read(response: requests.Response, cap: int, deadline: Deadline, guard: Guard) -> bytes:
    """The body, read in pieces under ``cap`` bytes and the call's deadline."""
    declared = response.headers.get("Content-Length", "").strip()
    if declared.isdigit() and int(declared) > cap:
        raise _too_large(f"declares {int(declared)} bytes", cap)
    chunks: list[bytes] = []
    received = 0
    while True:
        try:
            chunk = response.raw.read1(min(CHUNK_BYTES, cap - received + 1), decode_content=True)
        except (urllib3.exceptions.HTTPError, requests.RequestException, OSError) as exc:
            if guard.timed_out or deadline.expired():
                raise _timeout(deadline, f"({received} bytes of the answer read)") from None
            raise ParserConnectionLost(
                f"the connection to the remote parser broke after {received} bytes of its "
                f"answer ({exception_cause(exc)}); inspect the parser and retry manually"
            ) from None
        if guard.timed_out or deadline.expired():
            raise _timeout(deadline, f"({received} bytes of the answer read)")
        if not chunk:
            return b"".join(chunks)
        received += len(chunk)
        if received > cap:
            raise _too_large(f"sent more than {cap} bytes", cap)
        chunks.append(chunk)


def _too_large(detail: str, cap: int) -> ParserResponseTooLarge:
    return ParserResponseTooLarge(
        f"the remote parser's answer {detail}, over the limit of {cap} bytes "
        "(UNSTRUCTURED_MAX_RESPONSE_BYTES)"
    )
