"""The claim-before-enqueue protocol, once, for the dispatchers configured on it (upgrade jobs:
upgrades/services/dispatch.py; research tasks: retrieval/research_tasks/dispatch.py).

A :class:`ClaimedRunQueue` drives one model whose rows carry a state field with a queued, a
running and a failed value, ``task_id`` (the claim: one delivery's id), ``claimed_at``,
``step_started_at``, ``attempt_count`` and ``updated_at``:

* **claim before enqueue** (:meth:`~ClaimedRunQueue.dispatch`): a compare-and-set writes a fresh
  ``task_id`` and ``claimed_at`` on a queued row without a claim (and due, when the queue has a
  due condition) and commits; only then is ``(row id, task id)`` published. A failed publish
  releases the claim if it is still ours; the sweep dispatches it again. Inside a transaction
  use :meth:`~ClaimedRunQueue.dispatch_on_commit` (``on_commit(robust=True)``).
* **start** (:meth:`~ClaimedRunQueue.begin`): a delivery starts only by the compare-and-set
  queued → running with its own ``task_id`` (counting ``attempt_count``); anything else is
  refused without a write.
* **fenced writes** (:meth:`~ClaimedRunQueue.held`, :meth:`~ClaimedRunQueue.fail`): conditioned
  on running with the delivery's ``task_id``; a row taken back matches nothing (:class:`ClaimLost`).
* **sweep** (:meth:`~ClaimedRunQueue.sweep`): claims older than the grace setting are cleared by
  compare-and-set and dispatched again; running rows whose step started longer ago than the
  stale setting are failed ``attempts_exhausted`` at the attempts setting, else put back to
  queued and dispatched; unclaimed queued rows unchanged for :data:`UNCLAIMED_SETTLE_SECONDS`
  are dispatched. Rows are read under ``FOR UPDATE SKIP LOCKED`` where the database has it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Model, Q, QuerySet
from django.utils import timezone

RowT = TypeVar("RowT", bound=Model)

UNCLAIMED_SETTLE_SECONDS = 5
"""An unclaimed queued row is dispatched by the sweep only once unchanged this long, so the sweep
does not race the on-commit dispatch of the request that queued it."""


class ClaimLost(Exception):
    """A fenced write found the row no longer running under this delivery's ``task_id``."""


@dataclass
class SweepReport:
    """What one recovery sweep did, in rows: claims cleared because their message was never
    delivered, stale runs put back to ``queued``, rows failed ``attempts_exhausted``, and rows
    dispatched under a fresh claim."""

    undelivered_reclaimed: int = 0
    stale_requeued: int = 0
    attempts_exhausted: int = 0
    dispatched: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def locked_batch(queryset: QuerySet[RowT], batch: int) -> list[RowT]:
    """Up to ``batch`` rows of ``queryset``, least recently updated first, locked ``FOR UPDATE
    SKIP LOCKED`` where the database has it (PostgreSQL, MySQL 8, MariaDB 10.6), else ``FOR
    UPDATE`` (SQLite ignores row locks; its write transactions serialise), so concurrent sweeps
    never act on one row twice. Call it inside a transaction."""
    if connection.features.has_select_for_update_skip_locked:
        queryset = queryset.select_for_update(skip_locked=True)
    else:
        queryset = queryset.select_for_update()
    return list(queryset.order_by("updated_at")[:batch])


def _no_fields(*_args: object) -> dict[str, Any]:
    return {}


def _nothing(*_args: object) -> None:
    return None


