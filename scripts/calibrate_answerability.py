"""Calibrate answerability's absolute signals (docs/retrieval.md, "Answerability").

Usage: ``.venv/bin/python scripts/calibrate_answerability.py [SCIFACT_DIR] [MODEL_ID]`` (default
``../shared/data/scifact`` and the embedded default, bge-small-en-v1.5 int8; the thresholds are
per model, ``knowledgefs.runtime.local_embedding``). In process, no server, one thread: 100
SciFact test claims (seed 7) over their relevant abstracts plus 1,200 other abstracts, and 40
off-topic questions over the same abstracts, embedded with that model; the top 5 abstracts
by cosine are the evidence. Prints the best cosine and the best share of the question's words
(:func:`retrieval.evidence.coverage`) per group, and the states each pair of thresholds gives.
A few minutes on one core; not a benchmark.
"""

import gzip
import json
import os
import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")
import django  # noqa: E402

django.setup()
from knowledgefs.runtime import DEFAULT_MODEL_ID  # noqa: E402
from knowledgefs.runtime.local_embedding import LOCAL_MODELS, LocalOnnxEmbedding  # noqa: E402
from retrieval import evidence as ev  # noqa: E402

D = sys.argv[1] if len(sys.argv) > 1 else str(ROOT.parent / "shared" / "data" / "scifact")
rows = [json.loads(line) for line in open(f"{D}/queries.jsonl")]
queries = {row["_id"]: row["text"] for row in rows}
qrels: dict[str, set[str]] = {}
for line in list(open(f"{D}/qrels/test.tsv"))[1:]:
    q, c, s = line.split()
    qrels.setdefault(q, set()).add(c)
corpus = {}
with gzip.open(f"{D}/corpus.jsonl.gz", "rt") as f:
    for line in f:
        d = json.loads(line)
        corpus[d["_id"]] = d["title"] + "\n\n" + d["text"]
random.seed(7)
qids = random.sample(sorted(qrels), 100)
rel = sorted({c for q in qids for c in qrels[q]})
others = random.sample(sorted(set(corpus) - set(rel)), 1200)
docs = rel + others
MODEL = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_MODEL_ID
m = LocalOnnxEmbedding(model=LOCAL_MODELS[MODEL], threads=1)
X = m.embed_documents([corpus[d] for d in docs])
OFF = [
    "What is the capital gains tax rate in Germany for 2024?",
    "How do I reset my router password?",
    "Who won the football world cup in 2014?",
    "What is a good recipe for banana bread?",
    "How long does a flight from Paris to Tokyo take?",
    "What is the price of a new iPhone?",
    "How do I file my income tax return online?",
    "When does the train to Berlin leave?",
    "What are the best hiking trails in Colorado?",
    "How do I change a flat tyre on a bicycle?",
    "What is the refund policy for concert tickets?",
    "How many days of annual leave does an employee get?",
    "Which programming language should I learn first?",
    "How do I install Python on Windows?",
    "What is the exchange rate of the euro to the dollar?",
    "Who wrote the novel Pride and Prejudice?",
    "How do I bake sourdough bread at home?",
    "What is the speed limit on German motorways?",
    "How much does a parking permit cost in London?",
    "What time does the supermarket open on Sunday?",
    "How do I renew my passport?",
    "What is the best way to learn to play guitar?",
    "Which smartphone has the best camera in 2024?",
    "How do I cancel my gym membership?",
    "What is the VAT rate for restaurants in France?",
    "How do I set up a VPN on my laptop?",
    "What are the rules of cricket?",
    "How tall is the Eiffel Tower?",
    "What is the interest rate on a 30-year mortgage?",
    "How do I repot a houseplant?",
    "xyzzy plugh",
    "Where can I buy cheap furniture?",
    "How do I write a cover letter?",
    "What is the plot of the movie Inception?",
    "How do I clean a cast iron pan?",
    "When is the next solar eclipse visible in Europe?",
    "How do I configure nginx as a reverse proxy?",
    "What is the salary of a software engineer in Munich?",
    "How many players are on a basketball team?",
    "What is the shipping time for international orders?",
]


def stats(q, relevant=None):
    v = m.embed_query(q)
    sims = X @ v
    top = np.argsort(-sims)[:5]
    qt = ev.query_terms(q)
    cov = [ev.coverage(qt, corpus[docs[i]]) for i in top]
    r = max((sims[docs.index(c)] for c in relevant), default=None) if relevant else None
    return float(sims[top[0]]), max(cov), cov[0], r


on = [stats(queries[q], qrels[q]) for q in qids]
off = [stats(q) for q in OFF]


def pct(a, p):
    return round(float(np.percentile(a, p)), 3)


for name, rows in (("scifact", on), ("offtopic", off)):
    best = [r[0] for r in rows]
    cov = [r[1] for r in rows]
    print(
        name,
        len(rows),
        "best cos p5/p10/p50/p90/max",
        [pct(best, p) for p in (5, 10, 50, 90, 100)],
        "min",
        round(min(best), 3),
        "cov(top5 max) p5/p10/p50/p90",
        [pct(cov, p) for p in (5, 10, 50, 90)],
    )
rel_cos = [r[3] for r in on]
print("scifact relevant-abstract cosine p5/p10/p50", [pct(rel_cos, p) for p in (5, 10, 50)])
for t in (0.30, 0.35, 0.40, 0.45, 0.50, 0.55, 0.60, 0.65, 0.70, 0.75):
    for cut in (0.34, 0.5):
        ans_on = sum(1 for r in on if r[0] >= t and r[1] >= cut)
        ans_off = sum(1 for r in off if r[0] >= t and r[1] >= cut)
        nee_on = sum(1 for r in on if r[0] < t and r[1] < cut)
        nee_off = sum(1 for r in off if r[0] < t and r[1] < cut)
        print(
            f"T={t} C={cut}: scifact answerable {ans_on}/100 nee {nee_on}; "
            f"offtopic answerable {ans_off}/{len(off)} nee {nee_off}"
        )
for q, r in zip(OFF, off, strict=True):
    print(round(r[0], 3), round(r[1], 2), q)
