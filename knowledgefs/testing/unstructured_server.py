"""A local stand-in for an Unstructured-compatible parser, speaking the ``/general/v0/general``
contract the client in ``ingestion/unstructured`` uses, with faults a test can switch on.

Stdlib only (plus the multipart splitter of :mod:`ingestion.unstructured.server`):
``ThreadingHTTPServer`` on 127.0.0.1, port 0, HTTP/1.1 with keep-alive.

``POST /general/v0/general`` answers a JSON list of elements for the uploaded file: by default a
``Title`` naming the file, a ``NarrativeText`` with its size and a ``Table`` with
``text_as_html`` (``page_number`` 1 on each), or :attr:`UnstructuredTestServer.elements` when
set. ``GET /healthcheck`` answers ``{"status": "ok"}``. With ``api_key`` set, a request without
that ``unstructured-api-key`` gets 401.

Faults (:meth:`UnstructuredTestServer.add_fault`) apply to the next ``times`` requests (``None``:
all): ``delay`` (hold the answer ``seconds``), ``hang`` (never answer until the server stops),
``status`` (answer ``status`` with ``{"detail": ...}`` and an optional ``Retry-After``),
``malformed`` (200 with a body that is not JSON), ``huge`` (200 streaming ``size`` bytes of a
valid JSON list, chunked, no ``Content-Length``), ``declared`` (a ``Content-Length`` of
``size`` bytes and a few bytes of body), ``slow_body`` (a complete JSON answer trickled one
byte every ``interval`` seconds), ``drop`` (close the connection without answering).

Every request is recorded (:attr:`UnstructuredTestServer.requests`), with the peak number in
flight overall and per file extension (:meth:`peak`).
"""

from __future__ import annotations

import json
import socket
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ingestion.unstructured.server import MultipartError, parse_multipart
from knowledgefs.testing.loopback_server import LoopbackServerMixin

ENDPOINT = "/general/v0/general"


@dataclass
class Fault:
    kind: str
    times: int | None = 1
    seconds: float = 0.0
    status: int = 503
    retry_after: str | None = None
    detail: str = "injected"
    size: int = 0
    interval: float = 0.05


@dataclass
class Recorded:
    filename: str = ""
    content_type: str = ""
    size: int = 0
    fields: dict[str, list[str]] = field(default_factory=dict)
    api_key: str | None = None
    faults: list[str] = field(default_factory=list)
    status: int | None = None


def default_elements(filename: str, size: int) -> list[dict[str, Any]]:
    """What the server answers for an upload without :attr:`elements` set."""
    meta = {"filename": filename, "page_number": 1}
    return [
        {"type": "Title", "element_id": "t1", "text": f"Report {filename}",
         "metadata": {**meta, "category_depth": 0}},
        {"type": "NarrativeText", "element_id": "n1",
         "text": f"The parser received {size} bytes.", "metadata": meta},
        {"type": "Table", "element_id": "tb1", "text": "Team Cups Blues 1",
         "metadata": {**meta, "text_as_html": "<table><tr><td>Team</td><td>Cups</td></tr>"
                      "<tr><td>Blues</td><td>1</td></tr></table>"}},
    ]  # fmt: skip


