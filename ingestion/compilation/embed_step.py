"""The embed step: embed a group's nodes for every index version, then index them.

Texts are embedded in length-sorted model batches; after each batch the leases are renewed or
re-read, so a cancel stops the work within one batch. The vectors are written through the
projection port (:mod:`ingestion.projection`) with the ``projection_built`` checkpoint.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid

import numpy as np
from django.conf import settings

from ingestion.compilation.errors import CompilationFailure, embedding_failure, is_input_refusal
from ingestion.compilation.failures import _end_all, end_attempt
from ingestion.compilation.leases import Held
from ingestion.compilation.progress import PROGRESS, PROGRESS_WRITE_SECONDS, _progress
from ingestion.compilation.stage_commit import _commit
from ingestion.compilation.throttling import ThrottleWatch, provider_gate, provider_slot
from ingestion.models import KnowledgeNode, Stage
from ingestion.projection import IndexedNode, projector
from knowledgefs.dify.transport import throttle_listener

logger = logging.getLogger("knowledgefs.compilation")


def _project(held: Held, jobs, job_ids, nodes) -> dict[uuid.UUID, list[KnowledgeNode]]:
    """Embed the nodes of these jobs together (per index version), then index them.

    Texts are embedded one model batch at a time; after each batch the leases are extended,
    progress is written and canceled jobs are dropped from the rest of the stream, so a cancel
    stops the work within one batch.
    """
    if not job_ids:
        return {}
    space_id = jobs[job_ids[0]].space_id
    try:
        targets = projector().targets(space_id)
    except Exception as exc:  # noqa: BLE001
        logger.exception("no embedding model for space %s", space_id)
        _end_all(
            held,
            job_ids,
            CompilationFailure(
                "embedding_unavailable", f"{type(exc).__name__}: {exc}", retryable=True
            ),
        )
        return {}
    step = max(1, settings.KNOWLEDGE_EMBEDDING_BATCH_SIZE)
    vectors: dict[uuid.UUID, dict[int, np.ndarray]] = {j: {} for j in job_ids}
    total = {j: len(nodes[j]) for j in job_ids}
    for t_index, target in enumerate(targets):
        for j in job_ids:
            vectors[j][target.index_version] = np.zeros(
                (total[j], target.model.dimension), dtype=np.float32
            )
        # Length-sorted, so each model batch pads little (the model sorts only within a call).
        stream = [(j, i) for j in job_ids for i in range(total[j])]
        lengths = _embedding_lengths(target.model, [nodes[j][i].text for j, i in stream])
        stream = [stream[k] for k in sorted(range(len(stream)), key=lengths.__getitem__)]
        done = dict.fromkeys(job_ids, 0)
        position = 0
        # Progress is written for the jobs whose count moved since the last write (a job none
        # of whose chunks were embedded yet keeps its "chunked" progress), and for every job
        # of the stream while the provider throttles.
        last_write, written = 0.0, dict.fromkeys(job_ids, 0)
        watch = ThrottleWatch(held, target.model.model_id)
        gate = provider_gate(target.model)

        progress = functools.partial(
            _embedding_progress, held, list(job_ids), (t_index, len(targets)), done, total, watch
        )
        watch.progress = progress
        try:
            while position < len(stream):
                batch = stream[position : position + step]
                with throttle_listener(watch):
                    rows, refused = _embed_batch(target.model, batch, nodes, gate)
                for (j, i), vector in rows:
                    vectors[j][target.index_version][i] = vector
                    done[j] += 1
                position += len(batch)
                if refused:  # those documents fail alone; their batch-mates go on
                    _refuse(held, jobs, nodes, refused)
                    job_ids = [j for j in job_ids if j not in refused]
                    stream = stream[:position] + [
                        s for s in stream[position:] if s[0] not in refused
                    ]
                    if not job_ids:
                        return {}
                if time.monotonic() - last_write >= PROGRESS_WRITE_SECONDS:
                    # Renew, write progress of the jobs that moved, learn of cancels: one write.
                    moved = {j for j in job_ids if done[j] != written.get(j)}
                    written.update({j: done[j] for j in moved})
                    held.beat(progress(watch.note(), moved))
                    last_write = time.monotonic()
                else:
                    held.refresh()  # a read: a cancel is seen within one batch
                lost = [j for j in job_ids if j not in held.tokens or j in held.lost]
                if lost:  # canceled or taken over: stop embedding its remaining nodes
                    job_ids = [j for j in job_ids if j not in lost]
                    stream = stream[:position] + [s for s in stream[position:] if s[0] not in lost]
                    if not job_ids:
                        return {}
        except Exception as exc:  # noqa: BLE001
            logger.exception("embedding failed")
            _end_all(held, held.live(job_ids), embedding_failure(exc))
            return {}
    outputs = {j: (nodes[j], vectors[j]) for j in held.live(job_ids)}

    def index(batch: list[tuple[list[KnowledgeNode], dict[int, np.ndarray]]]) -> None:
        if not batch:
            return
        flat = [IndexedNode(n.id, n.space_id, n.document_id, n.text) for ns, _ in batch for n in ns]
        projector().write(
            flat,
            {
                t.index_version: np.concatenate([v[t.index_version] for _, v in batch])
                for t in targets
            },
        )

    committed = _commit(
        held,
        outputs,
        Stage.PROJECTION_BUILT,
        index,
        progress=lambda out: _progress(
            "indexed",
            "projections built",
            PROGRESS[Stage.PROJECTION_BUILT],
            nodes_total=len(out[0]),
            nodes_embedded=len(out[0]),
        ),
    )
    return {j: kept[0] for j, kept in committed.items()}


def _embedding_progress(
    held: Held, job_ids, stage: tuple[int, int], done, total, watch, note: str, moved=None
) -> dict:
    """Progress of the jobs of a stream (those in ``moved``, or all) still held: the share of
    their chunks embedded for target ``stage[0]`` of ``stage[1]``, and the throttled waits."""
    t_index, targets = stage
    return {
        j: _progress(
            "embedding",
            note,
            PROGRESS[Stage.NODES_GENERATED] + 40 * (t_index + done[j] / max(1, total[j])) / targets,
            nodes_total=total[j],
            nodes_embedded=done[j],
            throttled=watch.count,
        )
        for j in held.live(job_ids)
        if moved is None or j in moved
    }


def _embed_batch(model, batch: list[tuple[uuid.UUID, int]], nodes, gate=None) -> tuple[list, dict]:
    """Embed one model batch; returns ``([((job, index), vector)], {job: (index, error)})``.

    When the provider refuses the batch for what may be one text's fault (a terminal refusal
    other than a refused key, :func:`is_input_refusal`), its texts are sent one by one, so the
    document whose chunk is refused fails alone and the others are embedded. A document's
    further texts are skipped once one of its texts was refused, so a refusal that is no text's
    fault (a wrong model parameter) costs at most one request per document. Any other error is
    raised and fails the group (retryable or not, as :func:`embedding_failure` says).
    """

    def embed(texts: list[str]):
        with provider_slot(gate):  # machine-wide, per provider (throttling.py)
            return model.embed_documents(texts)

    try:
        out = embed([nodes[j][i].text for j, i in batch])
    except Exception as exc:
        if len(batch) == 1 and is_input_refusal(exc):
            return [], {batch[0][0]: (batch[0][1], exc)}
        if not is_input_refusal(exc):
            raise
        logger.warning("a batch of %d texts was refused; embedding them one by one", len(batch))
    else:
        return list(zip(batch, out, strict=True)), {}
    rows, refused = [], {}
    for j, i in batch:
        if j in refused:
            continue
        try:
            rows.append(((j, i), embed([nodes[j][i].text])[0]))
        except Exception as exc:
            if not is_input_refusal(exc):
                raise
            refused[j] = (i, exc)
    return [row for row in rows if row[0][0] not in refused], refused


def _refuse(held: Held, jobs, nodes, refused: dict) -> None:
    """End the jobs one of whose chunks the embedding provider refused, naming the chunk."""
    for job_id, (index, exc) in refused.items():
        node = nodes[job_id][index]
        document = getattr(jobs[job_id], "document", None)
        name = f" of {document.filename}" if document is not None else ""
        failure = embedding_failure(exc)
        failure.message = (
            f"the embedding model refused chunk {node.chunk_index}{name} (characters "
            f"{node.start_offset}-{node.end_offset}, {len(node.text)} characters): "
            f"{failure.message}"
        )
        if job_id in held.tokens:
            end_attempt(job_id, held.tokens[job_id], failure)
            held.release(job_id)


def _embedding_lengths(model, texts: list[str]) -> list[int]:
    """The length each text is embedded at, to cut a sorted stream into batches that pad little.

    Word pieces where the model counts them (``token_counts``, the local ONNX model; one extra
    tokenizer pass, about 0.4 ms per chunk), else characters. On SciFact abstracts, batches of
    8 sorted by characters cost the model 12% more time than batches sorted by word pieces:
    the two orders differ enough to put long and short texts in one batch (docs/benchmarks.md).
    """
    count = getattr(model, "token_counts", None)
    if count is None:
        return [len(text) for text in texts]
    return list(count(texts))
