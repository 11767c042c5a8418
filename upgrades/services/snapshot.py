"""The snapshot of a classic Dataset, and the job-level services Dify and operators call:
read, list (discovery), retry.

Product rules (docs/upgrades.md, "Staged run"):

* the idempotency key is per tenant: a replay returns the same job unchanged (the snapshot is
  never rewritten), the same key for another Dataset is 409 ``idempotency_key_reused``;
* one upgrade per Dataset: a new key while an upgrade of the Dataset is queued or running is
  409 ``upgrade_in_progress`` (the partial unique index is the last line: its
  ``IntegrityError`` is the same 409); after a failed upgrade it is 409 ``retry_required``
  (retry that job); after a succeeded one 409 ``already_upgraded`` (gap G6 decided: no second
  upgrade of a Dataset);
* only ``upload_file`` documents are supported: any other source type refuses the whole
  snapshot with 422 ``unsupported_data_source`` naming the documents. The stage
  ``creating_sources`` therefore never has work and is skipped.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from knowledgefs.errors import Conflict, InvalidInput, NotFound, ServiceError
from spaces.services import validate_tenant_id
from upgrades.models import (
    ACTIVE_JOB_STATUSES,
    DocumentStatus,
    FileLeaseStatus,
    JobStage,
    JobStatus,
    UpgradeDocument,
    UpgradeFileLease,
    UpgradeJob,
)

from .dispatch import dispatch_on_commit
from .leases import FILE_LEASE_TTL

SUPPORTED_SOURCE_TYPES = ("upload_file",)
ABANDONED = "upgrade_abandoned"
"""``last_error_code`` of a failed job an operator or Dify abandoned: it no longer blocks a new
snapshot of its Dataset and cannot be retried."""
DIFY_UPLOAD_PREFIX = "upload_files"
"""Dify stores uploads under ``upload_files/<tenant id>/<uuid>.<ext>`` (its file service)."""
MAX_NAMED_DOCUMENTS = 100
"""Errors naming documents list at most this many ids (the count is always given)."""


class Unprocessable(ServiceError):
    """422: the request is well-formed but describes something this service cannot do."""

    status = 422
    code = "unprocessable"


def _conflict(code: str, message: str, job: UpgradeJob) -> Conflict:
    return Conflict(message, code=code, details={"upgrade_id": str(job.id), "status": job.status})


def _check_documents(documents: list[dict[str, Any]], tenant: str) -> None:
    """Refuse the whole snapshot when a document cannot be upgraded as given (source type,
    file reference, storage key, metadata); every error names the documents."""
    unsupported = [d for d in documents if d["data_source_type"] not in SUPPORTED_SOURCE_TYPES]
    if unsupported:
        types = sorted({d["data_source_type"] for d in unsupported})
        raise Unprocessable(
            f"{len(unsupported)} documents have a source type this upgrade does not support "
            f"({', '.join(types)}); only upload_file documents can be upgraded",
            code="unsupported_data_source",
            details={
                "documents": [d["id"] for d in unsupported[:MAX_NAMED_DOCUMENTS]],
                "data_source_types": types,
            },
        )
    missing = [
        d["id"] for d in documents if not d.get("storage_key") or not d.get("upload_file_id")
    ]
    if missing:
        raise InvalidInput(
            f"{len(missing)} upload_file documents lack storage_key or upload_file_id",
            code="missing_file_reference",
            details={"documents": missing[:MAX_NAMED_DOCUMENTS]},
        )
    for index, document in enumerate(documents):
        _check_storage_key(index, document, tenant)
        _check_metadata(index, document)


def _refuse_document(
    index: int, document: dict[str, Any], field: str, code: str, reason: str
) -> InvalidInput:
    return InvalidInput(
        f"documents.{index}.{field} of document {document['id']} {reason}",
        code=code,
        details={"document": document["id"], "field": f"documents.{index}.{field}"},
    )


def _check_storage_key(index: int, document: dict[str, Any], tenant: str) -> None:
    """Refuse a storage key that could leave the upload area (400 ``invalid_storage_key``):
    absolute, with a ``..`` or empty segment, a backslash or a control character; and a key under
    Dify's upload layout ``upload_files/<tenant id>/…`` that names another tenant."""
    key = document["storage_key"]
    segments = key.split("/")
    reason = None
    if key.startswith("/") or "\\" in key or any(ord(c) < 32 or ord(c) == 127 for c in key):
        reason = "must be a relative key without backslashes or control characters"
    elif any(segment in ("", ".", "..") for segment in segments):
        reason = "must not contain empty, '.' or '..' segments"
    elif segments[0] == DIFY_UPLOAD_PREFIX and (len(segments) < 3 or segments[1] != tenant):
        reason = f"must be under {DIFY_UPLOAD_PREFIX}/{tenant}/ (the snapshot's namespace)"
    if reason:
        raise _refuse_document(index, document, "storage_key", "invalid_storage_key", reason)


