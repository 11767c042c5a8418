"""Running a delivery: claim a batch of jobs and compile it wave by wave, stage by stage.

Several queued jobs of one space are compiled as one batch so that their chunks share embedding
batches; a failure in one document fails only that document, and an error outside a single
job's work fails or defers every job still held, so no job is left ``running`` by an exception.
Stages: parse (:mod:`.parse_step`, in waves, :mod:`.waves`), chunk (:mod:`.generations`), embed
and index (:mod:`.embed_step`), visual projections (:mod:`ingestion.visual`), image
descriptions (:mod:`ingestion.enrichment`), publish (:mod:`.publish`); each commits its output
with its checkpoint (:mod:`.stage_commit`); the two image steps are idempotent instead.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Iterable

from django.conf import settings
from django.db.models import Count

from ingestion import memory_gates as gates
from ingestion.compilation.dispatch import dispatch
from ingestion.compilation.embed_step import _project
from ingestion.compilation.errors import CompilationFailure, classify
from ingestion.compilation.failures import _stop_on_timeout, end_attempt
from ingestion.compilation.generations import _generate_nodes, chunk_bounds
from ingestion.compilation.leases import Held, _requeue, claim_many, worker_identity
from ingestion.compilation.progress import PROGRESS, _progress
from ingestion.compilation.publish import publish_many
from ingestion.compilation.stage_commit import _commit
from ingestion.compilation.waves import _admit_wave, _Work
from ingestion.models import CompilationJob, KnowledgeNode, RunState, Stage

logger = logging.getLogger("knowledgefs.compilation")


def run_job(job_id: uuid.UUID | str, delivery_id: str | None = None) -> str | None:
    """Compile one delivered job plus up to ``KNOWLEDGE_COMPILE_BATCH_DOCUMENTS - 1`` siblings.

    The delivered job is claimed only if it is ``queued`` with ``delivery_id`` as its task id
    (``None`` accepts any claim: the in-process drain). Queued siblings of the same space are
    adopted by the same compare-and-set on the task id read with them, so their own messages
    later find them taken and do nothing. A job that already started once (a worker died on it,
    or it waits out a retry) is compiled alone and adopts no siblings, so one document that kills
    its worker cannot spend the attempts of a whole batch. Safe to call any number of times.
    Returns the job's resulting run state (``"missing"`` for an unknown id, ``None`` when the
    job row is gone by the end: its document was deleted meanwhile).
    """
    job_id = uuid.UUID(str(job_id))
    job = CompilationJob.objects.filter(id=job_id).only("space_id", "execution_attempts").first()
    if job is None:
        return "missing"
    expected = {job_id: delivery_id}
    if job.execution_attempts == 0:
        siblings = (
            CompilationJob.objects.filter(
                space_id=job.space_id, run_state=RunState.QUEUED, execution_attempts=0
            )
            .exclude(id=job_id)
            .order_by("created_at")
            .values_list("id", "task_id")[: settings.KNOWLEDGE_COMPILE_BATCH_DOCUMENTS - 1]
        )
        expected.update(dict(siblings))
    compile_jobs(expected, delivery=delivery_id)
    return CompilationJob.objects.filter(id=job_id).values_list("run_state", flat=True).first()


def compile_jobs(
    job_ids: Iterable[uuid.UUID] | dict[uuid.UUID, str | None],
    *,
    until: str | None = None,
    delivery: str | None = None,
) -> None:
    """Compile the given jobs as one batch; jobs that cannot be claimed are skipped.

    ``job_ids`` may map each job to the task id its claim must match (``None``: any);
    ``delivery`` is the id of the message being run, recorded on every job claimed so the sweep
    can find django-q2's record of it. Work happens in waves admitted by the retained-artifact
    gate; within a wave each stage does its work job by job (one job's failure fails only that
    job), then commits the outputs and checkpoints together. Any error outside a single job's
    work fails or defers every job of the batch still held, so no job is left ``running`` by an
    exception. A django-q2 timeout is recorded by :func:`_stop_on_timeout` and re-raised so the
    worker stops; an interrupt (Ctrl-C, shutdown) puts every held job back to ``queued``.
    ``until`` stops after that checkpoint with the jobs left running, which is how tests stand
    in for a worker that dies.
    """
    from django_q.exceptions import TimeoutException

    expected = job_ids if isinstance(job_ids, dict) else dict.fromkeys(job_ids)
    tokens = claim_many(expected, worker_identity(), delivery=delivery)
    if not tokens:
        return
    held = Held(tokens)
    try:
        with held.keep_alive():
            _compile_claimed(held, until)
    except TimeoutException:
        _stop_on_timeout(held)
        raise
    except BaseException as exc:
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: not the job's fault
            _hand_back_on_exit(held)
            raise
        logger.exception("compilation batch failed")
        failure = classify(exc)
        for job_id in list(held.tokens):
            try:
                end_attempt(job_id, held.tokens[job_id], failure)
            except Exception:  # noqa: BLE001 - keep failing the others
                logger.exception("could not record the failure of job %s", job_id)


def _hand_back(held: Held, job_ids: list[uuid.UUID]) -> None:
    """Requeue held jobs whose work has not started and dispatch each on its own."""
    _requeue(held, job_ids)
    for job_id in job_ids:
        held.release(job_id)
        dispatch(job_id)


def _hand_back_on_exit(held: Held) -> None:
    """The worker is stopping (SIGTERM: :mod:`knowledgefs.jobs.worker_runtime`, or Ctrl-C): put
    every held job back to ``queued`` with its lease cleared and dispatch it again at once, so
    another worker resumes it from its last checkpoint without waiting for the lease to expire.
    A dispatch that fails leaves the job ``queued`` without a claim, for the sweep."""
    job_ids = list(held.tokens)
    _requeue(held, job_ids)
    for job_id in job_ids:
        held.release(job_id)
        try:
            dispatch(job_id)
        except Exception:  # noqa: BLE001 - the sweep dispatches it
            logger.warning("could not dispatch job %s again while stopping", job_id, exc_info=True)


def _require_ready_profile(held: Held, jobs: dict, pending: list[uuid.UUID]) -> list[uuid.UUID]:
    """Before any work, each space of the batch must have a ready profile: a space pending
    validation runs its preflight here, under the held leases
    (:func:`spaces.profiles.ensure_ready_for_compile`). When a space is not ready its held jobs
    end with the profile's failure code (retryable for a timeout or 5xx of Dify, else terminal)
    and are left out; returns the jobs that may be compiled."""
    from spaces.readiness import SpaceNotReady, ensure_ready_for_compile

    ready = []
    for space_id in dict.fromkeys(jobs[j].space_id for j in pending):
        members = [j for j in pending if jobs[j].space_id == space_id]
        held.touch()
        try:
            ensure_ready_for_compile(space_id)
        except SpaceNotReady as exc:
            failure = CompilationFailure(exc.code, exc.message, retryable=exc.retryable)
            for job_id in members:
                held.start(job_id)  # a failure counts as an attempt, so retries stay bounded
                end_attempt(job_id, held.tokens[job_id], failure)
                held.release(job_id)
            continue
        finally:
            held.touch()
        ready.extend(members)
    return ready


def _compile_claimed(held: Held, until: str | None) -> None:
    """Compile the held jobs in groups: artifacts in waves under the gates, chunks together.

    Each wave parses and chunks at most the retained-artifact limit of documents and gives its
    leases back as soon as their chunks exist (the artifacts are then no longer held); chunked
    documents collect into a group until their chunks reach the retained byte budget or the
    batch ends, and a group is embedded, indexed and published together, so embedding batches
    draw from many documents however small the waves are.
    """
    jobs = CompilationJob.objects.select_related("document", "revision").in_bulk(list(held.tokens))
    for job_id in [j for j in held.tokens if j not in jobs]:
        held.release(job_id)  # deleted with its document meanwhile
    pending = [j for j in held.tokens if j in jobs]
    pending = _require_ready_profile(held, jobs, pending)
    budget = settings.Q_CLUSTER.get("timeout") or 0
    byte_budget = settings.KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES
    first_wave = True
    while pending:
        group: dict[uuid.UUID, CompilationJob] = {}
        nodes: dict[uuid.UUID, list[KnowledgeNode]] = {}
        group_bytes = 0
        while pending and group_bytes < byte_budget:
            if not first_wave and budget and time.monotonic() - held.created_at > budget / 2:
                # Half the worker timeout is spent: hand the rest back rather than risk it all.
                _hand_back(held, pending)
                pending = []
                break
            first_wave = False
            wave: dict[uuid.UUID, _Work] = {}
            try:
                pending = _admit_wave(held, jobs, pending, wave)
                if until == Stage.PARSED:
                    return
                chunked = _chunk_wave(held, wave)
            finally:
                # The wave's leases go back together: one ledger transaction, not one each.
                gates.release_all(work.lease for work in wave.values())
            if until == Stage.NODES_GENERATED:
                return
            group.update({j: wave[j].job for j in wave})
            nodes.update(chunked)
            group_bytes += sum(2 * len(n.text) + 512 for ns in chunked.values() for n in ns)
        if group:
            _embed_and_publish(held, group, nodes, until)
            if until:
                return
            held.active -= set(group)  # (kept on an exception: the timeout handler needs it)
            for job_id in group:
                jobs.pop(job_id, None)


def _chunk_wave(held: Held, wave: dict[uuid.UUID, _Work]) -> dict[uuid.UUID, list[KnowledgeNode]]:
    """Chunk the wave's artifacts and commit their nodes; returns the nodes per job chunked."""
    order = list(wave)
    jobs = {j: wave[j].job for j in order}
    to_chunk = [
        j
        for j in held.live(order)
        if wave[j].artifact is not None and jobs[j].stage in (Stage.QUEUED, Stage.PARSED)
    ]
    outputs = {}
    bounds: dict[uuid.UUID, tuple] = {}  # per space, read once for the wave
    for job_id in to_chunk:
        artifact = wave[job_id].artifact
        assert artifact is not None  # to_chunk holds only jobs with an artifact
        try:
            space_id = jobs[job_id].space_id
            if space_id not in bounds:
                bounds[space_id] = chunk_bounds(space_id)
            outputs[job_id] = _generate_nodes(jobs[job_id], artifact, bounds[space_id])
        except Exception as exc:  # noqa: BLE001
            if not isinstance(exc, CompilationFailure):
                logger.exception("chunking of job %s failed", job_id)
            end_attempt(job_id, held.tokens[job_id], classify(exc))
            held.release(job_id)
        wave[job_id].artifact = None  # the artifact's memory goes as soon as its nodes exist
    chunked = _commit(
        held,
        outputs,
        Stage.NODES_GENERATED,
        lambda outs: KnowledgeNode.objects.bulk_create(
            [node for nodes in outs for node in nodes], batch_size=500
        ),
        progress=lambda nodes: _progress(
            "chunked",
            "nodes generated",
            PROGRESS[Stage.NODES_GENERATED],
            nodes_total=len(nodes),
            nodes_embedded=0,
        ),
    )
    return chunked


