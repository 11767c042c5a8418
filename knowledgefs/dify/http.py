"""The transport every Dify inner-API client shares.

One pooled ``requests.Session`` per process (re-created after a fork), used by every thread; the
inner key travels in ``X-Inner-Api-Key`` on each request (never stored on the session), with
redirects off so it is never sent to another host, and ``trust_env`` off so no proxy variable
or ``.netrc`` entry changes where it goes.

Every call has one deadline (its ``timeout``) covering connect, send, headers and body: the
connect timeout and the read timeout are cut to what is left of it, and the session's pools
(:class:`GuardedAdapter`) arm a shared watchdog thread on the connection a call checks out,
before the request is sent (both in :mod:`knowledgefs.http_deadline`), which shuts the socket
down when the deadline passes, so a server that trickles bytes (headers, an upload it reads
slowly, a body) cannot hold a caller past it.
Bodies are read in pieces and never past their cap (``max_bytes``; a larger ``Content-Length`` is
refused before reading); JSON is parsed only after the cap held.

Retries: a call marked ``idempotent`` is sent again after a connection failure (before or while
its body was read) or a 408/409/425/429/5xx answer, at most ``max_retries`` times, with
exponential backoff and jitter (``Retry-After`` honoured up to 5 s), and only while the deadline
leaves time. A timeout is never retried inline: it spent the deadline. Streams
(:meth:`DifyTransport.open_stream`) are retried only until their body starts.

Logs (logger ``knowledgefs.dify``, DEBUG per attempt, INFO per retry): method, route (no query
string), status, duration, bytes sent and received, error code. Never the key, a body, or a
message from Dify.
"""

from __future__ import annotations

import http.client
import http.cookiejar
import json
import logging
import os
import random
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import requests
import urllib3
import urllib3.connection
from django.conf import settings

from knowledgefs.http_deadline import Deadline, GuardedAdapter, arm_alarm
from knowledgefs.http_deadline import Guard as _Guard
from knowledgefs.http_deadline import current as _local
from knowledgefs.http_deadline import exception_cause as _cause
from knowledgefs.http_deadline import is_guarded as _guarded
from knowledgefs.http_deadline import shutdown_socket as _shutdown

from . import config
from .errors import DifyError, DifyNotConfigured

_T = TypeVar("_T")
logger = logging.getLogger("knowledgefs.dify")

CHUNK_BYTES = 64 * 1024

# --- one session per process ------------------------------------------------------------------

_session_lock = threading.Lock()
_session: requests.Session | None = None


def shared_session() -> requests.Session:
    """The process's pooled session (``POOL_SIZE`` connections per host, no urllib3 retries)."""
    global _session
    session = _session
    if session is None:
        with _session_lock:
            session = _session
            if session is None:
                session = requests.Session()
                session.trust_env = False
                # Shared by every thread: it must hold no state, so cookies are never kept.
                session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
                adapter = GuardedAdapter(
                    pool_connections=4, pool_maxsize=config.POOL_SIZE, max_retries=0
                )
                session.mount("http://", adapter)
                session.mount("https://", adapter)
                _session = session
    return session


def _after_fork() -> None:
    global _session, _session_lock
    _session_lock = threading.Lock()
    _session = None


os.register_at_fork(after_in_child=_after_fork)


# --- messages ---------------------------------------------------------------------------------

_REDACT = [
    re.compile(r"(?i)\bbearer\s+\S+"),
    re.compile(
        r"(?i)\b(api[_-]?key|access[_-]?token|refresh[_-]?token|secret|password|passwd|"
        r"authorization|credentials?|token)\b\s*[:=]\s*(\"[^\"]*\"|'[^']*'|[^\s,;]+)"
    ),
    re.compile(r"\b(sk|pk|rk|ghp|gho|xox[abpr]|AKIA)[-_A-Za-z0-9]{8,}"),
    re.compile(r"://[^/\s:@]+:[^/\s@]*@"),
    re.compile(r"[A-Za-z0-9+/=_-]{32,}"),
]
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
MESSAGE_MAX_CHARS = 240
#: Only this much of a message from Dify is looked at (the rest could never be shown).
MESSAGE_SCAN_CHARS = 2000
#: Any span of the message this long that occurs in one of the inputs is an echo of it.
INPUT_SPAN_CHARS = 20


