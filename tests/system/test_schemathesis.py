"""Schemathesis against the served schema, in process: no operation answers a 5xx.

The schema is read from ``GET /openapi.json`` and every operation under ``/v1`` and
``/internal`` is called through the Django WSGI application (schemathesis' WSGI transport) with
a real API key of a real tenant, or the inner API key, and data generated from the schema: valid
bodies (positive) and bodies that break it (negative). Path parameters are pinned to real ids
(the space, a compiled document, its job, a golden question, an answer trace; negative cases
break them), so the operations reach their services and not only their 404s. Product routes run
before the internal ones (a cutover ledger created for the tenant closes its product routes),
and operations that destroy (DELETE, the internal space delete) run last.

Bounded: ``MAX_EXAMPLES`` per operation and mode, no deadline per example but one for the whole
run (``RUN_BUDGET_SECONDS``); a longer run against gunicorn is ``make schemathesis``
(scripts/schemathesis_run.py, docs/testing.md).
"""

from __future__ import annotations

import time
import uuid
from copy import deepcopy

import hypothesis
import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from hypothesis import HealthCheck, Phase
from rest_framework.test import APIClient
from schemathesis.generation import GenerationMode

from knowledgefs.testing.fixtures import compile_all, upload

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(290)]

MAX_EXAMPLES = 5
RUN_BUDGET_SECONDS = 170
INNER_KEY = "inner-key-for-schemathesis-0123456789"
MISSING = str(uuid.UUID(int=0))


@pytest.fixture
def world(settings, tenant, principal):
    """A tenant with a ready space, one compiled document, a golden question and an answer
    trace; returns the headers and the path-parameter values to draw from."""
    from spaces.api_keys import create_api_key
    from spaces.services import create_space

    settings.DIFY_INNER_API_KEY = INNER_KEY
    space = create_space(principal, name="Fuzzed space")
    secret = create_api_key(tenant)[1]
    api = APIClient(HTTP_AUTHORIZATION=f"Bearer {secret}")
    text = b"Photosynthesis turns light into chemical energy in the chloroplasts of plants.\n"
    admitted = upload(api, space, "plants.txt", text)
    assert admitted.status_code == 202, admitted.content
    compile_all()
    document = admitted.json()["document"]["id"]
    job = admitted.json()["job"]["id"]
    question = api.post(
        f"/v1/knowledge-spaces/{space.id}/golden-questions",
        {
            "question": "What turns light into chemical energy?",
            "expected_evidence": [{"document_id": document, "text": "chloroplasts"}],
        },
        format="json",
    )
    assert question.status_code == 201, question.content
    answer = api.post(
        "/v1/queries",
        {"space_id": str(space.id), "query": "What do chloroplasts do?"},
        format="json",
    )
    trace = answer.headers.get("X-Query-Run-Id", MISSING)
    if answer.streaming:  # read the stream to its end: the trace is then complete
        b"".join(answer.streaming_content)
    ids = {
        "space_id": [str(space.id)],
        "document_id": [document],
        "job_id": [job],
        "trace_id": [trace],
        "question_id": [question.json()["id"]],
        "namespace_id": [tenant],
    }
    return {"api_key": secret, "ids": ids}


def pinned(schema: dict, ids: dict[str, list[str]]) -> dict:
    """The schema with every path parameter and body ``space_id`` pinned to a real id (or,
    where there is none, an id that does not exist): valid cases reach the services, and
    negative generation still draws other strings for them."""
    schema = deepcopy(schema)
    for item in schema["paths"].values():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path":
                    values = ids.get(parameter["name"]) or [MISSING]
                    parameter["schema"] = {"type": "string", "enum": values}
            content = operation.get("requestBody", {}).get("content", {})
            members = content.get("application/json", {}).get("schema", {}).get("properties", {})
            if "space_id" in members:  # POST /v1/queries, research tasks: the space in the body
                members["space_id"] = {"type": "string", "enum": ids["space_id"]}
    return schema


def destroys(operation) -> bool:
    return operation.method.upper() == "DELETE" or operation.path.endswith("/delete")


def test_no_operation_answers_a_server_error(world):
    document = APIClient().get("/openapi.json")
    assert document.status_code == 200
    schema = schemathesis.openapi.from_dict(pinned(document.json(), world["ids"]))
    schema.app = WSGIHandler()
    operations = sorted(
        (result.ok() for result in schema.get_all_operations()),
        # deeper resources are destroyed before the space that holds them
        key=lambda op: (
            op.path.startswith("/internal/"),
            destroys(op),
            -op.path.count("/") if destroys(op) else 0,
            op.path,
            op.method,
        ),
    )
    assert len(operations) >= 40
    failures: list[str] = []
    calls: dict = {"count": 0, "succeeded": set()}
    deadline = time.monotonic() + RUN_BUDGET_SECONDS

    def headers_for(operation) -> dict[str, str]:
        if operation.path.startswith("/internal/"):
            return {"X-Inner-Api-Key": INNER_KEY}
        return {"Authorization": f"Bearer {world['api_key']}"}

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            if time.monotonic() > deadline:
                pytest.fail(f"the run took over {RUN_BUDGET_SECONDS} s ({calls['count']} calls)")
            fuzz(operation, mode, headers_for(operation), calls, failures)
    assert calls["count"] >= len(operations), calls
    # The run reached the services, not only the refusals: most operations answered a 2xx.
    assert len(calls["succeeded"]) >= 25, sorted(calls["succeeded"])
    assert not failures, "\n".join(failures[:20])


def fuzz(operation, mode, credentials: dict, calls: dict, failures: list[str]) -> None:
    """Call ``operation`` with up to ``MAX_EXAMPLES`` generated cases of ``mode``; every 5xx is
    appended to ``failures`` with what reproduces it."""

    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    @hypothesis.settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def call(case):
        response = case.call(headers={**(case.headers or {}), **credentials})
        calls["count"] += 1
        if response.status_code < 300:
            calls["succeeded"].add(f"{case.method} {operation.path}")
        if response.status_code >= 500:
            failures.append(
                f"{case.method} {case.formatted_path} -> {response.status_code}: "
                f"query={case.query!r} headers={case.headers!r} body={case.body!r}: "
                f"{response.text[:300]}"
            )

    call()
