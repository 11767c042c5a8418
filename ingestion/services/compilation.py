"""Durable document compilation: parse → chunk → embed → index → publish.

The database is the source of truth; the task queue only delivers ids.

* **Dispatch without a gap.** :func:`dispatch` first claims a ``queued`` attempt that has no
  task id by writing a fresh delivery id (``task_id``) in its own committed transaction, then
  enqueues ``(job id, delivery id)``; if enqueueing fails the claim is released, but only if it
  still holds our delivery id. Nothing is enqueued without a claim.
* **Fenced execution.** A delivery starts only by a compare-and-set from ``queued`` with its own
  delivery id, which issues a fresh ``lease_token``; every later write (checkpoint, progress,
  failure, success) is conditioned on that token, so a stale worker, a duplicate delivery or a
  late message changes nothing. A lease keeper thread extends the lease while the worker lives.
* **Checkpoints.** Each stage commits its output together with its checkpoint, so a resumed
  attempt finds all of a stage's output or none of it and continues from the last checkpoint
  without duplicating nodes or projections (node ids are UUIDv5 of the generation and chunk).
* **Recovery.** :func:`recover_jobs` (a django-q2 schedule) re-dispatches attempts claimed but
  never delivered, attempts whose lease expired (a killed worker) and retries that are due,
  through the same claim path; it fails an attempt whose task django-q2 recorded as timed out.
* **Retry and cancel.** Failures carry a stable ``error_code`` and are retryable (back off, then
  ``failed`` after ``KNOWLEDGE_JOB_MAX_ATTEMPTS``) or terminal. Cancel is cooperative: the
  worker checks its lease between stages and after every embedding batch, and a canceled
  attempt writes nothing after the cancel commits.
* **Bounded memory.** Parsing runs under the machine-wide materialization gate; a parsed
  artifact is retained only under a retained-artifact lease (count and byte budget), so a
  claimed batch is compiled in waves that fit (see :mod:`ingestion.gates`).

Several queued jobs of one space can be compiled as one batch so that their chunks share
embedding batches; a failure in one document fails only that document.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import timedelta

import numpy as np
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Case, Count, F, Q, Sum, Value, When
from django.db.models.functions import Cast, Length
from django.utils import timezone

from ingestion import gates, parsing, unstructured
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
from ingestion.parsing.isolation import ParseCanceled
from ingestion.projection import IndexedNode, ProjectionError, projector
from knowledgefs import storage
from knowledgefs.db import lock_for_update
from knowledgefs.errors import Conflict, NotFound
from spaces.models import PublicationHead

logger = logging.getLogger("knowledgefs.compilation")

TERMINAL_RUN_STATES = (
    RunState.SUCCEEDED,
    RunState.FAILED,
    RunState.CANCELED,
    RunState.SUPERSEDED,
)
# Percent of the whole job reached at each checkpoint; embedding fills 50 → 90.
PROGRESS = {
    Stage.QUEUED: 0,
    Stage.PARSED: 30,
    Stage.NODES_GENERATED: 50,
    Stage.PROJECTION_BUILT: 95,
    Stage.PUBLISHED: 100,
}
# Embedding progress is written at most this often; leases are re-read after every batch.
PROGRESS_WRITE_SECONDS = 1.0
_NODE_NAMESPACE = uuid.UUID("8f6d2a44-5c1e-4f7a-9f0e-3b9d6c2a7e10")
TASK_FUNCTION = "ingestion.tasks.compile_document"


def lease_seconds() -> int:
    return settings.KNOWLEDGE_JOB_LEASE_SECONDS


class LeaseLost(Exception):
    """The job is no longer ours (another delivery owns it, or it was canceled)."""


class CompilationFailure(Exception):
    """A document-level failure with a stable ``code``, a message and its retry class.

    ``retryable=False`` (the default) ends the attempt as ``failed``; ``True`` puts it in
    ``retry_wait`` with exponential back-off until ``KNOWLEDGE_JOB_MAX_ATTEMPTS`` is reached.
    """

    def __init__(self, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable


# Exceptions that say "try again later" rather than "this document cannot be compiled".
# A parser transport timeout is deliberately absent: the remote parser may still be working on
# the document, so an automatic retry would pile up work (see docs/architecture.md).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (DatabaseError, ConnectionError)


def classify(exc: BaseException) -> CompilationFailure:
    """Map an unexpected exception to a :class:`CompilationFailure` with its retry class."""
    if isinstance(exc, CompilationFailure):
        return exc
    if isinstance(exc, ProjectionError):  # e.g. the Dify bridge: its code and retry class
        return CompilationFailure(exc.code, exc.message, retryable=exc.retryable)
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, TRANSIENT_ERRORS):
        return CompilationFailure("transient_error", text, retryable=True)
    return CompilationFailure("internal_error", text)


# --- dispatch -------------------------------------------------------------------------------


def enqueue_on_commit(job_id: uuid.UUID) -> None:
    """Dispatch the job once the surrounding transaction commits.

    ``robust``: a queue failure after the commit is logged, never raised into the request that
    already stored the document; the job stays ``queued`` without a claim and the recovery
    sweep dispatches it.
    """
    transaction.on_commit(lambda: dispatch(job_id), robust=True)


def dispatch(job_id: uuid.UUID) -> str | None:
    """Claim a queued, unclaimed job with a fresh delivery id, then put it on the queue.

    Returns the delivery id, or ``None`` when the job was not ``queued`` without a claim or the
    queue refused it (the claim is then released so the sweep can try again).
    """
    if connection.in_atomic_block and not settings.Q_CLUSTER.get("orm"):
        # A message on another broker would be visible before the claim commits.
        raise RuntimeError("dispatch() must run after the commit: use enqueue_on_commit()")
    delivery = uuid.uuid4().hex
    with transaction.atomic():
        claimed = CompilationJob.objects.filter(
            id=job_id, run_state=RunState.QUEUED, task_id=""
        ).update(task_id=delivery, dispatched_at=timezone.now(), updated_at=timezone.now())
    if not claimed:
        return None
    return delivery if _enqueue(job_id, delivery) else None


def _enqueue(job_id: uuid.UUID, delivery: str) -> bool:
    """Put ``(job id, delivery id)`` on the queue; on failure release the claim if still ours."""
    from django_q.tasks import async_task

    try:
        async_task(
            TASK_FUNCTION,
            str(job_id),
            delivery,
            task_name=f"compile:{delivery}",
            group="compile",
        )
    except Exception:  # noqa: BLE001 - the broker failed: release our claim, the sweep retries
        logger.exception("could not enqueue job %s; releasing the claim", job_id)
        CompilationJob.objects.filter(
            id=job_id, run_state=RunState.QUEUED, task_id=delivery
        ).update(task_id="", dispatched_at=None, updated_at=timezone.now())
        return False
    return True


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
    now = timezone.now()
    CompilationJob.objects.filter(id__in=live).update(
        run_state=RunState.SUPERSEDED,
        lease_token=None,
        lease_expires_at=None,
        finished_at=now,
        updated_at=now,
    )
    for generation in live:
        if generation != document.active_generation:
            _drop_generation(document.id, generation)
    return len(live)


# --- running --------------------------------------------------------------------------------


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run_job(job_id: uuid.UUID | str, delivery_id: str | None = None) -> str:
    """Compile one delivered job plus up to ``KNOWLEDGE_COMPILE_BATCH_DOCUMENTS - 1`` siblings.

    The delivered job is claimed only if it is ``queued`` with ``delivery_id`` as its task id
    (``None`` accepts any claim: the in-process drain). Queued siblings of the same space are
    adopted by the same compare-and-set on the task id read with them, so their own messages
    later find them taken and do nothing. A job that already started once (a worker died on it,
    or it waits out a retry) is compiled alone and adopts no siblings, so one document that kills
    its worker cannot spend the attempts of a whole batch. Safe to call any number of times.
    Returns the job's resulting run state (``"missing"`` for an unknown id).
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
            _requeue(held, list(held.tokens))
            raise
        logger.exception("compilation batch failed")
        failure = classify(exc)
        for job_id in list(held.tokens):
            try:
                end_attempt(job_id, held.tokens[job_id], failure)
            except Exception:  # noqa: BLE001 - keep failing the others
                logger.exception("could not record the failure of job %s", job_id)


