"""The request handler of the simulated Dify inner API: one method per route family."""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, TypeGuard
from urllib.parse import parse_qs, urlsplit

from .dify_bridge import BridgeRefusal, BridgeStore
from .dify_contract import (
    _PROVIDER,
    CATALOG,
    DATASOURCE,
    DRIVE_FILES,
    LLM,
    LLM_ANSWER,
    MODEL_CATALOG,
    MULTIMODAL_EMBEDDING,
    NOTION_PAGES,
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
    checksum,
    envelope_frame,
    overlap_score,
)
from .dify_images import QUERY_IMAGE, ImageRefusal, describe_request, serve_query_image

if TYPE_CHECKING:
    from .dify_server import DifyTestServer


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
                if route == MULTIMODAL_EMBEDDING and len(raw) > 1024 * 1024:
                    record.body = self.dify.summarise_images(record.body)
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
                if fault.kind == "echo":  # an error naming the credentials it was sent
                    sent = ", ".join(
                        f"{name}: {self.headers.get(name)}"
                        for name in ("X-Inner-Api-Key", "Authorization")
                        if self.headers.get(name)
                    )
                    message = f"credentials refused ({sent})"
                    if fault.status == 200:
                        return self._json(200, {"data": None, "error": message})
                    return self._json(fault.status, {"code": "unauthorized", "message": message})
                if fault.kind == "oversize":
                    return self._oversize(fault)
            handlers: dict[str, Callable[[dict[str, Any], bytes], None]] = {
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
                QUERY_IMAGE: lambda q, r: serve_query_image(self, q),
            }
            handler = handlers.get(route)
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

    def _json(self, status: int, value: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(value).encode()
        self._start(
            status,
            {
                "Content-Type": "application/json",
                "Content-Length": str(len(body)),
                **(headers or {}),
            },
        )
        self._write(body)

    def _chunked(self, status: int, pieces: Iterable[bytes], content_type: str) -> None:
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

    def _model_request(self, raw: bytes, model_type: str) -> dict[str, Any] | None:
        body: dict[str, Any] = json.loads(raw)
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

    def _text_embedding(self, query: dict[str, Any], raw: bytes) -> None:
        body = self._model_request(raw, "text-embedding")
        if body is None:
            return
        texts = body.get("texts")
        if body.get("input_type") not in ("document", "query") or not texts:
            return self._json(400, {"code": "invalid_request", "message": "texts/input_type"})
        responder = self.dify.embedding_responder
        answer = responder(body) if responder is not None else None
        if answer is not None:  # a scripted provider: its status, body and headers
            status, value, *extra = answer
            return self._json(status, value, extra[0] if extra else None)
        data = {"model": body["model"], "embeddings": self._vectors(texts), "usage": {"tokens": 1}}
        self._json(200, {"data": data, "error": ""})

    def _multimodal_embedding(self, query: dict[str, Any], raw: bytes) -> None:
        body = self._model_request(raw, "text-embedding")
        if body is None:
            return
        try:
            vectors = self.dify.embed_documents(body, self._fault("dimension"))
        except ImageRefusal as refusal:
            return self._json(refusal.status, {"code": refusal.code, "message": refusal.message})
        identity = self.dify.multimodal_identity or body["model"]
        data = {"model": identity, "embeddings": vectors, "usage": {"tokens": 1}}
        self._json(200, {"data": data, "error": ""})

    def _rerank(self, query: dict[str, Any], raw: bytes) -> None:
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

    def _llm(self, query: dict[str, Any], raw: bytes) -> None:
        body = self._model_request(raw, "llm")
        if body is None:
            return
        if body.get("stream") is not True or body.get("mode") != "chat":
            return self._json(400, {"code": "invalid_request", "message": "stream/mode"})
        if (refusal := self.dify.count_llm_images(body)) is not None:
            return self._json(400, refusal)
        answer = LLM_ANSWER
        described = describe_request(body, self.dify)
        if described is not None:
            if self._fault("malformed"):
                described = 'Here is the description: {"caption": "a chart"'
            third = max(len(described) // 3, 1)
            answer = [described[:third], described[third : 2 * third], described[2 * third :]]
        if self.dify.llm_responder is not None:
            try:
                text = self.dify.llm_responder(body)
            except Exception as exc:  # noqa: BLE001 - a scripted failure
                return self._json(500, {"code": "scripted_failure", "message": str(exc)})
            if isinstance(text, list | tuple):
                return self._llm_deltas([str(t) for t in text])
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

    def _llm_deltas(self, deltas: list[str]) -> None:
        """Scripted deltas: one frame each, each frame flushed as its own chunk, the server's
        ``llm_frame_gap`` seconds apart (a list: the gap before each frame after the first); the
        last frame carries ``finish_reason`` and usage."""
        self._start(200, {"Content-Type": "text/event-stream", "Transfer-Encoding": "chunked"})
        for index, text in enumerate(deltas):
            delta = {"index": index, "message": {"content": text}}
            if index == len(deltas) - 1:
                delta |= {"finish_reason": "stop", "usage": {"prompt_tokens": 12,
                                                             "completion_tokens": 9}}  # fmt: skip
            gap = self.dify.llm_frame_gap
            if isinstance(gap, list | tuple):  # one gap per frame after the first
                gap = gap[index - 1] if 0 < index <= len(gap) else 0.0
            if index and gap and self.dify.stopping.wait(gap):
                return
            frame = envelope_frame({"delta": delta})
            self._write(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
            self.wfile.flush()
        self._write(b"0\r\n\r\n")

    def _catalog(self, query: dict[str, Any], raw: bytes) -> None:
        body = self._model_request(raw, "catalog")
        if body is None:
            return
        items = [
            {**item, "capabilities": {"model_properties": {"context_size": 8192},
                                      **self.dify.catalog_capabilities(item)},
             "plugin_unique_identifier": self.dify.catalog_identity(item)}
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

    def _datasource(self, query: dict[str, Any], raw: bytes) -> None:
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
        if self.dify.provider.serves(credential):
            status, answers = self.dify.provider.answer(body)
            if status != 200:
                return self._json(status, answers[0])
            frames = [
                envelope_frame(*a) if isinstance(a, list) else envelope_frame(a) for a in answers
            ]
        elif credential not in self.dify.credentials:
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

    def _valid_key(self, key: str | None) -> TypeGuard[str]:
        return bool(
            key
            and not key.startswith("/")
            and "\\" not in key
            and "\x00" not in key
            and all(s not in ("", ".", "..") for s in key.split("/"))
            and len(key.encode()) <= 1024
        )

    def _info(self, key: str, obj: StoredObject) -> dict[str, Any]:
        return {
            "key": key,
            "sizeBytes": len(obj.data),
            "contentType": obj.content_type,
            "checksumSha256Base64": obj.checksum,
            "metadata": obj.metadata,
        }

    def _object(self, query: dict[str, Any], raw: bytes) -> None:
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
        late = self._fault("late_ack")
        if late is not None:
            self.dify.stopping.wait(late.seconds)
        self._json(200, self._info(key, obj))

    def _object_metadata(self, query: dict[str, Any], raw: bytes) -> None:
        key = query.get("key")
        with self.dify.lock:
            obj = self.dify.objects.get(key or "")
        if obj is None or key is None:
            return self._json(404, {"code": "not_found", "message": "no such object"})
        self._json(200, self._info(key, obj))

    def _objects(self, query: dict[str, Any], raw: bytes) -> None:
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

    def _storage_health(self, query: dict[str, Any], raw: bytes) -> None:
        if self.dify.storage_healthy:
            return self._json(200, {"ok": True})
        self._json(503, {"ok": False})

    # -- the vector and text bridge ------------------------------------------------------------

    def _bridge(self, query: dict[str, Any], raw: bytes) -> None:
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
