"""Parsing speed and memory per format: our native parsers against unstructured's ``fast``
strategy, side by side in one run.

For each PDF and Office file under ``../shared/data/sample-docs`` (PDF, DOCX, PPTX, XLSX; with
``--all``, also EML, MSG, EPUB, XML and mbox), grouped by format, each side runs in a fresh
child process per format:

* ``native``: :func:`ingestion.parsing.parse_with_report` in-process in the child (this venv);
  when the build has an isolated-parse entry point (``ingestion.parsing.parse_isolated``) it is
  measured too, as ``native-isolated``;
* ``unstructured``: ``unstructured.partition.auto.partition(filename=..., strategy="fast")`` in
  ``.venv-unstructured`` (``make unstructured``), with the offline spaCy fix of
  :func:`ingestion.unstructured.server.load_partition`. The one-time cost of importing
  unstructured and loading the spaCy model (a warm-up partition of a short text) is reported
  separately and excluded from the per-file figures.

Every file is parsed once untimed (warm), then ``--reps`` times; the median wall time gives
pages (PDF pages, PPTX slides, XLSX sheets; one per document otherwise) per second. Peak RSS of
each child (``VmHWM`` from ``/proc/self/status``, and ``ru_maxrss`` from ``os.wait4``) is the
peak for that format on that side. A file a side cannot parse is reported with its error code.

Output: a markdown table (stdout, and ``--markdown FILE``) for docs/benchmarks.md and a JSON file
(``--out``, default ``bench/results/parse-formats-DATE.json``). Do not run on a shared machine
when the figures matter.

Usage::

    python bench/parse_formats.py [--reps 5] [--all] [--files a.pdf b.docx] [--out FILE]
        [--markdown FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT.parent / "shared" / "data" / "sample-docs"
UNSTRUCTURED_PYTHON = ROOT / ".venv-unstructured" / "bin" / "python"
sys.path.insert(0, str(ROOT))

FORMATS = {".pdf": "PDF", ".docx": "DOCX", ".pptx": "PPTX", ".xlsx": "XLSX"}
EXTRA_FORMATS = {".eml": "EML", ".msg": "MSG", ".epub": "EPUB", ".xml": "XML", ".mbox": "mbox"}
# OpenDocument, RTF and legacy Office: parsed natively since this release (--files to time them)
EXTRA_FORMATS.update(
    {".odt": "ODT", ".ods": "ODS", ".odp": "ODP", ".rtf": "RTF", ".doc": "DOC", ".xls": "XLS"}
)
EXTRA_FORMATS[".ppt"] = "PPT"
MIB = 1024 * 1024


def vm_hwm_kib() -> int | None:
    """Peak resident set of this process (KiB), from ``/proc/self/status``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


# --- children (print one JSON object) ---------------------------------------------------------


def _timed(call, path: Path, reps: int) -> dict:
    try:
        started = time.perf_counter()
        info = call(path)  # warm, untimed for the figures
        first = time.perf_counter() - started
    except Exception as exc:  # noqa: BLE001 - reported per file
        code = getattr(exc, "code", type(exc).__name__)
        return {"error": f"{code}: {str(exc)[:160]}"}
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        call(path)
        times.append(time.perf_counter() - started)
    return {"first_s": first, "times_s": times, "median_s": statistics.median(times), **info}


def child_native(files: list[Path], reps: int, isolated: bool) -> dict:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")
    try:
        import django

        django.setup()  # parsers may read settings (OCR, rasterization)
    except Exception:  # noqa: BLE001 - pure parsers do not need it
        pass
    from ingestion import parsing

    entry = parsing.parse_with_report
    if isolated:
        from ingestion.parsing import isolation, rasterize

        config = isolation.IsolationConfig.from_settings()
        raster = rasterize.RasterConfig.from_settings()

        def entry(data: bytes, mime: str):
            return isolation.parse_isolated(data, mime, config=config, raster=raster)

    def parse(path: Path) -> dict:
        data = path.read_bytes()
        report = entry(data, parsing.sniff_mime_type(data, path.name))
        return {
            "elements": len(report.elements),
            "chars": sum(len(e.text) for e in report.elements),
            "parser": report.parser,
        }

    baseline = vm_hwm_kib()
    results = {p.name: _timed(parse, p, reps) for p in files}
    return {"files": results, "baseline_vm_hwm_kib": baseline, "vm_hwm_kib": vm_hwm_kib()}


