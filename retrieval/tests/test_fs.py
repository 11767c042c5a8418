"""The knowledge filesystem over HTTP on a space compiled from generated files: every route,
paths that appear and disappear with their generation, citations equal to retrieval's, the
limits and bad input (400/404 with stable codes), the scan budget and the safe shell."""

from __future__ import annotations

import json
import uuid

import pytest
from rest_framework.test import APIClient

from ingestion.documents import admit_document
from ingestion.models import Document
from knowledgefs.testing.fixtures import compile_all, shared_path
from retrieval.modes import retrieve
from spaces.api_keys import create_api_key
from spaces.services import Principal, create_space

GUIDE = """# Installation guide

Intro text before the steps. The orbital widget needs calibration.

## Requirements

You need Python 3.11 and a Zebra-Compatible printer. Unicode: Größe café naïve.

## Steps

Run the installer, then reboot. The Zebra printer prints a test page.
"""
CSV = "name,colour,weight\napple,red,150\nbanana,yellow,120\ncherry,dark red,8\n"


@pytest.fixture
def corpus(space):
    docs = {}
    for name, data in (
        ("guide 2024/final.md", GUIDE.encode()),
        ("fruit.csv", CSV.encode()),
        ("notes.txt", b"Plain notes about zebras and orbital mechanics.\n"),
    ):
        docs[name] = admit_document(space, filename=name, data=data, enqueue=False).document
    compile_all()
    return {name: Document.objects.get(id=d.id) for name, d in docs.items()}


def fs(client, space, op, **params):
    return client.get(f"/v1/knowledge-spaces/{space.id}/fs/{op}", params)


def folder(doc) -> str:
    from retrieval.fs.paths import document_name

    return f"/knowledge/docs/{document_name(doc.filename, doc.id)}"


def test_ls_lists_the_roots_the_documents_and_their_parts(client, space, corpus):
    root = fs(client, space, "ls", path="/knowledge", limit=10).json()
    assert [i["path"] for i in root["items"]] == ["/knowledge/docs"]
    docs = fs(client, space, "ls", path="/knowledge/docs", limit=10).json()
    guide = corpus["guide 2024/final.md"]
    names = [i["name"] for i in docs["items"]]
    assert names == sorted(names, key=lambda n: n)  # ordered by filename
    assert f"guide-2024-final.md--{guide.id.hex[:8]}" in names
    assert docs["truncated"] is False and "nextCursor" not in docs
    inside = fs(client, space, "ls", path=folder(guide), limit=10).json()
    assert [i["name"] for i in inside["items"]] == ["outline.json", "sections"]
    sections = fs(client, space, "ls", path=folder(guide) + "/sections", limit=10).json()
    stems = sorted(i["name"].rsplit("--", 1)[0] for i in sections["items"])
    assert stems == [
        "Installation-guide",
        "Installation-guide--Requirements",
        "Installation-guide--Steps",
    ]
    for item in sections["items"]:
        assert len(item["path"]) <= 384 and " " not in item["path"]
    fruit = fs(client, space, "ls", path=folder(corpus["fruit.csv"]), limit=10).json()
    assert "tables" in [i["name"] for i in fruit["items"]]


def test_ls_pages_with_a_cursor_bound_to_its_listing(client, space, corpus):
    first = fs(client, space, "ls", path="/knowledge/docs", limit=2).json()
    assert len(first["items"]) == 2 and first["truncated"] is True
    second = fs(
        client, space, "ls", path="/knowledge/docs", limit=2, cursor=first["nextCursor"]
    ).json()
    assert len(second["items"]) == 1 and second["truncated"] is False
    seen = [i["path"] for i in first["items"] + second["items"]]
    assert len(set(seen)) == 3
    # the cursor of this listing on another listing, or damaged: 400 invalid_cursor
    other = fs(client, space, "ls", path="/knowledge", limit=2, cursor=first["nextCursor"])
    assert (other.status_code, other.json()["code"]) == (400, "invalid_cursor")
    other_limit = fs(
        client, space, "ls", path="/knowledge/docs", limit=3, cursor=first["nextCursor"]
    )
    assert other_limit.json()["code"] == "invalid_cursor"
    forged = fs(client, space, "ls", path="/knowledge/docs", limit=2, cursor="abc")
    assert (forged.status_code, forged.json()["code"]) == (400, "invalid_cursor")


