"""Legacy Word (DOC) and PowerPoint (PPT) binary files.

DOC: Debian's ``antiword`` (GPL-2, run as a separate program, never linked) converts Word
97-2003 files to UTF-8 text with tables as ``|cell|cell|`` lines, which become table elements
with every column position; Word 6/95 files it refuses are read by ``catdoc`` (same licence,
same package family). Both run inside the parser child in their own process group with a
deadline, on a copy of the bytes in a private temporary folder, and die with the parser.

PPT: ``catppt`` reads only the outline text list and misses text boxes (and finds nothing in
files written by LibreOffice), so the "PowerPoint Document" stream is read here with olefile
(the OLE2 container library the MSG parser uses): the record tree of [MS-PPT] is walked and
the text atoms (``TextCharsAtom`` UTF-16, ``TextBytesAtom`` 8-bit) of every slide container
are the slide's text, those of notes containers its speaker notes.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import struct
import subprocess
import tempfile

import olefile

from .base import Element, ParseReport, collapse_ws
from .errors import CorruptDocument, EncryptedDocument, ParseError
from .rasterize import _die_with_parent, kill_group, reap_group
from .tables import render_table
from .xlsx_parser import looks_like_header

#: Seconds one converter run may take; bytes of text it may print.
CONVERTER_TIMEOUT_S = 60
MAX_OUTPUT_BYTES = 64 * 1024 * 1024
_FIB_ENCRYPTED = 0x0100  # FibBase flags (offset 10): fEncrypted

# [MS-PPT] record types
_RT_SLIDE, _RT_SLIDE_ATOM, _RT_NOTES, _RT_NOTES_ATOM = 0x03EE, 0x03EF, 0x03F0, 0x03F1
_RT_SLIDE_LIST, _RT_SLIDE_PERSIST = 0x0FF0, 0x03F3
_RT_TEXT_CHARS, _RT_TEXT_BYTES = 0x0FA0, 0x0FA8
_RT_CRYPT_SESSION = 0x2F14
# OfficeArt records of the slide drawing: a group, a shape, a child anchor, the tertiary
# property table (its property 0x03A0, tableProperties, marks a group that is a table)
_RT_GROUP, _RT_SHAPE, _RT_CHILD_ANCHOR, _RT_TERTIARY_OPT = 0xF003, 0xF004, 0xF00F, 0xF122
_RT_TEXT_BOX = 0xF00D  # OfficeArtClientTextbox
_PROP_TABLE = 0x03A0
_MAX_DEPTH = 32


class ConverterUnavailable(ParseError):
    """The program that reads a legacy format is not installed on this server."""

    code = "converter_unavailable"


def _ole(data: bytes, label: str) -> olefile.OleFileIO:
    try:
        return olefile.OleFileIO(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - olefile raises OSError and assorted others
        raise CorruptDocument(f"corrupt or unreadable {label}") from exc


def _run(program: str, args: list[str], data: bytes, label: str) -> tuple[int, str]:
    """Run ``program args <file>`` on a private copy of ``data``; returns (exit code, text)."""
    path = shutil.which(program)
    if path is None:
        raise ConverterUnavailable(
            f"{label} documents cannot be read: {program} is not installed on this server"
        )
    with tempfile.TemporaryDirectory(prefix="kfs-legacy-") as tmp:
        source = os.path.join(tmp, "document")
        with open(source, "wb") as fh:
            fh.write(data)
        with tempfile.TemporaryFile(dir=tmp) as out:
            proc = subprocess.Popen(
                [path, *args, source], stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.DEVNULL, cwd=tmp, process_group=0, close_fds=True,
                preexec_fn=_die_with_parent,
            )  # fmt: skip
            try:
                code = proc.wait(timeout=CONVERTER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                kill_group(proc.pid)
                proc.wait()
                reap_group(proc.pid)
                raise ParseError(
                    f"reading the {label} document timed out after {CONVERTER_TIMEOUT_S} s",
                    code="parser_timeout",
                ) from None
            except BaseException:
                kill_group(proc.pid)
                proc.wait()
                raise
            out.seek(0)
            text = out.read(MAX_OUTPUT_BYTES).decode("utf-8", "replace")
    return code, text


def _is_row(line: str) -> bool:
    stripped = line.strip()
    return len(stripped) > 1 and stripped.startswith("|") and stripped.endswith("|")


def text_elements(text: str) -> list[Element]:
    """Paragraphs (blank-line separated) and tables (runs of ``|a|b|`` lines, a blank cell
    kept in its column) of a converter's text output."""
    out: list[Element] = []
    lines: list[str] = []
    rows: list[list[str]] = []

    def flush_paragraph() -> None:
        joined = "\n".join(lines).strip()
        if joined:
            out.append(Element(type="paragraph", text=joined))
        lines.clear()

    def flush_table() -> None:
        body = [r for r in rows if any(r)]
        if body:
            width = max(len(r) for r in body)
            body = [r + [""] * (width - len(r)) for r in body]
            header = len(body) > 1 and looks_like_header(body[0], body[1:])
            rendered = render_table(body[0], body[1:]) if header else render_table(None, body)
            out.append(Element(type="table", text=rendered[0], metadata=rendered[1]))
        rows.clear()

    for line in text.replace("\r\n", "\n").replace("\f", "\n").split("\n"):
        if _is_row(line):
            flush_paragraph()
            rows.append([collapse_ws(c) for c in line.strip()[1:-1].split("|")])
        elif line.strip():
            flush_table()
            lines.append(line.strip())
        else:
            flush_paragraph()
            flush_table()
    flush_paragraph()
    flush_table()
    return out


