"""REST views of research tasks: thin wrappers over :mod:`retrieval.research_tasks.service`.

Routes (``/v1``): ``POST research-tasks/plan``, ``POST research-tasks``, ``GET|DELETE
research-tasks/{task_id}``, ``GET research-tasks/{task_id}/partials``, ``POST
research-tasks/{task_id}/resume``, ``GET knowledge-spaces/{space_id}/research-tasks``.

A research task is a query that runs longer, so every operation is open to the callers queries
are open to (interactive, service, agent and workflow capability tokens; ``READ_CALLERS``): an
agent that starts a task can also cancel and resume it. It changes no knowledge.
"""

from __future__ import annotations

from rest_framework import status
from rest_framework.response import Response

from knowledgefs.auth.operations import Operation, child, space_from
from knowledgefs.errors import InvalidInput
from knowledgefs.idempotency import HEADER, fingerprint, idempotent
from knowledgefs.pagination import KeysetPagination, NewestFirstPagination
from spaces.services import get_space

from ..research_tasks import service
from ..research_tasks.models import ResearchTask, ResearchTaskPartial
from .views import RouteView, refuse_unknown_members


def _iso(moment) -> str | None:
    return moment.isoformat() if moment else None


def task_dict(task: ResearchTask, *, full: bool = True) -> dict:
    """The public shape of a task. ``progress`` is ``{stage, checkpoint_steps (the model steps
    with an outcome in the checkpoint), model_calls_spent (model calls started over all
    deliveries, a call cut short by a cancel included), attempts, resumes}``; ``result``
    (``full`` only, once ``completed``) holds ``items`` (with citations) and ``metrics``; items
    of documents disabled or deleted since are left out and listed in ``redacted``."""
    # A checkpoint damaged outside the service (the run then fails internal_error) still reads.
    checkpoint = task.checkpoint if isinstance(task.checkpoint, dict) else {}
    spent = checkpoint.get("spent")
    if not isinstance(spent, dict):
        spent = {}
    body = {
        "id": str(task.id),
        "space_id": str(task.space_id),
        "query": task.query,
        "top_k": task.top_k,
        "score_threshold": task.score_threshold,
        "filters": task.filters,
        "limits": task.limits,
        "query_images": task.query_images or [],
        "stage": task.stage,
        "status": task.run_state,
        "progress": {
            "stage": task.stage,
            "checkpoint_steps": sorted(k for k in checkpoint if k not in ("rounds", "spent")),
            "model_calls_spent": spent.get("model_calls", 0),
            "attempts": task.attempt_count,
            "resumes": task.resume_count,
        },
        "error": (
            {"code": task.error_code, "message": task.error_message} if task.error_code else None
        ),
        "elapsed_ms": task.elapsed_ms,
        "created_at": _iso(task.created_at),
        "started_at": _iso(task.started_at),
        "finished_at": _iso(task.finished_at),
        "updated_at": _iso(task.updated_at),
    }
    if full:
        body["plan"] = task.plan
        result = task.result
        body["result"] = service.redact(result, service.unavailable_documents([result]))
    return body


def partial_dict(partial: ResearchTaskPartial, reasons: dict[str, str]) -> dict:
    """A partial's public shape; items of documents in ``reasons`` (disabled or deleted since)
    are redacted (:func:`service.redact`)."""
    return {
        "sequence": partial.sequence,
        "kind": partial.kind,
        "evidence_bundle": service.redact(partial.evidence, reasons),
        "created_at": _iso(partial.created_at),
    }


class SequencePagination(KeysetPagination):
    """Keyset pagination by ``(sequence, id)``, oldest first; ``?limit=`` up to 100 (default
    25)."""

    page_size = 25
    ordering = ("sequence", "id")


BODY_MEMBERS = ("space_id", "query", "top_k", "filters", "limits", "query_images")