def _stop_on_timeout(held: Held) -> None:
    """Record a django-q2 timeout fast (the guard kills the worker seconds later).

    A delivery that held one job fails it as ``timeout``. A delivery that held several puts them
    all back to ``queued`` instead: a job that already started is then delivered alone, so a
    document that really needs longer than the timeout fails on its own run and its batch-mates
    are not charged for it. One or two statements, conditioned on the lease tokens; a failed
    attempt's invisible partial nodes are removed by the sweep's cleanup.
    """
    message = f"compilation exceeded the worker timeout of {settings.Q_CLUSTER['timeout']} s"
    now = timezone.now()
    try:
        if len(held.tokens) != 1:
            _requeue(held, list(held.tokens))
            return
        CompilationJob.objects.filter(_held_by(held.tokens), run_state=RunState.RUNNING).update(
            run_state=RunState.FAILED,
            stage=Stage.FAILED,
            lease_token=None,
            lease_expires_at=None,
            finished_at=now,
            updated_at=now,
            error_code="timeout",
            error_message=message,
            error_retryable=False,
        )
        Document.objects.filter(
            jobs__id__in=list(held.tokens), active_generation__isnull=True
        ).update(state=DocumentState.FAILED, error_code="timeout", error_message=message)
    except Exception:  # noqa: BLE001 - the sweep finds the expired leases and the timeout record
        logger.exception("could not record the timeout of a compilation batch")


def _hand_back(held: Held, job_ids: list[uuid.UUID]) -> None:
    """Requeue held jobs whose work has not started and dispatch each on its own."""
    _requeue(held, job_ids)
    for job_id in job_ids:
        held.release(job_id)
        dispatch(job_id)


def _requeue(held: Held, job_ids: list[uuid.UUID]) -> None:
    """Give held jobs back: ``queued`` without a claim (the sweep dispatches them)."""
    tokens = {j: held.tokens[j] for j in job_ids if j in held.tokens}
    if tokens:
        CompilationJob.objects.filter(_held_by(tokens), run_state=RunState.RUNNING).update(
            run_state=RunState.QUEUED,
            lease_token=None,
            lease_expires_at=None,
            task_id="",
            dispatched_at=None,
            worker_id="",
            updated_at=timezone.now(),
        )


def _held_by(tokens: dict[uuid.UUID, uuid.UUID]) -> Q:
    """Rows of these jobs that still carry the lease token we hold for them.

    ``tokens`` maps job id → lease token. The condition is ``id IN (…) AND lease_token IN (…)``,
    which selects exactly the rows of ``OR (id = job AND lease_token = token)`` over the pairs:
    a lease token is a fresh ``uuid4`` that :func:`claim_many` writes on one job row only, so no
    row can carry the token of another job of the list, and a job whose lease was re-issued,
    canceled or superseded matches nothing. Two ``IN`` lists also cost the same to build for
    any batch size (the OR of 64 pairs took Django about 10 ms to build per statement, which was
    most of compilation's overhead, docs/benchmarks.md) and use the primary-key index.
    """
    if not tokens:
        return Q(pk__in=[])
    return Q(id__in=list(tokens), lease_token__in=list(tokens.values()))


def _per_row(model, field_name: str, values: dict):
    """One SQL expression that gives each row its own value: ``CASE WHEN pk = … THEN … END``.

    ``values`` maps a row's primary key to the value of ``field_name`` for that row; rows not
    in it keep their current value. Lets a wave write each job's own
    progress (or each document's node count) in the single UPDATE of its checkpoint instead of
    one UPDATE per row. Cast like Django's ``bulk_update`` where the database needs it
    (PostgreSQL types a CASE of parameters as text).
    """
    field = model._meta.get_field(field_name)
    case = Case(
        *[When(pk=k, then=Value(v, output_field=field)) for k, v in values.items()],
        default=F(field.attname),
        output_field=field,
    )
    if connection.features.requires_casted_case_in_updates:
        case = Cast(case, output_field=field)
    return case


@dataclass
class Held:
    """The jobs a worker holds, by lease token, and a keeper thread that extends the leases.

    ``lost`` collects jobs whose lease is gone (canceled, superseded, re-issued); the compiler
    drops them at the next check. ``release(job_id)`` forgets a job that ended. ``active`` is
    the current wave (jobs whose work started); ``touch()`` records that the compiling thread
    made progress, and the keeper stops renewing leases when it has not for
    ``KNOWLEDGE_JOB_STALL_SECONDS``, so a hung worker's jobs are recovered by the sweep.
    """

    tokens: dict[uuid.UUID, uuid.UUID]
    lost: set[uuid.UUID] = field(default_factory=set)
    active: set[uuid.UUID] = field(default_factory=set)
    started: set[uuid.UUID] = field(default_factory=set)
    touched_at: float = field(default_factory=time.monotonic)
    created_at: float = field(default_factory=time.monotonic)
    _checked_at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def release(self, job_id: uuid.UUID) -> None:
        with self._lock:
            self.tokens.pop(job_id, None)
            self.active.discard(job_id)

    def touch(self) -> None:
        self.touched_at = time.monotonic()

    def expect_quiet(self, seconds: float) -> None:
        """Declare that the compiling thread will make no visible progress for up to
        ``seconds`` (one bounded call, e.g. a remote parse with its own total deadline); the
        keeper keeps renewing leases until then plus ``KNOWLEDGE_JOB_STALL_SECONDS``."""
        self.touched_at = time.monotonic() + seconds

    def live(self, job_ids: Iterable[uuid.UUID]) -> list[uuid.UUID]:
        return [j for j in job_ids if j in self.tokens and j not in self.lost]

    def start(self, job_id: uuid.UUID, progress: dict | None = None) -> bool:
        """Mark work on a job as beginning now; returns whether we still hold it.

        One UPDATE conditioned on the job's lease token and ``running``: it counts one
        execution attempt (once per delivery: an attempt is counted when work starts, so a
        document that kills its worker spends its own attempts), renews this job's lease and
        writes ``progress`` if given. When it matches nothing the job was canceled, superseded
        or taken over: it is recorded as lost and the caller must not start its work (this is
        the lease check before parsing, so a job canceled while queued never starts). The
        other held leases are left to the lease keeper: renewing the whole batch before every
        document was the largest per-document cost of compilation (docs/benchmarks.md).
        """
        self.active.add(job_id)
        now = timezone.now()
        fields: dict = {
            "heartbeat_at": now,
            "lease_expires_at": now + timedelta(seconds=lease_seconds()),
        }
        if job_id not in self.started:
            fields["execution_attempts"] = F("execution_attempts") + 1
        if progress is not None:
            fields.update(progress=progress, progress_percent=progress["percent"], updated_at=now)
        self.started.add(job_id)
        held = CompilationJob.objects.filter(
            id=job_id, lease_token=self.tokens[job_id], run_state=RunState.RUNNING
        ).update(**fields)
        if not held:
            with self._lock:
                self.lost.add(job_id)
        self.touch()
        return bool(held)

    def beat(self, progress: dict[uuid.UUID, dict] | None = None) -> set[uuid.UUID]:
        """Extend the leases (and write ``progress``); returns the jobs still held."""
        with self._lock:
            tokens = dict(self.tokens)
        still = heartbeat(tokens, progress=progress)
        with self._lock:
            self.lost |= set(tokens) - still
            self._checked_at = time.monotonic()
        self.touch()
        return still

    def refresh(self) -> None:
        """Re-read which jobs are still held (a read: no lease renewal, no write lock)."""
        with self._lock:
            tokens = dict(self.tokens)
        if not tokens:
            return
        still = set(
            CompilationJob.objects.filter(_held_by(tokens), run_state=RunState.RUNNING).values_list(
                "id", flat=True
            )
        )
        with self._lock:
            self.lost |= set(tokens) - still
            self._checked_at = time.monotonic()
        self.touch()

    def is_lost(self, job_id: uuid.UUID, *, max_age: float = 1.0) -> bool:
        """Whether the job was canceled or taken over (re-checked at most every ``max_age`` s)."""
        if time.monotonic() - self._checked_at > max_age:
            self.refresh()
        return job_id in self.lost or job_id not in self.tokens

    def keep_alive(self):
        # Inside an outer transaction (tests) another connection could not see these rows.
        return _LeaseKeeper(self, active=not connection.in_atomic_block)


