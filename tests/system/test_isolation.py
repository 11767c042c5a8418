"""Tenant isolation over every route, built from the URL configuration.

Each route and method registered in ``knowledgefs.urls`` is called with another tenant's ids,
by an API key, a space-bound API key and a capability token whose action and resource match
the route exactly (so only the tenant differs). A new route is covered without anyone adding
it here; a route with a path parameter this test cannot fill fails until it learns it.
"""

from __future__ import annotations

import uuid

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from ingestion.models import CompilationJob, Document
from knowledgefs.auth.operations import operation_for
from knowledgefs.testing import capability as cap
from knowledgefs.testing.fixtures import multipart_body, upload
from spaces.api_keys import create_api_key
from spaces.services import Principal, create_space

pytestmark = pytest.mark.django_db

INNER_KEY = "inner-key-for-isolation-0123456789"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")

# A body each operation accepts, so a 404 cannot hide behind a 400.
BODIES = {
    "knowledge_spaces.update": {"name": "renamed"},
    "knowledge_spaces.create": {"name": "mine"},
    "queries.create": {"query": "anything"},
    "knowledge_spaces.update_embedding_profile": {
        "plugin_id": "local",
        "provider": "local",
        "model": "local/all-MiniLM-L6-v2-int8-onnx",
    },
    "knowledge_spaces.update_retrieval_profile": {"top_k": 5},
    "jobs.retry": {"from": "checkpoint"},
    "golden_questions.create": {"question": "q", "expected_evidence": [{"text": "q"}]},
    "golden_questions.update": {"tags": ["x"]},
    "queries.feedback": {"helpful": False, "reason": "wrong"},
    "bad_cases.update": {"expected_revision": 1, "status": "dismissed"},
    "replay_runs.create": {"selection": "all-active"},
    "replay_runs.cancel": {"expected_revision": 1},
    "replay_runs.retry": {"expected_revision": 1},
    "failed_queries.triage_runs.cancel": {"expected_revision": 1},
    "golden_questions.evidence_matches.create": {"evidence_texts": ["tenant b"]},
    "golden_questions.bulk_import.create": {"rows": [{"question": "q", "evidence": "e"}]},
    "internal.knowledge_spaces.delete": {"namespace_id": "tenant-a"},
    "internal.knowledge_spaces.provision": {
        "namespace_id": "tenant-a",
        "name": "Provisioned",
        "slug": "provisioned",
    },
}
# Path parameters that do not name a tenant's object, with the reason.
NOT_TENANT_OWNED = {"grant_id": "capability grants are Dify's, revoked by Dify for any tenant"}


def routes() -> list[tuple[str, str, type]]:
    """(name, path template, view class) of every API route, walking nested includes."""
    found: list[tuple[str, str, type]] = []

    def walk(patterns, prefix: str) -> None:
        for entry in patterns:
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, prefix + str(entry.pattern))
            elif isinstance(entry, URLPattern):
                view = getattr(entry.callback, "cls", None) or getattr(
                    entry.callback, "view_class", None
                )
                template = prefix + str(entry.pattern)
                if template.startswith(("v1/", "internal/")):
                    found.append((entry.name, "/" + template, view))

    walk(get_resolver().url_patterns, "")
    return found


def implemented(view: type) -> list[str]:
    return [m for m in METHODS if hasattr(view, m.lower())]


@pytest.fixture
def foreign(db, settings):
    """Tenant B's space, document and job, and tenant A's own space."""
    settings.DIFY_INNER_API_KEY = INNER_KEY
    settings.KNOWLEDGE_FS_CAPABILITY_V2_ENABLED = True
    settings.KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS = cap.jwks_text("current")
    b_space = create_space(Principal(tenant_id="tenant-b"), name="B private")
    b_key = create_api_key("tenant-b")[1]
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {b_key}")
    admitted = upload(api, b_space, "b.txt", b"tenant b only\n").json()
    from retrieval.golden import create_question

    question = create_question(
        b_space, {"question": "tenant b?", "expected_evidence": [{"text": "tenant b"}]}
    )
    from ingestion.upload_sessions import Declared, create_session

    session, _ = create_session(
        b_space,
        Declared("b.md", "text/markdown", 14, "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="),
    )
    trace, failed, bad, run = _quality_rows(b_space)
    source, source_run = _source_rows(b_space)
    own = create_space(Principal(tenant_id="tenant-a"), name="A own")
    other_own = create_space(Principal(tenant_id="tenant-a"), name="A other")
    return {
        "space_id": str(b_space.id),
        "document_id": admitted["document"]["id"],
        "job_id": admitted["job"]["id"],
        "question_id": str(question.id),
        "asset_id": "0",
        "session_id": str(session.id),
        "trace_id": str(trace.id),
        "failed_query_id": str(failed.id),
        "bad_case_id": str(bad.id),
        "run_id": str(run.id),
        "source_id": str(source.id),
        "source_run_id": str(source_run.id),
        "own": own,
        "other_own": other_own,
    }


def _source_rows(b_space):
    """Tenant B's datasource source and one run of it."""
    from ingestion.sources.models import Source, SourceRun

    source = Source.objects.create(
        tenant_id="tenant-b", space=b_space, name="B wiki", kind="online_document",
        provider="langgenius/notion_datasource/notion", datasource="notion",
        credential_id="cred-b",
    )  # fmt: skip
    run = SourceRun.objects.create(
        tenant_id="tenant-b", space=b_space, source=source, kind="sync", state="failed"
    )
    return source, run


