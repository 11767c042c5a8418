"""Grow a benchmark space by replicating a compiled space's published chunks, without embedding.

:func:`replicate_space` copies every *visible* node of ``source`` (published documents, active
generation, enabled) into ``target`` until ``target`` holds ``chunks`` visible nodes. Each copy
of a document is written the way the compiler leaves a published document, in one transaction
per batch of documents:

- a ``Document`` (new id, ``filename`` prefixed ``c<copy>-``, ``sha256`` derived from the
  source's and the copy number so it stays unique in the space, ``storage_key`` suffixed
  ``#copy-<n>`` (unique; no object is stored under it, so the text route of a copy answers 404:
  the copies exist for queries), ``state`` published, ``active_generation`` = its job id,
  ``metadata`` the source's plus ``replica_of`` and ``copy``);
- a succeeded, published ``CompilationJob`` whose id is that generation;
- its ``KnowledgeNode`` rows (ids ``uuid5(namespace, "<generation>:<chunk_index>")`` as the
  compiler makes them; text, offsets, page and section path copied);
- the ``DenseVector`` rows of the target's active index version (the source's vector bytes of
  the same model: no re-embedding; the two spaces must use one model and dimension);
- the keyword rows through the engine's backend (``SearchBackend.index_keywords``: FTS5 on
  SQLite, ``to_tsvector`` on PostgreSQL), exactly what the compiler writes.

The publication head of ``target`` then moves forward once, so queries see all copies at once.
"""

from __future__ import annotations

import hashlib
import uuid

import numpy as np
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ingestion.compilation.generations import _NODE_NAMESPACE
from ingestion.models import CompilationJob, Document, DocumentState, KnowledgeNode, RunState, Stage
from retrieval.backends import get_search_backend
from retrieval.backends.base import IndexedNode
from retrieval.index_versions import ensure_active_version, live_versions
from retrieval.models import DenseVector
from spaces.models import KnowledgeSpace, PublicationHead

BATCH_DOCUMENTS = 200


def _visible_nodes(space: KnowledgeSpace):
    return KnowledgeNode.objects.filter(
        space=space,
        generation=F("document__active_generation"),
        document__enabled=True,
        document__state=DocumentState.PUBLISHED,
    )


def replicate_space(source: KnowledgeSpace, target: KnowledgeSpace, chunks: int) -> dict:
    """Fill ``target`` with copies of ``source``'s visible nodes until it holds at least
    ``chunks`` visible nodes (a document is never cut, so a batch may end up to one document's
    chunks past it; the last copy may stop part-way through the documents and a later call
    carries on with it). Returns ``{"documents", "chunks"}`` added, ``copies`` (the highest copy
    number now present) and ``seconds``.

    Raises ``ValueError`` when ``source`` has no visible nodes, has no active index version, or
    the two spaces' active versions differ in model or dimension.
    """
    import time

    started = time.perf_counter()
    source_version, _ = live_versions(source.id)
    if source_version is None:
        raise ValueError(f"space {source.slug} has no active index version")
    target_version = ensure_active_version(target)
    if (target_version.model_id, target_version.dimension) != (
        source_version.model_id,
        source_version.dimension,
    ):
        raise ValueError(
            f"{target.slug} indexes with {target_version.model_id}, {source.slug} with "
            f"{source_version.model_id}: vectors cannot be copied"
        )
    documents = list(
        Document.objects.filter(
            id__in=_visible_nodes(source).values("document_id").distinct()
        ).order_by("id")
    )
    if not documents:
        raise ValueError(f"space {source.slug} has no visible nodes")
    have = _visible_nodes(target).count()
    existing = {
        (meta.get("replica_of"), meta.get("copy"))
        for meta in Document.objects.filter(space=target).values_list("metadata", flat=True)
    }
    copy = max((c for _, c in existing if isinstance(c, int)), default=1)
    added_docs = added_nodes = 0
    backend = get_search_backend()
    while have < chunks:
        todo = [d for d in documents if (str(d.id), copy) not in existing]
        for start in range(0, len(todo), BATCH_DOCUMENTS):
            if have >= chunks:
                break
            docs, nodes = _copy_batch(
                todo[start : start + BATCH_DOCUMENTS],
                target,
                copy,
                source_version.number,
                target_version,
                backend,
                budget=chunks - have,
            )
            added_docs += docs
            added_nodes += nodes
            have += nodes
        if have < chunks:
            copy += 1
    PublicationHead.objects.advance(target.id)
    return {
        "documents": added_docs,
        "chunks": added_nodes,
        "copies": copy,
        "seconds": round(time.perf_counter() - started, 2),
    }