def _check_metadata(index: int, document: dict[str, Any]) -> None:
    """Refuse metadata reconciliation would refuse (400 ``invalid_metadata``): the same
    :func:`ingestion.availability.validate_metadata_patch` rules, per key so the
    error names it."""
    from ingestion.availability import validate_metadata_patch

    for key, value in document["metadata"].items():
        try:
            validate_metadata_patch({key: value})
        except InvalidInput as exc:
            raise InvalidInput(
                f"documents.{index}.metadata of document {document['id']}, key {key!r}: "
                f"{exc.message}",
                code="invalid_metadata",
                details={
                    "document": document["id"],
                    "field": f"documents.{index}.metadata",
                    "key": key,
                },
            ) from None


def _existing_for_dataset(tenant: str, data: dict[str, Any]) -> None:
    """Refuse a new upgrade of a Dataset that already has one (see the module's rules).

    Before any 409 the idempotency key is looked up again: a concurrent replay of the same key
    may have committed its job between the first look-up and this one, and must get that job
    (raised as :class:`_Replay`)."""
    jobs = UpgradeJob.objects.filter(tenant_id=tenant, dataset_id=data["dataset_id"])
    active = jobs.filter(status__in=ACTIVE_JOB_STATUSES).first()
    if active is not None:
        raise _conflict_or_replay(
            tenant, data, "upgrade_in_progress", "an upgrade of this dataset is already in progress"
        )
    done = jobs.filter(status=JobStatus.SUCCEEDED).first()
    if done is not None:
        raise _conflict_or_replay(
            tenant, data, "already_upgraded", "this dataset was already upgraded", done
        )
    failed = jobs.filter(status=JobStatus.FAILED).exclude(last_error_code=ABANDONED).first()
    if failed is not None:
        raise _conflict_or_replay(
            tenant, data, "retry_required", "an upgrade of this dataset failed; retry that upgrade"
        )


class _Replay(Exception):
    """The request is a replay of a job committed meanwhile (carries it)."""

    def __init__(self, job: UpgradeJob) -> None:
        super().__init__(str(job.id))
        self.job = job


def _conflict_or_replay(
    tenant: str, data: dict[str, Any], code: str, message: str, job: UpgradeJob | None = None
) -> Exception:
    replay = UpgradeJob.objects.filter(
        tenant_id=tenant, idempotency_key=data["idempotency_key"]
    ).first()
    if replay is not None:
        return _Replay(replay)
    if job is None:
        job = (
            UpgradeJob.objects.filter(tenant_id=tenant, dataset_id=data["dataset_id"])
            .exclude(status=JobStatus.SUCCEEDED)
            .order_by("-created_at")
            .first()
        )
    if job is None:
        return Conflict(message, code=code, details={"upgrade_id": None})
    return _conflict(code, message, job)


