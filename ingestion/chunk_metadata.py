"""What a chunk holds beyond its text (pure Python, no Django): a table piece's rows, header and
sheet, a code piece's language, and the *context* a reader needs around the text.

A chunk's text is always an exact slice of the canonical text (citations and offsets point at
it). Some pieces do not read right alone: a later piece of a long table starts with a data row
(case BC-38), and fenced code is kept without its fence lines (the parser drops them, case
BC-39), so a piece of code reads as prose. Their metadata carries
``{"context": {"insert": [[offset, text], ...]}}``: lines to insert at offsets of the chunk's
text (ascending): the table's Markdown header row and separator at 0, the code's opening fence
(with its info string) where its code starts in the chunk and the closing fence where it ends.
:func:`reading_text` applies them; what is cited stays the slice.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import replace

from ingestion.parsing.tables import header_block, header_lines

_BACKTICKS_RE = re.compile(r"^\s*(`{3,})", re.MULTILINE)


def reading_text(text: str, metadata: dict | None) -> str:
    """``text`` with its context inserted: what a reader of the chunk alone is shown."""
    inserts = ((metadata or {}).get("context") or {}).get("insert") or []
    out, pos = [], 0
    for offset, extra in sorted(inserts, key=lambda item: item[0]):
        offset = min(max(int(offset), pos), len(text))
        out += [text[pos:offset], extra]
        pos = offset
    out.append(text[pos:])
    return "".join(out)


def fence_for(code: str, language: str | None) -> tuple[str, str]:
    """``(opening line, closing line)`` of a backtick fence that ``code`` cannot close early
    (longer than any backtick run starting one of its lines)."""
    longest = max((len(m) for m in _BACKTICKS_RE.findall(code)), default=2)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language or ''}", fence


def annotate(chunker, chunks: list) -> list:
    """Each chunk with its ``metadata`` (table rows and sheet, code language, context)."""
    text, kept, starts = chunker.text, chunker.kept, chunker.starts
    out = []
    for chunk in chunks:
        a, b = chunk.start_offset, chunk.end_offset
        first_i = max(bisect_right(starts, a) - 1, 0)
        last_i = max(bisect_right(starts, b - 1) - 1, 0)
        inside = [
            (i, *kept[i]) for i in range(first_i, last_i + 1) if kept[i][1] < b and kept[i][2] > a
        ]
        meta: dict = {}
        tables = [item for item in inside if item[1].type == "table"]
        if chunk.kind == "table" and tables:
            meta.update(_table(chunker, tables, a, b))
        code = [item for item in inside if item[1].type == "code"]
        if code:
            language = code[0][1].metadata.get("language")
            meta["code"] = {"language": language} if language else {}
            inserts = list(meta.get("context", {}).get("insert", []))
            for _, element, start, end in code:
                opening, closing = fence_for(text[start:end], element.metadata.get("language"))
                # The fence opens where the code starts in this piece and closes where it ends.
                inserts.append([max(start, a) - a, opening + "\n"])
                inserts.append([min(end, b) - a, "\n" + closing])
            meta["context"] = {"insert": inserts}
        out.append(replace(chunk, metadata=meta) if meta else chunk)
    return out


def _data_row(chunker, i: int, start: int, pos: int, skip: int) -> int:
    """The 1-based data row of the table element ``i`` (starting at ``start``) at ``pos``."""
    line = chunker.text.count("\n", start, max(pos, start))
    return chunker.row_offsets[i] + max(line - skip, 0) + 1


def _table(chunker, tables: list, a: int, b: int) -> dict:
    text = chunker.text
    i, element, start, _ = tables[0]
    metadata = element.metadata or {}
    lines = header_lines(element.text, metadata)
    first = _data_row(chunker, i, start, a, lines)
    j, last_element, start_last, end_last = tables[-1]
    last_char = min(b, end_last) - 1
    last_lines = header_lines(last_element.text, last_element.metadata)
    last = _data_row(chunker, j, start_last, last_char, last_lines)
    table: dict = {"rows": [first, last]}
    out: dict = {"table": table}
    header = metadata.get("header")
    if header:
        table["header"] = list(header)
        # The header's lines end where the element's third line begins.
        header_end = start
        for _ in range(lines):
            header_end = text.find("\n", header_end, b) + 1 or b
        holds_header = lines and a <= start and header_end <= b
        if not holds_header:
            width = max([len(header)] + [len(r) for r in metadata.get("rows") or []])
            used = [
                k
                for k in range(width)
                if any(
                    k < len(r) and str(r[k]).strip()
                    for r in [*(metadata.get("rows") or []), header]
                )
            ]
            named = [header[k] if k < len(header) else "" for k in used]
            out["context"] = {"insert": [[0, header_block(named) + "\n"]]}
    if metadata.get("sheet"):
        table["sheet"] = metadata["sheet"]
    return out
