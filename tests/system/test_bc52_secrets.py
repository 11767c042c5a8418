"""BC-52: secrets never reach an error (../shared/cases/README.md).

A credential (``sk-CANARY-7f3a``) is used against stub endpoints that refuse it with 403, or
answer with an error body echoing it (as an ``Authorization`` header would be echoed): the
remote parser (Unstructured), Dify's inner API through the simulated Dify server, a compile
that uses each, a query with a capability JWT and ``kfs_`` API keys. Every log line (DEBUG and
up, with tracebacks), response body, stored error (jobs, documents), AnswerTrace and Django
admin change page is searched: the canary, bearer tokens, JWTs and ``kfs_`` secrets never
appear; a refusal says "authentication failed (403)".
"""

from __future__ import annotations

import logging
import time

import pytest
from django.urls import reverse

from ingestion.models import CompilationJob, Document
from knowledgefs.testing.fixtures import compile_all, upload
from knowledgefs.testing.pdf_fixtures import text_pdf
from knowledgefs.testing.unstructured_server import UnstructuredTestServer

pytestmark = pytest.mark.django_db

CANARY = "sk-CANARY-7f3a"
ECHO = (
    f"invalid credentials: Authorization: Bearer {CANARY}; api_key={CANARY}; "
    f"received {CANARY} from the caller"
)


