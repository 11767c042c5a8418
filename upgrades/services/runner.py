"""The staged run: one bounded step per delivery (docs/upgrades.md, "Staged run").

Stages (bridge specification §2.2): ``validating`` (create the knowledge space, resolve the
configuration) → ``waiting_for_space`` (its profile usable; bounded by time, G5) →
``creating_sources`` (always skipped: only ``upload_file`` documents are accepted) →
``submitting_documents`` (one legacy document per step, admitted as an ordinary document of the
new space) → ``migrating_access`` (what maps is recorded) → ``finalizing`` (success and the
first reconciliation lease in one transaction) → ``completed``.

A delivery starts through :func:`upgrades.services.dispatch.begin`; every write is fenced by the
delivery's ``task_id`` and every checkpoint hands the job back to ``queued`` in the same commit;
the next step is dispatched through the claim after the commit.
"""

from __future__ import annotations

import errno
import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.db import connection, transaction
from django.utils import timezone

from knowledgefs import storage
from knowledgefs.auth.principal import Principal
from knowledgefs.dify.errors import DifyError, ObjectStorageError
from knowledgefs.errors import Conflict, ServiceError
from spaces.models import KnowledgeSpace
from upgrades.models import DocumentStatus, JobStage, JobStatus, UpgradeDocument, UpgradeJob

from . import dispatch
from .dispatch import ClaimLost, checkpoint, held
from .leases import release_if_unreferenced

logger = logging.getLogger("knowledgefs.upgrades")

SPACE_POLL_SECONDS = 30
"""A space that is not usable yet is looked at again after this many seconds (the sweep runs
every minute, so in practice at the next sweep after this)."""
SPACE_SLUG_PREFIX = "upgrade-"
#: Space profile states that let documents be admitted (a pending space validates itself at its
#: first compilation).
USABLE_STATES = ("ready", "pending-validation")


