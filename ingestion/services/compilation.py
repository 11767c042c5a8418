"""Durable document compilation: parse → chunk → embed → index → publish.

The database is the source of truth; the task queue only delivers job ids. A delivery starts by a
compare-and-set from ``queued`` to ``running`` that issues a fresh ``lease_token``; every later
write (checkpoint, failure, success) is conditioned on that token, so a duplicate or late
delivery changes nothing. Each stage commits its output together with its checkpoint, so a
resumed job finds either all of a stage's output or none of it and continues from its last
checkpoint without duplicating nodes or projections (node ids are UUIDv5 of the generation and
chunk index). Publishing removes every other generation of the document in the same commit.

Several queued jobs of one space can be compiled as one batch so that their chunks share
embedding batches; a failure in one document's parse or chunk stage fails only that document.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import uuid
from collections.abc import Iterable
from dataclasses import asdict
from datetime import timedelta

import numpy as np
from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from ingestion import parsing
from ingestion.chunking import Chunk, chunk_elements
from ingestion.models import (
    LIVE_RUN_STATES,
    CompilationJob,
    Document,
    DocumentState,
    KnowledgeNode,
    ParseArtifact,
    RunState,
    Stage,
)
from knowledgefs import storage
from knowledgefs.runtime import get_embedding_model
from retrieval.backends import IndexedNode, get_search_backend
from spaces.models import PublicationHead

logger = logging.getLogger("knowledgefs.compilation")

LEASE_SECONDS = 300
EMBED_SLICE = 256
PROGRESS = {
    Stage.QUEUED: 0,
    Stage.PARSED: 30,
    Stage.NODES_GENERATED: 50,
    Stage.PROJECTION_BUILT: 90,
    Stage.PUBLISHED: 100,
}
_NODE_NAMESPACE = uuid.UUID("8f6d2a44-5c1e-4f7a-9f0e-3b9d6c2a7e10")


class LeaseLost(Exception):
    """The job is no longer ours (another delivery owns it, or it was canceled)."""


class CompilationFailure(Exception):
    """A document-level failure with a stable ``code`` and a message for the user."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# --- dispatch -------------------------------------------------------------------------------


def enqueue_on_commit(job_id: uuid.UUID) -> None:
    """Deliver the job to the worker queue once the surrounding transaction commits.

    ``robust``: a queue failure after the commit is logged, never raised into the request that
    already stored the document (the job stays ``queued`` in the database, and ``kfs ingest
    --wait`` or the recovery sweep of the durable-jobs work compiles it).
    """
    transaction.on_commit(lambda: dispatch(job_id), robust=True)


def dispatch(job_id: uuid.UUID) -> str | None:
    """Put a queued job on the django-q2 queue; returns the task id (``None`` if not queued)."""
    from django_q.tasks import async_task

    if not CompilationJob.objects.filter(id=job_id, run_state=RunState.QUEUED).exists():
        return None
    task_id = async_task(
        "ingestion.tasks.compile_document",
        str(job_id),
        task_name=f"compile-{job_id}",
        group="compile",
    )
    CompilationJob.objects.filter(id=job_id, run_state=RunState.QUEUED).update(task_id=task_id)
    return task_id


def supersede_live_jobs(document: Document) -> int:
    """Mark a document's live jobs superseded and remove what they built so far.

    Call inside a transaction holding the document's row lock. A worker still running one of
    these jobs loses its lease: its next checkpoint finds the job no longer ``running`` and it
    writes nothing more.
    """
    live = list(
        CompilationJob.objects.filter(document=document, run_state__in=LIVE_RUN_STATES).values_list(
            "id", flat=True
        )
    )
    if not live:
        return 0
    CompilationJob.objects.filter(id__in=live).update(
        run_state=RunState.SUPERSEDED,
        lease_token=None,
        lease_expires_at=None,
        finished_at=timezone.now(),
        updated_at=timezone.now(),
    )
    for generation in live:
        if generation != document.active_generation:
            _drop_generation(document.id, generation)
    return len(live)


