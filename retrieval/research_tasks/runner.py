"""One delivery of a research task: :func:`retrieval.research.run_research` with ``durable=True``.

The delivery starts through :func:`.dispatch.begin` (``queued`` → ``running`` with its delivery
id) and hands Research the task's ``checkpoint`` with two callbacks:

* ``save_checkpoint(dict)`` — a fenced write of the checkpoint (and the stage it implies, and
  the partial evidence of a finished round when the checkpoint carries one); when the delivery
  no longer owns the task it raises :class:`.dispatch.ClaimLost`, which ends the run with
  nothing more written.
* ``should_stop()`` — ``True`` once the task was canceled or taken back (read from the row at most
  every :data:`STOP_POLL_SECONDS`; Research asks between steps and during a model call) or the
  hard stop passed: the task's ``timeout_ms`` plus :data:`STOP_GRACE_SECONDS`.

Research is also given ``deadline_s`` (what is left of the delivery's ``timeout_ms``) and the
task's ``max_model_calls``: it starts no model call past them and ends ``completed`` with
``budget_exhausted`` and the evidence it has. Each save also brings ``elapsed_ms`` up to date
(the task's earlier deliveries plus this one so far), so a canceled delivery's time counts.

The result, its final partial and ``completed`` are one fenced commit. A failure is a fenced
``failed`` with a stable code: ``research_timeout`` only when Research was still running at the
hard stop (a step, such as a recall, hung past the whole budget: no result to give), a retrieval
error's own code such as ``embedding_model_unavailable``, or ``internal_error``; the checkpoint
is kept, so ``resume`` repeats no finished model call. Safe to deliver twice: a second delivery
is refused by :func:`.dispatch.begin` and writes nothing.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from knowledgefs.errors import ServiceError
from retrieval.research import ROUNDS_KEY, SPENT_KEY
from retrieval.research.images import STEP as IMAGE_STEP

from . import dispatch
from .dispatch import ClaimLost
from .models import ResearchTask, ResearchTaskPartial, RunState, Stage

logger = logging.getLogger("knowledgefs.research_tasks")

STOP_POLL_SECONDS = 0.5
"""``should_stop`` reads the task row at most this often, so a cancel is seen within about a
second of its commit (Research polls between steps and, during a model call, every 0.2 s)."""
STOP_GRACE_SECONDS = 20
"""How long past its ``timeout_ms`` a delivery lets Research finish (recall, rerank and ranking
after its last model call; persisting) before ``should_stop`` ends it as ``research_timeout``.
Ours; below :data:`.dispatch.DELIVERY_MARGIN_SECONDS` (30 s), so the worker's own timeout never
comes first."""
ROUND_EVIDENCE_KEY = ROUNDS_KEY
"""The checkpoint member Research fills with the evidence of each finished retrieval round
(``[{"items": [...], "metrics": {...}}, ...]``); each new round becomes a ``round`` partial."""
ANALYSIS_STEPS = ("judge", "supplemental", "supplement")
"""Checkpoint steps after which the task is ``analyzing`` (before them: ``retrieving`` once the
planner finished or a round was recorded, ``planning`` before)."""


def stage_for(checkpoint: dict) -> str:
    """The public stage a checkpoint implies (see :data:`ANALYSIS_STEPS`; ``spent`` is
    bookkeeping and implies nothing)."""
    if any(step in checkpoint for step in ANALYSIS_STEPS):
        return Stage.ANALYZING
    if any(key not in (ROUND_EVIDENCE_KEY, SPENT_KEY, IMAGE_STEP) for key in checkpoint):
        return Stage.RETRIEVING
    if checkpoint.get(ROUND_EVIDENCE_KEY):
        return Stage.RETRIEVING
    return Stage.PLANNING


class _Delivery:
    """The callbacks Research gets for one delivery, and what they observed."""

    def __init__(self, task: ResearchTask, delivery: str) -> None:
        self.task_pk = task.id
        self.delivery = delivery
        self.started = time.monotonic()
        timeout_ms = task.limits.get("timeout_ms") or settings.KNOWLEDGE_RESEARCH_TASK_TIMEOUT_MS
        self.timeout_ms = timeout_ms
        self.deadline = self.started + timeout_ms / 1000
        self.hard_stop = self.deadline + STOP_GRACE_SECONDS
        self.elapsed_before = task.elapsed_ms or 0
        self.max_model_calls = task.limits.get("max_model_calls")
        rounds = (task.checkpoint if isinstance(task.checkpoint, dict) else {}).get(
            ROUND_EVIDENCE_KEY
        )
        self.rounds_saved = len(rounds) if isinstance(rounds, list) else 0
        self.lost = False
        self.timed_out = False
        self._polled = 0.0

    def elapsed_ms(self) -> int:
        return round((time.monotonic() - self.started) * 1000)

    def remaining_s(self) -> float:
        """Seconds left of this delivery's ``timeout_ms`` (Research's ``deadline_s``)."""
        return max(0.0, self.deadline - time.monotonic())

    def save_checkpoint(self, checkpoint: dict) -> None:
        """Persist ``checkpoint`` (fenced); raises :class:`ClaimLost` when no longer ours."""
        rounds = list(checkpoint.get(ROUND_EVIDENCE_KEY) or [])
        now = timezone.now()
        with transaction.atomic():
            updated = dispatch.held(self.task_pk, self.delivery).update(
                checkpoint=checkpoint,
                stage=stage_for(checkpoint),
                elapsed_ms=self.elapsed_before + self.elapsed_ms(),
                heartbeat_at=now,
                updated_at=now,
            )
            if not updated:
                self.lost = True
                raise ClaimLost(str(self.task_pk))
            for evidence in rounds[self.rounds_saved :]:
                _add_partial(self.task_pk, "round", evidence)
        self.rounds_saved = max(self.rounds_saved, len(rounds))

    def should_stop(self) -> bool:
        """``True`` when canceled, taken back or past the hard stop (see the module)."""
        if self.lost:
            return True
        now = time.monotonic()
        if now >= self.hard_stop:
            self.timed_out = True
            return True
        if now - self._polled >= STOP_POLL_SECONDS:
            self._polled = now
            if not dispatch.held(self.task_pk, self.delivery).exists():
                self.lost = True
        return self.lost


def _add_partial(task_pk, kind: str, evidence: dict) -> ResearchTaskPartial:
    last = ResearchTaskPartial.objects.filter(task_id=task_pk).aggregate(n=Max("sequence"))["n"]
    return ResearchTaskPartial.objects.create(
        task_id=task_pk, sequence=(last or 0) + 1, kind=kind, evidence=evidence
    )


def run_delivery(task_pk, delivery: str) -> str:
    """Run the task for the delivery ``delivery``; returns what happened: ``stale`` (not this
    delivery's task: nothing written), ``lost`` (canceled or taken back meanwhile: nothing more
    written), ``failed`` or ``completed``."""
    task = dispatch.begin(task_pk, delivery)
    if task is None:
        logger.info("research task %s: delivery %s is stale or a duplicate", task_pk, delivery)
        return "stale"
    run = _Delivery(task, delivery)
    resumed_stage = stage_for(task.checkpoint or {})
    if resumed_stage != Stage.PLANNING:  # a resumed run: show the progress it resumes from
        dispatch.held(task.id, delivery).update(stage=resumed_stage)
    try:
        result = _research(task, run)
    except ClaimLost:
        return "lost"
    except _Stopped:
        if run.timed_out and not run.lost:
            return _failed(
                run,
                "research_timeout",
                f"the research was still running {STOP_GRACE_SECONDS} s past its "
                f"{run.timeout_ms} ms wall clock, with no result; resume it to continue from "
                "its checkpoint",
            )
        return "lost"
    except ServiceError as exc:
        return _failed(run, exc.code, exc.message)
    except Exception:  # noqa: BLE001 - any other error fails the task (fenced)
        logger.exception("research task %s failed", task.id)
        # The exception text stays in the log: callers get a stable code and a plain message.
        return _failed(
            run,
            "internal_error",
            "the research task failed on an internal error; resume it to retry from its "
            "checkpoint, or contact the operator",
        )
    return _complete(task, run, result)


class _Stopped(Exception):
    pass


def _research(task: ResearchTask, run: _Delivery):
    from retrieval.research import ResearchCanceled, run_research

    from .service import _require_searchable

    _require_searchable(task.space)
    try:
        return run_research(
            task.space,
            task.query,
            top_k=task.top_k,
            score_threshold=task.score_threshold,
            filters=task.filters,
            durable=True,
            checkpoint=dict(task.checkpoint or {}),
            save_checkpoint=run.save_checkpoint,
            should_stop=run.should_stop,
            deadline_s=run.remaining_s(),
            max_model_calls=run.max_model_calls,
            query_images=[
                str(r.get("upload_file_id"))
                for r in (task.query_images or [])
                if isinstance(r, dict) and r.get("upload_file_id")
            ],
            # whom Dify checks the images' ownership against, as for an interactive query
            subject=task.subject or (f"api-key:{task.api_key_id}" if task.api_key_id else ""),
        )
    except ResearchCanceled:
        raise _Stopped() from None


def _failed(run: _Delivery, code: str, message: str) -> str:
    if dispatch.fail(run.task_pk, run.delivery, code, message):
        ResearchTask.objects.filter(id=run.task_pk).update(
            elapsed_ms=run.elapsed_before + run.elapsed_ms()
        )
        logger.warning("research task %s failed: %s", run.task_pk, code)
        return "failed"
    return "lost"


def _complete(task: ResearchTask, run: _Delivery, result) -> str:
    body = result.as_dict()
    evidence = {"items": body["items"], "metrics": body["metrics"]}
    now = timezone.now()
    try:
        with transaction.atomic():
            _add_partial(task.id, "final", evidence)
            if not dispatch.held(task.id, run.delivery).update(
                run_state=RunState.COMPLETED,
                stage=Stage.COMPLETED,
                result=body,
                task_id=None,
                claimed_at=None,
                step_started_at=None,
                elapsed_ms=run.elapsed_before + run.elapsed_ms(),
                finished_at=now,
                updated_at=now,
            ):
                raise ClaimLost(str(task.id))
    except ClaimLost:
        return "lost"
    return "completed"