def create_upgrade(data: dict[str, Any]) -> tuple[UpgradeJob, bool]:
    """Snapshot a Dataset and queue its upgrade; returns ``(job, created)``.

    ``data`` is :class:`upgrades.api.serializers.SnapshotSerializer`'s validated data. In one
    transaction: the job, one row per document (``desired_enabled`` stored as "enabled and not
    archived"), one file lease per distinct ``upload_file_id`` (expiring in 7 days); the first
    step is dispatched after the commit. One upgrade per Dataset (codes of the refusals:
    docs/api.md, "Internal routes").
    """
    tenant = validate_tenant_id(data["namespace_id"])
    replay = UpgradeJob.objects.filter(
        tenant_id=tenant, idempotency_key=data["idempotency_key"]
    ).first()
    if replay is not None:
        return _replayed(replay, data), False
    _check_documents(data["documents"], tenant)
    try:
        _existing_for_dataset(tenant, data)
        try:
            with transaction.atomic():
                job = _insert(tenant, data)
                dispatch_on_commit(job.id)
        except IntegrityError:
            raise _conflict_or_replay(
                tenant, data, "upgrade_in_progress", "an upgrade of this dataset is in progress"
            ) from None
    except _Replay as won:  # a concurrent replay of the same key won
        return _replayed(won.job, data), False
    return job, True


def _replayed(job: UpgradeJob, data: dict[str, Any]) -> UpgradeJob:
    if job.dataset_id != data["dataset_id"]:
        raise Conflict(
            "this idempotency key was used for another dataset's upgrade",
            code="idempotency_key_reused",
            details={"upgrade_id": str(job.id)},
        )
    return job


def _insert(tenant: str, data: dict[str, Any]) -> UpgradeJob:
    now = timezone.now()
    documents = data["documents"]
    job = UpgradeJob.objects.create(
        tenant_id=tenant,
        dataset_id=data["dataset_id"],
        idempotency_key=data["idempotency_key"],
        requested_by=data["requested_by"],
        owner=data["owner"],
        snapshot_at=now,
        config_snapshot=data["config"],
        permission_snapshot=data.get("permission") or {},
        app_binding_snapshot=[dict(b) for b in data.get("app_bindings") or []],
        tag_ids_snapshot=list(data.get("tag_ids") or []),
        total_documents=len(documents),
    )
    UpgradeDocument.objects.bulk_create(
        [
            UpgradeDocument(
                job=job,
                tenant_id=tenant,
                legacy_document_id=d["id"],
                name=d["name"],
                data_source_type=d["data_source_type"],
                upload_file_id=d["upload_file_id"],
                source_key=d["storage_key"],
                desired_enabled=d["desired_enabled"] and not d["archived"],
                legacy_archived=d["archived"],
                legacy_indexing_status=d["indexing_status"],
                metadata_snapshot=d["metadata"],
            )
            for d in documents
        ],
        batch_size=500,
    )
    files = {d["upload_file_id"]: d["storage_key"] for d in documents}
    UpgradeFileLease.objects.bulk_create(
        [
            UpgradeFileLease(
                job=job, upload_file_id=file_id, source_key=key, expires_at=now + FILE_LEASE_TTL
            )
            for file_id, key in files.items()
        ],
        batch_size=500,
    )
    return job


# --- reading ------------------------------------------------------------------------------------


def get_upgrade(tenant_id: str, upgrade_id: uuid.UUID | str) -> UpgradeJob:
    """The tenant's upgrade job, else 404 ``upgrade_not_found`` (also for another tenant's)."""
    tenant = validate_tenant_id(tenant_id)
    try:
        job_uuid = uuid.UUID(str(upgrade_id))
    except ValueError:
        raise NotFound("upgrade not found", code="upgrade_not_found") from None
    job = UpgradeJob.objects.filter(id=job_uuid, tenant_id=tenant).select_related("space").first()
    if job is None:
        raise NotFound("upgrade not found", code="upgrade_not_found")
    return job


