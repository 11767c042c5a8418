"""The safe shell over HTTP: plans, pipelines of head/tail/wc/jq, the output bound and the
refusal table (each a 400 naming the token, never a host shell)."""

from __future__ import annotations

import json

import pytest

from ingestion.documents import admit_document
from knowledgefs.testing.fixtures import compile_all


@pytest.fixture
def corpus(space):
    for i in range(3):
        text = f"# Part {i}\n\nLine one of part {i}.\nThe zebra line {i}.\n"
        admit_document(space, filename=f"part-{i}.md", data=text.encode(), enqueue=False)
    compile_all()


def post(client, space, op, command):
    return client.post(
        f"/v1/knowledge-spaces/{space.id}/fs/shell/{op}", {"command": command}, format="json"
    )


def test_plan_lists_the_steps_with_their_input(client, space):
    body = post(client, space, "plan", "grep 'zebra line' /knowledge --limit 5 | jq .matches[0]")
    assert body.status_code == 200
    steps = body.json()["steps"]
    assert [s["command"] for s in steps] == ["grep", "jq"]
    assert steps[0]["input"] == {"q": "zebra line", "path": "/knowledge", "limit": 5}
    assert steps[0]["kind"] == "filesystem" and steps[1]["kind"] == "transform"
    assert steps[1]["input"] == {"selector": ".matches[0]"}


def test_execute_runs_the_pipeline(client, space, corpus):
    out = post(client, space, "execute", "ls /knowledge/docs --limit 10 | jq .items[1].name")
    assert out.status_code == 200
    body = out.json()
    assert body["truncated"] is False
    assert json.loads(body["output"]).startswith("part-1.md--")
    counted = post(client, space, "execute", "grep zebra /knowledge | wc").json()
    assert json.loads(counted["output"])["lines"] > 3
    head = post(client, space, "execute", "ls /knowledge/docs --limit 10 | head -n 2").json()
    assert len(json.loads(head["output"])["items"]) == 2
    tail = post(
        client, space, "execute", "grep zebra /knowledge | tail -n 1 | jq .matches[0].snippet"
    )
    every = json.loads(post(client, space, "execute", "grep zebra /knowledge").json()["output"])
    assert json.loads(tail.json()["output"]) == every["matches"][-1]["snippet"]
    assert len(every["matches"]) == 3
    missing = post(client, space, "execute", "ls /knowledge --limit 3 | jq .nothing[3].x").json()
    assert missing["output"] == "null"
    docs = post(client, space, "execute", "ls /knowledge/docs --limit 1 | jq .items[0].path")
    path = json.loads(docs.json()["output"])
    cat = post(client, space, "execute", f"cat {path}/outline.json | head -n 3").json()
    assert cat["output"].startswith("{")


def test_output_is_bounded_with_truncated(client, space, corpus, settings):
    from retrieval.fs import shell

    big = "word " * 6_000
    admit_document(space, filename="big.txt", data=big.encode(), enqueue=False)
    compile_all()
    docs = post(client, space, "execute", "find /knowledge --limit 5 --resource-type page_text")
    assert docs.status_code == 200
    listing = post(client, space, "execute", "find /knowledge/docs --limit 1 --name-contains big")
    path = json.loads(listing.json()["output"])["items"][0]["path"]
    sections = post(client, space, "execute", f"ls {path}/sections --limit 1 | jq .items[0].path")
    section = json.loads(sections.json()["output"])
    out = post(client, space, "execute", f"cat {section} --limit 65536").json()
    assert out["truncated"] is False and len(out["output"].encode()) < shell.MAX_OUTPUT_BYTES
    full = shell.execute(space, "tree /knowledge --limit 100 --depth 8")
    assert full["truncated"] is False
    original = shell.MAX_OUTPUT_BYTES
    shell.MAX_OUTPUT_BYTES = 1000
    try:
        cut = post(client, space, "execute", f"cat {section} --limit 65536").json()
    finally:
        shell.MAX_OUTPUT_BYTES = original
    assert cut["truncated"] is True and len(cut["output"].encode()) <= 1000


