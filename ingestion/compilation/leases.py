"""The lease protocol: claiming queued jobs, holding and renewing their leases, fenced writes.

A delivery starts a job only by a compare-and-set from ``queued`` that issues a fresh
``lease_token``; every later write (heartbeat, checkpoint, requeue) is conditioned on the job's
token and ``running``, so a stale worker, a duplicate delivery or a late message changes nothing.
:class:`Held` is what one worker holds; its keeper thread extends the leases while the
compiling thread makes progress. Jobs are claimed in id order, in one transaction, and the
document rows are touched only after that commit (the lock order is document, then job).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast
from django.utils import timezone

from ingestion.compilation.errors import LeaseLost
from ingestion.compilation.progress import PROGRESS
from ingestion.models import CompilationJob, Document, DocumentState, RunState

logger = logging.getLogger("knowledgefs.compilation")


def lease_seconds() -> int:
    return settings.KNOWLEDGE_JOB_LEASE_SECONDS


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


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
    """One SQL expression that gives each row its own value: ``CASE pk WHEN … THEN … END``.

    ``values`` maps a row's primary key to the value of ``field_name`` for that row; rows not
    in it keep their current value. Lets a wave write each job's own
    progress (or each document's node count) in the single UPDATE of its checkpoint instead of
    one UPDATE per row. The statement is written directly with the values as parameters,
    prepared by the field as a save would (Django's ``Case``/``When`` resolved a filter per
    row, most of compilation's remaining overhead, docs/benchmarks.md); cast like Django's
    ``bulk_update`` where the database needs it (PostgreSQL types a CASE of parameters as
    text).
    """
    field = model._meta.get_field(field_name)
    if not values:
        return F(field.attname)
    pk = model._meta.pk
    quote = connection.ops.quote_name
    params: list = []
    for key, value in values.items():
        params += [pk.get_db_prep_value(key, connection), field.get_db_prep_save(value, connection)]
    branches = " ".join(["WHEN %s THEN %s"] * len(values))
    sql = f"CASE {quote(pk.column)} {branches} ELSE {quote(field.column)} END"
    case: RawSQL | Cast = RawSQL(sql, params, output_field=field)
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