def child_unstructured(files: list[Path], reps: int) -> dict:
    from ingestion.unstructured.server import load_partition

    started = time.perf_counter()
    partition = load_partition()
    imported = time.perf_counter() - started
    started = time.perf_counter()
    partition(
        file=io.BytesIO(b"Warm-up. This sentence loads the language model."),
        metadata_filename="warm-up.txt",
        content_type="text/plain",
    )
    spacy_load = time.perf_counter() - started
    baseline = vm_hwm_kib()

    def parse(path: Path) -> dict:
        elements = partition(filename=str(path), strategy="fast")
        return {"elements": len(elements), "chars": sum(len(e.text or "") for e in elements)}

    results = {p.name: _timed(parse, p, reps) for p in files}
    return {
        "files": results,
        "import_s": imported,
        "spacy_load_s": spacy_load,
        "baseline_vm_hwm_kib": baseline,
        "vm_hwm_kib": vm_hwm_kib(),
    }


# --- a generated multi-page corpus (--generate) --------------------------------------------------


def _paragraphs(count: int) -> list[str]:
    """``count`` real abstracts from ../shared/data/scifact (corpus.jsonl.gz), else lorem text."""
    corpus = ROOT.parent / "shared" / "data" / "scifact" / "corpus.jsonl.gz"
    texts: list[str] = []
    if corpus.exists():
        import gzip

        with gzip.open(corpus, "rt") as lines:
            for line in lines:
                record = json.loads(line)
                text = record.get("text") or ""
                if len(text) > 400:
                    texts.append(f"{record.get('title', '').rstrip('.')}. {text}")
                if len(texts) >= count:
                    break
    while len(texts) < count:
        texts.append("Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 12)
    return texts


def generate(folder: Path, pages: int = 30) -> list[Path]:
    """Write a ``pages``-page text PDF (two abstracts a page, reportlab), a DOCX of the same
    text with one table per ten paragraphs, a ``pages``-slide PPTX and a 5-sheet XLSX (200 rows
    each); returns their paths."""
    from docx import Document as Docx
    from openpyxl import Workbook
    from pptx import Presentation
    from pptx.util import Inches
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.platypus import PageBreak, Paragraph, SimpleDocTemplate

    folder.mkdir(parents=True, exist_ok=True)
    texts = _paragraphs(pages * 2)
    pdf = folder / f"generated-{pages}p.pdf"
    style = getSampleStyleSheet()["BodyText"]
    story = []
    for page in range(pages):
        story += [Paragraph(texts[2 * page], style), Paragraph(texts[2 * page + 1], style)]
        story.append(PageBreak())
    SimpleDocTemplate(str(pdf), pagesize=A4).build(story[:-1])
    docx_path = folder / f"generated-{pages}p.docx"
    document = Docx()
    for index, text in enumerate(texts):
        document.add_paragraph(text)
        if index % 10 == 9:
            table = document.add_table(rows=4, cols=3)
            for r in range(4):
                for c in range(3):
                    table.cell(r, c).text = f"r{r}c{c} value {index}"
    document.save(docx_path)
    pptx_path = folder / f"generated-{pages}s.pptx"
    deck = Presentation()
    for index in range(pages):
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = f"Slide {index + 1}"
        slide.placeholders[1].text = texts[index][:600]
        slide.notes_slide.notes_text_frame.text = texts[-1 - index][:300]
        slide.shapes.add_table(3, 3, Inches(1), Inches(5), Inches(6), Inches(1))
    deck.save(pptx_path)
    xlsx_path = folder / "generated-5sheets.xlsx"
    book = Workbook()
    book.remove(book.active)
    for sheet_index in range(5):
        sheet = book.create_sheet(f"Sheet {sheet_index + 1}")
        sheet.append(["id", "title", "score", "note"])
        for row in range(200):
            sheet.append([row, texts[row % len(texts)][:40], row * 0.5, f"note {row}"])
    book.save(xlsx_path)
    return [pdf, docx_path, pptx_path, xlsx_path]


# --- the parent -------------------------------------------------------------------------------


def units(path: Path) -> tuple[int, str]:
    """(count, unit) the per-second figure is given in."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".pdf":
            from pypdf import PdfReader

            return len(PdfReader(str(path)).pages), "pages"
        if suffix == ".pptx":
            from pptx import Presentation

            return len(Presentation(str(path)).slides), "slides"
        if suffix == ".xlsx":
            from openpyxl import load_workbook

            return len(load_workbook(str(path), read_only=True).sheetnames), "sheets"
    except Exception:  # noqa: BLE001 - fall back to one document
        pass
    return 1, "document"


def run_child(python: Path, side: str, files: list[Path], reps: int) -> dict:
    """Run one child side on ``files``; its JSON result plus ``ru_maxrss_kib`` of exactly that
    child (``os.wait4``), or ``{"error": ...}``."""
    command = [str(python), str(Path(__file__).resolve()), "--child", side, "--reps", str(reps)]
    command += ["--files", *[str(f) for f in files]]
    env = {**os.environ, "DO_NOT_TRACK": "1", "UNSTRUCTURED_DISABLE_NOTICE": "1"}
    out_path = ROOT / "var" / f"parse-formats-{os.getpid()}-{side}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with (
        open(out_path, "w") as out,
        subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.PIPE, text=True
        ) as process,
    ):
        stderr = process.stderr.read() if process.stderr else ""
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    text = out_path.read_text()
    out_path.unlink()
    if process.returncode != 0 or not text.strip():
        return {"error": f"child exited {process.returncode}: {stderr.strip()[-400:]}"}
    result = json.loads(text.strip().splitlines()[-1])
    result["ru_maxrss_kib"] = usage.ru_maxrss
    return result


def _mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.0f}"


def _cell(entry: dict | None, count: int) -> tuple[str, str]:
    if not entry:
        return "-", "-"
    if "error" in entry:
        return "fails", entry["error"].split(":", 1)[0]
    median = entry["median_s"]
    return f"{median * 1000:.1f}", f"{count / median:.1f}" if median > 0 else "-"


def markdown(report: dict) -> str:
    sides = report["sides"]
    lines = [
        f"Run {report['date']} on {report['machine']}, {report['reps']} repetitions (median), "
        "warm; unstructured `fast` strategy.",
        "",
        "| file | format | size | units | native ms | native units/s | isolated ms | "
        "unstructured ms | unstructured units/s | native chars | unstructured chars |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for item in report["files"]:
        count, unit = item["units"], item["unit"]
        row = [item["file"], item["format"], f"{item['bytes'] / 1024:.0f} KiB", f"{count} {unit}"]
        row += list(_cell(item["results"].get("native"), count))
        row.append(_cell(item["results"].get("native-isolated"), count)[0])
        row += list(_cell(item["results"].get("unstructured"), count))
        for side in ("native", "unstructured"):
            entry = item["results"].get(side) or {}
            row.append(str(entry.get("chars", "-")))
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "| format | native peak RSS MiB | native after imports MiB | unstructured peak RSS MiB | "
        "unstructured after import + spaCy MiB |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for fmt, by_side in report["rss"].items():
        native, remote = by_side.get("native", {}), by_side.get("unstructured", {})
        lines.append(
            f"| {fmt} | {_mib(native.get('vm_hwm_kib'))} | "
            f"{_mib(native.get('baseline_vm_hwm_kib'))} | {_mib(remote.get('vm_hwm_kib'))} | "
            f"{_mib(remote.get('baseline_vm_hwm_kib'))} |"
        )
    once = sides.get("unstructured", {})
    if once:
        lines += [
            "",
            f"One-time unstructured start-up, excluded above: import "
            f"{once.get('import_s', 0):.2f} s, first partition with spaCy load "
            f"{once.get('spacy_load_s', 0):.2f} s (median over the per-format children).",
        ]
    if sides.get("native-isolated", {}).get("unavailable"):
        lines += ["", f"native-isolated: {sides['native-isolated']['unavailable']}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--all", action="store_true", help="also EML, MSG and EPUB")
    parser.add_argument("--files", nargs="*", help="these files instead of the sample set")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument(
        "--generate",
        type=int,
        metavar="PAGES",
        help="also a generated PAGES-page PDF/DOCX, PAGES-slide PPTX and 5-sheet XLSX",
    )
    parser.add_argument("--child", choices=("native", "native-isolated", "unstructured"))
    args = parser.parse_args()
    if args.child:
        files = [Path(f) for f in args.files]
        if args.child == "unstructured":
            result = child_unstructured(files, args.reps)
        else:
            result = child_native(files, args.reps, isolated=args.child == "native-isolated")
        print(json.dumps(result))
        return
    formats = {**FORMATS, **(EXTRA_FORMATS if args.all else {})}
    if args.files:
        files = [Path(f).resolve() for f in args.files]
    else:
        if not SAMPLES.is_dir():
            sys.exit(f"{SAMPLES} is not present")
        files = sorted(p for p in SAMPLES.iterdir() if p.suffix.lower() in formats)
    if args.generate:
        files += generate(ROOT / "var" / "bench-docs", args.generate)
    if not UNSTRUCTURED_PYTHON.exists():
        sys.exit(f"{UNSTRUCTURED_PYTHON} is missing: run `make unstructured`")
    groups: dict[str, list[Path]] = {}
    for path in files:
        groups.setdefault(formats.get(path.suffix.lower(), path.suffix.upper()), []).append(path)
    pythons = {
        "native": Path(sys.executable),
        "native-isolated": Path(sys.executable),
        "unstructured": UNSTRUCTURED_PYTHON,
    }
    per_format: dict[str, dict[str, dict]] = {}
    for fmt, group in groups.items():
        for side, python in pythons.items():
            print(f"{fmt}: {side} on {len(group)} file(s)", file=sys.stderr, flush=True)
            per_format.setdefault(fmt, {})[side] = run_child(python, side, group, args.reps)
    rows = []
    for fmt, group in groups.items():
        for path in group:
            count, unit = units(path)
            results = {
                side: (res.get("files") or {}).get(path.name, res if "error" in res else None)
                for side, res in per_format[fmt].items()
            }
            rows.append(
                {
                    "file": path.name,
                    "format": fmt,
                    "bytes": path.stat().st_size,
                    "units": count,
                    "unit": unit,
                    "results": results,
                }
            )
    remote = [r["unstructured"] for r in per_format.values() if "spacy_load_s" in r["unstructured"]]
    sides: dict[str, dict] = {"unstructured": {}, "native-isolated": {}}
    if remote:
        sides["unstructured"] = {
            "import_s": statistics.median(r["import_s"] for r in remote),
            "spacy_load_s": statistics.median(r["spacy_load_s"] for r in remote),
        }
    for by_side in per_format.values():
        if "unavailable" in by_side.get("native-isolated", {}):
            sides["native-isolated"] = by_side["native-isolated"]
    report = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "reps": args.reps,
        "files": rows,
        "rss": {
            fmt: {side: {k: v for k, v in res.items() if k != "files"} for side, res in r.items()}
            for fmt, r in per_format.items()
        },
        "sides": sides,
    }
    out = args.out or ROOT / "bench" / "results" / f"parse-formats-{dt.date.today()}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    if args.markdown:
        args.markdown.write_text(table)
    print(table)
    print(f"JSON: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
