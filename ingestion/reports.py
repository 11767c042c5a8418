"""Read-side summaries of compilation for the command line, operators and the API: the public
job state (:func:`public_state`), job listings by state and per-space counts, as plain values
(the serializers render them; this module imports none)."""

from __future__ import annotations

from django.db.models import Count, F, QuerySet

from ingestion.models import CompilationJob, Document, KnowledgeNode, RunState, Stage
from knowledgefs.errors import InvalidInput
from spaces.models import KnowledgeSpace

PUBLIC_STATES = [
    "queued",
    "parsed",
    "nodes_generated",
    "projection_built",
    "retry_wait",
    "published",
    "failed",
    "canceled",
    "superseded",
]

#: Ended run states whose public state is a fixed word.
PUBLIC_STAGE_STATES = {"succeeded": "published", "failed": "failed", "canceled": "canceled"}


def public_state(job: CompilationJob) -> str:
    """The one word a caller needs: ``published``, ``failed``, ``canceled``, ``superseded``,
    ``retry_wait``, or the current checkpoint of a live attempt (``queued``, ``parsed``, …)."""
    if job.run_state in PUBLIC_STAGE_STATES:
        return PUBLIC_STAGE_STATES[job.run_state]
    if job.run_state in ("superseded", "retry_wait"):
        return job.run_state
    return job.stage


def public_state_filter(state: str) -> dict:
    """Queryset filter kwargs for a public job state (see :data:`PUBLIC_STATES`).

    Raises :class:`InvalidInput` (``invalid_state``) naming the accepted values.
    """
    if state == "published":
        return {"run_state": RunState.SUCCEEDED}
    if state in ("failed", "canceled", "superseded", "retry_wait"):
        return {"run_state": state}
    if state in (Stage.QUEUED, Stage.PARSED, Stage.NODES_GENERATED, Stage.PROJECTION_BUILT):
        return {
            "stage": state,
            "run_state__in": [RunState.DISPATCH_PENDING, RunState.QUEUED, RunState.RUNNING],
        }
    raise InvalidInput(
        f"unknown state {state!r}; use one of {', '.join(PUBLIC_STATES)}", code="invalid_state"
    )


def jobs_in(space: KnowledgeSpace, *, state: str | None = None) -> QuerySet[CompilationJob]:
    """The space's compilation attempts, newest first, optionally of one public state."""
    qs = CompilationJob.objects.filter(space=space).select_related("document")
    if state:
        qs = qs.filter(**public_state_filter(state))
    return qs.order_by("-created_at", "-id")


def space_stats(space: KnowledgeSpace) -> dict:
    """``{"documents": {state: n}, "nodes": n, "jobs": {public state: n}}`` for one space.

    ``nodes`` counts published nodes only (the active generation of each document).
    """
    documents = dict(
        Document.objects.filter(space=space)
        .values_list("state")
        .annotate(n=Count("id"))
        .values_list("state", "n")
    )
    jobs: dict[str, int] = {}
    for job in CompilationJob.objects.filter(space=space).only("run_state", "stage"):
        key = public_state(job)
        jobs[key] = jobs.get(key, 0) + 1
    nodes = KnowledgeNode.objects.filter(
        space=space, generation=F("document__active_generation")
    ).count()
    return {"documents": documents, "nodes": nodes, "jobs": jobs}


def latest_job_percents(document_ids: list) -> dict:
    """``{document_id: percent}`` of each document's newest attempt; an ended attempt is 100."""
    ended = {RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELED, RunState.SUPERSEDED}
    percents: dict = {}
    for job in (
        CompilationJob.objects.filter(document_id__in=document_ids)
        .order_by("document_id", "-created_at")
        .only("document_id", "run_state", "progress_percent")
    ):
        if job.document_id not in percents:
            percents[job.document_id] = (
                100 if job.run_state in ended else min(job.progress_percent, 99)
            )
    for document_id in document_ids:
        percents.setdefault(document_id, 100)  # deleted meanwhile
    return percents