class _LeaseKeeper:
    """Extends the held leases every third of the lease while the compiling thread progresses."""

    def __init__(self, held: Held, *, active: bool) -> None:
        self.held, self.active = held, active
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self):
        if self.active:
            self.thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
            self.thread.start()
        return self

    def _run(self) -> None:
        interval = max(1.0, lease_seconds() / 3)
        stall = settings.KNOWLEDGE_JOB_STALL_SECONDS
        try:
            while not self.stop.wait(interval):
                if time.monotonic() - self.held.touched_at > stall:
                    logger.warning(
                        "compilation made no progress for %s s; letting the leases expire", stall
                    )
                    continue
                try:
                    with self.held._lock:
                        tokens = dict(self.held.tokens)
                    heartbeat(tokens)
                except Exception:  # noqa: BLE001 - a missed beat is retried next interval
                    logger.warning("lease heartbeat failed", exc_info=True)
        finally:
            connection.close()

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=30)


def claim(job_id: uuid.UUID, worker: str) -> uuid.UUID | None:
    """Compare-and-set ``queued`` → ``running`` with a fresh lease token (``None`` if not ours)."""
    return claim_many({job_id: None}, worker).get(job_id)


def claim_many(
    expected: dict[uuid.UUID, str | None] | list[uuid.UUID],
    worker: str,
    *,
    delivery: str | None = None,
) -> dict[uuid.UUID, uuid.UUID]:
    """Claim each job by its own compare-and-set, all in one transaction.

    ``expected`` maps a job to the task id its claim must match (``None`` matches any). Rows are
    updated in id order, so two deliveries adopting each other's jobs cannot deadlock. Returns
    ``{job_id: lease_token}`` for the jobs won, in the given order; a job that is not ``queued``
    (another delivery owns it, or it ended) or whose claim changed is left out. ``delivery``
    becomes every won job's ``task_id``. Execution attempts are counted when work on a job
    starts (:meth:`Held.start`), not here.
    """
    if not isinstance(expected, dict):
        expected = dict.fromkeys(expected)
    now = timezone.now()
    won: dict[uuid.UUID, uuid.UUID] = {}
    with transaction.atomic():
        for job_id, task_id in sorted(expected.items(), key=lambda item: str(item[0])):
            token = uuid.uuid4()
            qs = CompilationJob.objects.filter(id=job_id, run_state=RunState.QUEUED)
            if task_id is not None:
                qs = qs.filter(task_id=task_id)
            fields = {
                "run_state": RunState.RUNNING,
                "lease_token": token,
                "worker_id": worker[:120],
                "lease_expires_at": now + timedelta(seconds=lease_seconds()),
                "heartbeat_at": now,
                "started_at": now,
                "updated_at": now,
                "next_attempt_at": None,
            }
            if delivery:
                fields["task_id"] = delivery
            if qs.update(**fields):
                won[job_id] = token
    if won:
        # After the claim commits: document rows are locked before job rows everywhere else.
        Document.objects.filter(
            jobs__id__in=list(won),
            active_generation__isnull=True,
            state__in=[DocumentState.QUEUED, DocumentState.FAILED],
        ).update(state=DocumentState.PROCESSING)
    return {j: won[j] for j in expected if j in won}


def heartbeat(
    tokens: dict[uuid.UUID, uuid.UUID], *, progress: dict[uuid.UUID, dict] | None = None
) -> set[uuid.UUID]:
    """Extend the leases of the jobs still held with these tokens; returns their ids.

    Every UPDATE is conditioned on each job's token and ``running``, so a heartbeat racing a
    cancel or a finish writes nothing on the ended job. At most three statements whatever the
    batch size: one UPDATE renews the leases of the jobs without progress, one renews those in
    ``progress`` (job id → progress dict) and writes each its own progress (``CASE`` on the id),
    and one SELECT reads which jobs are still held.
    """
    if not tokens:
        return set()
    now = timezone.now()
    fields = {"heartbeat_at": now, "lease_expires_at": now + timedelta(seconds=lease_seconds())}
    progress = {j: p for j, p in (progress or {}).items() if j in tokens}
    plain = {j: t for j, t in tokens.items() if j not in progress}
    with transaction.atomic():
        if plain:
            CompilationJob.objects.filter(_held_by(plain), run_state=RunState.RUNNING).update(
                **fields
            )
        if progress:
            # Each job its own progress, all in one UPDATE (not one statement per job).
            CompilationJob.objects.filter(
                _held_by({j: tokens[j] for j in progress}), run_state=RunState.RUNNING
            ).update(
                **fields,
                progress=_per_row(CompilationJob, "progress", progress),
                progress_percent=_per_row(
                    CompilationJob,
                    "progress_percent",
                    {j: p["percent"] for j, p in progress.items()},
                ),
                updated_at=now,
            )
        return set(
            CompilationJob.objects.filter(_held_by(tokens), run_state=RunState.RUNNING).values_list(
                "id", flat=True
            )
        )


def _checkpoint(
    job_id: uuid.UUID, token: uuid.UUID, *, condition: Q | None = None, **fields
) -> None:
    """Write job fields only while we still hold the lease; raises :class:`LeaseLost` otherwise."""
    if not _checkpoint_many({job_id: token}, condition=condition, **fields):
        raise LeaseLost(str(job_id))


def _checkpoint_many(
    tokens: dict[uuid.UUID, uuid.UUID],
    *,
    condition: Q | None = None,
    per_job: dict[str, dict[uuid.UUID, object]] | None = None,
    **fields,
) -> set[uuid.UUID]:
    """Write job fields for the jobs still held with these tokens; returns their ids.

    The held rows are locked (``SELECT … FOR UPDATE`` where the database has it; SQLite's
    IMMEDIATE transactions already serialise writers) before they are updated, so the check
    and the write cannot be separated by another worker or a cancel. ``per_job`` maps a field
    name to each job's own value (e.g. ``{"progress": {job id: dict}}``); it is written in the
    same single UPDATE, so a checkpoint costs two statements whatever the number of jobs.
    """
    now = timezone.now()
    fields.setdefault("heartbeat_at", now)
    fields.setdefault("lease_expires_at", now + timedelta(seconds=lease_seconds()))
    fields["updated_at"] = now  # queryset updates bypass auto_now
    if fields.get("stage") in PROGRESS:
        fields.setdefault("progress_percent", PROGRESS[fields["stage"]])
    with transaction.atomic():
        held = set(
            CompilationJob.objects.select_for_update()
            .filter(_held_by(tokens), condition or Q(), run_state=RunState.RUNNING)
            .values_list("id", flat=True)
        )
        if held:
            for name, values in (per_job or {}).items():
                fields[name] = _per_row(
                    CompilationJob, name, {j: v for j, v in values.items() if j in held}
                )
            CompilationJob.objects.filter(id__in=held).update(**fields)
    return held


def _progress(phase: str, operation: str, percent: int, **counters) -> dict:
    return {"phase": phase, "operation": operation, "percent": int(percent), **counters}


# --- the stages -----------------------------------------------------------------------------


@dataclass
class _Work:
    """One held job inside a wave: what it has in memory and its retained-artifact lease."""

    job: CompilationJob
    artifact: ParseArtifact | None = None
    lease: gates.Lease | None = None


