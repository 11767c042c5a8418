"""The MCP server with the official SDK's client: over stdio (``manage.py kfs mcp`` spawned as a
child) and over streamable HTTP (``/mcp`` on a real gunicorn with a sync worker on loopback).
Each session lists the tools and calls every one of them; refusals are tool errors with the
codes of the HTTP routes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from django.db import connection, connections
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

from ingestion.documents import admit_document
from knowledgefs.testing.fixtures import compile_all
from spaces.api_keys import create_api_key
from spaces.services import Principal, create_space
from tests.system.test_answer_sse import SyncGunicorn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
TOOLS = {
    "knowledge.fs.ls", "knowledge.fs.tree", "knowledge.fs.cat", "knowledge.fs.stat",
    "knowledge.fs.grep", "knowledge.fs.find", "knowledge.fs.diff", "knowledge.fs.open_node",
    "knowledge.search", "knowledge.fetch_evidence", "knowledge.get_document_outline",
    "knowledge.shell.plan", "knowledge.shell.execute", "knowledge.space.status",
}  # fmt: skip
GUIDE = "# Guide\n\n## Setup\n\nInstall the zebra driver first.\n\n## Use\n\nPrint a page.\n"


@pytest.fixture(autouse=True)
def same_model_as_the_server(settings):
    """The children (knowledgefs.testing.cluster_settings) embed with the test embedder."""
    from knowledgefs.runtime import DEFAULT_MODEL_ID

    settings.KNOWLEDGE_EMBEDDING_MODELS = {
        DEFAULT_MODEL_ID: "knowledgefs.testing.cluster_support.SlowEmbedder"
    }


@pytest.fixture
def compiled(db):
    space = create_space(Principal(tenant_id="tenant-a"), name="Handbook")
    admit_document(space, filename="guide.md", data=GUIDE.encode(), enqueue=False)
    admit_document(space, filename="notes.txt", data=b"zebra notes\n", enqueue=False)
    compile_all()
    connections.close_all()
    return space


def child_env(object_storage, var_dir) -> dict:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "knowledgefs.testing.cluster_settings",
        "KFS_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
        "KFS_TEST_OBJECTS": str(object_storage),
        "KFS_TEST_VAR_DIR": str(var_dir),
        "LOG_LEVEL": "WARNING",
    }


def data(result) -> dict:
    return result.structuredContent


async def exercise(session: ClientSession, base: dict) -> dict:
    """List the tools and call each; returns what the caller checks further."""
    await session.initialize()
    listed = (await session.list_tools()).tools
    assert {t.name for t in listed} == TOOLS
    for tool in listed:
        assert tool.inputSchema["type"] == "object" and tool.inputSchema["properties"]
    seen: dict = {}

    async def call(name: str, **arguments):
        result = await session.call_tool(name, {**base, **arguments})
        assert not result.isError, (name, result.content)
        seen[name] = data(result)
        # the text content carries the same JSON
        assert json.loads(result.content[0].text) == seen[name]
        return seen[name]

    docs = await call("knowledge.fs.ls", path="/knowledge/docs", limit=10)
    assert len(docs["items"]) == 2
    guide = next(i for i in docs["items"] if i["name"].startswith("guide.md--"))
    tree = await call("knowledge.fs.tree", path=guide["path"], limit=50, depth=2)
    sections = [i["path"] for i in tree["items"] if i["resourceType"] == "section"]
    assert len(sections) == 2
    hits = await call("knowledge.fs.grep", q="zebra", path="/knowledge", limit=10)
    assert len(hits["matches"]) == 2
    setup = next(m for m in hits["matches"] if "guide.md" in m["path"])
    text = await call("knowledge.fs.cat", path=setup["path"])
    assert "Install the zebra driver first." in text["text"]
    node = await call("knowledge.fs.open_node", nodeId=setup["nodeId"])
    assert node["citation"]["filename"] == "guide.md"
    assert node["citation"]["start_offset"] <= setup["startOffset"]
    stat = await call("knowledge.fs.stat", path=guide["path"])
    assert stat["resourceType"] == "document"
    found = await call("knowledge.fs.find", path="/knowledge", limit=10, nameContains="notes")
    assert [i["name"].split("--")[0] for i in found["items"]] == ["notes.txt"]
    diff = await call("knowledge.fs.diff", oldPath=sections[0], newPath=sections[1])
    assert diff["stats"]["delete"] + diff["stats"]["insert"] >= 1
    search = await call("knowledge.search", query="zebra driver", topK=3, mode="fast")
    assert search["items"] and search["items"][0]["citation"]["filename"]
    evidence = await call("knowledge.fetch_evidence", query="zebra driver", topK=2)
    assert evidence["evidence"][0]["citation"]
    outline = await call("knowledge.get_document_outline", documentId=guide["targetId"])
    assert [s["sectionPath"] for s in outline["sections"]][-1] == ["Guide", "Use"]
    planned = await call("knowledge.shell.plan", command="grep zebra /knowledge | wc")
    assert [s["command"] for s in planned["steps"]] == ["grep", "wc"]
    ran = await call(
        "knowledge.shell.execute", command="ls /knowledge/docs --limit 5 | jq .items[0].kind"
    )
    assert json.loads(ran["output"]) == "directory"
    status = await call("knowledge.space.status")
    assert status["documents"]["readable"] == 2 and status["nodes"] >= 3
    assert set(seen) == TOOLS
    # refusals and not-found: tool errors with the HTTP codes
    for name, arguments, code in (
        ("knowledge.fs.ls", {"path": "/knowledge/../x", "limit": 5}, "invalid_path"),
        ("knowledge.fs.ls", {"path": "/knowledge", "limit": 101}, "invalid_limit"),
        ("knowledge.fs.cat", {"path": guide["path"] + "/none.md"}, "fs_path_not_found"),
        ("knowledge.fs.grep", {"q": "x" * 4001, "path": "/knowledge", "limit": 5},
         "query_too_long"),
        ("knowledge.shell.execute", {"command": "ls /; rm -rf /"}, "shell_syntax_refused"),
        ("knowledge.fs.open_node", {"nodeId": "00000000-0000-0000-0000-000000000000"},
         "node_not_found"),
        ("knowledge.nothing", {}, "unknown_tool"),
    ):  # fmt: skip
        result = await session.call_tool(name, {**base, **arguments})
        assert result.isError, name
        assert data(result)["code"] == code, (name, data(result))
    return seen


def test_stdio_session_spawning_kfs_mcp(compiled, object_storage, var_dir):
    params = StdioServerParameters(
        command=sys.executable,
        args=["manage.py", "kfs", "mcp", "--space", compiled.slug, "--tenant", "tenant-a"],
        env=child_env(object_storage, var_dir),
        cwd=str(ROOT),
    )
    other = create_space(Principal(tenant_id="tenant-a"), name="Other")

    async def main():
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await exercise(session, {})
                # a server bound to one space never reaches another
                result = await session.call_tool(
                    "knowledge.fs.ls",
                    {"knowledgeSpaceId": str(other.id), "path": "/knowledge", "limit": 5},
                )
                assert result.isError and data(result)["code"] == "space_not_found"

    anyio.run(main)


def test_streamable_http_session_on_gunicorn(compiled, object_storage, var_dir, tmp_path):
    key = create_api_key("tenant-a")[1]
    bound_key = create_api_key("tenant-a", spaces=[compiled])[1]
    other = create_space(Principal(tenant_id="tenant-a"), name="Other")
    foreign = create_space(Principal(tenant_id="tenant-b"), name="Foreign")
    connections.close_all()
    server = SyncGunicorn(object_storage, tmp_path / "gunicorn.log", KFS_TEST_VAR_DIR=str(var_dir))
    server.start()
    url = f"http://127.0.0.1:{server.port}/mcp"
    try:

        async def session_with(secret: str, check):
            headers = {"Authorization": f"Bearer {secret}"}
            async with streamablehttp_client(url, headers=headers) as (read, write, _):
                async with ClientSession(read, write) as session:
                    await check(session)

        async def everything(session):
            await exercise(session, {"knowledgeSpaceId": str(compiled.id)})
            for space in (foreign, other):
                result = await session.call_tool(
                    "knowledge.fs.ls",
                    {"knowledgeSpaceId": str(space.id), "path": "/knowledge", "limit": 5},
                )
                if space is foreign:
                    assert result.isError and data(result)["code"] == "space_not_found"
                else:
                    assert not result.isError
            missing = await session.call_tool("knowledge.fs.ls", {"path": "/", "limit": 5})
            assert missing.isError and data(missing)["code"] == "invalid_request"

        async def bound(session):
            await session.initialize()
            result = await session.call_tool(
                "knowledge.fs.ls",
                {"knowledgeSpaceId": str(other.id), "path": "/knowledge", "limit": 5},
            )
            assert result.isError and data(result)["code"] == "space_not_found"
            own = await session.call_tool(
                "knowledge.fs.ls",
                {"knowledgeSpaceId": str(compiled.id), "path": "/knowledge/docs", "limit": 5},
            )
            assert not own.isError and len(data(own)["items"]) == 2

        anyio.run(session_with, key, everything)
        anyio.run(session_with, bound_key, bound)
        # without credentials: 401 before any MCP work
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("POST", "/mcp", body="{}", headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 401
        assert json.loads(response.read())["code"] == "not_authenticated"
    finally:
        server.stop()