def test_cat_renders_sections_tables_and_the_outline(client, space, corpus):
    guide, fruit = corpus["guide 2024/final.md"], corpus["fruit.csv"]
    sections = fs(client, space, "ls", path=folder(guide) + "/sections", limit=10).json()["items"]
    steps = next(i for i in sections if i["name"].startswith("Installation-guide--Steps"))
    body = fs(client, space, "cat", path=steps["path"]).json()
    assert body["contentType"] == "text/markdown"
    assert body["text"].startswith("# Installation guide / Steps\n\n")
    assert "Run the installer, then reboot." in body["text"]
    assert "Requirements" not in body["text"].split("\n\n", 1)[1]
    tables = fs(client, space, "ls", path=folder(fruit) + "/tables", limit=10).json()["items"]
    table = fs(client, space, "cat", path=tables[0]["path"]).json()
    assert table["table"][0]["header"] == ["name", "colour", "weight"]
    assert "| banana | yellow | 120 |" in table["text"]
    outline = fs(client, space, "cat", path=folder(guide) + "/outline.json").json()
    data = json.loads(outline["text"])
    assert data["documentId"] == str(guide.id)
    assert [s["sectionPath"] for s in data["sections"]][0] == ["Installation guide"]


def test_cat_pages_long_text(client, space, corpus):
    guide = corpus["guide 2024/final.md"]
    path = folder(guide) + "/outline.json"
    whole = fs(client, space, "cat", path=path).json()["text"]
    parts, cursor = [], None
    while True:
        params = {"path": path, "limit": 50}
        if cursor:
            params["cursor"] = cursor
        page = fs(client, space, "cat", **params).json()
        parts.append(page["text"])
        cursor = page.get("nextCursor")
        if not cursor:
            break
    assert "".join(parts) == whole and len(parts) > 2


