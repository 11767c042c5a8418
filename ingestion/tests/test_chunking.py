"""Tests of ingestion.chunking (pure Python: no Django, no database)."""

from __future__ import annotations

from pathlib import Path

import pytest

import ingestion.chunking as chunking
from ingestion.chunking import CHUNKER_VERSION, Chunk, canonical_text, chunk_elements
from ingestion.parsing import Element, ParseError, parse_with_report, sniff_mime_type
from knowledgefs.testing.fixtures import SHARED, shared_path

SENTENCE = "The quick brown fox jumps over the lazy dog near the riverbank today. "


def shared_dir() -> Path:
    """``../shared`` next to the repository root; skips the test when it is absent."""
    return shared_path()


def sample_docs() -> list[Path]:
    """The shared sample documents, or one placeholder whose test skips with the reason."""
    folder = SHARED / "data" / "sample-docs"
    return sorted(folder.iterdir()) if folder.is_dir() else [folder / "absent"]


def check_invariants(elements: list[Element], chunks: list[Chunk], target: int) -> None:
    """Offsets are exact, no empty chunks, sizes bounded, indices sequential, paths pure."""
    text, spans = canonical_text(elements)
    kept = [e for e in elements if e.text.strip()]
    assert [c.index for c in chunks] == list(range(len(chunks)))
    for chunk in chunks:
        assert chunk.text == text[chunk.start_offset : chunk.end_offset]
        assert chunk.text.strip() and chunk.text == chunk.text.strip()
        if chunk.kind == "chunk":
            assert len(chunk.text) <= target
        else:
            assert chunk.kind == "table" and len(chunk.text) <= 4 * target
        # Every element the chunk touches belongs to its section, or is an ancestor heading.
        for element, (start, end) in zip(kept, spans, strict=True):
            if start < chunk.end_offset and end > chunk.start_offset:
                path = element.section_path
                if element.type in ("heading", "title"):
                    assert chunk.section_path[: len(path)] == path
                else:
                    assert path == chunk.section_path
    # Chunks cover every non-whitespace character of every element.
    covered = set()
    for chunk in chunks:
        covered.update(range(chunk.start_offset, chunk.end_offset))
    for start, end in spans:
        assert all(i in covered for i in range(start, end) if not text[i].isspace())


def paragraphs(*items: str, path: tuple[str, ...] = ()) -> list[Element]:
    return [Element(type="paragraph", text=t, section_path=path) for t in items]


def test_version() -> None:
    assert CHUNKER_VERSION == "structure-v1"


def test_canonical_text() -> None:
    elements = [
        Element(type="paragraph", text="  one \n"),
        Element(type="paragraph", text=" \t\n"),
        Element(type="heading", text="\u3000two\u00a0", level=1),
    ]
    text, spans = canonical_text(elements)
    assert text == "one\ntwo"
    assert spans == [(0, 3), (4, 7)]
    assert canonical_text([]) == ("", [])


def test_bc11_markdown_preface_and_sections() -> None:
    md = (
        b"Intro words with PREFACE-7Q before anything.\n\n# Section A\n\nAlpha body.\n\n"
        b"## Sub\n\nSub body text.\n"
    )
    elements = parse_with_report(md, "text/markdown").elements
    chunks = chunk_elements(elements)
    check_invariants(elements, chunks, 1200)
    preface = [c for c in chunks if "PREFACE-7Q" in c.text]
    assert len(preface) == 1 and preface[0].section_path == ()
    sub = [c for c in chunks if "Sub body text." in c.text]
    assert len(sub) == 1
    assert sub[0].section_path == ("Section A", "Sub")
    assert sub[0].text.startswith("Sub\n")  # the heading text is searchable in its chunk
    alpha = next(c for c in chunks if "Alpha body." in c.text)
    assert alpha.text == "Section A\nAlpha body." and alpha.section_path == ("Section A",)


