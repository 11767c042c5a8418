"""Constants, helpers and records of the simulated Dify inner API (dify_server.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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

# Declared capabilities beyond the context size: ``features`` with ``vision`` marks a vision LLM
# (gpt-4.1) and a multimodal embedding model (jina-clip-v2) whose route takes images.
VISION = {"features": ["vision"]}
CATALOG = [
    {"model_type": "llm", "plugin_id": "langgenius/openai", "provider": "openai", "model": m}
    | ({"capabilities": VISION} if m == "gpt-4.1" else {})
    for m in ("gpt-4.1", "gpt-4.1-mini", "o4-mini")
] + [
    {"model_type": "text-embedding", "plugin_id": "langgenius/openai", "provider": "openai",
     "model": "text-embedding-3-small"},
    {"model_type": "text-embedding", "plugin_id": "langgenius/cohere", "provider": "cohere",
     "model": "embed-v4.0"},
    {"model_type": "rerank", "plugin_id": "langgenius/cohere", "provider": "cohere",
     "model": "rerank-v3.5"},
    {"model_type": "text-embedding", "plugin_id": "langgenius/jina", "provider": "jina",
     "model": "jina-clip-v2", "capabilities": VISION},
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
    ``body`` as JSON with ``status``), ``echo`` (an error naming the credential headers the request
    carried: the error envelope when ``status`` is 200, else ``status`` with that message),
    ``trickle`` (send the first ``after_bytes`` of the body one byte every ``interval`` seconds,
    then stall ``seconds``), ``late_ack`` (store a PUT's object, then sleep ``seconds`` before
    answering: the caller may die in between), ``malformed`` (an image description answered
    with text that is not the JSON asked for). ``skip`` matching requests pass first; it then
    applies ``times`` times (``None``: always).
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


def wait_until(predicate: Callable[[], object], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())
