"""A local stand-in for Dify's inner API, implementing the contract the clients in
``knowledgefs/dify`` speak (docs/dify-boundary.md), with faults a test can switch on.

Stdlib only: ``ThreadingHTTPServer`` on 127.0.0.1, port 0, HTTP/1.1 with keep-alive. Every
request must carry ``X-Inner-Api-Key`` (401 otherwise).

- ``/inner/api/invoke/text-embedding`` and ``…/multimodal-embedding``: a seeded bag-of-words
  hashing embedder (each lower-cased word adds ±1 to one of ``dimension`` buckets), L2-normalised
  then multiplied by ``scale``, so texts that share words are near and retrieval on real text
  works; or, with ``embedder="local"``, the local all-MiniLM-L6-v2 ONNX model KnowledgeFS embeds
  with under ``KNOWLEDGE_MODEL_RUNTIME=local`` (384 dimensions), so a run through this server can
  be compared with a local run;
- ``…/rerank``: the share of the query's words found in each document, or the scores a test's
  :attr:`DifyTestServer.rerank_responder` returns for the request body (a scripted reranker);
- ``…/llm``: a fixed answer in three length-prefixed frames, or the text a test's
  :attr:`DifyTestServer.llm_responder` returns for the request body (a scripted model);
- ``…/model-catalog``: a fixed catalog, paged by ``limit``/``offset``;
- ``/inner/api/knowledge-fs/storage/…``: objects in memory, SHA-256 checked (422), size-limited
  (413), listed in key order with a cursor;
- ``/inner/api/invoke/datasource``: fake connections by credential id;
- ``/inner/api/knowledge-fs/vectors`` and ``…/texts``: the vector and text bridge in memory
  (:class:`BridgeStore`, :attr:`DifyTestServer.bridge`), enforcing the route's limits with 400,
  cosine or BM25 (SQLite FTS5) search restricted to the authorized ids, a quota (413) and an
  unavailable switch (503 with ``Retry-After``).

Faults (:meth:`DifyTestServer.add_fault` and helpers) apply to the next matching requests:
delays before the answer, a stall inside the body, an error status, an error envelope,
truncated frames, an oversized body, vectors of another dimension, a connection dropped mid-body,
a wrong stored checksum, a corrupted upload. Every request is recorded
(:attr:`DifyTestServer.requests`), with the peak number in flight per route.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import socket
import sqlite3
import struct
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from knowledgefs.testing.loopback_server import LoopbackServerMixin

TEST_INNER_KEY = "test-inner-key-0123456789abcdef"

TEXT_EMBEDDING = "/inner/api/invoke/text-embedding"
MULTIMODAL_EMBEDDING = "/inner/api/invoke/multimodal-embedding"
RERANK = "/inner/api/invoke/rerank"
LLM = "/inner/api/invoke/llm"
MODEL_CATALOG = "/inner/api/invoke/model-catalog"
DATASOURCE = "/inner/api/invoke/datasource"
OBJECT = "/inner/api/knowledge-fs/storage/object"
OBJECT_METADATA = "/inner/api/knowledge-fs/storage/object/metadata"
OBJECTS = "/inner/api/knowledge-fs/storage/objects"
STORAGE_HEALTH = "/inner/api/knowledge-fs/storage/health"
VECTORS = "/inner/api/knowledge-fs/vectors"
TEXTS = "/inner/api/knowledge-fs/texts"

LLM_ANSWER = ["The leave policy ", "grants 25 days ", "per year."]
_WORD = re.compile(r"\w+")
_PROVIDER = re.compile(r"^[a-z0-9_-]+/[a-z0-9_-]+/[a-z0-9_-]+$")

CATALOG = [
    {"model_type": "llm", "plugin_id": "langgenius/openai", "provider": "openai", "model": m}
    for m in ("gpt-4.1", "gpt-4.1-mini", "o4-mini")
] + [
    {"model_type": "text-embedding", "plugin_id": "langgenius/openai", "provider": "openai",
     "model": "text-embedding-3-small"},
    {"model_type": "text-embedding", "plugin_id": "langgenius/cohere", "provider": "cohere",
     "model": "embed-v4.0"},
    {"model_type": "rerank", "plugin_id": "langgenius/cohere", "provider": "cohere",
     "model": "rerank-v3.5"},
]  # fmt: skip

DRIVE_FILES = [f"report-{i:03d}.pdf" for i in range(25)]
NOTION_PAGES = [f"page-{i}" for i in range(3)]


def frame(payload: bytes) -> bytes:
    """One length-prefixed frame as Dify writes it (magic 0x0f, header length 10, LE)."""
    return struct.pack("<BBHI", 0x0F, 0, 10, len(payload)) + bytes(6) + payload


def envelope_frame(data: Any = None, error: str = "") -> bytes:
    return frame(json.dumps({"data": data, "error": error}).encode())


def checksum(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def hashed_embedding(text: str, dimension: int, seed: str = "kfs") -> list[float]:
    """Bag of words hashed into ``dimension`` signed buckets, L2-normalised."""
    vector = [0.0] * dimension
    for word in _WORD.findall(text.lower()):
        digest = hashlib.sha256(f"{seed}:{word}".encode()).digest()
        index = int.from_bytes(digest[:4], "little") % dimension
        vector[index] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0:
        vector[0] = 1.0
        return vector
    return [v / norm for v in vector]


def overlap_score(query: str, doc: str) -> float:
    words = set(_WORD.findall(query.lower()))
    if not words:
        return 0.0
    return len(words & set(_WORD.findall(doc.lower()))) / len(words)


@dataclass
class Fault:
    """A misbehaviour for requests to ``route`` (any route when ``None``).

    ``kind``: ``delay`` (sleep ``seconds`` before answering), ``status`` (answer ``status``
    with a small JSON body), ``envelope`` (answer the error envelope ``message``), ``stall``
    (send ``after_bytes`` of the body, sleep ``seconds``, go on), ``drop`` (send ``after_bytes``
    of the body and cut the connection), ``oversize`` (answer ``size`` bytes, chunked unless
    ``declare``), ``truncate`` (end the LLM stream inside its second frame), ``dimension`` (return
    ``dimension``-d vectors), ``bad_checksum`` (serve an object with a wrong checksum header),
    ``corrupt_upload`` (flip a byte of the next PUT body before checking it), ``json`` (answer
    ``body`` as JSON with ``status``), ``trickle`` (send the first ``after_bytes`` of the body
    one byte every ``interval`` seconds, then stall ``seconds``). ``skip`` matching requests
    pass first; it then applies ``times`` times (``None``: always).
    """

    kind: str
    route: str | None = None
    times: int | None = 1
    skip: int = 0
    seconds: float = 0.0
    status: int = 503
    message: str = ""
    after_bytes: int = 0
    size: int = 0
    declare: bool = False
    dimension: int = 0
    body: Any = None
    interval: float = 0.0


@dataclass
class Recorded:
    """One request as the server saw it: the key is not kept (``key_ok`` says if it matched),
    ``headers`` are the other request headers, ``body`` the parsed JSON (raw bytes of object
    PUTs are not kept), ``bytes_sent`` counts the answer's body bytes written."""

    method: str
    route: str
    query: dict[str, str]
    body: Any
    key_ok: bool
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 0
    bytes_sent: int = 0
    faults: list[str] = field(default_factory=list)