def list_upgrades(
    tenant_id: str, *, dataset_id: str | None = None, status: str | None = None
) -> QuerySet[UpgradeJob]:
    """The tenant's upgrade jobs, newest first, optionally of one Dataset and/or one status."""
    jobs = UpgradeJob.objects.filter(tenant_id=validate_tenant_id(tenant_id))
    if dataset_id:
        jobs = jobs.filter(dataset_id=dataset_id)
    if status:
        jobs = jobs.filter(status=status)
    return jobs.order_by("-created_at", "-id")


def discovery(tenant_id: str, dataset_id: str) -> dict[str, str | None]:
    """What Dify may offer for a Dataset (bridge specification §2.8): ``{"state", "upgrade_id"}``
    with state ``can_upgrade`` (no job), ``upgrade_in_progress`` (queued or running),
    ``retry_required`` (failed) or ``already_upgraded`` (succeeded); a failed and abandoned
    latest job answers ``can_upgrade``."""
    latest = list_upgrades(tenant_id, dataset_id=dataset_id).first()
    if latest is None or latest.last_error_code == ABANDONED:
        return {"state": "can_upgrade", "upgrade_id": None}
    states: dict[str, str] = {
        JobStatus.QUEUED: "upgrade_in_progress",
        JobStatus.RUNNING: "upgrade_in_progress",
        JobStatus.FAILED: "retry_required",
        JobStatus.SUCCEEDED: "already_upgraded",
    }
    state = states[latest.status]
    return {"state": state, "upgrade_id": str(latest.id)}


# --- retry --------------------------------------------------------------------------------------


def retry_upgrade(
    upgrade_id: uuid.UUID | str, *, tenant_id: str | None = None
) -> tuple[UpgradeJob, bool]:
    """Retry a failed upgrade; returns ``(job, retried)``.

    Only ``failed`` jobs are retried: failed documents go back to ``pending`` (documents left
    ``processing`` are picked again anyway), errors, ``completed_at`` and the claim are cleared,
    step attempts reset, every unreleased file lease becomes ``active`` until now + 7 days, and
    the job is dispatched through the claim after the commit. A job that failed after its
    documents were submitted goes back to ``submitting_documents`` when it had failed
    documents. A job whose space was deleted (or is missing) after ``validating`` restarts
    from ``validating``: every document back to ``pending``, a replacement space is created
    (:func:`upgrades.services.runner.space_slug`) and every file lease is active again (a
    released legacy file that Dify already deleted fails its document ``legacy_file_missing``).
    ``queued``/``running`` jobs are returned unchanged (``retried`` false); a succeeded or
    abandoned job, or one whose Dataset has another active upgrade meanwhile, is refused (409).
    """
    job = _find(upgrade_id, tenant_id)
    if job.status == JobStatus.SUCCEEDED:
        raise _conflict("upgrade_already_succeeded", "a succeeded upgrade cannot be retried", job)
    if job.status != JobStatus.FAILED:
        return job, False
    if job.last_error_code == ABANDONED:
        raise _conflict("upgrade_abandoned", "an abandoned upgrade cannot be retried", job)
    try:
        with transaction.atomic():
            retried = _rearm(job)
            if retried:
                dispatch_on_commit(job.id)
    except IntegrityError:
        raise _conflict(
            "upgrade_in_progress", "another upgrade of this dataset is in progress", job
        ) from None
    job.refresh_from_db()
    return job, retried


def _space_gone(job: UpgradeJob) -> bool:
    """Whether the job's space is missing or being deleted after the job had created it."""
    if job.stage == JobStage.VALIDATING:
        return False
    space = job.space  # None without a query when space_id is None
    return space is None or space.deleting_at is not None


