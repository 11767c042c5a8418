"""``kfs upgrade list|show|retry|abandon|sweep|schedules`` (the staged run) and ``kfs cutover
show|advance|rollback|recutover TENANT`` (the operator's view of a workspace's cutover ledger) on
the command line. Each action calls a service; wired into
``knowledgefs/management/commands/kfs.py``. The module contract (``COMMANDS``,
``add_parser(sub, name)``, ``handle(command, options)``) is the one of :mod:`spaces.cli`.

A cutover action is one call to :mod:`upgrades.services.cutover`; its answer is the ledger with
its runtime gate, as JSON."""

from __future__ import annotations

import json
from typing import Any

from knowledgefs.errors import InvalidInput
from knowledgefs.pagination import add_page_arguments, cli_page
from upgrades.api.serializers import UpgradeJobSerializer
from upgrades.models import CutoverPhase, UpgradeJob
from upgrades.services import cutover, dispatch, snapshot

COMMANDS = ("cutover", "upgrade")


def add_parser(sub, name: str) -> None:
    """Register the ``kfs`` command ``name`` (one of :data:`COMMANDS`) on ``sub``."""
    {"cutover": _add_cutover, "upgrade": _add_upgrade}[name](sub)


def handle(command, options: dict) -> None:
    """Run ``kfs upgrade <action>`` or ``kfs cutover <action>``; ``command`` is the management
    command (for ``emit`` and ``stdout``)."""
    if options["command"] == "cutover":
        command.stdout.write(json.dumps(run_cutover(options), indent=2))
    else:
        _upgrade(command, options)


def _add_cutover(sub) -> None:
    parser = sub.add_parser("cutover", help="show or move a workspace's cutover ledger")
    actions = parser.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", help="the ledger and its runtime gate")
    show.add_argument("tenant")
    phases = CutoverPhase.values
    advance = actions.add_parser("advance", help="one forward step (compare-and-set)")
    advance.add_argument("tenant")
    advance.add_argument("--to", dest="to_phase", required=True, choices=phases)
    advance.add_argument("--expected-phase", required=True, choices=phases)
    advance.add_argument("--expected-version", type=int, required=True)
    advance.add_argument("--ack", help="the remote freeze or activation ack, as JSON")
    advance.add_argument("--smoke", help='smoke results, as JSON: {"checks": [...]}')
    rollback = actions.add_parser("rollback", help="roll a cut-over workspace back to frozen")
    rollback.add_argument("tenant")
    rollback.add_argument("--expected-phase", required=True, choices=phases)
    rollback.add_argument("--expected-version", type=int, required=True)
    recut = actions.add_parser("recutover", help="cut a rolled-back workspace over again")
    recut.add_argument("tenant")
    recut.add_argument("--expected-version", type=int, required=True)
    recut.add_argument("--ack", required=True, help="the activation ack, as JSON")


def _add_upgrade(sub) -> None:
    upgrade = sub.add_parser("upgrade", help="classic Dataset upgrades: list, show, retry, sweep")
    actions = upgrade.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="a tenant's upgrades, newest first (a page)")
    listing.add_argument("--tenant", required=True)
    listing.add_argument("--status", choices=["queued", "running", "succeeded", "failed"])
    add_page_arguments(listing, default=100)
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


def _json(text: str | None, option: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"{option} is not valid JSON: {exc}", code="invalid_json") from None


def run_cutover(options: dict) -> dict:
    """Carry out one ``kfs cutover`` action; returns the ledger as a dict (service errors
    propagate with their codes)."""
    tenant, action = options["tenant"], options["action"]
    if action == "show":
        ledger = cutover.get_ledger(tenant)
    elif action == "advance":
        ledger = cutover.advance(
            tenant,
            expected_phase=options["expected_phase"],
            expected_cas_version=options["expected_version"],
            to_phase=options["to_phase"],
            ack=_json(options["ack"], "--ack"),
            smoke_results=_json(options["smoke"], "--smoke"),
        )
    elif action == "rollback":
        ledger = cutover.rollback(
            tenant,
            expected_phase=options["expected_phase"],
            expected_cas_version=options["expected_version"],
        )
    else:
        ledger = cutover.recutover(
            tenant,
            expected_cas_version=options["expected_version"],
            ack=_json(options["ack"], "--ack"),
        )
    return cutover.ledger_as_dict(ledger)


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


def _upgrade(command, options: dict) -> None:
    action = options["action"]
    if action == "list":
        jobs, next_cursor = cli_page(
            snapshot.list_upgrades(options["tenant"], status=options.get("status")),
            options,
            listing="upgrades",
            binding={"tenant": options["tenant"], "status": options.get("status")},
        )
        rows = UpgradeJobSerializer(jobs, many=True).data
        lines = [_line(j) for j in rows]
        if next_cursor:
            lines.append(f"more: --cursor {next_cursor}")
        command.emit(
            options,
            {"items": rows, "next_cursor": next_cursor},
            "\n".join(lines) or "no upgrades",
        )
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