@dataclass
class StoredObject:
    data: bytes
    checksum: str
    content_type: str | None
    metadata: dict[str, str]


class DifyTestServer(LoopbackServerMixin):
    """The server and its state; see the module docstring. Thread-safe."""

    def __init__(
        self,
        *,
        api_key: str = TEST_INNER_KEY,
        dimension: int = 64,
        max_object_bytes: int = 64 * 1024 * 1024,
        embedder: str = "hash",
    ) -> None:
        if embedder not in ("hash", "local"):
            raise ValueError(f"embedder must be 'hash' or 'local', not {embedder!r}")
        self.api_key = api_key
        self.embedder = embedder
        self.dimension = LOCAL_DIMENSION if embedder == "local" else dimension
        self.scale = 1.0
        self.max_object_bytes = max_object_bytes
        self.storage_healthy = True
        self.credentials = {"cred-drive-ok": True, "cred-notion-ok": True, "cred-expired": False}
        self.objects: dict[str, StoredObject] = {}
        self.bridge = BridgeStore()
        self.requests: list[Recorded] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._faults: list[Fault] = []
        # A scripted LLM: called with each /llm request body (dict), returns the answer text
        # (streamed in three frames) or None for the fixed answer. Raising fails the request 500.
        self.llm_responder: Any = None
        # A scripted reranker: called with each /rerank request body (dict), returns one score
        # per document of body["docs"] (in their order) or None for the word-overlap scores.
        # Raising fails the request 500.
        self.rerank_responder: Any = None
        self._in_flight: dict[str, int] = defaultdict(int)
        self._connections: set[socket.socket] = set()
        self._peak: dict[str, int] = defaultdict(int)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> DifyTestServer:
        server = self

        class Handler(_Handler):
            dify = server

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address) -> None:  # noqa: ANN001
                if not server.stopping.is_set():  # connections cut by stop() are expected
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

    # -- faults --------------------------------------------------------------------------------

    def add_fault(self, kind: str, route: str | None = None, **options: Any) -> Fault:
        fault = Fault(kind=kind, route=route, **options)
        with self.lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self.lock:
            self._faults.clear()

    def fail_next(self, n: int, *, status: int = 503, route: str | None = None) -> Fault:
        return self.add_fault("status", route, times=n, status=status)

    def delay(self, seconds: float, *, route: str | None = None, times: int | None = 1) -> Fault:
        return self.add_fault("delay", route, times=times, seconds=seconds)

    def _take_faults(self, route: str) -> list[Fault]:
        taken = []
        with self.lock:
            for fault in list(self._faults):
                if fault.route is not None and fault.route != route:
                    continue
                if fault.skip > 0:
                    fault.skip -= 1
                    continue
                taken.append(fault)
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
        return taken

    # -- observations --------------------------------------------------------------------------

    def calls(self, route: str) -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests if r.route == route]

    def count(self, route: str) -> int:
        return len(self.calls(route))

    def in_flight(self, route: str) -> int:
        with self.lock:
            return self._in_flight[route]

    def peak_in_flight(self, route: str) -> int:
        with self.lock:
            return self._peak[route]

    def reset_observations(self) -> None:
        with self.lock:
            self.requests.clear()
            self._peak.clear()

    def _enter(self, route: str) -> None:
        with self.lock:
            self._in_flight[route] += 1
            self._peak[route] = max(self._peak[route], self._in_flight[route])

    def _leave(self, route: str) -> None:
        with self.lock:
            self._in_flight[route] -= 1

    # -- model behaviour -----------------------------------------------------------------------

    def embed(self, texts: list[str], dimension: int) -> list[list[float]]:
        if self.embedder == "local" and dimension == LOCAL_DIMENSION:
            vectors = _local_onnx().embed_documents(list(texts))
            return [[float(v) * self.scale for v in row] for row in vectors]
        return [[v * self.scale for v in hashed_embedding(t, dimension)] for t in texts]


