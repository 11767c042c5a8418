"""Golden-question rows from a file (``kfs golden import``, the admin upload form): CSV with a
header row or JSON Lines, one question per row or line, parsed by the standard library's
``csv`` and ``json``.

Columns / members: ``question`` and ``evidence`` (required), ``tags`` (CSV: separated by ``|``;
JSONL: a list), ``metadata`` (CSV: a JSON object in the cell; JSONL: an object). The file is
UTF-8 (a byte-order mark is accepted). A file that cannot be read is 400 ``invalid_file`` naming
the line; the rows then go through :func:`retrieval.quality.evidence_match.bulk_import`.
"""

from __future__ import annotations

import csv
import io
import json

from knowledgefs.errors import InvalidInput

COLUMNS = ("question", "evidence", "tags", "metadata")
MAX_FILE_BYTES = 8 * 1024 * 1024


def _bad(message: str) -> InvalidInput:
    return InvalidInput(message, code="invalid_file")


def read_rows(filename: str, data: bytes) -> list[dict]:
    """The rows of a ``.csv`` or ``.jsonl`` file (by its extension)."""
    if len(data) > MAX_FILE_BYTES:
        raise _bad(f"the file is {len(data)} bytes; the limit is {MAX_FILE_BYTES}")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _bad(f"the file is not UTF-8 text (byte {exc.start})") from None
    name = filename.lower()
    if name.endswith(".csv"):
        return _csv_rows(text)
    if name.endswith((".jsonl", ".ndjson")):
        return _jsonl_rows(text)
    raise _bad(f"{filename}: give a .csv or .jsonl file")


def _csv_rows(text: str) -> list[dict]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    missing = [c for c in ("question", "evidence") if c not in header]
    if missing:
        raise _bad(f"the CSV header lacks the column {missing[0]} (columns: {', '.join(COLUMNS)})")
    unknown = [c for c in header if c not in COLUMNS]
    if unknown:
        raise _bad(f"the CSV column {unknown[0]!r} is not one of: {', '.join(COLUMNS)}")
    rows = []
    try:
        for record in reader:
            row = {"question": record.get("question") or "", "evidence": record.get("evidence")}
            if record.get("tags"):
                row["tags"] = [t.strip() for t in record["tags"].split("|") if t.strip()]
            if record.get("metadata"):
                try:
                    row["metadata"] = json.loads(record["metadata"])
                except ValueError:
                    raise _bad(f"line {reader.line_num}: metadata is not a JSON object") from None
            rows.append(row)
    except csv.Error as exc:
        raise _bad(f"line {reader.line_num}: {exc}") from None
    return rows


def _jsonl_rows(text: str) -> list[dict]:
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise _bad(f"line {number}: not JSON ({reason})") from None
        if not isinstance(row, dict):
            raise _bad(f"line {number}: each line must be a JSON object")
        rows.append(row)
    return rows