def parse_doc(data: bytes) -> ParseReport:
    """Parse a legacy Word document: paragraphs and tables (see :func:`text_elements`).

    Raises:
        EncryptedDocument: (code ``encrypted_document``) a password-protected document.
        ConverterUnavailable: (code ``converter_unavailable``) antiword is not installed.
        CorruptDocument: "corrupt or unreadable DOC".
    """
    with _ole(data, "DOC") as ole:
        if not ole.exists("WordDocument"):
            raise CorruptDocument("corrupt or unreadable DOC: no WordDocument stream")
        fib = ole.openstream("WordDocument").read(32)
    if len(fib) < 12:
        raise CorruptDocument("corrupt or unreadable DOC: the file information block is cut")
    if struct.unpack_from("<H", fib, 10)[0] & _FIB_ENCRYPTED:
        raise EncryptedDocument("encrypted DOC, password required")
    code, text = _run("antiword", ["-m", "UTF-8.txt", "-w", "0"], data, "DOC")
    parser = "antiword"
    if code != 0 or not text.strip():
        code, text = _run("catdoc", ["-d", "utf-8", "-w"], data, "DOC")
        parser = "catdoc"
    if code != 0:
        raise CorruptDocument("corrupt or unreadable DOC")
    return ParseReport(
        elements=text_elements(text), page_count=None, pages_without_text=[], parser=parser
    )


def _records(buf: bytes, start: int, end: int, depth: int = 0):
    """``(type, instance, body_start, body_end, depth)`` of the records in ``buf[start:end]``,
    containers (version 0xF) followed by their children."""
    offset = start
    while offset + 8 <= end:
        ver_inst, kind, length = struct.unpack_from("<HHI", buf, offset)
        body = offset + 8
        stop = min(body + length, end)
        yield kind, ver_inst >> 4, body, stop, depth
        if ver_inst & 0xF == 0xF and depth < _MAX_DEPTH:
            yield from _records(buf, body, stop, depth + 1)
        offset = body + length


def _atom_text(buf: bytes, kind: int, body: int, stop: int) -> str:
    raw = buf[body:stop]
    text = raw.decode("utf-16-le", "replace") if kind == _RT_TEXT_CHARS else raw.decode("cp1252")
    return text.replace("\r", "\n").replace("\x0b", "\n")


