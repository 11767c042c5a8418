"""Structure-aware chunking of parsed elements (pure Python, no Django).

The canonical text of a document is its elements' stripped texts joined by ``"\\n"``; every
chunk is an exact slice ``canonical[start_offset:end_offset]`` of it, so offsets can be used
for highlighting and citations.

Rules (``target_chars``/``overlap_chars`` are counted in Python ``str`` code points):

* a chunk never mixes content of two different section paths, nor of two pages. A run of
  headings with no content of their own (e.g. ``# A`` directly followed by ``## Sub``) is
  prepended to the first chunk of the following descendant section, so heading text always
  starts the chunk that follows it, and the chunk carries the deeper section path;
* consecutive elements of one section are packed up to ``target_chars``;
* an element longer than ``target_chars`` is split at paragraph/sentence/whitespace
  boundaries (mid-word only when a single word is longer than the target), consecutive
  pieces overlapping by about ``overlap_chars``;
* tables are their own chunks (``kind="table"``), kept whole up to ``4 * target_chars`` and
  split between rows beyond that (the lines of a row whose cells hold line breaks stay
  together). Rows render as ``header: value`` pairs, so every piece is
  self-describing; header lines are not repeated because chunks must stay exact slices;
* a chunk's ``page_number`` is the page of all its text (chunks never cross pages);
* no chunk is empty or whitespace-only; output is deterministic.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from ingestion.parsing import Element, TooManyChunks
from ingestion.parsing.tables import row_line_count

CHUNKER_VERSION = "structure-v1"
MAX_CHUNKS = 20_000
TABLE_CAP_FACTOR = 4
_HEADER_TYPES = frozenset({"heading", "title"})

_BLANK_LINE_RE = re.compile(r"\n[^\S\n]*\n")
_SENTENCE_RE = re.compile(r"(?:[.!?…][\"')\]’”»]*(?=\s)|[。！？])")
_NEWLINE_RE = re.compile(r"\n")
_CLAUSE_RE = re.compile(r"[，、；：]")
_SPACE_RE = re.compile(r"\s")


@dataclass(frozen=True)
class Chunk:
    """One retrieval unit.

    Attributes:
        index: 0-based position in the document's chunk list.
        text: the chunk text; always ``canonical[start_offset:end_offset]``.
        start_offset, end_offset: half-open range in code points into the canonical text.
        page_number: page of the element the chunk starts in (PDFs), else ``None``.
        section_path: headings enclosing the chunk's content, outermost first.
        kind: ``"chunk"`` for prose/lists/code, ``"table"`` for table pieces.
    """

    index: int
    text: str
    start_offset: int
    end_offset: int
    page_number: int | None
    section_path: tuple[str, ...]
    kind: str


def _kept(elements: Sequence[Element]) -> tuple[str, list[tuple[Element, int, int]]]:
    parts: list[str] = []
    kept: list[tuple[Element, int, int]] = []
    pos = 0
    for element in elements:
        text = element.text.strip()
        if not text:
            continue
        if parts:
            pos += 1
        kept.append((element, pos, pos + len(text)))
        parts.append(text)
        pos += len(text)
    return "\n".join(parts), kept


def canonical_text(elements: Sequence[Element]) -> tuple[str, list[tuple[int, int]]]:
    """Build the canonical text of a document.

    Each element's text is stripped of surrounding Unicode whitespace; the non-empty ones are
    joined with a single ``"\\n"``.

    Returns:
        ``(text, spans)`` where ``spans[i]`` is the half-open ``(start, end)`` range of the
        i-th *kept* (non-empty) element in ``text``.
    """
    text, kept = _kept(elements)
    return text, [(start, end) for _, start, end in kept]


class _Chunker:
    def __init__(self, elements: Sequence[Element], target: int, overlap: int) -> None:
        self.text, self.kept = _kept(elements)
        self.starts = [start for _, start, _ in self.kept]
        self.target = target
        self.overlap = overlap
        self.table_cap = TABLE_CAP_FACTOR * target
        self.chunks: list[Chunk] = []

    # -- output -------------------------------------------------------------------------
    def page_at(self, offset: int) -> int | None:
        idx = bisect_right(self.starts, offset) - 1
        return self.kept[max(idx, 0)][0].page_number

    def add(self, start: int, end: int, path: tuple[str, ...], kind: str) -> None:
        if end <= start or not self.text[start:end].strip():
            return
        if len(self.chunks) >= MAX_CHUNKS:
            raise TooManyChunks(
                f"document produces more than {MAX_CHUNKS} chunks", code="too_many_chunks"
            )
        self.chunks.append(
            Chunk(
                index=len(self.chunks),
                text=self.text[start:end],
                start_offset=start,
                end_offset=end,
                page_number=self.page_at(start),
                section_path=path,
                kind=kind,
            )
        )

    # -- splitting ----------------------------------------------------------------------
    def find_cut(self, pos: int, limit: int) -> int:
        """Best end index in ``(pos, limit]`` for a piece starting at ``pos``."""
        text = self.text
        lo = pos + max(1, (limit - pos) // 2)
        for regex, use_end in (
            (_BLANK_LINE_RE, False),
            (_SENTENCE_RE, True),
            (_NEWLINE_RE, False),
            (_CLAUSE_RE, True),
            (_SPACE_RE, False),
        ):
            best = -1
            for m in regex.finditer(text, lo, min(limit + 1, len(text))):
                cut = m.end() if use_end else m.start()
                if lo <= cut <= limit:
                    best = cut
            if best > pos:
                return best
        return limit

    def split(self, start: int, end: int, size: int, overlap: int) -> list[tuple[int, int]]:
        """Split ``[start, end)`` into pieces of at most ``size`` code points, each
        beginning and ending on non-whitespace, consecutive pieces sharing ~``overlap``."""
        text = self.text
        pieces: list[tuple[int, int]] = []
        pos = start
        while end - pos > size:
            cut = self.find_cut(pos, pos + size)
            stop = cut
            while stop > pos and text[stop - 1].isspace():
                stop -= 1
            if stop <= pos:
                stop = cut = pos + size
            pieces.append((pos, stop))
            nxt = cut
            if overlap > 0:
                nxt = max(stop - overlap, pos + 1)
                if not text[nxt - 1].isspace():
                    ws = _SPACE_RE.search(text, nxt, stop)
                    if ws is not None:
                        nxt = ws.end()
            while nxt < end and text[nxt].isspace():
                nxt += 1
            pos = max(nxt, pos + 1)
        if pos < end:
            pieces.append((pos, end))
        return pieces

    # -- packing ------------------------------------------------------------------------
    def emit_split(self, start: int, end: int, path: tuple[str, ...]) -> None:
        for a, b in self.split(start, end, self.target, self.overlap):
            self.add(a, b, path, "chunk")

    def emit_table(
        self, start: int, end: int, path: tuple[str, ...], element: Element | None = None
    ) -> None:
        if end - start <= self.table_cap:
            self.add(start, end, path, "table")
            return
        lines = self.row_spans(start, end, element)
        piece: tuple[int, int] | None = None
        for a, b in lines:
            if b - a > self.table_cap:
                if piece:
                    self.add(*piece, path, "table")
                    piece = None
                for pa, pb in self.split(a, b, self.table_cap, self.overlap):
                    self.add(pa, pb, path, "table")
            elif piece and b - piece[0] <= self.table_cap:
                piece = (piece[0], b)
            else:
                if piece:
                    self.add(*piece, path, "table")
                piece = (a, b)
        if piece:
            self.add(*piece, path, "table")

    def row_spans(self, start: int, end: int, element: Element | None) -> list[tuple[int, int]]:
        """``(start, end)`` of each non-blank line of ``[start, end)``; the lines of one table
        row whose cells hold line breaks (``metadata["rows"]``) are kept together."""
        lines = self.line_spans(start, end)
        rows = (element.metadata or {}).get("rows") if element is not None else None
        if not rows:
            return lines
        counts = [row_line_count(r) for r in rows if any(str(c).strip() for c in r)]
        extra = len(lines) - sum(counts)  # heading lines carried in front of the table
        if extra < 0 or all(n == 1 for n in counts):
            return lines
        spans = lines[:extra]
        pos = extra
        for n in counts:
            spans.append((lines[pos][0], lines[pos + n - 1][1]))
            pos += n
        return spans

    def line_spans(self, start: int, end: int) -> list[tuple[int, int]]:
        text = self.text
        lines: list[tuple[int, int]] = []
        pos = start
        while pos < end:
            nl = text.find("\n", pos, end)
            stop = end if nl < 0 else nl
            a, b = pos, stop
            while a < b and text[a].isspace():
                a += 1
            while b > a and text[b - 1].isspace():
                b -= 1
            if b > a:
                lines.append((a, b))
            pos = stop + 1
        return lines

    def pack_group(
        self,
        items: list[tuple[Element, int, int]],
        path: tuple[str, ...],
        prefix: tuple[int, int] | None,
    ) -> None:
        target = self.target
        cur: list[int] | None = list(prefix) if prefix else None
        headers_only = prefix is not None
        for element, s, e in items:
            if element.type == "table":
                if cur is not None and headers_only:
                    span_start = cur[0]
                else:
                    if cur is not None:
                        self.add(cur[0], cur[1], path, "chunk")
                    span_start = s
                cur = None
                self.emit_table(span_start, e, path, element)
                continue
            is_header = element.type in _HEADER_TYPES
            if cur is not None and e - cur[0] <= target:
                cur[1] = e
                headers_only = headers_only and is_header
                continue
            if e - s <= target:
                if cur is not None:
                    self.add(cur[0], cur[1], path, "chunk")
                cur = [s, e]
                headers_only = is_header
                continue
            # A long element: split it, starting with the pending text when that is short.
            if cur is not None and (headers_only or cur[1] - cur[0] < target // 2):
                span_start = cur[0]
            else:
                if cur is not None:
                    self.add(cur[0], cur[1], path, "chunk")
                span_start = s
            pieces = self.split(span_start, e, target, self.overlap)
            for a, b in pieces[:-1]:
                self.add(a, b, path, "chunk")
            cur = list(pieces[-1])
            headers_only = False
        if cur is not None:
            self.add(cur[0], cur[1], path, "chunk")

    def run(self) -> list[Chunk]:
        # A chunk never crosses a section boundary nor a page boundary, so that its citation's
        # section path and page number hold for every character of it.
        groups: list[tuple[tuple, list[tuple[Element, int, int]]]] = []
        for item in self.kept:
            key = (tuple(item[0].section_path), item[0].page_number)
            if groups and groups[-1][0] == key:
                groups[-1][1].append(item)
            else:
                groups.append((key, [item]))
        carry: tuple[int, int, tuple[str, ...]] | None = None  # pending heading-only text
        limit = self.target // 2
        for (path, _page), items in groups:
            g_start, g_end = items[0][1], items[-1][2]
            heading_only = all(el.type in _HEADER_TYPES for el, _, _ in items)
            fits = carry is not None and path[: len(carry[2])] == carry[2]
            if heading_only:
                if carry is not None and fits and g_end - carry[0] <= limit:
                    carry = (carry[0], g_end, path)
                    continue
                if carry is not None:
                    self.emit_split(carry[0], carry[1], carry[2])
                carry = (g_start, g_end, path)
                continue
            prefix = None
            if carry is not None:
                if fits and carry[1] - carry[0] <= limit:
                    prefix = (carry[0], carry[1])
                else:
                    self.emit_split(carry[0], carry[1], carry[2])
                carry = None
            self.pack_group(items, path, prefix)
        if carry is not None:
            self.emit_split(carry[0], carry[1], carry[2])
        return self.chunks


def chunk_elements(
    elements: Sequence[Element], *, target_chars: int = 1200, overlap_chars: int = 120
) -> list[Chunk]:
    """Split a document's elements into chunks over its canonical text.

    Args:
        elements: parser output in reading order (whitespace-only elements are ignored).
        target_chars: maximum size of a ``"chunk"`` in code points (tables may reach
            ``4 * target_chars``). Must be >= 16.
        overlap_chars: overlap between consecutive pieces of a split element; clamped to
            ``target_chars // 4`` so that splitting always makes progress.

    Returns:
        Chunks in document order, ``index`` 0..n-1, each satisfying
        ``chunk.text == canonical_text(elements)[0][chunk.start_offset:chunk.end_offset]``.

    Raises:
        TooManyChunks: (a ``ParseError`` with code ``"too_many_chunks"``) beyond
            :data:`MAX_CHUNKS` chunks.
        ValueError: invalid sizes.
    """
    if target_chars < 16:
        raise ValueError("target_chars must be >= 16")
    if overlap_chars < 0:
        raise ValueError("overlap_chars must be >= 0")
    overlap = min(overlap_chars, target_chars // 4)
    return _Chunker(elements, target_chars, overlap).run()
