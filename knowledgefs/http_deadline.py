"""Whole-call deadlines for ``requests``: a watchdog thread and connection pools that arm it.

Shared by the Dify transport (:mod:`knowledgefs.dify.transport`) and the Unstructured-compatible
parser client (:mod:`ingestion.unstructured.client`). A caller creates a :class:`Deadline`, a
:class:`Guard` for the attempt, sets ``current.guard`` in the calling thread around
``session.request(...)`` on a session whose adapters are :class:`GuardedAdapter`; the pool arms
the deadline on the connection the attempt checks out, before the request is sent, and the
watchdog shuts that socket down when the deadline passes, whatever the attempt is blocked in
(connect, upload, waiting for headers, reading the body). ``guard.timed_out`` then says the
failure was the deadline. The alarm is cancelled when the connection returns to the pool; a
connection whose alarm fired is closed there, never reused.

No Django imports; the watchdog thread is re-created after ``fork``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import requests
import urllib3
import urllib3.connection
from requests.adapters import HTTPAdapter

logger = logging.getLogger("knowledgefs.http")

# --- deadlines and the watchdog ---------------------------------------------------------------


class Deadline:
    """A point in ``time.monotonic()`` time, ``seconds`` from now."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def expired(self) -> bool:
        return self.remaining() <= 0


class _Alarm:
    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback: Callable[[], None] | None = callback
        self._lock = threading.Lock()
        self.cancelled = False
        self.fired = False

    def fire(self) -> None:
        with self._lock:
            if self.cancelled or self._callback is None:
                return
            self.fired = True
            try:
                self._callback()
            except Exception:  # noqa: BLE001 - an alarm must never kill the watchdog
                logger.debug("http watchdog callback failed", exc_info=True)

    def cancel(self) -> None:
        """After this returns the callback has either run completely or will never run."""
        with self._lock:
            self.cancelled = True
            # A cancelled alarm waits in the heap until its time: it must not keep the response.
            self._callback = None


class _Watchdog:
    """One daemon thread that runs callbacks at their deadlines (for every open response)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Alarm]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, at: float, callback: Callable[[], None]) -> _Alarm:
        alarm = _Alarm(callback)
        with self._cond:
            if len(self._heap) > 4096:
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
            heapq.heappush(self._heap, (at, next(self._seq), alarm))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="http-watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()
        return alarm

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][2].cancelled:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._cond.wait()
                        continue
                    wait = self._heap[0][0] - time.monotonic()
                    if wait <= 0:
                        alarm = heapq.heappop(self._heap)[2]
                        break
                    self._cond.wait(wait)
            alarm.fire()


_watchdog = _Watchdog()


def arm_alarm(at: float, callback: Callable[[], None]) -> _Alarm:
    """Run ``callback`` on the shared watchdog thread at ``at`` (``time.monotonic()`` time)
    unless the returned alarm is cancelled first (``alarm.cancel()``; afterwards the callback
    has either run completely or never will)."""
    return _watchdog.arm(at, callback)


def _after_fork() -> None:
    global _watchdog
    _watchdog = _Watchdog()


os.register_at_fork(after_in_child=_after_fork)


# --- connections guarded by the call's deadline -----------------------------------------------
#
# The watchdog must cover the whole attempt: connect, sending the request and its body, waiting
# for the status line and headers, and the body. So the deadline is attached to the connection
# itself, in the pool, the moment the attempt checks one out (``_get_conn`` runs in the calling
# thread, inside ``session.request``): when the deadline passes the connection's socket is shut
# down, whatever the attempt is blocked in. The alarm is cancelled when the connection goes back
# to the pool (``_put_conn``); a connection whose alarm fired is closed there, so a socket shut
# by the watchdog is never handed to another call.

#: ``current.guard`` is the :class:`Guard` of the attempt the calling thread is sending, if any;
#: ``current.cancellation`` the thread's :class:`Cancellation`, if any.
current = threading.local()


def shutdown_socket(sock: socket.socket | None) -> None:
    if sock is None:
        return
    try:
        # The plain socket's shutdown, also for an SSLSocket (whose own shutdown would drop the
        # TLS object under the thread using it): the blocked recv/send returns at once.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except (OSError, TypeError):
        pass


class Guard:
    """The deadline of one attempt; armed on every connection the attempt checks out."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self.timed_out = False

    def attach(self, conn: Any) -> None:
        conn._kfs_shut = False
        conn._kfs_alarm = _watchdog.arm(self.deadline.at, lambda: self._fire(conn))

    def _fire(self, conn: Any) -> None:
        self.timed_out = True
        conn._kfs_shut = True
        shutdown_socket(getattr(conn, "sock", None))


