"""``/evidence`` of the knowledge filesystem: the answer traces of a space, read with ls, tree,
cat, stat and find over HTTP and MCP, visible exactly as ``GET /v1/queries/{id}`` shows them
(the tenant, the caller's spaces, a capability token's own subject)."""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest
from django.test import Client
from rest_framework.test import APIClient

from ingestion.documents import admit_document
from knowledgefs.testing import capability as cap
from knowledgefs.testing.fixtures import compile_all
from retrieval.models import AnswerTrace
from spaces.api_keys import create_api_key
from spaces.services import Principal, create_space

LEAVE = (
    "# Leave\n\nEvery employee gets 25 days of annual leave per year. Unused leave days expire "
    "at the end of March."
)
EXPENSES = "# Expenses\n\nSubmit travel receipts within thirty days of the trip."
QUESTION = "How many days of annual leave does an employee get?"


@pytest.fixture
def corpus(space):
    for name, text in (("leave.md", LEAVE), ("expenses.md", EXPENSES)):
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    return space


@pytest.fixture
def tokens(settings):
    settings.KNOWLEDGE_FS_CAPABILITY_V2_ENABLED = True
    settings.KNOWLEDGE_FS_CAPABILITY_V2_PUBLIC_JWKS = cap.jwks_text("current")