def _redact_input_spans(text: str, inputs: Sequence[str]) -> str:
    """Replace every run of ``text`` covered by a span of :data:`INPUT_SPAN_CHARS` characters
    that occurs anywhere in an input by ``[input]`` (cost: one pass over each input)."""
    width = INPUT_SPAN_CHARS
    if len(text) < width:
        return text
    windows: dict[str, list[int]] = {}
    for i in range(len(text) - width + 1):
        windows.setdefault(text[i : i + width], []).append(i)
    covered = bytearray(len(text))
    found = 0
    for value in inputs:
        if not isinstance(value, str) or len(value) < width:
            continue
        for j in range(len(value) - width + 1):
            positions = windows.pop(value[j : j + width], None)
            if positions:
                found += 1
                for i in positions:
                    covered[i : i + width] = b"\x01" * width
        if not windows:
            break
    if not found:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        if covered[i]:
            while i < len(text) and covered[i]:
                i += 1
            out.append("[input]")
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def sanitize_message(text: str, *, secrets: Sequence[str] = (), inputs: Sequence[str] = ()) -> str:
    """A message from Dify made safe to keep in an error: secrets (the inner key, credentials,
    bearer tokens, ``key=value`` secrets, long opaque tokens) become ``[redacted]``, any echo
    of the request's own texts (a whole text of 12 characters or more, or any part of one of
    20 characters or more, wherever it starts) becomes ``[input]``, control characters become
    spaces, and the result is cut at 240 characters."""
    if len(text) > MESSAGE_SCAN_CHARS:
        # Cut before looking; the last span's worth is dropped too, so that an echo cut by
        # the limit cannot slip through as a piece shorter than a span.
        text = text[: MESSAGE_SCAN_CHARS - INPUT_SPAN_CHARS] + "…"
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    for value in inputs:
        if isinstance(value, str) and len(value) >= 12:
            text = text.replace(value, "[input]")
    text = _redact_input_spans(text, inputs)
    for pattern in _REDACT:
        text = pattern.sub("[redacted]", text)
    text = _CONTROL.sub(" ", text).strip()
    if len(text) > MESSAGE_MAX_CHARS:
        text = text[: MESSAGE_MAX_CHARS - 1] + "…"
    return text


# --- bodies -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """A complete answer: status, headers and the body read under its cap."""

    status: int
    headers: Mapping[str, str]
    body: bytes


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
            data = self._response.raw.read1(min(amt, allowance))
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


# --- the transport ----------------------------------------------------------------------------

Body = bytes | Callable[[], Any] | None