class StepFailure(Exception):
    """The step cannot succeed without someone changing something: the job fails with ``code``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Outcome:
    """What a step did: ``result`` (for logs and tests) and whether to dispatch the next step
    right after the commit (``False`` when a countdown or a terminal state was written)."""

    result: str
    dispatch_next: bool = True


def run_step(job_id: uuid.UUID | str, task_id: str) -> str:
    """Run one step of the job for the delivery ``task_id``; returns what happened:
    ``stale`` (not this delivery's job: nothing written), ``lost`` (the claim was taken away
    during the step: nothing of it committed), ``failed``, or the step's result
    (``space_created``, ``space_ready``, ``space_waiting``, ``document_submitted``,
    ``document_failed``, ``documents_done``, ``access_migrated``, ``succeeded``, …)."""
    job = dispatch.begin(job_id, task_id)
    if job is None:
        logger.info("upgrade %s: delivery %s is stale or a duplicate; ignored", job_id, task_id)
        return "stale"
    try:
        if job.stage != JobStage.VALIDATING and (job.space is None or job.space.deleting_at):
            raise StepFailure(
                "space_missing", "the upgrade's knowledge space is missing or deleted"
            )
        outcome = STEPS[job.stage](job, task_id)
    except ClaimLost:
        logger.warning("upgrade %s: delivery %s lost its claim during the step", job_id, task_id)
        return "lost"
    except StepFailure as failure:
        return _failed(job, task_id, failure.code, failure.message)
    except Exception as exc:  # noqa: BLE001 - every other error fails the job (fenced), retryable
        logger.exception("upgrade %s: step %s failed", job_id, job.stage)
        code = getattr(exc, "code", None) if isinstance(exc, ServiceError) else None
        return _failed(job, task_id, code or "internal_error", f"{type(exc).__name__}: {exc}")
    if outcome.dispatch_next:
        dispatch.dispatch(job.id)
    return outcome.result


def _failed(job: UpgradeJob, task_id: str, code: str, message: str) -> str:
    """Fail the job (fenced); ``failed``, or ``lost`` when the delivery no longer owned it."""
    if dispatch.fail(job.id, task_id, code, message):
        logger.warning("upgrade %s failed at %s: %s", job.id, job.stage, code)
        return "failed"
    return "lost"


# --- validating -------------------------------------------------------------------------------


MAX_SPACE_GENERATIONS = 20
"""How many replacement spaces one job may create after its space was deleted (slugs
``upgrade-<job>-2`` … ``-20``); beyond it the step fails ``space_missing``."""


def space_slug(job: UpgradeJob, generation: int = 1) -> str:
    """The new space's slug, fixed by the job id (the idempotency key of the space creation);
    a replacement for a deleted space (retry after ``space_missing``) adds ``-<generation>``."""
    base = f"{SPACE_SLUG_PREFIX}{job.id.hex}"
    return base if generation == 1 else f"{base}-{generation}"


def _provision(job: UpgradeJob) -> KnowledgeSpace:
    """The job's space: the first slug of :func:`space_slug`'s sequence whose space is not being
    deleted (created when missing, so a repeat of the step finds the same one)."""
    from spaces.services import provision_space

    config = job.config_snapshot or {}
    for generation in range(1, MAX_SPACE_GENERATIONS + 1):
        try:
            space, _ = provision_space(
                job.tenant_id,
                name=str(config.get("name") or job.dataset_id),
                slug=space_slug(job, generation),
                description=str(config.get("description") or "")[:2000],
            )
        except ServiceError as exc:
            raise StepFailure(exc.code, f"the knowledge space could not be created: {exc}") from exc
        if space.deleting_at is None:
            return space
    raise StepFailure(
        "space_missing",
        f"the upgrade's knowledge space was deleted {MAX_SPACE_GENERATIONS} times",
    )


def _validate(job: UpgradeJob, task_id: str) -> Outcome:
    config = job.config_snapshot or {}
    space = _provision(job)
    resolved = {
        "space_slug": space.slug,
        "owner": job.owner,
        "embedding": _map_embedding(space, job),
        "retrieval": {"applied": False, "snapshot": config.get("retrieval_model")},
    }
    with transaction.atomic():
        checkpoint(
            job.id,
            task_id,
            stage=JobStage.WAITING_FOR_SPACE,
            space=space,
            resolved_configuration=resolved,
        )
    return Outcome("space_created")


def _map_embedding(space: KnowledgeSpace, job: UpgradeJob) -> dict[str, Any]:
    """Give the space the Dataset's embedding model when the runtime can use it.

    Under ``KNOWLEDGE_MODEL_RUNTIME=dify`` a snapshot with ``embedding_model_provider``
    (``<org>/<plugin>/<provider>``, or a bare built-in provider taken as ``langgenius/<p>/<p>``)
    and ``embedding_model`` becomes the space's embedding selection. Otherwise (local runtime,
    nothing in the snapshot, or a selection the profile refuses) the space keeps its default
    profile and the reason is recorded.
    """
    from knowledgefs.runtime.selection import runtime_name
    from retrieval import embedding_profile

    config = job.config_snapshot or {}
    provider = str(config.get("embedding_model_provider") or "")
    model = str(config.get("embedding_model") or "")
    record = {"provider": provider or None, "model": model or None, "mapped": False}
    if runtime_name() != "dify":
        return {**record, "reason": "local_runtime_default_profile"}
    if not provider or not model:
        return {**record, "reason": "no_embedding_model_in_snapshot"}
    plugin_id, _, short = provider.rpartition("/")
    if not plugin_id:
        plugin_id, short = f"langgenius/{provider}", provider
    selection = {"plugin_id": plugin_id, "provider": short, "model": model}
    try:
        embedding_profile.set_embedding_profile(
            Principal(tenant_id=job.tenant_id, kind="internal"), space.id, selection
        )
    except ServiceError as exc:
        return {**record, "reason": exc.code}
    return {**record, "mapped": True, "selection": selection}


# --- waiting_for_space --------------------------------------------------------------------------


def _wait_for_space(job: UpgradeJob, task_id: str) -> Outcome:
    from spaces.profiles import profile_of

    space = job.space
    if space is None or space.deleting_at is not None:
        raise StepFailure("space_missing", "the upgrade's knowledge space is missing or deleted")
    state = profile_of(space).state
    if state in USABLE_STATES:
        with transaction.atomic():
            checkpoint(job.id, task_id, stage=JobStage.SUBMITTING_DOCUMENTS, not_ready_since=None)
        return Outcome("space_ready")
    if state == "validation-failed":
        raise StepFailure(
            "space_validation_failed",
            f"the knowledge space {space.id} failed its profile validation; fix its embedding "
            "profile, validate it, then retry the upgrade",
        )
    now = timezone.now()
    since = job.not_ready_since or now
    limit = settings.KNOWLEDGE_UPGRADE_SPACE_WAIT_SECONDS
    if now - since >= timedelta(seconds=limit):
        raise StepFailure(
            "space_not_ready",
            f"the knowledge space {space.id} was still {state} after "
            f"KNOWLEDGE_UPGRADE_SPACE_WAIT_SECONDS={limit} s; set its embedding profile, "
            "then retry the upgrade",
        )
    with transaction.atomic():
        checkpoint(job.id, task_id, not_ready_since=since, delay_seconds=SPACE_POLL_SECONDS)
    return Outcome("space_waiting", dispatch_next=False)


# --- creating_sources ---------------------------------------------------------------------------


def _skip_sources(job: UpgradeJob, task_id: str) -> Outcome:
    """No source documents are ever accepted (snapshot refuses them): nothing to create."""
    with transaction.atomic():
        checkpoint(job.id, task_id, stage=JobStage.SUBMITTING_DOCUMENTS)
    return Outcome("sources_skipped")


# --- submitting_documents -----------------------------------------------------------------------


def _pick(job: UpgradeJob, task_id: str) -> UpgradeDocument | None:
    """Mark the next ``pending``/``processing`` document ``processing`` (fenced); ``None`` when
    none is left."""
    with transaction.atomic():
        if not held(job.id, task_id).select_for_update().exists():
            raise ClaimLost(str(job.id))
        qs = UpgradeDocument.objects.filter(
            job=job, status__in=[DocumentStatus.PENDING, DocumentStatus.PROCESSING]
        ).order_by("id")
        if connection.features.has_select_for_update_skip_locked:
            qs = qs.select_for_update(skip_locked=True)
        document = qs.first()
        if document is not None and document.status != DocumentStatus.PROCESSING:
            UpgradeDocument.objects.filter(id=document.id).update(
                status=DocumentStatus.PROCESSING, updated_at=timezone.now()
            )
    return document


def _submit_documents(job: UpgradeJob, task_id: str) -> Outcome:
    document = _pick(job, task_id)
    if document is None:
        with transaction.atomic():
            checkpoint(job.id, task_id, stage=JobStage.MIGRATING_ACCESS, **_counts(job))
        return Outcome("documents_done")
    try:
        admitted = _admit(job, document)
    except DocumentFailure as failure:
        _finish_document(job, task_id, document, failure=failure)
        return Outcome("document_failed")
    _finish_document(job, task_id, document, admitted=admitted)
    return Outcome("document_submitted")


class DocumentFailure(Exception):
    """This document cannot be upgraded (missing or refused file); it is marked ``failed``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Admitted:
    document_id: uuid.UUID
    compilation_job_id: uuid.UUID | None
    deduplicated: bool


