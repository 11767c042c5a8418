"""Read-side summaries of compilation for the command line and operators."""

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
    from ingestion.serializers import public_state

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
