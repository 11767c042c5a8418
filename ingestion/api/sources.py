"""REST views of sources (docs/datasources.md): thin wrappers over ``ingestion.sources``.

Every route names its source in the path and is one registered operation on the capability
resource ``source`` (or the space, for the space-wide listings)."""

from __future__ import annotations

import json

from django.conf import settings
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from ingestion.sources import browse, bulk, policy, preview, runs, services
from ingestion.sources.models import RunKind, Source, SourceKind, SourceRun
from knowledgefs.auth.operations import WRITE_CALLERS, Operation, child, space_from
from knowledgefs.idempotency import fingerprint, idempotent
from knowledgefs.pagination import NewestFirstPagination
from spaces.services import get_space


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def source_body(source: Source) -> dict:
    """The public source: its connection is named by ``credential_id`` only."""
    return {
        "id": str(source.id),
        "space_id": str(source.space_id),
        "name": source.name,
        "kind": source.kind,
        "provider": source.provider,
        "datasource": source.datasource,
        "credential_id": source.credential_id,
        "parameters": source.parameters,
        "last_synced_at": _iso(source.last_synced_at),
        "created_at": source.created_at.isoformat(),
        "updated_at": source.updated_at.isoformat(),
    }


def source_of(request, space_id, source_id) -> Source:
    return services.get_source(get_space(request.user, space_id), source_id)


def _on_source(action: str, callers=None) -> Operation:
    binding = child("source", "source_id")
    return Operation(action, binding, callers) if callers else Operation(action, binding)


class SourceListView(APIView):
    operations = {
        "GET": Operation("sources.list", space_from()),
        "POST": Operation("sources.create", space_from(), WRITE_CALLERS),
    }

    def get(self, request, space_id):
        """The space's sources, newest first (paginated)."""
        space = get_space(request.user, space_id)
        paginator = NewestFirstPagination()
        page = paginator.paginate_queryset(services.sources_in(space), request, view=self)
        return paginator.get_paginated_response([source_body(s) for s in page])

    def post(self, request, space_id):
        """Create a source ``{name, kind, provider, datasource, credential_id, parameters?}``;
        201 with the source."""
        space = get_space(request.user, space_id)
        source = services.create_source(space, request.data)
        return Response(source_body(source), status=status.HTTP_201_CREATED)


class SourceDetailView(APIView):
    operations = {
        "GET": _on_source("sources.read"),
        "DELETE": _on_source("sources.delete", WRITE_CALLERS),
    }

    def get(self, request, space_id, source_id):
        return Response(source_body(source_of(request, space_id, source_id)))

    def delete(self, request, space_id, source_id):
        """Delete the source (``?documents=keep`` default, or ``cascade``); 204."""
        source = source_of(request, space_id, source_id)
        services.delete_source(source, documents=request.query_params.get("documents", "keep"))
        return Response(status=status.HTTP_204_NO_CONTENT)


class SourceTestView(APIView):
    operations = {"POST": _on_source("sources.test", WRITE_CALLERS)}

    def post(self, request, space_id, source_id):
        """Validate the connection through Dify: 200 ``{valid, code?, error?}``."""
        return Response(services.test_source(source_of(request, space_id, source_id)))


def run_body(run: SourceRun) -> dict:
    return {
        "id": str(run.id),
        "source_id": str(run.source_id) if run.source_id else None,
        "kind": run.kind,
        "trigger": run.trigger,
        "state": run.state,
        "checkpoint": run.checkpoint,
        "progress_total": run.progress_total,
        "progress_completed": run.progress_completed,
        "progress_skipped": run.progress_skipped,
        "progress_failed": run.progress_failed,
        "execution_attempts": run.attempt_count,
        "max_execution_attempts": settings.KNOWLEDGE_SOURCE_RUN_MAX_ATTEMPTS,
        "retry_at": _iso(run.retry_at),
        "error_code": run.error_code or None,
        "error_message": run.error_message or None,
        "created_at": run.created_at.isoformat(),
        "started_at": _iso(run.started_at),
        "completed_at": _iso(run.completed_at),
    }