@dataclass
class ClaimedRunQueue:
    """One model's claim-before-enqueue queue; the hooks are what the two dispatchers differ in.

    ``state_field`` names the state column, ``queued``/``running``/``failed`` its values.
    ``*_setting`` name the settings read at each sweep (seconds, seconds, deliveries). The
    message is ``task_path(str(pk), task_id)`` with ``task_name=f"{group}:{task_id}"``,
    ``group=group``, ``timeout=timeout(pk)`` (read before the publish is tried) and, when
    ``broker()`` returns one, ``broker`` (built inside the tried publish).
    """

    model: type[Model]
    state_field: str
    queued: str
    running: str
    failed: str
    task_path: str
    group: str
    logger: logging.Logger
    publish_error: str
    """``logger.exception`` line of a failed publish, with one ``%s`` for the row id."""
    sweep_label: str
    """The sweep's ``logger.info`` line is ``f"{sweep_label}: %s"`` with the report."""
    grace_setting: str
    stale_setting: str
    attempts_setting: str
    timeout: Callable[[Any], int]
    failed_fields: Callable[[str, str, Any], dict[str, Any]]
    """``(code, message, now)`` → the model's error and finish fields of a failed row."""
    exhausted_message: Callable[[Any], str]
    """The row (read by the sweep) → the ``attempts_exhausted`` message."""
    broker: Callable[[], Any] = _nothing
    due: Callable[[Any], Q] | None = None
    """``now`` → the condition a queued row must meet to be claimed (a countdown). A queue with
    one claims at the sweep's clock (one clock for the due check and the claim); without one, a
    sweep's dispatch claims at the wall clock."""
    begin_fields: Callable[[Any], dict[str, Any]] = _no_fields
    """``now`` → further fields the start's compare-and-set writes."""
    after_begin: Callable[[uuid.UUID, Any], None] = _nothing
    """``(row uuid, now)`` after a start that matched (inside its transaction when atomic)."""
    begin_atomic: bool = False
    load: Callable[[uuid.UUID], Any] | None = None
    """Row uuid → the running row :meth:`begin` returns (default ``objects.get``)."""
    requeue_fields: dict[str, Any] = field(default_factory=dict)
    """Further fields the sweep writes when it puts a stale run back to queued."""

    def _state(self, value: str) -> dict[str, str]:
        return {self.state_field: value}

    def _rows(self) -> QuerySet[Any]:
        """All rows of :attr:`model` (its default manager). The queue serves several models,
        so a row is typed ``Any``: it has the fields the module docstring names."""
        return self.model._default_manager.all()

    # --- claim and publish ----------------------------------------------------------------------

    def dispatch(self, pk: uuid.UUID | str, *, now: datetime | None = None) -> str | None:
        """Claim a queued unclaimed (due) row with a fresh task id, commit, then publish it.

        Returns the task id, or ``None`` when there was nothing to claim or the publish failed
        (the claim is then released so the sweep can try again). Must run outside a transaction
        unless the broker is the ORM (its message is a row of the same transaction).
        """
        if connection.in_atomic_block and not settings.Q_CLUSTER.get("orm"):
            raise RuntimeError("dispatch() must run after the commit: use dispatch_on_commit()")
        task_id = uuid.uuid4().hex
        now = now or timezone.now()
        rows = self._rows().filter(id=pk, **self._state(self.queued), task_id__isnull=True)
        if self.due is not None:
            rows = rows.filter(self.due(now))
        if not rows.update(task_id=task_id, claimed_at=now, updated_at=now):
            return None
        return task_id if self._publish(pk, task_id) else None

    def dispatch_on_commit(self, pk: uuid.UUID | str) -> None:
        """Dispatch once the surrounding transaction commits (``robust``: a failure is logged,
        the row stays queued and the sweep dispatches it)."""
        transaction.on_commit(lambda: self.dispatch(pk), robust=True)

    def _publish(self, pk: uuid.UUID | str, task_id: str) -> bool:
        """Publish ``(pk, task id)``; on failure release the claim if it is still ours."""
        from django_q.tasks import async_task

        timeout = self.timeout(pk)
        try:
            options: dict[str, Any] = {"task_name": f"{self.group}:{task_id}", "group": self.group}
            options["timeout"] = timeout
            broker = self.broker()
            if broker is not None:
                options["broker"] = broker
            async_task(self.task_path, str(pk), task_id, **options)
        except Exception:  # noqa: BLE001 - the broker failed: release our claim, the sweep retries
            self.logger.exception(self.publish_error, pk)
            self.release_claim(pk, task_id)
            return False
        return True

    def release_claim(self, pk: uuid.UUID | str, task_id: str) -> bool:
        """Clear the claim only if the row is still queued under ``task_id``; returns whether."""
        return bool(
            self._rows()
            .filter(id=pk, **self._state(self.queued), task_id=task_id)
            .update(task_id=None, claimed_at=None, updated_at=timezone.now())
        )

    # --- delivery start and fenced writes --------------------------------------------------------

    def begin(self, pk: uuid.UUID | str, task_id: str) -> Any:
        """Start a delivery: compare-and-set queued → running with this ``task_id``.

        Sets ``step_started_at``, counts ``attempt_count`` (plus :attr:`begin_fields`), then runs
        :attr:`after_begin`. Returns the running row, or ``None`` for a stale, duplicate or
        refused delivery (nothing written).
        """
        try:
            row_uuid = uuid.UUID(str(pk))
        except ValueError:
            return None
        now = timezone.now()
        with transaction.atomic() if self.begin_atomic else nullcontext():
            started = (
                self._rows()
                .filter(id=row_uuid, **self._state(self.queued), task_id=task_id)
                .update(
                    **self._state(self.running),
                    **self.begin_fields(now),
                    step_started_at=now,
                    attempt_count=F("attempt_count") + 1,
                    updated_at=now,
                )
            )
            if not started:
                return None
            self.after_begin(row_uuid, now)
        return self.load(row_uuid) if self.load else self._rows().get(id=row_uuid)

    def held(self, pk: uuid.UUID | str, task_id: str) -> QuerySet[Any]:
        """The queryset matching the row only while this delivery owns it."""
        return self._rows().filter(id=pk, **self._state(self.running), task_id=task_id)

    def fail(
        self,
        pk: uuid.UUID | str,
        task_id: str,
        code: str,
        message: str,
        *,
        condition: Q | None = None,
    ) -> bool:
        """Fail the row with ``code`` and ``message`` only while this delivery owns it (and
        ``condition`` holds); clears the claim. Returns whether the row was failed."""
        now = timezone.now()
        rows = self.held(pk, task_id)
        if condition is not None:
            rows = rows.filter(condition)
        return bool(
            rows.update(
                **self._state(self.failed),
                task_id=None,
                claimed_at=None,
                step_started_at=None,
                **self.failed_fields(code, message, now),
                updated_at=now,
            )
        )

    # --- the sweep ------------------------------------------------------------------------------

    def sweep(self, *, batch: int = 200, now: datetime | None = None) -> SweepReport:
        """One pass of recovery (see the module docstring); at most ``batch`` rows per part."""
        now = now or timezone.now()
        report = SweepReport()
        to_dispatch: list[uuid.UUID] = []
        rows = self._rows()
        grace = timedelta(seconds=getattr(settings, self.grace_setting))
        stale = timedelta(seconds=getattr(settings, self.stale_setting))
        with transaction.atomic():
            for row in locked_batch(
                rows.filter(
                    **self._state(self.queued), task_id__isnull=False, claimed_at__lt=now - grace
                ),
                batch,
            ):
                if self.release_claim(row.id, row.task_id):
                    report.undelivered_reclaimed += 1
                    to_dispatch.append(row.id)
        with transaction.atomic():
            for row in locked_batch(
                rows.filter(**self._state(self.running)).filter(
                    Q(step_started_at__lt=now - stale) | Q(step_started_at__isnull=True)
                ),
                batch,
            ):
                if row.attempt_count >= getattr(settings, self.attempts_setting):
                    if self.fail(
                        row.id, row.task_id, "attempts_exhausted", self.exhausted_message(row)
                    ):
                        report.attempts_exhausted += 1
                elif self.held(row.id, row.task_id).update(
                    **self._state(self.queued),
                    **self.requeue_fields,
                    task_id=None,
                    claimed_at=None,
                    step_started_at=None,
                    updated_at=now,
                ):
                    report.stale_requeued += 1
                    to_dispatch.append(row.id)
        unclaimed = rows.filter(**self._state(self.queued), task_id__isnull=True)
        if self.due is not None:
            unclaimed = unclaimed.filter(self.due(now))
        to_dispatch.extend(
            unclaimed.filter(updated_at__lt=now - timedelta(seconds=UNCLAIMED_SETTLE_SECONDS))
            .exclude(id__in=to_dispatch)
            .order_by("updated_at")
            .values_list("id", flat=True)[:batch]
        )
        claim_clock = now if self.due is not None else None
        for pk in dict.fromkeys(to_dispatch):
            if self.dispatch(pk, now=claim_clock):
                report.dispatched += 1
        if any(report.as_dict().values()):
            self.logger.info(f"{self.sweep_label}: %s", report.as_dict())
        return report