def _body(request) -> dict:
    """The JSON object body; 400 ``invalid_request`` for anything else or a member outside
    :data:`BODY_MEMBERS` (named)."""
    if not isinstance(request.data, dict):
        raise InvalidInput("body must be a JSON object", code="invalid_request")
    refuse_unknown_members(request.data, BODY_MEMBERS, "research-task")
    return request.data


def _space_in_body(request):
    space_id = _body(request).get("space_id")
    if not isinstance(space_id, str):
        raise InvalidInput("space_id is required (a knowledge space id)", code="invalid_space_id")
    return get_space(request.user, space_id)


class ResearchTaskPlanView(RouteView):
    operations = {"POST": Operation("research_tasks.plan", space_from("body"))}

    def post(self, request):
        """Body as for create; 200 with the estimate (nothing is created)."""
        space = _space_in_body(request)
        return Response(service.plan_task(space, _body(request)))


class ResearchTaskListView(RouteView):
    operations = {
        "POST": Operation("research_tasks.create", space_from("body")),
    }

    def post(self, request):
        """Body ``{space_id, query, top_k?, filters?, limits?, query_images?}``; 202 with the
        queued task.
        ``Idempotency-Key`` returns the same task for the same body."""
        space = _space_in_body(request)
        body = _body(request)
        key = request.META.get(HEADER)

        def create() -> Response:
            task, created = service.create_task(request.user, space, body, idempotency_key=key)
            response = Response(task_dict(task), status=status.HTTP_202_ACCEPTED)
            if not created:
                response["Idempotent-Replayed"] = "true"
            return response

        digest = fingerprint(
            "research_tasks.create",
            str(space.id),
            repr(body.get("query")),
            repr(body.get("top_k")),
            repr(body.get("filters")),
            repr(body.get("limits")),
            *([repr(body["query_images"])] if body.get("query_images") else []),
        )
        return idempotent(request, digest, create)


_TASK = child("research_task", "task_id", parent_field=None)


class ResearchTaskDetailView(RouteView):
    # /v1/research-tasks/{task_id} does not name the space: the token's parent_id scopes it.
    operations = {
        "GET": Operation("research_tasks.read", _TASK),
        "DELETE": Operation("research_tasks.cancel", _TASK),
    }

    def get(self, request, task_id):
        """Status, stage, progress, error and (once completed) the result."""
        return Response(task_dict(service.get_task(request.user, task_id)))

    def delete(self, request, task_id):
        """Cancel a queued or running task (409 ``research_task_finished`` once it ended)."""
        task = service.get_task(request.user, task_id)
        return Response(task_dict(service.cancel_task(task.id)))


class ResearchTaskPartialsView(RouteView):
    operations = {"GET": Operation("research_tasks.partials", _TASK)}

    def get(self, request, task_id):
        """The task's partial evidence bundles by ``sequence`` (paginated)."""
        task = service.get_task(request.user, task_id)
        paginator = SequencePagination()
        page = paginator.paginate_queryset(service.partials_of(task), request, view=self)
        reasons = service.unavailable_documents([p.evidence for p in page])
        return paginator.get_paginated_response([partial_dict(p, reasons) for p in page])


class ResearchTaskResumeView(RouteView):
    operations = {"POST": Operation("research_tasks.resume", _TASK)}

    def post(self, request, task_id):
        """Queue a failed or canceled task again from its checkpoint; 202 with the task."""
        task = service.get_task(request.user, task_id)
        return Response(task_dict(service.resume_task(task.id)), status=status.HTTP_202_ACCEPTED)


class SpaceResearchTaskListView(RouteView):
    operations = {"GET": Operation("research_tasks.list", space_from())}

    def get(self, request, space_id):
        """The space's research tasks the caller may see, newest first (paginated)."""
        space = get_space(request.user, space_id)
        paginator = NewestFirstPagination()
        page = paginator.paginate_queryset(
            service.tasks_in(request.user, space), request, view=self
        )
        return paginator.get_paginated_response([task_dict(t, full=False) for t in page])