def _rearm(job: UpgradeJob) -> bool:
    now = timezone.now()
    restart = _space_gone(job)
    if restart:  # every document goes again into the replacement space
        UpgradeDocument.objects.filter(job=job).update(
            status=DocumentStatus.PENDING,
            document=None,
            compilation_job_id=None,
            last_error_code=None,
            last_error_message=None,
            updated_at=now,
        )
        had_failed = 0
    else:
        failed_docs = UpgradeDocument.objects.filter(job=job, status=DocumentStatus.FAILED)
        had_failed = failed_docs.update(
            status=DocumentStatus.PENDING,
            last_error_code=None,
            last_error_message=None,
            updated_at=now,
        )
    stage = JobStage.VALIDATING if restart else job.stage
    if had_failed and stage in (JobStage.MIGRATING_ACCESS, JobStage.FINALIZING):
        stage = JobStage.SUBMITTING_DOCUMENTS
    extra = {"space": None, "resolved_configuration": None, "completed_documents": 0}
    updated = UpgradeJob.objects.filter(id=job.id, status=JobStatus.FAILED).update(
        **(extra if restart else {}),
        status=JobStatus.QUEUED,
        stage=stage,
        failed_documents=0,
        attempt_count=0,
        task_id=None,
        claimed_at=None,
        step_started_at=None,
        next_step_at=None,
        not_ready_since=None,
        last_error_code=None,
        last_error_message=None,
        completed_at=None,
        updated_at=now,
    )
    if not updated:
        transaction.set_rollback(True)
        return False
    leases = UpgradeFileLease.objects.filter(job=job)
    if not restart:
        leases = leases.exclude(status=FileLeaseStatus.RELEASED)
    leases.update(
        status=FileLeaseStatus.ACTIVE,
        expires_at=now + FILE_LEASE_TTL,
        released_at=None,
        updated_at=now,
    )
    return True


# --- abandon ------------------------------------------------------------------------------------


def abandon_upgrade(
    upgrade_id: uuid.UUID | str, *, tenant_id: str | None = None
) -> tuple[UpgradeJob, bool]:
    """Abandon a failed upgrade so its Dataset can be upgraded again; returns ``(job, changed)``.

    The job stays ``failed`` with ``last_error_code`` :data:`ABANDONED`; its file leases are
    released (the job never reads them again). A new snapshot of the Dataset is then accepted
    (G6 as decided here: one upgrade per Dataset, except after a failed and abandoned one), and
    discovery answers ``can_upgrade``. Repeating it changes nothing (``changed`` false). A
    queued, running or succeeded job is refused (409).
    """
    job = _find(upgrade_id, tenant_id)
    if job.status == JobStatus.SUCCEEDED:
        raise _conflict("upgrade_already_succeeded", "a succeeded upgrade cannot be abandoned", job)
    if job.status != JobStatus.FAILED:
        raise _conflict("upgrade_in_progress", "only a failed upgrade can be abandoned", job)
    if job.last_error_code == ABANDONED:
        return job, False
    now = timezone.now()
    with transaction.atomic():
        changed = (
            UpgradeJob.objects.filter(id=job.id, status=JobStatus.FAILED)
            .exclude(last_error_code=ABANDONED)
            .update(
                last_error_code=ABANDONED,
                last_error_message=(
                    f"abandoned at {now.isoformat()} after failing with "
                    f"{job.last_error_code or 'an error'}: {job.last_error_message or ''}"
                )[:2000],
                updated_at=now,
            )
        )
        if changed:
            UpgradeFileLease.objects.filter(job=job).exclude(
                status=FileLeaseStatus.RELEASED
            ).update(status=FileLeaseStatus.RELEASED, released_at=now, updated_at=now)
    job.refresh_from_db()
    return job, bool(changed)


def _find(upgrade_id: uuid.UUID | str, tenant_id: str | None) -> UpgradeJob:
    if tenant_id is not None:
        return get_upgrade(tenant_id, upgrade_id)
    job = UpgradeJob.objects.filter(id=upgrade_id).first()
    if job is None:
        raise NotFound("upgrade not found", code="upgrade_not_found")
    return job