REFUSED = [
    ("ls /knowledge; rm -rf /", "shell_syntax_refused", ";"),
    ("ls /knowledge && ls /", "shell_syntax_refused", "&&"),
    ("ls /knowledge & ls /", "shell_syntax_refused", "&"),
    ("ls /knowledge > out.txt", "shell_syntax_refused", ">"),
    ("cat < /etc/passwd", "shell_syntax_refused", "<"),
    ("ls `whoami`", "shell_syntax_refused", "`"),
    ("ls $(whoami)", "shell_syntax_refused", "$("),
    ("ls '/knowledge", "shell_unterminated_quote", None),
    ('grep "zebra /knowledge', "shell_unterminated_quote", None),
    ("ls /knowledge | | wc", "shell_empty_step", "|"),
    ("ls /knowledge |", "shell_empty_step", "|"),
    ("rm /knowledge", "shell_command_not_allowed", "rm"),
    ("head /knowledge", "shell_command_not_allowed", "head"),
    ("ls /knowledge | cat /x", "shell_command_not_allowed", "cat"),
    ("ls /knowledge | sh", "shell_command_not_allowed", "sh"),
    ("ls /knowledge | head | head | head | head | head", "shell_too_many_steps", None),
    ("ls /knowledge | jq 'del(.items)'", "shell_invalid_argument", "del(.items)"),
    ("ls /knowledge --limit x", "shell_invalid_argument", "x"),
    ("ls /knowledge --limit ²", "shell_invalid_argument", "²"),
    ("ls /knowledge | head -n ²", "shell_invalid_argument", "-n"),
    ("ls /knowledge --depth 2", "shell_invalid_argument", "--depth"),
    ("ls /knowledge /other", "shell_invalid_argument", "/other"),
    ("", "invalid_command", None),
]


@pytest.mark.parametrize(("command", "code", "token"), REFUSED)
def test_refusal_table(client, space, command, code, token):
    for op in ("plan", "execute"):
        response = post(client, space, op, command)
        assert response.status_code == 400, (op, command, response.content)
        body = response.json()
        assert body["code"] == code, (op, command, body)
        if token is not None:
            assert body["details"]["token"] == token
            assert token in body["message"] or code != "shell_syntax_refused"


def test_a_command_over_4000_characters_and_bad_fs_input(client, space):
    long = post(client, space, "plan", "ls /" + "a" * 4000)
    assert (long.status_code, long.json()["code"]) == (400, "command_too_long")
    bad = post(client, space, "execute", "ls /knowledge/../x")
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_path")
    limit = post(client, space, "execute", "ls /knowledge --limit 101")
    assert (limit.status_code, limit.json()["code"]) == (400, "invalid_limit")
    member = client.post(
        f"/v1/knowledge-spaces/{space.id}/fs/shell/plan", {"cmd": "ls"}, format="json"
    )
    assert (member.status_code, member.json()["code"]) == (400, "invalid_request")


def test_every_listed_path_can_be_read_through_the_shell(client, space):
    """Headings and filenames with code spans or ``$(``: the names the filesystem lists are
    names the shell accepts (quoted), so ``ls`` → ``cat`` works on every entry."""
    text = "# The `kfs fs` command\n\nIt lists the space.\n\n## Cost $(estimate)\n\nAbout 3 ms.\n"
    admit_document(space, filename="`odd`$(name).md", data=text.encode(), enqueue=False)
    compile_all()
    tree = client.get(
        f"/v1/knowledge-spaces/{space.id}/fs/tree",
        {"path": "/knowledge/docs", "limit": 20, "depth": 3},
    )
    assert tree.status_code == 200
    files = [i["path"] for i in tree.json()["items"] if i["path"].endswith(".md")]
    assert len(files) == 2
    headings = set()
    for path in files:
        assert "`" not in path and "$(" not in path
        out = post(client, space, "execute", f"cat '{path}' | head -n 1")
        assert out.status_code == 200, out.json()
        headings.add(out.json()["output"].rstrip("\n"))
    assert headings == {"# The `kfs fs` command", "# The `kfs fs` command / Cost $(estimate)"}


@pytest.mark.parametrize("command", [5, ["ls", "/"], {"ls": "/"}, True])
def test_a_command_that_is_not_a_string_is_named_as_such(client, space, command):
    response = post(client, space, "plan", command)
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid_command"
    assert body["message"] == "command must be a string (a shell command line)"
    assert body["details"] == {"field": "command"}