class DifyTransport:
    """Authenticated, bounded, retrying HTTP calls to Dify's inner API.

    ``base_url`` and ``api_key`` default to ``settings.DIFY_INNER_API_URL`` and
    ``settings.DIFY_INNER_API_KEY``; either missing raises :class:`DifyNotConfigured`.
    ``max_retries`` (2), ``backoff_base`` (0.2 s) and ``backoff_max`` (2 s) shape inline retries;
    ``connect_timeout`` (5 s) is cut to the call's deadline.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        session: requests.Session | None = None,
        connect_timeout: float = config.CONNECT_TIMEOUT_S,
        max_retries: int = config.MAX_RETRIES,
        backoff_base: float = config.BACKOFF_BASE_S,
        backoff_max: float = config.BACKOFF_MAX_S,
    ) -> None:
        if base_url is None:
            base_url = getattr(settings, "DIFY_INNER_API_URL", "")
        if api_key is None:
            api_key = getattr(settings, "DIFY_INNER_API_KEY", "")
        if not base_url:
            raise DifyNotConfigured("DIFY_INNER_API_URL is not set")
        if not api_key or not api_key.strip():
            raise DifyNotConfigured("DIFY_INNER_API_KEY is not set")
        self.base_url = config.parse_inner_api_url(base_url)
        self._api_key = api_key.strip()
        self._session = session
        self.connect_timeout = connect_timeout
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max

    def __repr__(self) -> str:  # never shows the key
        return f"DifyTransport({self.base_url!r})"

    @property
    def secrets(self) -> tuple[str, ...]:
        """Strings that must never appear in a message (for :func:`sanitize_message`)."""
        return (self._api_key,)

    @property
    def session(self) -> requests.Session:
        return self._session or shared_session()

    # -- public calls --------------------------------------------------------------------------

    def request(
        self,
        method: str,
        route: str,
        *,
        errors: type[DifyError],
        timeout: float,
        max_bytes: int,
        idempotent: bool,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        body: Body = None,
        body_size: int | None = None,
        headers: Mapping[str, str] | None = None,
        expect: Sequence[int] = (200,),
        passthrough: Sequence[int] = (),
    ) -> Reply:
        """Send, read the whole body under ``max_bytes``, return :class:`Reply`.

        ``expect`` statuses are read; ``passthrough`` statuses (``404`` for "missing") return
        with an empty body; any other status raises ``errors.for_status``. ``body`` may be a
        callable returning a fresh body per attempt (a rewound file). ``timeout`` (seconds)
        bounds the whole call, retries and backoff included.
        """
        deadline = Deadline(timeout)

        def send(attempt: int) -> Reply:
            stream = self._attempt(
                method,
                route,
                errors=errors,
                deadline=deadline,
                max_bytes=max_bytes,
                params=params,
                json_body=json_body,
                body=body,
                body_size=body_size,
                headers=headers,
                expect=expect,
                passthrough=passthrough,
                attempt=attempt,
            )
            if stream.status in passthrough:
                stream.close()
                return Reply(stream.status, stream.headers, b"")
            return Reply(stream.status, stream.headers, stream.read_all())

        return self._retrying(method, route, deadline, idempotent, send)

    def open_stream(
        self,
        method: str,
        route: str,
        *,
        errors: type[DifyError],
        timeout: float,
        max_bytes: int,
        retry_until_body: bool,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
        expect: Sequence[int] = (200,),
        passthrough: Sequence[int] = (),
    ) -> ResponseStream:
        """Send and return the open :class:`ResponseStream` once an ``expect`` or
        ``passthrough`` status arrived. With ``retry_until_body`` a connection failure or a
        retryable status before that point is retried like :meth:`request`; nothing is retried
        once the caller reads the body. ``timeout`` bounds everything, the body included.
        """
        deadline = Deadline(timeout)

        def send(attempt: int) -> ResponseStream:
            return self._attempt(
                method,
                route,
                errors=errors,
                deadline=deadline,
                max_bytes=max_bytes,
                params=params,
                json_body=json_body,
                body=None,
                body_size=None,
                headers=headers,
                expect=expect,
                passthrough=passthrough,
                attempt=attempt,
            )

        return self._retrying(method, route, deadline, retry_until_body, send)

    # -- internals -----------------------------------------------------------------------------

    def _retrying(
        self,
        method: str,
        route: str,
        deadline: Deadline,
        allowed: bool,
        send: Callable[[int], _T],
    ) -> _T:
        """Call ``send(attempt)`` until it returns, retrying a :class:`DifyError` while
        :meth:`_retry_delay` allows (``allowed``: the call may be sent again) and the deadline
        leaves time; the last error is raised."""
        attempt = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            try:
                return send(attempt)
            except _StatusError as exc:
                error, retry_after = exc.error, exc.retry_after
            except DifyError as exc:
                error = exc
            delay = self._retry_delay(error, attempt, allowed, deadline, retry_after)
            if delay is None:
                raise error
            logger.info(
                "dify %s %s retry=%d in %.2f s after %s", method, route, attempt, delay, error.code
            )
            time.sleep(delay)

    def _retry_delay(
        self,
        error: DifyError,
        attempt: int,
        allowed: bool,
        deadline: Deadline,
        retry_after: float | None,
    ) -> float | None:
        if not (allowed and error.retryable) or attempt > self.max_retries:
            return None
        delay = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
        delay *= random.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, min(retry_after, config.RETRY_AFTER_MAX_S))
        # Keep time for the next attempt itself; otherwise give up with this error.
        if deadline.remaining() - delay < min(0.05, deadline.seconds / 10):
            return None
        return delay

    def _attempt(
        self,
        method: str,
        route: str,
        *,
        errors: type[DifyError],
        deadline: Deadline,
        max_bytes: int,
        params: Mapping[str, Any] | None,
        json_body: Any,
        body: Body,
        body_size: int | None,
        headers: Mapping[str, str] | None,
        expect: Sequence[int],
        passthrough: Sequence[int],
        attempt: int,
    ) -> ResponseStream:
        started = time.monotonic()
        remaining = deadline.remaining()
        if remaining <= 0:
            raise errors.of(
                "timeout",
                f"{method} {route}: no time left of {deadline.seconds:g} s",
                retryable=True,
                route=route,
            )
        all_headers = {
            "X-Inner-Api-Key": self._api_key,
            "Accept-Encoding": "identity",
            "User-Agent": "knowledgefs",
        }
        if headers:
            all_headers.update(headers)
        data: Any = None
        sent = 0
        if json_body is not None:
            data = json.dumps(json_body, ensure_ascii=False, separators=(",", ":")).encode()
            all_headers["Content-Type"] = "application/json"
            sent = len(data)
        elif body is not None:
            data = body() if callable(body) else body
            sent = body_size if body_size is not None else len(data)
        session = self.session
        # The whole attempt (connect, request and body sent, headers, body read) is bounded by
        # the deadline: the pool arms it on the connection this thread checks out.
        guard = _Guard(deadline) if _guarded(session) else None
        _local.guard = guard
        try:
            response = session.request(
                method,
                self.base_url + route,
                params=params,
                data=data,
                headers=all_headers,
                timeout=(min(self.connect_timeout, remaining), remaining),
                stream=True,
                allow_redirects=False,
            )
        except requests.exceptions.ConnectTimeout as exc:
            kind = "timeout" if guard is not None and guard.timed_out else "unavailable"
            raise self._failed(errors, kind, method, route, started, attempt, exc) from None
        except requests.exceptions.ReadTimeout:
            error = errors.of(
                "timeout",
                f"{method} {route}: no answer within {deadline.seconds:g} s",
                retryable=True,
                route=route,
            )
            self._log_failure(method, route, started, attempt, error)
            raise error from None
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            timed_out = deadline.expired() or (guard is not None and guard.timed_out)
            kind = "timeout" if timed_out else "unavailable"
            raise self._failed(errors, kind, method, route, started, attempt, exc) from None
        finally:
            _local.guard = None
        status = response.status_code
        if status not in expect and status not in passthrough:
            response.close()
            error = errors.for_status(status, f"{method} {route}")
            error.route = route
            self._log_failure(method, route, started, attempt, error)
            raise _StatusError(error, _retry_after(response))
        return ResponseStream(
            response,
            errors=errors,
            route=route,
            method=method,
            deadline=deadline,
            max_bytes=max_bytes,
            started=started,
            sent=sent,
            attempt=attempt,
            guard=guard,
        )

    def _failed(
        self,
        errors: type[DifyError],
        kind: str,
        method: str,
        route: str,
        started: float,
        attempt: int,
        exc: BaseException,
    ) -> DifyError:
        error = errors.of(
            kind,
            f"{method} {route}: {'timed out' if kind == 'timeout' else 'unreachable'} "
            f"({_cause(exc)})",
            retryable=True,
            route=route,
        )
        self._log_failure(method, route, started, attempt, error)
        return error

    @staticmethod
    def _log_failure(
        method: str, route: str, started: float, attempt: int, error: DifyError
    ) -> None:
        logger.debug(
            "dify %s %s status=%s ms=%.1f attempt=%d error=%s",
            method,
            route,
            error.status,
            (time.monotonic() - started) * 1000,
            attempt,
            error.code,
        )


class _StatusError(Exception):
    def __init__(self, error: DifyError, retry_after: float | None) -> None:
        super().__init__(error.code)
        self.error = error
        self.retry_after = retry_after


def _retry_after(response: requests.Response) -> float | None:
    value = response.headers.get("Retry-After", "").strip()
    return float(value) if value.isdigit() else None


# --- JSON and envelopes -----------------------------------------------------------------------


def parse_json(body: bytes, *, errors: type[DifyError], route: str) -> Any:
    """Parse a body already read under its cap; ``invalid`` when it is not JSON."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise errors.of(
            "invalid", f"{route}: the answer is not JSON ({len(body)} bytes)", route=route
        ) from None


