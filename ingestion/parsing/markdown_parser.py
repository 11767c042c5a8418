"""Markdown parser: a small line-based block parser (CommonMark/GFM subset).

Recognised blocks: ATX and setext headings, fenced and indented code blocks, bullet and
ordered lists, GFM pipe tables, block quotes, YAML front matter, thematic breaks (dropped) and
paragraphs. Inline markup is kept verbatim.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

from .base import Element, ParseReport, SectionStack
from .encoding import decode_text_report
from .remote_refs import markdown_image_urls, unfetched_image_warnings
from .tables import render_table

_FENCE_RE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")
_ATX_RE = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT_RE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_HR_RE = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_LIST_RE = re.compile(r"^ {0,3}(?:[-*+]|\d{1,9}[.)])(?:[ \t]+\S|[ \t]*$)")
_TABLE_DELIM_RE = re.compile(r"^ {0,3}\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$")
_QUOTE_RE = re.compile(r"^ {0,3}> ?")
_CELL_SPLIT_RE = re.compile(r"(?<!\\)\|")


def _indent(line: str) -> int:
    expanded = line.expandtabs(4)
    return len(expanded) - len(expanded.lstrip(" "))


def _split_row(line: str) -> list[str]:
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    return [c.strip().replace("\\|", "|") for c in _CELL_SPLIT_RE.split(s)]


def _is_ordered(line: str) -> bool:
    return line.lstrip()[:1].isdigit()


def _starts_block(line: str) -> bool:
    """True for a non-indented line that starts a block which ends a list or quote."""
    return (
        bool(_FENCE_RE.match(line) or _ATX_RE.match(line) or _HR_RE.match(line))
        and _indent(line) < 4
    )


class _MarkdownParser:
    def __init__(self, text: str) -> None:
        self.lines = text.split("\n")
        self.out: list[Element] = []
        self.sections = SectionStack()
        self.para: list[str] = []

    def emit(self, type_: str, text: str, **kwargs: Any) -> None:
        if text.strip():
            self.out.append(
                Element(type=type_, text=text.strip(), section_path=self.sections.path, **kwargs)
            )

    def flush_para(self) -> None:
        if self.para:
            self.emit("paragraph", "\n".join(line.strip() for line in self.para))
            self.para = []

    def heading(self, level: int, text: str) -> None:
        text = " ".join(text.split())
        if not text:
            return
        self.sections.push(level, text)
        self.emit("heading", text, level=level)

    def run(self) -> list[Element]:
        lines = self.lines
        n = len(lines)
        i = self.front_matter()
        while i < n:
            line = lines[i]
            if not line.strip():
                self.flush_para()
                i += 1
                continue
            fence = _FENCE_RE.match(line)
            if fence and not (fence.group(2)[0] == "`" and "`" in fence.group(3)):
                self.flush_para()
                i = self.fenced_code(i, fence)
                continue
            atx = _ATX_RE.match(line)
            if atx:
                self.flush_para()
                self.heading(len(atx.group(1)), atx.group(2) or "")
                i += 1
                continue
            setext = _SETEXT_RE.match(line)
            if setext and self.para:
                text = " ".join(p.strip() for p in self.para)
                self.para = []
                self.heading(1 if setext.group(1)[0] == "=" else 2, text)
                i += 1
                continue
            if _HR_RE.match(line):
                self.flush_para()
                i += 1
                continue
            if (
                "|" in line
                and i + 1 < n
                and "|" in lines[i + 1]
                and _TABLE_DELIM_RE.match(lines[i + 1])
            ):
                self.flush_para()
                i = self.table(i)
                continue
            if _LIST_RE.match(line):
                self.flush_para()
                i = self.list_block(i)
                continue
            if _QUOTE_RE.match(line):
                self.flush_para()
                i = self.quote(i)
                continue
            if not self.para and _indent(line) >= 4:
                i = self.indented_code(i)
                continue
            self.para.append(line)
            i += 1
        self.flush_para()
        return self.out

    def front_matter(self) -> int:
        lines = self.lines
        if not lines or lines[0].strip() != "---":
            return 0
        for j in range(1, min(len(lines), 200)):
            if lines[j].strip() in ("---", "...") and j > 1:
                body = "\n".join(lines[1:j])
                self.emit("paragraph", body, metadata={"part": "front_matter"})
                return j + 1
        return 0

    def fenced_code(self, i: int, fence: re.Match[str]) -> int:
        indent = len(fence.group(1))
        marker = fence.group(2)
        info = fence.group(3).strip()
        body: list[str] = []
        j = i + 1
        while j < len(self.lines):
            line = self.lines[j]
            stripped = line.strip()
            if (
                _indent(line) < 4
                and stripped.startswith(marker[0] * len(marker))
                and not stripped.strip(marker[0])
            ):
                j += 1
                break
            body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
            j += 1
        meta = {"language": info.split()[0]} if info else {}
        self.emit("code", "\n".join(b.rstrip() for b in body), metadata=meta)
        return j

    def indented_code(self, i: int) -> int:
        body: list[str] = []
        j = i
        while j < len(self.lines):
            line = self.lines[j]
            if line.strip() and _indent(line) < 4:
                break
            body.append(line.expandtabs(4)[4:])
            j += 1
        self.emit("code", "\n".join(b.rstrip() for b in body))
        return j

    def table(self, i: int) -> int:
        header = _split_row(self.lines[i])
        rows: list[list[str]] = []
        j = i + 2
        while j < len(self.lines):
            line = self.lines[j]
            if not line.strip() or "|" not in line or _starts_block(line):
                break
            cells = _split_row(line)
            cells = (cells + [""] * len(header))[: len(header)]
            rows.append(cells)
            j += 1
        text, meta = render_table(header, rows)
        self.emit("table", text, metadata=meta)
        return j

    def list_block(self, i: int) -> int:
        body: list[str] = []
        j = i
        n = len(self.lines)
        ordered = _is_ordered(self.lines[i])

        def same_list_item(line: str) -> bool:
            return bool(_LIST_RE.match(line)) and _is_ordered(line) == ordered

        while j < n:
            line = self.lines[j]
            if not line.strip():
                # A blank line continues the list only if an item or indented line follows.
                k = j + 1
                while k < n and not self.lines[k].strip():
                    k += 1
                if k < n and (_indent(self.lines[k]) >= 2 or same_list_item(self.lines[k])):
                    j = k
                    continue
                break
            if (
                j > i
                and _indent(line) < 2
                and (_starts_block(line) or (_LIST_RE.match(line) and not same_list_item(line)))
            ):
                break
            fence = _FENCE_RE.match(line) if j > i else None
            if fence and not (fence.group(2)[0] == "`" and "`" in fence.group(3)):
                # A fence inside an item is a code block of its own, like one outside a list:
                # its lines are never headings and no chunk can hold half of its fence.
                if body:
                    self.emit("list", textwrap.dedent("\n".join(body)))
                    body = []
                j = self.fenced_code(j, fence)
                continue
            body.append(line.rstrip())
            j += 1
        if body:
            self.emit("list", textwrap.dedent("\n".join(body)))
        return j

    def quote(self, i: int) -> int:
        body: list[str] = []
        j = i
        while j < len(self.lines):
            line = self.lines[j]
            if not line.strip() or (j > i and _starts_block(line)):
                break
            body.append(_QUOTE_RE.sub("", line, count=1).strip())
            j += 1
        self.emit("paragraph", "\n".join(b for b in body if b), metadata={"quote": True})
        return j


def parse_markdown(data: bytes) -> ParseReport:
    """Parse Markdown bytes into heading/paragraph/list/code/table elements (parser
    ``"native-markdown"``).

    Text before the first heading is kept with ``section_path == ()``. Code fences are kept
    whole (``metadata["language"]`` from the info string) and never scanned for headings; a
    fence inside a list item is a ``"code"`` element of its own between the item's text before
    and after it, so no element holds a fence line. Images stay references (never fetched,
    :mod:`~ingestion.parsing.remote_refs`): each one is listed in the warnings, with the
    decoder's notes.

    Raises:
        EncodingError: when the bytes are not text in a detectable encoding.
    """
    decoded = decode_text_report(data)
    return ParseReport(
        elements=_MarkdownParser(decoded.text).run(),
        page_count=None,
        pages_without_text=[],
        parser="native-markdown",
        warnings=[*decoded.warnings, *unfetched_image_warnings(markdown_image_urls(decoded.text))],
    )