def test_stat_reports_hash_size_version_and_parser(client, space, corpus):
    import hashlib

    guide = corpus["guide 2024/final.md"]
    doc = fs(client, space, "stat", path=folder(guide)).json()
    assert doc["sha256"] == hashlib.sha256(GUIDE.encode()).hexdigest()
    assert doc["sizeBytes"] == len(GUIDE.encode())
    assert doc["version"] == str(guide.active_generation)
    assert doc["parserStatus"]["state"] == "published" and doc["parserStatus"]["parser"]
    outline_path = folder(guide) + "/outline.json"
    text = fs(client, space, "cat", path=outline_path).json()["text"]
    st = fs(client, space, "stat", path=outline_path).json()
    assert st["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert st["sizeBytes"] == len(text.encode())


def test_grep_finds_real_snippets_with_offsets_into_the_canonical_text(client, space, corpus):
    from ingestion.documents import published_text

    body = fs(client, space, "grep", q="zebra", path="/knowledge", limit=10).json()
    assert len(body["matches"]) == 3  # case-insensitive, first occurrence per node
    for match in body["matches"]:
        doc = Document.objects.get(id=match["metadata"]["documentId"])
        canonical = published_text(Principal(doc.tenant_id), doc.space_id, doc.id)["text"]
        found = canonical[match["startOffset"] : match["endOffset"]]
        assert found.lower() == "zebra"
        start = match["snippetStartOffset"]
        assert canonical[start : start + len(match["snippet"])] == match["snippet"]
        assert len(match["snippet"]) <= 5 + 2 * 100
    # a section path narrows to that section
    sections = fs(
        client, space, "ls", path=folder(corpus["guide 2024/final.md"]) + "/sections", limit=10
    ).json()["items"]
    steps = next(i for i in sections if i["name"].startswith("Installation-guide--Steps"))
    narrowed = fs(client, space, "grep", q="ZEBRA", path=steps["path"], limit=10).json()
    assert [m["path"] for m in narrowed["matches"]] == [steps["path"]]
    unicode = fs(client, space, "grep", q="GRÖSSE", path="/knowledge", limit=10).json()
    assert unicode["matches"] == []  # a substring test, not a case folding of ß
    assert (
        len(fs(client, space, "grep", q="größe", path="/knowledge", limit=10).json()["matches"])
        == 1
    )


def test_grep_pages_with_a_cursor(client, space, corpus):
    first = fs(client, space, "grep", q="zebra", path="/knowledge/docs", limit=2).json()
    assert len(first["matches"]) == 2 and first["truncated"] is True
    rest = fs(
        client, space, "grep", q="zebra", path="/knowledge/docs", limit=2,
        cursor=first["nextCursor"],
    ).json()  # fmt: skip
    assert len(rest["matches"]) == 1 and rest["truncated"] is False
    ids = {m["nodeId"] for m in first["matches"] + rest["matches"]}
    assert len(ids) == 3


def test_grep_over_a_large_scope_tests_the_keyword_candidates_exactly(
    client, space, corpus, monkeypatch
):
    from retrieval.fs import grep

    monkeypatch.setattr(grep, "SCAN_NODES", 2)  # this space is "large"
    first = fs(client, space, "grep", q="zebra", path="/knowledge", limit=2).json()
    assert first["scan"]["mode"] == "keyword_candidates" and first["scan"]["candidates"] >= 3
    assert len(first["matches"]) == 2 and first["truncated"] is True
    rest = fs(
        client, space, "grep", q="zebra", path="/knowledge", limit=2, cursor=first["nextCursor"]
    ).json()  # fmt: skip
    ids = [m["nodeId"] for m in first["matches"] + rest["matches"]]
    assert len(ids) == len(set(ids)) == 3 and rest["truncated"] is False
    # a word the keyword index ranks but whose exact text is absent matches nothing
    none = fs(client, space, "grep", q="zebras orbital", path="/knowledge", limit=5).json()
    assert none["matches"] == []
    # a cursor of the full scan is not one of the keyword walk
    monkeypatch.setattr(grep, "SCAN_NODES", 20_000)
    full = fs(client, space, "grep", q="zebra", path="/knowledge", limit=1).json()
    monkeypatch.setattr(grep, "SCAN_NODES", 2)
    mixed = fs(
        client, space, "grep", q="zebra", path="/knowledge", limit=1, cursor=full["nextCursor"]
    )
    assert (mixed.status_code, mixed.json()["code"]) == (400, "invalid_cursor")


def test_find_by_name_metadata_and_type(client, space, corpus):
    from ingestion.availability import patch_document_metadata

    found = fs(client, space, "find", path="/knowledge/docs", limit=10, nameContains="FRUIT")
    assert [i["name"].split("--")[0] for i in found.json()["items"]] == ["fruit.csv"]
    tables = fs(client, space, "find", path="/knowledge", limit=10, resourceType="table").json()
    assert tables["items"] and all(i["resourceType"] == "table" for i in tables["items"])
    notes = corpus["notes.txt"]
    patch_document_metadata(notes.id, {"team": "ops"}, notes.row_version)
    meta = fs(
        client, space, "find", path="/knowledge/docs", limit=10, metadataKey="team",
        metadataValue="ops", resourceType="document",
    ).json()  # fmt: skip
    assert [i["targetId"] for i in meta["items"]] == [str(notes.id)]
    lonely = fs(client, space, "find", path="/knowledge", limit=10, metadataKey="team")
    assert (lonely.status_code, lonely.json()["code"]) == (400, "invalid_metadata_filter")


def test_find_answers_503_when_the_scan_budget_cannot_fill_a_page(client, space, corpus):
    for i in range(25):
        admit_document(
            space, filename=f"bulk-{i:02}.txt", data=f"bulk {i}\n".encode(), enqueue=False
        )
    compile_all()
    response = fs(client, space, "find", path="/knowledge/docs", limit=1, nameContains="nothing")
    assert response.status_code == 503
    assert response.json()["code"] == "fs_scan_budget_exhausted"
    # a page that fills within the budget is served
    ok = fs(client, space, "find", path="/knowledge/docs", limit=2, nameContains="bulk-0")
    assert ok.status_code == 200 and len(ok.json()["items"]) == 2 and ok.json()["truncated"]


def test_tree_walks_to_its_depth(client, space, corpus):
    body = fs(client, space, "tree", path="/knowledge", limit=100, depth=3).json()
    depths = {i["depth"] for i in body["items"]}
    assert depths == {1, 2, 3}
    assert any(i["name"] == "outline.json" and i["depth"] == 3 for i in body["items"])
    paged = fs(client, space, "tree", path="/knowledge", limit=3, depth=4).json()
    assert paged["truncated"] is True
    again = fs(
        client, space, "tree", path="/knowledge", limit=3, depth=4, cursor=paged["nextCursor"]
    ).json()
    full = fs(client, space, "tree", path="/knowledge", limit=100, depth=4).json()["items"]
    assert paged["items"] + again["items"] == full[:6]


def test_diff_in_line_and_word_mode(client, space, corpus):
    guide = folder(corpus["guide 2024/final.md"])
    sections = fs(client, space, "ls", path=guide + "/sections", limit=10).json()["items"]
    a, b = sections[1]["path"], sections[2]["path"]
    lines = fs(client, space, "diff", oldPath=a, newPath=b).json()
    assert lines["mode"] == "line" and lines["stats"]["delete"] >= 1
    old_text = fs(client, space, "cat", path=a).json()["text"]
    assert "".join(o["text"] for o in lines["operations"] if o["kind"] != "insert") == old_text
    words = fs(client, space, "diff", oldPath=a, newPath=a, mode="word").json()
    assert words["stats"] == {"equal": 1, "insert": 0, "delete": 0}
    bad = fs(client, space, "diff", oldPath=a, newPath=b, mode="char")
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_diff_mode")


def test_open_node_gives_the_citation_exactly_as_retrieval(client, space, corpus):
    result = retrieve(space, "zebra printer test page", top_k=1)
    item = result.items[0]
    body = fs(client, space, "open_node", node_id=str(item.node_id)).json()
    assert body["citation"] == item.citation
    assert body["node"]["text"] == item.text
    listed = fs(client, space, "cat", path=body["node"]["path"]).json()["text"]
    assert item.text in listed
    missing = fs(client, space, "open_node", node_id=str(uuid.uuid4()))
    assert (missing.status_code, missing.json()["code"]) == (404, "node_not_found")


def test_paths_follow_the_published_generation_and_availability(client, space, corpus):
    from ingestion.availability import set_document_availability

    notes = corpus["notes.txt"]
    path = folder(notes)
    sections = fs(client, space, "ls", path=path + "/sections", limit=10).json()["items"]
    node_id = json.loads(fs(client, space, "cat", path=path + "/outline.json").json()["text"])[
        "sections"
    ][0]["nodeIds"][0]
    set_document_availability(notes.id, False, notes.row_version)
    assert fs(client, space, "stat", path=path).status_code == 404
    assert fs(client, space, "cat", path=sections[0]["path"]).status_code == 404
    assert path not in [
        i["path"] for i in fs(client, space, "ls", path="/knowledge/docs", limit=10).json()["items"]
    ]
    assert fs(client, space, "open_node", node_id=node_id).status_code == 404
    grep = fs(client, space, "grep", q="orbital mechanics", path="/knowledge", limit=10).json()
    assert grep["matches"] == []


def test_a_new_generation_replaces_the_section_paths(client, space, corpus):
    notes = corpus["notes.txt"]
    before = fs(client, space, "ls", path=folder(notes) + "/sections", limit=10).json()["items"]
    admit_document(
        space, filename="notes.txt", data=b"Plain notes about zebras and orbital mechanics.\n",
        on_duplicate="replace", enqueue=False,
    )  # fmt: skip
    # until the new generation is published, the old paths serve
    assert fs(client, space, "cat", path=before[0]["path"]).status_code == 200
    compile_all()
    after = fs(client, space, "ls", path=folder(notes) + "/sections", limit=10).json()["items"]
    assert [i["path"] for i in after] != [i["path"] for i in before]
    assert after[0]["version"] == str(Document.objects.get(id=notes.id).active_generation)
    gone = fs(client, space, "cat", path=before[0]["path"])
    assert (gone.status_code, gone.json()["code"]) == (404, "fs_path_not_found")
    assert fs(client, space, "cat", path=after[0]["path"]).status_code == 200


BAD = [
    ({"path": "/knowledge/../etc", "limit": 5}, 400, "invalid_path"),
    ({"path": "/knowledge//docs", "limit": 5}, 400, "invalid_path"),
    ({"path": "/knowledge/do\x00cs", "limit": 5}, 400, "invalid_path"),
    ({"path": "/knowledge/" + "a" * 374, "limit": 5}, 400, "path_too_long"),
    ({"path": "/etc", "limit": 5}, 400, "invalid_path"),
    ({"path": "/knowledge/docs/a b", "limit": 5}, 400, "invalid_path"),
    ({"path": "/knowledge", "limit": 0}, 400, "invalid_limit"),
    ({"path": "/knowledge", "limit": 101}, 400, "invalid_limit"),
    ({"path": "/knowledge"}, 400, "invalid_limit"),
    ({"path": "/knowledge", "limit": "ten"}, 400, "invalid_limit"),
    ({"path": "/knowledge/docs/nothing--00000000", "limit": 5}, 404, "fs_path_not_found"),
    ({"path": "/knowledge", "limit": 5, "sort": "x"}, 400, "invalid_request"),
]


@pytest.mark.parametrize(("params", "status", "code"), BAD)
def test_bad_listing_input_is_refused_with_a_stable_code(client, space, params, status, code):
    response = fs(client, space, "ls", **params)
    assert (response.status_code, response.json()["code"]) == (status, code)


def test_bad_input_on_every_route(client, space, corpus):
    path = folder(corpus["notes.txt"])
    cases = [
        ("tree", {"path": "/knowledge", "limit": 5, "depth": 9}, 400, "invalid_depth"),
        ("tree", {"path": "/knowledge", "limit": 5, "depth": 0}, 400, "invalid_depth"),
        ("grep", {"q": "x" * 4001, "path": "/knowledge", "limit": 5}, 400, "query_too_long"),
        ("grep", {"q": "", "path": "/knowledge", "limit": 5}, 400, "invalid_query"),
        ("grep", {"q": "a\x00b", "path": "/knowledge", "limit": 5}, 400, "invalid_query"),
        ("tree", {"path": "/knowledge", "limit": "²", "depth": 2}, 400, "invalid_limit"),
        ("tree", {"path": "/knowledge", "limit": 5, "depth": "-1"}, 400, "invalid_depth"),
        ("ls", {"path": "/knowledge", "limit": 5, "cursor": "ünïcode:x"}, 400, "invalid_cursor"),
        ("grep", {"q": "a", "path": "/knowledge", "limit": 5, "timeoutMs": 10001}, 400,
         "invalid_timeout"),
        ("grep", {"q": "a", "path": "/knowledge", "limit": 101}, 400, "invalid_limit"),
        ("find", {"path": "/knowledge", "limit": 5, "resourceType": "x"}, 400,
         "invalid_resource_type"),
        ("find", {"path": "/knowledge", "limit": 5, "nameContains": "n" * 241}, 400,
         "invalid_filter_value"),
        ("cat", {"path": path}, 400, "fs_is_directory"),
        ("cat", {"path": path + "/none.md"}, 404, "fs_path_not_found"),
        ("cat", {"path": path + "/outline.json", "limit": 0}, 400, "invalid_limit"),
        ("stat", {"path": "/knowledge/.."}, 400, "invalid_path"),
        ("diff", {"oldPath": path + "/outline.json", "newPath": "/a//b"}, 400, "invalid_path"),
        ("open_node", {"node_id": "not-a-uuid"}, 404, "node_not_found"),
        ("open_node", {}, 400, "invalid_node_id"),
    ]  # fmt: skip
    for op, params, status, code in cases:
        response = fs(client, space, op, **params)
        assert (response.status_code, response.json()["code"]) == (status, code), (op, params)


def test_a_foreign_space_is_404_and_a_space_bound_key_sees_only_its_space(space, corpus):
    other = create_space(Principal(tenant_id="tenant-a"), name="Other")
    admit_document(other, filename="secret.txt", data=b"a secret zebra\n", enqueue=False)
    compile_all()
    bound = APIClient()
    bound.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key('tenant-a', spaces=[space])[1]}")
    assert fs(bound, space, "grep", q="zebra", path="/knowledge", limit=10).status_code == 200
    response = fs(bound, other, "ls", path="/knowledge/docs", limit=10)
    assert (response.status_code, response.json()["code"]) == (404, "space_not_found")
    foreign = APIClient()
    foreign.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key('tenant-b')[1]}")
    response = fs(foreign, space, "grep", q="zebra", path="/knowledge", limit=10)
    assert (response.status_code, response.json()["code"]) == (404, "space_not_found")
    # a node of another space is not found through this one
    secret = json.loads(
        fs(APIClient_for(other), other, "cat", path=folder(Document.objects.get(space=other))
           + "/outline.json").json()["text"]
    )["sections"][0]["nodeIds"][0]  # fmt: skip
    assert fs(bound, space, "open_node", node_id=secret).status_code == 404


