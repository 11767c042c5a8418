"""Buffered-upload admission: a process-wide gate taken before a multipart body is read.

A document upload is buffered whole in this process (the multipart parser's chunks, the spooled
or in-memory part, the ``read()`` copy handed to the service), so the number of uploads being
read at once and the bytes they may hold are bounded per API process, before the first body
byte is read (production deployment guide, "Buffered document uploads"):

* at most ``KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_CONCURRENCY`` (2, 1..8) admitted requests;
* at most ``KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_RESERVED_BYTES`` (192 MiB) reserved in
  total, each request reserving :data:`RESERVATION_FACTOR` (3) times its bounded multipart
  envelope, ``min(Content-Length, KNOWLEDGE_UPLOAD_MAX_BYTES + KNOWLEDGE_UPLOAD_ENVELOPE_BYTES)``
  (an admission estimate of the retained buffers, not an RSS guarantee);
* a request that does not fit waits in FIFO order (a large upload is not overtaken for ever by
  small ones) for at most the idle timeout, then gets 429 ``upload_admission_busy`` with
  ``Retry-After`` (:data:`RETRY_AFTER_SECONDS`); it never read or allocated its body;
* a request whose own reservation is above the total can never fit: 413
  ``upload_reservation_too_large`` at once.

Once admitted, the body is read through :class:`DeadlineStream`: at most
``KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS`` (30 s) without a byte, and at most
``KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_TOTAL_TIMEOUT_MS`` (600 s) in all, else 408
``upload_timeout`` naming the deadline. Under gunicorn (the WSGI environ carries
``gunicorn.socket``) the socket's own timeout is the idle interval, so a stalled client cannot
hold the thread, and a timer cuts the reads short at the total deadline; elsewhere the deadlines
are checked between reads. A body that ends before its Content-Length is 400
``upload_incomplete``. ``details.received_bytes`` of a 408/400 is the number of body bytes the
server received, exact under gunicorn too: its body reader blocks until it holds all it was
asked for (64 KiB from Django's multipart parser) and drops a partial read on a timeout, so
the bytes are counted where gunicorn's reader takes them from the socket
(:class:`_CountingSocket`), not only as completed reads. The admission is released when the
view returns, on every path.

The gate counts are per process: the deployment-wide envelope is these limits times the API
processes (gunicorn workers) times the replicas. :func:`diagnostics` feeds ``/health``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponseBase
from rest_framework.request import Request
from rest_framework.views import APIView

from knowledgefs.errors import (
    InvalidInput,
    LengthRequired,
    PayloadTooLarge,
    RequestTimeout,
    TooManyRequests,
)
from knowledgefs.uploads import upload_limit_message

#: Each admitted request reserves this many times its envelope: the stream chunks, the parsed
#: part (memory or temporary file) and the ``read()`` copy handed to the service (seed guide).
RESERVATION_FACTOR = 3
#: ``Retry-After`` on a 429 ``upload_admission_busy``, in seconds.
RETRY_AFTER_SECONDS = 5
#: The socket timeout used to cut a read short once the total deadline passed, in seconds.
_EXPIRED_SOCKET_TIMEOUT = 0.001


@dataclass
class Lease:
    """One admitted request: its reservation in bytes; released once."""

    reservation: int
    released: bool = False


@dataclass
class AdmissionGate:
    """FIFO gate over active requests and reserved bytes (thread-safe, one per process).

    The limits are read from settings at each :meth:`acquire`, so they are the ones in force:
    ``concurrency_setting`` and ``reserved_setting`` name them (the multipart gate's by default;
    the small-file fallback has its own gate, ingestion.fallback_admission), ``factor`` is how
    many times its body a request reserves.
    """

    concurrency_setting: str = "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_CONCURRENCY"
    reserved_setting: str = "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_RESERVED_BYTES"
    factor: int = RESERVATION_FACTOR
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _queue: deque = field(default_factory=deque)
    active: int = 0
    reserved_bytes: int = 0
    counters: Counter = field(default_factory=Counter)

    def acquire(self, reservation: int, *, wait_seconds: float) -> Lease:
        """Admit a request reserving ``reservation`` bytes, waiting FIFO up to ``wait_seconds``.

        Raises :class:`PayloadTooLarge` (``upload_reservation_too_large``) when the reservation
        alone exceeds the total, :class:`TooManyRequests` (``upload_admission_busy``) when the
        wait ran out; a request that gives up leaves the queue and lets the next one in.
        """
        max_active = getattr(settings, self.concurrency_setting)
        max_reserved = getattr(settings, self.reserved_setting)
        if reservation > max_reserved:
            self.count("refused_reservation_too_large")
            raise PayloadTooLarge(
                f"this upload would reserve {reservation} bytes ({self.factor} times its "
                f"{reservation // self.factor}-byte body) but at most {max_reserved} bytes "
                f"may be reserved for buffered uploads ({self.reserved_setting}); nothing is "
                "stored",
                code="upload_reservation_too_large",
                details={"reservation_bytes": reservation, "max_reserved_bytes": max_reserved},
            )
        ticket = object()
        started = time.monotonic()
        deadline = started + wait_seconds
        with self._cond:
            self._queue.append(ticket)
            try:
                while not (
                    self._queue[0] is ticket
                    and self.active < max_active
                    and self.reserved_bytes + reservation <= max_reserved
                ):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        self.counters["refused_busy"] += 1
                        raise self._busy(max_active, max_reserved, wait_seconds)
                    self._cond.wait(remaining)
                self.active += 1
                self.reserved_bytes += reservation
                self.counters["admitted"] += 1
                if time.monotonic() - started > 0.001:
                    self.counters["admitted_after_wait"] += 1
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()
        return Lease(reservation)

    def release(self, lease: Lease) -> None:
        """Give back an admitted request's slot and bytes (a second call does nothing)."""
        with self._cond:
            if lease.released:
                return
            lease.released = True
            self.active -= 1
            self.reserved_bytes -= lease.reservation
            self._cond.notify_all()

    def snapshot(self) -> dict[str, Any]:
        """``{"active", "reserved_bytes", "waiting", "counters": {...}}`` at this moment."""
        with self._cond:
            return {
                "active": self.active,
                "reserved_bytes": self.reserved_bytes,
                "waiting": len(self._queue),
                "counters": dict(self.counters),
            }

    def count(self, name: str) -> None:
        """Add one to the counter ``name`` (shown on /health)."""
        with self._cond:
            self.counters[name] += 1

    def _busy(self, max_active: int, max_reserved: int, waited: float) -> TooManyRequests:
        return TooManyRequests(
            f"the server is reading {self.active} uploads ({self.reserved_bytes} of "
            f"{max_reserved} bytes reserved, at most {max_active} at once) and this one waited "
            f"{round(waited * 1000)} ms; nothing was read or stored, send it again later",
            code="upload_admission_busy",
            retry_after=RETRY_AFTER_SECONDS,
            details={
                "active": self.active,
                "max_concurrency": max_active,
                "reserved_bytes": self.reserved_bytes,
                "max_reserved_bytes": max_reserved,
                "waited_ms": round(waited * 1000),
            },
        )