# --- running --------------------------------------------------------------------------------


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run_job(job_id: uuid.UUID | str) -> str:
    """Compile one job plus up to ``KNOWLEDGE_COMPILE_BATCH_DOCUMENTS - 1`` queued siblings.

    Safe to call any number of times: a job that is not ``queued`` is left alone. Returns the
    job's resulting run state.
    """
    job_id = uuid.UUID(str(job_id))
    job = CompilationJob.objects.filter(id=job_id).only("space_id").first()
    if job is None:
        return "missing"
    siblings = list(
        CompilationJob.objects.filter(space_id=job.space_id, run_state=RunState.QUEUED)
        .exclude(id=job_id)
        .order_by("created_at")
        .values_list("id", flat=True)[: settings.KNOWLEDGE_COMPILE_BATCH_DOCUMENTS - 1]
    )
    compile_jobs([job_id, *siblings])
    return CompilationJob.objects.filter(id=job_id).values_list("run_state", flat=True).first()


def compile_jobs(job_ids: Iterable[uuid.UUID], *, until: str | None = None) -> None:
    """Compile the given jobs as one batch; jobs that cannot be claimed are skipped.

    Each stage does its work job by job (a parse or chunk failure fails only that job), then
    commits the outputs and checkpoints of the whole batch in one transaction; if that commit
    fails, the stage is committed job by job so one bad row cannot sink the others. A job
    resumes from its last checkpoint. Any error outside a single job's work (the model failing
    to load, the database going away) fails every job of the batch that is still held, so no
    job is left ``running`` by an exception. ``until`` stops after that checkpoint with the
    jobs left running, which is how tests stand in for a worker that dies.
    """
    tokens = claim_many(list(job_ids), worker_identity())
    if not tokens:
        return
    try:
        _compile_claimed(tokens, until)
    except BaseException as exc:
        logger.exception("compilation batch failed")
        for job_id, token in tokens.items():
            try:
                fail(job_id, token, "internal_error", f"{type(exc).__name__}: {exc}")
            except Exception:  # noqa: BLE001 - keep failing the others
                logger.exception("could not record the failure of job %s", job_id)
        if not isinstance(exc, Exception):
            raise  # KeyboardInterrupt, SystemExit: after recording, let the worker stop


def _compile_claimed(tokens: dict[uuid.UUID, uuid.UUID], until: str | None) -> None:
    jobs = CompilationJob.objects.select_related("document").in_bulk(list(tokens))
    order = [j for j in tokens if j in jobs]  # a job deleted with its document is gone

    parsed = _run_stage(
        jobs,
        tokens,
        [j for j in order if jobs[j].stage == Stage.QUEUED],
        _parse,
        Stage.PARSED,
        lambda outputs: ParseArtifact.objects.bulk_create(outputs),
    )
    if until == Stage.PARSED:
        return
    to_chunk = [j for j in order if j in parsed or jobs[j].stage == Stage.PARSED]
    artifacts = {
        a.job_id: a
        for a in ParseArtifact.objects.filter(job_id__in=[j for j in to_chunk if j not in parsed])
    }
    artifacts.update(parsed)
    chunked = _run_stage(
        jobs,
        tokens,
        to_chunk,
        lambda job: _generate_nodes(job, artifacts[job.id]),
        Stage.NODES_GENERATED,
        lambda outputs: KnowledgeNode.objects.bulk_create(
            [node for nodes in outputs for node in nodes], batch_size=500
        ),
    )
    if until == Stage.NODES_GENERATED:
        return
    to_project = [j for j in order if j in chunked or jobs[j].stage == Stage.NODES_GENERATED]
    nodes = _load_nodes(jobs, [j for j in to_project if j not in chunked])
    nodes.update(chunked)
    projected = _project(jobs, tokens, to_project, nodes)
    if until == Stage.PROJECTION_BUILT:
        return
    to_publish = [j for j in order if j in projected or jobs[j].stage == Stage.PROJECTION_BUILT]
    counts = {j: len(nodes[j]) for j in to_publish if j in nodes}
    counts.update(_node_counts(jobs, [j for j in to_publish if j not in counts]))
    publish_many([(jobs[j], tokens[j], counts[j]) for j in to_publish])


