"""Models through Dify's inner model API: embeddings, rerank, LLM streams, the model catalog.

Dify holds every provider credential; a call names the tenant (whose model settings Dify
applies), the provider as ``<org>/<plugin>/<provider>`` (``langgenius/openai/openai``) and the
model. Routes (POST, JSON): ``/inner/api/invoke/text-embedding``, ``…/multimodal-embedding``,
``…/rerank``, ``…/llm`` (answered as a stream of length-prefixed frames) and
``…/model-catalog``. Unary answers are Dify's envelope ``{"data": …, "error": ""}``.

:class:`DifyModelRuntime` is the client; :class:`~knowledgefs.dify.embedding_model.
DifyEmbeddingModel` adapts it to the :class:`knowledgefs.runtime.EmbeddingModel` protocol.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from django.conf import settings

from . import config, embedding_response
from .envelope import parse_json, unwrap_envelope
from .errors import DifyError, ModelRuntimeError
from .frames import iter_frames
from .multimodal_body import streamed_body
from .transport import Body, DifyTransport

TEXT_EMBEDDING = "/inner/api/invoke/text-embedding"
MULTIMODAL_EMBEDDING = "/inner/api/invoke/multimodal-embedding"
RERANK = "/inner/api/invoke/rerank"
LLM = "/inner/api/invoke/llm"
MODEL_CATALOG = "/inner/api/invoke/model-catalog"

INPUT_TYPES = ("document", "query")
MODEL_TYPES = ("llm", "rerank", "text-embedding")
_PROVIDER = re.compile(r"^[a-z0-9_-]+/[a-z0-9_-]+/[a-z0-9_-]+$")

T = TypeVar("T")
R = TypeVar("R")


def _input_error(message: str) -> ModelRuntimeError:
    return ModelRuntimeError.of("input", message)  # type: ignore[return-value]


def _int_setting(name: str, default: int) -> int:
    """The integer setting ``name`` (``bounded_int`` in knowledgefs/settings), ``default``
    when it is not set."""
    value: int = getattr(settings, name, default)
    return value


def checked_identifier(value: Any, name: str, max_length: int) -> str:
    """``value`` stripped; ``input`` unless a non-empty string of at most ``max_length``."""
    if not isinstance(value, str) or not value.strip() or len(value.strip()) > max_length:
        raise _input_error(f"{name} must be a non-empty string of at most {max_length} characters")
    return value.strip()


def canonical_provider(provider: str, errors: type[DifyError] = ModelRuntimeError) -> str:
    """Check ``<org>/<plugin>/<provider>`` (lower case, digits, ``_``, ``-``) and return it;
    ``errors``' ``input`` kind otherwise."""
    if not isinstance(provider, str) or not _PROVIDER.match(provider.strip()):
        raise errors.of(
            "input",
            f"provider {str(provider)[:80]!r} must be '<org>/<plugin>/<provider>' "
            "(langgenius/openai/openai)",
        )
    return provider.strip()


@dataclass(frozen=True)
class MultimodalDocument:
    """One item to embed: raw ``content`` bytes (sent base64), ``content_type`` (``image``),
    an optional ``file_id`` naming it in Dify's logs."""

    content: bytes
    content_type: str = "image"
    file_id: str | None = None


@dataclass(frozen=True)
class RerankHit:
    """Index into the ``docs`` sent, and its relevance score (finite; higher is better)."""

    index: int
    score: float


@dataclass(frozen=True)
class CatalogItem:
    """A model the tenant can use: ``provider`` is the provider slug, ``plugin_id`` is
    ``<org>/<plugin>``; :attr:`canonical_provider` joins them for invocations."""

    provider: str
    plugin_id: str
    plugin_unique_identifier: str
    model: str
    model_type: str
    capabilities: Mapping[str, Any]
    token_limits: Mapping[str, Any] | None = None

    @property
    def canonical_provider(self) -> str:
        return f"{self.plugin_id}/{self.provider}"


@dataclass(frozen=True)
class CatalogPage:
    """At most ``limit`` items; ``next_offset`` is ``None`` on the last page."""

    items: list[CatalogItem] = field(default_factory=list)
    next_offset: int | None = None


