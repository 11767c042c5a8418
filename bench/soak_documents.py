"""The soak's documents (bench/soak.py): the first SciFact abstracts as ``.txt`` plus every
accepted file of ``../shared/data``, their expected node counts from a clean parse and chunk of
the same bytes, and their admission with the real claim-before-enqueue dispatch."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
TERMINAL = {"succeeded", "failed", "canceled", "superseded"}
TENANT = "kfs-soak"


def corpus(docs: int) -> tuple[list[tuple[str, bytes]], dict]:
    """``(filename, bytes)`` of the documents to admit, and where they came from."""
    items: list[tuple[str, bytes]] = []
    source: dict = {}
    scifact = SHARED_DATA / "scifact" / "corpus.jsonl.gz"
    if scifact.exists():
        with gzip.open(scifact, "rt", encoding="utf-8") as handle:
            for line in handle:
                if len(items) >= docs:
                    break
                record = json.loads(line)
                text = f"{record.get('title', '').strip()}\n\n{record.get('text', '').strip()}"
                items.append((f"scifact-{record['_id']}.txt", text.encode("utf-8")))
        source["scifact_abstracts"] = len(items)
        real = sorted(p for p in SHARED_DATA.rglob("*") if p.is_file() and p.name != scifact.name)
        for path in real:
            items.append((str(path.relative_to(SHARED_DATA)), path.read_bytes()))
        source["real_files"] = [str(p.relative_to(SHARED_DATA)) for p in real]
        source["fallback"] = False
    else:  # no ../shared: the project's own docs, made distinct by a header
        pages = sorted((ROOT / "docs").glob("*.md"))
        n = 0
        while len(items) < docs:
            for page in pages:
                header = f"# Copy {n} of {page.name}\n\n".encode()
                items.append((f"copy-{n}-{page.name}", header + page.read_bytes()))
                if len(items) >= docs:
                    break
            n += 1
        source["fallback"] = "../shared/data absent: docs/*.md duplicated with distinct headers"
    return items, source


def expected_nodes(data: bytes, mime_type: str) -> int:
    """Chunks a clean run makes of these bytes (0 when the parser finds nothing)."""
    from django.conf import settings

    from ingestion import parsing
    from ingestion.chunking import chunk_elements

    try:
        report = parsing.parse_with_report(data, mime_type)
        return len(
            chunk_elements(
                report.elements,
                target_chars=settings.KNOWLEDGE_CHUNK_TARGET_CHARS,
                overlap_chars=settings.KNOWLEDGE_CHUNK_OVERLAP_CHARS,
            )
        )
    except parsing.ParseError:
        return 0


def admit(space, items) -> tuple[list[dict], list[dict]]:
    from ingestion.documents import admit_document
    from knowledgefs.errors import ServiceError

    admitted, rejected = [], []
    for filename, data in items:
        try:
            admission = admit_document(space, filename=filename, data=data, enqueue=True)
        except ServiceError as exc:
            rejected.append({"filename": filename, "bytes": len(data), "code": exc.code})
            continue
        document = admission.document
        admitted.append(
            {
                "document_id": document.id,
                "job_id": admission.job.id,
                "filename": filename,
                "mime_type": document.mime_type,
                "bytes": len(data),
                "expected_nodes": expected_nodes(data, document.mime_type),
            }
        )
    return admitted, rejected
