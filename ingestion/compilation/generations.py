"""Node generations: chunking an artifact into a job's nodes, and removing generations.

A generation is one job's nodes of its document; node ids are UUIDv5 of the generation and the
chunk index, so a resumed attempt rebuilds the same ids. Removing a generation removes its nodes
from every projection (through :mod:`ingestion.projection`), then its rows and its parse
artifact, whose assets are deleted after the commit.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from django.conf import settings

from ingestion import parsing
from ingestion.chunking import Chunk, chunk_elements
from ingestion.compilation.assets import _delete_assets_on_commit
from ingestion.compilation.errors import CompilationFailure
from ingestion.models import CompilationJob, KnowledgeNode, ParseArtifact, VisualProjection
from ingestion.projection import projector
from ingestion.tokens import approx_tokens, within_all
from spaces.models import KnowledgeSpace

logger = logging.getLogger("knowledgefs.compilation")

_NODE_NAMESPACE = uuid.UUID("8f6d2a44-5c1e-4f7a-9f0e-3b9d6c2a7e10")


def _elements_from(artifact: ParseArtifact) -> list[parsing.Element]:
    return [
        parsing.Element(**{**e, "section_path": tuple(e.get("section_path") or ())})
        for e in artifact.elements
    ]


def _generate_nodes(
    job: CompilationJob, artifact: ParseArtifact, bounds: tuple
) -> list[KnowledgeNode]:
    """Chunk the artifact; returns unsaved nodes (a job at ``parsed`` has none stored yet).

    Chunks are bounded by ``bounds``, :func:`chunk_bounds` of the job's space (read once per
    wave by the caller): the deployment's or the space's size in KnowledgeFS's token
    approximation, and the window of each model the nodes will be embedded with, counted by
    that model's own tokenizer."""
    count, max_tokens, overlap_tokens = bounds
    try:
        chunks = chunk_elements(
            _elements_from(artifact),
            target_chars=settings.KNOWLEDGE_CHUNK_TARGET_CHARS,
            overlap_chars=settings.KNOWLEDGE_CHUNK_OVERLAP_CHARS,
            max_tokens=max_tokens,
            overlap_tokens=overlap_tokens,
            count_tokens=count,
        )
    except parsing.ParseError as exc:
        raise CompilationFailure(exc.code, exc.message) from exc
    if not chunks:
        message = "the document contains no extractable text"
        if artifact.pages_without_text:
            pages = ", ".join(str(p) for p in artifact.pages_without_text[:20])
            message += f"; pages without a text layer: {pages}"
        raise CompilationFailure("no_extractable_text", message)
    return [_node(job, chunk) for chunk in chunks]


def chunk_bounds(space_id: uuid.UUID) -> tuple[Callable[[str], int], int, int]:
    """``(count, max_tokens, overlap_tokens)`` for :func:`chunk_elements` on this space.

    Every chunk must fit each of these at once (:func:`ingestion.tokens.within_all`):

    - ``KNOWLEDGE_EMBEDDING_MAX_INPUT_TOKENS`` in KnowledgeFS's approximation, or the space's own
      ``chunk_size_tokens`` when it set a smaller one (its overlap then applies; else a tenth);
    - the window of every model the space's new nodes are embedded with (the active index
      version's and a building one's, :meth:`ingestion.projection.Projector.targets`) that
      reports one (``max_input_tokens``, counted by its ``count_tokens``: the local models'
      word pieces with their special tokens), so no chunk is truncated by the model.

    Models served through Dify report no window; the approximation alone bounds their chunks.
    """
    size = settings.KNOWLEDGE_EMBEDDING_MAX_INPUT_TOKENS
    overlap = size // 10
    chunking = KnowledgeSpace.objects.filter(id=space_id).values_list("chunking", flat=True)
    chosen = chunking.first()
    if chosen and chosen["chunk_size_tokens"] < size:
        size = chosen["chunk_size_tokens"]
        overlap = chosen["chunk_overlap_tokens"]
    bounds: list[tuple[Callable[[str], int], int]] = [(approx_tokens, size)]
    # A model that cannot be resolved fails this attempt as the embed step would (retried):
    # chunks sized without its window could be truncated by it.
    try:
        targets = projector().targets(space_id)
    except Exception as exc:  # noqa: BLE001 - reported as the job's error
        raise CompilationFailure(
            "embedding_unavailable", f"{type(exc).__name__}: {exc}", retryable=True
        ) from exc
    seen = set()
    for target in targets:
        window = getattr(target.model, "max_input_tokens", None)
        counter = getattr(target.model, "count_tokens", None)
        if window and counter and target.model.model_id not in seen:
            seen.add(target.model.model_id)
            bounds.append((counter, int(window)))
    count, budget = within_all(bounds)
    return count, budget, overlap * budget // size


def _node(job: CompilationJob, chunk: Chunk) -> KnowledgeNode:
    # A compiled job has its document (deleting the document cancels its jobs first).
    assert job.document_id is not None
    return KnowledgeNode(
        id=uuid.uuid5(_NODE_NAMESPACE, f"{job.id}:{chunk.index}"),
        space_id=job.space_id,
        document_id=job.document_id,
        generation=job.id,
        chunk_index=chunk.index,
        kind=chunk.kind,
        text=chunk.text,
        start_offset=chunk.start_offset,
        end_offset=chunk.end_offset,
        page_number=chunk.page_number,
        section_path=list(chunk.section_path),
        metadata=chunk.metadata,
    )


def _drop_generation(document_id: uuid.UUID, generation: uuid.UUID) -> None:
    """Remove one generation's nodes, their projections and its parse artifact."""
    _drop_nodes(KnowledgeNode.objects.filter(document_id=document_id, generation=generation))
    artifacts = ParseArtifact.objects.filter(job_id=generation)
    _delete_assets_on_commit(artifacts.values_list("assets", flat=True))
    artifacts.delete()


def _drop_other_generations(keep: dict[uuid.UUID, uuid.UUID]) -> None:
    """Remove every node, projection and artifact of these documents not of their kept generation.

    ``keep`` maps document id → the generation (job id) it keeps. A node's or artifact's
    generation is always a job of its own document, so "of these documents, not of any kept
    generation" is exactly each document's "not its own kept generation": one SELECT and one
    DELETE per table for the whole batch.
    """
    if not keep:
        return
    kept = list(keep.values())
    _drop_nodes(KnowledgeNode.objects.filter(document_id__in=keep).exclude(generation__in=kept))
    VisualProjection.objects.filter(document_id__in=keep).exclude(generation__in=kept).delete()
    artifacts = ParseArtifact.objects.filter(document_id__in=keep).exclude(job_id__in=kept)
    _delete_assets_on_commit(artifacts.values_list("assets", flat=True))
    artifacts.delete()


def _drop_nodes(queryset) -> None:
    ids = list(queryset.values_list("id", flat=True))
    if ids:
        projector().delete(ids)
        KnowledgeNode.objects.filter(id__in=ids).delete()
