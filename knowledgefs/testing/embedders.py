"""Deterministic fake embedding models for tests: hashed token buckets, L2-normalised.

Register them with ``override_settings(KNOWLEDGE_EMBEDDING_MODELS=FAKE_MODELS)``. Each token
(lower-cased word) adds 1 to bucket ``sha256(salt + token) % dimension``; the vector is then
normalised, so texts sharing words score higher. ``delay`` seconds are slept per text so that a
test can act while a job is embedding; ``fail_after_calls`` makes the n+1-th call raise, which
stands in for a worker killed in the middle of a job.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time

import numpy as np

MODEL_A = "test/hash-a-8"
MODEL_B = "test/hash-b-4"
FAKE_MODELS = {
    MODEL_A: "knowledgefs.testing.embedders.EmbedderA",
    MODEL_B: "knowledgefs.testing.embedders.EmbedderB",
}
_TOKEN = re.compile(r"\w+")


class EmbedderKilled(RuntimeError):
    """Raised by a fake embedder after ``fail_after_calls`` calls."""


class HashingEmbedder:
    model_id = ""
    dimension = 0
    salt = ""

    def __init__(self) -> None:
        self.delay = 0.0
        self.fail_after_calls: int | None = None
        self.calls = 0
        self.texts_embedded = 0
        self._lock = threading.Lock()

    def _vector(self, text: str) -> np.ndarray:
        vector = np.zeros(self.dimension, dtype=np.float32)
        for token in _TOKEN.findall(text.lower()):
            digest = hashlib.sha256(f"{self.salt}:{token}".encode()).digest()
            vector[int.from_bytes(digest[:4], "little") % self.dimension] += 1.0
        norm = float(np.linalg.norm(vector))
        if norm == 0.0:
            vector[0] = 1.0
            return vector
        return vector / norm

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            if self.fail_after_calls is not None and self.calls >= self.fail_after_calls:
                raise EmbedderKilled(f"{self.model_id} killed after {self.calls} calls")
            self.calls += 1
            self.texts_embedded += len(texts)
        if self.delay:
            time.sleep(self.delay * len(texts))
        matrix = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for i, text in enumerate(texts):
            matrix[i] = self._vector(text)
        return matrix

    def embed_query(self, text: str) -> np.ndarray:
        return self._vector(text)

    def reset(self) -> None:
        with self._lock:
            self.delay = 0.0
            self.fail_after_calls = None
            self.calls = 0
            self.texts_embedded = 0


class EmbedderA(HashingEmbedder):
    """Fake model A: 8 dimensions."""

    model_id = MODEL_A
    dimension = 8
    salt = "a"


class EmbedderB(HashingEmbedder):
    """Fake model B: 4 dimensions."""

    model_id = MODEL_B
    dimension = 4
    salt = "b"