def APIClient_for(space) -> APIClient:  # noqa: N802
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {create_api_key(space.tenant_id)[1]}")
    return api


def test_the_sample_documents_are_browsable(client, space):
    folder_path = shared_path("data", "sample-docs")
    if not folder_path.is_dir():
        pytest.skip(f"{folder_path} is absent")
    files = sorted(p for p in folder_path.iterdir() if p.is_file())[:6]
    for p in files:
        admit_document(space, filename=p.name, data=p.read_bytes(), enqueue=False)
    compile_all()
    docs = fs(client, space, "ls", path="/knowledge/docs", limit=100).json()["items"]
    assert docs
    for doc in docs:
        body = fs(client, space, "tree", path=doc["path"], limit=100, depth=3).json()
        for item in body["items"]:
            assert len(item["path"]) <= 384
            if item["kind"] == "file":
                assert fs(client, space, "cat", path=item["path"], limit=200).status_code == 200
                assert fs(client, space, "stat", path=item["path"]).status_code == 200


def test_kfs_fs_commands(space, corpus):
    from io import StringIO

    from django.core.management import CommandError, call_command

    def kfs(*args: str) -> str:
        out = StringIO()
        call_command("kfs", *args, "--space", space.slug, "--tenant", space.tenant_id, stdout=out)
        return out.getvalue()

    listed = kfs("fs", "ls", "/knowledge/docs")
    guide = folder(corpus["guide 2024/final.md"])
    assert f"d {guide}" in listed.splitlines()
    as_json = json.loads(kfs("fs", "ls", "/knowledge/docs", "--json", "--limit", "1"))
    assert len(as_json["items"]) == 1 and as_json["nextCursor"]
    tree = kfs("fs", "tree", guide, "--depth", "2")
    assert "outline.json" in tree and "  Installation-guide--Steps--" in tree
    hits = kfs("fs", "grep", "zebra", "/knowledge")
    assert len(hits.splitlines()) == 3 and all(":" in line for line in hits.splitlines())
    found = kfs("fs", "find", "/knowledge", "--resource-type", "table")
    assert "/tables/table-1--" in found
    outline = kfs("fs", "cat", guide + "/outline.json")
    assert json.loads(outline)["documentId"] == str(corpus["guide 2024/final.md"].id)
    stat = json.loads(kfs("fs", "stat", guide))
    assert stat["resourceType"] == "document"
    with pytest.raises(CommandError, match="invalid_path"):
        kfs("fs", "ls", "/knowledge/../x")


