"""The transport every Dify inner-API client shares: :class:`DifyTransport`.

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
Bodies are read by :class:`~knowledgefs.dify.stream.ResponseStream`, never past their cap;
JSON is parsed only after the cap held (:mod:`.envelope`).

Retries: a call marked ``idempotent`` is sent again after a connection failure (before or while
its body was read) or a 408/409/425/429/5xx answer, at most ``max_retries`` times, with
exponential backoff and jitter (``Retry-After`` honoured up to 5 s, then 0-25 % later so that
workers told the same instant do not come back together), and only while the deadline leaves
time. A 429 (the provider throttles) may be retried up to ``THROTTLE_MAX_RETRIES`` (6) times,
still within the deadline; a :func:`throttle_listener` of the calling context is told of each
throttled wait before it starts (a job shows it as throttling, not failure). A timeout is never
retried inline: it spent the deadline. Streams (:meth:`DifyTransport.open_stream`) are retried
only until their body starts.

Logs (logger ``knowledgefs.dify``, DEBUG per attempt, INFO per retry): method, route (no query
string), status, duration, bytes sent and received, error code. Never the key, a body, or a
message from Dify.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import requests
import urllib3
from django.conf import settings

from knowledgefs.http_deadline import Deadline
from knowledgefs.http_deadline import Guard as _Guard
from knowledgefs.http_deadline import current as _local
from knowledgefs.http_deadline import exception_cause as _cause
from knowledgefs.http_deadline import is_guarded as _guarded
from knowledgefs.http_session import ProcessSession

from . import config
from .errors import DifyError, DifyNotConfigured
from .stream import ResponseStream

_T = TypeVar("_T")
logger = logging.getLogger("knowledgefs.dify")

_SESSION = ProcessSession(pool_connections=4, pool_maxsize=config.POOL_SIZE)

# Told ``(route, status, seconds)`` before a throttled call (429, or an answer with
# ``Retry-After``) waits to be sent again; set by :func:`throttle_listener`.
_THROTTLE_LISTENER: ContextVar[Callable[[str, int | None, float], None] | None] = ContextVar(
    "dify_throttle_listener", default=None
)


@contextmanager
def throttle_listener(callback: Callable[[str, int | None, float], None]) -> Iterator[None]:
    """Within this block (and the threads a client starts for it with the context copied), call
    ``callback(route, status, seconds)`` before each throttled wait. Its errors are logged and
    never fail the call."""
    token = _THROTTLE_LISTENER.set(callback)
    try:
        yield
    finally:
        _THROTTLE_LISTENER.reset(token)


def shared_session() -> requests.Session:
    """The process's pooled session (``POOL_SIZE`` connections per host, no urllib3 retries)."""
    return _SESSION.get()


@dataclass(frozen=True)
class Reply:
    """A complete answer: status, headers and the body read under its cap."""

    status: int
    headers: Mapping[str, str]
    body: bytes


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
            listener = _THROTTLE_LISTENER.get()
            if listener is not None and (error.status == 429 or retry_after is not None):
                try:
                    listener(route, error.status, delay)
                except Exception:  # noqa: BLE001 - an observer never fails the call
                    logger.exception("throttle listener failed")
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
        retries = self.max_retries
        if error.status == 429:
            retries = max(retries, config.THROTTLE_MAX_RETRIES)
        if not (allowed and error.retryable) or attempt > retries:
            return None
        delay: float = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
        delay *= random.uniform(0.5, 1.0)
        if retry_after is not None:
            # Never before the server's Retry-After; up to a quarter later, jittered.
            wait = min(retry_after, config.RETRY_AFTER_MAX_S) * random.uniform(1.0, 1.25)
            delay = max(delay, wait)
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
