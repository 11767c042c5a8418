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
  together). A table with a header is a Markdown table (header row, separator, one line per
  row); a piece that does not hold the header carries it as *context*
  (``metadata["context"]``), never in its text, because chunks stay exact slices;
  a piece of fenced code carries its fence the same way (:mod:`ingestion.chunk_metadata`);
* a chunk's ``page_number`` is the page of all its text (chunks never cross pages);
* no chunk is empty or whitespace-only; output is deterministic.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ingestion.chunk_metadata import annotate
from ingestion.parsing import Element, TooManyChunks
from ingestion.parsing.tables import header_lines, row_line_count
from ingestion.tokens import approx_tokens

CHUNKER_VERSION = "structure-v1"
MAX_CHUNKS = 20_000
TABLE_CAP_FACTOR = 4
MIN_CHUNK_TOKENS = 16
_HEADER_TYPES = frozenset({"heading", "title"})

_BLANK_LINE_RE = re.compile(r"\n[^\S\n]*\n")
_SENTENCE_RE = re.compile(r"(?:[.!?…][\"')\]’”»]*(?=\s)|[。！？])")
_NEWLINE_RE = re.compile(r"\n")
_CLAUSE_RE = re.compile(r"[，、；：]")
_SPACE_RE = re.compile(r"\s")

