"""``/mcp`` in this process (JSON-RPC posts through the Django test client): capability tokens
of caller kind ``mcp`` reach exactly the tool of their action and the space of their resource,
other caller kinds and the inner key are refused, and each tool call passes its operation's
rate limit."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from ingestion.documents import admit_document
from knowledgefs.testing import capability as cap
from knowledgefs.testing.fixtures import compile_all
from spaces.services import Principal, create_space

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def compiled(space, settings):
    settings.KNOWLEDGE_FS_CAPABILITY_V2_ENABLED = True
    settings.KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS = cap.jwks_text("current")
    admit_document(space, filename="a.txt", data=b"alpha zebra\n", enqueue=False)
    compile_all()
    return space


def rpc(token: str, name: str, arguments: dict):
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }
    response = Client().post(
        "/mcp",
        json.dumps(body),
        content_type="application/json",
        HTTP_ACCEPT="application/json, text/event-stream",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    return response


def result(response) -> dict:
    assert response.status_code == 200, response.content
    return json.loads(response.content)["result"]


def test_a_capability_token_reaches_only_its_action_and_space(compiled):
    other = create_space(Principal(tenant_id="tenant-a"), name="Other")
    args = {"knowledgeSpaceId": str(compiled.id), "path": "/knowledge/docs", "limit": 5}

    def token(action="knowledge_fs.ls", space=compiled, kind="mcp"):
        resource = cap.space_resource(space.id)
        return cap.token(action=action, resource=resource, caller_kind=kind)

    ok = result(rpc(token(), "knowledge.fs.ls", args))
    assert ok["isError"] is False and len(ok["structuredContent"]["items"]) == 1
    grep = result(rpc(token(), "knowledge.fs.grep", {**args, "q": "zebra"}))
    assert grep["isError"] and grep["structuredContent"]["code"] == "action_not_permitted"
    elsewhere = result(rpc(token(space=other), "knowledge.fs.ls", args))
    assert elsewhere["structuredContent"]["code"] == "resource_not_permitted"
    search = result(
        rpc(token("queries.create"), "knowledge.search", {**args_of(compiled), "query": "zebra"})
    )
    assert search["isError"] is False and search["structuredContent"]["items"]
    service = rpc(token(kind="service"), "knowledge.fs.ls", args)
    assert service.status_code == 403
    assert json.loads(service.content)["code"] == "caller_kind_not_permitted"
    anonymous = Client().post("/mcp", "{}", content_type="application/json")
    assert anonymous.status_code == 401


def args_of(space) -> dict:
    return {"knowledgeSpaceId": str(space.id)}


def test_tool_calls_pass_the_operation_rate_limit(compiled, settings, api_key):
    from django.core.cache import cache

    cache.clear()
    settings.KNOWLEDGE_RATE_LIMITS = {"default": "1200/minute", "knowledge_fs.stat": "2/minute"}
    args = {"knowledgeSpaceId": str(compiled.id), "path": "/knowledge"}
    codes = [
        result(rpc(api_key, "knowledge.fs.stat", args))["structuredContent"].get("code")
        for _ in range(3)
    ]
    assert codes == [None, None, "rate_limited"]
    # another operation keeps its own bucket
    listed = result(rpc(api_key, "knowledge.fs.ls", {**args, "limit": 5}))
    assert listed["isError"] is False
