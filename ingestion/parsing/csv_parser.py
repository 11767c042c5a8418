"""CSV/TSV parser: delimiter detection, header rows rendered as ``header: value`` lines."""

from __future__ import annotations

import csv
import io
from collections import Counter

from .base import Element, ParseReport
from .encoding import decode_text_report
from .tables import cell_lines, render_table

DELIMITERS = ",;\t|"
ROWS_PER_ELEMENT = 20
_SAMPLE_CHARS = 64 * 1024
_SAMPLE_ROWS = 100
_MAX_TITLE_ROWS = 5
_FIELD_LIMIT = 16 * 1024 * 1024


def _score(sample: str, delimiter: str) -> tuple[float, int]:
    """(share of sampled rows having the modal column count, modal column count)."""
    reader = csv.reader(io.StringIO(sample, newline=""), delimiter=delimiter)
    counts = []
    try:
        for row in reader:
            if any(cell.strip() for cell in row):
                counts.append(len(row))
            if len(counts) >= _SAMPLE_ROWS:
                break
    except csv.Error:
        return 0.0, 0
    if not counts:
        return 0.0, 0
    mode, hits = Counter(counts).most_common(1)[0]
    return hits / len(counts), mode


def detect_delimiter(text: str) -> str:
    """Pick the delimiter among ``, ; TAB |``.

    ``csv.Sniffer`` restricted to those characters is tried first and kept when it yields a
    consistent column count > 1; otherwise the candidate giving the most consistent column
    count > 1 wins. Falls back to ``","`` (single-column data).
    """
    sample = text[:_SAMPLE_CHARS]
    if len(text) > _SAMPLE_CHARS and "\n" in sample:
        sample = sample[: sample.rindex("\n")]
    try:
        sniffed: str | None = csv.Sniffer().sniff(sample, delimiters=DELIMITERS).delimiter
    except csv.Error:
        sniffed = None
    scores = {d: _score(sample, d) for d in DELIMITERS}
    if sniffed in scores:
        share, mode = scores[sniffed]
        if mode > 1 and share >= 0.8:
            return sniffed
    valid = [
        (share, mode, -DELIMITERS.index(d), d) for d, (share, mode) in scores.items() if mode > 1
    ]
    if not valid:
        return ","
    return max(valid)[3]


def parse_csv(data: bytes) -> ParseReport:
    """Parse CSV bytes into a report (parser ``"native-csv"``) of :func:`csv_elements`, with
    the decoder's warnings (e.g. invalid UTF-8 bytes replaced).

    Raises:
        EncodingError: when the bytes are not text in a detectable encoding.
    """
    decoded = decode_text_report(data)
    return ParseReport(
        elements=csv_elements(decoded.text),
        page_count=None,
        pages_without_text=[],
        parser="native-csv",
        warnings=list(decoded.warnings),
    )


def csv_elements(text: str) -> list[Element]:
    """Split decoded CSV text into ``"table"`` elements of up to 20 rows each.

    The first row is the header (a BOM never survives into it); a few leading rows with a
    single non-empty cell (sheet titles) become ``"paragraph"`` elements. Each row renders as
    one line ``"name: widget; region: EU; units: 12"``; a quoted newline inside a cell is
    kept (the row renders on several lines, BC-06). Table metadata:
    ``{"header": [...], "rows": [[...]]}``. ``text`` is the decoded CSV text.
    """
    if not text.strip():
        return []
    delimiter = detect_delimiter(text)
    if csv.field_size_limit() < _FIELD_LIMIT:
        csv.field_size_limit(_FIELD_LIMIT)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    rows = [[cell_lines(c) for c in row] for row in reader]
    rows = [r for r in rows if any(r)]
    if not rows:
        return []
    width = Counter(len(r) for r in rows).most_common(1)[0][0]
    out: list[Element] = []
    titles = 0
    while (
        len(rows) > 1
        and width > 1
        and titles < _MAX_TITLE_ROWS
        and sum(1 for c in rows[0] if c) <= 1
    ):
        out.append(Element(type="paragraph", text=next(c for c in rows[0] if c)))
        rows.pop(0)
        titles += 1
    header = rows[0]
    body = rows[1:]
    if not body:
        text_, meta = render_table(header, [])
        out.append(Element(type="table", text=text_, metadata=meta))
        return out
    for start in range(0, len(body), ROWS_PER_ELEMENT):
        group = body[start : start + ROWS_PER_ELEMENT]
        text_, meta = render_table(header, group, with_header=start == 0)
        meta["first_row"] = start + 1
        if text_.strip():
            out.append(Element(type="table", text=text_, metadata=meta))
    return out
