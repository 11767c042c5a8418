"""Chunks bounded in tokens: pathological inputs end fast, fit the size, and lose nothing (BC-37).

Each input is chunked in a child process with a 5 s timeout (a splitter that never ends is the
reported failure), chunk size 64 tokens and overlap 16 by KnowledgeFS's token approximation
(:mod:`ingestion.tokens`).
"""

from __future__ import annotations

import base64
import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ingestion.chunking import check_token_sizes, chunk_elements
from ingestion.parsing import Element
from ingestion.tokens import approx_tokens

ROOT = Path(__file__).resolve().parents[2]
SIZE, OVERLAP = 64, 16

CHILD = textwrap.dedent(
    """
    import json, sys, time
    from ingestion.chunking import chunk_elements
    from ingestion.parsing import Element
    from ingestion.tokens import approx_tokens

    spec = json.load(sys.stdin)
    elements = [Element(type=t, text=x) for t, x in spec["elements"]]
    started = time.monotonic()
    chunks = chunk_elements(
        elements, max_tokens=spec["size"], overlap_tokens=spec["overlap"]
    )
    elapsed = time.monotonic() - started
    json.dump(
        {
            "elapsed": elapsed,
            "chunks": [
                [c.start_offset, c.end_offset, c.text, approx_tokens(c.text), c.kind]
                for c in chunks
            ],
        },
        sys.stdout,
    )
    """
)


def _chunk_in_child(elements: list[tuple[str, str]]) -> dict:
    spec = json.dumps({"elements": elements, "size": SIZE, "overlap": OVERLAP})
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=spec,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=5,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _stitched(text: str, chunks: list) -> str:
    """The chunks with each one's overlap with the previous removed."""
    out, covered = [], 0
    for start, end, piece, _, _ in chunks:
        assert text[start:end] == piece  # an exact slice of the canonical text
        assert start <= covered or not text[covered:start].strip(), (covered, start)
        out.append(text[covered:end] if start <= covered else text[start:end])
        covered = max(covered, end)
    return "".join(out)


def _base64_run() -> str:
    rng = random.Random(37)
    return base64.b64encode(bytes(rng.randrange(256) for _ in range(3750))).decode()[:5000]


def _cjk_run() -> str:
    rng = random.Random(37)
    return "".join(chr(rng.randrange(0x4E00, 0x9FA5)) for _ in range(10_000))


def _table() -> str:
    rng = random.Random(37)
    long_cell = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(3000))
    return "\n".join(
        [
            "| Depot | Units | Remark |",
            "| --- | --- | --- |",
            "| D-001 | 120 | checked |",
            f"| D-002 | 7,310 | {long_cell} |",
            "| D-003 | 55 | 已盘点？是。 |",
        ]
    )


@pytest.mark.parametrize(
    ("case", "kind", "make"),
    [("a", "paragraph", _base64_run), ("b", "table", _table), ("c", "paragraph", _cjk_run)],
)
def test_bc37_pathological_inputs_end_fast_fit_the_size_and_lose_nothing(case, kind, make):
    text = make()
    result = _chunk_in_child([(kind, text)])
    assert result["elapsed"] < 2.0, result["elapsed"]
    chunks = result["chunks"]
    assert len(chunks) > 1
    assert max(tokens for *_, tokens, _ in chunks) <= SIZE, [c[3] for c in chunks]
    # Without whitespace there is nothing a piece may drop: the stitched chunks are the input.
    assert _stitched(text, chunks) == text
    assert all(k == ("table" if kind == "table" else "chunk") for *_, k in chunks)


def test_bc37_pieces_overlap_by_at_most_the_overlap_and_always_move_forward():
    text = _base64_run()
    chunks = chunk_elements([Element("paragraph", text)], max_tokens=SIZE, overlap_tokens=OVERLAP)
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert after.start_offset > before.start_offset
        shared = text[after.start_offset : before.end_offset]
        assert approx_tokens(shared) <= OVERLAP
        assert shared  # the overlap is kept: a hard cut still shares context