def test_heading_only_sections_prefix_descendant_chunk() -> None:
    elements = [
        Element(type="title", text="Doc Title"),
        Element(type="heading", text="A", level=1, section_path=("A",)),
        Element(type="heading", text="B", level=2, section_path=("A", "B")),
        Element(type="paragraph", text="Body of B.", section_path=("A", "B")),
        Element(type="heading", text="C", level=1, section_path=("C",)),
        Element(type="heading", text="D", level=1, section_path=("D",)),
        Element(type="paragraph", text="Body of D.", section_path=("D",)),
    ]
    chunks = chunk_elements(elements)
    check_invariants(elements, chunks, 1200)
    assert [(c.text, c.section_path) for c in chunks] == [
        ("Doc Title\nA\nB\nBody of B.", ("A", "B")),
        ("C", ("C",)),
        ("D\nBody of D.", ("D",)),
    ]


def test_packing_respects_target_and_sections() -> None:
    elements = paragraphs(*(f"Paragraph {i} " + "word " * 30 for i in range(10)), path=("S",))
    elements += paragraphs("Other section.", path=("T",))
    chunks = chunk_elements(elements, target_chars=400, overlap_chars=40)
    check_invariants(elements, chunks, 400)
    assert len(chunks) > 2
    assert chunks[-1].text == "Other section." and chunks[-1].section_path == ("T",)
    # Short elements are packed whole: no paragraph is cut when it fits.
    for chunk in chunks[:-1]:
        assert chunk.text.startswith("Paragraph") and chunk.text.endswith("word")


def test_long_element_split_with_overlap() -> None:
    long_text = SENTENCE * 60  # ~4000 chars
    elements = [
        Element(type="heading", text="Long", level=1, section_path=("Long",)),
        Element(type="paragraph", text=long_text, section_path=("Long",)),
    ]
    chunks = chunk_elements(elements, target_chars=500, overlap_chars=80)
    check_invariants(elements, chunks, 500)
    assert len(chunks) >= 8
    assert chunks[0].text.startswith("Long\nThe quick")
    text, _ = canonical_text(elements)
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        assert nxt.start_offset < prev.end_offset  # overlap present
        assert prev.end_offset - nxt.start_offset <= 80
        assert text[nxt.start_offset - 1].isspace()  # pieces start on a word
        assert prev.text.endswith(".")  # cut at a sentence end when possible


def test_overlap_zero_and_no_midword_cuts() -> None:
    words = " ".join(f"w{i:04d}" for i in range(800))
    elements = paragraphs(words)
    chunks = chunk_elements(elements, target_chars=300, overlap_chars=0)
    check_invariants(elements, chunks, 300)
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        assert nxt.start_offset >= prev.end_offset
    assert all(len(t) == 5 for c in chunks for t in c.text.split())


def test_unbreakable_word_and_cjk() -> None:
    elements = paragraphs("x" * 1000)
    chunks = chunk_elements(elements, target_chars=300, overlap_chars=30)
    check_invariants(elements, chunks, 300)
    assert len(chunks) >= 4
    cjk = "知识库搜索效果很好。" * 80
    elements = paragraphs(cjk)
    chunks = chunk_elements(elements, target_chars=200, overlap_chars=20)
    check_invariants(elements, chunks, 200)
    assert all(c.text.endswith("。") for c in chunks[:-1])


def test_tables_are_their_own_chunks() -> None:
    rows = "\n".join(f"name: item{i}; region: EU; units: {i}" for i in range(8))
    elements = [
        Element(type="heading", text="Data", level=1, section_path=("Data",)),
        Element(type="table", text=rows, section_path=("Data",)),
        Element(type="paragraph", text="After table.", section_path=("Data",)),
    ]
    chunks = chunk_elements(elements)
    check_invariants(elements, chunks, 1200)
    assert [c.kind for c in chunks] == ["table", "chunk"]
    assert chunks[0].text.startswith("Data\nname: item0")
    assert chunks[1].text == "After table."
    elements = paragraphs("Before.") + [Element(type="table", text=rows)]
    assert [c.kind for c in chunk_elements(elements)] == ["chunk", "table"]