def _require_ready_profile(held: Held, jobs: dict, pending: list[uuid.UUID]) -> list[uuid.UUID]:
    """Before any work, each space of the batch must have a ready profile: a space pending
    validation runs its preflight here, under the held leases
    (:func:`spaces.profiles.ensure_ready_for_compile`). When a space is not ready its held jobs
    end with the profile's failure code (retryable for a timeout or 5xx of Dify, else terminal)
    and are left out; returns the jobs that may be compiled."""
    from spaces.profiles import SpaceNotReady, ensure_ready_for_compile

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
    jobs = CompilationJob.objects.select_related("document").in_bulk(list(held.tokens))
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


def _admit_wave(
    held: Held,
    jobs: dict[uuid.UUID, CompilationJob],
    pending: list[uuid.UUID],
    wave: dict[uuid.UUID, _Work],
) -> list[uuid.UUID]:
    """Fill ``wave`` with jobs admitted under retained-artifact leases; returns the rest.

    The first job of a wave holds nothing while it waits, so it may wait for the
    materialization gate and then for its lease (an artifact over the whole budget runs
    alone). A later job never waits on either gate while the wave holds leases (two workers
    could otherwise each hold what the other waits for): if a gate is not free at once, the
    wave closes. A resumed job's lease is taken before its artifact is loaded; a freshly parsed
    artifact that finds no lease is committed with its ``parsed`` checkpoint at once and dropped
    from memory. Light documents of the wave are parsed one after another under one shared
    materialization slot (:class:`_LightSlot`), given back once the wave's artifacts are all
    retained. The caller releases the leases of ``wave``, however this returns.
    """
    gate = gates.retained_artifact_gate()
    parsed: dict[uuid.UUID, ParseArtifact] = {}
    rest = list(pending)
    light = _LightSlot()
    try:
        while rest:
            if len(wave) >= gate.capacity:
                # Every wave member holds a lease, so the gate's count bound admits no more:
                # close the wave now rather than parse a document that would find no room.
                break
            job_id = rest[0]
            if held.is_lost(job_id):
                rest.pop(0)
                held.release(job_id)
                continue
            job, first = jobs[job_id], not wave
            work = _Work(job)
            try:
                if job.stage == Stage.QUEUED:
                    outcome, work.artifact, work.lease = _materialize(
                        held, job, gate, light, first=first
                    )
                    if outcome == "lost":
                        rest.pop(0)
                        held.release(job_id)
                        continue
                    if outcome == "busy":
                        break
                    if work.lease is None:  # parsed, but no room left in this wave
                        light.release()
                        held.active.discard(job_id)
                        if _commit(
                            held,
                            {job_id: work.artifact},
                            Stage.PARSED,
                            _save_artifacts,
                            progress=_parsed_progress,
                        ):
                            job.stage = Stage.PARSED  # reloaded in a later wave
                        else:  # not ours any more: its stored images go with it
                            delete_assets(work.artifact.assets)
                        break
                    parsed[job_id] = work.artifact
                else:
                    work.lease = _retain(held, job_id, gate, _resume_charge(job, gate), first)
                    if work.lease is None:
                        if held.is_lost(job_id, max_age=0):  # canceled: never starts work
                            rest.pop(0)
                            held.release(job_id)
                            continue
                        break
                    if not held.start(job_id):  # canceled or taken over: never starts work
                        work.lease.release()
                        rest.pop(0)
                        held.release(job_id)
                        continue
                    if job.stage == Stage.PARSED:
                        work.artifact = ParseArtifact.objects.filter(job_id=job_id).first()
                        if work.artifact is None:
                            raise CompilationFailure(
                                "artifact_missing",
                                "the parse checkpoint has no artifact",
                                retryable=True,
                            )
            except Exception as exc:  # noqa: BLE001 - any error ends only this job
                if work.lease is not None:
                    work.lease.release()
                held.start(job_id)  # a failure counts as an attempt, so retries stay bounded
                if not isinstance(exc, CompilationFailure):
                    logger.exception("compilation of job %s failed", job_id)
                end_attempt(job_id, held.tokens[job_id], classify(exc))
                held.release(job_id)
                rest.pop(0)
                continue
            rest.pop(0)
            wave[job_id] = work
    finally:
        light.release()  # every artifact parsed under it is retained (or committed) by now
        committed = _commit(held, parsed, Stage.PARSED, _save_artifacts, progress=_parsed_progress)
        for job_id in [j for j in parsed if j not in committed]:
            delete_assets(parsed[job_id].assets)  # never checkpointed: nothing half-written stays
    for job_id in [j for j in parsed if j not in committed and j in wave]:
        wave.pop(job_id).lease.release()
    return rest


def _save_artifacts(artifacts: list[ParseArtifact]) -> None:
    ParseArtifact.objects.bulk_create(artifacts)


def _parsed_progress(artifact: ParseArtifact) -> dict:
    return _progress(
        "parsed", "parsed", PROGRESS[Stage.PARSED], elements_parsed=len(artifact.elements)
    )


class _LightSlot:
    """One main-lane materialization slot shared by the light documents of a wave.

    The materialization gate bounds how many sources are read and parsed at once; a wave parses
    its documents one after another on one thread, so one slot held across its light documents
    keeps that bound while costing two ledger transactions per wave instead of two per document
    (:func:`ingestion.gates.materialization_gate`). Heavy documents still take their own lanes
    per document, heavy lane first; the shared slot is given back before they do, so the fixed
    lock order (heavy, then main) holds. The slot is given back once the wave's artifacts are
    retained (the hand-off rule), or as soon as the wave closes.
    """

    def __init__(self) -> None:
        self.lease: gates.Lease | None = None

    def acquire(self, should_abort, *, block: bool) -> bool:
        """Hold the slot (already held: at once); ``False`` if not free and not ``block``.

        Raises :class:`ingestion.gates.GateAborted` when ``should_abort()`` is true while waiting.
        """
        if self.lease is None:
            self.lease = gates.materialization_gate().acquire(
                block=block, should_abort=should_abort
            )
        return self.lease is not None

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None


def _materialize(held: Held, job: CompilationJob, gate, light: _LightSlot, *, first: bool):
    """Parse under the materialization gate, then take a retained lease before letting go.

    A light document parses under the wave's shared slot ``light`` (taken now if the wave does
    not hold it yet); a heavy one takes its own heavy and main lanes for its parse. Returns
    ``(outcome, artifact, lease)``: ``("lost", None, None)`` when the job was canceled or taken
    over before it started, ``("busy", None, None)`` when ``first`` is false and a
    materialization lane is not free at once, else ``("parsed", artifact, lease)`` where
    ``lease`` is ``None`` if ``first`` is false and the retained gate had no room.
    """
    document = job.document
    aborted = lambda: held.is_lost(job.id)  # noqa: E731
    try:
        if gates.is_heavy(document.mime_type, document.size_bytes):
            light.release()
            with gates.materialization_slot(True, should_abort=aborted, block=first) as slot:
                if slot is None:
                    return "busy", None, None
                return _parse_and_retain(held, job, gate, first=first)
        if not light.acquire(aborted, block=first):
            return "busy", None, None
        return _parse_and_retain(held, job, gate, first=first)
    except (gates.GateAborted, ParseCanceled):  # canceled while waiting or while parsing
        return "lost", None, None


def _parse_and_retain(held: Held, job: CompilationJob, gate, *, first: bool):
    """Inside a materialization slot: start the job (its lease check), parse, retain.

    Hand-off: the caller's slot is let go only after this returns, so the artifact is covered
    by the slot until its retained lease is held.
    """
    if not held.start(job.id, _progress("parsing", "reading and parsing the source", 5)):
        return "lost", None, None
    artifact = _parse(job, held)
    try:
        return "parsed", artifact, _retain(held, job.id, gate, artifact.retained_bytes, first)
    except BaseException:
        delete_assets(artifact.assets)  # the artifact is never checkpointed
        raise


