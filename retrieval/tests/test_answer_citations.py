"""BC-51: citation markers of a streamed LLM answer, with a marker split across two deltas.

The stub generator is the Dify contract server's scripted model (``knowledgefs/testing``), which
streams the deltas a test gives it, one frame each.
"""

from __future__ import annotations

import pytest

from ingestion.documents import admit_document
from knowledgefs.testing import dify_fixtures
from knowledgefs.testing.dify_server import LLM
from knowledgefs.testing.fixtures import compile_all
from retrieval import answers
from retrieval.tests.test_answers import QUESTION, done_of, llm_space, run_events  # noqa: F401

dify_server = dify_fixtures.dify_server

BC51 = "Point A [E2]. Point B [E7]. Point C [E2][E2]. Point D [E0]."
BC51_ANSWER = "Point A [E2]. Point B. Point C [E2]. Point D."
VALID = {"[E1]", "[E2]", "[E3]"}


def normalise(pieces: list[str]) -> tuple[list[str], answers.CitationNormaliser]:
    normaliser = answers.CitationNormaliser(VALID, max_bytes=10_000)
    out = [normaliser.feed(p) for p in pieces] + [normaliser.flush()]
    return out, normaliser


def test_bc51_markers_resolve_orphans_go_and_duplicates_collapse_at_every_split():
    for cut in range(1, len(BC51)):
        out, normaliser = normalise([BC51[:cut], BC51[cut:]])
        assert "".join(out) == normaliser.answer == BC51_ANSWER, cut
        assert normaliser.cited == ["[E2]"]
        assert normaliser.orphans == ["[E7]", "[E0]"]
        for delta in out:  # a half marker is never shown
            assert not delta.rstrip().endswith(("[", "[E")), (cut, delta)
    # Character by character too.
    out, normaliser = normalise(list(BC51))
    assert "".join(out) == BC51_ANSWER and normaliser.orphans == ["[E7]", "[E0]"]
    assert all("[E" not in d or "]" in d for d in out)


THIRD = "# Parking\n\nStaff parking is free in the north garage for every employee."


@pytest.mark.django_db
def test_bc51_a_split_marker_resolves_to_the_second_evidence_item(llm_space, dify_server):  # noqa: F811
    admit_document(llm_space, filename="parking.md", data=THIRD.encode(), enqueue=False)
    compile_all()
    deltas = ["Point A [E", "2]. Point B [E7]. ", "Point C [E2][E2]. ", "Point D [E0]."]
    dify_server.llm_responder = lambda body: deltas
    events = run_events(llm_space, QUESTION, top_k=3)
    done = done_of(events)
    assert len(done["evidence"]) == 3
    streamed = [payload["delta"] for name, payload in events if name == "answer.delta"]
    assert "".join(streamed) == done["answer"] == BC51_ANSWER
    assert all(not d.rstrip().endswith(("[", "[E")) for d in streamed), streamed
    assert streamed[0] == "Point A"  # "[E" held back until "2]" arrives
    assert done["orphan_markers"] == ["[E7]", "[E0]"]
    second = done["evidence"][1]
    assert second["marker"] == "[E2]"
    assert done["citations"] == [{"marker": "[E2]", "citation": second["citation"]}]
    assert second["citation"] != done["evidence"][0]["citation"]
    assert second["citation"] != done["evidence"][2]["citation"]
    # The model was given the same numbering: [E2] is the second item in its prompt.
    user = dify_server.calls(LLM)[-1].body["prompt_messages"][1]["content"]
    assert f"[E2] ({second['citation']['filename']}" in user


def test_bc51_a_stream_ending_inside_a_marker_never_shows_half_of_it():
    out, normaliser = normalise(["Point D [E", "2"])
    assert "".join(out) == normaliser.answer == "Point D"
    assert normaliser.orphans == ["[E2"] and normaliser.cited == []
    out, normaliser = normalise(["Point D [E"])
    assert "".join(out) == "Point D" and normaliser.orphans == ["[E"]
    out, normaliser = normalise(["a list [", "x] and ["])
    assert "".join(out) == "a list [x] and ["  # brackets that are no marker stay