LOCAL_DIMENSION = 384
_local_lock = threading.Lock()
_local_model: Any = None


def _local_onnx() -> Any:
    """One LocalOnnxEmbedding per process, built on first use (the server's own instance)."""
    global _local_model
    with _local_lock:
        if _local_model is None:
            from knowledgefs.runtime.local_embedding import LocalOnnxEmbedding

            _local_model = LocalOnnxEmbedding()
        return _local_model


class _Abort(Exception):
    """The handler cut the connection on purpose."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    dify: DifyTestServer

    def setup(self) -> None:
        super().setup()
        with self.dify.lock:
            self.dify._connections.add(self.connection)

    def finish(self) -> None:
        with self.dify.lock:
            self.dify._connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    # Every method goes through one dispatcher.
    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        parts = urlsplit(self.path)
        route = parts.path
        query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        key_ok = self.headers.get("X-Inner-Api-Key") == self.dify.api_key
        headers = {k: v for k, v in self.headers.items() if k.lower() != "x-inner-api-key"}
        record = Recorded(self.command, route, query, None, key_ok, headers)
        self._record = record
        self._faults = self.dify._take_faults(route)
        record.faults = [f.kind for f in self._faults]
        self.dify._enter(route)
        try:
            with self.dify.lock:
                self.dify.requests.append(record)
            raw = self._read_body(route)
            if raw is not None and route != OBJECT:
                try:
                    record.body = json.loads(raw) if raw else None
                except ValueError:
                    record.body = raw
            for fault in self._faults:
                if fault.kind == "delay":
                    self.dify.stopping.wait(fault.seconds)
            if raw is None:
                return None  # _read_body answered already (413)
            if not key_ok:
                return self._json(401, {"code": "unauthorized", "message": "inner key refused"})
            for fault in self._faults:
                if fault.kind == "status":
                    return self._json(fault.status, {"code": "fault", "message": "injected"})
                if fault.kind == "json":
                    return self._json(fault.status, fault.body)
                if fault.kind == "envelope":
                    return self._json(200, {"data": None, "error": fault.message})
                if fault.kind == "oversize":
                    return self._oversize(fault)
            handler = {
                TEXT_EMBEDDING: self._text_embedding,
                MULTIMODAL_EMBEDDING: self._multimodal_embedding,
                RERANK: self._rerank,
                LLM: self._llm,
                MODEL_CATALOG: self._catalog,
                DATASOURCE: self._datasource,
                OBJECT: self._object,
                OBJECT_METADATA: self._object_metadata,
                OBJECTS: self._objects,
                STORAGE_HEALTH: self._storage_health,
                VECTORS: self._bridge,
                TEXTS: self._bridge,
            }.get(route)
            if handler is None:
                return self._json(404, {"code": "not_found", "message": route})
            return handler(query, raw)
        except _Abort:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            self.dify._leave(route)

    # -- I/O -----------------------------------------------------------------------------------

    def _read_body(self, route: str) -> bytes | None:
        length = int(self.headers.get("Content-Length") or 0)
        if route == OBJECT and self.command == "PUT" and length > self.dify.max_object_bytes:
            self.close_connection = True
            self._json(413, {"code": "knowledge_fs_object_too_large", "message": "too large"})
            return None
        return self.rfile.read(length) if length else b""

    def _write(self, data: bytes) -> None:
        """Write body bytes, applying stall and drop faults; counts what was sent."""
        record = self._record
        for fault in self._faults:
            if fault.kind == "trickle" and record.bytes_sent < fault.after_bytes:
                while data and record.bytes_sent < fault.after_bytes:
                    self.wfile.write(data[:1])
                    self.wfile.flush()
                    record.bytes_sent += 1
                    data = data[1:]
                    if self.dify.stopping.wait(fault.interval):
                        raise _Abort
                if record.bytes_sent >= fault.after_bytes:
                    self.dify.stopping.wait(fault.seconds)
            if fault.kind in ("stall", "drop") and fault.after_bytes >= record.bytes_sent:
                cut = fault.after_bytes - record.bytes_sent
                if cut < len(data):
                    self.wfile.write(data[:cut])
                    self.wfile.flush()
                    record.bytes_sent += cut
                    data = data[cut:]
                    if fault.kind == "drop":
                        self.connection.shutdown(socket.SHUT_RDWR)
                        raise _Abort
                    fault.after_bytes = -1  # stall once
                    self.dify.stopping.wait(fault.seconds)
        self.wfile.write(data)
        self.wfile.flush()
        record.bytes_sent += len(data)

    def _start(self, status: int, headers: dict[str, str]) -> None:
        self._record.status = status
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _json(self, status: int, value: Any) -> None:
        body = json.dumps(value).encode()
        self._start(status, {"Content-Type": "application/json", "Content-Length": str(len(body))})
        self._write(body)

    def _chunked(self, status: int, pieces, content_type: str) -> None:  # noqa: ANN001
        self._start(status, {"Content-Type": content_type, "Transfer-Encoding": "chunked"})
        for piece in pieces:
            if piece:
                self._write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        self._write(b"0\r\n\r\n")

    def _oversize(self, fault: Fault) -> None:
        prefix = b'{"data": {"embeddings": [['
        filler = b"0.125, " * 9362  # 64 KiB pieces
        if fault.declare:
            self._start(
                200, {"Content-Type": "application/json", "Content-Length": str(fault.size)}
            )
        else:
            self._start(200, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        sent = 0
        piece = prefix
        while sent < fault.size and not self.dify.stopping.is_set():
            piece = piece[: fault.size - sent]
            self._write(
                piece if fault.declare else f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
            )
            sent += len(piece)
            piece = filler
        if not fault.declare:
            self._write(b"0\r\n\r\n")

    def _fault(self, kind: str) -> Fault | None:
        return next((f for f in self._faults if f.kind == kind), None)

    # -- models --------------------------------------------------------------------------------

    def _model_request(self, raw: bytes, model_type: str) -> dict | None:
        body = json.loads(raw)
        problems = []
        if not isinstance(body.get("tenant_id"), str) or not body["tenant_id"]:
            problems.append("tenant_id")
        if body.get("user_id") != "knowledge-fs":
            problems.append("user_id")
        if model_type != "catalog":
            if not _PROVIDER.match(str(body.get("provider", ""))):
                problems.append("provider")
            if not body.get("model"):
                problems.append("model")
            if body.get("model_type") != model_type:
                problems.append("model_type")
        if problems:
            self._json(400, {"code": "invalid_request", "message": ", ".join(problems)})
            return None
        return body

    def _vectors(self, texts: list[str]) -> list[list[float]]:
        wrong = self._fault("dimension")
        return self.dify.embed(texts, wrong.dimension if wrong else self.dify.dimension)

    def _text_embedding(self, query: dict, raw: bytes) -> None:
        body = self._model_request(raw, "text-embedding")
        if body is None:
            return
        texts = body.get("texts")
        if body.get("input_type") not in ("document", "query") or not texts:
            return self._json(400, {"code": "invalid_request", "message": "texts/input_type"})
        data = {"model": body["model"], "embeddings": self._vectors(texts), "usage": {"tokens": 1}}
        self._json(200, {"data": data, "error": ""})

    def _multimodal_embedding(self, query: dict, raw: bytes) -> None:
        body = self._model_request(raw, "text-embedding")
        if body is None:
            return
        documents = body.get("documents") or []
        texts = [base64.b64decode(d["content"]).decode("latin-1") for d in documents]
        data = {"model": body["model"], "embeddings": self._vectors(texts), "usage": {"tokens": 1}}
        self._json(200, {"data": data, "error": ""})

    def _rerank(self, query: dict, raw: bytes) -> None:
        body = self._model_request(raw, "rerank")
        if body is None:
            return
        docs = body["docs"]
        scores = [overlap_score(body["query"], d) for d in docs]
        if self.dify.rerank_responder is not None:
            try:
                scripted = self.dify.rerank_responder(body)
            except Exception as exc:  # noqa: BLE001 - a scripted failure
                return self._json(500, {"code": "scripted_failure", "message": str(exc)})
            if scripted is not None:
                scores = list(scripted)
        scored = [{"index": i, "text": d, "score": scores[i]} for i, d in enumerate(docs)]
        threshold = body.get("score_threshold")
        if threshold is not None:
            scored = [s for s in scored if s["score"] >= threshold]
        scored.sort(key=lambda s: -s["score"])
        if body.get("top_n"):
            scored = scored[: body["top_n"]]
        self._json(200, {"data": {"model": body["model"], "docs": scored}, "error": ""})

    def _llm(self, query: dict, raw: bytes) -> None:
        body = self._model_request(raw, "llm")
        if body is None:
            return
        if body.get("stream") is not True or body.get("mode") != "chat":
            return self._json(400, {"code": "invalid_request", "message": "stream/mode"})
        answer = LLM_ANSWER
        if self.dify.llm_responder is not None:
            try:
                text = self.dify.llm_responder(body)
            except Exception as exc:  # noqa: BLE001 - a scripted failure
                return self._json(500, {"code": "scripted_failure", "message": str(exc)})
            if text is not None:
                third = max(len(text) // 3, 1)
                answer = [text[:third], text[third : 2 * third], text[2 * third :]]
        frames = [
            envelope_frame({"delta": {"index": i, "message": {"content": text}}})
            for i, text in enumerate(answer)
        ]
        frames[-1] = envelope_frame(
            {
                "delta": {
                    "index": len(answer) - 1,
                    "message": {"content": answer[-1]},
                    "finish_reason": "stop",
                    "usage": {"prompt_tokens": 12, "completion_tokens": 9},
                }
            }
        )
        if self._fault("truncate"):
            frames = [frames[0], frames[1][: len(frames[1]) // 2]]
        error = self._fault("frame_error")
        if error:
            frames = [frames[0], envelope_frame(None, error.message)]
        # Frames split at awkward places, each piece flushed: the client must reassemble them.
        stream = b"".join(frames)
        pieces = [stream[i : i + 7] for i in range(0, 21, 7)] + [stream[21:40], stream[40:]]
        self._chunked(200, pieces, "text/event-stream")

    def _catalog(self, query: dict, raw: bytes) -> None:
        body = self._model_request(raw, "catalog")
        if body is None:
            return
        items = [
            {**item, "capabilities": {"model_properties": {"context_size": 8192}},
             "plugin_unique_identifier": f"{item['plugin_id']}:1.0.0@sha256:abc"}
            for item in CATALOG
            if item["model_type"] == body.get("model_type")
            and (not body.get("provider")
                 or f"{item['plugin_id']}/{item['provider']}" == body["provider"])
            and (not body.get("model") or item["model"] == body["model"])
        ]  # fmt: skip
        limit, offset = int(body.get("limit", 100)), int(body.get("offset", 0))
        if not 1 <= limit <= 100:
            return self._json(400, {"code": "invalid_request", "message": "limit"})
        page = items[offset : offset + limit]
        next_offset = offset + limit if offset + limit < len(items) else None
        self._json(200, {"data": {"items": page, "next_offset": next_offset}, "error": ""})

    # -- datasources ---------------------------------------------------------------------------

    def _datasource(self, query: dict, raw: bytes) -> None:
        body = json.loads(raw)
        credential = body.get("credential_id")
        if set(body) - {
            "tenant_id",
            "user_id",
            "provider",
            "datasource",
            "datasource_type",
            "operation",
            "credential_id",
            "request",
            "datasource_parameters",
            "page",
        }:
            return self._json(400, {"code": "invalid_request", "message": "unknown field"})
        if credential not in self.dify.credentials:
            frames = [envelope_frame(None, f"credential {credential} not found")]
        elif body["operation"] == "validate_credentials":
            frames = [envelope_frame({"result": self.dify.credentials[credential]})]
        elif body["operation"] == "online_drive_browse_files":
            request = body["request"]
            start = int((request.get("next_page_parameters") or {}).get("offset", 0))
            names = [n for n in DRIVE_FILES if n.startswith(request.get("prefix", ""))]
            page = names[start : start + request["max_keys"]]
            more = start + request["max_keys"] < len(names)
            result = {
                "bucket": request.get("bucket") or "",
                "files": [{"id": f"id-{n}", "name": n, "size": 1000, "type": "file"} for n in page],
                "is_truncated": more,
                "next_page_parameters": {"offset": start + len(page)} if more else None,
            }
            frames = [envelope_frame({"result": [result]})]
        elif body["operation"] == "get_online_document_pages":
            pages = [
                {"page_id": p, "page_name": p.title(), "type": "page", "parent_id": None}
                for p in NOTION_PAGES
            ]
            frames = [
                envelope_frame(
                    {
                        "result": [
                            {
                                "workspace_id": "ws-1",
                                "workspace_name": "Acme",
                                "total": len(pages),
                                "pages": pages,
                            }
                        ]
                    }
                )
            ]
        else:
            frames = [envelope_frame(None, f"operation {body['operation']} not served")]
        self._chunked(200, frames, "text/event-stream")

    # -- storage -------------------------------------------------------------------------------

    def _valid_key(self, key: str | None) -> bool:
        return bool(
            key
            and not key.startswith("/")
            and "\\" not in key
            and "\x00" not in key
            and all(s not in ("", ".", "..") for s in key.split("/"))
            and len(key.encode()) <= 1024
        )

    def _info(self, key: str, obj: StoredObject) -> dict:
        return {
            "key": key,
            "sizeBytes": len(obj.data),
            "contentType": obj.content_type,
            "checksumSha256Base64": obj.checksum,
            "metadata": obj.metadata,
        }

    def _object(self, query: dict, raw: bytes) -> None:
        key = query.get("key")
        if not self._valid_key(key):
            return self._json(400, {"code": "invalid_request", "message": "key"})
        if self.command == "PUT":
            return self._put(key, raw)
        with self.dify.lock:
            obj = self.dify.objects.get(key)
        if self.command == "DELETE":
            with self.dify.lock:
                self.dify.objects.pop(key, None)
            self._record.status = 204
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if obj is None:
            return self._json(404, {"code": "not_found", "message": "no such object"})
        stored = "A" * 43 + "=" if self._fault("bad_checksum") else obj.checksum
        self._start(
            200,
            {
                "Content-Type": obj.content_type or "application/octet-stream",
                "Content-Length": str(len(obj.data)),
                "X-Knowledge-FS-Checksum-Sha256": stored,
            },
        )
        for start in range(0, len(obj.data), 65536):
            self._write(obj.data[start : start + 65536])

    def _put(self, key: str, raw: bytes) -> None:
        if self._fault("corrupt_upload") and raw:
            raw = bytes([raw[0] ^ 0xFF]) + raw[1:]
        expected = self.headers.get("X-Knowledge-FS-Checksum-Sha256")
        if expected is not None and expected != checksum(raw):
            return self._json(422, {"code": "knowledge_fs_object_checksum_mismatch"})
        encoded = self.headers.get("X-Knowledge-FS-Metadata")
        try:
            metadata = (
                json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
                if encoded
                else {}
            )
        except ValueError:
            return self._json(400, {"code": "invalid_request", "message": "metadata"})
        obj = StoredObject(
            raw, checksum(raw), self.headers.get("X-Knowledge-FS-Content-Type"), metadata
        )
        with self.dify.lock:
            self.dify.objects[key] = obj
        self._json(200, self._info(key, obj))

    def _object_metadata(self, query: dict, raw: bytes) -> None:
        key = query.get("key")
        with self.dify.lock:
            obj = self.dify.objects.get(key or "")
        if obj is None:
            return self._json(404, {"code": "not_found", "message": "no such object"})
        self._json(200, self._info(key, obj))

    def _objects(self, query: dict, raw: bytes) -> None:
        prefix, cursor = query.get("prefix", ""), query.get("cursor")
        limit = int(query.get("limit", 100))
        if not 1 <= limit <= 100:
            return self._json(400, {"code": "invalid_request", "message": "limit"})
        with self.dify.lock:
            keys = sorted(
                k for k in self.dify.objects if k.startswith(prefix) and (not cursor or k > cursor)
            )
            page = [(k, self.dify.objects[k]) for k in keys[:limit]]
        next_cursor = page[-1][0] if len(keys) > limit else None
        self._json(200, {"objects": [self._info(k, o) for k, o in page], "nextCursor": next_cursor})

    def _storage_health(self, query: dict, raw: bytes) -> None:
        if self.dify.storage_healthy:
            return self._json(200, {"ok": True})
        self._json(503, {"ok": False})

    # -- the vector and text bridge ------------------------------------------------------------

    def _bridge(self, query: dict, raw: bytes) -> None:
        bridge = self.dify.bridge
        if self.command != "POST":
            return self._json(405, {"code": "method_not_allowed", "message": self.command})
        if len(raw) > BridgeStore.MAX_BODY_BYTES:
            return self._json(413, {"code": "request_too_large", "message": "body over 32 MiB"})
        if bridge.unavailable:
            self._record.status = 503
            body = json.dumps({"code": "unavailable", "message": "being provisioned"}).encode()
            self.send_response(503)
            self.send_header("Retry-After", str(bridge.retry_after))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            return self._write(body)
        try:
            body = json.loads(raw)
        except ValueError:
            return self._json(400, {"code": "invalid_request", "message": "not JSON"})
        texts = self._record.route == TEXTS
        try:
            answer = bridge.execute(body, texts=texts)
        except BridgeRefusal as refusal:
            return self._json(refusal.status, {"code": refusal.code, "message": str(refusal)})
        self._json(200, answer)


class BridgeRefusal(Exception):
    """A bridge request refused: ``status`` (400 invalid, 413 quota, 503 missing collection)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_HASH = re.compile(r"^[0-9a-f]{64}$")


