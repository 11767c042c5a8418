"""The PostgreSQL keyword leg before (``ts_rank_cd`` over a GIN match) and after (exact BM25 by the
Threshold Algorithm over impact lists): latency, agreement with exact BM25, plans, SciFact nDCG.

Usage (against a PostgreSQL database migrated to the latest schema, e.g. under
``scripts/with_postgres.py``)::

    python bench/pg_keyword.py build --copies 20      # ≈100k nodes: SciFact abstracts × 20
    python bench/pg_keyword.py measure --copies 20 --queries 200 --limit 50
    python bench/pg_keyword.py explain --copies 20
    python bench/pg_keyword.py build --copies 1 && python bench/pg_keyword.py ndcg --copies 1

``build`` writes one published document and node per abstract copy (title + text; every copy
after the first drops 3 seeded random words, so copies are near-duplicates with distinct scores)
into the space ``bench-pg-keyword-<copies>``: documents and nodes by ``bulk_create``, keyword
rows through ``SearchBackend.index_keywords`` (what the compiler writes), and, for the *before*
statement, the same texts into ``bench_keyword_tsv`` (``retrieval.0002``'s tsvector table and
GIN index, under another name). ``measure`` runs every claim (queries.jsonl order) through the
before statement, the backend's ``keyword_search`` and the exhaustive exact BM25
(``pgkeyword.EXHAUSTIVE_SQL`` scored in Python), after one warm-up pass; it prints p50/p95 in
ms, the mean work of the threshold algorithm, and the share of each top 10 found in the exact
BM25 top 10. ``explain`` prints ``EXPLAIN (ANALYZE, BUFFERS)`` of the before statement and of
every statement the backend runs for one query. ``ndcg`` prints keyword-only nDCG@10 on the
test qrels for both. Query embedding plays no part (keyword leg only).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")
DATA = Path(os.environ.get("SCIFACT_DIR", "/work/shared/data/scifact"))
TSV = "bench_keyword_tsv"
BATCH = 2000

# retrieval/backends/postgres.py's keyword statement before the impact lists, on TSV.
BEFORE_SQL = (
    "WITH q AS MATERIALIZED (SELECT to_tsquery('english', string_agg("
    "CASE WHEN prefix THEN pq::text || ':*' ELSE pq::text END, ' | ')) AS query "
    "FROM (SELECT plainto_tsquery('english', t) AS pq, prefix "
    "FROM unnest(%s::text[], %s::boolean[]) AS u(t, prefix)) s "
    "WHERE pq::text <> '') "
    f"SELECT k.node_id, ts_rank_cd(k.tsv, q.query) AS score FROM {TSV} k "
    "CROSS JOIN q "
    "JOIN ingestion_knowledgenode n ON n.id = k.node_id "
    "JOIN ingestion_document d ON d.id = n.document_id "
    "WHERE q.query IS NOT NULL AND k.tsv @@ q.query AND k.space_id = %s "
    "AND d.active_generation = n.generation AND d.enabled "
    "ORDER BY score DESC LIMIT %s"
)


def corpus() -> list[tuple[str, str]]:
    with gzip.open(DATA / "corpus.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    return [(r["_id"], f"{r.get('title', '')} {r['text']}".strip()) for r in rows]


def claims() -> dict[str, str]:
    with open(DATA / "queries.jsonl") as f:
        return {q["_id"]: q["text"] for q in map(json.loads, f)}


def space_of(copies: int, *, create: bool = False):
    from spaces.models import KnowledgeSpace
    from spaces.services import Principal, create_space

    name = f"bench-pg-keyword-{copies}"
    found = KnowledgeSpace.objects.filter(name=name).first()
    if found is None and create:
        found = create_space(Principal(tenant_id="bench"), name=name)
    if found is None:
        sys.exit(f"no space {name}: run `build --copies {copies}` first")
    return found


def build(copies: int) -> None:

    from django.db import connection, transaction

    from ingestion.models import Document, KnowledgeNode
    from knowledgefs.testing.rows import published_document
    from retrieval.backends import IndexedNode, get_search_backend
    from retrieval.text import keyword_text

    space = space_of(copies, create=True)
    rng = random.Random(1)
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {TSV} (node_id uuid PRIMARY KEY, space_id uuid NOT NULL,"
            " tsv tsvector NOT NULL)"
        )
        cursor.execute(f"CREATE INDEX IF NOT EXISTS {TSV}_gin ON {TSV} USING GIN (tsv)")
        cursor.execute(f"CREATE INDEX IF NOT EXISTS {TSV}_space ON {TSV} (space_id)")
    rows = []
    for copy in range(copies):
        for doc_id, text in corpus():
            if copy:
                words = text.split()
                for _ in range(min(3, len(words) - 1)):
                    words.pop(rng.randrange(len(words)))
                text = " ".join(words)
            rows.append((f"c{copy}-{doc_id}", text))
    started = time.perf_counter()
    backend = get_search_backend()
    for start in range(0, len(rows), BATCH):
        with transaction.atomic():
            docs, nodes = [], []
            for name, text in rows[start : start + BATCH]:
                generation = uuid.uuid4()
                doc = published_document(
                    space, name, generation=generation, node_count=1, size_bytes=len(text),
                    prefix="bench",
                )  # fmt: skip
                docs.append(doc)
                nodes.append(
                    KnowledgeNode(
                        id=uuid.uuid4(),
                        space=space,
                        document=doc,
                        generation=generation,
                        chunk_index=0,
                        text=text,
                        start_offset=0,
                        end_offset=len(text),
                    )
                )
            Document.objects.bulk_create(docs)
            KnowledgeNode.objects.bulk_create(nodes)
            backend.index_keywords(
                [IndexedNode(n.id, space.id, n.document_id, n.text) for n in nodes]
            )
            with connection.cursor() as cursor:
                cursor.execute(
                    f"INSERT INTO {TSV} SELECT i, %s, to_tsvector('english', t) "
                    "FROM unnest(%s::uuid[], %s::text[]) u(i, t)",
                    [space.id, [n.id for n in nodes], [keyword_text(n.text) for n in nodes]],
                )
        print(f"{start + len(nodes)} nodes, {time.perf_counter() - started:.0f} s", flush=True)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    print(json.dumps({"space": str(space.id), "nodes": len(rows)}))


def before(cursor, space_id, query: str, limit: int) -> list:
    from retrieval.text import is_lone_cjk, keyword_terms

    terms = keyword_terms(query)
    cursor.execute(BEFORE_SQL, [terms, [is_lone_cjk(t) for t in terms], space_id, limit])
    return [str(row[0]) for row in cursor.fetchall()]


def after(space_id, query: str, limit: int, trace=None) -> list:
    from retrieval.backends import get_search_backend

    hits = get_search_backend().keyword_search(space_id, query, limit, trace=trace)
    return [str(h.node_id) for h in hits]


def unbounded(space_id, query: str, limit: int, trace=None) -> list:
    """The Threshold Algorithm without a postings budget (always exact; the leg before the
    budget), in the transaction the backend opens."""
    from django.db import connection, transaction

    from retrieval.backends import pgkeyword as pk
    from retrieval.text import is_lone_cjk, keyword_terms

    terms = keyword_terms(query)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        hits = pk.search(
            cursor, space_id, terms, [is_lone_cjk(t) for t in terms], limit, trace=trace,
            bounded=False,
        )  # fmt: skip
    return [node for node, _ in hits]


def exact(cursor, space_id, query: str, limit: int) -> list:
    """Exhaustive BM25: every matching visible posting scored in Python."""
    from retrieval.backends import pgkeyword as pk
    from retrieval.text import is_lone_cjk, keyword_terms

    terms = keyword_terms(query)
    n, length, _ = pk.space_statistics(cursor, space_id)
    lexemes = pk.query_lexemes(cursor, space_id, terms, [is_lone_cjk(t) for t in terms])
    if not lexemes:
        return []
    scorer = pk.Scorer(n, length, lexemes)
    cursor.execute(
        pk.EXHAUSTIVE_SQL.replace(pk.VISIBLE, pk.VISIBLE.format(only="")),
        [space_id, scorer.terms],
    )
    return [node for node, _ in pk.top(scorer.score_rows(cursor.fetchall()), limit)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(math.ceil(q * len(ordered))) - 1)]


def measure(copies: int, count: int, limit: int, only: set[str]) -> None:
    """``only``: the statements timed (``before``, ``unbounded``, ``after``). The exhaustive
    reference's ids are cached in ``var/pg-keyword-exact-<copies>-<limit>.json`` (reused by
    later runs over the same space: a budget sweep)."""
    from django.db import connection

    space = space_of(copies)
    queries = list(claims().values())[:count]
    timings: dict[str, list[float]] = {"before": [], "unbounded": [], "after": [], "exact": []}
    agree: dict[str, list[float]] = {name: [] for name in ("before", "unbounded", "after")}
    work, work_unbounded = [], []
    cache_path = ROOT / "var" / f"pg-keyword-exact-{copies}-{limit}-{space.id}.json"
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    runs = {
        "before": lambda c, q, t: before(c, space.id, q, limit),
        "unbounded": lambda c, q, t: unbounded(space.id, q, limit, t),
        "after": lambda c, q, t: after(space.id, q, limit, t),
    }
    with connection.cursor() as cursor:
        for q in queries[:20]:  # warm-up
            for name in only:
                runs[name](cursor, q, None)
        for q in queries:
            got = {}
            traces = {"unbounded": {}, "after": {}}
            for name in ("before", "unbounded", "after"):
                if name in only:
                    t0 = time.perf_counter()
                    got[name] = runs[name](cursor, q, traces.get(name))
                    timings[name].append((time.perf_counter() - t0) * 1000)
            if q not in cache:
                t0 = time.perf_counter()
                cache[q] = exact(cursor, space.id, q, limit)
                timings["exact"].append((time.perf_counter() - t0) * 1000)
                cache_path.parent.mkdir(exist_ok=True)
                cache_path.write_text(json.dumps(cache))
            e = cache[q]
            reference = set(e[:10])
            for name, ids in got.items():
                agree[name].append(len(set(ids[:10]) & reference) / max(1, min(10, len(e))))
            work.append(traces["after"])
            work_unbounded.append(traces["unbounded"])
    cache_path.parent.mkdir(exist_ok=True)
    cache_path.write_text(json.dumps(cache))
    timings = {k: v for k, v in timings.items() if v}
    agree = {k: v for k, v in agree.items() if v}
    report = {
        "nodes": copies * len(corpus()),
        "queries": len(queries),
        "limit": limit,
        **{
            f"{k}_ms": {
                "p50": round(statistics.median(v), 1),
                "p95": round(percentile(v, 0.95), 1),
            }
            for k, v in timings.items()
        },
        **{f"{k}_top10_agreement": round(statistics.mean(v), 4) for k, v in agree.items()},
        **{
            f"threshold_mean_{name}": {
                key: round(statistics.mean(t.get(key, 0) for t in traces), 1)
                for key in ("rounds", "postings", "resolved")
            }
            for name, traces in (("unbounded", work_unbounded), ("after", work))
        },
        "after_max_postings": max((t.get("postings", 0) for t in work), default=None),
        "after_proved_exact_share": round(statistics.mean(bool(t.get("exact")) for t in work), 3),
        "after_budget": sorted({t.get("budget") for t in work if t.get("budget")}),
    }
    print(json.dumps(report, indent=2))


def explain(copies: int, index: int) -> None:
    from django.db import connection

    space = space_of(copies)
    query = list(claims().values())[index]
    print(f"query: {query!r}\n")
    statements: list[tuple[str, list]] = []

    def record(execute, sql, params, many, context):
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.cursor() as cursor:
        from retrieval.text import is_lone_cjk, keyword_terms

        terms = keyword_terms(query)
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS) " + BEFORE_SQL,
            [terms, [is_lone_cjk(t) for t in terms], space.id, 50],
        )
        print("-- before (ts_rank_cd)\n" + "\n".join(r[0] for r in cursor.fetchall()) + "\n")
        with connection.execute_wrapper(record):
            after(space.id, query, 50)
        for sql, params in statements:
            if "retrieval_keyword" not in sql:
                continue
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
            print(f"-- after: {sql[:90]}…")
            print("\n".join(r[0] for r in cursor.fetchall()) + "\n")


def ndcg(copies: int) -> None:
    from django.db import connection

    space = space_of(copies)
    qrels: dict[str, dict[str, int]] = {}
    with open(DATA / "qrels" / "test.tsv") as f:
        next(f)
        for line in f:
            qid, cid, score = line.split()
            qrels.setdefault(qid, {})[cid] = int(score)
    texts = claims()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n.id, d.filename FROM ingestion_knowledgenode n "
            "JOIN ingestion_document d ON d.id = n.document_id WHERE n.space_id = %s",
            [space.id],
        )
        names = {
            str(row[0]): row[1].removesuffix(".txt").split("-", 1)[1] for row in cursor.fetchall()
        }
        result = {}
        for name, run in (
            ("before", lambda q: before(cursor, space.id, q, 10)),
            ("unbounded", lambda q: unbounded(space.id, q, 10)),
            ("after", lambda q: after(space.id, q, 10)),
        ):
            gains = []
            for qid, relevant in qrels.items():
                ranked = [names[n] for n in run(texts[qid])]
                dcg = sum(relevant.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked))
                ideal = sorted(relevant.values(), reverse=True)[:10]
                gains.append(dcg / sum(g / math.log2(i + 2) for i, g in enumerate(ideal)))
            result[name] = round(statistics.mean(gains), 4)
    print(json.dumps({"queries": len(qrels), "keyword_ndcg@10": result}))


def main() -> None:
    import django

    django.setup()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("build", "measure", "explain", "ndcg"))
    parser.add_argument("--copies", type=int, default=20)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--query-index", type=int, default=0)
    parser.add_argument("--only", default="before,unbounded,after", help="statements timed")
    parser.add_argument("--budget", type=int, help="threshold.POSTINGS_BUDGET_MIN (a sweep)")
    parser.add_argument("--per-result", type=int, help="threshold.POSTINGS_PER_RESULT")
    parser.add_argument("--first-share", type=float, help="threshold.FIRST_ROUND_SHARE")
    args = parser.parse_args()
    from retrieval.backends import threshold

    for name, value in (
        ("POSTINGS_BUDGET_MIN", args.budget), ("POSTINGS_PER_RESULT", args.per_result),
        ("FIRST_ROUND_SHARE", args.first_share),
    ):  # fmt: skip
        if value is not None:
            setattr(threshold, name, value)
    if args.command == "build":
        build(args.copies)
    elif args.command == "measure":
        measure(args.copies, args.queries, args.limit, set(args.only.split(",")))
    elif args.command == "explain":
        explain(args.copies, args.query_index)
    else:
        ndcg(args.copies)


if __name__ == "__main__":
    main()
