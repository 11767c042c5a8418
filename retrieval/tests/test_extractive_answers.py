"""Extractive answers say what is asked, and a conflict is only the same quantity of the same
subject: sentences rejoined across wrapped lines, headings and lead-ins never the answer, values
of other settings and examples never counted as disagreement. On small generated documents, on
excerpts of this repository's docs, and on the docs themselves compiled as ``make demo`` does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ingestion.documents import admit_document
from knowledgefs.testing.fixtures import compile_all
from retrieval import answers
from retrieval import evidence as ev
from retrieval.tests.test_answers import done_of, item, open_window, run_events

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "What is the upload size limit?"

# Excerpts of docs/configuration.md and docs/api.md, as their chunks hold them.
LIMIT_ROW = (
    "| `KNOWLEDGE_UPLOAD_MAX_BYTES` | 15728640 (15 MiB) | 1 – 52428800 | per-file upload limit: "
    "the one setting behind the file check |"
)
RESERVED_ROW = (
    "| `KNOWLEDGE_BUFFERED_DOCUMENT_UPLOAD_MAX_RESERVED_BYTES` | 201326592 (192 MiB) | 1048576 – "
    "4294967296 | bytes all admitted uploads of an API process may reserve together; each "
    "reserves 3 × its bounded body |"
)
EXAMPLE = (
    "The limit is one setting, `KNOWLEDGE_UPLOAD_MAX_BYTES`: it is the file check and the body\n"
    'limit. Raising it to 30 MiB takes a 20 MiB PDF and refuses a 31 MiB one with "… upload '
    'limit of\n31457280 bytes (30 MiB)".'
)
GATE = (
    "Before the multipart body is read, the upload needs a place in the API process's gate (at\n"
    "most 2 uploads read at once and 192 MiB reserved, 3 × each body); the size limit of one\n"
    "upload is checked first."
)


def bundle_of(rows, query=QUESTION) -> ev.Bundle:
    return ev.assess(ev.pack(ev.from_retrieval(rows, query), open_window(10_000)), query=query)


def headed(node_id: str, text: str, score: float, *path: str):
    row = item(node_id, text, score)
    row.citation["section_path"] = list(path)
    return row


# --- conflicts --------------------------------------------------------------------------------


def test_other_settings_and_examples_are_no_conflict_with_the_upload_limit():
    rows = [
        item("limit", LIMIT_ROW, 0.9),
        item("reserved", RESERVED_ROW, 0.8),
        item("example", EXAMPLE, 0.7),
        item("gate", GATE, 0.6),
    ]
    bundle = bundle_of(rows)
    assert [e.conflicts for e in bundle.items] == [[], [], [], []]
    assert bundle.answerability != "conflict"


def test_the_same_setting_with_another_value_is_a_conflict():
    other = "| `KNOWLEDGE_UPLOAD_MAX_BYTES` | 20971520 (20 MiB) | per-file upload limit |"
    bundle = bundle_of([item("limit", LIMIT_ROW, 0.9), item("other", other, 0.8)])
    assert bundle.answerability == "conflict"
    assert bundle.reasons == ["15 vs 20 mib (limit, upload)"]
    # The same value in another unit of the family agrees: 15728640 bytes are 15 MiB.
    same = "The per-file upload limit is 15728640 bytes."
    agreeing = bundle_of([item("limit", LIMIT_ROW, 0.9), item("same", same, 0.8)])
    assert agreeing.answerability != "conflict"
    assert [e.conflicts for e in agreeing.items] == [[], []]
    # Another unit of the family and another value: a conflict, both units named.
    smaller = "The per-file upload limit is 10485760 bytes."
    assert bundle_of([item("l", LIMIT_ROW, 0.9), item("s", smaller, 0.8)]).reasons == [
        "15 mib vs 10485760 byte (limit, upload)"
    ]


def test_a_value_far_from_the_subject_words_is_no_conflict():
    far = (
        "The quarterly report lists 192 MiB of logs per node, which has nothing to do with how "
        "the upload size limit is configured."
    )
    bundle = bundle_of([item("limit", LIMIT_ROW, 0.9), item("far", far, 0.8)])
    assert [e.conflicts for e in bundle.items] == [[], []]


# --- sentences --------------------------------------------------------------------------------


def test_wrapped_lines_are_one_sentence_and_headings_stay_apart():
    text = (
        "Upload limits\n"
        "What happens when a file is larger than the upload limit: the upload is refused with 413\n"
        '`file_too_large`, the message names the limit (for example "file exceeds the upload '
        'limit of\n15728640 bytes (15 MiB)").\n'
        "- a list item\n"
        "- another list item"
    )
    assert answers.answer_sentences(text, ["Upload limits"]) == [
        "What happens when a file is larger than the upload limit: the upload is refused with 413 "
        '`file_too_large`, the message names the limit (for example "file exceeds the upload '
        'limit of 15728640 bytes (15 MiB)").',
        "- a list item",
        "- another list item",
    ]


def test_a_heading_or_a_lead_in_is_never_the_answer():
    rows = [
        headed("h", "Upload size limit", 0.95, "Limits", "Upload size limit"),
        headed("l", "Upload limits\nThe upload size limit, step by step:", 0.9, "Upload limits"),
        item("a", "The upload size limit is 15 MiB per file; a larger file is refused.", 0.5),
    ]
    bundle = bundle_of(rows)
    assert answers.extract(bundle, QUESTION, 3) == [
        ("The upload size limit is 15 MiB per file; a larger file is refused.", "[E3]")
    ]


def test_a_prose_answer_leads_over_a_catalogue_row_that_matches_as_well():
    catalogue = (
        "| 413 | `file_too_large` | the upload is larger than the size limit "
        "(`KNOWLEDGE_UPLOAD_MAX_BYTES`); the message names the limit |\n"
        "| 413 | `upload_reservation_too_large` | the upload alone would reserve more |"
    )
    rows = [
        item("catalogue", catalogue, 0.95),
        item("prose", "The upload size limit is 15 MiB per file.", 0.6),
    ]
    pairs = answers.extract(bundle_of(rows), QUESTION, 3)
    assert pairs[0] == ("The upload size limit is 15 MiB per file.", "[E2]"), pairs
    assert pairs[1][1] == "[E1]" and pairs[1][0].startswith("| 413 | `file_too_large`")
    # A table row alone still answers when no prose does.
    only = answers.extract(bundle_of([item("catalogue", catalogue, 0.95)]), QUESTION, 3)
    assert only and only[0][0].startswith("| 413 | `file_too_large`")


def test_a_question_for_a_quantity_is_led_by_the_sentence_that_states_one():
    health = (
        "Visible on `/health` as `uploads`: the limits of the upload gate (`max_file_bytes`, "
        "`max_body_bytes`) and its counters since start."
    )
    stated = "A larger upload is refused: the limit is 15728640 bytes (15 MiB) per file."
    rows = [item("health", health, 0.9), item("stated", stated, 0.6)]
    pairs = answers.extract(bundle_of(rows), QUESTION, 3)
    assert pairs[0] == (stated, "[E2]"), pairs


def test_the_question_in_other_words_is_no_answer():
    rows = [item("q", "What is the upload size limit?", 0.9)]
    assert answers.extract(bundle_of(rows), QUESTION, 3) == []


# --- through the answer run -------------------------------------------------------------------


@pytest.mark.django_db
def test_a_heading_only_document_is_not_the_answer_and_the_value_is(space):
    documents = {
        "limits.md": "# Upload size limit\n",
        "uploads.md": (
            "# Uploads\n\nThe upload size limit is 15 MiB per file; a larger file is refused with\n"
            "413 and nothing is stored.\n"
        ),
        "memory.md": "# Memory\n\n" + GATE + "\n",
        "example.md": "# Raising the limit\n\n" + EXAMPLE + "\n",
    }
    for name, text in documents.items():
        admit_document(space, filename=name, data=text.encode(), enqueue=False)
    compile_all()
    done = done_of(run_events(space, QUESTION, mode="fast", top_k=4))
    by_marker = {e["marker"]: e["citation"]["filename"] for e in done["evidence"]}
    assert "limits.md" in by_marker.values()  # the heading was found, and is not quoted
    assert done["answer"].startswith(
        "The upload size limit is 15 MiB per file; a larger file is refused with 413 and "
        "nothing is stored. [E"
    ), done["answer"]
    assert "Upload size limit [E" not in done["answer"]
    first = done["citations"][0]
    assert by_marker[first["marker"]] == "uploads.md"
    assert done["answerability"] == "answerable", done["answerability_reasons"]
    assert all(not e["conflicts"] for e in done["evidence"])


@pytest.mark.django_db
def test_only_a_heading_answers_nothing_and_is_partial(space):
    admit_document(space, filename="limits.md", data=b"# Upload size limit\n", enqueue=False)
    compile_all()
    done = done_of(run_events(space, QUESTION, mode="fast", top_k=3))
    assert done["answer"] == answers.NO_SENTENCE_MESSAGE
    assert done["citations"] == []
    assert done["answerability"] == "partial", done["answerability_reasons"]


@pytest.mark.django_db
def test_upload_limit_questions_on_the_repository_docs(space):
    for name in ("api.md", "configuration.md", "architecture.md"):
        admit_document(space, filename=name, data=(ROOT / "docs" / name).read_bytes(),
                       enqueue=False)  # fmt: skip
    compile_all()
    done = done_of(run_events(space, QUESTION, top_k=5))
    assert done["answerability"] == "answerable", done["answerability_reasons"]
    assert "15 MiB" in done["answer"].split(" [E")[0], done["answer"]
    done = done_of(run_events(space, "How does an uploaded document become searchable?", top_k=3))
    assert done["answerability"] in ("answerable", "partial")
    heading = "How an uploaded document becomes searchable, stage by stage"
    assert not done["answer"].startswith(heading), done["answer"]
    for sentence in done["answer"].split(" [E"):
        assert not sentence.rstrip().endswith(":")
