"""The Dify boundary wired in: runtime selection, forbidden credentials, operator settings,
``/health`` and ``/ready``.

Start-up refusals run ``manage.py check`` in a subprocess (settings refuse before Django is set
up, so gunicorn, ``qcluster`` and ``manage.py`` all stop the same way). Readiness and the upload
path run against the local Dify contract server (knowledgefs/testing/dify_server.py), the only
simulated part; its faults (stopped, 5xx, slow, key refused) are real HTTP behaviour.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.files.storage import storages
from rest_framework.test import APIClient

from knowledgefs import boundary, health
from knowledgefs.dify.object_storage import DifyObjectStorage
from knowledgefs.runtime import selection
from knowledgefs.testing import capability as cap
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import (
    MODEL_CATALOG,
    OBJECT,
    STORAGE_HEALTH,
    TEST_INNER_KEY,
    checksum,
)
from knowledgefs.testing.fixtures import compile_all, upload

pytestmark = pytest.mark.timeout(120)

dify_server = dify_fixtures.dify_server

ROOT = Path(__file__).resolve().parents[2]
#: /ready must answer within its own bound plus this margin for a busy 2-core machine.
READY_BOUND = health.READY_WAIT_SECONDS + 0.5

#: Variables that shape the runtime; removed from the subprocess environment so the developer's
#: or CI's own settings cannot decide a test.
OURS = (
    "KNOWLEDGE_MODEL_RUNTIME",
    "DIFY_INNER_API_URL",
    "DIFY_INNER_API_KEY",
    "DATABASE_URL",
    "DIFY_MODEL_RUNTIME_TIMEOUT_MS",
    "DIFY_MODEL_RUNTIME_MAX_RESPONSE_BYTES",
    "KNOWLEDGE_EMBEDDING_REQUEST_CONCURRENCY",
    "DIFY_OBJECT_STORAGE_REQUEST_TIMEOUT_MS",
)


def manage_check(tmp_path, **variables: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in OURS}
    env.update(KNOWLEDGE_VAR_DIR=str(tmp_path / "var"), **variables)
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


# --- forbidden credentials ---------------------------------------------------------------------

SECRET = "value-that-must-never-be-printed-7f3a"

#: One start-up per family: the variable is named, its family too, and its value never.
FAMILIES = {
    "OPENAI_API_KEY": "model-provider or service API key",
    "MINIO_ROOT_PASSWORD": "object-storage credential",
    "AWS_SECRET_ACCESS_KEY": "object-storage credential",
    "PLUGIN_DAEMON_KEY": "plugin daemon credential",
    "NOTION_INTEGRATION_TOKEN": "datasource token or OAuth secret",
    "GOOGLE_OAUTH_CLIENT_SECRET": "datasource token or OAuth secret",
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_start_up_refuses_a_credential_dify_owns(tmp_path, name):
    run = manage_check(tmp_path, **{name: SECRET})
    assert run.returncode != 0
    assert "ImproperlyConfigured" in run.stderr
    assert f"{name} ({FAMILIES[name]}" in run.stderr
    assert SECRET not in run.stderr + run.stdout


def test_every_forbidden_variable_is_named_at_once(tmp_path):
    run = manage_check(tmp_path, ANTHROPIC_API_KEY=SECRET, S3_SECRET_KEY=SECRET)
    assert run.returncode != 0
    assert "ANTHROPIC_API_KEY (" in run.stderr and "S3_SECRET_KEY (" in run.stderr
    assert SECRET not in run.stderr


def test_our_own_names_and_harmless_neighbours_start(tmp_path):
    run = manage_check(
        tmp_path,
        DIFY_INNER_API_KEY="k" * 32,  # ours: Dify's INNER_API_KEY_FOR_PLUGIN
        UNSTRUCTURED_API_KEY=SECRET,  # ours: the parser's key in the operator table
        AWS_REGION="eu-west-1",  # not a credential
        AWS_CA_BUNDLE="/etc/ssl/certs/ca-certificates.crt",
        OPENAI_API_KEY="",  # empty: holds nothing (Compose's ${X:-})
        SECRET_KEY="django-secret-key-of-this-deployment",
    )
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("OPENAI_API_KEY", 0),
        ("ANTHROPIC_API_KEY", 0),
        ("AZURE_OPENAI_API_KEY", 0),
        ("AZURE_OPENAI_KEY", 0),
        ("COHERE_API_KEY", 0),
        ("GOOGLE_API_KEY", 0),
        ("JINA_API_KEY", 0),
        ("VOYAGE_API_KEY", 0),
        ("REPLICATE_API_TOKEN", 0),
        ("HF_TOKEN", 0),
        ("openai_api_key", 0),
        ("OPENAI_KEY", 0),
        ("ANTHROPIC_KEY", 0),
        ("GOOGLE_API_CREDENTIALS", 0),
        ("OPENAI_API_KEY_FILE", 0),
        ("GEMINI_KEY", 0),
        ("CLICKZETTA_PASSWORD", 1),
        ("MINIO_ACCESS_KEY", 1),
        ("S3_BUCKET_NAME", 1),
        ("AWS_ACCESS_KEY_ID", 1),
        ("AWS_SESSION_TOKEN", 1),
        ("AZURE_STORAGE_CONNECTION_STRING", 1),
        ("AZURE_BLOB_ACCOUNT_KEY", 1),
        ("GOOGLE_APPLICATION_CREDENTIALS", 1),
        ("GOOGLE_STORAGE_SERVICE_ACCOUNT_JSON_BASE64", 1),
        ("ALIYUN_OSS_SECRET_KEY", 1),
        ("TENCENT_COS_SECRET_KEY", 1),
        ("OCI_SECRET_KEY", 1),
        ("PLUGIN_DAEMON_URL", 2),
        ("NOTION_CLIENT_SECRET", 3),
        ("GITHUB_CLIENT_SECRET", 3),
        ("DROPBOX_ACCESS_TOKEN", 3),
        ("GOOGLE_DRIVE_REFRESH_TOKEN", 3),
        ("FIRECRAWL_API_URL", 3),
    ],
)
def test_the_rule_puts_each_name_in_its_family(name, family):
    found = boundary.forbidden_credentials({name: "x"})
    assert found == [(name, boundary.FORBIDDEN_CREDENTIALS[family])]


@pytest.mark.parametrize(
    "name",
    [
        "DIFY_INNER_API_KEY",
        "UNSTRUCTURED_API_KEY",
        "SECRET_KEY",
        "AWS_REGION",
        "AWS_CA_BUNDLE",
        "GITHUB_TOKEN",  # CI tokens are not ours to refuse and are not provider keys
        "ACTIONS_ID_TOKEN_REQUEST_TOKEN",
        "CI_JOB_TOKEN",
        "KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS",
        "REDIS_URL",
        "DATABASE_URL",
    ],
)
def test_the_rule_leaves_other_names_alone(name):
    assert boundary.forbidden_credentials({name: "x"}) == []


def test_this_environment_trips_nothing():
    """CI and dev shells run the suite: the settings this process started with passed the rule."""
    assert boundary.forbidden_credentials(os.environ) == []


# --- runtime selection and operator settings ---------------------------------------------------


@pytest.mark.parametrize(
    ("variables", "missing"),
    [
        ({}, "DIFY_INNER_API_URL and DIFY_INNER_API_KEY"),
        ({"DIFY_INNER_API_URL": "http://api:5001"}, "DIFY_INNER_API_KEY"),
        ({"DIFY_INNER_API_KEY": TEST_INNER_KEY}, "DIFY_INNER_API_URL"),
        ({"DIFY_INNER_API_URL": " ", "DIFY_INNER_API_KEY": TEST_INNER_KEY}, "DIFY_INNER_API_URL"),
    ],
)
def test_dify_runtime_refuses_to_start_without_the_inner_api(tmp_path, variables, missing):
    run = manage_check(tmp_path, KNOWLEDGE_MODEL_RUNTIME="dify", **variables)
    assert run.returncode != 0
    assert f"KNOWLEDGE_MODEL_RUNTIME=dify needs {missing}:" in run.stderr
    assert TEST_INNER_KEY not in run.stderr


def test_an_unknown_runtime_is_refused_naming_the_accepted_values(tmp_path):
    run = manage_check(tmp_path, KNOWLEDGE_MODEL_RUNTIME="openai")
    assert run.returncode != 0
    assert "KNOWLEDGE_MODEL_RUNTIME='openai' is not supported; accepted values: local, dify" in (
        run.stderr
    )


def test_the_dify_runtime_starts_with_dify_storage(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            "from django.core.files.storage import storages; "
            "print(type(storages['objects']).__name__)",
        ],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if k not in OURS},
            "KNOWLEDGE_VAR_DIR": str(tmp_path / "var"),
            "KNOWLEDGE_MODEL_RUNTIME": "dify",
            "DIFY_INNER_API_URL": "http://api:5001/",
            "DIFY_INNER_API_KEY": TEST_INNER_KEY,
        },
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "DifyObjectStorage"


#: The Dify block's numeric settings: (low, high).
DIFY_RANGES = {
    "DIFY_MODEL_RUNTIME_TIMEOUT_MS": (100, 600000),
    "DIFY_MODEL_RUNTIME_MAX_RESPONSE_BYTES": (1024, 268435456),
    "KNOWLEDGE_EMBEDDING_REQUEST_CONCURRENCY": (1, 8),
    "DIFY_OBJECT_STORAGE_REQUEST_TIMEOUT_MS": (100, 3600000),
}


@pytest.mark.parametrize("name", list(DIFY_RANGES))
def test_dify_settings_out_of_range_stop_start_up(tmp_path, name):
    low, high = DIFY_RANGES[name]
    for value in (low - 1, high + 1):
        run = manage_check(tmp_path, **{name: str(value)})
        assert run.returncode != 0
        assert f"{name}={value} is outside the accepted range {low}..{high}" in run.stderr
    run = manage_check(tmp_path, **{name: "12abc"})
    assert f"{name}='12abc' is not a whole number; accepted range {low}..{high}" in run.stderr


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://kfs:hunter2pw@db", "is not accepted: a PostgreSQL URL"),
        ("oracle://kfs:hunter2pw@db/kfs", "is not accepted: a PostgreSQL URL"),
        ("postgres://kfs:hunter2pw@db", "is not accepted: a PostgreSQL URL"),
        ("postgres://kfs:hunter2pw@db:port/kfs", "is not a database URL"),
        ("sqlite:////tmp/x.sqlite3", "is not accepted: a PostgreSQL URL"),
    ],
)
def test_database_url_must_be_postgres_or_mysql_and_is_never_echoed_with_its_password(
    tmp_path, url, message
):
    run = manage_check(tmp_path, DATABASE_URL=url)
    assert run.returncode != 0
    assert "DATABASE_URL=" in run.stderr and message in run.stderr
    assert "hunter2pw" not in run.stderr


# --- accessors -----------------------------------------------------------------------------------


def dify_settings(settings, server_url: str, key: str = TEST_INNER_KEY) -> None:
    """What ``KNOWLEDGE_MODEL_RUNTIME=dify`` sets at start-up, through the same selection code."""
    settings.KNOWLEDGE_MODEL_RUNTIME = "dify"
    settings.DIFY_INNER_API_URL = server_url
    settings.DIFY_INNER_API_KEY = key
    settings.STORAGES = {
        **settings.STORAGES,
        "objects": boundary.objects_storage("dify", str(settings.OBJECT_STORAGE_DIR)),
    }


def test_local_runtime_has_no_dify_clients(settings):
    assert selection.runtime_name() == "local" and not selection.uses_dify()
    for accessor, capability in (
        (selection.model_runtime, "model_runtime"),
        (selection.datasources, "datasources"),
    ):
        with pytest.raises(selection.CapabilityUnavailable) as caught:
            accessor()
        assert caught.value.code == "capability_unavailable" and caught.value.status == 503
        assert caught.value.details == {"capability": capability, "runtime": "local"}


def test_dify_clients_are_shared_per_process_and_configuration(settings, dify_server):
    dify_settings(settings, dify_server.url)
    runtime = selection.model_runtime()
    assert runtime is selection.model_runtime()
    assert runtime.transport.base_url == dify_server.url
    assert selection.datasources() is selection.datasources()
    assert isinstance(storages["objects"], DifyObjectStorage)
    settings.DIFY_MODEL_RUNTIME_TIMEOUT_MS = 1234
    assert selection.model_runtime() is not runtime
    assert selection.model_runtime().timeout_ms == 1234


# --- readiness on the embedded default -----------------------------------------------------------


@pytest.fixture(autouse=True)
def fresh_probes():
    health.reset()
    yield
    health.reset()


def test_both_probes_answer_200_on_the_embedded_default(db):
    ready = APIClient().get("/ready")
    assert ready.status_code == 200, ready.json()
    body = ready.json()
    assert body["status"] == "ready" and body["failing"] == [] and body["runtime"] == "local"
    checks = body["checks"]
    assert list(checks) == list(health.COMPONENTS)
    assert checks["model_runtime"]["detail"] == (
        "local ONNX embedding and reranker model files installed and verified"
    )
    assert checks["datasource_runtime"]["state"] == "disabled"
    assert checks["object_storage"]["detail"].startswith("FileSystemStorage: wrote")
    assert checks["database"]["detail"].endswith("no unapplied migrations")
    live = APIClient().get("/health")
    assert live.status_code == 200
    assert live.json()["status"] == "ok"
    assert all(c["ok"] for c in live.json()["components"].values())


def test_the_local_storage_probe_leaves_nothing_behind(db, object_storage):
    assert APIClient().get("/ready").status_code == 200
    assert not [p for p in object_storage.rglob("*") if p.is_file()]


def test_unapplied_migrations_make_the_service_not_ready(db, settings):
    settings.MIGRATION_MODULES = {"upgrades": "knowledgefs.testing.pending_migrations"}
    ready = APIClient().get("/ready")
    assert ready.status_code == 503
    assert ready.json()["failing"] == ["database"]
    assert "1 unapplied migrations" in ready.json()["checks"]["database"]["detail"]
    assert APIClient().get("/health").status_code == 200


def test_an_unwritable_local_storage_is_not_ready(db, settings, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the storage folder should be")
    settings.STORAGES = {
        **settings.STORAGES,
        "objects": boundary.objects_storage("local", str(blocked)),
    }
    ready = APIClient().get("/ready")
    assert ready.status_code == 503 and ready.json()["failing"] == ["object_storage"]


def test_capability_verifier_needs_its_key_set(db, settings):
    settings.KNOWLEDGE_FS_CAPABILITY_V2_ENABLED = True
    settings.KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS = cap.jwks_text("current", "previous")
    ready = APIClient().get("/ready")
    assert ready.status_code == 200
    assert "capability v2 tokens with 2 public key(s)" in ready.json()["checks"]["auth"]["detail"]
    # A set that start-up would have refused (it can only arrive by changing settings live).
    settings.KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS = '{"keys": []}'
    ready = APIClient().get("/ready")
    assert ready.status_code == 503 and ready.json()["failing"] == ["auth"]
    assert "KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS" in ready.json()["checks"]["auth"]["detail"]


# --- readiness on the Dify runtime ---------------------------------------------------------------


def timed_ready() -> tuple[float, object]:
    started = time.monotonic()
    response = APIClient().get("/ready")
    return time.monotonic() - started, response


def test_ready_on_dify_checks_the_catalog_and_dify_storage(db, settings, dify_server):
    dify_settings(settings, dify_server.url)
    took, ready = timed_ready()
    assert ready.status_code == 200, ready.json()
    checks = ready.json()["checks"]
    assert ready.json()["runtime"] == "dify"
    assert checks["model_runtime"]["detail"] == "Dify model catalog answered"
    assert checks["object_storage"]["detail"] == "Dify storage answered ok"
    assert checks["datasource_runtime"]["state"] == "not_probed"
    assert checks["datasource_runtime"]["ok"] is True
    catalog = dify_server.calls(MODEL_CATALOG)
    assert len(catalog) == 1 and catalog[0].key_ok
    assert catalog[0].body["tenant_id"] == health.PROBE_TENANT_ID
    assert catalog[0].body["limit"] == 1
    assert dify_server.count(STORAGE_HEALTH) == 1
    # Nothing went to the local object folder or to Dify's objects: the Dify probe is a GET.
    assert dify_server.objects == {}

    # A second probe within CACHE_SECONDS reuses the results: no new call to Dify.
    assert APIClient().get("/ready").status_code == 200
    assert dify_server.count(MODEL_CATALOG) == 1 and dify_server.count(STORAGE_HEALTH) == 1
    # ... and /health never calls anything while they are fresh.
    assert APIClient().get("/health").json()["components"]["model_runtime"]["ok"] is True
    assert dify_server.count(MODEL_CATALOG) == 1


def test_an_error_envelope_for_the_probe_tenant_still_proves_the_route(db, settings, dify_server):
    dify_settings(settings, dify_server.url)
    dify_server.add_fault("envelope", MODEL_CATALOG, message="tenant not found")
    ready = APIClient().get("/ready")
    assert ready.status_code == 200
    assert "error for the probe tenant" in ready.json()["checks"]["model_runtime"]["detail"]


def assert_not_ready(response, *components: str) -> dict:
    assert response.status_code == 503, response.json()
    body = response.json()
    assert body["status"] == "not_ready"
    assert set(components) <= set(body["failing"])
    text = response.content.decode()
    assert TEST_INNER_KEY not in text
    return body["checks"]


def test_dify_stopped_means_not_ready_but_alive(db, settings, dify_server):
    dify_settings(settings, dify_server.url)
    assert APIClient().get("/ready").status_code == 200
    dify_server.stop()
    health.clear_cache()
    took, ready = timed_ready()
    checks = assert_not_ready(ready, "model_runtime", "object_storage")
    assert took < READY_BOUND
    assert checks["model_runtime"]["detail"].startswith("MODEL_RUNTIME_UNAVAILABLE")
    assert checks["object_storage"]["detail"].startswith("STORAGE_UNAVAILABLE")
    assert checks["database"]["ok"] and checks["auth"]["ok"]
    live = APIClient().get("/health")
    assert live.status_code == 200
    assert live.json()["components"]["model_runtime"]["ok"] is False


def test_dify_answering_5xx_means_not_ready(caplog, db, settings, dify_server):
    caplog.set_level(logging.INFO)
    dify_settings(settings, dify_server.url)
    dify_server.add_fault("status", MODEL_CATALOG, times=None, status=502)
    dify_server.add_fault("status", STORAGE_HEALTH, times=None, status=503)
    took, ready = timed_ready()
    checks = assert_not_ready(ready, "model_runtime", "object_storage")
    assert took < READY_BOUND
    assert checks["model_runtime"]["detail"] == "MODEL_RUNTIME_UNAVAILABLE (502)"
    assert checks["object_storage"]["detail"] == "STORAGE_UNAVAILABLE (503)"
    assert APIClient().get("/health").status_code == 200
    # One WARNING names the reasons; repeated failing probes add nothing, and django.request
    # does not log each 503 as an ERROR.
    health.clear_cache()
    assert APIClient().get("/ready").status_code == 503
    warnings = [r for r in caplog.records if r.name == "knowledgefs.health"]
    assert [r.levelname for r in warnings] == ["WARNING"]
    assert "model_runtime: MODEL_RUNTIME_UNAVAILABLE (502)" in warnings[0].getMessage()
    assert not [r for r in caplog.records if r.name == "django.request"]
    dify_server.clear_faults()
    health.clear_cache()
    assert APIClient().get("/ready").status_code == 200
    assert [r.getMessage() for r in caplog.records if r.name == "knowledgefs.health"][-1] == "ready"


def test_a_hanging_dify_cannot_hold_ready_past_its_bound(db, settings, dify_server):
    dify_settings(settings, dify_server.url)
    dify_server.delay(30, route=MODEL_CATALOG, times=None)
    dify_server.delay(30, route=STORAGE_HEALTH, times=None)
    took, ready = timed_ready()
    checks = assert_not_ready(ready, "model_runtime", "object_storage")
    assert took < READY_BOUND, took
    assert checks["model_runtime"]["detail"] == "MODEL_RUNTIME_TIMEOUT"
    assert checks["object_storage"]["detail"] == "STORAGE_TIMEOUT"
    started = time.monotonic()
    assert APIClient().get("/health").status_code == 200
    assert time.monotonic() - started < 0.5


def test_a_refused_inner_key_is_named_without_the_key(db, settings, dify_server):
    dify_settings(settings, dify_server.url, key="another-inner-key-0123456789")
    checks = assert_not_ready(APIClient().get("/ready"), "model_runtime", "object_storage")
    assert "refused the inner key" in checks["model_runtime"]["detail"]
    assert "another-inner-key" not in str(checks)


def test_dify_runtime_with_a_local_storage_is_not_ready(db, settings, dify_server):
    dify_settings(settings, dify_server.url)
    settings.STORAGES = {
        **settings.STORAGES,
        "objects": boundary.objects_storage("local", str(settings.OBJECT_STORAGE_DIR)),
    }
    checks = assert_not_ready(APIClient().get("/ready"), "object_storage")
    assert "STORAGES['objects'] is FileSystemStorage" in checks["object_storage"]["detail"]


# --- documents on the Dify runtime ---------------------------------------------------------------

SENTENCE = "The zebra-striped quokka audits seventeen lighthouses every solstice."


def local_files(*roots: Path) -> list[Path]:
    return [p for root in roots if root.exists() for p in root.rglob("*") if p.is_file()]


def test_an_upload_on_dify_stores_its_bytes_in_dify_storage(
    settings, dify_server, client, space, object_storage
):
    dify_settings(settings, dify_server.url)
    # var/objects may hold files of earlier runs (make demo): only new files would be ours.
    before = set(local_files(object_storage, Path(settings.OBJECT_STORAGE_DIR)))
    data = f"# Field notes\n\n{SENTENCE}\n".encode()
    response = upload(client, space, "notes.md", data)
    assert response.status_code == 202, response.json()
    document_id = response.json()["document"]["id"]

    puts = [r for r in dify_server.calls(OBJECT) if r.method == "PUT"]
    assert len(puts) == 1 and puts[0].key_ok
    key = puts[0].query["key"]
    assert key.endswith(f"/documents/{document_id}/source") and key.startswith("tenants/")
    sent = {name.lower(): value for name, value in puts[0].headers.items()}
    assert sent["x-knowledge-fs-checksum-sha256"] == checksum(data)
    assert checksum(data) == base64.b64encode(hashlib.sha256(data).digest()).decode()
    assert dify_server.objects[key].data == data
    assert set(local_files(object_storage, Path(settings.OBJECT_STORAGE_DIR))) == before

    # The compiler reads the source back through Dify (a checksum-verified GET).
    assert compile_all() >= 1
    gets = [r for r in dify_server.calls(OBJECT) if r.method == "GET"]
    assert gets and gets[-1].query["key"] == key
    document = client.get(f"/v1/knowledge-spaces/{space.id}/documents/{document_id}").json()
    assert document["state"] == "published", document
    assert set(local_files(object_storage, Path(settings.OBJECT_STORAGE_DIR))) == before


def test_no_key_token_or_document_text_reaches_any_log_record(
    caplog, settings, dify_server, client, api_key, space
):
    for name in ("", "knowledgefs", "knowledgefs.dify", "urllib3", "django", "ingestion"):
        caplog.set_level(logging.DEBUG, logger=name)
    dify_settings(settings, dify_server.url)
    settings.KNOWLEDGE_FS_CAPABILITY_V2_ENABLED = True
    settings.KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS = cap.jwks_text("current")
    dify_server.fail_next(1, status=503, route=OBJECT)  # a retried PUT logs a retry line too

    data = f"# Field notes\n\n{SENTENCE}\n\nA second paragraph about the quokka census.\n"
    assert upload(client, space, "notes.md", data.encode()).status_code == 202
    assert compile_all() >= 1
    token = cap.sign(cap.claims(action="queries.create", resource=cap.space_resource(space.id)))
    query = "which marsupial audits lighthouses at the solstice"
    for caller in (client, APIClient()):
        if caller is not client:
            caller.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        answer = caller.post(
            f"/v1/knowledge-spaces/{space.id}/retrieval-tests",
            {"query": query, "top_k": 3},
            format="json",
        )
        assert answer.status_code == 200, answer.json()
        assert SENTENCE in str(answer.json())  # the answer carries it; the logs must not
    assert APIClient().get("/ready").status_code == 200

    records = caplog.records
    assert any(r.name == "knowledgefs.dify" and OBJECT in r.getMessage() for r in records)
    assert any("retry" in r.getMessage() for r in records)
    forbidden = [TEST_INNER_KEY, api_key, token, SENTENCE, "quokka", "marsupial", query]
    for record in records:
        text = " ".join(
            [record.getMessage(), record.exc_text or "", repr(record.args), repr(record.__dict__)]
        )
        for secret in forbidden:
            assert secret not in text, (record.name, record.levelname, secret[:12])