def test_bc39_cat_shows_fenced_code_inside_its_fence(client, space):
    script = "\n".join(f"echo step {i} && apt-get install -y package-{i}" for i in range(60))
    source = (
        f"# Setup\n\n```bash\n# install deps\n## not a title\n{script}\n```\n\n# Usage\n\nRun it.\n"
    )
    doc = admit_document(space, filename="setup.md", data=source.encode(), enqueue=False).document
    compile_all()
    doc = Document.objects.get(id=doc.id)
    nodes = doc.nodes.filter(generation=doc.active_generation, section_path=["Setup"])
    assert nodes.count() >= 3  # the code is longer than a chunk
    sections = fs(client, space, "ls", path=folder(doc) + "/sections", limit=10).json()["items"]
    setup = next(i for i in sections if i["name"].startswith("Setup"))
    text = fs(client, space, "cat", path=setup["path"]).json()["text"]
    # One fence around the whole block, with its info string, however many chunks it spans.
    expected = f"```bash\n# install deps\n## not a title\n{script}\n```"
    assert text == f"# Setup\n\nSetup\n{expected}", text[:120]
    usage = next(i for i in sections if i["name"].startswith("Usage"))
    assert "```" not in fs(client, space, "cat", path=usage["path"]).json()["text"]


def test_a_repeated_parameter_is_refused_naming_it(client, space, corpus):
    url = f"/v1/knowledge-spaces/{space.id}/fs/ls"
    response = client.get(f"{url}?path=/knowledge&limit=5&limit=500")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "invalid_request" and body["details"]["field"] == "limit"
    assert "limit" in body["message"] and "2 times" in body["message"]
    grep = client.get(f"/v1/knowledge-spaces/{space.id}/fs/grep?q=a&q=b&path=/knowledge")
    assert (grep.status_code, grep.json()["details"]["field"]) == (400, "q")


def test_a_lone_surrogate_in_a_grep_pattern_is_refused(client, space, corpus):
    from retrieval.fs import tools

    # A JSON body may hold "\ud800": the safe shell's grep over HTTP.
    response = client.post(
        f"/v1/knowledge-spaces/{space.id}/fs/shell/execute",
        b'{"command": "grep zebra\\ud800 /knowledge"}',
        content_type="application/json",
    )
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid_query", response.content
    assert "surrogate" in response.json()["message"]
    # The same through the tool MCP calls (a JSON string may hold "\ud800").
    from knowledgefs.errors import InvalidInput

    tool = tools.BY_NAME["knowledge.fs.grep"]
    with pytest.raises(InvalidInput) as refused:
        tools.call(tool, space, {"q": "\ud800", "path": "/knowledge"})
    assert (refused.value.status, refused.value.code) == (400, "invalid_query")
