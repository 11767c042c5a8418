"""``kfs`` listings and answers with the fields and pages the API has: ``kfs jobs``,
``kfs documents``, ``kfs research-tasks`` and ``kfs upgrade list`` page with
``--limit``/``--all``/``--cursor`` and print ``next_cursor``; ``kfs documents --json`` carries
``error_message``; ``kfs answer --json`` carries the SSE ``answer.done`` payload's fields
(``answerability_reasons``, ``conflicts``)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document
from knowledgefs.testing.fixtures import compile_all
from retrieval import answers
from spaces.services import Principal

pytestmark = pytest.mark.django_db


def kfs(*args: str) -> dict:
    out = StringIO()
    call_command("kfs", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def jobs_of(space, *extra: str) -> dict:
    return kfs("jobs", "--space", space.slug, "--tenant", space.tenant_id, *extra)


def test_kfs_jobs_pages_past_100_with_limit_all_and_cursor(space):
    for n in range(105):
        admit_document(space, filename=f"d{n}.txt", data=f"text {n}".encode(), enqueue=False)
    expected = [
        str(i)
        for i in CompilationJob.objects.filter(space=space)
        .order_by("-created_at", "-id")
        .values_list("id", flat=True)
    ]
    first = jobs_of(space)  # the default page of 100 now says there is more
    assert len(first["items"]) == 100 and first["next_cursor"]
    rest = jobs_of(space, "--cursor", first["next_cursor"])
    assert [j["id"] for j in first["items"] + rest["items"]] == expected
    assert rest["next_cursor"] is None
    everything = jobs_of(space, "--all")
    assert [j["id"] for j in everything["items"]] == expected and everything["next_cursor"] is None
    walked, cursor = [], None
    while True:
        page = jobs_of(space, "--limit", "40", *(("--cursor", cursor) if cursor else ()))
        walked += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert walked == expected
    text = StringIO()
    call_command("kfs", "jobs", "--space", space.slug, "--tenant", space.tenant_id, "--limit",
                 "2", stdout=text)  # fmt: skip
    # The cursor is signed with a timestamp: two calls a second apart sign the same position
    # differently, so the position (before the signature) is compared.
    position = jobs_of(space, "--limit", "2")["next_cursor"].split(":")[0]
    assert f"more: --cursor {position}:" in text.getvalue()


def test_kfs_jobs_refuses_a_bad_limit_and_a_foreign_or_changed_cursor(space, principal):
    from spaces.services import create_space

    other = create_space(principal, name="Other")
    for target in (space, other):
        for n in range(3):
            admit_document(target, filename=f"d{n}.txt", data=f"{target.id} {n}".encode(),
                           enqueue=False)  # fmt: skip
    for limit in ("0", "1001", "-3"):
        with pytest.raises(CommandError, match="invalid_limit: --limit must be an integer from 1"):
            jobs_of(space, "--limit", limit)
    cursor = jobs_of(space, "--limit", "1")["next_cursor"]
    refused = [
        ("--space", other.slug, "--cursor", cursor),  # another space
        ("--space", space.slug, "--state", "queued", "--cursor", cursor),  # another filter
        ("--space", space.slug, "--cursor", cursor[:-2] + "xx"),  # changed
    ]
    for args in refused:
        with pytest.raises(CommandError, match="invalid_cursor"):
            kfs("jobs", "--tenant", space.tenant_id, *args)
    with pytest.raises(CommandError, match="invalid_cursor"):  # another listing's cursor
        kfs("research-tasks", "--tenant", space.tenant_id, "--cursor", cursor)


def test_kfs_documents_json_has_the_error_message(space):
    admit_document(space, filename="empty.md", data=b"# \n\n   \n", enqueue=False)
    compile_all()
    document = Document.objects.get()
    assert document.state == "failed" and document.error_message
    listed = kfs("documents", "--space", space.slug, "--tenant", space.tenant_id)["items"]
    assert listed[0]["error_code"] == document.error_code
    assert listed[0]["error_message"] == document.error_message


def test_kfs_documents_pages_with_limit_all_and_cursor(space):
    for n in range(105):
        admit_document(space, filename=f"d{n}.txt", data=f"text {n}".encode(), enqueue=False)
    expected = [
        str(i) for i in Document.objects.order_by("-created_at", "-id").values_list("id", flat=True)
    ]
    args = ("documents", "--space", space.slug, "--tenant", space.tenant_id)
    first = kfs(*args)  # a page of 100, then the cursor: never an unbounded listing
    assert len(first["items"]) == 100 and first["next_cursor"]
    rest = kfs(*args, "--cursor", first["next_cursor"])
    assert [d["id"] for d in first["items"] + rest["items"]] == expected
    assert rest["next_cursor"] is None
    assert [d["id"] for d in kfs(*args, "--all")["items"]] == expected
    assert [d["id"] for d in kfs(*args, "--limit", "3")["items"]] == expected[:3]
    with pytest.raises(CommandError, match="invalid_limit"):
        kfs(*args, "--limit", "0")
    with pytest.raises(CommandError, match="invalid_cursor"):
        kfs(*args, "--cursor", jobs_of(space, "--limit", "2")["next_cursor"])
    text = StringIO()
    call_command("kfs", *args, "--limit", "2", stdout=text)
    assert f"more: --cursor {kfs(*args, '--limit', '2')['next_cursor']}" in text.getvalue()


CONFLICTING = (
    ("policy-a.md", "# Leave\n\nEvery employee gets 25 days of annual leave per year.\n"),
    ("policy-b.md", "# Leave\n\nEmployees receive 20 days of annual leave each year.\n"),
)


def test_kfs_answer_json_has_the_fields_of_the_sse_answer(space):
    for name, text in CONFLICTING:
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    question = "How many days of annual leave does an employee get?"
    run = answers.start(answers.Requester.of(Principal(tenant_id=space.tenant_id)), space,
                        question, mode="fast", top_k=2)  # fmt: skip
    name, done = answers.answer(run)
    assert name == "answer.done"
    printed = kfs("answer", question, "--space", space.slug, "--tenant", space.tenant_id,
                  "--mode", "fast", "--top-k", "2")  # fmt: skip
    assert set(done) <= set(printed)
    assert printed["answerability"] == done["answerability"] == "conflict"
    assert printed["answerability_reasons"] == done["answerability_reasons"]
    assert any("25 vs 20" in r or "20 vs 25" in r for r in printed["answerability_reasons"])
    assert [e["conflicts"] for e in printed["evidence"]] == [
        e["conflicts"] for e in done["evidence"]
    ]
    assert all(e["conflicts"] for e in printed["evidence"])
    assert set(printed["evidence"][0]) == set(done["evidence"][0])