def bearer(token: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return api


def ask(api: APIClient, space, query: str = QUESTION) -> str:
    response = api.post(
        "/v1/queries", {"space_id": str(space.id), "query": query, "mode": "fast"}, format="json"
    )
    assert response.status_code == 200, response.content
    b"".join(response.streaming_content)
    return response["X-Query-Run-Id"]


def fs(api, space, op, **params):
    return api.get(f"/v1/knowledge-spaces/{space.id}/fs/{op}", params)


def fs_token(space, sub: str, action: str = "knowledge_fs.ls", kind: str = "service") -> str:
    return cap.token(
        action=action, resource=cap.space_resource(space.id), sub=sub, actor=sub,
        caller_kind=kind,
    )  # fmt: skip


@pytest.mark.django_db
def test_a_fast_answer_trace_is_listed_and_its_items_read(client, corpus):
    run_id = ask(client, corpus)
    trace = AnswerTrace.objects.get(id=run_id)
    assert trace.mode == "fast" and trace.evidence_node_ids
    listed = fs(client, corpus, "ls", path="/evidence", limit=10).json()
    assert [i["name"] for i in listed["items"]] == [run_id]
    assert listed["items"][0]["resourceType"] == "trace"
    assert listed["items"][0]["metadata"]["mode"] == "fast"
    assert listed["truncated"] is False
    base = f"/evidence/{run_id}"
    names = [i["name"] for i in fs(client, corpus, "ls", path=base, limit=10).json()["items"]]
    assert names == ["items", "query.json"]

    query = fs(client, corpus, "cat", path=f"{base}/query.json").json()
    assert query["contentType"] == "application/json"
    body = json.loads(query["text"])
    assert body["traceId"] == run_id and body["mode"] == "fast"
    assert body["query"] == {
        "sha256": hashlib.sha256(QUESTION.encode()).hexdigest(), "chars": len(QUESTION)
    }  # fmt: skip
    assert body["createdAt"] == trace.created_at.isoformat()

    items = fs(client, corpus, "ls", path=f"{base}/items", limit=100).json()["items"]
    assert [i["name"] for i in items] == [
        f"{n:03d}" for n in range(1, len(trace.evidence_node_ids) + 1)
    ]
    for rank, node_id in enumerate(trace.evidence_node_ids, 1):
        item = json.loads(fs(client, corpus, "cat", path=f"{base}/items/{rank:03d}").json()["text"])
        opened = fs(client, corpus, "open_node", nodeId=node_id).json()
        assert item["rank"] == rank and item["nodeId"] == node_id
        assert item["citation"] == opened["citation"]  # exactly as retrieval gives it
        assert item["path"] == opened["node"]["path"]
        assert item["path"].startswith("/knowledge/docs/")
        section = fs(client, corpus, "cat", path=item["path"])
        assert section.status_code == 200 and item["text"] in section.json()["text"]

    stat = fs(client, corpus, "stat", path=f"{base}/items/001").json()
    assert stat["kind"] == "file" and stat["resourceType"] == "evidence_item"
    assert stat["targetId"] == trace.evidence_node_ids[0] and len(stat["sha256"]) == 64
    tree = fs(client, corpus, "tree", path="/evidence", limit=100, depth=3).json()
    assert f"{base}/items/001" in [i["path"] for i in tree["items"]]
    found = fs(client, corpus, "find", path="/", limit=100, resourceType="evidence_item").json()
    assert [i["path"] for i in found["items"]] == [f"{base}/items/{i['name']}" for i in items]
    root = [i["name"] for i in fs(client, corpus, "ls", path="/", limit=10).json()["items"]]
    assert "evidence" in root and "knowledge" in root


@pytest.mark.django_db
def test_ls_evidence_pages_newest_first_with_a_signed_cursor(client, corpus):
    first, second, third = (ask(client, corpus, q) for q in ("leave days", "receipts", QUESTION))
    page = fs(client, corpus, "ls", path="/evidence", limit=2).json()
    assert [i["name"] for i in page["items"]] == [third, second] and page["truncated"] is True
    rest = fs(client, corpus, "ls", path="/evidence", limit=2, cursor=page["nextCursor"]).json()
    assert [i["name"] for i in rest["items"]] == [first] and rest["truncated"] is False
    other = fs(client, corpus, "ls", path="/knowledge/docs", limit=2, cursor=page["nextCursor"])
    assert (other.status_code, other.json()["code"]) == (400, "invalid_cursor")
    forged = fs(client, corpus, "ls", path="/evidence", limit=2, cursor=page["nextCursor"] + "x")
    assert (forged.status_code, forged.json()["code"]) == (400, "invalid_cursor")
    too_many = fs(client, corpus, "ls", path="/evidence", limit=101)
    assert (too_many.status_code, too_many.json()["code"]) == (400, "invalid_limit")
    for bad in (f"/evidence/{first.upper()}", f"/evidence/{first}/items/1", "/evidence/x"):
        response = fs(client, corpus, "cat", path=bad)
        assert (response.status_code, response.json()["code"]) == (404, "fs_path_not_found"), bad


@pytest.mark.django_db
def test_a_capability_trace_is_read_only_by_the_same_subject(tokens, client, corpus):
    subject, stranger = "dify-service-api:caller-1", "dify-service-api:caller-2"
    run_id = ask(bearer(cap.token(
        action="queries.answer", resource=cap.space_resource(corpus.id), sub=subject,
        actor=subject,
    )), corpus)  # fmt: skip
    path = f"/evidence/{run_id}/query.json"
    missing = f"/evidence/{uuid.uuid4()}/query.json"

    def as_subject(sub: str, op: str, **params):
        api = bearer(fs_token(corpus, sub, f"knowledge_fs.{op}"))
        return fs(api, corpus, op, **params)

    own = as_subject(subject, "ls", path="/evidence", limit=10).json()
    assert [i["name"] for i in own["items"]] == [run_id]
    assert as_subject(subject, "cat", path=path).status_code == 200
    assert as_subject(stranger, "ls", path="/evidence", limit=10).json()["items"] == []
    for target in (path, missing):
        response = as_subject(stranger, "cat", path=target)
        assert (response.status_code, response.json()["code"]) == (404, "fs_path_not_found")
        response = as_subject(stranger, "stat", path=target)
        assert (response.status_code, response.json()["code"]) == (404, "fs_path_not_found")
    # The trace route agrees: the tenant's API key reads it, the other subject does not.
    assert client.get(f"/v1/queries/{run_id}").status_code == 200
    assert [i["name"] for i in fs(client, corpus, "ls", path="/evidence", limit=10).json()[
        "items"]] == [run_id]  # fmt: skip
    # A trace made by an API key is not the capability subject's.
    by_key = ask(client, corpus)
    own = as_subject(subject, "ls", path="/evidence", limit=10).json()
    assert by_key not in [i["name"] for i in own["items"]]


@pytest.mark.django_db
def test_a_space_bound_key_of_another_space_cannot_read_the_evidence(client, corpus):
    run_id = ask(client, corpus)
    other = create_space(Principal(tenant_id="tenant-a"), name="Other")
    bound = bearer(create_api_key("tenant-a", spaces=[other])[1])
    response = fs(bound, corpus, "cat", path=f"/evidence/{run_id}/query.json")
    assert (response.status_code, response.json()["code"]) == (404, "space_not_found")
    # Through its own space the trace of the first one is no path at all.
    assert fs(bound, other, "ls", path="/evidence", limit=10).json()["items"] == []
    response = fs(bound, other, "cat", path=f"/evidence/{run_id}/query.json")
    assert (response.status_code, response.json()["code"]) == (404, "fs_path_not_found")
    response = fs(client, other, "stat", path=f"/evidence/{run_id}")
    assert (response.status_code, response.json()["code"]) == (404, "fs_path_not_found")
    foreign = bearer(create_api_key("tenant-b")[1])
    response = fs(foreign, corpus, "ls", path="/evidence", limit=10)
    assert (response.status_code, response.json()["code"]) == (404, "space_not_found")


def rpc(token: str, name: str, arguments: dict) -> dict:
    body = {
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }  # fmt: skip
    response = Client().post(
        "/mcp", json.dumps(body), content_type="application/json",
        HTTP_ACCEPT="application/json, text/event-stream", HTTP_AUTHORIZATION=f"Bearer {token}",
    )  # fmt: skip
    assert response.status_code == 200, response.content
    return json.loads(response.content)["result"]


@pytest.mark.django_db(transaction=True)
def test_mcp_ls_and_cat_on_evidence_follow_the_same_visibility(tokens, client, corpus):
    run_id = ask(client, corpus)  # made with an API key of the tenant
    args = {"knowledgeSpaceId": str(corpus.id), "path": "/evidence", "limit": 10}
    key = create_api_key("tenant-a")[1]
    own = rpc(key, "knowledge.fs.ls", args)
    assert own["isError"] is False
    assert [i["name"] for i in own["structuredContent"]["items"]] == [run_id]
    item_path = f"/evidence/{run_id}/items/001"
    read = rpc(key, "knowledge.fs.cat", {"knowledgeSpaceId": str(corpus.id), "path": item_path})
    assert read["isError"] is False
    assert json.loads(read["structuredContent"]["text"])["citation"]["filename"] == "leave.md"
    # An MCP session token is a capability subject: a key's trace is not its own (as over HTTP).
    session = fs_token(corpus, "dify-mcp-session:s-1", "knowledge_fs.ls", kind="mcp")
    theirs = rpc(session, "knowledge.fs.ls", args)
    assert theirs["isError"] is False and theirs["structuredContent"]["items"] == []
    session_cat = fs_token(corpus, "dify-mcp-session:s-1", "knowledge_fs.cat", kind="mcp")
    for path in (f"/evidence/{run_id}/query.json", f"/evidence/{uuid.uuid4()}/query.json"):
        refused = rpc(session_cat, "knowledge.fs.cat", {"knowledgeSpaceId": str(corpus.id),
                                                        "path": path})  # fmt: skip
        assert refused["isError"] is True
        assert refused["structuredContent"]["code"] == "fs_path_not_found"
        assert refused["structuredContent"]["status"] == 404
    other = create_space(Principal(tenant_id="tenant-a"), name="Other")
    bound = rpc(create_api_key("tenant-a", spaces=[other])[1], "knowledge.fs.ls", args)
    assert bound["isError"] is True
    assert bound["structuredContent"]["code"] == "space_not_found"


@pytest.mark.django_db
def test_an_item_keeps_its_rank_when_its_document_is_disabled(client, corpus):
    from ingestion.availability import set_document_availability
    from ingestion.models import Document

    run_id = ask(client, corpus)
    path = f"/evidence/{run_id}/items/001"
    before = json.loads(fs(client, corpus, "cat", path=path).json()["text"])
    assert before["citation"]["filename"] == "leave.md" and before["path"]
    leave = Document.objects.get(space=corpus, filename="leave.md")
    set_document_availability(leave.id, False, leave.row_version)
    after = json.loads(fs(client, corpus, "cat", path=path).json()["text"])
    assert after["nodeId"] == before["nodeId"] and after["rank"] == 1
    assert after["citation"] is None and after["path"] is None and after["text"] is None
    # the safe shell reads the evidence as the same caller
    out = client.post(
        f"/v1/knowledge-spaces/{corpus.id}/fs/shell/execute",
        {"command": "ls /evidence --limit 5 | jq .items[0].name"}, format="json",
    )  # fmt: skip
    assert out.status_code == 200, out.content
    assert run_id in out.json()["output"]