def everything_logged(caplog) -> str:
    """Every captured record, formatted with its traceback, as one text."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return "\n".join(formatter.format(r) for r in caplog.records)


def assert_clean(text: str, *secrets: str) -> None:
    for secret in (CANARY, *secrets):
        assert secret not in text, (
            f"{secret!r} leaked: …{text[max(0, text.find(secret) - 200) :][:400]}…"
        )


@pytest.fixture
def parser(settings):
    server = UnstructuredTestServer().start()
    settings.UNSTRUCTURED_API_URL = server.url
    settings.UNSTRUCTURED_API_KEY = CANARY
    settings.UNSTRUCTURED_MAX_RETRIES = 0
    settings.UNSTRUCTURED_REQUEST_TIMEOUT_MS = 10_000
    settings.UNSTRUCTURED_HEAVY_REQUEST_TIMEOUT_MS = 10_000
    yield server
    server.stop()


@pytest.mark.parametrize("detail", ["Forbidden", ECHO])
def test_bc52_a_parser_refusing_the_key_leaks_it_nowhere(
    client, space, parser, admin_client, caplog, detail
):
    caplog.set_level(logging.DEBUG)
    parser.add_fault("status", status=403, detail=detail, times=None)
    accepted = upload(client, space, "report.pdf", text_pdf([["Quarterly report"]]))
    assert accepted.status_code == 202, accepted.content
    compile_all()
    job = CompilationJob.objects.get()
    document = Document.objects.get()
    assert parser.requests and parser.requests[0].api_key == CANARY  # the key was used
    assert job.error_code == "parser_rejected", (job.run_state, job.error_code)
    assert "authentication failed (403)" in job.error_message
    assert "authentication failed (403)" in document.error_message
    seen = [job.error_message, document.error_message, everything_logged(caplog)]
    api_job = client.get(f"/v1/jobs/{job.id}")
    assert "authentication failed (403)" in api_job.json()["error_message"]
    seen.append(api_job.content.decode())
    seen.append(client.get(f"/v1/knowledge-spaces/{space.id}/documents").content.decode())
    seen.append(client.get(f"/v1/knowledge-spaces/{space.id}/jobs").content.decode())
    for name, pk in (
        ("admin:ingestion_compilationjob_change", job.pk),
        ("admin:ingestion_document_change", document.pk),
        ("admin:ingestion_compilationjob_changelist", None),
    ):
        page = admin_client.get(reverse(name, args=[pk] if pk else []))
        assert page.status_code == 200
        seen.append(page.content.decode())
    assert_clean("\n".join(seen))


# --- Dify's inner API, a compile, an answer and a capability JWT --------------------------------

EMBEDDER = {
    "plugin_id": "langgenius/openai",
    "provider": "openai",
    "model": "text-embedding-3-small",
}
REASONER = {"plugin_id": "langgenius/openai", "provider": "openai", "model": "gpt-4.1-mini"}
QUESTION = "How many days of annual leave does an employee get?"


@pytest.fixture
def dify(settings):
    from knowledgefs.testing.dify_server import DifyTestServer
    from retrieval import answers

    server = DifyTestServer(api_key=CANARY).start()
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = server.url
    settings.DIFY_INNER_API_KEY = CANARY
    settings.KNOWLEDGE_JOB_MAX_ATTEMPTS = 1  # a refusal fails the job at once
    server.dimension = 48
    answers.window._catalog_sizes.clear()
    yield server
    server.stop()


@pytest.fixture
def dify_space(dify, client, principal):
    from spaces.services import create_space

    space = create_space(principal, name="Dify runtime")
    base = f"/v1/knowledge-spaces/{space.id}"
    for which, body in (("embedding", EMBEDDER), ("retrieval", {"reasoning_model": REASONER})):
        assert client.put(f"{base}/{which}-profile", body, format="json").status_code == 200
    ready = client.post(f"{base}/profile-validation").json()
    assert ready["readiness"]["state"] == "ready", ready
    return space


def failed_compile(client, space, name: str) -> CompilationJob:
    text = f"Every employee gets 25 days of annual leave ({name})."
    accepted = upload(client, space, name, text.encode())
    assert accepted.status_code == 202, accepted.content
    compile_all()
    return CompilationJob.objects.get(id=accepted.json()["job"]["id"])


def test_bc52_dify_refusing_or_echoing_the_inner_key_leaks_it_nowhere(
    dify, dify_space, client, admin_client, caplog, settings
):
    from knowledgefs.testing import capability as cap
    from knowledgefs.testing.dify_contract import LLM, TEXT_EMBEDDING
    from retrieval.models import AnswerTrace

    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    # The connection check (the profile validation calls Dify with the key): refused, echoed.
    check = f"/v1/knowledge-spaces/{dify_space.id}/profile-validation"
    for kind, status in (("status", 403), ("echo", 403), ("echo", 200)):
        dify.add_fault(kind, status=status, times=None)
        checked = client.post(check)
        dify.clear_faults()
        assert checked.status_code < 500, checked.content
        seen.append(checked.content.decode())
        if kind == "status":
            assert "authentication failed (403)" in checked.content.decode(), checked.content
    assert client.post(check).json()["readiness"]["state"] == "ready"
    # A 403 on the embedding call: the job says why without the key.
    dify.add_fault("status", route=TEXT_EMBEDDING, status=403, times=None)
    refused = failed_compile(client, dify_space, "refused.txt")
    assert refused.error_message and "authentication failed (403)" in refused.error_message
    dify.clear_faults()
    # An error naming the credentials it was sent (as a 403 body and in the error envelope).
    jobs = [refused]
    for n, status in enumerate((403, 200)):
        dify.add_fault("echo", route=TEXT_EMBEDDING, status=status, times=None)
        jobs.append(failed_compile(client, dify_space, f"echo-{n}.txt"))
        dify.clear_faults()
    for job in jobs:
        assert job.error_code, (job.run_state, job.error_message)
        seen += [job.error_message, job.document.error_message]
        seen.append(client.get(f"/v1/jobs/{job.id}").content.decode())
        for name, pk in (
            ("admin:ingestion_compilationjob_change", job.pk),
            ("admin:ingestion_document_change", job.document.pk),
        ):
            page = admin_client.get(reverse(name, args=[pk]))
            assert page.status_code == 200
            seen.append(page.content.decode())
    # An answer whose model call echoes the credentials, asked with a capability JWT.
    settings.KNOWLEDGE_FS_CAPABILITY_V2_ENABLED = True
    settings.KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS = cap.jwks_text("current")
    assert failed_compile(client, dify_space, "leave.txt").run_state == "succeeded"
    jwt = cap.token(action="queries.answer", resource=cap.space_resource(dify_space.id))
    dify.add_fault("echo", route=LLM, status=200, times=None)
    from rest_framework.test import APIClient

    asker = APIClient(HTTP_AUTHORIZATION=f"Bearer {jwt}")
    response = asker.post(
        "/v1/queries", {"space_id": str(dify_space.id), "query": QUESTION}, format="json"
    )
    streamed = b"".join(response.streaming_content).decode()
    assert "answer.error" in streamed, streamed
    seen.append(streamed)
    trace = AnswerTrace.objects.get(id=response["X-Query-Run-Id"])
    seen.append(repr({f.name: getattr(trace, f.name) for f in trace._meta.fields}))
    page = admin_client.get(reverse("admin:retrieval_answertrace_change", args=[trace.pk]))
    assert page.status_code == 200
    seen.append(page.content.decode())
    seen.append(everything_logged(caplog))
    assert_clean("\n".join(seen), jwt, jwt.split(".")[2])


def test_bc52_kfs_api_keys_and_jwts_never_appear_in_refusals_or_logs(
    client, space, api_key, admin_client, caplog, settings
):
    from rest_framework.test import APIClient

    from knowledgefs.testing import capability as cap
    from spaces.api_keys import revoke_api_key
    from spaces.models import ApiKey

    caplog.set_level(logging.DEBUG)
    settings.KNOWLEDGE_FS_CAPABILITY_V2_ENABLED = True
    settings.KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS = cap.jwks_text("current")
    seen = []
    wrong = api_key[:-4] + ("aaaa" if not api_key.endswith("aaaa") else "bbbb")
    expired = cap.token(  # a JWT that expired an hour ago
        action="knowledge_spaces.read",
        resource=cap.space_resource(space.id),
        now=time.time() - 3600,
    )
    for credential in (wrong, expired, f"{CANARY}", f"{api_key} extra"):
        response = APIClient(HTTP_AUTHORIZATION=f"Bearer {credential}").get(
            f"/v1/knowledge-spaces/{space.id}"
        )
        assert response.status_code in (401, 403), response.content
        seen.append(response.content.decode())
    key = ApiKey.objects.get()
    revoke_api_key(key)
    revoked = client.get(f"/v1/knowledge-spaces/{space.id}")
    assert revoked.status_code == 401
    seen.append(revoked.content.decode())
    page = admin_client.get(reverse("admin:spaces_apikey_change", args=[key.pk]))
    assert page.status_code == 200
    seen.append(page.content.decode())
    seen.append(everything_logged(caplog))
    secret_part = api_key.split("_", 1)[1]
    assert_clean("\n".join(seen), api_key, wrong, secret_part, expired)


def test_bc52_sources_never_hold_or_log_credentials(
    dify, client, space, tenant, admin_client, caplog, django_capture_on_commit_callbacks
):
    """Datasource sources: a credential in a request is refused without being echoed; Dify
    refusing or echoing the inner key on the datasource route leaves it in no response, run,
    item, admin page or log line."""
    from ingestion.sources import runner
    from ingestion.sources.models import Source, SourceRun, SourceRunItem
    from knowledgefs.testing.dify_contract import DATASOURCE

    caplog.set_level(logging.DEBUG)
    dify.provider.credentials = {"cred-kfs": tenant}
    base = f"/v1/knowledge-spaces/{space.id}/sources"
    source = {
        "name": "Wiki",
        "kind": "online_document",
        "datasource": "notion",
        "provider": "langgenius/notion_datasource/notion",
        "credential_id": "cred-kfs",
    }
    seen: list[str] = []
    for bad in (
        {**source, "parameters": {"api_key": CANARY}},
        {**source, "parameters": {"auth": [{"password": CANARY}]}},
        {**source, "client_secret": CANARY},
        {**source, "credential_id": CANARY + " x"},
    ):
        refused = client.post(base, bad, format="json")
        assert refused.status_code == 400, refused.content
        seen.append(refused.content.decode())
    assert not Source.objects.exists()
    created = client.post(base, source, format="json")
    assert created.status_code == 201
    seen.append(created.content.decode())
    source_id = created.json()["id"]
    for kind, status in (("status", 403), ("echo", 403), ("echo", 200)):
        dify.add_fault(kind, route=DATASOURCE, status=status, times=None)
        tested = client.post(f"{base}/{source_id}/test")
        assert tested.status_code in (200, 403, 502), tested.content  # never a 500
        seen.append(tested.content.decode())
        with django_capture_on_commit_callbacks(execute=True):
            started = client.post(f"{base}/{source_id}/sync")
        assert started.status_code == 202, started.content
        run = SourceRun.objects.get(id=started.json()["id"])
        assert runner.run_delivery(str(run.id), run.task_id) == "failed"
        dify.clear_faults()
        run.refresh_from_db()
        assert run.error_code, run.error_message
        seen.append(client.get(f"{base}/{source_id}/runs/{run.id}").content.decode())
        seen.append(repr({f.name: getattr(run, f.name) for f in run._meta.fields}))
        for name, pk in (("admin:ingestion_sourcerun_change", run.pk),
                         ("admin:ingestion_source_change", source_id)):  # fmt: skip
            page = admin_client.get(reverse(name, args=[pk]))
            assert page.status_code == 200
            seen.append(page.content.decode())
    seen += [repr(list(SourceRunItem.objects.values())), repr(list(Source.objects.values()))]
    seen.append(everything_logged(caplog))
    assert_clean("\n".join(seen))