def _copy_batch(batch, target, copy, source_number, target_version, backend, *, budget):
    """Copy ``batch`` (documents) once; stops before the document that would exceed
    ``budget`` nodes (but always copies at least one). Returns ``(documents, nodes)``."""
    nodes_by_doc: dict[uuid.UUID, list[KnowledgeNode]] = {}
    visible = KnowledgeNode.objects.filter(
        document_id__in=[d.id for d in batch], generation=F("document__active_generation")
    ).order_by("document_id", "chunk_index")
    for node in visible:
        nodes_by_doc.setdefault(node.document_id, []).append(node)
    vectors = dict(
        DenseVector.objects.filter(
            node_id__in=[n.id for ns in nodes_by_doc.values() for n in ns],
            index_version=source_number,
        ).values_list("node_id", "vector")
    )
    now = timezone.now()
    new_docs, jobs, new_nodes, dense, keyword = [], [], [], [], []
    for doc in batch:
        source_nodes = nodes_by_doc.get(doc.id, [])
        if new_nodes and len(new_nodes) + len(source_nodes) > budget:
            break
        generation = uuid.uuid4()
        copy_doc = Document(
            id=uuid.uuid4(),
            tenant_id=target.tenant_id,
            space=target,
            filename=f"c{copy}-{doc.filename}"[:512],
            mime_type=doc.mime_type,
            size_bytes=doc.size_bytes,
            sha256=hashlib.sha256(f"{doc.sha256}:copy-{copy}".encode()).hexdigest(),
            storage_key=f"{doc.storage_key}#copy-{copy}"[:300],
            state=DocumentState.PUBLISHED,
            active_generation=generation,
            node_count=len(source_nodes),
            metadata={**doc.metadata, "replica_of": str(doc.id), "copy": copy},
        )
        new_docs.append(copy_doc)
        jobs.append(
            CompilationJob(
                id=generation,
                tenant_id=target.tenant_id,
                space=target,
                document=copy_doc,
                stage=Stage.PUBLISHED,
                run_state=RunState.SUCCEEDED,
                progress_percent=100,
                started_at=now,
                finished_at=now,
            )
        )
        for node in source_nodes:
            new = KnowledgeNode(
                id=uuid.uuid5(_NODE_NAMESPACE, f"{generation}:{node.chunk_index}"),
                space=target,
                document=copy_doc,
                generation=generation,
                chunk_index=node.chunk_index,
                kind=node.kind,
                text=node.text,
                start_offset=node.start_offset,
                end_offset=node.end_offset,
                page_number=node.page_number,
                section_path=node.section_path,
            )
            new_nodes.append(new)
            keyword.append(IndexedNode(new.id, target.id, copy_doc.id, node.text))
            if node.id in vectors:
                dense.append((new.id, vectors[node.id]))
    if not new_docs:
        return 0, 0
    dimension = len(dense[0][1]) // 4 if dense else 0
    with transaction.atomic():
        Document.objects.bulk_create(new_docs, batch_size=500)
        CompilationJob.objects.bulk_create(jobs, batch_size=500)
        KnowledgeNode.objects.bulk_create(new_nodes, batch_size=500)
        # Through the backend: on PostgreSQL it also fills the pgvector column.
        if dense:
            by_id = {n.id: n for n in keyword}
            backend.index_dense(
                [by_id[node_id] for node_id, _ in dense],
                np.frombuffer(b"".join(v for _, v in dense), dtype="<f4").reshape(-1, dimension),
                index_version=target_version.number,
                model_id=target_version.model_id,
            )
        backend.index_keywords(keyword)
    return len(new_docs), len(new_nodes)