def _embed_and_publish(
    held: Held,
    jobs: dict[uuid.UUID, CompilationJob],
    chunked: dict[uuid.UUID, list[KnowledgeNode]],
    until: str | None,
) -> None:
    """Embed and index a group's chunks together, then publish the group."""
    order = list(jobs)
    nodes = dict(chunked)
    nodes.update(
        _load_nodes(
            jobs,
            [
                j
                for j in held.live(order)
                if j not in nodes and jobs[j].stage == Stage.NODES_GENERATED
            ],
        )
    )
    projected = _project(held, jobs, [j for j in held.live(order) if j in nodes], nodes)
    if until == Stage.PROJECTION_BUILT:
        return
    to_publish = [
        j for j in held.live(order) if j in projected or jobs[j].stage == Stage.PROJECTION_BUILT
    ]
    to_publish = _visual(held, jobs, to_publish)
    to_publish, described = _enrich(held, jobs, to_publish)
    counts = {j: len(nodes[j]) + described.get(j, 0) for j in to_publish if j in nodes}
    counts.update(_node_counts(jobs, [j for j in to_publish if j not in counts]))
    for job_id in publish_many([(jobs[j], held.tokens[j], counts[j]) for j in to_publish]):
        held.release(job_id)


def _visual(held: Held, jobs, job_ids: list[uuid.UUID]) -> list[uuid.UUID]:
    """Build each generation's visual projections (:mod:`ingestion.visual`; nothing for a
    text-only profile); returns the jobs to publish. A retryable model-runtime failure puts the
    job in retry; a refusal of the images publishes the text and logs it; a cancel drops it."""
    from ingestion.visual import VisualCanceled, build_visual_projections, image_profile
    from knowledgefs.dify.errors import DifyError

    kept = []
    profiles: dict[uuid.UUID, tuple | None] = {}  # space → image_profile (None: text-only)
    for job_id in job_ids:
        try:
            space_id = jobs[job_id].space_id
            if space_id not in profiles:
                profiles[space_id] = image_profile(space_id)
            if profiles[space_id] is None:
                kept.append(job_id)  # a text-only profile: no visual projection to build
                continue
            cancelled = functools.partial(held.is_lost, job_id)
            build_visual_projections(jobs[job_id], cancelled=cancelled, found=profiles[space_id])
        except VisualCanceled:
            held.release(job_id)
            continue
        except DifyError as exc:
            if getattr(exc, "retryable", False):
                failure = CompilationFailure(
                    "visual_embedding_unavailable",
                    f"the document's images could not be embedded ({exc.code}); retried",
                    retryable=True,
                )
                end_attempt(job_id, held.tokens[job_id], failure)
                held.release(job_id)
                continue
            logger.warning("job %s: images not embedded (%s); text published", job_id, exc)
        except Exception as exc:  # noqa: BLE001 - this job fails or retries, the group goes on
            if not isinstance(exc, CompilationFailure):
                logger.exception("visual projections of job %s failed", job_id)
            end_attempt(job_id, held.tokens[job_id], classify(exc))
            held.release(job_id)
            continue
        kept.append(job_id)
    return kept


