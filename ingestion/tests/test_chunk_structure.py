"""Structure the chunker keeps: tables cut between rows (BC-38), fenced code (BC-39).

The real parsers (Markdown, XLSX) feed the real chunker; what is asserted is what a reader of a
stored chunk sees. A table with a header is a Markdown table (``ingestion/parsing/tables.py``);
a later piece of it, and a piece of fenced code, carry the header or the fence as context
(``ingestion/chunk_metadata.py``), so chunks stay exact slices of the canonical text.
"""

from __future__ import annotations

import io
import re

import openpyxl
import pytest

from ingestion.chunk_metadata import reading_text
from ingestion.chunking import canonical_text, chunk_elements
from ingestion.parsing import parse

XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
HEADER, SEPARATOR = "| Depot | Units | Remark |", "| --- | --- | --- |"
ROWS = [(f"D-{n:03d}", f"{(n * 7919) % 9000 + 1000:,}", "已盘点？是。") for n in range(200)]
ROWS[42] = ("D-042", "7,310", "已盘点？是。")


def _markdown() -> bytes:
    lines = ["# Depots", "", "Table 3: depot stock", ""]
    lines += ["| Depot | Units | Remark |", "| --- | --- | --- |"]
    lines += [f"| {d} | {u} | {r} |" for d, u, r in ROWS]
    return ("\n".join(lines) + "\n").encode()


def _xlsx() -> bytes:
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Depots"
    sheet.append(["Table 3: depot stock"])
    sheet.append(["Depot", "Units", "Remark"])
    for row in ROWS:
        sheet.append(list(row))
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


@pytest.mark.parametrize(("source", "mime"), [(_markdown, "text/markdown"), (_xlsx, XLSX)])
def test_bc38_a_long_table_is_cut_between_rows_and_every_piece_reads_with_its_header(source, mime):
    elements = parse(source(), mime)
    text, _ = canonical_text(elements)
    chunks = chunk_elements(elements, target_chars=400, overlap_chars=40)
    tables = [c for c in chunks if c.kind == "table"]
    assert len(tables) >= 4
    for n, chunk in enumerate(tables):
        # The cited text is an exact slice, cut only between rows.
        assert text[chunk.start_offset : chunk.end_offset] == chunk.text
        assert chunk.start_offset == 0 or text[chunk.start_offset - 1] == "\n"
        assert chunk.end_offset == len(text) or text[chunk.end_offset] == "\n"
        # What a reader of the piece gets begins with the header row and the separator (a
        # valid Markdown table); the first piece holds them, later ones carry them as context.
        lines = reading_text(chunk.text, chunk.metadata).splitlines()
        assert lines[:2] == [HEADER, SEPARATOR], lines[:3]
        assert (HEADER in chunk.text) == (n == 0)
        assert ("context" in chunk.metadata) == (n > 0)
        for row in lines[2:]:
            assert re.fullmatch(r"\| D-\d{3} \| [\d,]+ \| 已盘点？是。 \|", row), row
        # The chunk's metadata gives its data rows (1-based), the header and the sheet.
        numbers = [int(m) + 1 for m in re.findall(r"\| D-(\d{3}) \|", chunk.text)]
        table = chunk.metadata["table"]
        assert table["rows"] == [numbers[0], numbers[-1]], (table, numbers[:3])
        assert table["header"] == ["Depot", "Units", "Remark"]
        assert table.get("sheet") == ("Depots" if mime == XLSX else None)
    # The header and the caption are in the text once: in the first pieces only.
    assert text.count(HEADER) == 1
    assert sum("Table 3: depot stock" in c.text for c in chunks) == 1
    assert "Table 3: depot stock" in chunks[0].text
    # Every value and delimiter survives: 200 rows, "7,310", each 。 and ？.
    joined = "\n".join(c.text for c in tables)
    assert "| D-042 | 7,310 | 已盘点？是。 |" in joined
    found = {m for c in tables for m in re.findall(r"\| (D-\d{3}) \|", c.text)}
    assert len(found) == 200
    assert text.count("。") == text.count("？") == 200
    assert all(t.section_path == ("Depots",) for t in tables)


SCRIPT = "\n".join(
    f"echo step {i} && apt-get install -y package-{i} --no-install-recommends" for i in range(45)
)


def _fenced(fence: str, indent: str = "") -> bytes:
    lines = f"# install deps\n## not a title\n{SCRIPT}".split("\n")
    body = "\n".join(indent + line for line in lines)
    code = f"{indent}{fence}bash\n{body}\n{indent}{fence}"
    if indent:
        code = "- install the dependencies\n\n" + code
    return f"# Setup\n\n{code}\n\n# Usage\n\nRun the tool with one argument.\n".encode()