def _admit(job: UpgradeJob, document: UpgradeDocument) -> Admitted:
    """Read the legacy bytes through the storage boundary and admit them into the new space
    (the upload admission path: filename, size, type sniffing, sha256 dedupe, compilation
    queued). The same bytes already in the space link to that document (``deduplicated``)."""
    from ingestion.documents import admit_document
    from ingestion.models import CompilationJob

    key = document.source_key
    if not key:
        raise DocumentFailure("missing_file_reference", "the document has no storage key")
    space = job.space
    assert space is not None  # run_step fails a step past validating without a space
    try:
        data = _read_legacy(document, key)
        admission = admit_document(
            space, filename=document.name, data=data, metadata=document.metadata_snapshot
        )
    except Conflict as exc:
        if exc.code != "duplicate_document":
            raise
        existing = uuid.UUID(exc.details["existing_document_id"])
        latest = (
            CompilationJob.objects.filter(document_id=existing)
            .order_by("-created_at")
            .values_list("id", flat=True)
            .first()
        )
        return Admitted(existing, latest, True)
    except ServiceError as exc:  # the upload admission refused the file: this document fails
        raise DocumentFailure(exc.code, exc.message) from exc
    except (DifyError, OSError) as exc:  # writing the new document failed: the job fails
        raise StepFailure(*_storage_failure(exc)) from exc
    return Admitted(admission.document.id, admission.job.id, False)


