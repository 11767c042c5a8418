"""A local stand-in for Dify's inner API, implementing the contract the clients in
``knowledgefs/dify`` speak (docs/dify-boundary.md), with faults a test can switch on.

Stdlib only: ``ThreadingHTTPServer`` on 127.0.0.1, port 0, HTTP/1.1 with keep-alive. Every
request must carry ``X-Inner-Api-Key`` (401 otherwise).

- ``/inner/api/invoke/text-embedding`` and ``…/multimodal-embedding``: a seeded bag-of-words
  hashing embedder (each lower-cased word adds ±1 to one of ``dimension`` buckets), L2-normalised
  then multiplied by ``scale``, so texts that share words are near and retrieval on real text
  works (or the answer a test's :attr:`DifyTestServer.embedding_responder` scripts: a token
  limit, a rate limit, a refused key); or, with ``embedder="local"``, the local
  all-MiniLM-L6-v2 ONNX model (384 dimensions), one of the local models KnowledgeFS embeds with
  under ``KNOWLEDGE_MODEL_RUNTIME=local``, so a run through this server can be compared with a
  local run on that model;
- ``…/rerank``: the share of the query's words found in each document, or the scores a test's
  :attr:`DifyTestServer.rerank_responder` returns for the request body (a scripted reranker);
- ``…/llm``: a fixed answer in three length-prefixed frames, or the text a test's
  :attr:`DifyTestServer.llm_responder` returns for the request body (a scripted model), or the
  list of deltas it returns, one frame each, :attr:`DifyTestServer.llm_frame_gap` seconds apart;
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

import socket
import threading
from collections import defaultdict
from http.server import ThreadingHTTPServer
from typing import Any

from knowledgefs.testing.loopback_server import LoopbackServerMixin

# The contract's names, as the tests import them from this module.
from .dify_bridge import BridgeRefusal, BridgeStore  # noqa: F401
from .dify_contract import (  # noqa: F401
    _WORD,
    CATALOG,
    DATASOURCE,
    LLM,
    LLM_ANSWER,
    LOCAL_DIMENSION,
    MODEL_CATALOG,
    MULTIMODAL_EMBEDDING,
    OBJECT,
    OBJECT_METADATA,
    OBJECTS,
    RERANK,
    STORAGE_HEALTH,
    TEST_INNER_KEY,
    TEXT_EMBEDDING,
    TEXTS,
    VECTORS,
    Fault,
    Recorded,
    StoredObject,
    _local_onnx,
    checksum,
    envelope_frame,
    frame,
    hashed_embedding,
    overlap_score,
    wait_until,
)
from .dify_handler import _Handler


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
        # The responder may instead return a list of strings: the deltas, one frame each, each
        # frame its own chunk, ``llm_frame_gap`` seconds apart (a model that streams slowly), or
        # a list: the gap before each frame after the first.
        self.llm_frame_gap: float | list[float] = 0.0
        # A scripted reranker: called with each /rerank request body (dict), returns one score
        # per document of body["docs"] (in their order) or None for the word-overlap scores.
        # Raising fails the request 500.
        self.rerank_responder: Any = None
        # A scripted embedding provider: called with each text-embedding request body (dict)
        # while the request counts as in flight; returns None to embed as usual, or
        # ``(status, json_body)`` / ``(status, json_body, headers)`` to answer that instead
        # (a token limit, a rate limit with Retry-After, a refused key).
        self.embedding_responder: Any = None
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