# Where a piece is best cut, best first: prose, and a table's rows.
_CUTS = (
    (_BLANK_LINE_RE, False),
    (_SENTENCE_RE, True),
    (_NEWLINE_RE, False),
    (_CLAUSE_RE, True),
    (_SPACE_RE, False),
)
_ROW_CUTS = ((_NEWLINE_RE, False), *(cut for cut in _CUTS if cut[0] is not _NEWLINE_RE))


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
        metadata: what the chunk holds beyond its text: a table piece
            ``{"table": {"rows": [first, last], "header": [...], "sheet": name}}`` (its data
            rows, 1-based, header excluded; ``sheet`` for spreadsheets, the page is
            ``page_number``), a piece of fenced code ``{"code": {"language": "bash"}}``; and
            ``{"context": {"insert": [[offset, text], ...]}}`` where a reader needs lines
            that are not part of the text (the header of a later table piece, the fence of a
            code piece): :func:`ingestion.chunk_metadata.reading_text`; else ``{}``.
    """

    index: int
    text: str
    start_offset: int
    end_offset: int
    page_number: int | None
    section_path: tuple[str, ...]
    kind: str
    metadata: dict = field(default_factory=dict, compare=False)


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
        # Per kept element: the rows of its table before it (tables of one section split into
        # several elements, e.g. 20 spreadsheet rows each, number their rows on).
        self.row_offsets: list[int] = []
        previous = None
        for element, start, end in self.kept:
            offset = 0
            if element.type == "table":
                first = element.metadata.get("first_row")
                if isinstance(first, int) and first > 0:
                    offset = first - 1
                elif (
                    previous is not None
                    and previous[0].type == "table"
                    and previous[0].section_path == element.section_path
                ):
                    lines = self.text.count("\n", previous[1], previous[2]) + 1
                    lines -= header_lines(previous[0].text, previous[0].metadata)
                    offset = self.row_offsets[-1] + lines
            self.row_offsets.append(offset)
            previous = (element, start, end)

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
    def find_cut(self, pos: int, limit: int, *, rows: bool = False) -> int:
        """Best end index in ``(pos, limit]`` for a piece starting at ``pos`` (``rows``: a
        table's, cut between rows first)."""
        text = self.text
        lo = pos + max(1, (limit - pos) // 2)
        order = _ROW_CUTS if rows else _CUTS
        for regex, use_end in order:
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

    def longest_within(self, pos: int, end: int, budget: int, count) -> int:
        """The largest ``e`` in ``(pos, end]`` with ``count(text[pos:e]) <= budget`` (at least
        ``pos + 1``: one grapheme is never over a budget >= 2). Exponential, then binary
        search, so each call reads about one piece's worth of text a few dozen times."""
        text = self.text
        lo, step = pos + 1, max(8, 4 * budget)
        hi = min(end, pos + step)
        while hi < end and count(text[pos:hi]) <= budget:
            lo, step = hi, step * 2
            hi = min(end, pos + step)
        if count(text[pos:hi]) <= budget:
            return hi
        while lo < hi - 1:  # count(pos:lo) <= budget < count(pos:hi)
            mid = (lo + hi) // 2
            if count(text[pos:mid]) <= budget:
                lo = mid
            else:
                hi = mid
        return lo

    def split_tokens(
        self,
        start: int,
        end: int,
        max_tokens: int,
        overlap_tokens: int,
        count,
        *,
        rows: bool = False,
    ) -> list[tuple[int, int]]:
        """Split ``[start, end)`` into pieces of at most ``max_tokens`` by ``count``, cut at the
        best separator in the second half of the room (:meth:`find_cut`), hard where there is
        none (a run without spaces, CJK without punctuation); consecutive pieces share at most
        ``overlap_tokens`` (< ``max_tokens``), so every piece starts past the previous start and
        the loop always ends. Pieces begin and end on non-whitespace; together they cover every
        non-whitespace character of the range."""
        text = self.text
        pieces: list[tuple[int, int]] = []
        pos = start
        while pos < end:
            while pos < end and text[pos].isspace():
                pos += 1
            if pos >= end:
                break
            limit = self.longest_within(pos, end, max_tokens, count)
            if limit >= end:
                stop = end
                while stop > pos and text[stop - 1].isspace():
                    stop -= 1
                pieces.append((pos, stop))
                break
            cut = self.find_cut(pos, limit, rows=rows)
            stop = cut
            while stop > pos and text[stop - 1].isspace():
                stop -= 1
            if stop <= pos:
                stop = cut = limit
            pieces.append((pos, stop))
            nxt = cut
            if overlap_tokens > 0:
                # The furthest-back start whose tail to ``stop`` fits the overlap budget.
                lo, hi = pos + 1, stop
                while lo < hi:
                    mid = (lo + hi) // 2
                    if count(text[mid:stop]) <= overlap_tokens:
                        hi = mid
                    else:
                        lo = mid + 1
                nxt = lo
                if rows and text[nxt - 1] != "\n":  # a table's overlap starts at a row
                    line = text.find("\n", nxt, stop)
                    nxt = cut if line < 0 else line + 1
                elif nxt < stop and not text[nxt - 1].isspace():
                    ws = _SPACE_RE.search(text, nxt, stop)
                    if ws is not None:
                        nxt = ws.end()
            pos = max(nxt, pos + 1)
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
    elements: Sequence[Element],
    *,
    target_chars: int = 1200,
    overlap_chars: int = 120,
    max_tokens: int | None = None,
    overlap_tokens: int = 0,
    count_tokens: Callable[[str], int] | None = None,
) -> list[Chunk]:
    """Split a document's elements into chunks over its canonical text.

    Args:
        elements: parser output in reading order (whitespace-only elements are ignored).
        target_chars: maximum size of a ``"chunk"`` in code points (tables may reach
            ``4 * target_chars``). Must be >= 16.
        overlap_chars: overlap between consecutive pieces of a split element; clamped to
            ``target_chars // 4`` so that splitting always makes progress.
        max_tokens: when given, no chunk is over this many tokens by ``count_tokens``
            (default :func:`ingestion.tokens.approx_tokens`): a longer one is split again at
            the best separator, hard where there is none, its pieces sharing at most
            ``overlap_tokens`` (which must be smaller, :func:`check_token_sizes`).

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
    check_token_sizes(max_tokens, overlap_tokens)
    overlap = min(overlap_chars, target_chars // 4)
    chunker = _Chunker(elements, target_chars, overlap)
    chunks = chunker.run()
    if max_tokens is not None:
        count = count_tokens or approx_tokens
        chunks = _within_tokens(chunker, chunks, max_tokens, overlap_tokens, count)
    return annotate(chunker, chunks)


def check_token_sizes(max_tokens: int | None, overlap_tokens: int) -> None:
    """The rule for a chunk size in tokens and its overlap: ``max_tokens`` at least
    :data:`MIN_CHUNK_TOKENS`, the overlap at least 0 and smaller than the size (an overlap as
    large as the size would never move forward). ``ValueError`` naming the rule otherwise."""
    if max_tokens is None:
        return
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise ValueError("chunk size must be an integer number of tokens")
    if max_tokens < MIN_CHUNK_TOKENS:
        raise ValueError(f"chunk size must be at least {MIN_CHUNK_TOKENS} tokens")
    if isinstance(overlap_tokens, bool) or not isinstance(overlap_tokens, int):
        raise ValueError("chunk overlap must be an integer number of tokens")
    if overlap_tokens < 0:
        raise ValueError("chunk overlap must be 0 or more tokens")
    if overlap_tokens >= max_tokens:
        raise ValueError(
            f"chunk overlap ({overlap_tokens} tokens) must be smaller than the chunk size "
            f"({max_tokens} tokens)"
        )


def _within_tokens(
    chunker: _Chunker, chunks: list[Chunk], max_tokens: int, overlap_tokens: int, count
) -> list[Chunk]:
    """Re-split every chunk over ``max_tokens`` (by ``count``) into exact slices that fit; the
    others are kept as they are. Indexes are renumbered; the chunk cap still holds."""
    if all(count(c.text) <= max_tokens for c in chunks):
        return chunks
    text = chunker.text
    # Runs of consecutive chunks over the size that overlap or touch (pieces of one long
    # element, of one section, page and kind) are split again as one span, so the pieces share
    # the token overlap and not the character overlap of the first cut.
    runs: list[tuple[Chunk, int, int, bool]] = []
    for chunk in chunks:
        over = count(chunk.text) > max_tokens
        if runs and over and runs[-1][3]:
            first, start, end, _ = runs[-1]
            joined = not text[end : chunk.start_offset].strip()
            same = (first.section_path, first.kind) == (chunk.section_path, chunk.kind)
            if same and joined and chunker.page_at(chunk.start_offset) == first.page_number:
                runs[-1] = (first, start, max(end, chunk.end_offset), True)
                continue
        runs.append((chunk, chunk.start_offset, chunk.end_offset, over))
    out: list[Chunk] = []
    for chunk, start, end, over in runs:
        if over:
            spans = chunker.split_tokens(
                start, end, max_tokens, overlap_tokens, count, rows=chunk.kind == "table"
            )
        else:
            spans = [(start, end)]
        for a, b in spans:
            if len(out) >= MAX_CHUNKS:
                raise TooManyChunks(
                    f"document produces more than {MAX_CHUNKS} chunks", code="too_many_chunks"
                )
            out.append(
                Chunk(
                    index=len(out),
                    text=text[a:b],
                    start_offset=a,
                    end_offset=b,
                    page_number=chunker.page_at(a),
                    section_path=chunk.section_path,
                    kind=chunk.kind,
                )
            )
    return out