#: The process-wide gate (one per API process).
GATE = AdmissionGate()


class DeadlineStream:
    """A request body stream (Django's ``request._stream``) read under the upload deadlines.

    ``expected`` is the Content-Length; ``sock`` the client socket when the server exposes it
    (gunicorn), ``wsgi_input`` the server's body stream (gunicorn's ``Body``, whose socket
    reader is then counted, see :meth:`received_bytes`). ``read``/``readline`` raise
    :class:`RequestTimeout` (``upload_timeout``, ``details.deadline`` ``idle`` or ``total``)
    and :class:`InvalidInput` (``upload_incomplete``) when the body ends early.
    :meth:`close` restores the socket.
    """

    def __init__(
        self,
        stream: Any,
        expected: int,
        *,
        sock: Any = None,
        wsgi_input: Any = None,
        gate: AdmissionGate | None = None,
    ) -> None:
        self._gate = gate or GATE  # whose counters the timeouts and short bodies go to
        self._stream = stream
        self.expected = expected
        self.received = 0
        self.idle_ms = settings.KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS
        self.total_ms = settings.KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_TOTAL_TIMEOUT_MS
        self._deadline = time.monotonic() + self.total_ms / 1000
        self._lock = threading.Lock()
        self._expired = False
        self._closed = False
        self._sock = sock if hasattr(sock, "settimeout") and hasattr(sock, "gettimeout") else None
        self._prior_timeout = self._sock.gettimeout() if self._sock else None
        self._timer = None
        self._counter = _CountingSocket.install(wsgi_input, self._sock)
        if self._sock is not None:
            self._timer = threading.Timer(self.total_ms / 1000, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def read(self, *args: Any) -> bytes:
        """Read like the wrapped stream, under the deadlines."""
        return self._guarded(self._stream.read, args)

    def readline(self, *args: Any) -> bytes:
        """Read a line like the wrapped stream, under the deadlines."""
        return self._guarded(self._stream.readline, args)

    def received_bytes(self) -> int:
        """Body bytes received so far: those read through this stream, or (gunicorn) those its
        reader took from the socket, read-ahead included, whichever is more; at most
        ``expected``."""
        on_wire = self._counter.body_bytes() if self._counter is not None else 0
        return min(self.expected, max(self.received, on_wire))

    def close(self) -> None:
        """Stop the total-deadline timer, give the socket its own timeout back and gunicorn's
        reader its own socket."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._counter is not None:
                self._counter.uninstall()
            if self._timer is not None:
                self._timer.cancel()
            if self._sock is not None:
                try:
                    self._sock.settimeout(self._prior_timeout)
                except OSError:
                    pass

    def _expire(self) -> None:
        with self._lock:
            if self._closed or self._sock is None:  # (the timer runs only with a socket)
                return
            self._expired = True
            try:  # a read blocked on the socket returns within this once data stops coming
                self._sock.settimeout(_EXPIRED_SOCKET_TIMEOUT)
            except OSError:
                pass

    def _guarded(self, read: Any, args: tuple) -> bytes:
        if self.received >= self.expected:
            return read(*args)
        now = time.monotonic()
        if self._expired or now >= self._deadline:
            raise self._timeout("total")
        if self._sock is not None:
            with self._lock:
                if not self._closed and not self._expired:
                    self._sock.settimeout(min(self.idle_ms / 1000, self._deadline - now))
        try:
            data = read(*args)
        except OSError as exc:  # socket.timeout is TimeoutError, an OSError
            if self._expired or time.monotonic() >= self._deadline:
                raise self._timeout("total") from None
            if isinstance(exc, TimeoutError):
                raise self._timeout("idle") from None
            raise
        if self._sock is None and (time.monotonic() - now) * 1000 > self.idle_ms:
            raise self._timeout("idle")  # no socket to bound the read: checked once it returned
        self.received += len(data)
        if not data and self.received < self.expected and (not args or args[0] != 0):
            self._gate.count("incomplete")
            received = self.received_bytes()
            raise InvalidInput(
                f"the request body ended after {received} of its {self.expected} declared "
                "bytes (the client stopped sending); nothing is stored",
                code="upload_incomplete",
                details={"received_bytes": received, "expected_bytes": self.expected},
            )
        if self.received >= self.expected:
            self.close()
        return data

    def _timeout(self, which: str) -> RequestTimeout:
        self._gate.count(f"timeout_{which}")
        limit, name = (
            (self.idle_ms, "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS")
            if which == "idle"
            else (self.total_ms, "KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_TOTAL_TIMEOUT_MS")
        )
        what = "sent nothing for" if which == "idle" else "took longer than"
        received = self.received_bytes()
        return RequestTimeout(
            f"the upload {what} {limit} ms ({which} deadline, {name}) after {received} of "
            f"{self.expected} bytes; nothing is stored",
            details={
                "deadline": which,
                "timeout_ms": limit,
                "received_bytes": received,
                "expected_bytes": self.expected,
            },
        )


class _CountingSocket:
    """The client socket as gunicorn's body reader sees it, counting what ``recv`` returns.

    Installed in place of ``wsgi_input.reader.unreader.sock`` (gunicorn's ``Body`` ->
    ``LengthReader`` -> ``SocketUnreader``) only when that is the very ``gunicorn.socket``;
    otherwise nothing is installed and the completed reads are the count. One attribute
    look-up and an addition per ``recv`` (of up to 1 MiB): no measurable cost.
    """

    def __init__(self, sock: Any, owner: Any, already: int) -> None:
        self._sock = sock
        self._owner = owner
        self.already = already  # body bytes gunicorn read ahead with the request head
        self.received = 0

    @classmethod
    def install(cls, wsgi_input: Any, sock: Any) -> _CountingSocket | None:
        """Wrap gunicorn's socket reader of ``wsgi_input``; None when it is not one."""
        unreader = getattr(getattr(wsgi_input, "reader", None), "unreader", None)
        if sock is None or unreader is None or getattr(unreader, "sock", None) is not sock:
            return None
        already = _buffered(unreader) + _buffered(wsgi_input)
        counter = cls(sock, unreader, already)
        unreader.sock = counter
        return counter

    def uninstall(self) -> None:
        """Give the reader its socket back (once)."""
        if self._owner is not None and self._owner.sock is self:
            self._owner.sock = self._sock
        self._owner = None

    def body_bytes(self) -> int:
        """Bytes read ahead before admission plus those received since."""
        return self.already + self.received

    def recv(self, *args: Any) -> bytes:
        """``socket.recv``, counted."""
        data = self._sock.recv(*args)
        self.received += len(data)
        return data

    def recv_into(self, *args: Any) -> int:
        """``socket.recv_into``, counted."""
        count = self._sock.recv_into(*args)
        self.received += count
        return count

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _buffered(holder: Any) -> int:
    """Bytes held in ``holder.buf`` (a ``BytesIO``, as gunicorn's readers keep), else 0."""
    buf = getattr(holder, "buf", None)
    try:
        return buf.getbuffer().nbytes if buf is not None else 0
    except (AttributeError, BufferError, ValueError):
        return 0


class Admission:
    """An admitted upload: its lease and deadline stream, released once by :meth:`release`."""

    def __init__(self, request: Any, lease: Lease, stream: DeadlineStream) -> None:
        self.request = request
        self.lease = lease
        self.stream = stream

    def release(self) -> None:
        """Close the stream, delete spooled parts of an unfinished parse, free the gate."""
        try:
            self.stream.close()
            _close_partial_files(self.request)
        finally:
            GATE.release(self.lease)


def _close_partial_files(request: Any) -> None:
    """A parse that raised leaves its part file open (a temporary file is deleted on close)."""
    for handler in getattr(request, "_upload_handlers", None) or ():
        part = getattr(handler, "file", None)
        if part is not None and hasattr(part, "close"):
            try:
                part.close()
            except OSError:
                pass


def declared_length(request: Any) -> int:
    """The request's Content-Length in bytes; 411 ``length_required`` when absent or chunked."""
    raw = (request.META.get("CONTENT_LENGTH") or "").strip()
    if not raw or not raw.isdigit():
        raise LengthRequired(
            "uploads need a Content-Length header (chunked request bodies are not accepted)"
        )
    return int(raw)


def admit_upload(request: Any) -> Admission:
    """Admit one buffered multipart upload before its body is read (``request``: Django's).

    Order: Content-Length required (411); a declared body above ``KNOWLEDGE_UPLOAD_MAX_BYTES +
    KNOWLEDGE_UPLOAD_ENVELOPE_BYTES`` bytes is refused unread (413); then the gate (413/429);
    then the body stream is put under the read deadlines. The caller must
    :meth:`Admission.release`.
    """
    declared = declared_length(request)
    limit = settings.KNOWLEDGE_UPLOAD_MAX_BYTES
    envelope_cap = limit + settings.KNOWLEDGE_UPLOAD_ENVELOPE_BYTES
    if declared > envelope_cap:
        GATE.count("refused_declared_too_large")
        raise PayloadTooLarge(
            upload_limit_message(limit),
            details={"limit_bytes": limit, "declared_bytes": declared},
        )
    envelope = min(declared, envelope_cap)
    wait = settings.KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS / 1000
    lease = GATE.acquire(RESERVATION_FACTOR * envelope, wait_seconds=wait)
    try:
        stream = DeadlineStream(
            request._stream,
            declared,
            sock=request.META.get("gunicorn.socket"),
            wsgi_input=request.META.get("wsgi.input"),
        )
        request._stream = stream
    except BaseException:
        GATE.release(lease)
        raise
    return Admission(request, lease, stream)


class BufferedUploadAdmissionMixin(APIView):
    """APIView mixin for multipart document-upload routes (the methods in ``upload_methods``).

    The admission is taken in ``initial`` — after authentication, permission and throttling,
    which read no body, and before the handler touches ``request.data`` / ``request.FILES`` —
    and released when ``dispatch`` returns or raises, whatever the outcome.
    """

    upload_methods = frozenset({"POST"})

    _upload_admission: Admission | None

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        self._upload_admission = None
        try:
            return super().dispatch(request, *args, **kwargs)
        finally:
            if self._upload_admission is not None:
                self._upload_admission.release()
                self._upload_admission = None

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        if request.method in self.upload_methods:
            # A binding or check read the body: a bug here. (HttpRequest._read_started is
            # Django's own flag; the stubs do not declare it.)
            if request._request._read_started:  # type: ignore[attr-defined]
                raise RuntimeError("the upload body was read before its admission")
            self._upload_admission = admit_upload(request._request)


def diagnostics() -> dict[str, Any]:
    """The upload limits and the gate's state, for ``/health``: sizes in bytes, times in ms."""
    return {
        "max_file_bytes": settings.KNOWLEDGE_UPLOAD_MAX_BYTES,
        "max_body_bytes": settings.KNOWLEDGE_UPLOAD_MAX_BYTES
        + settings.KNOWLEDGE_UPLOAD_ENVELOPE_BYTES,
        "max_concurrency": settings.KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_CONCURRENCY,
        "max_reserved_bytes": settings.KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_RESERVED_BYTES,
        "idle_timeout_ms": settings.KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_IDLE_TIMEOUT_MS,
        "total_timeout_ms": settings.KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_TOTAL_TIMEOUT_MS,
        **GATE.snapshot(),
    }
