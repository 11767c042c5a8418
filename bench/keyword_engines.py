"""Keyword engines side by side on SciFact: SQLite FTS5 (our table and MATCH form) and tantivy.

Both engines index the same nodes: each SciFact abstract (``title + " " + text``, BEIR's
convention, as ``kfs eval`` admits it) is parsed as plain text and chunked by the compiler's
chunker (``ingestion.chunking.chunk_elements``, 1,200 / 120 characters), and every chunk goes
in as :func:`retrieval.text.keyword_text` of its text; queries go through
:func:`retrieval.text.keyword_terms`. FTS5 is the table of migration ``retrieval.0002`` and the
statement of the previous SQLite backend (``text : (...) AND space_id : "..."``, ``ORDER BY rank
LIMIT``); tantivy is :mod:`retrieval.keyword_index.analysis` (schema, analyzer, query), with
analyzer variants and with or without the FTS5-idf boost. Engine time only: no visibility check.

Measured per corpus:

- ``5k``: the 5,183 abstracts (9,233 chunks); nDCG@10 over the 300 test claims with the top 100
  chunks mapped to their documents (first occurrence wins), as ``kfs eval`` does
  (:func:`retrieval.evaluation.ndcg_at_k`);
- ``100k``: noisy copies of those chunks up to 100,000 (copy ``c`` of a chunk drops 3 random
  words and swaps 2 adjacent pairs, ``random.Random(SEED * 1000003 + c)``); a copy maps to its
  source document for nDCG, which is then a sanity figure, not SciFact's.

Latency: p50 / p95 per query (``time.perf_counter``) over the 300 test claims, run twice (the
first pass warms caches and is dropped), with a window of 100 rows (Fast's 50 candidates × 2,
the backend's first window) and of 200 (the evaluation's 100 × 2).

Run: ``.venv/bin/python bench/keyword_engines.py --out bench/results/keyword-engines-DATE.json``
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")

DATA = Path("/work/shared/data/scifact")
SEED = 20261201
SPACE = uuid.UUID(int=1).hex
FTS_CREATE = None  # set from migration retrieval.0002 in main()


def load(data: Path):
    with gzip.open(data / "corpus.jsonl.gz", "rt") as f:
        corpus = [json.loads(line) for line in f]
    queries = {}
    with open(data / "queries.jsonl") as f:
        for line in f:
            q = json.loads(line)
            queries[str(q["_id"])] = q["text"]
    qrels: dict[str, dict[str, int]] = {}
    with open(data / "qrels" / "test.tsv") as f:
        next(f)
        for line in f:
            qid, did, score = line.split("\t")
            qrels.setdefault(qid, {})[did] = int(score)
    return corpus, {q: queries[q] for q in qrels}, qrels


def chunk_corpus(corpus) -> list[tuple[str, str]]:
    """``[(corpus id, chunk text)]`` in corpus order."""
    from ingestion.chunking import chunk_elements
    from ingestion.parsing import parse

    chunks = []
    for record in corpus:
        text = f"{record.get('title', '')} {record.get('text', '')}".strip()
        if not text:
            continue
        for chunk in chunk_elements(parse(text.encode("utf-8"), "text/plain")):
            chunks.append((str(record["_id"]), chunk.text))
    return chunks


def noisy(text: str, rng: random.Random) -> str:
    words = text.split()
    for _ in range(min(3, max(0, len(words) - 5))):
        words.pop(rng.randrange(len(words)))
    for _ in range(2):
        if len(words) > 2:
            i = rng.randrange(len(words) - 1)
            words[i], words[i + 1] = words[i + 1], words[i]
    return " ".join(words)


def grow(chunks, size: int):
    out = list(chunks)
    copy = 1
    while len(out) < size:
        rng = random.Random(SEED * 1000003 + copy)
        for cid, text in chunks:
            if len(out) >= size:
                break
            out.append((cid, noisy(text, rng)))
        copy += 1
    return out


def percentile(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


class FTS5:
    name = "fts5 (porter unicode61 remove_diacritics 2)"

    def __init__(self, nodes):
        from retrieval.text import keyword_text

        self.db = sqlite3.connect(":memory:")
        self.db.execute(FTS_CREATE)
        self.db.executemany(
            "INSERT INTO retrieval_keyword_fts (text, node_id, space_id, document_id) "
            "VALUES (?, ?, ?, ?)",
            [(keyword_text(t), str(i), SPACE, cid) for i, (cid, t) in enumerate(nodes)],
        )
        self.db.commit()

    def search(self, query: str, window: int) -> list[int]:
        from retrieval.text import is_lone_cjk, keyword_terms

        terms = keyword_terms(query)
        words = " OR ".join(
            '"' + t.replace('"', '""') + '"' + ("*" if is_lone_cjk(t) else "") for t in terms
        )
        match = f'text : ({words}) AND space_id : "{SPACE}"'
        rows = self.db.execute(
            "SELECT node_id, rank FROM retrieval_keyword_fts WHERE retrieval_keyword_fts "
            "MATCH ? ORDER BY rank LIMIT ?",
            [match, window],
        ).fetchall()
        return [int(r[0]) for r in rows]


class Tantivy:
    def __init__(self, nodes, *, stemmer="english", ascii_fold=True, boost=True):
        import tantivy

        from retrieval.keyword_index import analysis
        from retrieval.text import keyword_text

        self.analysis = analysis
        self.boost = boost
        self.name = f"tantivy (stemmer={stemmer}, ascii_fold={ascii_fold}, fts5_idf={boost})"
        self.analyzer = analysis.build_analyzer(stemmer, ascii_fold)
        self.dir = tempfile.TemporaryDirectory(prefix="kfs-kw-bench-")
        self.index = tantivy.Index(analysis.SCHEMA, self.dir.name)
        analysis.register(self.index, self.analyzer)
        self.index.config_reader("manual")
        writer = self.index.writer(200_000_000, 1)
        for i, (cid, text) in enumerate(nodes):
            writer.add_document(
                tantivy.Document(node_id=str(i), document_id=cid, text=keyword_text(text))
            )
        writer.commit()
        writer.wait_merging_threads()
        self.index.reload()
        self.searcher = self.index.searcher()

    def search(self, query: str, window: int) -> list[int]:
        s = self.searcher
        q = self.analysis.build_query(
            query, analyzer=self.analyzer, searcher=s if self.boost else None
        )
        if q is None:
            return []
        hits = s.search(q, window, count=False).hits
        return [int(s.doc(addr)["node_id"][0]) for _, addr in hits]


def evaluate(engine, nodes, queries, qrels) -> dict:
    from retrieval.evaluation import ndcg_at_k

    scores = []
    for qid, text in queries.items():
        ranked: list[str] = []
        for i in engine.search(text, 200)[:100]:
            cid = nodes[i][0]
            if cid not in ranked:
                ranked.append(cid)
        scores.append(ndcg_at_k(ranked, qrels[qid], 10))
    out = {"ndcg@10": round(statistics.mean(scores), 4)}
    for window in (100, 200):
        times = []
        for rep in range(2):
            for text in queries.values():
                t0 = time.perf_counter()
                engine.search(text, window)
                if rep:
                    times.append((time.perf_counter() - t0) * 1000)
        out[f"window{window}_p50_ms"] = round(percentile(times, 50), 3)
        out[f"window{window}_p95_ms"] = round(percentile(times, 95), 3)
    return out


def main() -> None:
    global FTS_CREATE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--sizes", default="5k,100k")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import django

    django.setup()
    import importlib

    FTS_CREATE = importlib.import_module("retrieval.migrations.0002_keyword_index").SQLITE_CREATE
    corpus, queries, qrels = load(args.data)
    base = chunk_corpus(corpus)
    result = {
        "benchmark": "keyword-engines",
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "queries": len(queries),
        "sqlite": sqlite3.sqlite_version,
        "corpora": {},
    }
    for size in args.sizes.split(","):
        n = len(base) if size == "5k" else int(size.rstrip("k")) * 1000
        nodes = base if size == "5k" else grow(base, n)
        rows = {}
        engines = [(FTS5, {}), (Tantivy, {}), (Tantivy, {"boost": False})]
        if size == "5k":
            engines += [(Tantivy, {"ascii_fold": False}), (Tantivy, {"stemmer": None})]
        for make, options in engines:
            t0 = time.perf_counter()
            engine = make(nodes, **options)
            build_s = time.perf_counter() - t0
            rows[engine.name] = {
                "build_s": round(build_s, 2),
                **evaluate(engine, nodes, queries, qrels),
            }
            print(size, engine.name, rows[engine.name], flush=True)
            del engine
        result["corpora"][size] = {"chunks": len(nodes), "engines": rows}
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