class DifyModelRuntime:
    """Client of Dify's inner model API.

    Defaults come from settings: ``DIFY_MODEL_RUNTIME_TIMEOUT_MS`` (60 000; bounds each HTTP
    request, its retries and its body), ``DIFY_MODEL_RUNTIME_MAX_RESPONSE_BYTES`` (8 MiB per
    answer, or per LLM stream), ``KNOWLEDGE_EMBEDDING_REQUEST_CONCURRENCY`` (2 requests in flight
    per embedding call). ``texts_per_request`` is 16. ``transport`` defaults to a
    :class:`DifyTransport` on ``DIFY_INNER_API_URL`` / ``DIFY_INNER_API_KEY``.

    Embedding, multimodal embedding, rerank and catalog calls are idempotent and retried inline;
    an LLM stream is retried only before its first byte. Errors are
    :class:`~knowledgefs.dify.errors.ModelRuntimeError` (codes ``MODEL_RUNTIME_*``,
    ``EMBEDDING_DIMENSION_MISMATCH``).
    """

    def __init__(
        self,
        *,
        transport: DifyTransport | None = None,
        timeout_ms: int | None = None,
        max_response_bytes: int | None = None,
        concurrency: int | None = None,
        texts_per_request: int = config.EMBEDDING_TEXTS_PER_REQUEST,
        user_id: str = config.USER_ID,
    ) -> None:
        self.transport = transport or DifyTransport()
        self.timeout_ms: int = timeout_ms or _int_setting(
            "DIFY_MODEL_RUNTIME_TIMEOUT_MS", config.MODEL_RUNTIME_TIMEOUT_MS
        )
        self.max_response_bytes: int = max_response_bytes or _int_setting(
            "DIFY_MODEL_RUNTIME_MAX_RESPONSE_BYTES", config.MODEL_RUNTIME_MAX_RESPONSE_BYTES
        )
        self.concurrency: int = concurrency or _int_setting(
            "KNOWLEDGE_EMBEDDING_REQUEST_CONCURRENCY", config.EMBEDDING_REQUEST_CONCURRENCY
        )
        if not 1 <= self.timeout_ms <= config.MODEL_RUNTIME_TIMEOUT_MS_MAX:
            raise ValueError(f"timeout_ms={self.timeout_ms} is outside 1..600000")
        if not 1 <= self.concurrency <= 8:
            raise ValueError(f"concurrency={self.concurrency} is outside 1..8")
        if not 1 <= texts_per_request <= config.EMBEDDING_TEXTS_PER_REQUEST:
            raise ValueError(f"texts_per_request={texts_per_request} is outside 1..16")
        self.texts_per_request = texts_per_request
        self.user_id = checked_identifier(user_id, "user_id", 512)

    # -- embeddings ----------------------------------------------------------------------------

    def embed_texts(
        self,
        *,
        tenant_id: str,
        provider: str,
        model: str,
        texts: Sequence[str],
        input_type: str = "document",
        expected_dimension: int | None = None,
    ) -> np.ndarray:
        """Embed ``texts``; returns float32 ``(len(texts), d)``, each row of unit L2 norm, in
        input order.

        Requests carry at most 16 texts; at most ``concurrency`` are in flight. Every batch must
        return one finite, non-zero vector per text, all of one dimension ``d``, equal to
        ``expected_dimension`` when given (else ``EMBEDDING_DIMENSION_MISMATCH``).
        """
        if input_type not in INPUT_TYPES:
            raise _input_error(f"input_type must be one of {INPUT_TYPES}")
        if not texts:
            raise _input_error("text embedding needs at least one text")
        if not all(isinstance(t, str) for t in texts):
            raise _input_error("every text must be a string")
        common = self._common(tenant_id, provider, model, "text-embedding")
        size = self.texts_per_request
        batches = [list(texts[i : i + size]) for i in range(0, len(texts), size)]

        def call(batch: list[str]) -> np.ndarray:
            data = self._unary(
                TEXT_EMBEDDING, {**common, "texts": batch, "input_type": input_type}, batch
            )
            return embedding_response.embeddings(
                data, len(batch), TEXT_EMBEDDING, expected_dimension
            )

        return embedding_response.stacked(
            self._map(call, batches), expected_dimension, TEXT_EMBEDDING
        )

    def embed_multimodal(
        self,
        *,
        tenant_id: str,
        provider: str,
        model: str,
        documents: Sequence[MultimodalDocument],
        input_type: str = "document",
        expected_dimension: int | None = None,
    ) -> np.ndarray:
        """Embed images (or other documents the model accepts); same result as
        :meth:`embed_texts`. A request carries at most 8 documents and 32 MiB of raw bytes; one
        document may hold at most 20 MiB."""
        if input_type not in INPUT_TYPES:
            raise _input_error(f"input_type must be one of {INPUT_TYPES}")
        if not documents:
            raise _input_error("multimodal embedding needs at least one document")
        common = self._common(tenant_id, provider, model, "text-embedding")
        batches: list[list[MultimodalDocument]] = []
        batch_bytes = 0
        for document in documents:
            size = len(document.content)
            if size > config.MULTIMODAL_MAX_DOCUMENT_BYTES:
                raise _input_error(
                    f"a document of {size} bytes is over the limit of "
                    f"{config.MULTIMODAL_MAX_DOCUMENT_BYTES}"
                )
            if (
                not batches
                or len(batches[-1]) >= config.MULTIMODAL_DOCUMENTS_PER_REQUEST
                or batch_bytes + size > config.MULTIMODAL_MAX_BATCH_BYTES
            ):
                batches.append([])
                batch_bytes = 0
            batches[-1].append(document)
            batch_bytes += size

        def call(batch: list[MultimodalDocument]) -> np.ndarray:
            # The body is streamed: base64 is encoded while it is sent (no copy of the batch).
            parts = []
            for document in batch:
                extra = {
                    "content_type": checked_identifier(document.content_type, "content_type", 64)
                }
                if document.file_id:
                    extra["file_id"] = document.file_id
                parts.append((document.content, extra))
            body, size = streamed_body(common, parts, input_type)
            data = self._unary(MULTIMODAL_EMBEDDING, None, body=body, body_size=size)
            return embedding_response.embeddings(
                data, len(batch), MULTIMODAL_EMBEDDING, expected_dimension
            )

        return embedding_response.stacked(
            self._map(call, batches), expected_dimension, MULTIMODAL_EMBEDDING
        )

    def embedding_probe(
        self,
        *,
        tenant_id: str,
        provider: str,
        model: str,
        text: str | None = None,
        image: bytes | None = None,
        input_type: str = "document",
    ) -> tuple[str, int]:
        """One probe embedding of ``text`` (the text route) or of ``image`` (the multimodal
        route, ``content_type`` ``image``): returns ``(model identity as Dify answered it,
        dimension)``. The preflight compares these across the text and image probes."""
        if input_type not in INPUT_TYPES:
            raise _input_error(f"input_type must be one of {INPUT_TYPES}")
        if (text is None) == (image is None):
            raise _input_error("an embedding probe takes a text or an image")
        common = self._common(tenant_id, provider, model, "text-embedding")
        if text is not None:
            route = TEXT_EMBEDDING
            payload = {**common, "texts": [text], "input_type": input_type}
        else:
            assert image is not None  # exactly one of text and image (checked above)
            route = MULTIMODAL_EMBEDDING
            encoded = {"content": base64.b64encode(image).decode(), "content_type": "image"}
            payload = {**common, "documents": [encoded], "input_type": input_type}
        data = self._unary(route, payload)
        matrix = embedding_response.embeddings(data, 1, route, None)
        identity = data.get("model") if isinstance(data, dict) else None
        if not isinstance(identity, str) or not identity.strip():
            identity = ""
        return identity.strip()[:256], int(matrix.shape[1])

    # -- rerank --------------------------------------------------------------------------------

    def rerank(
        self,
        *,
        tenant_id: str,
        provider: str,
        model: str,
        query: str,
        docs: Sequence[str],
        score_threshold: float | None = None,
        top_n: int | None = None,
    ) -> list[RerankHit]:
        """Score ``docs`` against ``query``; returns hits sorted by score (highest first).

        Every returned index must be within ``docs`` and appear once, every score finite;
        otherwise ``MODEL_RUNTIME_RESPONSE_INVALID``. At most ``top_n`` hits are returned.
        """
        if not isinstance(query, str) or not query:
            raise _input_error("rerank needs a query")
        if not docs or not all(isinstance(d, str) for d in docs):
            raise _input_error("rerank needs at least one document, all strings")
        if top_n is not None and (isinstance(top_n, bool) or not 1 <= top_n <= len(docs)):
            raise _input_error(f"top_n must be between 1 and {len(docs)}")
        if score_threshold is not None and not math.isfinite(score_threshold):
            raise _input_error("score_threshold must be a finite number")
        payload: dict[str, Any] = {
            **self._common(tenant_id, provider, model, "rerank"),
            "query": query,
            "docs": list(docs),
        }
        if score_threshold is not None:
            payload["score_threshold"] = score_threshold
        if top_n is not None:
            payload["top_n"] = top_n
        data = self._unary(RERANK, payload, [query, *docs])
        raw = data.get("docs") if isinstance(data, dict) else None
        if not isinstance(raw, list) or len(raw) > len(docs):
            raise ModelRuntimeError.of(
                "invalid", f"{RERANK}: 'docs' is not a list of at most {len(docs)} results"
            )
        hits: list[RerankHit] = []
        seen: set[int] = set()
        for item in raw:
            index = item.get("index") if isinstance(item, dict) else None
            score = item.get("score") if isinstance(item, dict) else None
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(docs):
                raise ModelRuntimeError.of(
                    "invalid", f"{RERANK}: result index {index!r} is not within 0..{len(docs) - 1}"
                )
            if index in seen:
                raise ModelRuntimeError.of("invalid", f"{RERANK}: index {index} returned twice")
            if (
                isinstance(score, bool)
                or not isinstance(score, int | float)
                or not math.isfinite(score)
            ):
                raise ModelRuntimeError.of(
                    "invalid", f"{RERANK}: the score of index {index} is not a finite number"
                )
            seen.add(index)
            hits.append(RerankHit(index=index, score=float(score)))
        hits.sort(key=lambda hit: (-hit.score, hit.index))
        return hits[:top_n] if top_n is not None else hits

    # -- LLM -----------------------------------------------------------------------------------

    def invoke_llm(
        self,
        *,
        tenant_id: str,
        provider: str,
        model: str,
        prompt_messages: Sequence[Mapping[str, Any]],
        completion_params: Mapping[str, Any] | None = None,
        stop: Sequence[str] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> Generator[dict[str, Any], None, None]:
        """Stream an LLM answer: yields each frame's ``data`` (``{"delta": {"message":
        {"content": …}, "finish_reason": …, "usage": …}}``) as its bytes arrive.

        The request is sent on the first ``next()``. The whole stream is bounded by the timeout
        and by ``max_response_bytes`` (each frame too). A stream ending inside a frame, a bad
        magic or a non-JSON payload is ``MODEL_RUNTIME_RESPONSE_INVALID``; an error frame is
        ``MODEL_RUNTIME_ERROR``. Retried only before the first byte; closing the iterator early
        closes the connection.
        """
        payload = {
            **self._common(tenant_id, provider, model, "llm"),
            "prompt_messages": [dict(m) for m in prompt_messages],
            "completion_params": dict(completion_params or {}),
            "stop": list(stop or []),
            "tools": [dict(t) for t in (tools or [])],
            "mode": "chat",
            "stream": True,
        }
        inputs = [c for m in prompt_messages if isinstance(c := m.get("content"), str)]
        return self._llm_stream(payload, inputs)

    def _llm_stream(
        self, payload: dict[str, Any], inputs: list[str]
    ) -> Generator[dict[str, Any], None, None]:
        stream = self.transport.open_stream(
            "POST",
            LLM,
            errors=ModelRuntimeError,
            timeout=self.timeout_ms / 1000,
            max_bytes=self.max_response_bytes,
            retry_until_body=True,
            json_body=payload,
            headers={"Accept": "text/event-stream, application/json"},
        )
        frames = iter_frames(stream, errors=ModelRuntimeError, route=LLM)
        try:
            for value in frames:
                data = unwrap_envelope(
                    value,
                    errors=ModelRuntimeError,
                    route=LLM,
                    secrets=self.transport.secrets,
                    inputs=inputs,
                )
                if not isinstance(data, dict):
                    raise ModelRuntimeError.of("invalid", f"{LLM}: a frame's data is not an object")
                yield data
        finally:
            frames.close()  # an abandoned or failed stream releases its connection now

    # -- catalog -------------------------------------------------------------------------------

    def list_models(
        self,
        *,
        tenant_id: str,
        model_type: str,
        limit: int = config.CATALOG_MAX_LIMIT,
        offset: int = 0,
        provider: str | None = None,
        model: str | None = None,
    ) -> CatalogPage:
        """One page of the tenant's active models of ``model_type`` (``llm``, ``rerank``,
        ``text-embedding``); ``limit`` 1..100, ``offset`` ≥ 0, optional ``provider``
        (``<org>/<plugin>/<provider>``) and ``model`` filters."""
        if model_type not in MODEL_TYPES:
            raise _input_error(f"model_type must be one of {MODEL_TYPES}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100:
            raise _input_error("catalog limit must be between 1 and 100")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise _input_error("catalog offset must be a non-negative integer")
        payload: dict[str, Any] = {
            "tenant_id": checked_identifier(tenant_id, "tenant_id", 512),
            "user_id": self.user_id,
            "model_type": model_type,
            "limit": limit,
            "offset": offset,
        }
        if provider:
            payload["provider"] = canonical_provider(provider)
        if model:
            payload["model"] = checked_identifier(model, "model", 256)
        data = self._unary(MODEL_CATALOG, payload)
        items = data.get("items") if isinstance(data, dict) else None
        next_offset = data.get("next_offset") if isinstance(data, dict) else None
        if not isinstance(items, list) or len(items) > limit:
            raise ModelRuntimeError.of(
                "invalid", f"{MODEL_CATALOG}: 'items' is not a list of at most {limit}"
            )
        if next_offset is not None and (
            isinstance(next_offset, bool) or not isinstance(next_offset, int) or next_offset < 0
        ):
            raise ModelRuntimeError.of("invalid", f"{MODEL_CATALOG}: 'next_offset' is invalid")
        return CatalogPage(items=[_catalog_item(i) for i in items], next_offset=next_offset)

    # -- internals -----------------------------------------------------------------------------

    def _common(self, tenant_id: str, provider: str, model: str, model_type: str) -> dict[str, Any]:
        return {
            "tenant_id": checked_identifier(tenant_id, "tenant_id", 512),
            "user_id": self.user_id,
            "provider": canonical_provider(provider),
            "model": checked_identifier(model, "model", 256),
            "model_type": model_type,
        }

    def _unary(
        self,
        route: str,
        payload: dict[str, Any] | None,
        inputs: Sequence[str] = (),
        *,
        body: Body = None,  # a streamed JSON body factory (multimodal_body)
        body_size: int | None = None,
    ) -> Any:
        reply = self.transport.request(
            "POST",
            route,
            errors=ModelRuntimeError,
            timeout=self.timeout_ms / 1000,
            max_bytes=self.max_response_bytes,
            idempotent=True,
            json_body=payload,
            body=body,
            body_size=body_size,
            headers={"Content-Type": "application/json"} if body is not None else None,
        )
        value = parse_json(reply.body, errors=ModelRuntimeError, route=route)
        return unwrap_envelope(
            value,
            errors=ModelRuntimeError,
            route=route,
            secrets=self.transport.secrets,
            inputs=inputs,
        )

    def _map(self, call: Callable[[T], R], batches: list[T]) -> list[R]:
        """``call`` on every batch, at most ``concurrency`` at once, results in batch order.
        The first failure (in batch order) is raised and batches not started are dropped."""
        workers = min(self.concurrency, len(batches))
        if workers <= 1:
            return [call(batch) for batch in batches]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dify-embed") as pool:
            # Each batch runs in a copy of the caller's context (its throttle listener).
            futures = [pool.submit(copy_context().run, call, batch) for batch in batches]
            try:
                return [future.result() for future in futures]
            except BaseException:
                for future in futures:
                    future.cancel()
                raise


def _catalog_item(value: Any) -> CatalogItem:
    if not isinstance(value, dict):
        raise ModelRuntimeError.of("invalid", f"{MODEL_CATALOG}: an item is not an object")
    strings = {}
    for name, limit in (
        ("provider", 256),
        ("plugin_id", 256),
        ("plugin_unique_identifier", 1024),
        ("model", 256),
    ):
        item = value.get(name)
        if not isinstance(item, str) or not item or len(item) > limit:
            raise ModelRuntimeError.of("invalid", f"{MODEL_CATALOG}: an item's {name} is invalid")
        strings[name] = item
    model_type = value.get("model_type")
    capabilities = value.get("capabilities")
    token_limits = value.get("token_limits")
    if model_type not in MODEL_TYPES or not isinstance(capabilities, dict):
        raise ModelRuntimeError.of(
            "invalid", f"{MODEL_CATALOG}: an item's model_type or capabilities is invalid"
        )
    if token_limits is not None and not isinstance(token_limits, dict):
        raise ModelRuntimeError.of("invalid", f"{MODEL_CATALOG}: an item's token_limits is invalid")
    return CatalogItem(
        model_type=model_type, capabilities=capabilities, token_limits=token_limits, **strings
    )


def streamed_text(stream: Generator[dict[str, Any], None, None]) -> str:
    """The text of an :meth:`DifyModelRuntime.invoke_llm` stream: every frame's
    ``delta.message.content`` string joined, the stream closed however the read ends."""
    pieces = []
    try:
        for frame in stream:
            message = (frame.get("delta") or {}).get("message") or {}
            if isinstance(message.get("content"), str):
                pieces.append(message["content"])
    finally:
        stream.close()
    return "".join(pieces)