@pytest.mark.parametrize("fence", ["```", "~~~"])
def test_bc39_headings_inside_a_fence_are_code_and_pieces_of_it_stay_balanced(fence):
    elements = parse(_fenced(fence), "text/markdown")
    paths = {e.section_path for e in elements}
    assert paths == {("Setup",), ("Usage",)}, paths
    code = [e for e in elements if e.type == "code"]
    assert len(code) == 1 and code[0].metadata.get("language") == "bash"
    assert "# install deps" in code[0].text and "## not a title" in code[0].text
    chunks = chunk_elements(elements)
    assert {c.section_path for c in chunks} == {("Setup",), ("Usage",)}
    setup = [c for c in chunks if c.section_path == ("Setup",)]
    assert len(setup) >= 3  # the script is longer than a chunk
    # Every piece of the code says its fence's info string, so a reader re-opens the fence.
    assert all(c.metadata["code"] == {"language": "bash"} for c in setup)
    for chunk in chunks:
        # A fence is never left open: the parser keeps the code without its fence lines, so no
        # stored chunk holds half of one.
        assert not any(line.strip().startswith(fence) for line in chunk.text.splitlines())
    for chunk in setup:
        # Read alone, each piece of the code is closed and reopened with its fence and info
        # string (context inserted around the cited slice, which stays exact).
        lines = reading_text(chunk.text, chunk.metadata).splitlines()
        fences = [line for line in lines if line.startswith("```")]
        assert fences == ["```bash", "```"], lines[:3]
        assert lines[-1] == "```"
        opened = lines.index("```bash")
        assert opened == (1 if chunk is setup[0] else 0)  # after the carried heading "Setup"
        assert "echo step" in "\n".join(lines[opened + 1 : -1])
        assert "install deps" not in " ".join(chunk.section_path)
    assert chunks[-1].section_path == ("Usage",) and "one argument" in chunks[-1].text


@pytest.mark.parametrize("fence", ["```", "~~~"])
def test_bc39_a_fence_inside_a_list_item_is_code_and_never_left_open(fence):
    elements = parse(_fenced(fence, indent="  "), "text/markdown")
    assert {e.section_path for e in elements} == {("Setup",), ("Usage",)}
    assert not any(e.type == "heading" and "install deps" in e.text for e in elements)
    assert [(e.type, e.metadata.get("language")) for e in elements if e.type != "heading"] == [
        ("list", None),
        ("code", "bash"),
        ("paragraph", None),
    ]
    chunks = chunk_elements(elements)
    assert {c.section_path for c in chunks} == {("Setup",), ("Usage",)}
    assert len([c for c in chunks if c.section_path == ("Setup",)]) >= 3
    for chunk in chunks:  # no stored chunk holds an opening fence without its closing one
        fences = [line for line in chunk.text.splitlines() if line.strip().startswith(fence)]
        assert len(fences) % 2 == 0, chunk.text[:80]
        # Read alone, a piece holding code has its fence opened and closed around it.
        read = [
            line
            for line in reading_text(chunk.text, chunk.metadata).splitlines()
            if line.startswith("```")
        ]
        assert read == (["```bash", "```"] if "echo step" in chunk.text else []), read


@pytest.mark.django_db
def test_bc38_stored_table_chunks_carry_their_rows_and_sheet(space, settings):
    from ingestion.documents import admit_document
    from ingestion.models import KnowledgeNode
    from knowledgefs.testing.fixtures import compile_all

    settings.KNOWLEDGE_CHUNK_TARGET_CHARS = 600
    admit_document(space, filename="depots.xlsx", data=_xlsx(), enqueue=False)
    assert compile_all() == 1
    tables = list(KnowledgeNode.objects.filter(space=space, kind="table").order_by("chunk_index"))
    assert len(tables) >= 4
    assert tables[0].metadata["table"]["rows"][0] == 1
    assert tables[-1].metadata["table"]["rows"][1] == 200
    for node in tables:
        assert node.metadata["table"]["sheet"] == "Depots"
        assert node.metadata["table"]["header"] == ["Depot", "Units", "Remark"]
    covered = sorted(
        n
        for node in tables
        for n in range(node.metadata["table"]["rows"][0], node.metadata["table"]["rows"][1] + 1)
    )
    assert set(covered) == set(range(1, 201))