def _detach(conn: Any) -> None:
    """Stop the connection's alarm; close it when the alarm already shut its socket."""
    alarm = conn.__dict__.pop("_kfs_alarm", None)
    if alarm is not None:
        alarm.cancel()  # after this the alarm has fired completely or never will
    if alarm is not None and alarm.fired or getattr(conn, "_kfs_shut", False):
        conn.close()
    conn._kfs_shut = False


class Cancellation:
    """Lets another thread abort the HTTP calls one thread makes, whatever they are blocked in.

    The calling thread sets ``current.cancellation`` to it; every connection that thread checks
    out from a guarded pool is attached until it goes back. :meth:`cancel` (from any thread)
    shuts the attached sockets down, so a blocked connect, send or read returns at once (the
    call fails as a broken connection), and any connection checked out afterwards is shut as
    soon as it connects; a shut connection is closed when it returns to the pool, never reused.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: set[Any] = set()
        self.cancelled = False

    def attach(self, conn: Any) -> None:
        with self._lock:
            if self.cancelled:
                conn._kfs_shut = True
                shutdown_socket(getattr(conn, "sock", None))
            else:
                self._conns.add(conn)

    def detach(self, conn: Any) -> None:
        with self._lock:
            self._conns.discard(conn)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            for conn in self._conns:
                conn._kfs_shut = True
                shutdown_socket(getattr(conn, "sock", None))
            self._conns.clear()


class _GuardedConnectionMixin:
    _kfs_shut = False

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        if self._kfs_shut:  # the deadline passed while connecting
            shutdown_socket(getattr(self, "sock", None))


class _GuardedHTTPConnection(_GuardedConnectionMixin, urllib3.connection.HTTPConnection):
    pass


class _GuardedHTTPSConnection(_GuardedConnectionMixin, urllib3.connection.HTTPSConnection):
    pass


class _GuardedPoolMixin:
    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        guard = getattr(current, "guard", None)
        if guard is not None:
            guard.attach(conn)
        cancellation = getattr(current, "cancellation", None)
        if cancellation is not None:
            conn._kfs_cancellation = cancellation
            cancellation.attach(conn)
        return conn

    def _put_conn(self, conn: Any) -> None:
        if conn is not None:
            cancellation = conn.__dict__.pop("_kfs_cancellation", None)
            if cancellation is not None:
                cancellation.detach(conn)
            _detach(conn)
        super()._put_conn(conn)  # type: ignore[misc]


class _GuardedHTTPPool(_GuardedPoolMixin, urllib3.HTTPConnectionPool):
    ConnectionCls = _GuardedHTTPConnection


class _GuardedHTTPSPool(_GuardedPoolMixin, urllib3.HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPSConnection


class GuardedAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` whose pools arm the calling attempt's deadline on each connection."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": _GuardedHTTPPool,
            "https": _GuardedHTTPSPool,
        }


def is_guarded(session: requests.Session) -> bool:
    """Whether every adapter of ``session`` is a :class:`GuardedAdapter`."""
    return all(isinstance(a, GuardedAdapter) for a in session.adapters.values())


def exception_cause(exc: BaseException) -> str:
    """The innermost exception class name (``ConnectionRefusedError``), never its text."""
    seen: set[int] = set()
    current: BaseException | None = exc
    name = type(exc).__name__
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__
        nested = [a for a in getattr(current, "args", ()) if isinstance(a, BaseException)]
        reason = getattr(current, "reason", None)
        current = (
            nested[0]
            if nested
            else reason
            if isinstance(reason, BaseException)
            else current.__cause__ or current.__context__
        )
    return name