class _Group:
    """A drawing group being read; when it is a table, its cells' anchors and texts."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.table = False
        self.cells: list[list] = []  # [anchor (left, top) or None, texts, has a text box]

    def grid(self) -> list[list[str]] | None:
        """The cells on the grid their anchors form (rows by top edge, columns by left edge),
        a blank cell kept; ``None`` when a cell has no anchor."""
        # The first shape of a group is the group's own; shapes without a text box are the
        # table's border lines.
        cells = [(anchor, texts) for anchor, texts, box in self.cells[1:] if box]
        if not cells or any(anchor is None for anchor, _ in cells):
            return None
        tops = sorted({anchor[1] for anchor, _ in cells})
        lefts = sorted({anchor[0] for anchor, _ in cells})
        rows = [[""] * len(lefts) for _ in tops]
        for (left, top), texts in cells:
            rows[tops.index(top)][lefts.index(left)] = collapse_ws(" ".join(texts))
        return rows


def _has_table_property(buf: bytes, instance: int, body: int, stop: int) -> bool:
    for n in range(min(instance, (stop - body) // 6)):
        if struct.unpack_from("<H", buf, body + 6 * n)[0] & 0x3FFF == _PROP_TABLE:
            return True
    return False


def _table_element(rows: list[list[str]], number: int) -> Element | None:
    rows = [r for r in rows if any(r)]
    if not rows:
        return None
    header = len(rows) > 1 and looks_like_header(rows[0], rows[1:])
    text, meta = render_table(rows[0], rows[1:]) if header else render_table(None, rows)
    return Element(type="table", text=text, page_number=number, metadata=meta)


def parse_ppt(data: bytes) -> ParseReport:
    """Parse a legacy PowerPoint presentation: per slide (``page_number`` = slide number in
    the order of the slide containers) the text of its shapes as paragraphs, the first one a
    level-1 heading when the slide has more than one; speaker notes ``{"part": "notes"}`` on
    their slide (matched by slide id). Master slides and ``*`` field placeholders are left
    out. A table (a group of cell shapes marked with ``tableProperties``) becomes a
    ``"table"`` element on the grid of its cells' anchors, a blank cell kept in its column.

    Raises:
        EncryptedDocument: (code ``encrypted_document``) a password-protected presentation.
        CorruptDocument: "corrupt or unreadable PPT".
    """
    with _ole(data, "PPT") as ole:
        if ole.exists("EncryptedSummary"):
            raise EncryptedDocument("encrypted PPT, password required")
        if not ole.exists("PowerPoint Document"):
            raise CorruptDocument("corrupt or unreadable PPT: no PowerPoint Document stream")
        buf = ole.openstream("PowerPoint Document").read()
    slide_ids: list[int] = []
    slides: list[list] = []  # per slide: texts, and tables as lists of rows
    notes: dict[int, list[str]] = {}
    owner: tuple[str, int] | None = None  # the top-level container the text belongs to
    owner_depth = -1
    list_instance = -1
    groups: list[_Group] = []
    for kind, instance, body, stop, depth in _records(buf, 0, len(buf)):
        while groups and depth <= groups[-1].depth:
            group = groups.pop()
            rows = group.grid() if group.table else None
            if rows is not None and owner is not None and owner[0] == "slide":
                slides[owner[1]].append(rows)
            elif group.table and owner is not None and owner[0] == "slide":
                slides[owner[1]].extend(t for _, texts, _ in group.cells for t in texts)
        if depth <= owner_depth:
            owner, owner_depth = None, -1
        if groups and groups[-1].table is not None:
            group = groups[-1]
            if kind == _RT_SHAPE and depth == group.depth + 1:
                group.cells.append([None, [], False])
            elif kind == _RT_CHILD_ANCHOR and depth == group.depth + 2 and stop - body >= 16:
                group.cells[-1][0] = struct.unpack_from("<2i", buf, body)
            elif kind == _RT_TEXT_BOX and depth == group.depth + 2:
                group.cells[-1][2] = True
            elif kind == _RT_TERTIARY_OPT and len(group.cells) == 1:
                group.table = _has_table_property(buf, instance, body, stop)
        if kind == _RT_GROUP and owner is not None and owner[0] == "slide":
            groups.append(_Group(depth))
        if kind == _RT_CRYPT_SESSION:
            raise EncryptedDocument("encrypted PPT, password required")
        if kind == _RT_SLIDE_LIST:
            list_instance = instance  # 0 slides, 1 masters, 2 notes
        elif kind == _RT_SLIDE_PERSIST and list_instance == 0 and stop - body >= 16:
            slide_ids.append(struct.unpack_from("<I", buf, body + 12)[0])
        elif kind == _RT_SLIDE and owner is None:
            slides.append([])
            owner, owner_depth = ("slide", len(slides) - 1), depth
        elif kind == _RT_NOTES and owner is None:
            owner, owner_depth = ("notes", -1), depth
        elif kind == _RT_NOTES_ATOM and owner is not None and owner[0] == "notes":
            slide_ref = struct.unpack_from("<I", buf, body)[0] if stop - body >= 4 else 0
            owner = ("notes", slide_ref)
        elif kind in (_RT_TEXT_CHARS, _RT_TEXT_BYTES) and owner is not None:
            text = _atom_text(buf, kind, body, stop).strip()
            if not text or text == "*":
                continue
            table = next((g for g in reversed(groups) if g.table), None)
            if owner[0] == "slide" and table is not None and table.cells:
                table.cells[-1][1].append(text)
            elif owner[0] == "slide":
                slides[owner[1]].append(text)
            elif owner[1]:
                notes.setdefault(owner[1], []).append(text)
    if not buf:
        raise CorruptDocument("corrupt or unreadable PPT: the document stream is empty")
    out: list[Element] = []
    for number, items in enumerate(slides, start=1):
        path: tuple[str, ...] = ()
        if len(items) > 1 and isinstance(items[0], str):
            title = collapse_ws(items[0])
            path = (title,)
            out.append(
                Element(type="heading", text=title, page_number=number, section_path=path, level=1)
            )
            items = items[1:]
        for item in items:
            if isinstance(item, str):
                out.append(
                    Element(type="paragraph", text=item, page_number=number, section_path=path)
                )
            elif (element := _table_element(item, number)) is not None:
                out.append(dataclasses.replace(element, section_path=path))
        slide_id = slide_ids[number - 1] if number <= len(slide_ids) else None
        for text in notes.get(slide_id, []) if slide_id is not None else []:
            out.append(
                Element(
                    type="paragraph",
                    text=text,
                    page_number=number,
                    section_path=path,
                    metadata={"part": "notes"},
                )
            )
    return ParseReport(elements=out, page_count=None, pages_without_text=[], parser="olefile-ppt")