def _retain(held: Held, job_id: uuid.UUID, gate, charge: int, block: bool):
    """A retained-artifact lease, or ``None`` (gate full and not blocking, or job lost)."""
    try:
        return gate.acquire(charge, block=block, should_abort=lambda: held.is_lost(job_id))
    except gates.GateAborted:
        return None


def _resume_charge(job: CompilationJob, gate) -> int:
    """The retained-byte charge of a job resuming after ``parsed``, read without loading it."""
    if job.stage == Stage.PARSED:
        charge = (
            ParseArtifact.objects.filter(job_id=job.id)
            .values_list("retained_bytes", flat=True)
            .first()
        )
        return charge or gate.byte_budget  # unknown size: run alone
    return _node_charge(job)


def _node_charge(job: CompilationJob) -> int:
    """A conservative retained-byte charge for a job resuming after chunking (its node texts)."""
    agg = KnowledgeNode.objects.filter(document_id=job.document_id, generation=job.id).aggregate(
        chars=Sum(Length("text")), n=Count("id")
    )
    return 2 * (agg["chars"] or 0) + 512 * (agg["n"] or 0)


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
    for job_id in to_chunk:
        try:
            outputs[job_id] = _generate_nodes(jobs[job_id], wave[job_id].artifact)
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
    counts = {j: len(nodes[j]) for j in to_publish if j in nodes}
    counts.update(_node_counts(jobs, [j for j in to_publish if j not in counts]))
    for job_id in publish_many([(jobs[j], held.tokens[j], counts[j]) for j in to_publish]):
        held.release(job_id)


def _commit(held: Held, outputs: dict, stage: str, write, *, progress=None) -> dict:
    """Write ``outputs`` of the jobs still held, with their checkpoint, in one transaction.

    ``progress(output)`` gives each job's progress dict. If the batch commit fails, the stage
    is committed job by job so one bad row cannot sink the others. Returns the outputs kept.
    """
    if not outputs:
        return {}

    def commit(job_ids: list[uuid.UUID]) -> set[uuid.UUID]:
        with transaction.atomic():
            # One locked read of the jobs still held, one UPDATE of their checkpoints and
            # progress, then the output.
            per_job = None
            if progress is not None:
                per_job = {"progress": {j: progress(outputs[j]) for j in job_ids}}
            done = _checkpoint_many(
                {j: held.tokens[j] for j in job_ids}, stage=stage, per_job=per_job
            )
            write([outputs[j] for j in job_ids if j in done])
        return done

    live = [j for j in outputs if j in held.tokens]
    try:
        done = commit(live)
    except Exception:  # noqa: BLE001
        logger.exception("batch commit of stage %s failed; committing job by job", stage)
        done = set()
        for job_id in live:
            try:
                done |= commit([job_id])
            except Exception as exc:  # noqa: BLE001
                logger.exception("stage %s of job %s failed", stage, job_id)
                end_attempt(job_id, held.tokens[job_id], classify(exc))
                held.release(job_id)
    for job_id in set(live) - done:
        held.lost.add(job_id)
    return {j: out for j, out in outputs.items() if j in done}


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


# --- ending an attempt ----------------------------------------------------------------------


def _end_all(held: Held, job_ids: list[uuid.UUID], code: str, exc: Exception) -> None:
    """End these held jobs with one retryable failure (the model runtime failed them all)."""
    failure = CompilationFailure(code, f"{type(exc).__name__}: {exc}", retryable=True)
    for job_id in job_ids:
        end_attempt(job_id, held.tokens[job_id], failure)
        held.release(job_id)


def end_attempt(job_id: uuid.UUID, token: uuid.UUID, failure: CompilationFailure) -> str | None:
    """Fail the attempt or, for a retryable failure with attempts left, put it in retry_wait.

    Returns the new run state, or ``None`` when the job was no longer ours.
    """
    row = (
        CompilationJob.objects.filter(id=job_id).values_list("execution_attempts", "stage").first()
    )
    if row is None:
        return None
    attempts, stage = row
    if failure.retryable and attempts < settings.KNOWLEDGE_JOB_MAX_ATTEMPTS:
        delay = settings.KNOWLEDGE_JOB_RETRY_BACKOFF_SECONDS * 2 ** max(0, attempts - 1)
        now = timezone.now()
        if _checkpoint_many(
            {job_id: token},
            run_state=RunState.RETRY_WAIT,
            lease_token=None,
            lease_expires_at=None,
            task_id="",
            next_attempt_at=now + timedelta(seconds=delay),
            progress=_progress(
                "retry_wait", f"{failure.code}; retrying after {delay} s", PROGRESS.get(stage, 0)
            ),
            error_code=failure.code[:64],
            error_message=failure.message[:4000],
            error_retryable=True,
        ):
            return RunState.RETRY_WAIT
        return None
    message = failure.message
    if failure.retryable:
        message += f" (gave up after {attempts} attempts)"
    return (
        RunState.FAILED
        if fail(job_id, token, failure.code, message, retryable=failure.retryable)
        else None
    )


def _parse(job: CompilationJob, held: Held | None = None) -> ParseArtifact:
    """Read and parse the document; returns an unsaved :class:`ParseArtifact`.

    Complex formats go to the Unstructured-compatible parser when ``UNSTRUCTURED_API_URL`` is
    set (:func:`_parse_remote`), everything else to the isolated native parser. A job at
    ``queued`` has no artifact yet: the artifact is only ever written in the same transaction
    as the ``parsed`` checkpoint.
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
    except OSError as exc:
        raise CompilationFailure(  # no server paths in the message
            "source_unavailable",
            f"could not read the stored source ({type(exc).__name__}: {exc.strerror or 'error'})",
            retryable=True,
        ) from exc
    if unstructured.enabled() and unstructured.routes(document.mime_type):
        report = _parse_remote(data, document, held)
    else:
        report = _parse_isolated(data, document.mime_type, _stop_check(job, held))
    elements = [_element_dict(e) for e in report.elements]
    artifact_hash = hashlib.sha256(
        json.dumps(elements, sort_keys=True, ensure_ascii=False).encode()
    ).hexdigest()
    assets = store_assets(job, report.assets)
    # Ids, not instances: assigning the job would cache the artifact on it (a one-to-one
    # reverse cache) and keep it alive as long as the batch holds the job.
    return ParseArtifact(
        job_id=job.id,
        document_id=document.id,
        parser=report.parser,
        artifact_hash=artifact_hash,
        page_count=report.page_count,
        pages_without_text=list(report.pages_without_text),
        elements=elements,
        assets=assets,
        ocr_pages=list(report.ocr_pages),
        warnings=[w[:500] for w in report.warnings[:200]],
        retained_bytes=gates.estimate_retained_bytes(
            elements, settings.KNOWLEDGE_DOCUMENT_RETAINED_ARTIFACT_MAX_BYTES
        ),
    )


# Parse failures a later attempt may cure: the rasterizer's process group was killed, so a retry
# cannot pile up work (unlike a parser that may still be running, see TRANSIENT_ERRORS).
RETRYABLE_PARSE_CODES = frozenset({"rasterization_timeout", "ocr_timeout"})


def _stop_check(job: CompilationJob, held: Held | None):
    """``should_stop`` for the isolated parse: the job was canceled or taken over (a lease
    read at most once a second); ``None`` without a lease holder."""
    if held is None:
        return None
    return lambda: held.is_lost(job.id)


def _parse_isolated(data: bytes, mime_type: str, should_stop=None) -> parsing.ParseReport:
    """Parse in the isolated child (:mod:`ingestion.parsing.isolation`); failures mapped to
    :class:`CompilationFailure`: the parser's code (retryable only for
    :data:`RETRYABLE_PARSE_CODES`), or the terminal ``parser_timeout`` after the hard limit.
    When ``should_stop`` answers true (the job was canceled) the parse is killed within about
    a second and :class:`~ingestion.parsing.isolation.ParseCanceled` propagates."""
    from ingestion.parsing import isolation, rasterize

    try:
        return isolation.parse_isolated(
            data,
            mime_type,
            config=isolation.IsolationConfig.from_settings(),
            raster=rasterize.RasterConfig.from_settings(),
            should_stop=should_stop,
        )
    except parsing.ParseError as exc:
        raise CompilationFailure(
            exc.code, exc.message, retryable=exc.code in RETRYABLE_PARSE_CODES
        ) from exc
    except TimeoutError as exc:
        # Terminal on purpose: a document that needs longer than the limit will again.
        raise CompilationFailure(
            "parser_timeout", f"the parser did not answer in time ({exc}); retry manually"
        ) from exc


def _parse_remote(data: bytes, document: Document, held: Held | None) -> parsing.ParseReport:
    """Parse through the Unstructured-compatible service (:mod:`ingestion.unstructured`).

    The call is bounded by its own total deadline (600 s, 2,400 s heavy), so the lease keeper
    is told to expect no progress for that long. Failures become :class:`CompilationFailure`
    with the client's code; only ``parser_unavailable`` is retryable (transport timeouts are
    terminal: the parser may still be working). A format the service does not support
    (HTTP 415) is parsed natively instead, with a warning in the artifact.
    """
    from ingestion.unstructured.errors import ParserRejected, UnstructuredError

    if held is not None:
        held.expect_quiet(
            max(
                settings.UNSTRUCTURED_REQUEST_TIMEOUT_MS,
                settings.UNSTRUCTURED_HEAVY_REQUEST_TIMEOUT_MS,
            )
            / 1000
        )
    try:
        return unstructured.parse_remote(data, document.mime_type, document.filename)
    except ParserRejected as exc:
        if exc.status != 415:
            raise CompilationFailure(exc.code, exc.message) from exc
        report = _parse_isolated(data, document.mime_type)
        note = "the remote parser does not support this format (HTTP 415); parsed natively"
        return dataclasses.replace(report, warnings=[note, *report.warnings])
    except UnstructuredError as exc:
        raise CompilationFailure(exc.code, exc.message, retryable=exc.retryable) from exc
    except parsing.ParseError as exc:  # refused before sending, e.g. archive_rejected
        raise CompilationFailure(exc.code, exc.message) from exc
    finally:
        if held is not None:
            held.touch()


# --- parse assets (images) ------------------------------------------------------------------

_ASSET_EXTENSIONS = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/gif": "gif",
    "image/bmp": "bmp",
    "image/tiff": "tif",
    "image/webp": "webp",
    "image/svg+xml": "svg",
    "image/x-emf": "emf",
    "image/x-wmf": "wmf",
}


def asset_key(job: CompilationJob, index: int, mime_type: str) -> str:
    """Object key of a job's ``index``-th asset: ``assets/<space>/<document>/<job>/<n>.<ext>``."""
    ext = _ASSET_EXTENSIONS.get(mime_type, "bin")
    return f"assets/{job.space_id}/{job.document_id}/{job.id}/{index}.{ext}"