def test_big_table_split_by_rows() -> None:
    rows = [f"name: item{i:03d}; region: EU; units: {i}" for i in range(200)]
    elements = [Element(type="table", text="\n".join(rows))]
    target = 300
    chunks = chunk_elements(elements, target_chars=target, overlap_chars=30)
    check_invariants(elements, chunks, target)
    assert len(chunks) > 1 and {c.kind for c in chunks} == {"table"}
    for chunk in chunks:
        assert len(chunk.text) <= 4 * target
        assert all(line in rows for line in chunk.text.split("\n"))  # whole rows only
    assert sum(len(c.text.split("\n")) for c in chunks) == len(rows)


def test_chunks_never_cross_a_page_boundary() -> None:
    elements = [
        Element(type="paragraph", text="Page one text.", page_number=1),
        Element(type="paragraph", text="Page two text BRAVO-PDF-222.", page_number=2),
    ]
    chunks = chunk_elements(elements)
    assert [(c.text, c.page_number) for c in chunks] == [
        ("Page one text.", 1),
        ("Page two text BRAVO-PDF-222.", 2),
    ]
    long_pages = [Element(type="paragraph", text=SENTENCE * 10, page_number=p) for p in (1, 2)]
    chunks = chunk_elements(long_pages, target_chars=300, overlap_chars=30)
    text, spans = canonical_text(long_pages)
    for chunk in chunks:
        expected = 1 if chunk.start_offset < spans[1][0] else 2
        assert chunk.page_number == expected


def test_empty_and_whitespace_elements() -> None:
    assert chunk_elements([]) == []
    assert chunk_elements(paragraphs(" ", "\n\t", "\u3000")) == []
    chunks = chunk_elements(paragraphs(" ", "real", ""))
    assert [(c.text, c.start_offset, c.end_offset) for c in chunks] == [("real", 0, 4)]


def test_deterministic() -> None:
    elements = paragraphs(*(SENTENCE * (i % 7 + 1) for i in range(40)), path=("P",))
    first = chunk_elements(elements, target_chars=350, overlap_chars=50)
    second = chunk_elements(list(elements), target_chars=350, overlap_chars=50)
    assert first == second


def test_too_many_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunking, "MAX_CHUNKS", 5)
    elements = [
        Element(type="heading", text=f"H{i}", level=1, section_path=(f"H{i}",)) for i in range(6)
    ]
    elements = [
        e
        for h in elements
        for e in (h, Element(type="paragraph", text="x", section_path=h.section_path))
    ]
    with pytest.raises(ParseError) as exc:
        chunk_elements(elements)
    assert exc.value.code == "too_many_chunks"


def test_invalid_sizes() -> None:
    with pytest.raises(ValueError):
        chunk_elements(paragraphs("x"), target_chars=0)
    with pytest.raises(ValueError):
        chunk_elements(paragraphs("x"), overlap_chars=-1)


@pytest.mark.parametrize("path", sample_docs(), ids=lambda p: p.name)
@pytest.mark.parametrize("target", [1200, 150])
def test_invariants_on_sample_docs(path: Path, target: int) -> None:
    shared_dir()
    data = path.read_bytes()
    try:
        report = parse_with_report(data, sniff_mime_type(data, path.name))
    except ParseError as exc:
        assert exc.code == "unsupported_media_type", path.name
        return
    chunks = chunk_elements(report.elements, target_chars=target, overlap_chars=target // 10)
    check_invariants(report.elements, chunks, target)
    if report.elements:
        assert chunks
    if path.suffix == ".pdf":
        assert all(c.page_number is not None for c in chunks)


def test_sample_docs_found() -> None:
    shared_dir()
    assert len(sample_docs()) >= 10
