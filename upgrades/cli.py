"""``kfs upgrade list|show|retry|abandon|sweep|schedules``: the staged run on the command line (each
calls a service; wired into ``knowledgefs/management/commands/kfs.py``)."""

from __future__ import annotations

import json

from upgrades.api.serializers import UpgradeJobSerializer
from upgrades.models import UpgradeJob
from upgrades.services import dispatch, snapshot


def add_parser(sub) -> None:
    """Register ``upgrade`` and its actions on the ``kfs`` sub-parser set."""
    upgrade = sub.add_parser("upgrade", help="classic Dataset upgrades: list, show, retry, sweep")
    actions = upgrade.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="a tenant's upgrades, newest first (at most 100)")
    listing.add_argument("--tenant", required=True)
    listing.add_argument("--status", choices=["queued", "running", "succeeded", "failed"])
    listing.add_argument("--json", action="store_true")
    show = actions.add_parser("show", help="one upgrade with its failed documents")
    show.add_argument("job_id", metavar="JOB_ID")
    show.add_argument("--json", action="store_true")
    retry = actions.add_parser("retry", help="retry a failed upgrade (failed documents again)")
    retry.add_argument("job_id", metavar="JOB_ID")
    retry.add_argument("--json", action="store_true")
    abandon = actions.add_parser(
        "abandon", help="abandon a failed upgrade so its Dataset can be upgraded again"
    )
    abandon.add_argument("job_id", metavar="JOB_ID")
    abandon.add_argument("--json", action="store_true")
    sweep = actions.add_parser("sweep", help="run one sweep of the staged run now")
    sweep.add_argument("--json", action="store_true")
    schedules = actions.add_parser("schedules", help="create or repair the sweep schedule")
    schedules.add_argument("--json", action="store_true")


def _line(job: dict) -> str:
    return (
        f"{job['id']}  {job['namespace_id']}/{job['dataset_id']}  {job['status']}/{job['stage']}"
        f"  documents {job['completed_documents']}+{job['failed_documents']} failed"
        f"/{job['total_documents']}  {job['last_error_code'] or ''}"
    ).rstrip()


def _job(job_id: str) -> UpgradeJob:
    from knowledgefs.errors import NotFound

    job = UpgradeJob.objects.filter(id=job_id).first() if _is_uuid(job_id) else None
    if job is None:
        raise NotFound(f"no upgrade {job_id}", code="upgrade_not_found")
    return job


def _is_uuid(value: str) -> bool:
    import uuid

    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def handle(command, options: dict) -> None:
    """Run ``kfs upgrade <action>``; ``command`` is the management command (for ``emit``)."""
    action = options["action"]
    if action == "list":
        jobs = snapshot.list_upgrades(options["tenant"], status=options.get("status"))[:100]
        rows = UpgradeJobSerializer(jobs, many=True).data
        command.emit(options, rows, "\n".join(_line(j) for j in rows) or "no upgrades")
    elif action == "show":
        row = UpgradeJobSerializer(_job(options["job_id"])).data
        lines = [_line(row), f"space: {row['space_id']}"]
        if row["last_error_message"]:
            lines.append(f"error: {row['last_error_message']}")
        lines += [f"  {e['legacy_document_id']}: {e['code']} {e['message']}" for e in row["errors"]]
        command.emit(options, row, "\n".join(lines))
    elif action == "retry":
        job, retried = snapshot.retry_upgrade(_job(options["job_id"]).id)
        row = UpgradeJobSerializer(job).data
        text = f"{job.id} queued again" if retried else f"{job.id} is {job.status}: unchanged"
        command.emit(options, row, text)
    elif action == "abandon":
        job, changed = snapshot.abandon_upgrade(_job(options["job_id"]).id)
        row = UpgradeJobSerializer(job).data
        command.emit(options, row, f"{job.id} {'abandoned' if changed else 'already abandoned'}")
    elif action == "sweep":
        report = dispatch.sweep().as_dict()
        command.emit(options, report, json.dumps(report, indent=2))
    else:
        schedule = dispatch.ensure_sweep_schedule()
        payload = {"name": schedule.name, "func": schedule.func, "minutes": schedule.minutes}
        command.emit(options, payload, f"{schedule.name}: {schedule.func} every minute")
