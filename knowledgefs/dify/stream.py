"""A Dify response body read in pieces, never past its cap, bounded by the call's deadline.

Bodies are read in pieces (:data:`CHUNK_BYTES`) and never past their cap (``max_bytes``; a larger
``Content-Length`` is refused before reading). The deadline is carried by the guarded connection
(:mod:`knowledgefs.http_deadline`) or, on a session without the guarded adapter, by a body-only
watchdog. Closing logs one DEBUG line (logger ``knowledgefs.dify``): method, route, status,
duration, bytes sent and received, attempt, error code; never a body.
"""

from __future__ import annotations

import http.client
import logging
import time
from collections.abc import Iterator

import requests
import urllib3

from knowledgefs.http_deadline import Deadline, arm_alarm
from knowledgefs.http_deadline import Guard as _Guard
from knowledgefs.http_deadline import exception_cause as _cause
from knowledgefs.http_deadline import shutdown_socket as _shutdown

from .errors import DifyError

logger = logging.getLogger("knowledgefs.dify")

CHUNK_BYTES = 64 * 1024

_READ_ERRORS = (
    urllib3.exceptions.HTTPError,
    requests.RequestException,
    http.client.HTTPException,
    OSError,
)


class ResponseStream:
    """A response body read in pieces, never past ``max_bytes``, bounded by the deadline.

    :meth:`read` returns up to ``amt`` bytes as soon as they arrive (``b""`` at the end) and
    raises the surface's typed error: ``too_large`` past the cap (``bytes_read`` says how many
    were read, at most ``max_bytes + 1``), ``timeout`` when the deadline passed, ``unavailable``
    (retryable) when the connection broke. Closing releases the connection (or drops it when
    the body was not read to its end) and stops the watchdog.
    """

    def __init__(
        self,
        response: requests.Response,
        *,
        errors: type[DifyError],
        route: str,
        method: str,
        deadline: Deadline,
        max_bytes: int,
        started: float,
        sent: int,
        attempt: int,
        guard: _Guard | None = None,
    ) -> None:
        self.status = response.status_code
        self.headers = response.headers
        self.bytes_read = 0
        self._response = response
        self._errors = errors
        self._route = route
        self._method = method
        self._deadline = deadline
        self._max_bytes = max_bytes
        self._started = started
        self._sent = sent
        self._attempt = attempt
        self._guard = guard
        self._timed_out = False
        self._eof = False
        self._closed = False
        self._failure: str | None = None
        declared = _content_length(response)
        if declared is not None and declared > max_bytes:
            self._alarm = None
            self._raise("too_large", f"declares {declared} bytes, over the limit of {max_bytes}")
        # A guarded connection already carries the deadline (armed before the request was
        # sent); a session without the guarded adapter gets the body-only watchdog.
        self._alarm = None if guard is not None else arm_alarm(deadline.at, self._abort)

    @property
    def content_length(self) -> int | None:
        return _content_length(self._response)

    def _abort(self) -> None:
        self._timed_out = True
        connection = getattr(self._response.raw, "_connection", None)
        _shutdown(getattr(connection, "sock", None))

    def _expired(self) -> bool:
        return (
            self._timed_out
            or (self._guard is not None and self._guard.timed_out)
            or self._deadline.expired()
        )

    def _raise(self, kind: str, detail: str, *, retryable: bool = False) -> None:
        error = self._errors.of(
            kind,
            f"{self._method} {self._route}: {detail}",
            retryable=retryable,
            status=self.status,
            route=self._route,
            bytes_read=self.bytes_read,
        )
        self._failure = error.code
        self.close()
        raise error

    def _raise_timeout(self) -> None:
        self._raise(
            "timeout",
            f"not complete within {self._deadline.seconds:g} s ({self.bytes_read} bytes read)",
            retryable=True,
        )

    def read(self, amt: int = CHUNK_BYTES) -> bytes:
        if self._closed or self._eof:
            return b""
        allowance = self._max_bytes - self.bytes_read + 1
        try:
            data: bytes = self._response.raw.read1(min(amt, allowance))
        except _READ_ERRORS as exc:
            if self._expired():
                self._raise_timeout()
            self._raise(
                "unavailable",
                f"connection broke after {self.bytes_read} bytes ({_cause(exc)})",
                retryable=True,
            )
        if self._expired():
            self._raise_timeout()
        if not data:
            self._eof = True
            self.close()
            return b""
        self.bytes_read += len(data)
        if self.bytes_read > self._max_bytes:
            self._raise("too_large", f"body over the limit of {self._max_bytes} bytes")
        return data

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self.read():
            yield chunk

    def read_all(self) -> bytes:
        return b"".join(self)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._alarm is not None:
            self._alarm.cancel()
        self._response.close()
        logger.debug(
            "dify %s %s status=%s ms=%.1f sent=%d received=%d attempt=%d%s%s",
            self._method,
            self._route,
            self.status,
            (time.monotonic() - self._started) * 1000,
            self._sent,
            self.bytes_read,
            self._attempt,
            "" if self._eof else " incomplete",
            f" error={self._failure}" if self._failure else "",
        )

    def __enter__(self) -> ResponseStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _content_length(response: requests.Response) -> int | None:
    value = response.headers.get("Content-Length")
    if value is None or not value.strip().isdigit():
        return None
    return int(value)