def unwrap_envelope(
    value: Any,
    *,
    errors: type[DifyError],
    route: str,
    secrets: Sequence[str] = (),
    inputs: Sequence[str] = (),
) -> Any:
    """Return ``data`` of Dify's ``{data, error}`` envelope.

    A non-empty string ``error`` raises the surface's ``error`` kind (``MODEL_RUNTIME_ERROR``,
    ``DATASOURCE_ERROR``; not retryable) with Dify's message passed through
    :func:`sanitize_message`, and so does a ``data`` of ``null`` next to an ``error`` of ``""``.
    Anything else that is not an object holding ``data`` and a string or null ``error`` (``{}``,
    ``{"error": null, "message": "Not Found"}``, a null ``data`` with a null ``error``) is
    ``invalid``: it is not an envelope, so it proves nothing about the route.
    """
    if not isinstance(value, dict):
        raise errors.of(
            "invalid", f"{route}: the answer is not a {{data, error}} envelope", route=route
        )
    message = value.get("error")
    if message is not None and not isinstance(message, str):
        raise errors.of("invalid", f"{route}: the envelope's error is not a string", route=route)
    if message:
        safe = sanitize_message(message, secrets=secrets, inputs=inputs)
        raise errors.of("error", f"{route}: Dify reported: {safe}", route=route)
    if "data" not in value or "error" not in value:
        raise errors.of(
            "invalid",
            f"{route}: the answer is not a {{data, error}} envelope (no data, no error)",
            route=route,
        )
    data = value["data"]
    if data is None:
        if message is None:
            raise errors.of(
                "invalid", f"{route}: the envelope holds a null data and a null error", route=route
            )
        raise errors.of("error", f"{route}: Dify answered no data and no error", route=route)
    return data


