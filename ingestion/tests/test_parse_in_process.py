"""Small plain-text sources are parsed in the worker (no isolated child); everything else,
and plain text past the bound, still goes through the child, with the same report."""

from __future__ import annotations

import pytest

from ingestion.compilation import parse_step
from ingestion.compilation.errors import CompilationFailure
from ingestion.documents import admit_document
from ingestion.models import CompilationJob, Document
from ingestion.parsing import isolation
from knowledgefs.testing.fixtures import compile_all

LATIN1 = "Café crème, naïve façade.\n\nDeuxième paragraphe.".encode("latin-1")


def test_the_bound_is_plain_text_up_to_its_size():
    assert parse_step.in_process(b"x" * parse_step.IN_PROCESS_MAX_BYTES, "text/plain")
    assert parse_step.in_process(b"x", "text/plain; charset=utf-8")
    assert not parse_step.in_process(b"x" * (parse_step.IN_PROCESS_MAX_BYTES + 1), "text/plain")
    assert not parse_step.in_process(b"# x", "text/markdown")
    assert not parse_step.in_process(b"%PDF-1.7", "application/pdf")


@pytest.mark.parametrize("data", [b"Alpha.\n\nBeta.\n", LATIN1])
def test_in_process_gives_the_isolated_childs_report(data):
    here = parse_step._parse_in_process(data, "text/plain")
    there = isolation.parse_isolated(data, "text/plain")
    assert [e.text for e in here.elements] == [e.text for e in there.elements]
    assert here.parser == there.parser and here.warnings == there.warnings
    assert here.elements[0].text.startswith(("Alpha.", "Café crème"))


def test_a_parse_error_in_process_is_the_same_compilation_failure():
    with pytest.raises(CompilationFailure) as exc:
        parse_step._parse_in_process(b"", "text/plain")
    assert exc.value.code == "empty_file" and not exc.value.retryable


@pytest.mark.django_db
def test_compilation_starts_a_child_only_for_what_is_not_small_plain_text(space, monkeypatch):
    children = []
    real = isolation.parse_isolated

    def counted(data, mime_type, **kwargs):
        children.append(mime_type)
        return real(data, mime_type, **kwargs)

    monkeypatch.setattr(isolation, "parse_isolated", counted)
    big = ("A long line of plain text. " * 12_000).encode()  # about 324 KB
    admit_document(space, filename="small.txt", data=b"Alpha.\n\nBeta.\n", enqueue=False)
    admit_document(space, filename="legacy.txt", data=LATIN1, enqueue=False)
    admit_document(space, filename="big.txt", data=big, enqueue=False)
    admit_document(space, filename="notes.md", data=b"# Title\n\nBody text.\n", enqueue=False)
    compile_all()
    assert sorted(children) == ["text/markdown", "text/plain"]  # notes.md and big.txt
    assert set(Document.objects.filter(space=space).values_list("state", flat=True)) == {
        "published"
    }
    assert not CompilationJob.objects.filter(document__space=space, error_code__gt="").exists()