def _quality_rows(b_space):
    """Tenant B's answer trace, the failed query it captured and a bad case of it."""
    from retrieval.models import AnswerTrace
    from retrieval.quality import bad_cases
    from retrieval.quality.capture import store

    tenant_b = Principal(tenant_id="tenant-b")
    trace = AnswerTrace.objects.create(
        tenant_id="tenant-b", space=b_space, requester_kind="operator",
        requester="operator:tenant-b", source="cli", mode="fast", query_sha256="0" * 64,
        query_chars=1, completed=True,
    )  # fmt: skip
    failed = store(
        {"tenant_id": "tenant-b", "space_id": b_space.id, "trace_id": trace.id,
         "trigger": "not-enough-evidence", "requester_kind": "operator",
         "requester": "operator:tenant-b", "query": "tenant b only", "query_sha256": "0" * 64}
    )  # fmt: skip
    bad = bad_cases.create_bad_case(tenant_b, b_space, {"trace_id": str(trace.id), "reason": "b"})
    from retrieval.models import ReplayRun

    run = ReplayRun.objects.create(
        tenant_id="tenant-b", space=b_space, requester_kind="operator",
        requester="operator:tenant-b", mode="fast", selection="all-active",
        request_fingerprint="sha256:" + "0" * 64,
    )  # fmt: skip
    return trace, failed, bad, run


def fill(template: str, ids: dict) -> str:
    url = template
    for name, value in ids.items():
        url = url.replace(f"<str:{name}>", value)
    assert "<" not in url, (
        f"{template}: add a foreign object for its path parameter to tests/system/test_isolation.py"
    )
    return url


def call(api: APIClient, method: str, url: str, action: str):
    if action == "documents.create":
        body, content_type = multipart_body("x.txt", b"x\n")
        return api.generic("POST", url, body, content_type=content_type)
    return api.generic(method, url, data=_json(BODIES.get(action)), content_type="application/json")


def _json(body) -> str:
    import json

    return json.dumps(body or {})


def test_every_route_and_method_registers_one_operation():
    seen: dict[str, str] = {}
    table = routes()
    assert len(table) >= 12
    for _name, template, view in table:
        assert view is not None, f"{template} is not a class-based API view"
        for method in implemented(view):
            operation = operation_for(view, method)
            assert operation is not None, f"{method} {template} declares no operation"
            assert operation.action not in seen, (
                f"{operation.action} is used by both {seen[operation.action]} and "
                f"{method} {template}"
            )
            seen[operation.action] = f"{method} {template}"
            assert operation.internal == template.startswith("/internal/"), template


def test_foreign_ids_are_404_on_every_route_for_every_kind_of_caller(foreign):
    checked = 0
    own_key = create_api_key("tenant-a")[1]
    scoped_key = create_api_key("tenant-a", spaces=[foreign["own"]])[1]
    for _name, template, view in routes():
        params = [
            p
            for p in (
                "asset_id",
                "session_id",
                "space_id",
                "document_id",
                "job_id",
                "question_id",
                "grant_id",
                "trace_id",
                "failed_query_id",
                "bad_case_id",
                "run_id",
                "source_id",
                "source_run_id",
            )
            if f"<str:{p}>" in template
        ]
        if not params or any(p in NOT_TENANT_OWNED for p in params):
            continue
        url = fill(template, {p: foreign[p] for p in params})
        for method in implemented(view):
            operation = operation_for(view, method)
            callers: list[tuple[str, APIClient]] = []
            if operation.internal:
                api = APIClient()
                api.credentials(HTTP_X_INNER_API_KEY=INNER_KEY)
                callers.append(("inner key naming tenant-a", api))
            else:
                for label, secret in (("api key", own_key), ("space-bound key", scoped_key)):
                    api = APIClient()
                    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
                    callers.append((label, api))
                resource = _resource_for(operation.binding, foreign)
                token = cap.token(
                    action=operation.action, resource=resource, caller_kind="interactive"
                )
                api = APIClient()
                api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
                callers.append(("capability token of tenant-a", api))
            for label, api in callers:
                response = call(api, method, url, operation.action)
                assert response.status_code == 404, (label, method, url, response.content)
                body = response.json()
                assert body["code"].endswith("_not_found"), (label, method, url, body)
                assert "tenant-b" not in response.content.decode()
                checked += 1
    assert checked >= 30
    # nothing of tenant B changed
    assert Document.objects.filter(id=foreign["document_id"]).exists()
    assert CompilationJob.objects.filter(id=foreign["job_id"]).exists()


def _resource_for(binding, foreign: dict) -> dict:
    if binding.type == "knowledge_space":
        return cap.space_resource(foreign["space_id"])
    ident = foreign[binding.field]
    return cap.child_resource(binding.type, ident, foreign["space_id"])


def test_lists_show_only_what_details_show(foreign):
    """List and detail agree: what a caller can list it can read, and nothing else."""
    scoped_key = create_api_key("tenant-a", spaces=[foreign["own"]])[1]
    for secret, expected in (
        (create_api_key("tenant-a")[1], {str(foreign["own"].id), str(foreign["other_own"].id)}),
        (scoped_key, {str(foreign["own"].id)}),
    ):
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        listed = {s["id"] for s in api.get("/v1/knowledge-spaces?limit=100").json()["results"]}
        assert listed == expected
        for space_id in (str(foreign["own"].id), str(foreign["other_own"].id), foreign["space_id"]):
            readable = api.get(f"/v1/knowledge-spaces/{space_id}").status_code == 200
            assert readable == (space_id in listed), (space_id, listed)


def test_ids_that_do_not_exist_look_exactly_like_foreign_ones(foreign):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key('tenant-a')[1]}")
    missing = api.get(f"/v1/knowledge-spaces/{uuid.uuid4()}")
    foreign_one = api.get(f"/v1/knowledge-spaces/{foreign['space_id']}")
    assert missing.status_code == foreign_one.status_code == 404
    assert missing.json() == foreign_one.json()