def _storage_failure(exc: Exception) -> tuple[str, str]:
    """``(code, message)`` of a storage call that failed for the whole job: ``storage_unavailable``
    when a retry may succeed (Dify's retryable answers, an I/O error of the file system),
    else ``storage_error`` (Dify refused every call, e.g. its credentials)."""
    retryable = bool(getattr(exc, "retryable", False)) or not isinstance(exc, DifyError)
    code = "storage_unavailable" if retryable else "storage_error"
    detail = getattr(exc, "code", None) or type(exc).__name__
    return code, f"the object storage failed ({detail}); retry the upgrade when it is back"


#: File system errors that concern one object only (its key names a directory, a forbidden or
#: unreachable path, …): the document fails, the run goes on.
PER_OBJECT_ERRNOS = frozenset(
    {
        errno.EISDIR,
        errno.ENOTDIR,
        errno.EACCES,
        errno.EPERM,
        errno.ENAMETOOLONG,
        errno.ELOOP,
        errno.EINVAL,
        errno.ENXIO,
    }
)


def _unreadable(document: UpgradeDocument, exc: Exception) -> DocumentFailure:
    detail = getattr(exc, "code", None) or type(exc).__name__
    return DocumentFailure(
        "legacy_file_unreadable",
        f"the uploaded file {document.upload_file_id} of document {document.legacy_document_id} "
        f"cannot be read from the storage ({detail})",
    )


def _read_legacy(document: UpgradeDocument, key: str) -> bytes:
    """The legacy bytes under the document's storage key ``key``.

    Per-object failures raise :class:`DocumentFailure` (``legacy_file_missing``,
    ``file_too_large`` over ``KNOWLEDGE_UPLOAD_MAX_BYTES``, ``legacy_file_unreadable`` for a key
    the storage refuses or cannot read as a file: a suspicious path, a directory, a permission,
    a non-retryable answer of Dify's storage about this object). A retryable outage raises
    :class:`StepFailure` ``storage_unavailable`` (the job fails; retry it when the storage is
    back); Dify refusing the call itself (not the object) ``storage_error``.
    """
    limit = settings.KNOWLEDGE_UPLOAD_MAX_BYTES
    try:
        return storage.read_object(key, max_bytes=limit)
    except FileNotFoundError as exc:
        raise DocumentFailure(
            "legacy_file_missing",
            f"the uploaded file {document.upload_file_id} is not in the storage",
        ) from exc
    except ValueError as exc:
        raise DocumentFailure(
            "file_too_large",
            f"the uploaded file is larger than KNOWLEDGE_UPLOAD_MAX_BYTES={limit} bytes",
        ) from exc
    except SuspiciousOperation as exc:
        raise _unreadable(document, exc) from exc
    except (DifyError, OSError) as exc:
        if _per_object(exc):
            raise _unreadable(document, exc) from exc
        raise StepFailure(*_storage_failure(exc)) from exc