def test_bc37_prose_is_cut_at_separators_and_whitespace_only_is_left_out():
    text = " ".join(f"Sentence {n} tells of tides and cranes at the harbour." for n in range(80))
    chunks = chunk_elements([Element("paragraph", text)], max_tokens=SIZE, overlap_tokens=OVERLAP)
    assert max(approx_tokens(c.text) for c in chunks) <= SIZE
    assert all(c.text == text[c.start_offset : c.end_offset] for c in chunks)
    assert all(c.text.endswith(".") for c in chunks[:-1])  # sentence ends, not mid-word
    stitched = _stitched(text, [[c.start_offset, c.end_offset, c.text, 0, c.kind] for c in chunks])
    assert stitched.split() == text.split()


@pytest.mark.parametrize(
    ("size", "overlap", "says"),
    [
        (64, 64, "chunk overlap (64 tokens) must be smaller than the chunk size (64 tokens)"),
        (64, 80, "must be smaller than the chunk size"),
        (8, 0, "chunk size must be at least 16 tokens"),
        (64, -1, "chunk overlap must be 0 or more tokens"),
    ],
)
def test_bc37_an_overlap_as_large_as_the_size_is_refused(size, overlap, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        check_token_sizes(size, overlap)
    with pytest.raises(ValueError):
        chunk_elements([Element("paragraph", "text")], max_tokens=size, overlap_tokens=overlap)


# --- (d) the space's setting ----------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("chunking", "says"),
    [
        ({"chunk_size_tokens": 64, "chunk_overlap_tokens": 64}, "must be smaller than"),
        ({"chunk_size_tokens": 64, "chunk_overlap_tokens": 80}, "must be smaller than"),
        ({"chunk_size_tokens": 8}, "chunk_size_tokens must be between 16 and 8192"),
        ({"chunk_size_tokens": "64"}, "chunk_size_tokens must be an integer"),
        ({"chunk_size": 64}, "unknown member 'chunk_size'"),
        ([64, 16], "must be an object or null"),
    ],
)
def test_bc37_an_overlap_as_large_as_the_size_is_refused_when_saved(client, space, chunking, says):
    before = client.get(f"/v1/knowledge-spaces/{space.id}").json()
    answer = client.patch(f"/v1/knowledge-spaces/{space.id}", {"chunking": chunking}, format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["code"] == "invalid_chunking"
    assert says in answer.json()["message"] and "chunking" in answer.json()["message"]
    after = client.get(f"/v1/knowledge-spaces/{space.id}").json()
    assert (after["revision"], after["chunking"]) == (before["revision"], None)


@pytest.mark.django_db
def test_bc37_a_space_chunked_at_64_tokens_stores_chunks_of_at_most_64(client, space):
    from ingestion.models import KnowledgeNode
    from knowledgefs.testing.fixtures import compile_all, upload

    chosen = {"chunk_size_tokens": SIZE, "chunk_overlap_tokens": OVERLAP}
    answer = client.patch(f"/v1/knowledge-spaces/{space.id}", {"chunking": chosen}, format="json")
    assert answer.status_code == 200 and answer.json()["chunking"] == chosen, answer.content
    text = _base64_run() + "\n\n" + _cjk_run()[:3000]
    assert upload(client, space, "runs.txt", text.encode()).status_code == 202
    assert compile_all() == 1
    nodes = list(KnowledgeNode.objects.filter(space=space))
    assert len(nodes) > 2 * 5000 // (4 * SIZE)
    assert max(approx_tokens(n.text) for n in nodes) <= SIZE
    # Back to the deployment's chunking.
    cleared = client.patch(f"/v1/knowledge-spaces/{space.id}", {"chunking": None}, format="json")
    assert cleared.status_code == 200 and cleared.json()["chunking"] is None
