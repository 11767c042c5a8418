"""``kfs ingest|documents|jobs|stats|retry|cancel|schedules|sweep|storage|visual``: uploads,
documents, compilation jobs and visual projections on the command line (each calls a service;
wired into ``knowledgefs/management/commands/kfs.py``). The module contract (``COMMANDS``,
``add_parser(sub, name)``, ``handle(command, options)``) is the one of :mod:`spaces.cli`."""

from __future__ import annotations

import json
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import CommandError
from tqdm import tqdm

from ingestion import documents, reports
from ingestion.api.serializers import JobSerializer
from ingestion.compilation import dispatch, operations, recovery
from ingestion.models import Document, DocumentState
from knowledgefs.errors import Conflict, ServiceError
from knowledgefs.pagination import add_page_arguments, cli_page
from knowledgefs.uploads import upload_limit_message
from retrieval.backends import SearchBackendUnavailable, require_supported_engine
from spaces.cli import space_of

COMMANDS = (
    "ingest",
    "documents",
    "jobs",
    "stats",
    "retry",
    "cancel",
    "schedules",
    "sweep",
    "storage",
    "visual",
)


def add_parser(sub, name: str) -> None:
    """Register the ``kfs`` command ``name`` (one of :data:`COMMANDS`) on ``sub``."""
    _PARSERS[name](sub)


def handle(command, options: dict) -> None:
    """Run the ``kfs`` command ``options["command"]`` (one of :data:`COMMANDS`)."""
    _HANDLERS[options["command"]](command, options)


def _add_ingest(sub) -> None:
    ingest = sub.add_parser("ingest", help="upload files or folders into a space")
    ingest.add_argument("paths", nargs="+", metavar="PATH")
    ingest.add_argument("--space", required=True, metavar="SLUG")
    ingest.add_argument("--tenant", required=True)
    ingest.add_argument(
        "--wait",
        action="store_true",
        help="compile in this process until done; exit 1 if any failed",
    )
    ingest.add_argument(
        "--follow",
        action="store_true",
        help="leave compilation to the worker cluster and show its progress until done",
    )
    ingest.add_argument("--on-duplicate", choices=["skip", "reject", "replace"], default="skip")
    ingest.add_argument("--json", action="store_true")


def _add_documents(sub) -> None:
    docs = sub.add_parser("documents", help="list a space's documents")
    docs.add_argument("--space", required=True, metavar="SLUG")
    docs.add_argument("--tenant", required=True)
    add_page_arguments(docs, default=100)
    docs.add_argument("--json", action="store_true")


def _add_jobs(sub) -> None:
    jobs = sub.add_parser("jobs", help="list a space's compilation jobs with progress")
    jobs.add_argument("--space", required=True, metavar="SLUG")
    jobs.add_argument("--tenant", required=True)
    jobs.add_argument("--state", help="published, failed, canceled, retry_wait, or a stage")
    add_page_arguments(jobs, default=100)
    jobs.add_argument("--json", action="store_true")


def _add_stats(sub) -> None:
    stats = sub.add_parser("stats", help="document, node and job counts of a space")
    stats.add_argument("--space", required=True, metavar="SLUG")
    stats.add_argument("--tenant", required=True)
    stats.add_argument("--json", action="store_true")


def _add_retry(sub) -> None:
    retry = sub.add_parser("retry", help="retry a failed or canceled job")
    retry.add_argument("job_id", metavar="JOB_ID")
    retry.add_argument("--from-start", action="store_true", help="parse again instead of resuming")
    retry.add_argument("--json", action="store_true")


def _add_cancel(sub) -> None:
    cancel = sub.add_parser("cancel", help="cancel a queued or running job")
    cancel.add_argument("job_id", metavar="JOB_ID")
    cancel.add_argument("--json", action="store_true")


def _add_schedules(sub) -> None:
    sched = sub.add_parser(
        "schedules", help="create or repair the schedule of every recurring sweep, then show them"
    )
    sched.add_argument("--json", action="store_true")


def _add_sweep(sub) -> None:
    sweep = sub.add_parser("sweep", help="run one recovery sweep now")
    sweep.add_argument("--json", action="store_true")