def _per_object(exc: DifyError | OSError) -> bool:
    if isinstance(exc, DifyError):
        return isinstance(exc, ObjectStorageError) and not exc.retryable
    return exc.errno in PER_OBJECT_ERRNOS


def _counts(job: UpgradeJob) -> dict[str, int]:
    rows = UpgradeDocument.objects.filter(job=job)
    return {
        "completed_documents": rows.filter(status=DocumentStatus.SUCCEEDED).count(),
        "failed_documents": rows.filter(status=DocumentStatus.FAILED).count(),
    }


def _finish_document(
    job: UpgradeJob,
    task_id: str,
    document: UpgradeDocument,
    *,
    admitted: Admitted | None = None,
    failure: DocumentFailure | None = None,
) -> None:
    """The document's checkpoint and the job's, in one fenced transaction."""
    now = timezone.now()
    with transaction.atomic():
        locked = held(job.id, task_id).select_for_update().first()
        if locked is None:
            raise ClaimLost(str(job.id))
        fields: dict[str, Any] = {}
        if admitted is not None:
            UpgradeDocument.objects.filter(id=document.id).update(
                status=DocumentStatus.SUCCEEDED,
                document_id=admitted.document_id,
                compilation_job_id=admitted.compilation_job_id,
                last_error_code=None,
                last_error_message=None,
                updated_at=now,
            )
            release_if_unreferenced(job.id, document.upload_file_id, now)
            if admitted.deduplicated:
                resolved = dict(locked.resolved_configuration or {})
                linked = [
                    e
                    for e in resolved.get("deduplicated_documents", [])
                    if e["legacy_document_id"] != document.legacy_document_id
                ]
                linked.append(
                    {
                        "legacy_document_id": document.legacy_document_id,
                        "document_id": str(admitted.document_id),
                    }
                )
                fields["resolved_configuration"] = {**resolved, "deduplicated_documents": linked}
        else:
            assert failure is not None  # the callers pass either admitted or failure
            UpgradeDocument.objects.filter(id=document.id).update(
                status=DocumentStatus.FAILED,
                last_error_code=failure.code[:128],
                last_error_message=failure.message[:4000],
                updated_at=now,
            )
        checkpoint(job.id, task_id, **fields, **_counts(job))


# --- migrating_access ---------------------------------------------------------------------------


def _migrate_access(job: UpgradeJob, task_id: str) -> Outcome:
    """Record how the Dataset's access maps onto the space.

    A knowledge space has no members, visibility, app bindings or tags of its own (access is by
    tenant API keys and Dify capability tokens), so nothing is applied: the snapshot's values
    are recorded under ``resolved_configuration["access"]`` with ``applied: false`` for Dify
    (which owns those concepts) to apply on its side, and the metadata field names are
    recorded (documents carry their metadata values themselves).
    """
    config = job.config_snapshot or {}
    permission = job.permission_snapshot or {}
    access = {
        "applied": False,
        "reason": "knowledge spaces have no members, visibility, app bindings or tags",
        "owner": job.owner,
        "visibility": permission.get("visibility"),
        "members": permission.get("member_ids") or permission.get("members") or [],
        "enable_api": config.get("enable_api"),
        "app_bindings": job.app_binding_snapshot or [],
        "tag_ids": job.tag_ids_snapshot or [],
        "metadata_fields": config.get("metadata_fields") or config.get("doc_metadata") or [],
    }
    resolved = {**(job.resolved_configuration or {}), "access": access}
    with transaction.atomic():
        checkpoint(job.id, task_id, stage=JobStage.FINALIZING, resolved_configuration=resolved)
    return Outcome("access_migrated")


# --- finalizing ---------------------------------------------------------------------------------


