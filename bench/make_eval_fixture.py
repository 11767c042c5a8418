"""Build tests/fixtures/eval-mini (the regression gate's dataset) from BEIR SciFact.

Deterministic: the same SciFact files always give the same bytes. Picks ``--queries`` test
queries (every ``len(test) // queries``-th judged query in qrels order), keeps all their relevant
abstracts, adds for each query the ``--hard`` non-relevant abstracts sharing the most
IDF-weighted words with it (hard negatives, so the fixture is not trivially easy), then fills up
to ``--documents`` with abstracts drawn by a seeded generator. Writes the BEIR layout
(``corpus.jsonl.gz`` with a fixed gzip mtime, ``queries.jsonl``, ``qrels/test.tsv``); the README
with the licence attribution is kept by hand next to them.

Usage: ``python bench/make_eval_fixture.py [--source ../shared/data/scifact]
[--out tests/fixtures/eval-mini] [--queries 30] [--documents 200] [--hard 3]``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORD = re.compile(r"[a-z0-9]{3,}")


def words(text: str) -> set[str]:
    """Lower-cased words of 3+ letters or digits."""
    return set(WORD.findall(text.lower()))


def main() -> int:
    """Build the fixture (see the module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "eval-mini"))
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--documents", type=int, default=200)
    parser.add_argument("--hard", type=int, default=3)
    parser.add_argument("--seed", type=int, default=20261130)
    args = parser.parse_args()
    source, out = Path(args.source), Path(args.out)
    if not (source / "corpus.jsonl.gz").exists():
        print(f"SciFact not found under {source}", file=sys.stderr)
        return 2

    with gzip.open(source / "corpus.jsonl.gz", "rt", encoding="utf-8") as handle:
        corpus = {str(d["_id"]): d for d in map(json.loads, handle)}
    with (source / "queries.jsonl").open(encoding="utf-8") as handle:
        queries = {str(q["_id"]): q for q in map(json.loads, handle)}
    qrels: dict[str, list[str]] = {}
    for line in (source / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        qid, did, score = line.split("\t")
        if int(score) > 0:
            qrels.setdefault(qid, []).append(did)

    step = max(1, len(qrels) // args.queries)
    picked = list(qrels)[::step][: args.queries]
    keep: list[str] = []
    for qid in picked:
        keep += [d for d in qrels[qid] if d not in keep]

    doc_words = {d: words(f"{r.get('title', '')} {r.get('text', '')}") for d, r in corpus.items()}
    df = Counter(w for ws in doc_words.values() for w in ws)
    idf = {w: math.log(len(corpus) / n) for w, n in df.items()}
    for qid in picked:
        terms = words(queries[qid]["text"])
        ranked = sorted(
            (d for d in corpus if d not in keep),
            key=lambda d: (-sum(idf[w] for w in terms & doc_words[d]), d),
        )
        keep += ranked[: args.hard]
    rest = sorted(d for d in corpus if d not in keep)
    random.Random(args.seed).shuffle(rest)
    keep += rest[: max(0, args.documents - len(keep))]

    (out / "qrels").mkdir(parents=True, exist_ok=True)
    lines = "".join(
        json.dumps({"_id": d, "title": corpus[d]["title"], "text": corpus[d]["text"]}) + "\n"
        for d in sorted(keep, key=int)
    )
    with (out / "corpus.jsonl.gz").open("wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as handle:
            handle.write(lines.encode("utf-8"))
    (out / "queries.jsonl").write_text(
        "".join(
            json.dumps({"_id": q, "text": queries[q]["text"]}) + "\n"
            for q in sorted(picked, key=int)
        ),
        encoding="utf-8",
    )
    (out / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n"
        + "".join(f"{q}\t{d}\t1\n" for q in sorted(picked, key=int) for d in qrels[q]),
        encoding="utf-8",
    )
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{out}: {len(keep)} abstracts, {len(picked)} queries, {size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