class UnstructuredTestServer(LoopbackServerMixin):
    """The server and its state; see the module docstring. Thread-safe."""

    def __init__(self, *, api_key: str = "") -> None:
        self.api_key = api_key
        self.elements: list[dict[str, Any]] | None = None
        self.requests: list[Recorded] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._faults: list[Fault] = []
        self._in_flight: dict[str, int] = defaultdict(int)
        self._peak: dict[str, int] = defaultdict(int)
        self._connections: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> UnstructuredTestServer:
        server = self

        class Handler(_Handler):
            owner = server

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                if not server.stopping.is_set():
                    super().handle_error(request, client_address)

        httpd = Server(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        httpd.block_on_close = False
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def add_fault(self, kind: str, **options: Any) -> Fault:
        fault = Fault(kind=kind, **options)
        with self.lock:
            self._faults.append(fault)
        return fault

    def _take_faults(self) -> list[Fault]:
        taken = []
        with self.lock:
            for fault in list(self._faults):
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                taken.append(fault)
        return taken

    def peak(self, key: str = "*") -> int:
        """Most requests in flight at once: overall (``"*"``) or for one file extension
        (``".pdf"``)."""
        with self.lock:
            return self._peak[key]

    def _enter(self, keys: tuple[str, ...]) -> None:
        with self.lock:
            for key in keys:
                self._in_flight[key] += 1
                self._peak[key] = max(self._peak[key], self._in_flight[key])

    def _leave(self, keys: tuple[str, ...]) -> None:
        with self.lock:
            for key in keys:
                self._in_flight[key] -= 1


class _Abort(Exception):
    pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: UnstructuredTestServer

    def setup(self) -> None:
        super().setup()
        with self.owner.lock:
            self.owner._connections.add(self.connection)

    def finish(self) -> None:
        with self.owner.lock:
            self.owner._connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_GET(self) -> None:
        if self.path == "/healthcheck":
            return self._json(200, {"status": "ok"})
        return self._json(404, {"detail": "not found"})

    def do_POST(self) -> None:
        if self.path != ENDPOINT:
            return self._json(404, {"detail": "not found"})
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        record = Recorded(api_key=self.headers.get("unstructured-api-key"))
        try:
            fields, files = parse_multipart(self.headers.get("Content-Type", ""), body)
        except MultipartError as exc:
            return self._json(400, {"detail": str(exc)})
        uploads = [f for f in files if f[0] == "files"]
        if len(uploads) != 1:
            return self._json(400, {"detail": "send exactly one file in 'files'"})
        _, record.filename, record.content_type, data = uploads[0]
        record.size, record.fields = len(data), fields
        faults = self.owner._take_faults()
        record.faults = [f.kind for f in faults]
        with self.owner.lock:
            self.owner.requests.append(record)
        extension = "." + record.filename.rsplit(".", 1)[-1] if "." in record.filename else ""
        keys = ("*", extension)
        self.owner._enter(keys)
        try:
            self._answer(record, faults, data)
        except (_Abort, BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            self.owner._leave(keys)

    def _answer(self, record: Recorded, faults: list[Fault], data: bytes) -> None:
        stopping = self.owner.stopping
        if self.owner.api_key and record.api_key != self.owner.api_key:
            record.status = 401
            return self._json(401, {"detail": "API key is missing or wrong"})
        for fault in faults:
            if fault.kind == "delay":
                stopping.wait(fault.seconds)
            elif fault.kind == "hang":
                stopping.wait()
                raise _Abort
        elements = self.owner.elements
        if elements is None:
            elements = default_elements(record.filename, len(data))
        for fault in faults:
            record.status = fault.status if fault.kind == "status" else 200
            if fault.kind == "status":
                headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                return self._json(fault.status, {"detail": fault.detail}, headers)
            if fault.kind == "malformed":
                return self._raw(200, b'[{"type": "Title", "text": "cut off', "application/json")
            if fault.kind == "drop":
                self.connection.shutdown(socket.SHUT_RDWR)
                raise _Abort
            if fault.kind == "declared":
                self._start(200, {"Content-Type": "application/json",
                                  "Content-Length": str(fault.size)})  # fmt: skip
                self.wfile.write(b"[")
                self.wfile.flush()
                stopping.wait(30)
                raise _Abort
            if fault.kind == "huge":
                return self._huge(fault.size)
            if fault.kind == "slow_body":
                return self._slow(json.dumps(elements).encode(), fault.interval)
        record.status = 200
        return self._json(200, elements)

    def _start(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _raw(
        self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None
    ) -> None:
        headers = {"Content-Type": content_type, "Content-Length": str(len(body)), **(extra or {})}
        self._start(status, headers)
        self.wfile.write(body)
        self.wfile.flush()

    def _json(self, status: int, value: Any, extra: dict[str, str] | None = None) -> None:
        self._raw(status, json.dumps(value).encode(), "application/json", extra)

    def _huge(self, size: int) -> None:
        self._start(200, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        item = json.dumps({"type": "NarrativeText", "text": "x" * 1000, "metadata": {}}).encode()
        sent, first = 0, True
        while sent < size and not self.owner.stopping.is_set():
            piece = (b"[" if first else b",") + item
            first = False
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            sent += len(piece)
        self.wfile.write(b"1\r\n]\r\n0\r\n\r\n")
        self.wfile.flush()

    def _slow(self, body: bytes, interval: float) -> None:
        self._start(200, {"Content-Type": "application/json", "Content-Length": str(len(body))})
        for i in range(len(body)):
            self.wfile.write(body[i : i + 1])
            self.wfile.flush()
            if self.owner.stopping.wait(interval):
                raise _Abort