def _ingest(command, options: dict) -> None:
    space = space_of(options)
    try:
        require_supported_engine()  # MySQL/MariaDB: refused before anything is written
    except SearchBackendUnavailable as exc:
        raise CommandError(f"search_backend_unavailable: {exc}") from None
    files = _collect_files(options["paths"])
    if not files:
        raise CommandError("no files found under the given paths")
    admitted, skipped, rejected = [], [], []
    policy = options["on_duplicate"]
    limit = settings.KNOWLEDGE_UPLOAD_MAX_BYTES
    for path in tqdm(files, desc="upload", unit="file", disable=options["json"]):
        if path.stat().st_size > limit:  # refused before the file is read
            rejected.append(
                {
                    "path": str(path),
                    "code": "file_too_large",
                    "message": upload_limit_message(limit),
                }
            )
            continue
        try:
            admission = documents.admit_document(
                space,
                filename=path.name,
                data=path.read_bytes(),
                on_duplicate="reject" if policy == "skip" else policy,
                enqueue=not options["wait"],
            )
            admitted.append(admission.document.id)
        except Conflict as exc:
            if policy != "skip" or exc.code != "duplicate_document":
                rejected.append({"path": str(path), "code": exc.code, "message": exc.message})
            else:
                skipped.append({"path": str(path), "reason": exc.message})
        except ServiceError as exc:
            rejected.append({"path": str(path), "code": exc.code, "message": exc.message})
    if options["wait"] and admitted:
        with tqdm(total=len(admitted), desc="compile", unit="doc", disable=options["json"]) as bar:
            recovery.drain_queued(space.id, document_ids=admitted, on_progress=bar.update)
        # A running worker cluster may have taken some of them: wait for those too.
        if any(p < 100 for p in reports.latest_job_percents(admitted).values()):
            _follow(admitted, quiet=options["json"])
    elif options["follow"] and admitted:
        _follow(admitted, quiet=options["json"])
    rows = list(
        Document.objects.filter(id__in=admitted).values(
            "id", "filename", "state", "error_code", "error_message", "node_count"
        )
    )
    failed = [r for r in rows if r["state"] == DocumentState.FAILED]
    payload = {
        "space": space.slug,
        "admitted": [{**r, "id": str(r["id"])} for r in rows],
        "skipped": skipped,
        "rejected": rejected,
    }
    lines = [
        f"{r['state']:<10} {r['node_count']:>5} nodes  {r['filename']}"
        + (f"  [{r['error_code']}: {r['error_message']}]" if r["error_code"] else "")
        for r in rows
    ]
    lines += [f"skipped    {s['path']}: already in the space" for s in skipped]
    lines += [f"rejected   {r['path']}: {r['code']}: {r['message']}" for r in rejected]
    command.emit(options, payload, "\n".join(lines))
    if options["wait"] and (failed or rejected):
        raise CommandError(f"{len(failed)} documents failed, {len(rejected)} files rejected")


def _follow(document_ids: list, *, quiet: bool) -> None:
    """A progress bar over the documents' latest jobs (percent summed) until all ended."""
    with tqdm(total=100 * len(document_ids), desc="compile", unit="%", disable=quiet) as bar:
        while True:
            percents = reports.latest_job_percents(document_ids)
            done = sum(percents.values())
            bar.update(done - bar.n)
            if all(p == 100 for p in percents.values()):
                return
            time.sleep(0.5)


def _documents(command, options: dict) -> None:
    """A page of the space's documents, newest first (``--limit``, ``--all``, ``--cursor``; the
    output's ``next_cursor`` continues it)."""
    space = space_of(options)
    page, next_cursor = cli_page(
        documents.documents_in(space),
        options,
        listing="documents",
        binding={"space": str(space.id)},
    )
    rows = [
        {
            "id": str(d.id),
            "filename": d.filename,
            "state": d.state,
            "error_code": d.error_code or None,
            "error_message": d.error_message or None,
            "nodes": d.node_count,
        }
        for d in page
    ]
    lines = [f"{r['state']:<10} {r['nodes']:>5}  {r['filename']}" for r in rows]
    if next_cursor:
        lines.append(f"more: --cursor {next_cursor}")
    command.emit(
        options,
        {"items": rows, "next_cursor": next_cursor},
        "\n".join(lines) or "no documents",
    )


def _jobs(command, options: dict) -> None:
    """A page of the space's jobs, newest first (``--limit``, ``--all``, ``--cursor``; the
    output's ``next_cursor`` continues it)."""
    space = space_of(options)
    jobs, next_cursor = cli_page(
        reports.jobs_in(space, state=options["state"]),
        options,
        listing="jobs",
        binding={"space": str(space.id), "state": options["state"]},
    )
    rows = [_job_row(job) for job in jobs]
    lines = [
        f"{r['state']:<16} {r['progress']['percent']:>3}%  {r['filename']}  {r['id']}"
        + (f"  [{r['error_code']}]" if r["error_code"] else "")
        for r in rows
    ]
    if next_cursor:
        lines.append(f"more: --cursor {next_cursor}")
    command.emit(
        options, {"items": rows, "next_cursor": next_cursor}, "\n".join(lines) or "no jobs"
    )


def _stats(command, options: dict) -> None:
    payload = reports.space_stats(space_of(options))
    command.emit(options, payload, json.dumps(payload, indent=2))


def _retry(command, options: dict) -> None:
    job = operations.retry_job(options["job_id"], from_checkpoint=not options["from_start"])
    command.emit(options, _job_row(job), f"queued attempt {job.attempt_number}: {job.id}")


def _cancel(command, options: dict) -> None:
    job = operations.cancel_job(options["job_id"])
    command.emit(options, _job_row(job), f"canceled {job.id}")