def _started(request, source: Source, what: str, start) -> Response:
    """202 with the queued run; an ``Idempotency-Key`` replays the first answer."""
    body = request.data if isinstance(request.data, dict) else {}
    digest = fingerprint(what, str(source.id), json.dumps(body, sort_keys=True, default=str))
    return idempotent(
        request,
        digest,
        lambda: Response(run_body(start()), status=status.HTTP_202_ACCEPTED),
    )


class SourcePagesView(APIView):
    operations = {"GET": _on_source("sources.pages")}

    def get(self, request, space_id, source_id):
        """Online-document pages by workspace, or a crawl's pages without content:
        ``?cursor=&limit=`` (1–200, 50)."""
        source = source_of(request, space_id, source_id)
        return Response(
            browse.list_pages(
                source,
                cursor=request.query_params.get("cursor"),
                limit=request.query_params.get("limit"),
            )
        )


class SourceFilesView(APIView):
    operations = {"GET": _on_source("sources.files")}

    def get(self, request, space_id, source_id):
        """A drive listing: ``?bucket=&prefix=&max_keys=`` (1–1,000, 100)
        ``&continuation_token=``."""
        source = source_of(request, space_id, source_id)
        params = request.query_params
        return Response(
            browse.list_files(
                source,
                bucket=params.get("bucket"),
                prefix=params.get("prefix"),
                max_keys=params.get("max_keys"),
                continuation_token=params.get("continuation_token"),
            )
        )


class SourceImportView(APIView):
    operations = {"POST": _on_source("sources.import", WRITE_CALLERS)}

    def post(self, request, space_id, source_id):
        """Import 1–200 items ``{items: [...]}``, or for a website a crawl preview's frozen
        selection ``{preview_run_id, urls[1–200]}``; 202 with the queued run."""
        source = source_of(request, space_id, source_id)
        if source.kind == SourceKind.WEBSITE:
            return _started(request, source, "crawl-import",
                            lambda: preview.start_crawl_import(source, request.data))  # fmt: skip
        return _started(request, source, "import", lambda: runs.start_import(source, request.data))


class SourceCrawlPreviewView(APIView):
    operations = {"POST": _on_source("sources.crawl_preview", WRITE_CALLERS)}

    def post(self, request, space_id, source_id):
        """Crawl a website source as a durable ``crawl-preview`` run; 202 with it."""
        source = source_of(request, space_id, source_id)
        return _started(request, source, "crawl-preview", lambda: preview.start_preview(source))


class SourceSyncView(APIView):
    operations = {"POST": _on_source("sources.sync", WRITE_CALLERS)}

    def post(self, request, space_id, source_id):
        """Sync the source's items now; 202 with the queued run (409 while one is live)."""
        source = source_of(request, space_id, source_id)
        return _started(request, source, "sync", lambda: runs.start_sync(source))


class SourceRunListView(APIView):
    operations = {"GET": Operation("sources.runs.list", space_from())}

    def get(self, request, space_id):
        """The space's source runs, newest first; ``?source_id=`` filters."""
        space = get_space(request.user, space_id)
        source_id = request.query_params.get("source_id")
        if source_id:
            source_id = services.get_source(space, source_id).id
        paginator = NewestFirstPagination()
        page = paginator.paginate_queryset(
            runs.runs_in(space, source_id=source_id), request, view=self
        )
        return paginator.get_paginated_response([run_body(r) for r in page])


def _run_of(request, space_id, source_id, source_run_id) -> SourceRun:
    return runs.get_run(source_of(request, space_id, source_id), source_run_id)


class SourceRunDetailView(APIView):
    operations = {"GET": _on_source("sources.runs.read")}

    def get(self, request, space_id, source_id, source_run_id):
        """The run; a crawl preview adds its listed pages (``?cursor=&limit=`` 1–200, 50)."""
        run = _run_of(request, space_id, source_id, source_run_id)
        body = run_body(run)
        if run.kind == RunKind.CRAWL_PREVIEW:
            params = request.query_params
            body.update(
                preview.pages_of(run, cursor=params.get("cursor"), limit=params.get("limit"))
            )
        return Response(body)