def store_assets(job: CompilationJob, assets: list[parsing.Asset]) -> list[dict]:
    """Write every asset through the storage boundary; returns the artifact's ``assets`` list.

    All or nothing: when a write fails, the objects already written are deleted and a
    :class:`CompilationFailure` is raised: ``storage_unavailable`` (retryable; a file-system
    ``OSError`` or a retryable Dify storage error) or ``storage_error`` (terminal).
    """
    stored: list[dict] = []
    try:
        for index, asset in enumerate(assets):
            key = asset_key(job, index, asset.mime_type)
            storage.put_object(key, asset.data)
            stored.append(
                {
                    "key": key,
                    "kind": asset.kind,
                    "name": asset.name,
                    "page_number": asset.page_number,
                    "mime_type": asset.mime_type,
                    "width": asset.width,
                    "height": asset.height,
                    "bytes": len(asset.data),
                    "sha256": hashlib.sha256(asset.data).hexdigest(),
                    "element_index": asset.element_index,
                }
            )
    except Exception as exc:
        delete_assets(stored)
        if len(stored) < len(assets):  # the failed write may have left a partial object
            delete_assets([{"key": asset_key(job, len(stored), assets[len(stored)].mime_type)}])
        if not isinstance(exc, OSError):
            raise
        retryable = getattr(exc, "retryable", True)
        raise CompilationFailure(
            "storage_unavailable" if retryable else "storage_error",
            f"could not store the document's images ({type(exc).__name__})",
            retryable=retryable,
        ) from exc
    return stored


def delete_assets(assets: Iterable[dict]) -> int:
    """Delete stored asset objects best effort (a failure is logged, not raised); returns the
    number deleted. A missing object counts as deleted."""
    deleted = 0
    for asset in assets:
        try:
            storage.delete_object(asset["key"])
            deleted += 1
        except Exception:  # noqa: BLE001 - logged; the rows are what clients see
            logger.warning("could not delete asset object %s", asset["key"], exc_info=True)
    return deleted


def _delete_assets_on_commit(artifacts) -> None:
    """After the surrounding transaction commits, delete the assets of these artifact rows."""
    assets = [a for row in artifacts for a in (row or [])]
    if assets:
        transaction.on_commit(lambda: delete_assets(assets))


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
    artifacts = ParseArtifact.objects.filter(document_id__in=keep).exclude(job_id__in=kept)
    _delete_assets_on_commit(artifacts.values_list("assets", flat=True))
    artifacts.delete()