def _schedules(command, options: dict) -> None:
    from knowledgefs.jobs import schedules

    schedule = dispatch.ensure_recovery_schedule()
    payload = {
        "name": schedule.name,
        "func": schedule.func,
        "minutes": schedule.minutes,
        "next_run": schedule.next_run.isoformat() if schedule.next_run else None,
    }
    # Every other registered sweep (research tasks, upgrade reconciliation, the upgrade sweep;
    # knowledgefs.jobs.schedules) is repaired too, in registration order.
    others = [schedules.ensure(name) for name in schedules.SCHEDULES if name != schedule.name]
    payload["also"] = [{"name": s.name, "func": s.func, "minutes": s.minutes} for s in others]
    command.emit(
        options,
        payload,
        "\n".join(
            [
                f"{schedule.name}: {schedule.func} every {schedule.minutes} min "
                f"(next {payload['next_run']})"
            ]
            + [f"{s.name}: {s.func} every {s.minutes} min" for s in others]
        ),  # fmt: skip
    )


def _sweep(command, options: dict) -> None:
    report = recovery.recover_jobs().as_dict()
    command.emit(options, report, json.dumps(report, indent=2))


def _add_storage(sub) -> None:
    store = sub.add_parser("storage", help="object storage hygiene")
    actions = store.add_subparsers(dest="storage_command", required=True)
    sweep = actions.add_parser(
        "sweep",
        help="report (default) or delete stored objects no document or parse artifact "
        "references, older than the grace period",
    )
    mode = sweep.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="report only (the default)")
    mode.add_argument("--apply", action="store_true", help="delete what the report lists")
    sweep.add_argument(
        "--older-than",
        type=int,
        metavar="SECONDS",
        help="grace period (default KNOWLEDGE_STORAGE_SWEEP_GRACE_SECONDS; at least 600)",
    )
    sweep.add_argument("--json", action="store_true")


def _storage(command, options: dict) -> None:
    from ingestion import storage_sweep

    grace = options.get("older_than")
    if grace is not None and grace < 600:
        raise CommandError(f"--older-than must be at least 600 seconds (got {grace})")
    report = storage_sweep.sweep(apply=options["apply"], grace_seconds=grace)
    data = report.as_dict()
    lines = [
        f"{o.key}\t{o.size_bytes} bytes\t{round(o.age_seconds or 0)} s old" for o in report.objects
    ]
    verb = "deleted" if report.applied else "would delete (dry run; --apply deletes)"
    lines.append(
        f"{len(report.objects)} unreferenced object(s), {report.total_bytes} bytes, older than "
        f"{report.grace_seconds} s: "
        + (f"{len(report.deleted)} {verb}" if report.applied else verb)
    )
    if report.failed:
        lines.append(f"{len(report.failed)} could not be deleted (the next sweep tries again)")
    command.emit(options, data, "\n".join(lines))
    if report.failed:
        raise CommandError(f"{len(report.failed)} object(s) could not be deleted")


def _add_visual(sub) -> None:
    visual = sub.add_parser("visual", help="visual projections of document images")
    actions = visual.add_subparsers(dest="visual_command", required=True)
    backfill = actions.add_parser(
        "backfill",
        help="embed the images of every published document with the space's image-capable "
        "profile (and remove those of other profiles)",
    )
    backfill.add_argument("--space", required=True, metavar="SLUG")
    backfill.add_argument("--tenant", required=True)
    backfill.add_argument("--json", action="store_true")


def _visual(command, options: dict) -> None:
    from ingestion.visual import backfill_space

    summary = backfill_space(space_of(options).id)
    command.emit(
        options,
        summary,
        f"{summary['documents']} document(s), {summary['embedded']} image(s) embedded, "
        f"{summary['removed']} stale projection(s) removed",
    )


def _job_row(job) -> dict:
    data = JobSerializer(job).data
    return {
        "id": str(job.id),
        "document_id": str(job.document_id),
        "filename": job.document.filename,
        "state": data["state"],
        "stage": job.stage,
        "run_state": job.run_state,
        "progress": data["progress"],
        "attempt_number": job.attempt_number,
        "error_code": job.error_code or None,
        "error_message": job.error_message or None,
    }


def _collect_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(
                sorted(
                    p
                    for p in path.rglob("*")
                    if p.is_file()
                    and not any(part.startswith(".") for part in p.relative_to(path).parts)
                )
            )
        elif path.is_file():
            files.append(path)
        else:
            raise CommandError(f"no such file or folder: {raw}")
    return files


_PARSERS = {
    "ingest": _add_ingest,
    "documents": _add_documents,
    "jobs": _add_jobs,
    "stats": _add_stats,
    "retry": _add_retry,
    "cancel": _add_cancel,
    "schedules": _add_schedules,
    "sweep": _add_sweep,
    "storage": _add_storage,
    "visual": _add_visual,
}
_HANDLERS = {
    "ingest": _ingest,
    "documents": _documents,
    "jobs": _jobs,
    "stats": _stats,
    "retry": _retry,
    "cancel": _cancel,
    "schedules": _schedules,
    "sweep": _sweep,
    "storage": _storage,
    "visual": _visual,
}
