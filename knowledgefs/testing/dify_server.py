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
  an LLM request with an image that asks for ``{caption, ocr_text, summary}`` (image
  understanding) gets that JSON, deterministic per picture (:func:`dify_images.describe_image`,
  :attr:`DifyTestServer.image_captions`); the fault ``malformed`` answers text that is no JSON;
- ``…/model-catalog``: a fixed catalog, paged by ``limit``/``offset``;
- ``/inner/api/knowledge-fs/storage/…``: objects in memory, SHA-256 checked (422), size-limited
  (413), listed in key order with a cursor;
- ``/inner/api/invoke/datasource``: fake connections by credential id, and the fake provider
  (:class:`~knowledgefs.testing.dify_datasource.FakeProvider`, :attr:`DifyTestServer.provider`)
  with every datasource operation, a 403 for another tenant's credential and oversized items;
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

import hashlib
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
from .dify_contract import (
    TEST_INNER_KEY as TEST_INNER_KEY,
)
from .dify_datasource import FakeProvider
from .dify_handler import _Handler
from .dify_images import ImageRefusal, decode_documents, image_vector


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
        # The fake datasource provider (pages, files, sites a test changes between syncs).
        self.provider = FakeProvider()
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
        # Images: the model identity the multimodal route answers with (None: the requested
        # model; another name stands for a route served by another model), catalog entries a
        # test changed (drift: ``{model: {"identity": …, "capabilities": {…}}}``), and what the
        # route received (images embedded, the largest raw bytes of one request).
        self.multimodal_identity: str | None = None
        self.catalog_overrides: dict[str, dict[str, Any]] = {}
        # "pixels" (the image embedder) or "digest" (a vector from the bytes' SHA-256, for
        # benchmarks that send large non-image payloads and measure the client, not the server).
        self.image_vectors = "pixels"
        self.images_embedded = 0
        # Image parts LLM requests carried (a vision answer's budget is counted here).
        self.llm_images_received = 0
        self.llm_image_bytes_received = 0
        # Query images Dify holds: {(tenant_id, upload_file_id): (bytes, MIME, subject | None)}.
        self.query_images: dict[tuple[str, str], tuple[bytes, str, str | None]] = {}
        # Image descriptions (a request asking for {caption, ocr_text, summary}): the vision
        # model answers the description of the nearest picture registered here ``[(image bytes,
        # {caption, ocr_text, summary})]``, else one derived from the image's size and colour
        # (dify_images.describe_image); ``image_descriptions`` counts the answers.
        self.image_captions: list[tuple[bytes, dict[str, Any]]] = []
        self.image_descriptions = 0
        self.peak_image_request_bytes = 0
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
            def handle_error(self, request: Any, client_address: Any) -> None:
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
            self.images_embedded = self.peak_image_request_bytes = 0
            self.llm_images_received = self.llm_image_bytes_received = 0
            self.image_descriptions = 0

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

    def embed_documents(
        self, body: dict[str, Any], wrong: Fault | None = None
    ) -> list[list[float]]:
        """The multimodal route: images by :func:`dify_images.image_vector` (bytes that are no
        image, as before, by the bag-of-words of their Latin-1 text), ``text`` documents as the
        text route; within the route's limits (ImageRefusal)."""
        documents = decode_documents(body.get("documents"))
        dimension = wrong.dimension if wrong else self.dimension
        with self.lock:
            self.images_embedded += sum(1 for kind, _ in documents if kind == "image")
            size = sum(len(raw) for _, raw in documents)
            self.peak_image_request_bytes = max(self.peak_image_request_bytes, size)
        vectors = []
        for kind, raw in documents:
            if kind == "image" and self.image_vectors == "digest":
                digest = hashlib.sha256(raw).hexdigest()
                vectors.append([v * self.scale for v in hashed_embedding(digest, dimension)])
            elif kind == "image":
                try:
                    vector = image_vector(raw, dimension)
                except ImageRefusal:
                    vector = hashed_embedding(raw.decode("latin-1"), dimension)
                vectors.append([v * self.scale for v in vector])
            else:
                vectors.extend(self.embed([raw.decode("utf-8", "replace")], dimension))
        return vectors

    @staticmethod
    def summarise_images(body: dict[str, Any]) -> dict[str, Any]:
        """A large request's body as recorded: each document's content replaced by its size."""
        if not isinstance(body, dict) or not isinstance(body.get("documents"), list):
            return body
        documents = [
            {**d, "content": f"<{len(d.get('content', ''))} base64 characters>"}
            if isinstance(d, dict) else d
            for d in body["documents"]
        ]  # fmt: skip
        return {**body, "documents": documents}

    def catalog_capabilities(self, item: dict[str, Any]) -> dict[str, Any]:
        override = self.catalog_overrides.get(item["model"], {})
        return dict(override.get("capabilities", item.get("capabilities", {})))

    def catalog_identity(self, item: dict[str, Any]) -> str:
        override = self.catalog_overrides.get(item["model"], {})
        identity: str = override.get("identity", f"{item['plugin_id']}:1.0.0@sha256:abc")
        return identity

    def count_llm_images(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Count the image parts of an LLM request; a model the catalog does not mark vision
        refuses them (the error body), as Dify does."""
        parts = [
            part
            for message in body.get("prompt_messages") or []
            if isinstance(message.get("content"), list)
            for part in message["content"]
            if isinstance(part, dict) and part.get("type") == "image"
        ]
        if not parts:
            return None
        item = next((c for c in CATALOG if c["model"] == body.get("model")), {})
        if "vision" not in self.catalog_capabilities(item).get("features", []):
            return {"code": "invalid_request", "message": f"{body.get('model')} takes no images"}
        with self.lock:
            self.llm_images_received += len(parts)
            self.llm_image_bytes_received += sum(
                len(p.get("base64_data", "")) * 3 // 4 for p in parts
            )
        return None