def _run_stage(jobs, tokens, job_ids, work, stage, write) -> dict:
    """Run ``work(job)`` for each job, then commit outputs and ``stage`` checkpoints together."""
    outputs = {}
    for job_id in job_ids:
        try:
            outputs[job_id] = work(jobs[job_id])
        except CompilationFailure as failure:
            fail(job_id, tokens[job_id], failure.code, failure.message)
        except Exception as exc:  # noqa: BLE001 - any bug must end the job, never leave it running
            logger.exception("compilation of job %s failed", job_id)
            fail(job_id, tokens[job_id], "internal_error", f"{type(exc).__name__}: {exc}")
    return _commit(tokens, outputs, stage, write)


def _commit(tokens, outputs: dict, stage: str, write) -> dict:
    """Write ``outputs`` of the jobs still held, with their checkpoint, in one transaction."""
    if not outputs:
        return {}
    try:
        with transaction.atomic():
            held = _checkpoint_many({j: tokens[j] for j in outputs}, stage=stage)
            write([outputs[j] for j in outputs if j in held])
        return {j: out for j, out in outputs.items() if j in held}
    except Exception:  # noqa: BLE001
        logger.exception("batch commit of stage %s failed; committing job by job", stage)
    kept = {}
    for job_id, output in outputs.items():
        try:
            with transaction.atomic():
                if _checkpoint_many({job_id: tokens[job_id]}, stage=stage):
                    write([output])
                    kept[job_id] = output
        except Exception as exc:  # noqa: BLE001
            logger.exception("stage %s of job %s failed", stage, job_id)
            fail(job_id, tokens[job_id], "internal_error", f"{type(exc).__name__}: {exc}")
    return kept


def _load_nodes(jobs, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, list[KnowledgeNode]]:
    found: dict[uuid.UUID, list[KnowledgeNode]] = {j: [] for j in job_ids}
    if job_ids:
        for node in KnowledgeNode.objects.filter(
            document_id__in={jobs[j].document_id for j in job_ids}, generation__in=job_ids
        ).order_by("generation", "chunk_index"):
            found[node.generation].append(node)
    return found