class BridgeStore:
    """Dify's knowledge-fs vectors and texts routes in memory, per the contract (inventory
    7.2-7.3): a collection per scope, created on the first upsert; ≤ 64 points per upsert and
    per get, ≤ 2048 ids, limit 1..256, dimension 1..16384, UUID ids, unique ids, vectors of the
    scope's dimension, finite and non-zero, texts checked against their SHA-256, queries
    ≤ 8192 characters; anything else is 400. Search: cosine (vectors) or BM25 over the whole
    collection (texts: :meth:`_text_search`), only among the ids sent; a search of a missing
    collection is 503. Delete removes, then checks the ids are gone.

    Switches: ``unavailable`` (every request 503 with ``Retry-After: retry_after``),
    ``quota_points`` (an upsert that would take a tenant's vector points past it is 413
    ``vector_space_quota_exceeded``). :meth:`points` and :meth:`collections` show the state.
    """

    MAX_BODY_BYTES = 32 * 1024 * 1024
    KINDS = ("dense", "visual", "graph-entity", "graph-relation")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.vectors: dict[str, dict[str, dict]] = {}  # collection → id → point
        self.texts: dict[str, dict[str, dict]] = {}
        self.scopes: dict[str, dict] = {}  # collection → its scope
        self.unavailable = False
        self.retry_after = 1
        self.quota_points: int | None = None

    # -- observations --------------------------------------------------------------------------

    def collections(self, *, texts: bool = False) -> dict[str, dict]:
        """Collection name → scope, for the vector (or text) collections that exist."""
        with self.lock:
            names = self.texts if texts else self.vectors
            return {name: self.scopes[name] for name in names}

    def points(self, *, texts: bool = False, space_id: str | None = None) -> dict[str, dict]:
        """Every stored point by id (of one knowledge space when ``space_id``)."""
        with self.lock:
            store = self.texts if texts else self.vectors
            return {
                pid: dict(point)
                for name, points in store.items()
                if space_id is None or self.scopes[name]["knowledge_space_id"] == space_id
                for pid, point in points.items()
            }

    # -- requests ------------------------------------------------------------------------------

    def execute(self, body: Any, *, texts: bool) -> dict:
        request = self._validate(body, texts=texts)
        name = self._collection(request["scope"], texts)
        with self.lock:
            store = self.texts if texts else self.vectors
            operation = request["operation"]
            if operation == "upsert":
                if not texts:
                    self._admit(request)
                self.scopes[name] = request["scope"]
                collection = store.setdefault(name, {})
                for point in request["points"]:
                    collection[point["id"].lower()] = dict(point, id=point["id"].lower())
                return {"points": [], "matches": []}
            collection = store.get(name)
            ids = [i.lower() for i in request["ids"]]
            if operation == "search":
                if collection is None:
                    raise BridgeRefusal(503, "unavailable", "collection is missing")
                matches = self._text_search if texts else self._vector_search
                return {"points": [], "matches": matches(collection, request, ids)}
            if collection is None:
                return {"points": [], "matches": []}
            if operation == "get":
                return {"points": [collection[i] for i in ids if i in collection], "matches": []}
            for i in ids:
                collection.pop(i, None)
            if any(i in collection for i in ids):  # delete verifies invisibility
                raise BridgeRefusal(503, "unavailable", "deletion not yet visible")
            return {"points": [], "matches": []}

    def _admit(self, request: dict) -> None:
        if self.quota_points is None:
            return
        tenant = request["scope"]["tenant_id"]
        held = {
            (name, pid)
            for name, points in self.vectors.items()
            if self.scopes[name]["tenant_id"] == tenant
            for pid in points
        }
        name = self._collection(request["scope"], False)
        new = {(name, p["id"].lower()) for p in request["points"]} - held
        if len(held) + len(new) > self.quota_points:
            raise BridgeRefusal(413, "vector_space_quota_exceeded", "vector-space quota exceeded")

    @staticmethod
    def _collection(scope: dict, texts: bool) -> str:
        identity = json.dumps(scope, sort_keys=True, separators=(",", ":"))
        prefix = "knowledgefs_v1_fts_" if texts else "knowledgefs_v1_"
        return prefix + hashlib.sha256(identity.encode()).hexdigest()[:32]

    # -- validation (400 for anything the contract refuses) ------------------------------------

    def _validate(self, body: Any, *, texts: bool) -> dict:
        def refuse(message: str) -> BridgeRefusal:
            return BridgeRefusal(400, "invalid_request", message)

        allowed = {"operation", "scope", "points", "ids", "limit"}
        allowed |= {"query"} if texts else {"query_vector"}
        if not isinstance(body, dict) or set(body) - allowed:
            raise refuse("unknown field")
        operation = body.get("operation")
        if operation not in ("upsert", "get", "search", "delete"):
            raise refuse("operation")
        scope = self._scope(body.get("scope"), texts, refuse)
        points, ids = body.get("points", []), body.get("ids", [])
        limit = body.get("limit", 10)
        if not isinstance(points, list) or len(points) > 64:
            raise refuse("points: at most 64")
        if not isinstance(ids, list) or len(ids) > 2048:
            raise refuse("ids: at most 2048")
        if not isinstance(limit, int) or not 1 <= limit <= 256:
            raise refuse("limit: 1..256")
        if operation == "upsert":
            if not points or ids or body.get("query") or body.get("query_vector"):
                raise refuse("upsert takes points only")
            for point in points:
                self._point(point, scope, texts, refuse)
            if len({p["id"].lower() for p in points}) != len(points):
                raise refuse("duplicate point ids")
        else:
            if not ids or points or len({str(i).lower() for i in ids}) != len(ids):
                raise refuse("a bounded set of unique ids is required")
            if not all(isinstance(i, str) and _UUID.match(i) for i in ids):
                raise refuse("ids must be UUIDs")
            if operation == "get" and len(ids) > 64:
                raise refuse("get: at most 64 ids")
            if operation == "search" and texts:
                query = body.get("query", "")
                if not isinstance(query, str) or not query.strip() or len(query) > 8192:
                    raise refuse("query: 1..8192 characters")
            elif operation == "search":
                self._vector(body.get("query_vector"), scope["dimension"], refuse)
            elif body.get("query") or body.get("query_vector"):
                raise refuse("get and delete take ids only")
        return {**body, "scope": scope, "points": points, "ids": ids, "limit": limit}

    def _scope(self, scope: Any, texts: bool, refuse) -> dict:  # noqa: ANN001
        keys = {"tenant_id", "knowledge_space_id"}
        keys |= {"index_version"} if texts else {"vector_space_id", "kind", "dimension"}
        if not isinstance(scope, dict) or set(scope) != keys:
            raise refuse("scope fields")
        for key in ("tenant_id", "knowledge_space_id"):
            if not isinstance(scope[key], str) or not _UUID.match(scope[key]):
                raise refuse(f"scope.{key} must be a UUID")
        name = "index_version" if texts else "vector_space_id"
        if not isinstance(scope[name], str) or not 1 <= len(scope[name]) <= 256:
            raise refuse(f"scope.{name}: 1..256 characters")
        if not texts:
            if scope["kind"] not in self.KINDS:
                raise refuse("scope.kind")
            dimension = scope["dimension"]
            if isinstance(dimension, bool) or not isinstance(dimension, int):
                raise refuse("scope.dimension")
            if not 1 <= dimension <= 16384:
                raise refuse("scope.dimension: 1..16384")
        return {k: (v.lower() if k.endswith("_id") and k != "vector_space_id" else v)
                for k, v in scope.items()}  # fmt: skip

    def _point(self, point: Any, scope: dict, texts: bool, refuse) -> None:  # noqa: ANN001
        keys = {"id", "generation_id", "content_hash", "text" if texts else "vector"}
        if not isinstance(point, dict) or set(point) != keys:
            raise refuse("point fields")
        if not all(isinstance(point[k], str) and _UUID.match(point[k])
                   for k in ("id", "generation_id")):  # fmt: skip
            raise refuse("point ids must be UUIDs")
        if not isinstance(point["content_hash"], str) or not _HASH.match(point["content_hash"]):
            raise refuse("content_hash")
        if texts:
            text = point["text"]
            if not isinstance(text, str) or not text.strip() or len(text.encode()) > 1 << 20:
                raise refuse("text: not blank, at most 1 MiB")
            if hashlib.sha256(text.encode()).hexdigest() != point["content_hash"]:
                raise refuse("full-text checksum mismatch")
        else:
            self._vector(point["vector"], scope["dimension"], refuse)

    @staticmethod
    def _vector(vector: Any, dimension: int, refuse) -> None:  # noqa: ANN001
        if not isinstance(vector, list) or len(vector) != dimension:
            raise refuse("vector dimension")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in vector):
            raise refuse("vector values")
        if not all(math.isfinite(v) for v in vector) or not any(vector):
            raise refuse("vector must be finite and non-zero")
        if max(abs(v) for v in vector) > 1e10:
            raise refuse("vector magnitude")

    # -- search --------------------------------------------------------------------------------

    @staticmethod
    def _vector_search(collection: dict, request: dict, ids: list[str]) -> list[dict]:
        query = request["query_vector"]
        query_norm = math.sqrt(sum(v * v for v in query))
        scored = []
        for pid in ids:
            point = collection.get(pid)
            if point is None:
                continue
            vector = point["vector"]
            norm = math.sqrt(sum(v * v for v in vector))
            score = sum(a * b for a, b in zip(query, vector, strict=True)) / (norm * query_norm)
            scored.append({"id": pid, "score": score})
        scored.sort(key=lambda m: -m["score"])
        return scored[: request["limit"]]

    @staticmethod
    def _text_search(collection: dict, request: dict, ids: list[str]) -> list[dict]:
        """BM25 as Elasticsearch ranks English text (k1 1.2, b 0.75, stemmed words), computed by
        an in-memory SQLite FTS5 table (Porter stemming) over the whole collection, so two
        requests on one collection have comparable scores; the words of the query are OR-ed."""
        words = list(dict.fromkeys(_WORD.findall(request["query"].lower())))
        if not words:
            return []
        match = "text : (" + " OR ".join('"' + w.replace('"', '""') + '"' for w in words) + ")"
        db = sqlite3.connect(":memory:")
        try:
            db.execute(
                "CREATE VIRTUAL TABLE t USING fts5(text, id UNINDEXED, "
                "tokenize = 'porter unicode61 remove_diacritics 2')"
            )
            db.executemany(
                "INSERT INTO t (text, id) VALUES (?, ?)",
                [(p["text"], pid) for pid, p in collection.items()],
            )
            db.execute("CREATE TEMP TABLE allowed (id TEXT PRIMARY KEY)")
            db.executemany("INSERT OR IGNORE INTO allowed VALUES (?)", [(i,) for i in ids])
            rows = db.execute(
                "SELECT id, rank FROM t WHERE t MATCH ? AND id IN (SELECT id FROM allowed) "
                "ORDER BY rank LIMIT ?",
                (match, request["limit"]),
            ).fetchall()
        finally:
            db.close()
        return [{"id": pid, "score": -float(rank)} for pid, rank in rows]


def wait_until(predicate, timeout: float = 5.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
