"""The embed step: embed a group's nodes for every index version, then index them.

Texts are embedded in length-sorted model batches; after each batch the leases are renewed or
re-read, so a cancel stops the work within one batch. The vectors are written through the
projection port (:mod:`ingestion.projection`) with the ``projection_built`` checkpoint.
"""

from __future__ import annotations

import logging
import time
import uuid

import numpy as np
from django.conf import settings

from ingestion.compilation.failures import _end_all
from ingestion.compilation.leases import Held
from ingestion.compilation.progress import PROGRESS, PROGRESS_WRITE_SECONDS, _progress
from ingestion.compilation.stage_commit import _commit
from ingestion.models import KnowledgeNode, Stage
from ingestion.projection import IndexedNode, projector

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
        _end_all(held, job_ids, "embedding_unavailable", exc)
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
        # of whose chunks were embedded yet keeps its "chunked" progress).
        last_write, written = 0.0, dict.fromkeys(job_ids, 0)
        try:
            while position < len(stream):
                batch = stream[position : position + step]
                out = target.model.embed_documents([nodes[j][i].text for j, i in batch])
                for row, (j, i) in enumerate(batch):
                    vectors[j][target.index_version][i] = out[row]
                    done[j] += 1
                position += len(batch)
                if time.monotonic() - last_write >= PROGRESS_WRITE_SECONDS:
                    # Renew, write progress of the jobs that moved, learn of cancels: one write.
                    moved = {j for j in job_ids if done[j] != written.get(j)}
                    written.update({j: done[j] for j in moved})
                    held.beat(
                        {
                            j: _progress(
                                "embedding",
                                f"embedding with {target.model.model_id}",
                                PROGRESS[Stage.NODES_GENERATED]
                                + 40 * (t_index + done[j] / max(1, total[j])) / len(targets),
                                nodes_total=total[j],
                                nodes_embedded=done[j],
                            )
                            for j in held.live(job_ids)
                            if j in moved
                        }
                    )
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
            _end_all(held, held.live(job_ids), "embedding_failed", exc)
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

    done = _commit(
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
    return {j: out[0] for j, out in done.items()}


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