def _finalize(job: UpgradeJob, task_id: str) -> Outcome:
    """Succeed when every document was handed off (completed == total); failed documents fail
    the job with ``documents_failed`` (retry re-arms them); documents still to do go back to
    ``submitting_documents``.

    Success and the first reconciliation lease commit in one UPDATE (token, expiry now +
    ``KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS``, dispatched now, attempt counted); the
    reconcile task is published after the commit, and a publish failure is only logged (the
    reconciliation recovery schedule re-issues an expired lease). A job without documents has
    nothing to reconcile: it succeeds with ``reconcile_completed_at`` set and no lease.
    """
    counts = _counts(job)
    remaining = job.total_documents - counts["completed_documents"] - counts["failed_documents"]
    if remaining > 0:
        with transaction.atomic():
            checkpoint(job.id, task_id, stage=JobStage.SUBMITTING_DOCUMENTS, **counts)
        return Outcome("documents_remaining")
    if counts["failed_documents"]:
        with transaction.atomic():
            held(job.id, task_id).update(**counts)
            failed = dispatch.fail(
                job.id,
                task_id,
                "documents_failed",
                f"{counts['failed_documents']} of {job.total_documents} documents could not be "
                "upgraded (see each document's error); fix them and retry the upgrade",
            )
        if not failed:
            raise ClaimLost(str(job.id))
        return Outcome("documents_failed", dispatch_next=False)
    _succeed(job, task_id, counts)
    return Outcome("succeeded", dispatch_next=False)


def _succeed(job: UpgradeJob, task_id: str, counts: dict[str, int]) -> None:
    now = timezone.now()
    token = uuid.uuid4() if job.total_documents else None
    fields: dict[str, Any] = {
        **counts,
        "status": JobStatus.SUCCEEDED,
        "stage": JobStage.COMPLETED,
        "completed_at": now,
        "task_id": None,
        "claimed_at": None,
        "step_started_at": None,
        "next_step_at": None,
        "last_error_code": None,
        "last_error_message": None,
        "updated_at": now,
    }
    if token is None:
        fields["reconcile_completed_at"] = now
    else:
        from django.db.models import F

        fields.update(
            reconcile_lease_token=token,
            reconcile_lease_expires_at=now
            + timedelta(seconds=settings.KNOWLEDGE_UPGRADE_RECONCILE_LEASE_SECONDS),
            reconcile_dispatched_at=now,
            reconcile_attempt_count=F("reconcile_attempt_count") + 1,
        )
    with transaction.atomic():
        if not held(job.id, task_id).update(**fields):
            raise ClaimLost(str(job.id))
        if token is not None:
            transaction.on_commit(lambda: publish_reconcile(job.id, token))


def publish_reconcile(job_id: uuid.UUID, token: uuid.UUID) -> bool:
    """Publish the first reconciliation delivery carrying its lease token
    (:func:`upgrades.services.reconciliation_runner.publish`, with the delivery's hard timeout); a
    failure is logged and swallowed: the lease expires and the reconciliation recovery schedule
    re-issues it."""
    from upgrades.services import reconciliation_runner

    return reconciliation_runner.publish(job_id, token)


def _completed(job: UpgradeJob, task_id: str) -> Outcome:
    """A running job at ``completed`` cannot arise (success clears the claim in the same
    UPDATE); should one be found, it fails rather than loop."""
    raise StepFailure("invalid_stage", "the job is running at stage completed")


STEPS = {
    JobStage.VALIDATING: _validate,
    JobStage.WAITING_FOR_SPACE: _wait_for_space,
    JobStage.CREATING_SOURCES: _skip_sources,
    JobStage.SUBMITTING_DOCUMENTS: _submit_documents,
    JobStage.MIGRATING_ACCESS: _migrate_access,
    JobStage.FINALIZING: _finalize,
    JobStage.COMPLETED: _completed,
}
"""Each stage dispatches to exactly one step (bridge specification §5.2, case 8)."""