class SourceRunCancelView(APIView):
    operations = {"POST": _on_source("sources.runs.cancel", WRITE_CALLERS)}

    def post(self, request, space_id, source_id, source_run_id):
        """Cancel a queued or running run; 200 with it (409 ``source_run_finished``)."""
        run = _run_of(request, space_id, source_id, source_run_id)
        return Response(run_body(runs.cancel_run(run)))


class SourceRunRetryView(APIView):
    operations = {"POST": _on_source("sources.runs.retry", WRITE_CALLERS)}

    def post(self, request, space_id, source_id, source_run_id):
        """Queue a failed or canceled run again (finished items kept); 202 with it."""
        run = _run_of(request, space_id, source_id, source_run_id)
        return Response(run_body(runs.retry_run(run)), status=status.HTTP_202_ACCEPTED)


class SourceSyncPolicyView(APIView):
    operations = {
        "GET": _on_source("sources.sync_policy.read"),
        "PUT": _on_source("sources.sync_policy.update", WRITE_CALLERS),
    }

    def get(self, request, space_id, source_id):
        return Response(policy.policy_of(source_of(request, space_id, source_id)))

    def put(self, request, space_id, source_id):
        """``{mode manual|interval|custom, enabled, custom_interval_seconds?,
        expected_revision}``; 200 with the policy (409 ``revision_conflict``)."""
        source = source_of(request, space_id, source_id)
        return Response(policy.put_policy(source, request.data))


class SourceBulkView(APIView):
    operations = {"POST": Operation("sources.bulk", space_from(), WRITE_CALLERS)}

    def post(self, request, space_id):
        """``{action sync|disable|remove, source_ids[1-200]}``: 202 with a durable ``bulk``
        run (one outcome per source, ``GET …/source-runs/{run}``)."""
        space = get_space(request.user, space_id)
        body = request.data if isinstance(request.data, dict) else {}
        digest = fingerprint("bulk", str(space.id), json.dumps(body, sort_keys=True, default=str))
        return idempotent(
            request,
            digest,
            lambda: Response(
                space_run_body(bulk.start_bulk(space, request.data)),
                status=status.HTTP_202_ACCEPTED,
            ),
        )


def space_run_body(run: SourceRun) -> dict:
    """A run read by its space; a bulk run adds each source's outcome (``results``)."""
    body = run_body(run)
    if run.kind == RunKind.BULK:
        body["results"] = bulk.results_of(run)
    return body


def _space_run(request, space_id, source_run_id) -> SourceRun:
    return runs.get_space_run(get_space(request.user, space_id), source_run_id)


class SpaceSourceRunDetailView(APIView):
    operations = {"GET": Operation("sources.space_runs.read", space_from())}

    def get(self, request, space_id, source_run_id):
        """Any source run of the space (bulk runs: with their per-source ``results``)."""
        return Response(space_run_body(_space_run(request, space_id, source_run_id)))


class SpaceSourceRunCancelView(APIView):
    operations = {"POST": Operation("sources.space_runs.cancel", space_from(), WRITE_CALLERS)}

    def post(self, request, space_id, source_run_id):
        """Cancel a queued or running run; 200 with it (409 ``source_run_finished``)."""
        run = runs.cancel_run(_space_run(request, space_id, source_run_id))
        return Response(space_run_body(run))


class SpaceSourceRunRetryView(APIView):
    operations = {"POST": Operation("sources.space_runs.retry", space_from(), WRITE_CALLERS)}

    def post(self, request, space_id, source_run_id):
        """Queue a failed or canceled run again (finished items kept); 202 with it."""
        run = runs.retry_run(_space_run(request, space_id, source_run_id))
        return Response(space_run_body(run), status=status.HTTP_202_ACCEPTED)
