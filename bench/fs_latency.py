"""Latency of the knowledge filesystem's ``ls`` and ``grep`` on spaces of N chunks.

1. Compiles (or reuses) the evaluation space of ``--dataset`` (default the committed
   ``tests/fixtures/eval-mini``, 200 SciFact abstracts) with ``kfs eval``'s ``prepare_space``.
2. Creates the space ``bench-fs`` (``--slug``; tenant ``kfs-bench``, dropped first if present
   unless ``--reuse``, which keeps it and only grows it) and grows it
   to each ``--sizes`` value in ascending order by copying the source's published nodes, vectors
   and keyword rows (``bench/replicate.py``; every copy a published document of its own).
3. Per size, times ``--repeat`` calls of each case in this process through the services the
   HTTP views call (:mod:`retrieval.fs`; no HTTP, no JSON rendering): ``ls /knowledge/docs``
   first page and a page 50 pages deep (limit 20, via its cursor), ``ls`` of one document's
   sections, and ``grep`` over the whole space for a frequent word, a rare word and a phrase
   (limit 20), reporting nearest-rank p50/p95 and the grep scan mode (``full`` up to 20,000
   published nodes, else ``keyword_candidates``: the keyword index's 500 best nodes scanned
   exactly, in rank order).

Writes ``bench/results/fs-latency-DATE.json`` (or ``--out``) and prints a markdown table.
Run on a throw-away SQLite database::

    env -u DATABASE_URL KNOWLEDGE_VAR_DIR=var/bench-fs nice .venv/bin/python bench/fs_latency.py
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")

TENANT = "kfs-bench"
SLUG = "bench-fs"
GREPS = {"frequent": "cells", "rare": "zebrafish", "phrase": "randomized controlled trial"}


def timed(fn, repeat: int) -> tuple[dict, object]:
    from retrieval.evaluation import percentile

    samples, last = [], None
    fn()  # warm-up (caches, first keyword index open)
    for _ in range(repeat):
        started = time.perf_counter()
        last = fn()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {
        "p50_ms": round(percentile(samples, 50), 2),
        "p95_ms": round(percentile(samples, 95), 2),
        "n": repeat,
    }, last


def measure(space, repeat: int) -> dict:
    from retrieval.fs import grep, listing

    rows: dict = {}
    rows["ls docs (page 1)"], first = timed(
        lambda: listing.ls(space, "/knowledge/docs", 20), repeat
    )
    cursor = first["nextCursor"]
    for _ in range(49):
        cursor = listing.ls(space, "/knowledge/docs", 20, cursor)["nextCursor"]
    rows["ls docs (page 51)"], _ = timed(
        lambda: listing.ls(space, "/knowledge/docs", 20, cursor), repeat
    )
    doc = first["items"][0]["path"]
    rows["ls document sections"], _ = timed(
        lambda: listing.ls(space, doc + "/sections", 20), repeat
    )
    for name, q in GREPS.items():
        row, last = timed(lambda q=q: grep.grep(space, q, "/knowledge", 20), repeat)
        row["scan"] = last["scan"]
        row["matches"] = len(last["matches"])
        rows[f"grep {name} ({q!r})"] = row
    return rows


def table(result: dict) -> str:
    sizes = list(result["sizes"])
    lines = ["| case | " + " | ".join(f"{s} chunks p50 / p95 (ms)" for s in sizes) + " |"]
    lines.append("|---" * (len(sizes) + 1) + "|")
    for case in result["sizes"][sizes[0]]:
        cells = []
        for size in sizes:
            row = result["sizes"][size][case]
            scan = f" ({row['scan']['mode']})" if "scan" in row else ""
            cells.append(f"{row['p50_ms']} / {row['p95_ms']}{scan}")
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from bench.replicate import replicate_space
    from knowledgefs.auth.principal import Principal
    from retrieval.evaluation import load_dataset, prepare_space
    from spaces.models import KnowledgeSpace
    from spaces.services import create_space, delete_space

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=str(ROOT / "tests" / "fixtures" / "eval-mini"))
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--out", default=None)
    parser.add_argument("--slug", default=SLUG)
    parser.add_argument(
        "--reuse", action="store_true", help="keep the space if present and only grow it"
    )
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    call_command("migrate", verbosity=0)
    corpus_path, corpus, _queries, _qrels = load_dataset(Path(args.dataset), "test")
    source, _, _ = prepare_space(corpus_path, corpus)
    principal = Principal(tenant_id=TENANT)
    target = KnowledgeSpace.objects.filter(tenant_id=TENANT, slug=args.slug).first()
    if target is not None and not args.reuse:
        delete_space(principal, target.id)
        target = None
    if target is None:
        target = create_space(principal, name="Filesystem benchmark", slug=args.slug)
    result = {
        "date": dt.date.today().isoformat(),
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        ),
        "database": connection.vendor,
        "source_chunks": source.nodes.count(),
        "repeat": args.repeat,
        "replication": {},
        "sizes": {},
    }
    for size in sizes:
        added = replicate_space(source, target, size)
        result["replication"][size] = added
        print(f"{size} chunks: {json.dumps(added)}", flush=True)
        result["sizes"][size] = measure(target, args.repeat)
        print(json.dumps(result["sizes"][size], indent=1), flush=True)
    out = Path(args.out or ROOT / "bench" / "results" / f"fs-latency-{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