def _node_counts(jobs, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
    """Nodes per generation, counted by the database (no node text is loaded)."""
    counts = {j: 0 for j in job_ids}
    if job_ids:
        counts.update(
            KnowledgeNode.objects.filter(
                document_id__in={jobs[j].document_id for j in job_ids}, generation__in=job_ids
            )
            .values_list("generation")
            .annotate(n=Count("id"))
            .values_list("generation", "n")
        )
    return counts


def claim(job_id: uuid.UUID, worker: str) -> uuid.UUID | None:
    """Compare-and-set ``queued`` → ``running`` with a fresh lease token (``None`` if not ours)."""
    return claim_many([job_id], worker).get(job_id)


def claim_many(job_ids: list[uuid.UUID], worker: str) -> dict[uuid.UUID, uuid.UUID]:
    """Claim each job by its own compare-and-set, all in one transaction.

    Returns ``{job_id: lease_token}`` for the jobs won, in the given order; a job that is not
    ``queued`` (another delivery owns it, or it ended) is left out.
    """
    now = timezone.now()
    won: dict[uuid.UUID, uuid.UUID] = {}
    with transaction.atomic():
        for job_id in job_ids:
            token = uuid.uuid4()
            if CompilationJob.objects.filter(id=job_id, run_state=RunState.QUEUED).update(
                run_state=RunState.RUNNING,
                lease_token=token,
                worker_id=worker[:120],
                lease_expires_at=now + timedelta(seconds=LEASE_SECONDS),
                heartbeat_at=now,
                started_at=now,
                updated_at=now,
                execution_attempts=F("execution_attempts") + 1,
            ):
                won[job_id] = token
        if won:
            Document.objects.filter(jobs__id__in=list(won), active_generation__isnull=True).update(
                state=DocumentState.PROCESSING
            )
    return won


def heartbeat(tokens: dict[uuid.UUID, uuid.UUID]) -> None:
    """Extend the leases of running jobs still held with these tokens (one statement)."""
    now = timezone.now()
    live = Q()
    for job_id, token in tokens.items():
        live |= Q(id=job_id, lease_token=token)
    CompilationJob.objects.filter(live, run_state=RunState.RUNNING).update(
        heartbeat_at=now, lease_expires_at=now + timedelta(seconds=LEASE_SECONDS)
    )


def _checkpoint(job_id: uuid.UUID, token: uuid.UUID, **fields) -> None:
    """Write job fields only while we still hold the lease; raises :class:`LeaseLost` otherwise."""
    if not _checkpoint_many({job_id: token}, **fields):
        raise LeaseLost(str(job_id))


def _checkpoint_many(tokens: dict[uuid.UUID, uuid.UUID], **fields) -> set[uuid.UUID]:
    """Write job fields for the jobs still held with these tokens; returns their ids.

    The held rows are locked (``SELECT … FOR UPDATE`` where the database has it; SQLite's
    IMMEDIATE transactions already serialise writers) before they are updated, so the check
    and the write cannot be separated by another worker.
    """
    now = timezone.now()
    fields.setdefault("heartbeat_at", now)
    fields.setdefault("lease_expires_at", now + timedelta(seconds=LEASE_SECONDS))
    fields["updated_at"] = now  # queryset updates bypass auto_now
    if "stage" in fields:
        fields.setdefault("progress_percent", PROGRESS.get(fields["stage"], 0))
    held_by_token = Q()
    for job_id, token in tokens.items():
        held_by_token |= Q(id=job_id, lease_token=token)
    with transaction.atomic():
        held = set(
            CompilationJob.objects.select_for_update()
            .filter(held_by_token, run_state=RunState.RUNNING)
            .values_list("id", flat=True)
        )
        if held:
            CompilationJob.objects.filter(id__in=held).update(**fields)
    return held


def _parse(job: CompilationJob) -> ParseArtifact:
    """Read and parse the document; returns an unsaved :class:`ParseArtifact`.

    A job at ``queued`` has no artifact yet: the artifact is only ever written in the same
    transaction as the ``parsed`` checkpoint.
    """
    document = job.document
    try:
        data = storage.read_object(
            document.storage_key,
            max_bytes=max(document.size_bytes, settings.KNOWLEDGE_UPLOAD_MAX_BYTES),
        )
    except FileNotFoundError:
        raise CompilationFailure(
            "source_missing", "the stored source file of this document is missing"
        ) from None
    try:
        report = parsing.parse_with_report(data, document.mime_type)
    except parsing.ParseError as exc:
        raise CompilationFailure(exc.code, exc.message) from exc
    elements = [_element_dict(e) for e in report.elements]
    artifact_hash = hashlib.sha256(
        json.dumps(elements, sort_keys=True, ensure_ascii=False).encode()
    ).hexdigest()
    return ParseArtifact(
        job=job,
        document=document,
        parser=report.parser,
        artifact_hash=artifact_hash,
        page_count=report.page_count,
        pages_without_text=list(report.pages_without_text),
        elements=elements,
    )


def _element_dict(element: parsing.Element) -> dict:
    data = asdict(element)
    data["section_path"] = list(element.section_path)
    return data


def _elements_from(artifact: ParseArtifact) -> list[parsing.Element]:
    return [
        parsing.Element(**{**e, "section_path": tuple(e.get("section_path") or ())})
        for e in artifact.elements
    ]


def _generate_nodes(job: CompilationJob, artifact: ParseArtifact) -> list[KnowledgeNode]:
    """Chunk the artifact; returns unsaved nodes (a job at ``parsed`` has none stored yet)."""
    try:
        chunks = chunk_elements(
            _elements_from(artifact),
            target_chars=settings.KNOWLEDGE_CHUNK_TARGET_CHARS,
            overlap_chars=settings.KNOWLEDGE_CHUNK_OVERLAP_CHARS,
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


def _node(job: CompilationJob, chunk: Chunk) -> KnowledgeNode:
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
    )


def _drop_generation(document_id: uuid.UUID, generation: uuid.UUID) -> None:
    """Remove one generation's nodes, their projections and its parse artifact."""
    _drop_nodes(KnowledgeNode.objects.filter(document_id=document_id, generation=generation))
    ParseArtifact.objects.filter(job_id=generation).delete()


def _drop_other_generations(document_id: uuid.UUID, keep: uuid.UUID) -> None:
    """Remove every node, projection and artifact of the document not of generation ``keep``."""
    _drop_nodes(KnowledgeNode.objects.filter(document_id=document_id).exclude(generation=keep))
    ParseArtifact.objects.filter(document_id=document_id).exclude(job_id=keep).delete()


def _drop_nodes(queryset) -> None:
    ids = list(queryset.values_list("id", flat=True))
    if ids:
        get_search_backend().delete_nodes(ids)
        KnowledgeNode.objects.filter(id__in=ids).delete()


def _project(jobs, tokens, job_ids, nodes) -> dict[uuid.UUID, list[KnowledgeNode]]:
    """Embed the nodes of all these jobs together, then index them with their checkpoints."""
    if not job_ids:
        return {}
    texts = [node.text for j in job_ids for node in nodes[j]]
    try:
        model = get_embedding_model()
        vectors = np.zeros((len(texts), model.dimension), dtype=np.float32)
        for start in range(0, len(texts), EMBED_SLICE):
            vectors[start : start + EMBED_SLICE] = model.embed_documents(
                texts[start : start + EMBED_SLICE]
            )
            # Lost leases are found by the projection checkpoint below.
            heartbeat({j: tokens[j] for j in job_ids})
    except Exception as exc:  # noqa: BLE001
        logger.exception("embedding failed")
        for j in job_ids:
            fail(j, tokens[j], "embedding_failed", f"{type(exc).__name__}: {exc}")
        return {}
    outputs, offset = {}, 0
    for j in job_ids:
        outputs[j] = (nodes[j], vectors[offset : offset + len(nodes[j])])
        offset += len(nodes[j])
    backend = get_search_backend()

    def index(batch: list[tuple[list[KnowledgeNode], np.ndarray]]) -> None:
        if batch:
            backend.index_nodes(
                [
                    IndexedNode(n.id, n.space_id, n.document_id, n.text)
                    for ns, _ in batch
                    for n in ns
                ],
                np.concatenate([v for _, v in batch]),
                model.model_id,
            )

    done = _commit(tokens, outputs, Stage.PROJECTION_BUILT, index)
    return {j: out[0] for j, out in done.items()}


def publish(job: CompilationJob, token: uuid.UUID, *, node_count: int) -> None:
    """Publish one job (see :func:`publish_many`); raises :class:`LeaseLost` if it is not ours."""
    if not publish_many([(job, token, node_count)]):
        raise LeaseLost(str(job.id))


def publish_many(items: list[tuple[CompilationJob, uuid.UUID, int]]) -> list[uuid.UUID]:
    """Make each job's generation its document's visible one, all in one transaction.

    For every job still held with its token: the job succeeds, the document's
    ``active_generation`` points at it and the previous generation's nodes and projections are
    removed. The space's publication head then moves forward by one compare-and-set, so a query
    sees all of these documents' new generations or none of them. Every other generation of the
    document (the previous one, leftovers of superseded attempts) is removed in the same commit.
    Jobs whose lease was lost, or whose document was deleted, are skipped. Returns the ids of
    the jobs published.
    """
    if not items:
        return []
    now = timezone.now()
    published: list[uuid.UUID] = []
    with transaction.atomic():
        for job, token, node_count in items:
            # Lock order everywhere: the document row first, then its jobs.
            if Document.objects.select_for_update().filter(id=job.document_id).first() is None:
                continue  # deleted meanwhile
            if not CompilationJob.objects.filter(
                id=job.id, lease_token=token, run_state=RunState.RUNNING
            ).update(
                stage=Stage.PUBLISHED,
                run_state=RunState.SUCCEEDED,
                progress_percent=100,
                finished_at=now,
                heartbeat_at=now,
                updated_at=now,
                lease_expires_at=None,
                error_code="",
                error_message="",
            ):
                continue
            Document.objects.filter(id=job.document_id).update(
                active_generation=job.id,
                state=DocumentState.PUBLISHED,
                node_count=node_count,
                error_code="",
                error_message="",
                updated_at=now,
            )
            # The previous published generation and anything a superseded or abandoned attempt
            # left behind go in the same commit.
            _drop_other_generations(job.document_id, keep=job.id)
            published.append(job.id)
        for space_id in {job.space_id for job, _, _ in items if job.id in published}:
            advance_publication_head(space_id)
    return published


def advance_publication_head(space_id: uuid.UUID, attempts: int = 20) -> int:
    """Move the space's publication head by one compare-and-set; returns the new revision."""
    for _ in range(attempts):
        head, _ = PublicationHead.objects.get_or_create(space_id=space_id)
        if PublicationHead.objects.filter(space_id=space_id, revision=head.revision).update(
            revision=head.revision + 1, published_at=timezone.now()
        ):
            return head.revision + 1
    raise RuntimeError(f"publication head of space {space_id} kept moving; gave up")


def fail(job_id: uuid.UUID, token: uuid.UUID, code: str, message: str) -> bool:
    """End a job as failed (if we still hold it) and remove its partial nodes and projections.

    Returns ``False`` when the job is no longer ours (superseded, canceled, deleted): whoever
    took it over owns the cleanup.
    """
    now = timezone.now()
    document_id = CompilationJob.objects.filter(id=job_id).values_list("document_id", flat=True)
    document_id = document_id.first()
    if document_id is None:
        return False
    try:
        with transaction.atomic():
            Document.objects.select_for_update().filter(id=document_id).first()  # lock order
            _checkpoint(
                job_id,
                token,
                stage=Stage.FAILED,
                run_state=RunState.FAILED,
                finished_at=now,
                lease_expires_at=None,
                error_code=code[:64],
                error_message=message[:4000],
            )
            _drop_generation(document_id, job_id)
            Document.objects.filter(id=document_id, active_generation__isnull=True).update(
                state=DocumentState.FAILED, updated_at=now
            )
            Document.objects.filter(id=document_id).update(
                error_code=code[:64], error_message=message[:4000]
            )
    except LeaseLost:
        return False
    return True


def drain_queued(space_id: uuid.UUID | None = None, *, on_progress=None) -> int:
    """Compile every queued job in-process (for ``kfs ingest --wait`` and evaluation).

    Jobs are taken in batches of ``KNOWLEDGE_COMPILE_BATCH_DOCUMENTS``; a job a worker cluster
    claims first is simply skipped. ``on_progress(n)`` is called with the number of jobs done in
    each batch. Returns how many jobs were attempted.
    """
    done = 0
    batch_size = settings.KNOWLEDGE_COMPILE_BATCH_DOCUMENTS
    while True:
        qs = CompilationJob.objects.filter(run_state=RunState.QUEUED)
        if space_id is not None:
            qs = qs.filter(space_id=space_id)
        batch = list(qs.order_by("created_at").values_list("id", flat=True)[:batch_size])
        if not batch:
            return done
        compile_jobs(batch)
        done += len(batch)
        if on_progress:
            on_progress(len(batch))
