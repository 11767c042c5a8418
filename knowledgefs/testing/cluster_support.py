"""Slow stand-ins used by the worker-cluster fault tests (loaded inside the qcluster process).

``SlowEmbedder`` replaces the default embedding model id with a deterministic hashing embedder
that sleeps ``KFS_TEST_EMBED_DELAY`` seconds per text and appends one line per call to
``KFS_TEST_EMBED_LOG`` (``<unix time> <texts>``), so a test can see when embedding stopped; a
query waits ``KFS_TEST_QUERY_DELAY`` seconds (a replay item then takes that long).
``SlowFileSystemStorage`` sleeps ``KFS_TEST_READ_DELAY`` seconds before each read, so a kill can
land while a document is being materialized.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from typing import Any

import numpy as np
from django.core.files import File
from django.core.files.storage import FileSystemStorage

from knowledgefs.runtime import DEFAULT_MODEL_ID

_TOKEN = re.compile(r"\w+")


class SlowEmbedder:
    model_id = DEFAULT_MODEL_ID
    dimension = 16

    def _vector(self, text: str) -> np.ndarray:
        vector = np.zeros(self.dimension, dtype=np.float32)
        for token in _TOKEN.findall(text.lower()):
            digest = hashlib.sha256(token.encode()).digest()
            vector[digest[0] % self.dimension] += 1.0
        norm = float(np.linalg.norm(vector)) or 1.0
        return vector / norm

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        time.sleep(float(os.environ.get("KFS_TEST_EMBED_DELAY", "0")) * len(texts))
        log = os.environ.get("KFS_TEST_EMBED_LOG")
        if log:
            with open(log, "a") as handle:
                handle.write(f"{time.time():.3f} {len(texts)}\n")
        return np.stack([self._vector(t) for t in texts]) if texts else np.zeros((0, 16))

    def embed_query(self, text: str) -> np.ndarray:
        time.sleep(float(os.environ.get("KFS_TEST_QUERY_DELAY", "0")))
        return self._vector(text)


class SlowFileSystemStorage(FileSystemStorage):
    def open(self, name: str, mode: str = "rb") -> File[Any]:
        time.sleep(float(os.environ.get("KFS_TEST_READ_DELAY", "0")))
        return super().open(name, mode)