def _enrich(held: Held, jobs, job_ids: list[uuid.UUID]) -> tuple[list, dict[uuid.UUID, int]]:
    """Describe each generation's images (:mod:`ingestion.enrichment`; nothing without a vision
    reasoning model); returns the jobs to publish and the image nodes each holds. One image's
    failure is recorded and the job goes on; a cancel drops the job; a failure to embed or
    index the descriptions ends the job's attempt with its retry class."""
    from ingestion.enrichment import EnrichmentCanceled, describe_images, without_images

    kept, described = [], {}
    try:
        bare = without_images(job_ids) if job_ids else set()
    except Exception:  # noqa: BLE001 - each job then meets the error on its own below
        logger.exception("reading the image assets of %d jobs failed", len(job_ids))
        bare = set()
    for job_id in job_ids:
        if job_id in bare:  # no image to describe (recorded as describe_images records it)
            described[job_id] = 0
            kept.append(job_id)
            continue
        try:
            report = describe_images(
                jobs[job_id], cancelled=functools.partial(held.is_lost, job_id), touch=held.touch
            )
        except EnrichmentCanceled:
            held.release(job_id)
            continue
        except Exception as exc:  # noqa: BLE001 - this job fails or retries, the group goes on
            if not isinstance(exc, CompilationFailure):
                logger.exception("image descriptions of job %s failed", job_id)
            end_attempt(job_id, held.tokens[job_id], classify(exc))
            held.release(job_id)
            continue
        described[job_id] = report.nodes
        kept.append(job_id)
    return kept, described


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