def _drop_nodes(queryset) -> None:
    ids = list(queryset.values_list("id", flat=True))
    if ids:
        projector().delete(ids)
        KnowledgeNode.objects.filter(id__in=ids).delete()


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
    the jobs published. The statements do not grow with the number of jobs: the documents are
    locked by one SELECT, the jobs checkpointed by one locked read and one UPDATE, the
    documents updated by one UPDATE (``CASE`` per row) and the other generations removed by one
    SELECT and one DELETE per table.
    """
    if not items:
        return []
    now = timezone.now()
    counts = {job.id: node_count for job, _, node_count in items}
    with transaction.atomic():
        # Lock order everywhere: the document rows first (here in id order, so two publishers
        # cannot deadlock on each other), then their jobs. A deleted document is skipped.
        present = set(
            lock_for_update(
                Document.objects.filter(id__in={job.document_id for job, _, _ in items}).order_by(
                    "id"
                )
            ).values_list("id", flat=True)
        )
        items = [item for item in items if item[0].document_id in present]
        # One locked read and one UPDATE for every job still held with its token.
        done = _checkpoint_many(
            {job.id: token for job, token, _ in items},
            stage=Stage.PUBLISHED,
            run_state=RunState.SUCCEEDED,
            lease_token=None,
            lease_expires_at=None,
            finished_at=now,
            heartbeat_at=now,
            error_code="",
            error_message="",
            per_job={
                "progress": {
                    j: _progress("published", "published", 100, nodes_total=n, nodes_embedded=n)
                    for j, n in counts.items()
                }
            },
        )
        published = [job for job, _, _ in items if job.id in done]
        if published:
            keep = {job.document_id: job.id for job in published}
            Document.objects.filter(id__in=keep).update(
                active_generation=_per_row(Document, "active_generation", keep),
                node_count=_per_row(
                    Document, "node_count", {job.document_id: counts[job.id] for job in published}
                ),
                state=DocumentState.PUBLISHED,
                error_code="",
                error_message="",
                updated_at=now,
            )
            # The previous published generation and anything a superseded or abandoned attempt
            # left behind go in the same commit.
            _drop_other_generations(keep)
            for space_id in {job.space_id for job in published}:
                PublicationHead.objects.advance(space_id)
    return [job.id for job in published]


def fail(
    job_id: uuid.UUID,
    token: uuid.UUID,
    code: str,
    message: str,
    *,
    retryable: bool = False,
    condition: Q | None = None,
) -> bool:
    """End a job as failed (if we still hold it) and remove its partial nodes and projections.

    The parse artifact is kept, so a manual retry resumes from the ``parsed`` checkpoint.
    ``condition`` must also hold on the job row (the sweep passes "lease still expired").
    Returns ``False`` when the job is no longer ours (superseded, canceled, deleted): whoever
    took it over owns the cleanup.
    """
    now = timezone.now()
    row = (
        CompilationJob.objects.filter(id=job_id)
        .values_list("document_id", "progress_percent")
        .first()
    )
    if row is None:
        return False
    document_id, percent = row
    try:
        with transaction.atomic():
            lock_for_update(Document.objects.filter(id=document_id)).first()  # lock order
            _checkpoint(
                job_id,
                token,
                condition=condition,
                stage=Stage.FAILED,
                run_state=RunState.FAILED,
                finished_at=now,
                lease_token=None,
                lease_expires_at=None,
                error_code=code[:64],
                error_message=message[:4000],
                error_retryable=retryable,
                progress=_progress("failed", code, percent),
            )
            _drop_nodes(KnowledgeNode.objects.filter(document_id=document_id, generation=job_id))
            Document.objects.filter(id=document_id, active_generation__isnull=True).update(
                state=DocumentState.FAILED, updated_at=now
            )
            Document.objects.filter(id=document_id).update(
                error_code=code[:64], error_message=message[:4000]
            )
    except LeaseLost:
        return False
    return True


# --- operator and API actions ---------------------------------------------------------------


def _job_for_update(job_id) -> CompilationJob:
    try:
        job_uuid = uuid.UUID(str(job_id))
    except ValueError:
        raise NotFound("job not found", code="job_not_found") from None
    document_id = (
        CompilationJob.objects.filter(id=job_uuid).values_list("document_id", flat=True).first()
    )
    if document_id is None:
        raise NotFound("job not found", code="job_not_found")
    # Lock order everywhere: the document row first, then its jobs.
    lock_for_update(Document.objects.filter(id=document_id)).first()
    job = CompilationJob.objects.select_for_update().filter(id=job_uuid).first()
    if job is None:
        raise NotFound("job not found", code="job_not_found")
    return job


def cancel_job(job_id) -> CompilationJob:
    """Cancel a live attempt; returns it ``canceled``.

    The attempt's lease is revoked in the same commit, so the worker (if any) writes nothing
    more: its next lease check, at most one embedding batch later, finds the job gone, and any
    checkpoint or finish it tries is refused. Nodes and projections it built are removed; the
    document keeps its published generation if it has one, else becomes ``canceled``.

    Raises :class:`NotFound` (``job_not_found``) or :class:`Conflict` (``job_finished``, 409)
    when the attempt already ended.
    """
    with transaction.atomic():
        job = _job_for_update(job_id)
        if job.run_state in TERMINAL_RUN_STATES:
            raise Conflict(
                f"job {job.id} already ended as {job.run_state}; nothing to cancel",
                code="job_finished",
            )
        now = timezone.now()
        CompilationJob.objects.filter(id=job.id).update(
            run_state=RunState.CANCELED,
            stage=Stage.CANCELED,
            lease_token=None,
            lease_expires_at=None,
            task_id="",
            finished_at=now,
            updated_at=now,
            error_code="canceled",
            error_message="canceled by request",
            error_retryable=False,
            progress={**(job.progress or {}), "phase": "canceled", "operation": "canceled"},
        )
        _drop_nodes(KnowledgeNode.objects.filter(document_id=job.document_id, generation=job.id))
        Document.objects.filter(id=job.document_id, active_generation__isnull=True).update(
            state=DocumentState.CANCELED, updated_at=now
        )
    job.refresh_from_db()
    return job


def retry_job(job_id, *, from_checkpoint: bool = True) -> CompilationJob:
    """Start a new attempt for a failed or canceled one; returns the new ``queued`` attempt.

    With ``from_checkpoint`` the new attempt takes over the previous attempt's parse artifact
    (the last checkpoint kept after a failure) and starts at ``parsed``; chunks and vectors are
    always rebuilt, because a failed attempt's partial nodes are removed. The new attempt links
    to the old one (``retry_of``) and is dispatched after the commit.

    Raises :class:`NotFound`, or :class:`Conflict` (409): ``job_live`` (still running or
    queued), ``job_succeeded`` (already published) or ``job_superseded`` (a newer upload or
    attempt replaced it).
    """
    with transaction.atomic():
        job = _job_for_update(job_id)
        if job.run_state in LIVE_RUN_STATES:
            raise Conflict(f"job {job.id} is still {job.run_state}", code="job_live")
        if job.run_state == RunState.SUCCEEDED:
            raise Conflict(f"job {job.id} already succeeded", code="job_succeeded")
        newer = CompilationJob.objects.filter(
            document_id=job.document_id, created_at__gt=job.created_at
        )
        if job.run_state == RunState.SUPERSEDED or newer.exists():
            raise Conflict(
                f"job {job.id} was replaced by a newer attempt of its document",
                code="job_superseded",
            )
        attempt = CompilationJob.objects.create(
            tenant_id=job.tenant_id,
            space_id=job.space_id,
            document_id=job.document_id,
            retry_of=job,
            attempt_number=job.attempt_number + 1,
        )
        if from_checkpoint and ParseArtifact.objects.filter(job_id=job.id).update(job=attempt):
            CompilationJob.objects.filter(id=attempt.id).update(
                stage=Stage.PARSED,
                progress_percent=PROGRESS[Stage.PARSED],
                progress=_progress(
                    "parsed", "resumed from the parse checkpoint", PROGRESS[Stage.PARSED]
                ),
            )
        Document.objects.filter(id=job.document_id, active_generation__isnull=True).update(
            state=DocumentState.QUEUED, updated_at=timezone.now()
        )
        Document.objects.filter(id=job.document_id).update(error_code="", error_message="")
        enqueue_on_commit(attempt.id)
    attempt.refresh_from_db()
    return attempt


# --- recovery -------------------------------------------------------------------------------


@dataclass
class SweepReport:
    """What one recovery sweep did (counts of jobs)."""

    redispatched_undelivered: int = 0
    requeued_expired: int = 0
    failed_expired: int = 0
    retries_due: int = 0
    dispatched: int = 0
    orphan_nodes_removed: int = 0
    index_builds: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _locked_batch(qs, batch: int) -> list[CompilationJob]:
    """Up to ``batch`` rows of ``qs`` locked for this transaction (skipping locked ones)."""
    if connection.features.has_select_for_update_skip_locked:
        qs = qs.select_for_update(skip_locked=True)
    else:
        qs = qs.select_for_update()
    return list(qs.order_by("updated_at")[:batch])


def _timeout_recorded(task_id: str) -> bool:
    """Whether django-q2 recorded the delivery ``task_id`` as failed by its timeout."""
    from django_q.models import Task

    if not task_id:
        return False
    result = (
        Task.objects.filter(name=f"compile:{task_id}", success=False)
        .values_list("result", flat=True)
        .first()
    )
    return bool(result) and "timeout" in str(result).lower()


def recover_jobs(*, batch: int = 200, now=None) -> SweepReport:
    """The recovery sweep: re-dispatch or fail every attempt that lost its way.

    * ``queued`` with a claim older than ``KNOWLEDGE_JOB_DISPATCH_GRACE_SECONDS`` (claimed but
      never delivered: the broker lost it, or the dispatcher died between claim and enqueue):
      enqueued again with the same delivery id, so a message that was only delayed still works
      and whichever copy arrives first does the job (the claim is a compare-and-set).
    * ``queued`` without a claim for more than a few seconds (a failed enqueue): dispatched.
    * ``running`` with an expired lease (the worker died or hangs): failed as ``timeout`` if
      django-q2 recorded the delivery as timed out, failed as ``worker_lost`` once
      ``KNOWLEDGE_JOB_MAX_ATTEMPTS`` deliveries started, else put back to ``queued`` (the next
      delivery resumes from the last checkpoint). Each action re-checks that the lease is
      still expired, so a worker that renewed it meanwhile keeps its job.
    * nodes left by attempts that ended without publishing (see :func:`_remove_orphan_nodes`).
    * ``retry_wait`` whose ``next_attempt_at`` passed: back to ``queued``.

    Rows are taken in bounded batches with ``SELECT … FOR UPDATE SKIP LOCKED`` where the
    database has it, and every state change is a compare-and-set, so two sweeps never act on
    one job twice. Returns a :class:`SweepReport`.
    """
    now = now or timezone.now()
    report = SweepReport()
    grace = timedelta(seconds=settings.KNOWLEDGE_JOB_DISPATCH_GRACE_SECONDS)
    to_dispatch: list[uuid.UUID] = []
    to_redeliver: list[tuple[uuid.UUID, str]] = []
    with transaction.atomic():
        for job in _locked_batch(
            CompilationJob.objects.filter(
                run_state=RunState.QUEUED, dispatched_at__lt=now - grace
            ).exclude(task_id=""),
            batch,
        ):
            if CompilationJob.objects.filter(
                id=job.id, run_state=RunState.QUEUED, task_id=job.task_id
            ).update(dispatched_at=now, updated_at=now):
                to_redeliver.append((job.id, job.task_id))
    with transaction.atomic():
        for job in _locked_batch(
            CompilationJob.objects.filter(
                run_state__in=[RunState.QUEUED, RunState.DISPATCH_PENDING],
                task_id="",
                updated_at__lt=now - timedelta(seconds=5),
            ),
            batch,
        ):
            CompilationJob.objects.filter(id=job.id, task_id="").update(
                run_state=RunState.QUEUED, updated_at=now
            )
            to_dispatch.append(job.id)
    expired = []
    with transaction.atomic():
        for job in _locked_batch(
            CompilationJob.objects.filter(run_state=RunState.RUNNING).filter(
                Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True)
            ),
            batch,
        ):
            expired.append(
                (job.id, job.lease_token, job.task_id, job.execution_attempts, job.stage)
            )
    # Every action re-checks that the lease is still expired: a worker that renewed it since
    # (a slow keeper) keeps its job.
    still_expired = Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True)
    for job_id, token, task_id, attempts, stage in expired:
        if _timeout_recorded(task_id):
            if fail(
                job_id,
                token,
                "timeout",
                "compilation exceeded the worker timeout",
                condition=still_expired,
            ):
                report.failed_expired += 1
        elif attempts >= settings.KNOWLEDGE_JOB_MAX_ATTEMPTS:
            if fail(
                job_id,
                token,
                "worker_lost",
                f"the worker stopped {attempts} times while compiling this document "
                "(killed, out of memory or restarted); retry it when the cause is fixed",
                retryable=True,
                condition=still_expired,
            ):
                report.failed_expired += 1
        elif CompilationJob.objects.filter(
            still_expired, id=job_id, run_state=RunState.RUNNING, lease_token=token
        ).update(
            run_state=RunState.QUEUED,
            lease_token=None,
            lease_expires_at=None,
            worker_id="",
            task_id="",
            dispatched_at=None,
            updated_at=now,
            progress=_progress(
                "queued", "the worker stopped; queued again", PROGRESS.get(stage, 0)
            ),
            progress_percent=PROGRESS.get(stage, 0),
        ):
            report.requeued_expired += 1
            to_dispatch.append(job_id)
    with transaction.atomic():
        for job in _locked_batch(
            CompilationJob.objects.filter(run_state=RunState.RETRY_WAIT, next_attempt_at__lte=now),
            batch,
        ):
            if CompilationJob.objects.filter(id=job.id, run_state=RunState.RETRY_WAIT).update(
                run_state=RunState.QUEUED, task_id="", next_attempt_at=None, updated_at=now
            ):
                report.retries_due += 1
                to_dispatch.append(job.id)
    for job_id in dict.fromkeys(to_dispatch):
        if dispatch(job_id):
            report.dispatched += 1
    for job_id, delivery in to_redeliver:
        if _enqueue(job_id, delivery):
            report.redispatched_undelivered += 1
    report.orphan_nodes_removed = _remove_orphan_nodes(batch=batch * 25)
    report.index_builds = _recover_index_builds()
    if any(report.as_dict().values()):
        logger.info("recovery sweep: %s", report.as_dict())
    return report


def _remove_orphan_nodes(*, batch: int) -> int:
    """Remove up to ``batch`` nodes (with projections) of attempts that ended without publishing.

    Normally an ending attempt removes its own nodes; a worker killed right after a django-q2
    timeout may leave them. They are invisible to queries; this only reclaims the space.
    """
    ended = CompilationJob.objects.filter(
        run_state__in=[RunState.FAILED, RunState.CANCELED, RunState.SUPERSEDED]
    ).values("id")
    ids = list(
        KnowledgeNode.objects.filter(generation__in=ended)
        .exclude(generation=F("document__active_generation"))
        .values_list("id", flat=True)[:batch]
    )
    if ids:
        with transaction.atomic():
            _drop_nodes(KnowledgeNode.objects.filter(id__in=ids))
    return len(ids)


def _recover_index_builds() -> int:
    return projector().recover_builds()


def drain_queued(
    space_id: uuid.UUID | None = None,
    *,
    document_ids: list | None = None,
    on_progress=None,
    wait_for_retries: bool = True,
) -> int:
    """Compile every queued job in-process (for ``kfs ingest --wait`` and evaluation).

    Jobs are taken in batches of ``KNOWLEDGE_COMPILE_BATCH_DOCUMENTS``; a job a worker cluster
    claims first is simply skipped; ``document_ids`` limits the drain to those documents' jobs.
    With ``wait_for_retries`` a job in ``retry_wait`` is waited
    for and compiled again when due (attempts are bounded, so this ends). ``on_progress(n)`` is
    called with the number of jobs done in each batch. Returns how many deliveries were made.
    """
    done = 0
    batch_size = settings.KNOWLEDGE_COMPILE_BATCH_DOCUMENTS
    scope = CompilationJob.objects.all()
    if space_id is not None:
        scope = scope.filter(space_id=space_id)
    if document_ids is not None:
        scope = scope.filter(document_id__in=document_ids)
    while True:
        qs = scope.filter(run_state=RunState.QUEUED)
        oldest = qs.order_by("created_at").values_list("space_id", flat=True).first()
        # One space per batch: a batch shares one set of embedding targets.
        batch = list(
            qs.filter(space_id=oldest)
            .order_by("created_at")
            .values_list("id", flat=True)[:batch_size]
        )
        if batch:
            compile_jobs(batch)
            done += len(batch)
            if on_progress:
                on_progress(len(batch))
            continue
        due = scope.filter(run_state=RunState.RETRY_WAIT).order_by("next_attempt_at").first()
        if not wait_for_retries or due is None:
            return done
        pause = (due.next_attempt_at - timezone.now()).total_seconds() if due.next_attempt_at else 0
        time.sleep(min(max(pause, 0.0), 60.0))
        scope.filter(run_state=RunState.RETRY_WAIT, next_attempt_at__lte=timezone.now()).update(
            run_state=RunState.QUEUED, task_id="", next_attempt_at=None, updated_at=timezone.now()
        )


RECOVERY_SCHEDULE = "knowledgefs.recover_jobs"


def ensure_recovery_schedule():
    """Create or repair the django-q2 schedule that runs :func:`recover_jobs`; returns it.

    The interval is ``KNOWLEDGE_JOB_SWEEP_INTERVAL_SECONDS`` rounded up to whole minutes (the
    unit of django-q2 schedules); migration ``ingestion.0003`` creates the same schedule.
    """
    from django_q.models import Schedule

    minutes = max(1, math.ceil(settings.KNOWLEDGE_JOB_SWEEP_INTERVAL_SECONDS / 60))
    schedule, _ = Schedule.objects.update_or_create(
        name=RECOVERY_SCHEDULE,
        defaults={
            "func": "ingestion.tasks.recover_jobs",
            "schedule_type": Schedule.MINUTES,
            "minutes": minutes,
            "repeats": -1,
        },
    )
    return schedule