# --- length-prefixed frames -------------------------------------------------------------------

FRAME_MAGIC = 0x0F
FRAME_PREFIX_BYTES = 4  # magic (1), reserved (1), header length (uint16 LE)
FRAME_MIN_HEADER_BYTES = 10  # data length (uint32 LE) + 6 reserved bytes
_PREFIX = struct.Struct("<BBH")
_DATA_LENGTH = struct.Struct("<I")


def encode_frame(payload: bytes) -> bytes:
    """One frame as Dify writes it: ``0x0f``, 0, header length 10, data length, 6 zero bytes,
    payload (all little endian)."""
    return (
        _PREFIX.pack(FRAME_MAGIC, 0, FRAME_MIN_HEADER_BYTES)
        + _DATA_LENGTH.pack(len(payload))
        + bytes(6)
        + payload
    )


class FrameDecoder:
    """Incremental decoder of Dify's length-prefixed frames.

    Layout: byte 0 magic ``0x0f``, byte 1 reserved, bytes 2-3 header length ``h`` (uint16 LE,
    at least 10), bytes 4-7 data length ``n`` (uint32 LE), then the rest of the header up to
    byte ``4 + h``, then ``n`` bytes of JSON. :meth:`feed` returns the payloads completed by
    the bytes given; a bad magic or header length is ``invalid``, a frame declaring more than
    ``max_frame_bytes`` is ``too_large`` before its payload is read, and :meth:`finish` makes a
    stream that ended inside a frame ``invalid``.
    """

    def __init__(self, *, errors: type[DifyError], route: str, max_frame_bytes: int) -> None:
        self._errors = errors
        self._route = route
        self._max = max_frame_bytes
        self._buffer = bytearray()
        self.frames = 0

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        payloads: list[bytes] = []
        while self._buffer:
            if self._buffer[0] != FRAME_MAGIC:
                raise self._errors.of(
                    "invalid",
                    f"{self._route}: frame {self.frames} starts with 0x{self._buffer[0]:02x}, "
                    "not the magic 0x0f",
                    route=self._route,
                )
            if len(self._buffer) < FRAME_PREFIX_BYTES + 4:
                break
            _, _, header = _PREFIX.unpack_from(self._buffer, 0)
            (length,) = _DATA_LENGTH.unpack_from(self._buffer, FRAME_PREFIX_BYTES)
            if header < FRAME_MIN_HEADER_BYTES:
                raise self._errors.of(
                    "invalid",
                    f"{self._route}: frame {self.frames} has a header of {header} bytes",
                    route=self._route,
                )
            start = FRAME_PREFIX_BYTES + header
            if start + length > self._max:
                raise self._errors.of(
                    "too_large",
                    f"{self._route}: frame {self.frames} declares {start + length} bytes, "
                    f"over the limit of {self._max}",
                    route=self._route,
                )
            if len(self._buffer) < start + length:
                break
            payloads.append(bytes(self._buffer[start : start + length]))
            del self._buffer[: start + length]
            self.frames += 1
        return payloads

    def finish(self) -> None:
        if self._buffer:
            raise self._errors.of(
                "invalid",
                f"{self._route}: the stream ended inside frame {self.frames} "
                f"({len(self._buffer)} bytes of it)",
                route=self._route,
            )


def iter_frames(stream: ResponseStream, *, errors: type[DifyError], route: str) -> Iterator[Any]:
    """Parse frames as their bytes arrive and yield each payload's JSON value.

    The stream's own cap bounds the total; each frame is bounded by the same cap. The stream is
    closed when the iteration ends, fails or is abandoned.
    """
    decoder = FrameDecoder(errors=errors, route=route, max_frame_bytes=stream._max_bytes)
    try:
        for chunk in stream:
            for payload in decoder.feed(chunk):
                yield parse_json(payload, errors=errors, route=route)
        decoder.finish()
    finally:
        stream.close()
